#include "engine/admission.hpp"

#include <cstdio>

#include "engine/lifecycle.hpp"

namespace asyncinfer::detail {

std::optional<std::string> AdmissionControl::check(std::size_t queued, Clock::time_point now,
                                                   Clock::time_point deadline) const {
  if (!enabled_ || deadline == Clock::time_point::max()) return std::nullopt;
  const double service = service_us();
  const double predicted_us = static_cast<double>(queued) * service / static_cast<double>(workers_);
  const double left_us = us_between(now, deadline);
  if (predicted_us <= left_us) return std::nullopt;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "admission control: predicted queue wait %.1f ms (%zu queued x %.3f ms "
                "per request / %d workers) exceeds the %.1f ms left to the deadline",
                predicted_us / 1000.0, queued, service / 1000.0, workers_, left_us / 1000.0);
  return std::string(buf);
}

void AdmissionControl::observe(double compute_us, std::size_t requests) noexcept {
  if (requests == 0) return;
  const double per_request = compute_us / static_cast<double>(requests);
  const double old = service_us_.load(std::memory_order_relaxed);
  service_us_.store(old == 0 ? per_request : old + (per_request - old) / 8.0,
                    std::memory_order_relaxed);
}

}  // namespace asyncinfer::detail
