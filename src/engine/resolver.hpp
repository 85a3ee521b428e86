// resolver.hpp (internal) — the engine's Resolver: ending each accepted request exactly once and
// delivering its result.
//
// What it does:
//   - try_resolve: the one place a request ends (completed, failed, timed_out, cancelled,
//     shut_down). Whoever gets there first wins (the stage's compare-exchange, request.hpp); the
//     others get false. A request still queued or waiting to retry is withdrawn from the
//     Scheduler first.
//   - the ending's bookkeeping: the deadline timer, the per-outcome counters, Triton's
//     success/fail statistics, the request-latency histogram, the id store;
//   - delivery: a future is fulfilled (its continuations go to the completion executor), a
//     callback is handed to the completion executor — one task per batch inside a CallbackBatch —
//     and with EngineOptions::ordered_delivery, results of one sequence key are delivered in
//     submit order (core/ordered_delivery.hpp), one drain per key at a time;
//   - requests by id (Engine::submit(id, ...)): the result store, result(), status(), cancel(),
//     release().
//
// What it does not do: queue, batch or run anything (the Scheduler and the workers), or decide
// whether a failure is retried (the engine's retry scheduler, which calls try_resolve when not).
//
// Thread safety: every public method may be called from any thread; try_resolve concurrently for
// the same request ends it once. Locks: the scheduler's mutex (withdraw) is never held while this
// class takes its own (the reasons mutex, the store's, the ordered-delivery table's), except in
// admit(), which the Scheduler's accept hook calls under it. User code (callbacks, future
// continuations) runs with no lock held, on a completion thread — or on the resolving thread for
// RequestOptions::inline_callback and futures without a callback executor.
//
// Lifetime: the scheduler, timer and completion executor outlive it; the owner shuts the timer
// and the executor down before destroying it.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"
#include "core/ordered_delivery.hpp"
#include "engine/request.hpp"
#include "engine/result_store.hpp"
#include "engine/scheduler.hpp"
#include "engine/statistics.hpp"

namespace asyncinfer::detail {

class Resolver {
 public:
  /// Uses o.ordered_delivery, o.result_store_capacity and o.result_ttl.
  Resolver(const EngineOptions& o, Scheduler& scheduler, DeadlineTimer& timer,
           Executor& completion);
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  // ---- accepting ------------------------------------------------------------------------------

  /// What acceptance registers here, from the Scheduler's accept hook (under its mutex): the
  /// request's place in its key's delivery order, the in-flight count, and its deadline timer
  /// (which ends it timed_out). Non-blocking.
  void admit(const std::shared_ptr<Request>& r);

  /// Prepares a request's promise: its continuations run on the completion executor (unless
  /// `inline_continuations`, or with ordered delivery, where the promise is set on a completion
  /// thread already, in order: posting them would let two threads reorder them); with ordered
  /// delivery, its waits get ordered_wait_would_never_end's check while `owner` is alive.
  void bind_promise(Promise<Outputs>& p, const std::shared_ptr<Request>& r,
                    bool inline_continuations, std::weak_ptr<const void> owner);

  /// failed_precondition when the calling thread is delivering (an ordered drain) an earlier
  /// request of r's key on this resolver: r is delivered only after that callback returns, so a
  /// wait for it there would never end (EngineOptions::ordered_delivery). ok otherwise.
  Status ordered_wait_would_never_end(const Request& r) const;

  // ---- ending ---------------------------------------------------------------------------------

  /// Ends `r` in stage `to` with `result` unless something else ended it first (then false).
  /// `now`, when given, is the time of the ending (a batch's requests share their completion
  /// point's); otherwise the clock is read. A request whose submit has not returned yet is left
  /// to its submit, which refuses it (true, nothing delivered). Non-blocking, except that a
  /// decoupled request's response in progress ends first.
  bool try_resolve(const std::shared_ptr<Request>& r, Stage to, Result<Outputs> result,
                   Clock::time_point now = {});

