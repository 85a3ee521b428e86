// retry_scheduler.hpp (internal) — whether and when a failed request runs again
// (EngineOptions::retry), and the requests waiting out their backoff.
//
// decide() is the rule: a request is retried while it has attempts left (RetryPolicy::
// max_attempts), its error is retryable (RetryPolicy::is_retryable), the engine is not cancelling,
// the backoff (full jitter, RetryPolicy::backoff) ends before its deadline, and the retry budget
// (RetryBudget, retry.hpp) allows one more. Otherwise final_status() is the error the request ends
// with, naming its attempts and why it was not retried.
//
// The waiting set holds a reference to each request in `retry_wait` (the deadline timer holds
// none), so it stays alive until its backoff timer requeues it or something ends it. The set is
// not thread-safe: the Scheduler (scheduler.hpp) owns it and guards it with the queue mutex
// (request.hpp's queue rule). The engine's side (BatchFailure::retry_or_fail,
// requeue_after_backoff) is in batch_failure.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "asyncinfer/policy.hpp"
#include "engine/request.hpp"
#include "engine/retry.hpp"

namespace asyncinfer::detail {

struct RetryDecision {
  bool retry = false;
  Clock::time_point at{};  ///< when to requeue (retry)
  std::string why_not;     ///< why not, when the policy would have retried; else empty
  bool denied_by_budget = false;
};

class RetryScheduler {
 public:
  explicit RetryScheduler(const RetryPolicy& policy);

  /// Counts a request accepted at `now` (the budget's denominator).
  void on_request(Clock::time_point now);
  /// Whether a request that failed with `code` after `attempts` attempts runs again (the rule
  /// above); a retry is taken from the budget. Thread-safe.
  RetryDecision decide(int attempts, StatusCode code, Clock::time_point deadline,
                       Clock::time_point now, bool cancelling);
  /// The error a request ends with after its last attempt failed with `last`.
  static Status final_status(const Status& last, int attempts, const std::string& why_not,
                             const std::string& tag);

  // The waiting set (under the Scheduler's queue mutex).
  void park(const std::shared_ptr<Request>& r) { waiting_.emplace(r.get(), r); }
  /// Removes `r`; its reference, or null when it is not waiting.
  std::shared_ptr<Request> unpark(Request* r);
  bool waiting(const Request* r) const { return waiting_.count(const_cast<Request*>(r)) != 0; }
  bool empty() const noexcept { return waiting_.empty(); }
  std::size_t size() const noexcept { return waiting_.size(); }
  std::vector<std::shared_ptr<Request>> all() const;

 private:
  RetryPolicy policy_;
  RetryBudget budget_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::unordered_map<Request*, std::shared_ptr<Request>> waiting_;
};

}  // namespace asyncinfer::detail
