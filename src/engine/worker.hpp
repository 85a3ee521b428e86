// worker.hpp (internal) — one engine worker: a thread, a device stream and a model instance, as
// an owned class with private state (Worker).
//
// The worker loop (worker.cpp) leaves at once when the engine is cancelling or stopped, whatever
// else is pending; otherwise, in order: an unhealthy worker (it gave up) waits for shutdown; a
// pending recycle waits for its backoff and for the abandoned-instance limit, then replaces the
// stream and model instance (bounded attempts, then unhealthy); an open breaker waits for its
// cool-down; then the worker asks the Scheduler (Scheduler::next_batch, with the batcher's rules)
// for a batch when it has a free in-flight slot, assembles it, enqueues it on its stream with a
// completion point, and arms the hang watchdog.
//
// The execution gate (EngineOptions::execution_gate, execution_gate.hpp: a server's rate
// limiter), when there is one: launch() waits at it with the batch in hand (counted in running_,
// so shutdown's cancel sees its requests; the wait is the requests' queue time) and the batch
// gives its turn back when its work ends (on_batch_done or end_without_running: leave_gate), or
// when the hang watchdog abandons it (on_watchdog). A
// cancelling engine wakes the wait (wake() requests gate_stop_); the batch's requests then end
// as shut down and it never runs. Without a gate each of those places costs one pointer test.
//
// The inline path (a device with DeviceCapabilities::caller_run_streams, such as cpu, and no hang
// watchdog): the worker's stream has no thread of its own,
// and the worker runs each batch it launched itself, right after launching it (kernel, then the
// completion point): one thread hand-off fewer per batch. With a watchdog the batch runs on the
// stream's thread as on other devices, so that a hung model leaves the worker free to replace it.
//
// What the worker owns: its stream and model instance, its batches in flight, its circuit breaker
// (circuit_breaker.hpp), its recycling state and its counters. What it shares, by reference: the
// Scheduler it takes batches from, the Resolver that ends their requests, and the engine-wide
// context (engine_context.hpp: configuration, executors, counters, and what happens to a failed
// batch's requests). It never sees EngineCore or the other workers.
//
// worker.cpp holds the loop, launch, batch assembly and the completion point;
// worker_recovery.cpp the watchdog, recycling, giving up and the circuit breaker.
//
// Threads: the worker thread runs the loop, launch and recycle; the completion point runs where
// the stream reaches it (EngineContext::completion_point); the watchdog on the deadline timer's
// thread; the destruction of replaced instances on a reaper thread. The public methods may be
// called from any thread unless they say otherwise.
//
// Locks: `mu_` guards the fields marked so; never held together with the Scheduler's mutex.
// Under it only leaf locks are taken: a batch's watchdog mutex and the deadline timer's, when the
// watchdog re-arms itself for a batch queued behind another (on_watchdog). The atomic mirrors
// (`recycle_wanted_`, the breaker's open_flag()) let the Scheduler, which holds its own mutex, see
// that the worker must stop taking work without taking `mu_`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asyncinfer/detail/transitions.hpp"
#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "engine/circuit_breaker.hpp"
#include "engine/engine_context.hpp"
#include "engine/request.hpp"

namespace asyncinfer::detail {

/// A worker's life cycle as far as its stream and model instance go:
///
///   serving --(hang watchdog)--> recycling --(new stream + instance)--> serving
///                                recycling --(max_recycle_attempts failed)--> gave_up
///
/// A failed attempt below the limit stays in recycling (the next one after a backoff); gave_up
/// is the end (the worker serves nothing and waits for shutdown).
enum class WorkerLife : std::uint8_t { serving, recycling, gave_up };

inline constexpr Transitions<WorkerLife, 3> kWorkerLifeMoves{
    "worker life cycle",
    {"serving", "recycling", "gave_up"},
    {
        {WorkerLife::serving, WorkerLife::recycling},
        {WorkerLife::recycling, WorkerLife::serving},
        {WorkerLife::recycling, WorkerLife::gave_up},
    }};

class HostStream;

class Worker {
 public:
  /// Worker number `index` of the engine `ctx` describes (not owned; it must outlive the worker);
  /// each model instance it creates gets `intra_op_threads` (InstanceOptions). Starts nothing.
  Worker(int index, int intra_op_threads, EngineContext& ctx);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  /// Joins the thread if it still runs (it leaves once the engine is cancelling).
  ~Worker() = default;

