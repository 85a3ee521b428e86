#include "asyncinfer/status.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "asyncinfer/log.hpp"

namespace asyncinfer {
namespace {
constexpr std::array<std::string_view, 11> kCodeNames = {
    "ok",        "cancelled",      "invalid_argument",   "deadline_exceeded",
    "not_found", "already_exists", "resource_exhausted", "failed_precondition",
    "aborted",   "unavailable",    "internal",
};
}  // namespace

std::string_view to_string(StatusCode code) noexcept {
  const auto index = static_cast<std::size_t>(code);
  return index < kCodeNames.size() ? kCodeNames[index] : std::string_view("unknown");
}

bool parse_status_code(std::string_view name, StatusCode* out) noexcept {
  for (std::size_t i = 0; i < kCodeNames.size(); ++i) {
    if (kCodeNames[i] == name) {
      *out = static_cast<StatusCode>(i);
      return true;
    }
  }
  return false;
}

Status::Status(StatusCode code, std::string_view message) : code_(code) {
  if (code == StatusCode::ok) return;
  if (message.empty()) {
    message_ = std::make_shared<const std::string>(std::string(asyncinfer::to_string(code)) +
                                                   " (no detail given)");
  } else {
    message_ = std::make_shared<const std::string>(message);
  }
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out(asyncinfer::to_string(code_));
  out += ": ";
  out += message();
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message();
  return Status(code_, msg);
}

std::ostream& operator<<(std::ostream& os, const Status& status) {
  return os << status.to_string();
}
std::ostream& operator<<(std::ostream& os, StatusCode code) { return os << to_string(code); }

Status invalid_argument_error(std::string_view m) { return {StatusCode::invalid_argument, m}; }
Status not_found_error(std::string_view m) { return {StatusCode::not_found, m}; }
Status already_exists_error(std::string_view m) { return {StatusCode::already_exists, m}; }
Status resource_exhausted_error(std::string_view m) { return {StatusCode::resource_exhausted, m}; }
Status deadline_exceeded_error(std::string_view m) { return {StatusCode::deadline_exceeded, m}; }
Status cancelled_error(std::string_view m) { return {StatusCode::cancelled, m}; }
Status unavailable_error(std::string_view m) { return {StatusCode::unavailable, m}; }
Status failed_precondition_error(std::string_view m) {
  return {StatusCode::failed_precondition, m};
}
Status internal_error(std::string_view m) { return {StatusCode::internal, m}; }
Status aborted_error(std::string_view m) { return {StatusCode::aborted, m}; }

namespace detail {
void check_failed(const char* file, int line, const char* what) noexcept {
  char buf[512];
  std::snprintf(buf, sizeof buf, "check failed at %s:%d: %s", file, line, what);
  log(LogLevel::error, buf);
  std::fflush(stderr);
  std::abort();
}

const Status& ok_status() noexcept {
  static const Status kOk;
  return kOk;
}
}  // namespace detail
}  // namespace asyncinfer
