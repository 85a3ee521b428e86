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
//   worker.hpp            a Worker: its thread, stream, model instance, batches in flight,
//                         circuit breaker and recovery (an owned class; it sees the Scheduler,
//                         the Resolver and the EngineContext, never EngineCore);
//   engine_context.hpp    the EngineContext: what the workers share with each other and with
//                         EngineCore — configuration and executors by reference, the counters
//                         and the failure paths (engine_context.cpp: the health-change hook);
//   engine_counters.hpp   the EngineCounters: engine-wide counters, histograms and statistics,
//                         filling EngineMetrics (its add_to() is in engine_metrics.cpp);
//   batch_failure.hpp     the BatchFailure: a failed batch split, requeued, retried or ended;
//                         late failures; the end of what waits when the last worker gave up
//                         (batch_failure.cpp);
//   engine.cpp            start, submit and shutdown — what EngineCore owns;
//   engine_api.cpp        Engine's public methods, Engine::create and its option checks;
//   engine_metrics.cpp    metrics() and health(), and EngineCounters' metrics;
//   worker.cpp            the worker loop, launch, batch assembly, the completion point, the
//                         check of a model's outputs (EngineContext::check_outputs);
//   worker_recovery.cpp   the hang watchdog, recycling, giving up, feeding the circuit breaker;
//   circuit_breaker.hpp   a worker's circuit breaker (an owned class, checked life cycle);
//   batcher.hpp           which requests form the next batch, and when (a pure function);
//   caller_run.hpp        the caller-run fast path: a request run by its submitting thread on a
//                         sleeping worker (WorkerLending, the Scheduler's side; CallerRun, the
//                         engine's);
//   retry_scheduler.hpp   whether and when a failed request runs again, and the requests
//                         waiting out their backoff (the Scheduler's);
//   admission.hpp         refusing a request that would miss its deadline in the queue;
//   request.hpp           a request's record and its life cycle (transition());
//   request_queue.hpp, retry.hpp  the queue, the retry budget.
//
// EngineCore composes them: it owns the executors, the Scheduler, the Resolver, the
// EngineContext and the Workers (in that order, so each is destroyed before what it refers to),
// starts the workers and shuts everything down in order (shutdown()). Its state is private:
// Engine (engine_api.cpp) reaches it through the submit forms, shutdown(), metrics(), health()
// and the read-only accessors (options(), signature(), request_signature(), device()).
//
// Thread safety: every public method may be called from any thread at once; shutdown()
// serialises itself (shutdown_mu_) and blocks until the workers and executors have stopped
// (a drain waits up to its timeout). The configuration is fixed at construction.
//
// Engine life cycle (EngineState, scheduler.hpp): running → draining → cancelling → stopped, or
// running → cancelling → stopped; the Scheduler holds it and is the one place it changes.
//
// Locks: the scheduler's mutex (queue, retry waiting set, engine state) → ordered delivery /
// retry budget / timer internals (taken by the accept hook); worker mutexes (Worker's own) are
// never held together with the scheduler's. No user code runs under any of them; messages go to the
// log hook (log.hpp) with no lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/log.hpp"
#include "engine/caller_run.hpp"
#include "engine/engine_context.hpp"
#include "engine/lifecycle.hpp"
#include "engine/request.hpp"
#include "engine/resolver.hpp"
#include "engine/scheduler.hpp"
#include "engine/statistics.hpp"
#include "engine/worker.hpp"

namespace asyncinfer {

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  EngineCore(std::shared_ptr<Model> model, std::shared_ptr<Device> device, EngineOptions options,
             std::int64_t max_rows);
  ~EngineCore();

  // ---- fixed at construction (read-only; any thread) ------------------------------------------

  const EngineOptions& options() const noexcept { return opt_; }
  const ModelSignature& signature() const noexcept { return sig_; }
  /// What a request brings: a sequence engine's (SequencePlan::request_signature), else the
  /// model's signature.
  const ModelSignature& request_signature() const noexcept {
    return sequence_plan_ ? sequence_plan_->request_signature : sig_;
  }
  Device& device() const noexcept { return *device_; }

  // ---- submission (engine.cpp) ----------------------------------------------------------------

  /// Opens and starts the workers (Engine::create; once, before any submit).
  Status start();

