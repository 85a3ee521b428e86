// metrics.hpp — counters, gauges and histograms of the engine and the pipeline, as a snapshot and
// as Prometheus text.
//
// Design: recording is lock-free (relaxed atomics on the hot path); a snapshot copies the values
// and may be taken from any thread at any time. Histograms use fixed log-spaced bucket bounds in
// microseconds (1-2-5 series from 1 µs to 100 s), so percentiles from a snapshot are estimates
// within one bucket; exact percentiles of a run come from `asyncinfer bench`, which keeps every
// sample. Metric names follow Triton's (nv_inference_queue_duration_us,
// nv_inference_compute_infer_duration_us, failures labelled by reason), prefixed "asyncinfer_".
//
// Thread safety: Histogram::observe and the snapshot functions are thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace asyncinfer {

/// A point-in-time copy of a histogram.
struct HistogramSnapshot {
  std::vector<double> bounds;         ///< upper bounds of the buckets, ascending (µs or units)
  std::vector<std::uint64_t> counts;  ///< per bucket; one more than bounds (the +Inf bucket)
  std::uint64_t count = 0;
  double sum = 0;
  double max = 0;

  double mean() const noexcept { return count == 0 ? 0.0 : sum / static_cast<double>(count); }
  /// The upper bound of the bucket holding the q-quantile (0 < q <= 1), clamped to max; 0 when
  /// empty. An estimate within one bucket.
  double percentile(double q) const noexcept;
};

/// A fixed-bucket histogram. Values are in the unit the caller chose (µs for durations, items for
/// batch sizes); `bounds` must be ascending.
class Histogram {
 public:
  /// 1-2-5 series from 1 to 1e8 (µs: 1 µs to 100 s).
  Histogram();
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void observe(double value) noexcept;
  HistogramSnapshot snapshot() const;

  /// Bounds for batch sizes: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024.
  static std::vector<double> batch_size_bounds();

 private:
  std::vector<double> bounds_;
  std::vector<std::atomic<std::uint64_t>> counts_;
  std::atomic<std::uint64_t> count_{0};
  std::atomic<double> sum_{0};
  std::atomic<double> max_{0};
};

/// Per worker of an engine.
struct WorkerMetrics {
  int index = 0;
  std::string breaker;  ///< "closed", "open" or "half_open"
  /// "healthy", "recovering" (replacing its stream and model instance), "paused" (waiting for
  /// abandoned work, RecoveryOptions::max_abandoned_instances) or "unhealthy" (gave up).
  std::string health;
  std::string health_reason;  ///< why it is not healthy; empty when healthy
  std::uint64_t batches = 0;
  std::uint64_t failed_batches = 0;
  std::uint64_t recycles = 0;          ///< stream + instance replaced by the hang watchdog
  std::uint64_t recycle_failures = 0;  ///< attempts to create a replacement that failed
  /// Batches holding one of the engine's in-flight slots on this worker.
  std::int64_t inflight_batches = 0;
  /// Batches really on this worker's streams: launched and their completion point not yet
  /// reached, abandoned ones included (a batch the watchdog failed frees its slot at once, but its
  /// work may still run).
  std::int64_t stream_batches = 0;
  /// Replaced model instances (with their streams) not yet destroyed: their work still runs.
  std::int64_t abandoned_instances = 0;
};

/// A cumulative duration: how many, and their total in nanoseconds (Triton's StatisticDuration).
struct DurationStat {
  std::uint64_t count = 0;
  std::uint64_t ns = 0;
};

/// The executions of one batch size (Triton's InferBatchStatistics): each duration's count is
/// the number of executions of `batch_size` rows.
struct BatchSizeStats {
  std::int64_t batch_size = 0;
  DurationStat compute_input;
  DurationStat compute_infer;
  DurationStat compute_output;
};

