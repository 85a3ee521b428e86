// scheduler.hpp (internal) — the engine's Scheduler: the queue of accepted requests, the requests
// waiting out a retry backoff, admission (queue capacity, deadline-aware admission control) and the
// engine's life cycle, behind one mutex that no other class sees (the queue mutex of request.hpp's
// queue rule).
//
// What it decides: whether a request is accepted (accept), which requests a worker takes next and
// when (next_batch, with the batcher's plan_batch), where a request that must run again goes
// (requeue, park_for_retry, requeue_after_backoff), and whether the engine still accepts work.
// What it does not do: end requests (the Resolver's try_resolve, resolver.hpp), run anything,
// or hold a thread. Every method returns what its caller must do next (a refusal, requests to end,
// a withdrawn request's reference); the caller does it after the scheduler's lock is released, so
// no user code and no other engine lock is ever taken under it (except what the accept hook
// takes, see accept()).
//
// The queue rule (request.hpp): every transition of a request out of `submitting`, `queued` or
// `retry_wait`, and every one into `queued` or `retry_wait`, happens here, under the mutex.
//
// Engine life cycle (EngineState): running → draining → cancelling → stopped, or running →
// cancelling → stopped. set_state() is the one place it changes (under the mutex, checked: an
// illegal change aborts); readers without the lock load the atomic. A drain that finishes moves
// on to cancelling: nothing is left to cancel, and the workers leave.
//
// Thread safety: every public method may be called from any thread. Blocking: accept() (a full
// queue with QueueFullPolicy::block), next_batch() and wait_drained() wait on condition variables
// (never by polling; next_batch() may first spin on the queue's Arrivals, spin_wait.hpp, whose
// SpinPolicy decides); the rest only take the mutex, after a short spin on the hot paths
// (accept(), next_batch(): lock_spinning).
//
// The caller-run fast path (caller_run.hpp) enters here in three places only: accept() may lend
// a sleeping worker to the submitting thread instead of queueing (lend()), give_back() ends
// that, and next_batch() keeps a lent worker in its wait. Which worker may be lent, and the
// compute-time bound, are WorkerLending's (caller_run.hpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "asyncinfer/detail/transitions.hpp"
#include "asyncinfer/engine.hpp"
#include "core/spin_wait.hpp"
#include "engine/admission.hpp"
#include "engine/batcher.hpp"
#include "engine/caller_run.hpp"
#include "engine/request.hpp"
#include "engine/request_queue.hpp"
#include "engine/retry_scheduler.hpp"
#include "engine/sequence_batcher.hpp"

