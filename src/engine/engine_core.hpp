// engine_core.hpp (internal) — EngineCore, the engine behind asyncinfer::Engine (engine.hpp).
//
// Threads, all fixed at creation:
//   - one worker thread per worker (worker.hpp): forms batches from the queue with the batcher
//     (batcher.hpp) and enqueues them on its stream;
//   - the device's stream threads (sim, and cpu with a hang watchdog: one per worker stream; cpu
//     without a watchdog runs each batch on its worker's thread, the inline path, worker.hpp);
//   - one dispatcher thread: runs the streams' completion points (library code only: splits the
//     outputs, ends requests, fulfils futures — waking waiters — and hands callbacks on);
//   - completion_threads completion threads: run user callbacks and future continuations, so a
//     callback may block on another future without starving the dispatcher (docs/design.md,
//     guarantee 2);
//   - one deadline timer thread (deadlines, retry backoff, hang watchdog);
//   - reaper threads (workers × max(1, max_abandoned_instances), at most 64): destroy streams and
//     model instances replaced by the watchdog; each destruction waits for the work on that stream
//     that could not be stopped, and the worker counts it as abandoned until then.
//
// Where each part lives (one concept per file):
//   scheduler.hpp         the Scheduler: the queue, the retry waiting set, admission and the
//                         engine's life cycle, behind its own mutex (an owned class);
//   resolver.hpp          the Resolver: ending a request once, the sinks and callback batches,
//                         ordered delivery, the result store and the outcome counters (an owned
//                         class);
//   engine.cpp            start, submit and shutdown — what EngineCore owns;
//   engine_api.cpp        Engine's public methods, Engine::create and its option checks;
//   engine_metrics.cpp    metrics() and health();
//   worker.cpp            the worker loop, launch, batch assembly, the completion point;
//   batch_failure.cpp     a failed batch: split, requeue, retry or end; late failures;
//   worker_recovery.cpp   the hang watchdog, recycling, giving up, feeding the circuit breaker;
//   circuit_breaker.hpp   a worker's circuit breaker (an owned class, checked life cycle);
//   batcher.hpp           which requests form the next batch, and when (a pure function);
//   retry_scheduler.hpp   whether and when a failed request runs again;
//   admission.hpp         refusing a request that would miss its deadline in the queue;
//   request.hpp           a request's record and its life cycle (transition());
//   request_queue.hpp, retry.hpp  the queue, the retry budget.
//
// Engine life cycle (EngineState, scheduler.hpp): running → draining → cancelling → stopped, or
// running → cancelling → stopped; the Scheduler holds it and is the one place it changes.
//
// Locks: the scheduler's mutex (queue, retry waiting set, engine state) → ordered delivery /
// retry budget / timer internals (taken by the accept hook); worker mutexes are never held
// together with the scheduler's. No user code runs under any of them; messages go to the log hook
// (log.hpp) with no lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/log.hpp"
#include "engine/lifecycle.hpp"
#include "engine/request.hpp"
#include "engine/resolver.hpp"
#include "engine/scheduler.hpp"
#include "engine/statistics.hpp"
#include "engine/worker.hpp"

namespace asyncinfer {

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  using Request = detail::Request;
  using Batch = detail::Batch;
  using Worker = detail::Worker;
  using Stage = detail::Stage;
  using Pending = detail::Pending;
  using EngineState = detail::EngineState;

  EngineCore(std::shared_ptr<Model> model, std::shared_ptr<Device> device, EngineOptions options,
             std::int64_t max_rows);
  ~EngineCore();
  /// One reaper thread per abandoned instance the workers may hold at once (see the header).
  static std::size_t reaper_threads(const EngineOptions& o);

  // ---- submission (engine.cpp) ----------------------------------------------------------------

  Status start();
  Result<std::shared_ptr<Request>> prepare(Inputs&& inputs, const RequestOptions& o);
  Clock::time_point effective_deadline(const RequestOptions& o, Clock::time_point now) const;

  /// Accepts a prepared request into the queue, or refuses it (nothing registered): the
  /// Scheduler decides (Scheduler::accept). Acceptance is one step under its mutex: the stage
  /// leaves `submitting`, the Resolver's admit() gives the request its place in the
  /// ordered-delivery sequence and its deadline timer, and it takes its place in the queue.
  /// Whatever ended the request before (see request.hpp, `refusal`) makes it a refusal instead.
  Status accept(const std::shared_ptr<Request>& r);