  /// The three submit forms of engine.hpp: prepare (validate, copy shared inputs), then accept.
  /// They block only where EngineOptions::submit_timeout lets a full queue make them wait, and
  /// where a caller run (RequestOptions::caller_run_max_compute) runs the request here.
  Future<Outputs> submit_future(Inputs&& inputs, const RequestOptions& o);
  /// As submit_future, with a refusal returned as the error rather than as a ready future.
  Result<Future<Outputs>> try_submit_future(Inputs&& inputs, const RequestOptions& o);
  Status submit_callback(Inputs&& inputs, Engine::Callback&& cb, const RequestOptions& o);
  Status submit_id(std::string&& id, Inputs&& inputs, const RequestOptions& o);

  // The id form's results (the Resolver's result store).
  Result<Outputs> result(std::string_view id, std::chrono::nanoseconds timeout);
  RequestState status(std::string_view id);
  Status cancel(std::string_view id);
  Status release(std::string_view id);

  // ---- engine life cycle and shutdown (engine.cpp) --------------------------------------------

  /// Drains (up to `drain_timeout`) or cancels, then stops the workers and the executors; blocks
  /// until they have stopped. A second call waits for the first (a cancel escalates its drain).
  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout);

  // ---- metrics (engine_metrics.cpp) -----------------------------------------------------------

  EngineMetrics metrics() const;
  EngineHealth health() const;

 private:
  using Request = detail::Request;
  using Batch = detail::Batch;
  using Worker = detail::Worker;
  using Stage = detail::Stage;
  using Pending = detail::Pending;
  using EngineState = detail::EngineState;

  /// One reaper thread per abandoned instance the workers may hold at once (see the header).
  static std::size_t reaper_threads(const EngineOptions& o);

  Result<std::shared_ptr<Request>> prepare(Inputs&& inputs, const RequestOptions& o);
  Clock::time_point effective_deadline(const RequestOptions& o, Clock::time_point now) const;

  /// Accepts a prepared request into the queue, or refuses it (nothing registered): the
  /// Scheduler decides (Scheduler::accept). Acceptance is one step under its mutex: the stage
  /// leaves `submitting`, the Resolver's admit() gives the request its place in the
  /// ordered-delivery sequence and its deadline timer, and it takes its place in the queue.
  /// Whatever ended the request before (see request.hpp, `refusal`) makes it a refusal instead.
  Status accept(const std::shared_ptr<Request>& r);
  /// prepare()'s checks of RequestOptions::sequence: set exactly on a sequence engine, with a
  /// non-zero ID, one row, and an integer ID where the CORRID control is an integer.
  Status check_sequence(const Inputs& inputs, const RequestOptions& o) const;

  /// Counts a refusal under `reason` (EngineMetrics::rejections_by_reason); returns `s`.
  Status reject(const char* reason, Status s);

  EngineState state() const noexcept { return scheduler_.state(); }
  bool accepting() const noexcept { return scheduler_.accepting(); }

  /// Switches a shutdown in progress to cancel: the queued and running requests end now.
  void escalate_to_cancel();
  /// Wakes every thread waiting in the scheduler and every worker.
  void wake_everyone();
  void cancel_all();

  std::string context(const std::string& what, const std::string& tag) const {
    return detail::with_tag(what, tag);
  }

  // ---- state ----------------------------------------------------------------------------------

  std::shared_ptr<Model> model_;
  std::shared_ptr<Device> device_;
  EngineOptions opt_;
  ModelSignature sig_;
  std::int64_t max_rows_;
  // Sequence engines: where each model input comes from, and what a request brings
  // (SequencePlan::request_signature); unset otherwise.
  std::optional<detail::SequencePlan> sequence_plan_;
  // Which of a request's inputs are ragged (TensorSpec::ragged); empty when none is.
  std::vector<bool> ragged_;
  // The inline path (worker.hpp): a device with DeviceCapabilities::caller_run_streams (cpu) and
  // no hang watchdog.
  bool inline_path_;
  // The caller-run fast path's engine side (caller_run.hpp): which requests may run on their
  // callers (RequestOptions::caller_run_max_compute), and running one there.
  detail::CallerRun caller_run_;
  Clock::time_point started_;

  // Executors. Destroyed in reverse order; shutdown() stops them in the right order first.
  ThreadPool completion_;
  ThreadPool dispatcher_;
  DeadlineTimer timer_;
  ThreadPool reaper_;

  detail::Scheduler scheduler_;
  detail::Resolver resolver_;  // after the executors and the scheduler it uses
  // What the workers share, with the engine-wide counters (submitted and rejected too) and the
  // failure paths: after everything it refers to.
  detail::EngineContext ctx_;
  std::vector<std::unique_ptr<Worker>> workers_;  // destroyed first: they refer to all the above

  std::mutex shutdown_mu_;  // held by the shutdown() in progress
};

}  // namespace asyncinfer
