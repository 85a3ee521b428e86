#include "engine/request_queue.hpp"

#include <algorithm>

namespace asyncinfer::detail {

RequestQueue::~RequestQueue() {
  for (Request* r : all()) remove(r);
}

void RequestQueue::push_back(const std::shared_ptr<Request>& r) {
  const auto l = static_cast<std::size_t>(r->level);
  r->prev = tails_[l];
  r->next = nullptr;
  if (tails_[l] != nullptr) {
    tails_[l]->next = r.get();
  } else {
    heads_[l] = r.get();
  }
  tails_[l] = r.get();
  r->in_queue = true;
  r->queue_ref = r;
  ++size_;
}

void RequestQueue::push_front(const std::shared_ptr<Request>& r) {
  const auto l = static_cast<std::size_t>(r->level);
  r->prev = nullptr;
  r->next = heads_[l];
  if (heads_[l] != nullptr) {
    heads_[l]->prev = r.get();
  } else {
    tails_[l] = r.get();
  }
  heads_[l] = r.get();
  r->in_queue = true;
  r->queue_ref = r;
  ++size_;
}

std::shared_ptr<Request> RequestQueue::remove(Request* r) {
  if (!r->in_queue) return nullptr;
  const auto l = static_cast<std::size_t>(r->level);
  if (r->prev != nullptr) {
    r->prev->next = r->next;
  } else {
    heads_[l] = r->next;
  }
  if (r->next != nullptr) {
    r->next->prev = r->prev;
  } else {
    tails_[l] = r->prev;
  }
  r->prev = r->next = nullptr;
  r->in_queue = false;
  --size_;
  return std::move(r->queue_ref);
}

Request* RequestQueue::next(Clock::time_point now, std::chrono::microseconds aging) const noexcept {
  // microseconds::max() means "never aged": compared in the clock's unit without overflow.
  const Clock::duration limit = saturating_cast<Clock::duration>(aging);
  Request* best = nullptr;
  for (Request* h : heads_) {
    if (h == nullptr) continue;
    if (best == nullptr) {
      best = h;
      if (aging.count() <= 0) return best;
      continue;
    }
    // A lower level's head that has waited past the aging limit competes as if at the top
    // level; among such requests the older wins.
    const bool h_aged = now - h->enqueued >= limit;
    const bool best_aged = best->level == 0 || now - best->enqueued >= limit;
    if (h_aged && (!best_aged || h->enqueued < best->enqueued)) best = h;
  }
  return best;
}

std::vector<Request*> RequestQueue::all() const {
  std::vector<Request*> out;
  out.reserve(size_);
  for (Request* h : heads_) {
    for (Request* r = h; r != nullptr; r = r->next) out.push_back(r);
  }
  return out;
}

}  // namespace asyncinfer::detail
