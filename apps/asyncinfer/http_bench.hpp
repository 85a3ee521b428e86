// http_bench.hpp — the HTTP mode of `asyncinfer bench` (--url): the same modes and report
// fields, against an Open Inference Protocol server instead of an in-process engine.
#pragma once

#include <memory>
#include <string>

#include "bench_options.hpp"
#include "commands.hpp"

namespace asyncinfer::cli {

struct HttpBenchArgs {
  std::string url;      ///< http://HOST:PORT/v2/models/M[/versions/V]/infer; empty = engine mode
  bool binary = false;  ///< Triton's binary tensor extension for inputs and outputs
};

/// Adds --url and --binary to `bench`.
std::shared_ptr<HttpBenchArgs> add_http_bench_options(CLI::App& bench);

/// Runs the HTTP mode with the bench's mode (async = closed loop, rate = open loop),
/// --concurrency (connections), --request-rate, --arrivals, --duration-s / --requests,
/// --warmup-s, --batch-rows, --seed. Prints the throughput and latency percentiles (µs, from the
/// intended send time). Exit codes as bench's.
int run_http_bench(const BenchOptions& options, const HttpBenchArgs& http);

}  // namespace asyncinfer::cli
