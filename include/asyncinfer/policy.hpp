// policy.hpp — how the engine reacts to failure: retries, retry budget, circuit breaker, worker
// recovery.
//
// Design (the article's §5.2 retries every error after a fixed one-second sleep, in the calling
// thread; we do not):
//   - RetryPolicy: bounded attempts; exponential backoff with full jitter (each wait is uniform in
//     [0, min(max_backoff, initial_backoff × multiplier^(attempt-1))], as in "Exponential Backoff
//     And Jitter", AWS Architecture Blog, 2015), so a hundred requests failing together do not
//     retry in lockstep; only retryable codes (never invalid_argument, cancelled,
//     deadline_exceeded); never an attempt past the request's deadline; waits live on the
//     engine's deadline timer, never in a sleeping worker.
//   - Retry budget (after Finagle's RetryBudget and gRPC's retry throttling): within a sliding
//     window, retries may be at most `budget_ratio` of the requests submitted plus
//     `budget_min_retries_per_s` × window, so a failing device does not get a retry storm.
//   - CircuitBreakerOptions: per worker (model instance). After `failure_threshold` consecutive
//     failed batches the worker is taken out for `cooldown`, then probed with one request; a
//     success closes it, a failure opens it again. Meanwhile requests go to healthy workers.
//     Workers pull from one queue, so the probe is the first request the half-open worker takes:
//     while healthy workers keep up with the traffic alone, it may wait (harmlessly) for load.
//   - RecoveryOptions: after the hang watchdog fails a batch, its worker replaces its stream and
//     model instance. The old ones are destroyed off the hot path once the work they run ends;
//     work a backend cannot stop keeps running meanwhile ("abandoned"), so the worker keeps at
//     most `max_abandoned_instances` of them beside its live one and takes no new work beyond
//     that (BentoML #5642 shows what happens otherwise: every hang adds a job to the device).
//     A replacement that fails (a lost device: create_instance() keeps failing) is tried again
//     with exponential backoff, at most `max_recycle_attempts` times in a row; then the worker
//     gives up and reports itself unhealthy (EngineMetrics, Engine::health()). When no worker is
//     left, queued requests and later submits fail `unavailable`, naming the cause.
//
// Durations: `max()` of an option's type means "no limit" (a backoff with no cap, a breaker that
// stays open, a recovery that waits as long as it takes); nothing overflows (detail/chrono.hpp).
//
// Thread safety: plain option structs; RetryPolicy's member functions are const and thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer {

struct RetryPolicy {
  /// Attempts in all, the first included; 1 = no retries.
  int max_attempts = 1;
  std::chrono::microseconds initial_backoff{1000};
  double multiplier = 2.0;
  std::chrono::microseconds max_backoff{200'000};
  /// Codes worth another attempt. invalid_argument, cancelled and deadline_exceeded are never
  /// retried even if listed (Engine::create rejects such a list).
  std::vector<StatusCode> retryable_codes = {StatusCode::unavailable,
                                             StatusCode::resource_exhausted};
  /// Retry budget: retries in the window may be at most budget_ratio × requests submitted in the
  /// window + budget_min_retries_per_s × window seconds.
  double budget_ratio = 0.2;
  double budget_min_retries_per_s = 10.0;
  std::chrono::milliseconds budget_window{10'000};

  bool is_retryable(StatusCode code) const noexcept;
  /// The full-jitter wait before attempt `next_attempt` (2 = the first retry).
  std::chrono::microseconds backoff(int next_attempt, std::mt19937_64& rng) const;
  /// invalid_argument naming the bad field.
  Status validate() const;
};

struct CircuitBreakerOptions {
  /// Consecutive failed batches that open a worker's breaker; 0 = no breaker.
  int failure_threshold = 0;
  /// How long an open worker stays out before it is probed with one request (max(): for good).
  std::chrono::milliseconds cooldown{1000};
};

struct RecoveryOptions {
  /// Attempts in a row to create a worker's new stream and model instance before it gives up and
  /// is unhealthy for good (>= 1).
  int max_recycle_attempts = 5;
  /// Wait after the first failed attempt; doubles after each further one, up to
  /// max_recycle_backoff (with the defaults: 0.1, 0.2, 0.4, 0.8 s, then it gives up).
  std::chrono::milliseconds recycle_backoff{100};
  std::chrono::milliseconds max_recycle_backoff{5000};
  /// Replaced model instances per worker whose work could not be stopped and still runs. At the
  /// limit the worker takes no new work (health "paused") until one of them finishes. 0: a
  /// replaced instance's work must end before the worker takes new work.
  int max_abandoned_instances = 1;

  /// invalid_argument naming the bad field.
  Status validate() const;
};

}  // namespace asyncinfer