  /// Counts a refusal under `reason` (EngineMetrics::rejections_by_reason); returns `s`.
  Status reject(const char* reason, Status s);

  /// The three submit forms of engine.hpp: prepare (validate, copy shared inputs), then accept.
  Future<Outputs> submit_future(Inputs&& inputs, const RequestOptions& o);
  /// As submit_future, with a refusal returned as the error rather than as a ready future.
  Result<Future<Outputs>> try_submit_future(Inputs&& inputs, const RequestOptions& o);

  Status submit_callback(Inputs&& inputs, Engine::Callback&& cb, const RequestOptions& o);
  Status submit_id(std::string&& id, Inputs&& inputs, const RequestOptions& o);
  Result<Outputs> result(std::string_view id, std::chrono::nanoseconds timeout);
  RequestState status(std::string_view id);
  Status cancel(std::string_view id);
  Status release(std::string_view id);

  // ---- workers (worker.cpp) -------------------------------------------------------------------

  /// A new stream and model instance for `w` (at start and on every recycle attempt). An
  /// exception from the device or the model is a failed attempt, never an escape.
  Status make_stream_and_instance(Worker& w, int threads);

  /// Where the streams' completion points run: where the device allows it
  /// (DeviceCapabilities::host_funcs_may_call_device: cpu, sim) the thread that reaches the point
  /// in the stream runs the (library-only) completion code, saving a thread hand-off per batch;
  /// elsewhere (cuda, whose callback thread must not call CUDA) the dispatcher thread.
  Executor* completion_point_executor();
  void worker_loop(Worker& w);

  void launch(Worker& w, const std::shared_ptr<Batch>& batch);

  /// Builds the batch's inputs. Requests whose preparation throws fail alone and leave the batch.
  Status assemble(Worker& w, Batch& batch, BatchIO& io);
  void fail_alone(const std::shared_ptr<Request>& r, Status s);
  Status enqueue_copies_back(Worker& w, Batch& batch, BatchIO& io);

  /// Counts the batch off its worker's stream (once).
  void off_stream(Worker& w, Batch& batch);

  /// A batch that never reached its stream (or whose completion point could not be enqueued).
  void end_without_running(Worker& w, const std::shared_ptr<Batch>& batch, Status s);
  void on_batch_done(const std::shared_ptr<Batch>& batch, Status st);

  /// Frees the batch's in-flight slot on its worker; true when the worker's stream was replaced
  /// since the batch was launched.
  bool release_slot(Worker& w, const Batch& batch);

  /// Ends the batch's requests with their rows of the outputs; `now` is the completion point.
  /// `previous`: when the batch before it on its worker reached its completion point.
  void complete(const std::shared_ptr<Batch>& batch, double compute_us, Clock::time_point now,
                Clock::time_point previous);
  Status check_outputs(const std::vector<Tensor>& outs, std::int64_t rows) const;
  void batch_failed(const std::shared_ptr<Batch>& batch, const Status& st);

