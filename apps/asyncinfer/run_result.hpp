// run_result.hpp — what one measured run of `asyncinfer bench` produced. Every mode (sync,
// async, rate, pipeline) returns this; tables, JSON, CSV and the HTML report read only it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "mode.hpp"
#include "stats.hpp"

namespace asyncinfer::cli {

/// p50/p99 (and count/mean) of an engine metrics histogram over the measured window. The values
/// are bucket upper bounds (estimates within one bucket; see metrics.hpp); nullopt when empty.
struct HistogramSummary {
  std::uint64_t count = 0;
  std::optional<double> mean, p50, p99;
};

struct RunResult {
  // What ran.
  Mode mode = Mode::async;             ///< sync, async, rate, pipeline
  std::string label;                   ///< for tables: "async c=64", "rate 200/s poisson"
  int concurrency = 0;                 ///< requests kept in flight (sync: 1; rate: 0)
  std::optional<double> request_rate;  ///< rate: offered requests per second
  std::optional<Arrivals> arrivals;    ///< rate: poisson | constant
  std::int64_t rows_per_request = 1;
  /// The largest batch the engine formed in rows (Engine::options()); unset for pipelines of
  /// stages.
  std::optional<std::int64_t> max_batch_size;

  // Counts over the measured window (warm-up excluded).
  std::uint64_t requests = 0;   ///< measured requests issued (accepted or refused)
  std::uint64_t completed = 0;  ///< ended ok
  std::uint64_t failed = 0;     ///< ended with an error or refused at submit
  std::map<std::string, std::uint64_t>
      failures;  ///< reason → count ("deadline_exceeded", "rejected:resource_exhausted", ...)
  std::uint64_t warmup_requests = 0;
  double warmup_s = 0;

  // Time and rates.
  double duration_s = 0;                     ///< measurement start → last measured completion
  double throughput_rps = 0;                 ///< completed / duration_s
  double rows_per_s = 0;                     ///< completed × rows_per_request / duration_s
  std::optional<double> first_inference_us;  ///< the first request on a fresh engine (excluded)

  // Latency (µs) of completed requests, from send (rate: intended send) to completion callback.
  std::vector<double> latency_us;  ///< every sample, ascending after finish
  LatencySummary latency;
  // Rate mode: how late the driver sent versus the schedule (µs).
  std::optional<LatencySummary> send_lag_us;

  // From the engine's metrics over the measured window.
  HistogramSummary queue_us;
  HistogramSummary compute_us;
  std::optional<double> batch_size_mean;
  std::uint64_t batches = 0;

  // Pipeline runs (bench --stages): items/s the slowest stage allows, and each stage's share.
  std::optional<double> bound_rps;
  std::string stage_utilisation;

  // Process CPU over the measured window: (user + sys) / wall, 1.0 = one core busy.
  double cpu_user_s = 0;
  double cpu_sys_s = 0;
  std::optional<double> cpu_util;
};

}  // namespace asyncinfer::cli
