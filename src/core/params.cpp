#include "core/params.hpp"

#include <cerrno>
#include <cstdlib>
#include <limits>

namespace asyncinfer::detail {

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t pos = text.find(sep, start);
    out.emplace_back(text.substr(start, pos == std::string_view::npos ? text.npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

Result<Params> Params::parse(std::string_view text, char separator, std::string context) {
  Params p;
  p.context_ = std::move(context);
  if (text.empty()) return p;
  for (const std::string& item : split(text, separator)) {
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return invalid_argument_error(p.context_ + ": parameter '" + item +
                                    "' is not of the form key=value");
    }
    std::string key = item.substr(0, eq);
    if (!p.values_.emplace(key, item.substr(eq + 1)).second) {
      return invalid_argument_error(p.context_ + ": parameter '" + key + "' is given twice");
    }
  }
  return p;
}

Result<std::string> Params::get_string(std::string_view key, std::string fallback) const {
  auto it = values_.find(std::string(key));
  return it == values_.end() ? fallback : it->second;
}

Result<std::int64_t> Params::get_int(std::string_view key, std::int64_t fallback, std::int64_t min,
                                     std::int64_t max) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  const std::string& v = it->second;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || parsed < min || parsed > max) {
    return invalid_argument_error(context_ + ": " + std::string(key) + "=" + v +
                                  " is not an integer in [" + std::to_string(min) + ", " +
                                  std::to_string(max) + "]");
  }
  return static_cast<std::int64_t>(parsed);
}

Result<double> Params::get_double(std::string_view key, double fallback, double min,
                                  double max) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  const std::string& v = it->second;
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || !(parsed >= min) ||
      !(parsed <= max)) {
    return invalid_argument_error(context_ + ": " + std::string(key) + "=" + v +
                                  " is not a number in [" + std::to_string(min) + ", " +
                                  std::to_string(max) + "]");
  }
  return parsed;
}

Result<bool> Params::get_bool(std::string_view key, bool fallback) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return invalid_argument_error(context_ + ": " + std::string(key) + "=" + v +
                                " is not a boolean (expected true/false, 1/0, yes/no, on/off)");
}

Result<std::vector<std::int64_t>> Params::get_int_list(std::string_view key,
                                                       std::vector<std::int64_t> fallback,
                                                       char list_separator) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  std::vector<std::int64_t> out;
  for (const std::string& item : split(it->second, list_separator)) {
    errno = 0;
    char* end = nullptr;
    const long long parsed = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || end != item.c_str() + item.size() || errno == ERANGE) {
      return invalid_argument_error(context_ + ": " + std::string(key) + "=" + it->second +
                                    " is not a list of integers separated by '" +
                                    std::string(1, list_separator) + "'");
    }
    out.push_back(static_cast<std::int64_t>(parsed));
  }
  return out;
}

Status Params::accept_alias(std::string_view old_key, std::string_view key) {
  auto old = values_.find(std::string(old_key));
  if (old == values_.end()) return Status();
  if (has(key)) {
    return invalid_argument_error(context_ + ": give " + std::string(key) + " or its old name " +
                                  std::string(old_key) + ", not both");
  }
  values_.emplace(std::string(key), std::move(old->second));
  values_.erase(old);
  return Status();
}

Status Params::check_known(const std::set<std::string>& known) const {
  for (const auto& [key, value] : values_) {
    if (known.count(key) == 0) {
      std::string accepted;
      for (const std::string& k : known) accepted += (accepted.empty() ? "" : ", ") + k;
      return invalid_argument_error(context_ + ": unknown parameter '" + key +
                                    "' (accepted: " + accepted + ")");
    }
  }
  return Status();
}

}  // namespace asyncinfer::detail
