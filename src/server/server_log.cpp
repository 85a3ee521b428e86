// server_log.cpp — the server's log and Triton's logging extension (server_log.hpp).
#include "server_log.hpp"

#include <chrono>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "asyncinfer/detail/enum_names.hpp"

namespace asyncinfer::server {
namespace {

constexpr std::string_view kSettings =
    "log_file, log_info, log_warning, log_error, log_verbose_level, log_format";

char letter(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug:
      return 'V';
    case LogLevel::info:
      return 'I';
    case LogLevel::warning:
      return 'W';
    case LogLevel::error:
      return 'E';
  }
  return 'I';
}

}  // namespace

namespace {
constexpr detail::EnumNames<ServerLog::Format, 2> kFormatNames{{"default", "ISO8601"}, "default"};
}  // namespace

std::string_view to_string(ServerLog::Format format) noexcept { return kFormatNames.name(format); }

ServerLog::ServerLog(std::string prefix, std::FILE* out) : prefix_(std::move(prefix)), out_(out) {}

void ServerLog::write(LogLevel level, std::string_view message) noexcept {
  bool on = true;
  switch (level) {
    case LogLevel::debug:
      on = verbose_.load(std::memory_order_relaxed) >= 1;
      break;
    case LogLevel::info:
      on = info_.load(std::memory_order_relaxed);
      break;
    case LogLevel::warning:
      on = warning_.load(std::memory_order_relaxed);
      break;
    case LogLevel::error:
      on = error_.load(std::memory_order_relaxed);
      break;
  }
  if (!on) return;
  try {
    std::string line;
    line.reserve(message.size() + prefix_.size() + 32);
    if (format_.load(std::memory_order_relaxed) == Format::iso8601) {
      const std::time_t now =
          std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm utc{};
      gmtime_r(&now, &utc);
      char stamp[32];
      const std::size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
      line.append(stamp, n);
      line += ' ';
      line += letter(level);
      line += ' ';
    }
    line += prefix_;
    line += ": ";
    line += message;
    line += '\n';
    std::lock_guard lock(write_mu_);
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fflush(out_);
  } catch (...) {  // out of memory: the line is lost, never the caller
  }
}

void ServerLog::write_line(std::string_view message) noexcept {
  LogLevel level = LogLevel::info;
  if (message.find("UNAVAILABLE: ") != std::string_view::npos ||
      message.find("load failed") != std::string_view::npos || message.starts_with("error: ")) {
    level = LogLevel::error;
  } else if (message.find("warning: ") != std::string_view::npos) {
    level = LogLevel::warning;
  }
  write(level, message);
}

ServerLog::Settings ServerLog::settings() const {
  Settings s;
  s.log_info = info_.load();
  s.log_warning = warning_.load();
  s.log_error = error_.load();
  s.log_verbose_level = verbose_.load();
  s.log_format = format_.load();
  return s;
}

Result<ServerLog::Settings> ServerLog::update(const Parameters& changes) {
  std::lock_guard lock(update_mu_);
  Settings next = settings();
  for (const auto& [name, value] : changes) {
    const std::string what = "log setting '" + name + "'";
    if (name == "log_file") {
      // Triton's words first (qa/L0_logging matches them).
      return invalid_argument_error(
          "log file location can not be updated through network "
          "protocol (" +
          what + ": the log goes to standard error)");
    }
    if (name == "log_info" || name == "log_warning" || name == "log_error") {
      ASYNCINFER_ASSIGN_OR_RETURN(bool on, parameter_bool(value, name));
      (name == "log_info"      ? next.log_info
       : name == "log_warning" ? next.log_warning
                               : next.log_error) = on;
    } else if (name == "log_verbose_level") {
      ASYNCINFER_ASSIGN_OR_RETURN(
          std::int64_t level,
          parameter_int(value, name, 0, std::numeric_limits<std::uint32_t>::max()));
      next.log_verbose_level = static_cast<std::uint32_t>(level);
    } else if (name == "log_format") {
      const auto* text = std::get_if<std::string>(&value);
      const std::optional<Format> format = text ? kFormatNames.parse(*text) : std::nullopt;
      if (!format) return invalid_argument_error(what + " must be \"default\" or \"ISO8601\"");
      next.log_format = *format;
    } else {
      return invalid_argument_error("unknown " + what +
                                    " (the settings: " + std::string(kSettings) + ")");
    }
  }
  info_.store(next.log_info);
  warning_.store(next.log_warning);
  error_.store(next.log_error);
  verbose_.store(next.log_verbose_level);
  format_.store(next.log_format);
  return next;
}

std::string log_settings_json(const ServerLog::Settings& s) {
  nlohmann::ordered_json j;
  j["log_file"] = s.log_file;
  j["log_info"] = s.log_info;
  j["log_warning"] = s.log_warning;
  j["log_error"] = s.log_error;
  j["log_verbose_level"] = s.log_verbose_level;
  j["log_format"] = std::string(to_string(s.log_format));
  return j.dump();
}

}  // namespace asyncinfer::server
