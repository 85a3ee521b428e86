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
  if (!batching && c.coalesce > 1 && !head->solo) {
    // Coalesced (the header's last rule): what is queued goes now, each request run alone.
    const auto limit = static_cast<std::size_t>(c.coalesce);
    std::size_t scanned = 0;
    const std::size_t scan_limit = 4 * limit + 64;
    for (int l = 0; l < queue.levels() && picked.size() < limit && scanned < scan_limit; ++l) {
      for (Request* r = queue.head(l);
           r != nullptr && picked.size() < limit && scanned < scan_limit; r = r->next) {
        ++scanned;
        if (r == head || r->solo) continue;
        picked.push_back(r);
        rows += r->rows;
      }
    }
    plan.take = std::move(picked);
    plan.rows = rows;
    return plan;
  }
  // Triton's max_preferred_batch_size: past it a batch goes without waiting.
  std::int64_t max_preferred = cap;
  if (!c.preferred_batch_sizes.empty()) {
    max_preferred = std::min(
        cap, *std::max_element(c.preferred_batch_sizes.begin(), c.preferred_batch_sizes.end()));
  }
  // Without preferred sizes, a full batch is the one (Triton's config completion makes
  // max_batch_size the preferred size).
  const auto preferred = [&](std::int64_t n) {
    if (c.preferred_batch_sizes.empty()) return n == cap;
    return std::find(c.preferred_batch_sizes.begin(), c.preferred_batch_sizes.end(), n) !=
           c.preferred_batch_sizes.end();
  };
  // How many of `picked` make the batch to take before the delay ends: the longest run from the
  // head whose rows are a preferred size, or the run the next request would carry past the
  // largest one; 0 = none.
  std::size_t best = preferred(rows) ? 1 : 0;
  // A queued request was passed over (another shape, too many rows, or one that runs alone):
  // the batch goes without waiting, so that the request is not held back by the delay.
  bool passed_over = false;
  if (batching && rows < cap) {
    // Batch-compatible requests in priority order, FIFO within a level; bounded scan.
    std::size_t scanned = 0;
    const auto scan_limit = static_cast<std::size_t>(4 * cap + 64);
    for (int l = 0; l < queue.levels() && rows < cap && scanned < scan_limit; ++l) {
      for (Request* r = queue.head(l); r != nullptr && rows < cap && scanned < scan_limit;
           r = r->next) {
        if (r == head) continue;
        ++scanned;
        if (r->solo || !batch_compatible(*head, *r)) {
          passed_over = true;
          continue;
        }
        if (best == 0 && rows + r->rows > max_preferred) best = picked.size();
        if (rows + r->rows > cap) {
          passed_over = true;
          continue;
        }
        picked.push_back(r);
        rows += r->rows;
        oldest = std::min(oldest, r->enqueued);
        nearest_deadline = std::min(nearest_deadline, r->deadline);
        if (preferred(rows)) best = picked.size();
      }
    }
  }
  // The delay ends max_queue_delay after the oldest request came, and never later than the
  // nearest deadline minus the delay (deadline-aware wake); max() = never (saturating).
  bool waited = true;
  if (c.max_queue_delay.count() > 0) {
    const auto delay = saturating_cast<Clock::duration>(c.max_queue_delay);
    Clock::time_point wake = saturating_add(oldest, delay);
    if (nearest_deadline != Clock::time_point::max()) {
      wake = std::min(wake, saturating_add(nearest_deadline, -delay));
    }
    waited = now >= wake;
    plan.wake = wake;
  }
  if (batching && best > 0 && !(waited && c.max_queue_delay.count() > 0) && !c.flush) {
    picked.resize(best);  // a preferred size (Triton's best_preferred_batch_size)
    rows = 0;
    for (const Request* r : picked) rows += r->rows;
  } else if (batching && !passed_over && rows < max_preferred && !waited && !c.flush) {
    return plan;  // wait for more requests, or for the delay to end
  }
  plan.wake = Clock::time_point::max();
  plan.take = std::move(picked);
  plan.rows = rows;
  return plan;
}

}  // namespace asyncinfer::detail
