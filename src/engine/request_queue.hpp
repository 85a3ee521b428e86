// request_queue.hpp (internal) — the engine's priority queue.
//
// One intrusive doubly-linked FIFO per priority level, so a request leaves the queue in O(1) when
// it is cancelled or times out (the article's queue.Queue cannot remove anything). Not
// thread-safe: the Scheduler (scheduler.hpp) guards it with its mutex, the queue mutex.
//
// Aging: with an aging limit, a request whose wait exceeds it is served as if it were at the top
// level (ties broken by arrival), so a lower level cannot starve forever. The rule is applied when
// the batcher picks the next batch's first request.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "engine/request.hpp"

namespace asyncinfer::detail {

class RequestQueue {
 public:
  explicit RequestQueue(int levels)
      : heads_(static_cast<std::size_t>(levels)), tails_(static_cast<std::size_t>(levels)) {}
  /// Unlinks what is still queued, dropping the queue's references (a queued request holds one
  /// to itself, `queue_ref`, which would otherwise keep it alive for good).
  ~RequestQueue();
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  void push_back(const std::shared_ptr<Request>& r);
  void push_front(const std::shared_ptr<Request>& r);
  /// Unlinks `r`; returns the queue's reference so the caller can drop it outside the lock.
  std::shared_ptr<Request> remove(Request* r);

  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  int levels() const noexcept { return static_cast<int>(heads_.size()); }

  /// The request to serve next at `now`: the head of the highest non-empty level, unless a lower
  /// level's head has waited longer than `aging` (0 = no aging); null when empty.
  Request* next(Clock::time_point now, std::chrono::microseconds aging) const noexcept;
  /// First request of `level`, then follow Request::next.
  Request* head(int level) const noexcept { return heads_[static_cast<std::size_t>(level)]; }

  /// Every queued request, highest level first, FIFO within a level (for shutdown).
  std::vector<Request*> all() const;

 private:
  std::vector<Request*> heads_;
  std::vector<Request*> tails_;
  std::size_t size_ = 0;
};

}  // namespace asyncinfer::detail