  /// The deadline timer's handler: ends `r` timed_out, saying where it was and its last error.
  void on_deadline(const std::shared_ptr<Request>& r);

  /// While alive on a thread, callbacks of this resolver's requests ended on that thread are
  /// collected and handed to the completion executor as one task when it goes (one hand-off per
  /// batch instead of one per request). Order within the batch is kept. Nests.
  class CallbackBatch {
   public:
    explicit CallbackBatch(Resolver& resolver);
    ~CallbackBatch();
    CallbackBatch(const CallbackBatch&) = delete;
    CallbackBatch& operator=(const CallbackBatch&) = delete;

   private:
    Resolver& resolver_;
    CallbackBatch* prev_;
    std::vector<Pending> pending_;
    friend class Resolver;
  };

  // ---- requests by id -------------------------------------------------------------------------

  /// Registers r->id; already_exists or resource_exhausted (the store is full) otherwise.
  Status register_id(const std::shared_ptr<Request>& r);
  /// Forgets an id whose submit was refused after register_id.
  void unregister_refused(const std::string& id, const Request* r);
  /// Blocks up to `timeout` (max() = for good) for the result of request `id`.
  Result<Outputs> result(std::string_view id, std::chrono::nanoseconds timeout);
  RequestState status(std::string_view id);
  Status cancel(std::string_view id, const char* message);
  Status release(std::string_view id) { return store_.release(id); }

  // ---- counters -------------------------------------------------------------------------------

  /// Adds what this class counts to `m`: the outcomes and failures by reason, callback
  /// exceptions, requests in flight, the result store's size, the ordered backlog, request
  /// latency and Triton's success/fail statistics.
  void add_metrics(EngineMetrics& m) const;

  /// Accepted requests not ended yet.
  std::int64_t in_flight() const noexcept {
    return inflight_requests_.load(std::memory_order_relaxed);
  }
  /// Accepted requests whose callback has not run yet: in_flight() plus the ended ones whose
  /// callbacks wait on the completion executor (ordered delivery's backlog aside). The engine's
  /// load, as a closed-loop caller sees it: what decides whether its threads spin before they
  /// sleep (EngineOptions::spin_wait).
  std::int64_t undelivered() const noexcept {
    return inflight_requests_.load(std::memory_order_relaxed) +
           queued_callbacks_.load(std::memory_order_relaxed);
  }

 private:
  /// The ending's bookkeeping, then the sink: in order (deliver_ordered) or at once (run_sink).
  void finish(const std::shared_ptr<Request>& r, Stage to, Result<Outputs>&& result,
              Clock::time_point now);
  /// Fulfils the future (waking waiters) or hands the callback to the completion executor.
  void run_sink(const std::shared_ptr<Request>& r, Result<Outputs>&& result);
  void invoke_callback(Request& r, const Result<Outputs>& result);
  void deliver_ordered(const std::shared_ptr<Request>& r, Result<Outputs>&& result);
  /// Delivers, in sequence, every result of `key` whose predecessors have been delivered.
  void drain_order(const std::string& key);
  /// Runs `task` on the completion executor, or here once it has shut down.
  void post(Task task);

  const bool ordered_;
  Scheduler& scheduler_;
  DeadlineTimer& timer_;
  Executor& completion_;
  ResultStore store_;
  OrderedDelivery<Pending, std::string> order_;  // per RequestOptions::sequence_key

  // Hot counters live on their own cache lines: they are bumped from several threads at once.
  OutcomeCounters outcomes_;
  alignas(64) std::atomic<std::int64_t> inflight_requests_{0};
  std::atomic<std::int64_t> queued_callbacks_{0};  // posted to the completion executor, not run
  alignas(64) DurationCounter stat_success_;       // Triton's InferenceStats success and fail
  DurationCounter stat_fail_;
  Histogram request_us_;
  std::atomic<std::uint64_t> callback_exceptions_{0};
  mutable std::mutex reasons_mu_;
  std::map<std::string, std::uint64_t> failures_by_reason_;  // under reasons_mu_
};

}  // namespace asyncinfer::detail
