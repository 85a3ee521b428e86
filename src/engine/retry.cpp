#include "engine/retry.hpp"

#include <algorithm>
#include <cmath>

namespace asyncinfer {

bool RetryPolicy::is_retryable(StatusCode code) const noexcept {
  if (code == StatusCode::invalid_argument || code == StatusCode::cancelled ||
      code == StatusCode::deadline_exceeded || code == StatusCode::ok) {
    return false;
  }
  return std::find(retryable_codes.begin(), retryable_codes.end(), code) != retryable_codes.end();
}

std::chrono::microseconds RetryPolicy::backoff(int next_attempt, std::mt19937_64& rng) const {
  // Full jitter: uniform in [0, min(cap, base × multiplier^(n-1))], n = retries so far + 1.
  const int n = std::max(1, next_attempt - 1);
  const double base = static_cast<double>(initial_backoff.count());
  const double cap = static_cast<double>(max_backoff.count());
  const double ceiling = std::min(cap, base * std::pow(multiplier, n - 1));
  std::uniform_real_distribution<double> dist(0.0, std::max(0.0, ceiling));
  // max_backoff = microseconds::max() is "no cap": the double may reach 2^63, which no int64
  // holds, so convert saturating.
  return detail::saturating_cast<std::chrono::microseconds>(
      std::chrono::duration<double, std::micro>(dist(rng)));
}

Status RetryPolicy::validate() const {
  if (max_attempts < 1) {
    return invalid_argument_error("retry.max_attempts must be >= 1 (1 = no retries), got " +
                                  std::to_string(max_attempts));
  }
  if (initial_backoff.count() < 0 || max_backoff.count() < 0 || multiplier < 1.0) {
    return invalid_argument_error(
        "retry: initial_backoff and max_backoff must be >= 0 and multiplier >= 1");
  }
  for (StatusCode c : retryable_codes) {
    if (c == StatusCode::invalid_argument || c == StatusCode::cancelled ||
        c == StatusCode::deadline_exceeded || c == StatusCode::ok) {
      return invalid_argument_error("retry.retryable_codes may not include " +
                                    std::string(to_string(c)) +
                                    " (ok, invalid_argument, cancelled and deadline_exceeded are "
                                    "never retried)");
    }
  }
  if (budget_ratio < 0 || budget_min_retries_per_s < 0 || budget_window.count() < 1000) {
    return invalid_argument_error(
        "retry budget: ratio and min retries per second must be >= 0 and the window >= 1000 ms");
  }
  return Status();
}

Status RecoveryOptions::validate() const {
  if (max_recycle_attempts < 1) {
    return invalid_argument_error("recovery.max_recycle_attempts must be >= 1, got " +
                                  std::to_string(max_recycle_attempts));
  }
  if (recycle_backoff.count() < 0 || max_recycle_backoff.count() < 0) {
    return invalid_argument_error("recovery: recycle_backoff and max_recycle_backoff must be >= 0");
  }
  if (max_abandoned_instances < 0) {
    return invalid_argument_error("recovery.max_abandoned_instances must be >= 0, got " +
                                  std::to_string(max_abandoned_instances));
  }
  return Status();
}

namespace detail {

RetryBudget::RetryBudget(const RetryPolicy& policy)
    : ratio_(policy.budget_ratio),
      min_per_s_(policy.budget_min_retries_per_s),
      window_s_(std::max<std::int64_t>(1, policy.budget_window.count() / 1000)) {}

RetryBudget::Bucket& RetryBudget::current(Clock::time_point now) {
  const std::int64_t second =
      std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  while (!buckets_.empty() && buckets_.front().second <= second - window_s_) buckets_.pop_front();
  if (buckets_.empty() || buckets_.back().second != second) buckets_.push_back(Bucket{second});
  return buckets_.back();
}

void RetryBudget::on_request(Clock::time_point now) {
  std::lock_guard lock(mu_);
  current(now).requests++;
}

bool RetryBudget::try_retry(Clock::time_point now) {
  std::lock_guard lock(mu_);
  Bucket& b = current(now);
  std::uint64_t requests = 0;
  std::uint64_t retries = 0;
  for (const Bucket& x : buckets_) {
    requests += x.requests;
    retries += x.retries;
  }
  const double allowed =
      ratio_ * static_cast<double>(requests) + min_per_s_ * static_cast<double>(window_s_);
  if (static_cast<double>(retries) + 1.0 > allowed) return false;
  b.retries++;
  return true;
}

}  // namespace detail
}  // namespace asyncinfer