  /// Puts running requests back at the front of their levels (in their order), without counting
  /// the attempt. With solo, each will run in a batch of its own. A decoupled request is not put
  /// back (it runs once): it fails with `cause` (fail_partial), or "its batch did not complete".
  void requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo,
               const Status* cause = nullptr);
  void requeue_all(const std::shared_ptr<Batch>& batch);
  /// Ends a decoupled request whose batch failed (`st`): it is never re-run, as its client may
  /// hold part of an answer.
  void fail_partial(const std::shared_ptr<Request>& r, const Status& st);

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

  // ---- retries (retry_scheduler.cpp) ----------------------------------------------------------

  void retry_or_fail(const std::shared_ptr<Request>& r, const Status& st);
  void requeue_after_backoff(const std::shared_ptr<Request>& r);

  // ---- recovery and the breaker (worker_recovery.cpp) -----------------------------------------

  void on_watchdog(const std::shared_ptr<Batch>& batch);

  /// Replaces a hung worker's stream and model instance (worker thread only). The old ones are
  /// destroyed by a reaper thread, so a kernel that ignores its stop token cannot block this
  /// worker; until that destruction returns they count as abandoned (worker_loop bounds them).
  /// Batches still queued on the old stream come back through requeue_all. A failed attempt is
  /// retried after a backoff; after RecoveryOptions::max_recycle_attempts in a row the worker
  /// gives up (worker_gave_up).
  void recycle(Worker& w);

  /// The wait after `failures` failed attempts in a row: recycle_backoff doubled per further
  /// failure, capped (saturating: max() waits for good).
  std::chrono::milliseconds recycle_backoff(int failures) const;

  /// A worker gave up for good. When it was the last one that could serve, everything queued or
  /// waiting to retry fails `unavailable` with `cause`, and later submits are refused with it.
  /// `last_worker`: it was the last live one (live_workers_ already counted it out, under w.mu).
  void worker_gave_up(Worker& w, bool last_worker, const std::string& cause);

  /// A worker's health and why (under w.mu).
  std::pair<WorkerHealth, std::string> health_of(const Worker& w) const;
  /// Calls EngineOptions::on_health_change (if any): after a worker's health changed, or when
  /// shutdown begins. With no engine lock held (shutdown_mu_ aside, inside shutdown()); an
  /// exception is reported and dropped.
  void health_changed() noexcept;
  void breaker_success(Worker& w);
  void breaker_failure(Worker& w, StatusCode code);

  // ---- engine life cycle and shutdown (engine.cpp) --------------------------------------------

  EngineState state() const noexcept { return scheduler_.state(); }
  bool accepting() const noexcept { return scheduler_.accepting(); }
  /// Cancelling or stopped: the workers leave, nothing is retried or requeued.
  bool cancelling() const noexcept { return scheduler_.cancelling(); }

  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout);

  /// Switches a shutdown in progress to cancel: the queued and running requests end now.
  void escalate_to_cancel();
  /// Wakes every thread waiting in the scheduler and every worker.
  void wake_everyone();
  void cancel_all();

  // ---- metrics (engine_metrics.cpp) -----------------------------------------------------------

  EngineMetrics metrics() const;
  EngineHealth health() const;
  std::string context(const std::string& what, const std::string& tag) const {
    return detail::with_tag(what, tag);
  }

  // ---- state ----------------------------------------------------------------------------------

  std::shared_ptr<Model> model_;
  std::shared_ptr<Device> device_;
  EngineOptions opt_;
  ModelSignature sig_;
  std::int64_t max_rows_;
  bool unified_;
  // The inline path (worker.hpp): a device with DeviceCapabilities::caller_run_streams (cpu) and
  // no hang watchdog.
  bool inline_path_;
  Clock::time_point started_;
  int intra_op_threads_ = 1;

  // Executors. Destroyed in reverse order; shutdown() stops them in the right order first.
  ThreadPool completion_;
  ThreadPool dispatcher_;
  InlineExecutor inline_;
  DeadlineTimer timer_;
  ThreadPool reaper_;

  detail::Scheduler scheduler_;
  detail::Resolver resolver_;         // after the executors and the scheduler it uses
  std::atomic<int> live_workers_{0};  // workers that have not given up

  std::vector<std::unique_ptr<Worker>> workers_;

  // Hot counters live on their own cache lines: they are bumped from several threads at once.
  alignas(64) std::atomic<std::uint64_t> submitted_{0};
  alignas(64) std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::atomic<std::uint64_t> retries_{0};
  std::atomic<std::uint64_t> retries_denied_{0};
  std::atomic<std::uint64_t> split_batches_{0};
  std::atomic<std::uint64_t> late_completions_{0};
  std::atomic<std::uint64_t> late_failures_{0};
  std::atomic<std::uint64_t> model_exceptions_{0};
  std::atomic<std::uint64_t> watchdog_fired_{0};
  mutable std::mutex reasons_mu_;
  std::map<std::string, std::uint64_t> rejections_by_reason_;     // under reasons_mu_
  std::map<std::string, std::uint64_t> late_failures_by_reason_;  // under reasons_mu_
  LogLimiter late_log_;     // late failures: their messages, rate-limited
  LogLimiter recycle_log_;  // failed recycle attempts
  Histogram queue_us_;
  Histogram compute_us_;
  Histogram batch_size_{Histogram::batch_size_bounds()};
  // Triton's statistics (InferenceStats) added once per completed batch, in complete(); success
  // and fail per request are the Resolver's.
  alignas(64) detail::DurationCounter stat_queue_;
  detail::DurationCounter stat_input_;
  detail::DurationCounter stat_infer_;
  detail::DurationCounter stat_output_;
  std::atomic<std::uint64_t> inference_count_{0};
  std::atomic<std::uint64_t> execution_count_{0};
  std::atomic<std::int64_t> last_inference_ms_{0};
  detail::BatchStatsTable batch_stats_;

  std::mutex shutdown_mu_;
};

}  // namespace asyncinfer