namespace asyncinfer::detail {

/// The engine's life cycle (the header). Ordered: a later state never goes back.
enum class EngineState : std::uint8_t {
  running,     ///< accepts requests
  draining,    ///< refuses new requests; queued, retrying and running work finishes
  cancelling,  ///< refuses new requests; what is left ends shut_down; the workers leave
  stopped,     ///< shutdown() has returned: every thread joined
};
/// The legal changes (the header's diagram), checked by Scheduler::set_state().
inline constexpr Transitions<EngineState, 4> kEngineStateMoves{
    "engine state",
    {"running", "draining", "cancelling", "stopped"},
    {
        {EngineState::running, EngineState::draining},
        {EngineState::running, EngineState::cancelling},
        {EngineState::draining, EngineState::cancelling},
        {EngineState::cancelling, EngineState::stopped},
    }};
inline const char* to_string(EngineState s) noexcept { return kEngineStateMoves.name(s); }

/// Why a request was not accepted: the error its submit returns, and the reason it is counted
/// under (EngineMetrics::rejections_by_reason).
struct Refusal {
  const char* reason;
  Status status;
};

/// A worker asking for work (next_batch): its index, the rows its batch may hold, and its flags
/// that say it must stop taking work (a recycle is wanted, its breaker opened), which the
/// scheduler reads under its own mutex (the worker's is never taken here).
struct Taker {
  int worker = 0;
  std::int64_t max_rows = 1;
  const std::atomic<bool>* recycle_wanted = nullptr;
  const std::atomic<bool>* breaker_open = nullptr;
  /// Non-null: the worker's own SpinWait, used once before it sleeps on an empty queue (the
  /// worker passes it when its SpinPolicy says so, spin_wait.hpp).
  SpinWait* spin = nullptr;
  /// Requests a batch may carry when max_rows is 1 (EngineContext::coalesce; 0 = one, and
  /// always 0 for a half-open breaker's probe).
  int coalesce = 0;
};

/// What withdraw() did with a request.
enum class Withdrawal : std::uint8_t {
  not_waiting,      ///< running or ended: the scheduler does not hold it (look at it again)
  refused,          ///< still being submitted: its submit will refuse it (recorded in refusal)
  already_refused,  ///< still being submitted, and already refused
  from_queue,       ///< taken out of the queue: the caller ends it
  from_retry_wait,  ///< taken out of the waiting set: the caller cancels its timer and ends it
};

/// What requeue() did with running requests that must run again.
struct Requeued {
  /// Not put back because the engine is cancelling or no worker can serve
  /// (`unavailable`): the caller ends them.
  std::vector<std::shared_ptr<Request>> refused;
  /// Decoupled requests, which run once (their clients may hold part of an answer): the caller
  /// fails them.
  std::vector<std::shared_ptr<Request>> partial;
  std::optional<Status> unavailable;
};

/// What requeue_after_backoff() did.
struct BackoffEnd {
  bool requeued = false;              ///< back in the queue
  bool unservable = false;            ///< the engine is cancelling or no worker can serve: end it
  std::optional<Status> unavailable;  ///< when unservable because no worker can serve
};

class Scheduler {
 public:
  /// Reads the options it applies: priority_levels, queue_capacity, queue_full_policy,
  /// submit_timeout, retry, admission_control, workers, batching, priority_aging. `batched`:
  /// the model takes a batch dim (ModelSignature::batched).
  Scheduler(const EngineOptions& o, bool batched);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- life cycle ---------------------------------------------------------------------------

  EngineState state() const noexcept { return state_.load(std::memory_order_acquire); }
  bool accepting() const noexcept { return state() == EngineState::running; }
  /// Cancelling or stopped: the workers leave, nothing is retried or requeued.
  bool cancelling() const noexcept { return state() >= EngineState::cancelling; }

  /// Moves to `want` (draining or cancelling) unless the engine is there or later already.
  /// Returns the state it was in. Wakes every waiter when it changed.
  EngineState begin_shutdown(EngineState want);
  /// Waits (condition variable) until nothing is queued, waiting to retry or in flight, until
  /// `until` (time_point::max(): no limit), or until the state leaves `draining`; then moves a
  /// draining engine on to cancelling and wakes every waiter.
  void wait_drained(Clock::time_point until);
  /// cancelling → stopped, once every engine thread has been joined.
  void stopped();

  /// Wakes every thread waiting here: workers, blocked submits, a drain.
  void wake_all();
  /// Wakes the workers waiting for work: a flag of theirs (Taker) changed.
  void wake_workers();

  // ---- accepting ----------------------------------------------------------------------------

