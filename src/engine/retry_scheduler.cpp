#include "engine/retry_scheduler.hpp"

namespace asyncinfer {
namespace detail {

RetryScheduler::RetryScheduler(const RetryPolicy& policy)
    : policy_(policy), budget_(policy), rng_(std::random_device{}()) {}

void RetryScheduler::on_request(Clock::time_point now) {
  if (policy_.max_attempts > 1) budget_.on_request(now);
}

RetryDecision RetryScheduler::decide(int attempts, StatusCode code, Clock::time_point deadline,
                                     Clock::time_point now, bool cancelling) {
  RetryDecision d;
  if (attempts >= policy_.max_attempts || !policy_.is_retryable(code) || cancelling) return d;
  std::chrono::microseconds wait;
  {
    std::lock_guard lock(rng_mu_);
    wait = policy_.backoff(attempts + 1, rng_);
  }
  d.at = saturating_add(now, wait);
  if (d.at >= deadline) {
    d.why_not = "no time left before the deadline for attempt " + std::to_string(attempts + 1);
  } else if (!budget_.try_retry(now)) {
    d.denied_by_budget = true;
    d.why_not = "retry budget exhausted";
  } else {
    d.retry = true;
  }
  return d;
}

Status RetryScheduler::final_status(const Status& last, int attempts, const std::string& why_not,
                                    const std::string& tag) {
  if (attempts <= 1 && why_not.empty()) return last;
  std::string msg =
      "failed after " + std::to_string(attempts) + " attempt" + (attempts == 1 ? "" : "s");
  if (!why_not.empty()) msg += " (" + why_not + ")";
  msg += "; last error: " + last.to_string();
  return Status(last.code(), with_tag(msg, tag));
}

std::shared_ptr<Request> RetryScheduler::unpark(Request* r) {
  auto it = waiting_.find(r);
  if (it == waiting_.end()) return nullptr;
  std::shared_ptr<Request> ref = std::move(it->second);
  waiting_.erase(it);
  return ref;
}

std::vector<std::shared_ptr<Request>> RetryScheduler::all() const {
  std::vector<std::shared_ptr<Request>> out;
  out.reserve(waiting_.size());
  for (const auto& [ptr, ref] : waiting_) out.push_back(ref);
  return out;
}

}  // namespace detail
}  // namespace asyncinfer
