// engine_counters.hpp (internal) — EngineCounters: the engine-wide counters, gauges, histograms
// and Triton statistics that the submitting threads, the workers and the failure paths bump, and
// that fill EngineMetrics (engine.hpp) in one place (add_to()).
//
// What it counts:
//   - submissions: requests accepted into the queue (submitted), refused (rejected, and by
//     reason), and the live workers (a gauge: workers that have not given up);
//   - batches and attempts, retries and those the budget denied, split batches, late completions
//     and late failures (and by reason), model exceptions, watchdog firings;
//   - the queue-time, compute-time and batch-size histograms;
//   - Triton's statistics (InferenceStats): durations, counts and the per-batch-size table,
//     added once per completed batch (Worker's completion point).
//
// Thread safety: every counter may be bumped and read from any thread at once. The plain
// counters are public atomics (relaxed: counters, not synchronisation), so that the hot paths
// bump them without a call; the two maps by reason are private, each behind its own mutex
// (rejections_mu_, late_mu_: leaves, no other lock is taken under them). No method blocks beyond
// those mutexes; add_to() takes each in turn, never both.
//
// It needs no engine: a test bumps it and reads what add_to() fills (test_engine_parts.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "asyncinfer/metrics.hpp"
#include "asyncinfer/status.hpp"
#include "engine/statistics.hpp"

namespace asyncinfer::detail {

class EngineCounters {
 public:
  EngineCounters() = default;
  EngineCounters(const EngineCounters&) = delete;
  EngineCounters& operator=(const EngineCounters&) = delete;

  /// Counts a refused submit under `reason` (EngineMetrics::rejected, rejections_by_reason).
  /// Takes rejections_mu_.
  void count_rejection(const char* reason);
  /// Counts `n` late failures with `code` (EngineMetrics::late_failures,
  /// late_failures_by_reason). Takes late_mu_.
  void count_late_failures(std::size_t n, StatusCode code);

  /// Fills EngineMetrics' counters, gauges, histograms and statistics (`m.stats`) from a
  /// snapshot of each (relaxed loads: a snapshot taken while others count may see one counter
  /// and not yet the next). Leaves the rest of `m` as it was (the model, uptime, depths, the
  /// outcome counters, the workers).
  void add_to(EngineMetrics& m) const;

  // ---- submissions (bumped by the submitting threads) -----------------------------------------

  // Hot counters live on their own cache lines: they are bumped from several threads at once.
  alignas(64) std::atomic<std::uint64_t> submitted{0};
  std::atomic<std::uint64_t> rejected{0};
  std::atomic<int> live_workers{0};  // a gauge: workers that have not given up

  // ---- batches (bumped by the workers and the failure paths) ----------------------------------

  alignas(64) std::atomic<std::uint64_t> attempts{0};
  std::atomic<std::uint64_t> batches{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> retries_denied{0};
  std::atomic<std::uint64_t> split_batches{0};
  std::atomic<std::uint64_t> late_completions{0};
  std::atomic<std::uint64_t> late_failures{0};
  std::atomic<std::uint64_t> model_exceptions{0};
  std::atomic<std::uint64_t> watchdog_fired{0};
  Histogram queue_us;
  Histogram compute_us;
  Histogram batch_size{Histogram::batch_size_bounds()};

  // ---- Triton's statistics (InferenceStats), once per completed batch -------------------------

  // Success and fail per request are the Resolver's.
  alignas(64) DurationCounter stat_queue;
  DurationCounter stat_input;
  DurationCounter stat_infer;
  DurationCounter stat_output;
  std::atomic<std::uint64_t> inference_count{0};
  std::atomic<std::uint64_t> execution_count{0};
  std::atomic<std::int64_t> last_inference_ms{0};
  BatchStatsTable batch_stats;

 private:
  mutable std::mutex rejections_mu_;
  std::map<std::string, std::uint64_t> rejections_by_reason_;  // under rejections_mu_
  mutable std::mutex late_mu_;
  std::map<std::string, std::uint64_t> late_failures_by_reason_;  // under late_mu_
};

}  // namespace asyncinfer::detail
