// batcher.hpp (internal) — which queued requests form the next batch, and when.
//
// The batcher is a pure function of the queue's contents, the batching options and the current
// time (after Triton core's split of GetDynamicBatch from BatcherThread): plan_batch() takes no
// lock, starts no thread and changes nothing. Scheduler::next_batch (scheduler.hpp) calls it under
// the queue mutex, then either takes the requests it returned or sleeps until the time it returned
// (or until the queue changes, which notifies it). So every batching rule can be tested with a
// queue built by hand and a made-up clock (tests/unit/test_batcher.cpp).
//
// The rules, in order:
//   1. the first request is RequestQueue::next(now, priority_aging): the head of the highest
//      non-empty level, unless a lower level's head has waited past the aging limit;
//   2. batch-compatible requests (same dtypes and non-batch dims, those of ragged inputs aside:
//      batch_compatible()) join it in priority order, FIFO within a level, while the rows fit
//      max_rows; requests marked `solo` (a failed batch being split) run alone; the scan is
//      bounded (4 × max_rows + 64 requests);
//   3. before the delay ends, the longest run of the joined requests, in order from the first,
//      whose rows are a preferred batch size goes at once, or, without one, the run that the next
//      would carry past the largest preferred size (Triton core's GetDynamicBatch and its
//      best_preferred_batch_size); with max_queue_delay 0 too;
//   4. otherwise the batch goes at once when it cannot grow (max_rows or the largest preferred
//      size reached), when a queued request was passed over in 2 (Triton sends a batch that the
//      next request cannot join, rather than hold that request behind the delay), when batching
//      is off (unbatched model, max_rows 1) or the delay is 0, or when the engine is flushing
//      (shutting down);
//   5. otherwise the batch waits until the oldest request has waited max_queue_delay, but never
//      past the nearest deadline minus max_queue_delay (deadline-aware wake); at that time it goes
//      with what it has.
// Where batching is off (an unbatched model, max_rows 1) and the model runs a launch's requests
// each alone (`coalesce`, Model::coalesced_requests), the queued requests go together, in
// priority order, up to `coalesce` of them, whatever their shapes, at once: coalesced, not
// batched. Requests marked `solo` are passed over, and go alone.
// A request that leaves the queue (cancelled, timed out) leaves a forming batch with it: the
// next call simply does not see it, and the wake time follows the requests that remain.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/request_queue.hpp"

namespace asyncinfer::detail {

struct BatcherConfig {
  bool batched = true;        ///< the model takes a batch dim (ModelSignature::batched)
  std::int64_t max_rows = 1;  ///< rows a batch may hold now (1 for a half-open breaker's probe)
  std::chrono::microseconds max_queue_delay{0};  ///< BatchingOptions::max_queue_delay
  std::span<const std::int64_t> preferred_batch_sizes;
  std::chrono::microseconds priority_aging{0};  ///< EngineOptions::priority_aging (0 = none)
  bool flush = false;  ///< the engine is shutting down: take what is there, wait for nothing
  /// Where batching is off: requests a launch may carry, each run alone (EngineContext::coalesce;
  /// 0 or 1 = one).
  int coalesce = 0;
};

struct BatchPlan {
  /// The requests to take now, in dispatch order; empty = take nothing yet.
  std::vector<Request*> take;
  std::int64_t rows = 0;  ///< their rows
  /// When `take` is empty: when to look again. time_point::max() = only when the queue changes
  /// (an empty queue, or max_queue_delay max() with no deadline).
  Clock::time_point wake = Clock::time_point::max();

  bool ready() const noexcept { return !take.empty(); }
  /// How long to wait from `now` before looking again (nanoseconds::max() = until notified).
  std::chrono::nanoseconds wait(Clock::time_point now) const noexcept;
};

/// The next batch from `queue` at `now` under `config` (the rules above). Pure; O(scan limit).
BatchPlan plan_batch(const RequestQueue& queue, const BatcherConfig& config, Clock::time_point now);

}  // namespace asyncinfer::detail
