// params.hpp (internal) — "key=value" lists in device specs and model URIs, with typed getters
// whose errors name the key, the value and what was expected.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer::detail {

class Params {
 public:
  /// Parses "k1=v1<sep>k2=v2". `context` prefixes every error ("sim device", "builtin:faulty").
  /// invalid_argument for an item without '=' or a repeated key.
  static Result<Params> parse(std::string_view text, char separator, std::string context);

  bool has(std::string_view key) const { return values_.count(std::string(key)) != 0; }
  Result<std::string> get_string(std::string_view key, std::string fallback) const;
  Result<std::int64_t> get_int(std::string_view key, std::int64_t fallback, std::int64_t min,
                               std::int64_t max) const;
  Result<double> get_double(std::string_view key, double fallback, double min, double max) const;
  Result<bool> get_bool(std::string_view key, bool fallback) const;
  /// Comma-free list "a:b:c" or "a,b" depending on the separator in use; `list_separator` splits.
  Result<std::vector<std::int64_t>> get_int_list(std::string_view key,
                                                 std::vector<std::int64_t> fallback,
                                                 char list_separator) const;
  /// Accepts `old_key` as a deprecated spelling of `key` (its value moves to `key`).
  /// invalid_argument when both are given.
  Status accept_alias(std::string_view old_key, std::string_view key);
  /// invalid_argument naming the first key not in `known`, and listing the accepted keys.
  Status check_known(const std::set<std::string>& known) const;
  const std::string& context() const { return context_; }

 private:
  std::map<std::string, std::string> values_;
  std::string context_;
};

/// Splits `text` at every `sep` (empty items kept).
std::vector<std::string> split(std::string_view text, char sep);

}  // namespace asyncinfer::detail
