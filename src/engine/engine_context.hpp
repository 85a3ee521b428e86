// engine_context.hpp (internal) — EngineContext: what the engine's workers share with each other
// and with EngineCore, so that a Worker (worker.hpp) needs no pointer to EngineCore.
//
// What it holds:
//   - the engine's fixed configuration (model, device, options, signature, the inline path), the
//     executors a worker hands work to (the completion-point executor, the deadline timer, the
//     reaper pool), and the Scheduler and the Resolver — all by reference: EngineCore owns them;
//   - the engine-wide counters, histograms and Triton statistics that the workers bump and
//     EngineCore's metrics() reads (public atomics: each is written lock-free from several
//     threads; the two maps by reason are behind reasons_mu);
//   - the engine-wide ends of a batch, which touch no worker's state: a failed batch split,
//     requeued, retried or ended (batch_failure.cpp, retry_scheduler.cpp), late failures, the
//     check of a model's outputs, the health-change hook, and the end of everything waiting when
//     the last worker gave up.
//
// Thread safety: the references and configuration are fixed at construction; the counters are
// atomics (or guarded as marked); every method may be called from any thread and takes no lock
// of its own but reasons_mu (a leaf), besides the Scheduler's and the Resolver's through their
// methods. No method blocks. User code runs only in health_changed() (EngineOptions::
// on_health_change), with no engine lock held.
//
// Lifetime: EngineCore constructs it after the executors, the Scheduler and the Resolver, and
// stops the executors (shutdown()) before any of them is destroyed.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"
#include "asyncinfer/log.hpp"
#include "asyncinfer/model.hpp"
#include "engine/lifecycle.hpp"
#include "engine/request.hpp"
#include "engine/resolver.hpp"
#include "engine/scheduler.hpp"
#include "engine/sequence_batcher.hpp"
#include "engine/statistics.hpp"

namespace asyncinfer::detail {

struct EngineContext {
  /// `run_inline`: the engine runs a worker's batches on its own thread (worker.hpp). Does not
  /// own anything it is given (`dispatcher` runs completion points where the device forbids
  /// running them where the stream reaches them); all of it must outlive this object.
  EngineContext(Model& the_model, Device& the_device, const EngineOptions& options,
                const ModelSignature& signature, std::int64_t batch_rows, bool run_inline,
                Executor& dispatcher, DeadlineTimer& deadline_timer, ThreadPool& reaper_pool,
                Scheduler& the_scheduler, Resolver& the_resolver);
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  // ---- the engine-wide ends of a batch (batch_failure.cpp, retry_scheduler.cpp) ---------------

  /// A batch failed with `st`: its running requests are split (each runs alone: one bad request
  /// fails alone), retried or ended; those that had already ended count as late failures.
  void batch_failed(const std::shared_ptr<Batch>& batch, const Status& st);

  /// Puts running requests back at the front of their levels (in their order), without counting
  /// the attempt. With solo, each will run in a batch of its own. A decoupled request is not put
  /// back (it runs once): it fails with `cause` (fail_partial), or "its batch did not complete".
  void requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo,
               const Status* cause = nullptr);
  /// Requeues the batch's requests still running (its stream was replaced under it).
  void requeue_all(const std::shared_ptr<Batch>& batch);

  /// Ends a running request that failed alone (batch assembly), or counts a late failure.
  void fail_alone(const std::shared_ptr<Request>& r, Status s);
  /// Ends a decoupled request whose batch failed (`st`): it is never re-run, as its client may
  /// hold part of an answer.
  void fail_partial(const std::shared_ptr<Request>& r, const Status& st);

  /// Retries a running request that failed with `st` after its backoff (the Scheduler decides;
  /// the deadline timer requeues it), or ends it with its final status.
  void retry_or_fail(const std::shared_ptr<Request>& r, const Status& st);
  /// The retry timer's handler: back to the queue, or ended when no worker will serve it.
  void requeue_after_backoff(const std::shared_ptr<Request>& r);

  /// Ends a request no worker will serve: failed with `unavailable` (every worker gave up), else
  /// shut_down with the message `shut_down`.
  void end_unservable(const std::shared_ptr<Request>& r, const std::optional<Status>& unavailable,
                      const char* shut_down);

