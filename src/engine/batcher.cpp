#include "engine/batcher.hpp"

#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"

namespace asyncinfer::detail {

std::chrono::nanoseconds BatchPlan::wait(Clock::time_point now) const noexcept {
  if (ready() || now >= wake) return std::chrono::nanoseconds(0);
  if (no_limit(wake)) return std::chrono::nanoseconds::max();
  return saturating_cast<std::chrono::nanoseconds>(wake - now);
}

BatchPlan plan_batch(const RequestQueue& queue, const BatcherConfig& c, Clock::time_point now) {
  BatchPlan plan;
  if (queue.empty()) return plan;
  Request* head = queue.next(now, c.priority_aging);
  std::vector<Request*> picked{head};
  std::int64_t rows = head->rows;
  Clock::time_point oldest = head->enqueued;
  Clock::time_point nearest_deadline = head->deadline;
  const std::int64_t cap = c.max_rows;
  const bool batching = c.batched && cap > 1 && !head->solo;
  if (batching && rows < cap) {
    // Shape-compatible requests in priority order, FIFO within a level; bounded scan.
    std::size_t scanned = 0;
    const auto scan_limit = static_cast<std::size_t>(4 * cap + 64);
    for (int l = 0; l < queue.levels() && rows < cap && scanned < scan_limit; ++l) {
      for (Request* r = queue.head(l); r != nullptr && rows < cap && scanned < scan_limit;
           r = r->next) {
        ++scanned;
        if (r == head || r->solo || rows + r->rows > cap || !batch_compatible(*head, *r)) continue;
        picked.push_back(r);
        rows += r->rows;
        oldest = std::min(oldest, r->enqueued);
        nearest_deadline = std::min(nearest_deadline, r->deadline);
      }
    }
  }
  bool dispatch = !batching || rows >= cap || c.flush || c.max_queue_delay.count() <= 0;
  if (!dispatch && !c.preferred_batch_sizes.empty()) {
    std::int64_t best = 0;
    for (std::int64_t p : c.preferred_batch_sizes) {
      if (p <= rows) best = std::max(best, p);
    }
    if (best > 0) {
      // Take the requests (in order) that fit the largest reachable preferred size.
      std::vector<Request*> fit;
      std::int64_t fit_rows = 0;
      for (Request* r : picked) {
        if (fit_rows + r->rows <= best) {
          fit.push_back(r);
          fit_rows += r->rows;
        }
      }
      picked.swap(fit);
      rows = fit_rows;
      dispatch = true;
    }
  }
  if (!dispatch) {
    // max_queue_delay max(): wait for a full batch or a preferred size (saturating).
    const auto delay = saturating_cast<Clock::duration>(c.max_queue_delay);
    Clock::time_point wake = saturating_add(oldest, delay);
    // Never hold a request in a forming batch past its deadline minus the delay.
    if (nearest_deadline != Clock::time_point::max()) {
      wake = std::min(wake, saturating_add(nearest_deadline, -delay));
    }
    if (now < wake) {
      plan.wake = wake;
      return plan;
    }
  }
  plan.take = std::move(picked);
  plan.rows = rows;
  return plan;
}

}  // namespace asyncinfer::detail