  /// Accepts a prepared request (stage `submitting`) into the queue, or refuses it. Refused:
  /// something ended it before (request.hpp, `refusal`), the engine no longer accepts, no worker
  /// can serve, the queue is full (QueueFullPolicy::reject, or still full after waiting up to
  /// submit_timeout and never past the request's deadline with QueueFullPolicy::block), or
  /// admission control. Accepted: the request gets its engine-wide number (Request::seq),
  /// `on_accepted()` runs — under the mutex, so whatever it registers (a place in the ordered
  /// delivery, a deadline timer whose handler withdraws the request here) is in place before
  /// anyone can see the request queued — then the request enters the queue and a worker wakes.
  /// Blocks only with QueueFullPolicy::block and a full queue.
  ///
  /// With `lent` and a request that may run on its caller (Request::caller_run_max): when
  /// nothing is queued and WorkerLending lends a sleeping worker, the request goes
  /// queued → running as that worker's batch of one and `*lent` says which (caller_run.hpp); no
  /// worker wakes. Otherwise `*lent` is left empty and the request is queued.
  template <class OnAccepted>
  std::optional<Refusal> accept(const std::shared_ptr<Request>& r, OnAccepted&& on_accepted,
                                Lent* lent = nullptr) {
    std::unique_lock lock = lock_spinning(mu_);  // held briefly by next_batch, on another core
    Clock::time_point now;
    if (auto refusal = admit(*r, lock, now)) return refusal;
    if (sequences_) {
      // A sequence engine: the request waits with its sequence, not in the queue.
      if (auto refused = sequences_->add(r, now)) return Refusal{"sequence", std::move(*refused)};
      r->seq = next_seq_++;
      on_accepted();
      enqueue_sequence(r, now, lock);
      return std::nullopt;
    }
    r->seq = next_seq_++;
    on_accepted();
    if (lent != nullptr && r->caller_run_max.count() > 0 && lend(r, now, *lent, lock)) {
      return std::nullopt;
    }
    enqueue_accepted(r, now, lock);
    return std::nullopt;
  }

  /// The caller that accept() lent `worker` to has run its batch (caller_run.hpp): the worker
  /// serves the queue again, and is woken when something waits for it.
  void give_back(int worker);

  /// Takes `r` out of wherever it waits here, moving it to stage `to` (a terminal stage), when it
  /// is queued or waiting to retry; records `why` as its refusal when it is still being submitted
  /// (`to` is then not entered: its submit refuses it). See Withdrawal for the outcomes.
  /// On a sequence engine, given `also` and `expired`, a request whose sequence waits in the
  /// backlog and that times out takes the rest of its sequence with it (Triton: the backlog
  /// expired): those requests move to `to` here and are added to `*also`, and `*expired` is set;
  /// the caller ends them all with SequenceTable::backlog_expired().
  Withdrawal withdraw(const std::shared_ptr<Request>& r, Stage to, const Status& why,
                      std::shared_ptr<Request>& ref,
                      std::vector<std::shared_ptr<Request>>* also = nullptr,
                      bool* expired = nullptr);

  // ---- workers ------------------------------------------------------------------------------

  /// Blocks until a batch is ready for `taker` (the batcher's rules, batcher.hpp), and moves its
  /// requests queued → running. Null when the worker must stop taking work: the engine is
  /// cancelling, the taker's flags say so, or the engine no longer accepts and nothing is queued,
  /// waiting to retry or in flight.
  std::shared_ptr<Batch> next_batch(const Taker& taker);
  /// A batch from next_batch has been handled (its requests ended or requeued). On a sequence
  /// engine its sequences may run their next requests (Batch::sequences).
  void batch_finished(const Batch& batch);
  /// A batch of `requests` computed in `compute_us` (admission control's service time).
  void observe_batch(double compute_us, std::size_t requests) noexcept {
    admission_.observe(compute_us, requests);
    lending_.observe(compute_us);  // what bounds a caller run
  }

  /// Puts running requests back at the front of their levels (in their order), without counting
  /// the attempt; with `solo`, each runs in a batch of its own. See Requeued for what is not put
  /// back.
  Requeued requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo);

  /// Whether a request that failed with `code` after `attempts` runs again (RetryScheduler).
  RetryDecision decide_retry(int attempts, StatusCode code, Clock::time_point deadline,
                             Clock::time_point now) {
    return retry_.decide(attempts, code, deadline, now, cancelling());
  }
  /// Moves a running request to the retry waiting set; false when it ended meanwhile.
  bool park_for_retry(const std::shared_ptr<Request>& r);
  /// Its backoff is over: back to the end of its queue level (retries do not count against
  /// queue_capacity), unless it ended meanwhile or can no longer be served.
  BackoffEnd requeue_after_backoff(const std::shared_ptr<Request>& r);

  /// Every worker gave up: later submits are refused with `why` (blocked ones too). Returns the
  /// requests queued or waiting to retry, for the caller to end.
  std::vector<std::shared_ptr<Request>> no_workers(const Status& why);

