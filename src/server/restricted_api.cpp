// restricted_api.cpp — Triton's limited endpoint access (restricted_api.hpp).
#include "restricted_api.hpp"

#include <cctype>

namespace asyncinfer::server {
namespace {

constexpr std::array<std::string_view, kApiCategories> kNames = {
    "health",           "metadata",   "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "trace",     "logging"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view to_string(ApiCategory category) noexcept {
  return kNames[static_cast<std::size_t>(category)];
}

Status RestrictedApis::add(std::string_view spec, std::string_view option,
                           std::string_view key_prefix) {
  const std::string what = std::string(option) + " '" + std::string(spec) + "'";
  const std::size_t colon = spec.find(':');
  const std::size_t equals = colon == std::string_view::npos ? colon : spec.find('=', colon);
  if (colon == std::string_view::npos || equals == std::string_view::npos) {
    return invalid_argument_error(what + ": expected <api>[,<api>...]:<key>=<value>");
  }
  const std::string_view key = trim(spec.substr(colon + 1, equals - colon - 1));
  if (key.empty()) return invalid_argument_error(what + ": the key is empty");
  ApiRestriction restriction;
  restriction.key = std::string(key_prefix) + std::string(key);
  if (!key_prefix.empty()) {  // gRPC metadata keys are lower case
    for (char& c : restriction.key)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  restriction.value = std::string(spec.substr(equals + 1));
  std::string_view apis = spec.substr(0, colon);
  bool any = false;
  while (!apis.empty()) {
    const std::size_t comma = apis.find(',');
    const std::string_view name = trim(apis.substr(0, comma));
    apis = comma == std::string_view::npos ? std::string_view() : apis.substr(comma + 1);
    if (name.empty()) continue;
    std::size_t i = 0;
    while (i < kNames.size() && kNames[i] != name) ++i;
    if (i == kNames.size()) {
      return invalid_argument_error(what + ": unknown API '" + std::string(name) +
                                    "' (health, metadata, inference, shared-memory, "
                                    "model-config, model-repository, statistics, trace, "
                                    "logging)");
    }
    if (by_category_[i]) {
      return invalid_argument_error(what + ": '" + std::string(name) +
                                    "' is already in another group (a category may be in one)");
    }
    by_category_[i] = restriction;
    any = true;
  }
  if (!any) return invalid_argument_error(what + ": no API named before ':'");
  return Status();
}

const ApiRestriction* RestrictedApis::find(ApiCategory category) const noexcept {
  const auto& r = by_category_[static_cast<std::size_t>(category)];
  return r ? &*r : nullptr;
}

bool RestrictedApis::empty() const noexcept {
  for (const auto& r : by_category_) {
    if (r) return false;
  }
  return true;
}

bool restriction_met(const ApiRestriction& restriction, const std::string_view* got) noexcept {
  if (got == nullptr || got->size() != restriction.value.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < got->size(); ++i) {
    diff |= static_cast<unsigned char>((*got)[i] ^ restriction.value[i]);
  }
  return diff == 0;
}

}  // namespace asyncinfer::server
