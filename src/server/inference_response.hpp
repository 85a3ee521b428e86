// inference_response.hpp (internal) — what the server's request paths share to answer a request:
// InferenceServer::run (inference_server.cpp), the response cache's (cache_follower.cpp) and
// an ensemble's (ensemble_run.cpp). Every answer to a request is made by make_response.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "asyncinfer/executor.hpp"
#include "inference_server.hpp"

namespace asyncinfer::server {

/// The response carrying the model's outputs `outs`: those `selected` (indices into the model's
/// outputs, in the order the request asked for them), or all of them when none were; an empty
/// `outs` (a decoupled model's final flag alone) gives a response without outputs. Pure.
InferResponse make_response(const ModelRef& ref, std::string id,
                            const std::vector<std::size_t>& selected, const Outputs& outs);

/// Nanoseconds from `from` to `to` (the statistics extension's unit).
std::uint64_t ns_between(Clock::time_point from, Clock::time_point to);
/// Nanoseconds from `start` to now.
std::uint64_t ns_since(Clock::time_point start);

}  // namespace asyncinfer::server
