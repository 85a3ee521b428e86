// spin_wait.hpp (internal) — a bounded spin before a blocking wait, for the engine's two
// hand-offs at low load (the worker waiting for a request, the completion thread waiting for a
// result).
//
// Why: at one request in flight, each hand-off finds the other thread asleep on a futex, and its
// wake-up costs far more than the work it hands over. On a virtual machine whose idle vCPUs halt,
// a wake-up that crosses vCPUs took ~20 µs (docs/performance.md, "Spinning before sleeping"),
// against ~1 µs of engine work a request. A thread that stays awake a few microseconds after its
// work is done takes the next hand-off without any wake-up: the handing side's notify finds no
// sleeper and returns without a system call.
//
// The cost is bounded: a spin lasts at most its budget, once per idle period, and a thread whose
// spins keep failing (the next piece of work comes later than the budget, as on a server whose
// next request is a network round trip away) stops spinning for a while. This is the adaptive
// spin-then-park of glibc's PTHREAD_MUTEX_ADAPTIVE_NP, of the Linux kernel's mutexes and of
// Java's and TBB's thread pools, applied to a condition variable's wait.
//
// Thread safety: a SpinWait is used by one thread (it keeps that thread's history); the
// predicate it polls must be safe to call without the lock that guards the condition (atomics).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

#include "asyncinfer/executor.hpp"  // available_cores

namespace asyncinfer::detail {

/// The spin budget a thread of this process may use: `requested`, or 0 where the process may run
/// on fewer than 2 cores (its affinity). There a spinning thread only holds the core that the
/// thread it waits for needs. Checked when a budget is set up (an engine's or an HTTP I/O
/// thread's), not per wait.
inline std::chrono::microseconds spin_budget(std::chrono::microseconds requested) noexcept {
  return available_cores() < 2 ? std::chrono::microseconds(0) : requested;
}

/// The CPU's spin-wait hint (x86 `pause`, ARM `yield`); nothing elsewhere.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Locks `mu`, trying up to `tries` times, with the pause hint between, before it blocks: for a
/// mutex whose holders keep it for a fraction of a microsecond, so that a thread that finds it
/// taken does not go to sleep and need a wake-up from the holder's unlock (glibc's
/// PTHREAD_MUTEX_ADAPTIVE_NP spins up to 100 tries the same way). Returns the held lock.
inline std::unique_lock<std::mutex> lock_spinning(std::mutex& mu, int tries = 100) {
  for (int i = 0; i < tries; ++i) {
    if (mu.try_lock()) return std::unique_lock<std::mutex>(mu, std::adopt_lock);
    cpu_relax();
  }
  return std::unique_lock<std::mutex>(mu);
}

/// One thread's spin before a blocking wait. `budget` 0 never spins.
class SpinWait {
 public:
  explicit SpinWait(std::chrono::nanoseconds budget) noexcept : budget_(budget) {}

  /// Spins up to the budget until `ready()` is true; returns whether it became true. Returns
  /// false at once (no spin) with budget 0, or while backing off after kMissesToBackOff spins in a
  /// row that ran out (the next kBackOffWaits calls do not spin). Does not block; `ready` is
  /// called without any lock the caller waits under.
  template <class Ready>
  bool spin(Ready&& ready) {
    if (budget_.count() <= 0) return false;
    if (skip_ > 0) {
      --skip_;
      return false;
    }
    using Clock = std::chrono::steady_clock;
    const Clock::time_point until = Clock::now() + budget_;
    for (std::uint32_t i = 1;; ++i) {
      if (ready()) {
        misses_ = 0;
        return true;
      }
      cpu_relax();
      // The clock costs ~20 ns: read it every 16 pauses (a pause is ~10-40 ns).
      if (i % 16 == 0 && Clock::now() >= until) break;
    }
    if (++misses_ >= kMissesToBackOff) {
      misses_ = 0;
      skip_ = kBackOffWaits;
    }
    return false;
  }

  /// Spins that run out in a row before the thread backs off, and the waits it then skips.
  static constexpr int kMissesToBackOff = 8;
  static constexpr int kBackOffWaits = 64;

 private:
  std::chrono::nanoseconds budget_;
  int misses_ = 0;
  int skip_ = 0;
};

}  // namespace asyncinfer::detail
