// status_mapping.hpp — the one table that maps asyncinfer's StatusCode onto HTTP statuses and
// gRPC codes, for every frontend.
//
// Source: Triton's HTTP mapping (docs/protocol, src/http_server.cc: INVALID_ARG, UNKNOWN,
// ALREADY_EXISTS, CANCELLED → 400; NOT_FOUND → 404; UNAVAILABLE → 503; INTERNAL → 500) and the
// gRPC status codes (grpc/status.h; StatusCode already follows absl's numbering). Where Triton has
// no entry, the issue decides: deadline exceeded → 504; a full queue (resource_exhausted) → 503,
// as Triton answers "Exceeds maximum queue size" with UNAVAILABLE, so Triton clients see what they
// know; a request ended by shutdown (aborted) → 503, so a load balancer retries it elsewhere.
// docs/serving.md shows the same table.
#pragma once

#include <array>
#include <string_view>

#include "asyncinfer/status.hpp"

namespace asyncinfer::server {

struct StatusMapping {
  StatusCode code;
  int http_status;
  int grpc_code;  ///< grpc::StatusCode value
};

/// Every StatusCode, in enum order.
const std::array<StatusMapping, 11>& status_mappings() noexcept;
int http_status(StatusCode code) noexcept;
int grpc_code(StatusCode code) noexcept;

}  // namespace asyncinfer::server
