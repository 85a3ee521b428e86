// lifecycle.hpp (internal) — what the engine and the pipeline share about ending work: the
// outcomes a request or an item ends with, their counters, and the time arithmetic and text of
// their messages.
//
// Both the engine (a request: engine/request.hpp's Stage) and the pipeline (an item) end each unit
// of work exactly once, with one of the outcomes below, and count it. Times are steady-clock
// (Clock); durations in messages are "12.5 ms". Thread safety: pure functions; OutcomeCounters is
// lock-free (relaxed atomics: counters, not synchronisation).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "asyncinfer/executor.hpp"
#include "asyncinfer/status.hpp"

namespace asyncinfer::detail {

/// How a request (engine) or an item (pipeline) ended.
enum class Outcome : std::uint8_t { completed, failed, timed_out, cancelled, shut_down };

/// The outcome an error ends work with: deadline_exceeded → timed_out, cancelled → cancelled,
/// aborted (shutdown) → shut_down, anything else → failed.
inline Outcome outcome_for_error(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::deadline_exceeded:
      return Outcome::timed_out;
    case StatusCode::cancelled:
      return Outcome::cancelled;
    case StatusCode::aborted:
      return Outcome::shut_down;
    default:
      return Outcome::failed;
  }
}

/// One counter per outcome. `completed` sits on its own cache line: it is the hot one.
struct OutcomeCounters {
  alignas(64) std::atomic<std::uint64_t> completed{0};
  alignas(64) std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> timed_out{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> shut_down{0};

  void count(Outcome o) noexcept {
    switch (o) {
      case Outcome::completed:
        completed.fetch_add(1, std::memory_order_relaxed);
        return;
      case Outcome::failed:
        failed.fetch_add(1, std::memory_order_relaxed);
        return;
      case Outcome::timed_out:
        timed_out.fetch_add(1, std::memory_order_relaxed);
        return;
      case Outcome::cancelled:
        cancelled.fetch_add(1, std::memory_order_relaxed);
        return;
      case Outcome::shut_down:
        shut_down.fetch_add(1, std::memory_order_relaxed);
        return;
    }
  }
};

/// Microseconds from `a` to `b` (negative when b is earlier).
inline double us_between(Clock::time_point a, Clock::time_point b) noexcept {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// Nanoseconds from `a` to `b`, 0 when b is earlier (the durations of Triton's statistics).
inline std::uint64_t ns_between(Clock::time_point a, Clock::time_point b) noexcept {
  const auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
  return d > 0 ? static_cast<std::uint64_t>(d) : 0;
}

/// Microseconds from `t` to now.
inline double elapsed_us_since(Clock::time_point t) noexcept { return us_between(t, Clock::now()); }

/// Seconds from `t` to now.
inline double elapsed_s_since(Clock::time_point t) noexcept {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// "12.5 ms" for a duration of any unit (a double conversion: max() cannot overflow).
template <class Rep, class Period>
std::string ms_text(std::chrono::duration<Rep, Period> d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f ms", std::chrono::duration<double, std::milli>(d).count());
  return buf;
}

/// "what [tag]", or "what" without a tag: how a message names the request or item it is about.
inline std::string with_tag(const std::string& what, const std::string& tag) {
  return tag.empty() ? what : what + " [" + tag + "]";
}

}  // namespace asyncinfer::detail
