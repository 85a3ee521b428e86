// spin_wait.hpp (internal) — a bounded spin before a blocking wait, and the policy that says
// when and how long: for the engine's two hand-offs at low load (the worker waiting for a
// request, the completion thread waiting for a result) and the HTTP I/O thread's wait for an
// answer.
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
// The one seam (issue 46): every thread that spins before it sleeps — the engine's workers
// (Scheduler::next_batch, given the worker's SpinWait), its completion threads
// (ThreadPool::spin_before_sleep, set up by EngineCore::start) and the HTTP server's I/O threads
// (http_server.cpp's run_io_loop) — asks a SpinPolicy whether and how long, takes its SpinWait
// from it, and, where it waits on a queue under a lock, spins on that queue's Arrivals. A change
// to how spinning works is a change to this file and tests/unit/test_spin_policy.cpp.
//
// Thread safety: a SpinPolicy is a value, fixed once made: any thread may read it. A SpinWait is
// used by one thread (it keeps that thread's history); the predicate it polls must be safe to
// call without the lock that guards the condition (atomics). Arrivals: see the class.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "asyncinfer/executor.hpp"  // available_cores

namespace asyncinfer::detail {

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

/// Whether, and how long, a thread spins before it sleeps: the one place that decides (the
/// header). A value, fixed once made (from the public option, when an engine or an HTTP server
/// is set up); copy it to whoever needs it. Never blocks; thread-safe (const).
class SpinPolicy {
 public:
  /// Never spins.
  constexpr SpinPolicy() noexcept = default;
  /// A budget already checked against the cores (`Engine::options().spin_wait`, which
  /// from_option made at Engine::create); a budget of 0 or less never spins.
  constexpr explicit SpinPolicy(std::chrono::microseconds budget) noexcept
      : budget_(budget.count() > 0 ? budget : std::chrono::microseconds(0)) {}

  /// From a public option as set (EngineOptions::spin_wait, HttpOptions::spin_wait, already
  /// validated by their owners): `requested`, or never where the process may run on fewer than
  /// 2 `cores` (its affinity, available_cores()): there a spinning thread only holds the core
  /// that the thread it waits for needs. Made when a budget is set up, not per wait (the
  /// affinity is a system call).
  static SpinPolicy from_option(std::chrono::microseconds requested,
                                int cores = available_cores()) noexcept {
    return SpinPolicy(cores < 2 ? std::chrono::microseconds(0) : requested);
  }

  /// How long one spin lasts at most; 0: never spins.
  constexpr std::chrono::microseconds budget() const noexcept { return budget_; }
  constexpr bool spins() const noexcept { return budget_.count() > 0; }

  /// An engine thread (a worker, a completion thread) about to wait for its next piece of work:
  /// whether it spins first. Only at low load: while at most one request per worker is
  /// `undelivered` (in flight, or its callback not run), the next one most likely comes from a
  /// caller waiting on the last result, soon, and alone, and sleeping would cost a wake-up a
  /// request. With more in flight, sleeping lets requests gather into a batch. Cheap: asked
  /// before every wait, by the waiting thread.
  constexpr bool worth_spinning(std::int64_t undelivered, std::int64_t workers) const noexcept {
    return spins() && undelivered <= workers;
  }

  /// An HTTP I/O thread about to sleep in its reactor while its sessions await `awaited`
  /// answers from an engine: whether it polls first. Only while exactly one is awaited: more
  /// means answers come often enough without it; none means the next thing is a client's bytes,
  /// a network round trip away. Asked before every wait, by the I/O thread.
  constexpr bool worth_polling(std::uint64_t awaited) const noexcept {
    return spins() && awaited == 1;
  }

  /// A thread's own spinner under this policy (it keeps that thread's history of misses).
  SpinWait waiter() const noexcept { return SpinWait(budget_); }

 private:
  std::chrono::microseconds budget_{0};
};

/// A queue's arrivals as a spinning consumer sees them without the queue's lock: a count that
/// the producer bumps under that lock each time it puts work in the queue. Thread safety:
/// note() under the queue's lock (one writer at a time); spin_unlocked() from any consumer
/// thread that holds that lock.
class Arrivals {
 public:
  /// After work was put in the queue, under the queue's lock. Never blocks.
  void note() noexcept {
    n_.store(n_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  /// A consumer about to sleep on an empty queue, holding `lock` (the queue's): lets go of the
  /// lock and spins with `waiter` (its budget and back-off) until note() is called or `stop()`
  /// is true (called without the lock; it must be cheap and read atomics only), then takes the
  /// lock again. Returns whether the spin ended before its budget. The caller then looks at the
  /// queue again under the lock: whatever else would have woken its wait is seen at most a
  /// budget later. Blocks only to take the lock back.
  template <class Stop>
  bool spin_unlocked(std::unique_lock<std::mutex>& lock, SpinWait& waiter, Stop&& stop) {
    const std::uint64_t seen = n_.load(std::memory_order_relaxed);
    lock.unlock();
    const bool ended =
        waiter.spin([&] { return n_.load(std::memory_order_acquire) != seen || stop(); });
    lock.lock();
    return ended;
  }

 private:
  std::atomic<std::uint64_t> n_{0};
};

}  // namespace asyncinfer::detail