  // ---- reading ------------------------------------------------------------------------------

  /// Every request queued or waiting to retry, queued first.
  std::vector<std::shared_ptr<Request>> waiting() const;
  struct Depths {
    std::int64_t queued = 0;
    std::int64_t retry_waiting = 0;
    SequenceTable::Counts sequences;  ///< sequence engines
  };
  Depths depths() const;
  bool sequences() const noexcept { return sequences_.has_value(); }

 private:
  /// accept()'s checks, under the lock; `now` is the time of acceptance when it returns nullopt.
  std::optional<Refusal> admit(Request& r, std::unique_lock<std::mutex>& lock,
                               Clock::time_point& now);
  void enqueue_accepted(const std::shared_ptr<Request>& r, Clock::time_point now,
                        std::unique_lock<std::mutex>& lock);
  void enqueue_sequence(const std::shared_ptr<Request>& r, Clock::time_point now,
                        std::unique_lock<std::mutex>& lock);
  /// next_batch on a sequence engine: its slots' next requests (SequenceTable::take), under the
  /// lock; null when nothing is ready, with `wake` the time to look again.
  std::shared_ptr<Batch> take_sequences(const Taker& taker, Clock::time_point& wake,
                                        const std::unique_lock<std::mutex>& lock);
  /// Requests waiting to run (the queue, or the sequences' waiting requests), under mu_.
  std::size_t queued_locked() const noexcept {
    return queue_.size() + (sequences_ ? static_cast<std::size_t>(sequences_->queued()) : 0);
  }
  /// accept()'s caller run, under the lock: true when `r` became a lent worker's batch
  /// (WorkerLending::lend picks the worker).
  bool lend(const std::shared_ptr<Request>& r, Clock::time_point now, Lent& out,
            const std::unique_lock<std::mutex>& lock);
  /// Wakes one worker waiting for work: all of them while one is lent (`any_lent`, read under
  /// the lock: WorkerLending::any_lent), since a lent worker that took the notification would
  /// keep it.
  void notify_one_worker(bool any_lent) {
    if (any_lent) {
      work_cv_.notify_all();
    } else {
      work_cv_.notify_one();
    }
  }
  /// The one place the state changes (under the mutex; an illegal change aborts).
  void set_state(EngineState to, const std::unique_lock<std::mutex>& lock);
  std::vector<std::shared_ptr<Request>> waiting_locked() const;  // under mu_
  /// After a change a drain waits for (a batch finished, a request left): wakes the drain and
  /// the workers (which leave once nothing is left).
  void notify_progress();

  // Options (fixed).
  const std::size_t queue_capacity_;
  const QueueFullPolicy queue_full_policy_;
  const std::chrono::milliseconds submit_timeout_;
  const bool batched_;
  const std::chrono::microseconds max_queue_delay_;
  const std::vector<std::int64_t> preferred_batch_sizes_;
  const std::chrono::microseconds priority_aging_;
  const std::size_t workers_;  // EngineOptions::workers, at least 1

  mutable std::mutex mu_;
  std::condition_variable work_cv_;                       // workers waiting for a batch
  std::condition_variable space_cv_;                      // submits waiting for room in the queue
  std::condition_variable drain_cv_;                      // a drain waiting for the work to finish
  std::atomic<EngineState> state_{EngineState::running};  // written by set_state() under mu_
  RequestQueue queue_;                                    // under mu_
  std::optional<SequenceTable> sequences_;                // under mu_; sequence engines only
  RetryScheduler retry_;                                  // its waiting set under mu_
  AdmissionControl admission_;
  std::int64_t inflight_batches_ = 0;  // under mu_
  std::uint64_t next_seq_ = 0;         // under mu_
  Arrivals arrivals_;                  // noted under mu_ per request put in queue_
  std::optional<Status> no_workers_;   // under mu_: every worker gave up
  WorkerLending lending_;  // under mu_ (its observe() aside): the caller-run fast path's seats
};

}  // namespace asyncinfer::detail
