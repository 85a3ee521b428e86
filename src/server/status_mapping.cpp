#include "status_mapping.hpp"

namespace asyncinfer::server {

const std::array<StatusMapping, 11>& status_mappings() noexcept {
  // code, HTTP, gRPC (OK 0, CANCELLED 1, INVALID_ARGUMENT 3, DEADLINE_EXCEEDED 4, NOT_FOUND 5,
  // ALREADY_EXISTS 6, RESOURCE_EXHAUSTED 8, FAILED_PRECONDITION 9, ABORTED 10, INTERNAL 13,
  // UNAVAILABLE 14).
  static constexpr std::array<StatusMapping, 11> kTable = {{
      {StatusCode::ok, 200, 0},
      {StatusCode::cancelled, 400, 1},
      {StatusCode::invalid_argument, 400, 3},
      {StatusCode::deadline_exceeded, 504, 4},
      {StatusCode::not_found, 404, 5},
      {StatusCode::already_exists, 400, 6},
      {StatusCode::resource_exhausted, 503, 8},
      {StatusCode::failed_precondition, 400, 9},
      {StatusCode::aborted, 503, 10},
      {StatusCode::unavailable, 503, 14},
      {StatusCode::internal, 500, 13},
  }};
  return kTable;
}

int http_status(StatusCode code) noexcept {
  for (const StatusMapping& m : status_mappings()) {
    if (m.code == code) return m.http_status;
  }
  return 500;
}

int grpc_code(StatusCode code) noexcept {
  for (const StatusMapping& m : status_mappings()) {
    if (m.code == code) return m.grpc_code;
  }
  return 2;  // UNKNOWN
}

}  // namespace asyncinfer::server