/// Triton's model statistics (extension_statistics.md), cumulative since the engine started.
/// Per request: `success` (submit to completion) and `fail` (submit to the error) for every
/// request; `queue` and the three compute parts for the successful ones only, as Triton counts
/// them. The compute parts of a request are those of the batch it ran in:
///   compute_input   dispatch → the batch's inputs gathered (rows concatenated) and their copies
///                   to the device enqueued;
///   compute_infer   → the batch's completion point on the stream (the model's work; on devices
///                   with their own memory, the copies of the outputs back are in it too: the
///                   stream gives one completion point per batch);
///   compute_output  → the outputs checked, split per request and handed to their requests.
/// `inference_count` counts the rows (batch elements) of successful requests,
/// `execution_count` the batch executions that completed (each request of a coalesced launch,
/// Model::coalesced_requests, being an execution of its own, with its share of the launch's
/// compute parts).
struct InferenceStats {
  std::uint64_t inference_count = 0;
  std::uint64_t execution_count = 0;
  std::int64_t last_inference_ms = 0;  ///< ms since the Unix epoch of the last completion; 0 = none
  DurationStat success;
  DurationStat fail;
  DurationStat queue;
  DurationStat compute_input;
  DurationStat compute_infer;
  DurationStat compute_output;
  /// A server's response cache (Triton's cache_hit / cache_miss); an engine leaves them zero.
  DurationStat cache_hit;
  DurationStat cache_miss;
  std::vector<BatchSizeStats> batch_stats;  ///< ascending batch_size; sizes that ran only
};

/// A snapshot of an engine's metrics.
struct EngineMetrics {
  std::string model;
  double uptime_s = 0;
  // Requests by outcome.
  std::uint64_t submitted = 0;  ///< accepted at submit
  std::uint64_t rejected = 0;   ///< refused at submit (queue full, bad input, stopped, admission)
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t timed_out = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t shut_down = 0;
  std::map<std::string, std::uint64_t> failures_by_reason;  ///< status code name → count
  std::map<std::string, std::uint64_t> rejections_by_reason;
  // Work.
  std::uint64_t batches = 0;
  std::uint64_t attempts = 0;  ///< request executions, first attempts included
  std::uint64_t retries = 0;
  std::uint64_t retries_denied_by_budget = 0;
  std::uint64_t split_batches = 0;     ///< failed batches re-run request by request
  std::uint64_t late_completions = 0;  ///< results that arrived after their request ended
  /// Failures that arrived after their request had ended (timed out, cancelled): counted per
  /// request by status code name; their messages are logged (log.hpp), rate-limited.
  std::uint64_t late_failures = 0;
  std::map<std::string, std::uint64_t> late_failures_by_reason;
  std::uint64_t callback_exceptions = 0;
  std::uint64_t model_exceptions = 0;
  std::uint64_t watchdog_fired = 0;
  // Gauges.
  std::int64_t queue_depth = 0;
  std::int64_t inflight_requests = 0;
  std::int64_t retry_waiting = 0;
  /// Entries of the id-based API's result store (pending, running and finished).
  std::int64_t result_store_size = 0;
  /// Ordered delivery: requests accepted and not yet delivered, per sequence key ("" = the shared
  /// order), for the 64 keys with the most; ordered_backlog_total counts every key.
  std::map<std::string, std::int64_t> ordered_backlog;
  std::int64_t ordered_backlog_total = 0;
  /// Sequence batching (EngineOptions::sequence_batching): live sequences (with a slot or waiting
  /// for one), those waiting for a slot, slots freed because their sequence was idle past
  /// max_sequence_idle, and backlogged sequences whose timeout expired.
  std::int64_t sequences_live = 0;
  std::int64_t sequence_backlog = 0;
  std::uint64_t sequences_idle_released = 0;
  std::uint64_t sequence_backlog_expired = 0;
  /// Workers that are not unhealthy (healthy, recovering or paused).
  std::int64_t live_workers = 0;
  double batches_per_s = 0;  ///< since start
  std::vector<WorkerMetrics> workers;
  // Histograms (µs; batch size in items).
  HistogramSnapshot queue_us;    ///< submit (or re-queue) → dispatch in a batch
  HistogramSnapshot compute_us;  ///< batch enqueue on the stream → its completion point
  HistogramSnapshot request_us;  ///< submit → terminal state (end to end)
  HistogramSnapshot batch_size;
  /// Triton's statistics (the server's /v2/models/.../stats and ModelStatistics).
  InferenceStats stats;

  /// Prometheus text exposition format (version 0.0.4), written by the project's one exporter
  /// (src/metrics/prometheus_text.hpp, on prometheus-cpp): the same families as the server's
  /// /metrics, labelled model="<model>".
  std::string to_prometheus(std::string_view prefix = "asyncinfer") const;
};

}  // namespace asyncinfer
