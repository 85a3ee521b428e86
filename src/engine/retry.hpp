// retry.hpp (internal) — the engine's retry budget.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>

#include "asyncinfer/executor.hpp"
#include "asyncinfer/policy.hpp"

namespace asyncinfer::detail {

/// Sliding-window retry budget (Finagle's RetryBudget; gRPC retry throttling): counts requests
/// and retries in one-second buckets over the window; a retry is allowed while
/// retries < ratio × requests + min_per_s × window_s. Thread-safe.
class RetryBudget {
 public:
  explicit RetryBudget(const RetryPolicy& policy);
  void on_request(Clock::time_point now);
  /// Takes one retry from the budget; false (and nothing taken) when the budget is spent.
  bool try_retry(Clock::time_point now);

 private:
  struct Bucket {
    std::int64_t second;
    std::uint64_t requests = 0;
    std::uint64_t retries = 0;
  };
  Bucket& current(Clock::time_point now);
  double ratio_;
  double min_per_s_;
  std::int64_t window_s_;
  std::mutex mu_;
  std::deque<Bucket> buckets_;
};

}  // namespace asyncinfer::detail
