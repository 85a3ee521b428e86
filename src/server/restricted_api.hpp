// restricted_api.hpp — Triton's limited endpoint access (`--http-restricted-api`,
// `--grpc-restricted-protocol`; Triton's docs/customization_guide/inference_protocols.md, "Limit
// Endpoint Access"): groups of API categories that answer only a request carrying a shared
// secret in a header.
//
// A group is "<api>[,<api>...]:<key>=<value>"; the option may be given several times, and a
// category may be in one group only. The categories are Triton's: health, metadata, inference,
// shared-memory, model-config, model-repository, statistics, trace, logging. Over HTTP the header
// is `<key>` (403 without it); over gRPC the metadata key is `triton-grpc-protocol-<key>`
// (UNAVAILABLE without it). The messages are Triton's.
//
// Thread safety: immutable once the server starts; allowed() may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "asyncinfer/status.hpp"

namespace asyncinfer::server {

enum class ApiCategory : std::uint8_t {
  health,
  metadata,
  inference,
  shared_memory,
  model_config,
  model_repository,
  statistics,
  trace,
  logging,
};
inline constexpr std::size_t kApiCategories = 9;
/// Triton's name: "health", "shared-memory", ...
std::string_view to_string(ApiCategory category) noexcept;

/// The header a restricted category asks for, and its value.
struct ApiRestriction {
  std::string key;  ///< the header (gRPC: with the prefix)
  std::string value;
};

class RestrictedApis {
 public:
  /// Adds the group `spec` of option `option` ("--http-restricted-api"); `key_prefix` goes before
  /// the key ("triton-grpc-protocol-" for gRPC, whose metadata keys are lower case).
  /// invalid_argument naming the option and what is wrong: no ':' or '=', an empty key, an
  /// unknown category, a category already in a group.
  Status add(std::string_view spec, std::string_view option, std::string_view key_prefix = "");
  /// The restriction of `category`, or null when it is open.
  const ApiRestriction* find(ApiCategory category) const noexcept;
  bool empty() const noexcept;

 private:
  std::array<std::optional<ApiRestriction>, kApiCategories> by_category_;
};

/// Whether `got` (the request's header value, null when absent) is the restriction's value
/// (compared in constant time for values of its length).
bool restriction_met(const ApiRestriction& restriction, const std::string_view* got) noexcept;

}  // namespace asyncinfer::server