  /// A failure that reached `n` requests which had already ended (timed out, cancelled, shut
  /// down): counted per request by reason; its message is logged once, rate-limited.
  void late_failure(std::size_t n, const Status& st, const Request& example);

  /// The completion point of a batch the watchdog already ended: its result is late.
  void late_outcome(const Batch& batch, const Status& st);

  /// Whether `st` is only the engine's own doing, not a failure: the batch's work stopped because
  /// its stop token fired (all its requests ended, or the watchdog), or its stream was destroyed
  /// (a recycle, shutdown).
  static bool own_stop(const Batch& batch, const Status& st);

  /// Whether a model's outputs for `rows` rows match its signature.
  Status check_outputs(const std::vector<Tensor>& outs, std::int64_t rows) const;

  // ---- workers' health (worker_recovery.cpp) --------------------------------------------------

  /// Calls EngineOptions::on_health_change (if any): after a worker's health changed, or when
  /// shutdown begins. With no engine lock held (EngineCore's shutdown mutex aside, inside
  /// shutdown()); an exception is reported and dropped.
  void health_changed() noexcept;

  /// The last worker that could serve gave up (`cause`): everything queued or waiting to retry
  /// fails `unavailable`, and later submits are refused with it.
  void no_worker_left(const std::string& cause);

  // ---- fixed at construction ------------------------------------------------------------------

  Model& model;
  Device& device;
  const EngineOptions& opt;
  const ModelSignature& sig;
  const std::int64_t max_rows;
  const bool unified;              // DeviceInfo::unified_memory: no copies to and from the device
  const bool inline_path;          // worker.hpp: caller-run streams (cpu) and no hang watchdog
  InlineExecutor inline_executor;  // runs a completion point where the stream reaches it
  /// Where the streams' completion points run: where the device allows it
  /// (DeviceCapabilities::host_funcs_may_call_device: cpu, sim) the thread that reaches the point
  /// in the stream runs the (library-only) completion code, saving a thread hand-off per batch;
  /// elsewhere (cuda, whose callback thread must not call CUDA) the dispatcher thread.
  Executor& completion_point;
  DeadlineTimer& timer;
  ThreadPool& reaper;
  Scheduler& scheduler;
  Resolver& resolver;
  /// Sequence engines (EngineOptions::sequence_batching): where the model's inputs come from;
  /// null otherwise. Set by EngineCore before any worker starts.
  const SequencePlan* sequence_plan = nullptr;

  // ---- engine-wide counters (read by EngineCore::metrics) --------------------------------------

  std::atomic<int> live_workers{0};  // workers that have not given up
  // Hot counters live on their own cache lines: they are bumped from several threads at once.
  alignas(64) std::atomic<std::uint64_t> attempts{0};
  std::atomic<std::uint64_t> batches{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> retries_denied{0};
  std::atomic<std::uint64_t> split_batches{0};
  std::atomic<std::uint64_t> late_completions{0};
  std::atomic<std::uint64_t> late_failures{0};
  std::atomic<std::uint64_t> model_exceptions{0};
  std::atomic<std::uint64_t> watchdog_fired{0};
  mutable std::mutex reasons_mu;
  std::map<std::string, std::uint64_t> late_failures_by_reason;  // under reasons_mu
  LogLimiter late_log;     // late failures: their messages, rate-limited
  LogLimiter recycle_log;  // failed recycle attempts
  Histogram queue_us;
  Histogram compute_us;
  Histogram batch_size{Histogram::batch_size_bounds()};
  // Triton's statistics (InferenceStats) added once per completed batch (Worker's completion
  // point); success and fail per request are the Resolver's.
  alignas(64) DurationCounter stat_queue;
  DurationCounter stat_input;
  DurationCounter stat_infer;
  DurationCounter stat_output;
  std::atomic<std::uint64_t> inference_count{0};
  std::atomic<std::uint64_t> execution_count{0};
  std::atomic<std::int64_t> last_inference_ms{0};
  BatchStatsTable batch_stats;
};

}  // namespace asyncinfer::detail