  int index() const noexcept { return index_; }

  // ---- life cycle (the owner's thread; not thread-safe among themselves) ----------------------

  /// Creates the first stream and model instance. An exception from the device or the model is
  /// an error, never an escape. Before start().
  Status open();
  /// Starts the worker thread (the loop). Once, after open() succeeded.
  void start();
  /// Wakes the worker thread wherever it waits on the worker's own condition variable (a recycle
  /// backoff, a breaker cool-down, a full in-flight window) and, once the engine is cancelling,
  /// its wait at the execution gate; the Scheduler wakes its own waits.
  /// Thread-safe; takes the worker's mutex briefly.
  void wake();
  /// Waits for the worker thread to leave: the engine must be cancelling (the loop leaves then).
  /// Blocks.
  void join();
  /// Destroys the stream (which stops what still runs where the backend can, and delivers its
  /// pending completion points as aborted) and the model instance. After join().
  void close();

  /// Runs `batch` (a batch of one from Scheduler::accept, Lent) on the calling thread, with this
  /// worker's stream and model instance, exactly as the worker's loop would: launch, then the
  /// inline path's run of the stream (its completion point ends the request). Only while the
  /// scheduler holds this worker lent (its thread waits in next_batch, and touches neither until
  /// Scheduler::give_back), and only on the inline path. Blocks for the model's run.
  void run_lent(const std::shared_ptr<Batch>& batch);

  // ---- reading (thread-safe) ------------------------------------------------------------------

  /// Appends the requests of its batches in flight to `out` (shutdown cancels them). Takes the
  /// worker's mutex.
  void append_running(std::vector<std::shared_ptr<Request>>& out) const;
  /// Its health and why (empty when healthy). Takes the worker's mutex.
  std::pair<WorkerHealth, std::string> health() const;
  /// A snapshot of its state and counters (EngineMetrics::workers). Takes the worker's mutex.
  WorkerMetrics metrics() const;

 private:
  // ---- the loop, launch and the completion point (worker.cpp) ---------------------------------

  void loop();
  /// A new stream and model instance (at open() and on every recycle attempt). `stop`:
  /// EngineOptions::create_stop at open(), none for a recycle.
  Status make_stream_and_instance(std::stop_token stop = {});
  void launch(const std::shared_ptr<Batch>& batch);
  /// Waits at the execution gate for `batch` (launch(), with a gate). false: the engine is
  /// cancelling; the batch's requests have ended (shut down) and it has left the worker.
  bool pass_gate(const std::shared_ptr<Batch>& batch);
  /// Gives back the batch's turn at the execution gate if it holds one (once).
  void leave_gate(Batch& batch) noexcept;
  /// Builds the batch's inputs. Requests whose preparation throws fail alone and leave the batch.
  Status assemble(Batch& batch, BatchIO& io);
  Status enqueue_copies_back(Batch& batch, BatchIO& io);
  /// Counts the batch off the stream (once).
  void off_stream(Batch& batch);
  /// A batch that never reached its stream (or whose completion point could not be enqueued).
  void end_without_running(const std::shared_ptr<Batch>& batch, Status s);
  /// The completion point: on whatever thread the stream's host function runs.
  void on_batch_done(const std::shared_ptr<Batch>& batch, Status st);
  /// Frees the batch's in-flight slot; true when the stream was replaced since the batch was
  /// launched.
  bool release_slot(const Batch& batch);
  /// Ends the batch's requests with their rows of the outputs; `now` is the completion point.
  /// `previous`: when the batch before it on this worker reached its completion point.
  void complete(const std::shared_ptr<Batch>& batch, double compute_us, Clock::time_point now,
                Clock::time_point previous);

