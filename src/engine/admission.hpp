// admission.hpp (internal) — admission control (EngineOptions::admission_control): refuse at
// submit a request that would miss its deadline waiting in the queue, instead of accepting it and
// timing it out later.
//
// The prediction: queued requests × recent service time per request / workers, against the time
// left to the request's deadline. The service time is an exponentially weighted moving average
// (weight 1/8) of compute time per request over completed batches; until a batch has completed it
// is 0 and nothing is refused. A request without a deadline is never refused. Thread-safe
// (check() and observe() race benignly: one relaxed atomic).
#pragma once

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>

#include "asyncinfer/executor.hpp"

namespace asyncinfer::detail {

class AdmissionControl {
 public:
  AdmissionControl(bool enabled, int workers) : enabled_(enabled), workers_(workers) {}

  /// Why a request with `deadline` is refused when `queued` requests are ahead of it at `now`;
  /// nullopt when it is admitted.
  std::optional<std::string> check(std::size_t queued, Clock::time_point now,
                                   Clock::time_point deadline) const;
  /// A batch of `requests` computed in `compute_us` microseconds.
  void observe(double compute_us, std::size_t requests) noexcept;
  /// The recent service time per request, microseconds (0 before the first batch).
  double service_us() const noexcept { return service_us_.load(std::memory_order_relaxed); }

 private:
  bool enabled_;
  int workers_;
  std::atomic<double> service_us_{0};
};

}  // namespace asyncinfer::detail
