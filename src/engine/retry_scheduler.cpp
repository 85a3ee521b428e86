#include "engine/retry_scheduler.hpp"

#include "engine/engine_context.hpp"

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

void EngineContext::retry_or_fail(const std::shared_ptr<Request>& r, const Status& st) {
  {
    std::lock_guard tl(r->timer_mu);
    r->last_error = st;
  }
  if (r->on_response) return fail_partial(r, st);  // decoupled: runs once
  const int tries = r->attempts.load(std::memory_order_relaxed);
  const detail::RetryDecision d =
      scheduler.decide_retry(tries, st.code(), r->deadline, Clock::now());
  if (d.denied_by_budget) retries_denied.fetch_add(1, std::memory_order_relaxed);
  if (d.retry) {
    if (!scheduler.park_for_retry(r)) {
      late_failure(1, st, *r);  // ended meanwhile (deadline, cancel)
      return;
    }
    retries.fetch_add(1, std::memory_order_relaxed);
    TimerId id = timer.add(d.at, [this, r] { requeue_after_backoff(r); });
    std::lock_guard tl(r->timer_mu);
    r->retry_timer = id;
    return;
  }
  Status final = detail::RetryScheduler::final_status(st, tries, d.why_not, r->tag);
  const Status copy = final;
  if (!resolver.try_resolve(r, detail::stage_for_error(final.code()), std::move(final))) {
    late_failure(1, copy, *r);  // ended meanwhile (deadline, cancel)
  }
}

void EngineContext::requeue_after_backoff(const std::shared_ptr<Request>& r) {
  const detail::BackoffEnd end = scheduler.requeue_after_backoff(r);
  if (end.unservable) {
    end_unservable(r, end.unavailable, "engine shut down while the request waited to retry");
  }
}

}  // namespace detail
}  // namespace asyncinfer