  // ---- recovery and the breaker (worker_recovery.cpp) -----------------------------------------

  /// The hang watchdog's handler (the deadline timer's thread).
  void on_watchdog(const std::shared_ptr<Batch>& batch);
  /// EngineOptions::watchdog for `batch`: once for each request of a coalesced launch, which
  /// runs them one after another (Model::coalesced_requests).
  std::chrono::milliseconds watchdog_limit(const Batch& batch) const;
  /// Replaces a hung stream and model instance (worker thread only). The old ones are destroyed
  /// by a reaper thread, so a kernel that ignores its stop token cannot block this worker; until
  /// that destruction returns they count as abandoned (the loop bounds them). Batches still
  /// queued on the old stream come back through BatchFailure::requeue_all. A failed attempt is
  /// retried after a backoff; after RecoveryOptions::max_recycle_attempts in a row the worker
  /// gives up (give_up).
  void recycle();
  /// The wait after `failures` failed attempts in a row: recycle_backoff doubled per further
  /// failure, capped (saturating: max() waits for good).
  std::chrono::milliseconds recycle_backoff(int failures) const;
  /// The worker gave up for good; `last_worker`: it was the last live one (live_workers already
  /// counted it out, under mu_).
  void give_up(bool last_worker, const std::string& cause);
  /// Its health and why (under mu_).
  std::pair<WorkerHealth, std::string> health_locked() const;
  void breaker_success();
  void breaker_failure(StatusCode code);

  const int index_;
  const int intra_op_threads_;
  EngineContext& ctx_;
  Scheduler& scheduler_;
  Resolver& resolver_;

  std::unique_ptr<Stream> stream_;  // replaced only by the worker thread (recycle)
  // The inline path (EngineContext::inline_path): `stream_` is a caller-run stream, and this is
  // it; the worker runs each batch it launched on its own thread (run_pending). Null otherwise.
  HostStream* caller_stream_ = nullptr;
  std::unique_ptr<ModelInstance> instance_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;                 // under mu_
  int inflight_ = 0;                             // under mu_
  std::vector<std::shared_ptr<Batch>> running_;  // under mu_
  WorkerLife life_ = WorkerLife::serving;        // under mu_ (kWorkerLifeMoves)
  std::atomic<bool> recycle_wanted_{false};      // life_ == recycling, readable without mu_
  int recycle_failures_ = 0;                     // under mu_: failed attempts in a row
  Clock::time_point next_recycle_{};             // under mu_: backoff after a failed attempt
  std::string last_error_;                       // under mu_: why the last attempt failed
  int abandoned_ = 0;                            // under mu_: replaced instances not yet destroyed
  CircuitBreaker breaker_;                       // under mu_ (but for its open_flag())
  std::atomic<std::uint64_t> batches_{0};
  /// When its last batch reached its completion point (steady clock, ns since its epoch): a batch
  /// launched while the one before ran waited for it on the stream, which Triton's statistics
  /// count as queue time, not compute (complete).
  std::atomic<std::int64_t> last_completion_ns_{0};
  std::atomic<std::uint64_t> failed_batches_{0};
  std::atomic<std::uint64_t> recycles_{0};
  std::atomic<std::uint64_t> recycle_attempts_failed_{0};
  std::atomic<std::int64_t> stream_batches_{0};  // launched, completion point not yet run
  SpinWait spin_;               // the worker thread's only: its wait for work at low load (loop)
  std::stop_source gate_stop_;  // requested by wake() once cancelling: leaves the gate's wait
  std::jthread thread_;         // last: joined before the rest is destroyed
};

}  // namespace asyncinfer::detail
