// circuit_breaker.hpp (internal) — one worker's circuit breaker (EngineOptions::breaker), an owned
// class with private state and a checked life cycle.
//
//   closed ──failure_threshold failed batches in a row──▶ open
//   open ──cool-down over (the worker looks: admit())──▶ half_open
//   half_open ──its one probe request succeeds──▶ closed
//   half_open ──the probe fails──▶ open
//
// The pattern is the circuit breaker of M. Nygard, "Release It!" (2007), ch. 5, as Envoy's
// outlier detection and resilience4j apply it per upstream: here per worker, so one bad model
// instance or device stream stops taking work while the others go on.
//
// What counts as a failure: a batch that failed for the worker's reasons. invalid_argument (the
// request's fault), cancelled and aborted (the caller's choice, shutdown) do not count.
//
// Thread safety: not synchronised: the worker's mutex guards every method, except open_flag(),
// an atomic mirror of "open" that the Scheduler reads under its own mutex (Taker::breaker_open)
// so that a worker waiting for work does not take a request once its breaker opened. No method
// blocks; waiting out the cool-down is the caller's (admit() says until when).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "asyncinfer/detail/chrono.hpp"
#include "asyncinfer/detail/transitions.hpp"
#include "asyncinfer/policy.hpp"
#include "asyncinfer/status.hpp"
#include "engine/lifecycle.hpp"

namespace asyncinfer::detail {

enum class Breaker : std::uint8_t { closed, open, half_open };

inline constexpr Transitions<Breaker, 3> kBreakerMoves{"circuit breaker",
                                                       {"closed", "open", "half_open"},
                                                       {
                                                           {Breaker::closed, Breaker::open},
                                                           {Breaker::open, Breaker::half_open},
                                                           {Breaker::half_open, Breaker::closed},
                                                           {Breaker::half_open, Breaker::open},
                                                       }};
inline const char* to_string(Breaker b) noexcept { return kBreakerMoves.name(b); }

class CircuitBreaker {
 public:
  /// failure_threshold 0: no breaker (it never opens); cooldown max(): once open, open for good.
  explicit CircuitBreaker(CircuitBreakerOptions o) noexcept : opt_(o) {}
  CircuitBreaker(const CircuitBreaker&) = delete;
  CircuitBreaker& operator=(const CircuitBreaker&) = delete;

  Breaker state() const noexcept { return state_; }

  /// Whether the worker may take work at `now`, and how much: nullopt while open (then
  /// open_until() says until when), else the requests it may have in flight — 1 when half open
  /// (the probe), `limit` when closed. An open breaker whose cool-down is over turns half open
  /// here.
  std::optional<int> admit(int limit, Clock::time_point now) noexcept {
    if (state_ == Breaker::open) {
      if (now < open_until_) return std::nullopt;
      kBreakerMoves.move(state_, Breaker::half_open);
      open_.store(false, std::memory_order_release);
    }
    return state_ == Breaker::half_open ? 1 : limit;
  }

  /// When an open breaker's cool-down ends (max(): never).
  Clock::time_point open_until() const noexcept { return open_until_; }

  /// A batch succeeded: the failure count restarts, a half-open breaker closes.
  void record_success() noexcept {
    failures_ = 0;
    if (state_ == Breaker::half_open) kBreakerMoves.move(state_, Breaker::closed);
  }

  /// A batch failed with `code` at `now`. Returns true when this opened the breaker (the caller
  /// then wakes a worker that waits for work, so that it does not take the next request).
  bool record_failure(StatusCode code, Clock::time_point now) noexcept {
    if (opt_.failure_threshold <= 0 || !counts(code)) return false;
    // A batch launched before the breaker opened: the same outage, already counted; it does not
    // extend the cool-down.
    if (state_ == Breaker::open) return false;
    ++failures_;
    if (state_ != Breaker::half_open && failures_ < opt_.failure_threshold) return false;
    kBreakerMoves.move(state_, Breaker::open);
    open_.store(true, std::memory_order_release);
    open_until_ = saturating_add(now, opt_.cooldown);  // max(): open for good
    failures_ = 0;
    return true;
  }

  /// "Open", readable without the worker's mutex.
  const std::atomic<bool>* open_flag() const noexcept { return &open_; }

  /// Whether a failure with `code` is the worker's: not the request's fault (invalid_argument)
  /// nor the caller's choice (cancelled, aborted).
  static bool counts(StatusCode code) noexcept {
    return code != StatusCode::invalid_argument && code != StatusCode::cancelled &&
           code != StatusCode::aborted;
  }

 private:
  const CircuitBreakerOptions opt_;
  Breaker state_ = Breaker::closed;
  int failures_ = 0;  // failed batches in a row
  Clock::time_point open_until_{};
  std::atomic<bool> open_{false};
};

}  // namespace asyncinfer::detail
