// batch_failure.hpp (internal) — BatchFailure: the engine-wide ends of a failed batch, which touch
// no worker's state. A batch failed (the Worker's completion point, the hang watchdog, a
// recycle): its running requests are split so that one bad request fails alone, put back in the
// queue, retried after their backoff (the Scheduler decides, RetryScheduler's rule) or ended;
// failures that arrive after their requests had ended (late failures) are counted and logged,
// rate-limited. And when the last worker gave up, everything waiting ends here.
//
// What it uses, all by reference (EngineCore owns them, through the EngineContext): the engine's
// options (retry, batching.split_failed_batches), the sequence plan (a sequence engine's requests
// run once), the Scheduler (requeue, retry waiting set), the Resolver (ending a request once),
// the deadline timer (retry backoff) and the EngineCounters.
//
// Thread safety: every method may be called from any thread at once (workers, the timer, the
// dispatcher). It takes no lock of its own but the log limiter's and the counters' (leaves), and
// the Scheduler's, the Resolver's and the request's timer_mu through their methods; never with a
// worker's mutex held by it. No method blocks on anything but those. No user code runs here:
// ending a request hands its callback to the Resolver's executors.
//
// Lifetime: constructed after everything it refers to; the deadline timer, whose retry handlers
// refer to it, is shut down (EngineCore::shutdown) before it is destroyed.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"
#include "asyncinfer/log.hpp"
#include "engine/engine_counters.hpp"
#include "engine/request.hpp"
#include "engine/resolver.hpp"
#include "engine/scheduler.hpp"
#include "engine/sequence_batcher.hpp"

namespace asyncinfer::detail {

class BatchFailure {
 public:
  /// `sequence_plan`: set on a sequence engine (EngineOptions::sequence_batching), else null.
  /// Owns nothing it is given; all of it must outlive this object.
  BatchFailure(const EngineOptions& options, const SequencePlan* sequence_plan,
               Scheduler& scheduler, Resolver& resolver, DeadlineTimer& timer,
               EngineCounters& counters);
  BatchFailure(const BatchFailure&) = delete;
  BatchFailure& operator=(const BatchFailure&) = delete;

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

  /// The last worker that could serve gave up (`cause`): everything queued or waiting to retry
  /// fails `unavailable`, and later submits are refused with it.
  void no_worker_left(const std::string& cause);

  /// A failure that reached `n` requests which had already ended (timed out, cancelled, shut
  /// down): counted per request by reason; its message is logged once, rate-limited.
  void late_failure(std::size_t n, const Status& st, const Request& example);

  /// The completion point of a batch the watchdog already ended: its result is late.
  void late_outcome(const Batch& batch, const Status& st);

  /// Whether `st` is only the engine's own doing, not a failure: the batch's work stopped because
  /// its stop token fired (all its requests ended, or the watchdog), or its stream was destroyed
  /// (a recycle, shutdown).
  static bool own_stop(const Batch& batch, const Status& st);

 private:
  const EngineOptions& opt_;
  const SequencePlan* const sequence_plan_;
  Scheduler& scheduler_;
  Resolver& resolver_;
  DeadlineTimer& timer_;
  EngineCounters& counters_;
  LogLimiter late_log_;  // late failures: their messages, rate-limited
};

}  // namespace asyncinfer::detail
