// executor.hpp — the fixed thread pool that runs completion callbacks, and the deadline timer.
//
// Design (after BS::thread_pool and taskflow's executor):
//   - ThreadPool: N threads fixed at construction, one FIFO task queue under a mutex. Idle workers
//     block on a condition variable that also watches a std::stop_token: no spinning, no sleeps
//     in a loop. A task that throws is caught, counted and reported; the worker survives.
//     shutdown() stops intake, runs every task already queued (a completion callback accepted is
//     a callback owed), then joins. Threads never grow with load: callbacks of a million requests
//     share the same N threads (the article's §2.1 starts a thread per callback instead).
//   - DeadlineTimer: one thread and an ordered map of (deadline, id) → function. The thread sleeps
//     in a timed wait until the nearest deadline and is woken only when an earlier one is added.
//     Deadlines fire in time order; a cancelled timer never fires. The engine uses it for request
//     deadlines, retry backoff and the hang watchdog; nothing else waits in a sleeping thread.
//     Timer functions run on the timer thread and must be short (hand longer work to a pool).
//
// Both set the Linux timer slack of their threads to 1 µs so timed waits wake on time (the
// default slack is 50 µs).
//
// Thread safety: all public members of both classes are thread-safe. Destructors call shutdown().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/future.hpp"

namespace asyncinfer {

using Clock = std::chrono::steady_clock;
using Task = detail::UniqueFunction<void()>;

/// Somewhere to run tasks. Implemented by ThreadPool; devices take one for host functions.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Queues `task` (moving from it) and returns true; or returns false when the executor has shut
  /// down, leaving `task` untouched so the caller can run or fail it itself. Never blocks on a
  /// full queue (the queue is unbounded: its producers — streams and the engine — are bounded by
  /// their own in-flight limits).
  virtual bool post(Task&& task) = 0;
};

/// Runs each task at once on the posting thread (exceptions are caught, counted and reported).
/// For completion points of host-thread streams (cpu, sim), where handing off to another thread
/// would only add a wake-up; never for a CUDA or CANN callback thread, which must not run code
/// that may call the device runtime.
class InlineExecutor final : public Executor {
 public:
  bool post(Task&& task) override;
};

class ThreadPool final : public Executor {
 public:
  /// Starts `threads` (>= 1) workers named "<name>-<i>" (thread names are cut to 15 chars).
  explicit ThreadPool(std::size_t threads, std::string name = "asyncinfer");
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  bool post(Task&& task) override;

  /// Runs `fn()` on a worker; the future holds its return value (R or Result<R>), or `internal`
  /// when it throws, or `aborted` when the pool has shut down.
  template <class F>
  [[nodiscard]] auto submit(F&& fn) {
    using R = std::invoke_result_t<std::decay_t<F>&>;
    using U = typename detail::unwrap_result<R>::type;
    Promise<U> p;
    Future<U> f = p.get_future();
    auto run = [p = std::move(p), fn = std::decay_t<F>(std::forward<F>(fn))]() mutable {
      try {
        p.set_result(Result<U>(fn()));
      } catch (const std::exception& e) {
        p.set_error(internal_error(std::string("exception in pool task: ") + e.what()));
      } catch (...) {
        p.set_error(internal_error("unknown exception in pool task"));
      }
    };
    if (!post(Task(std::move(run)))) {
      // The dropped task broke its promise; say why instead.
      return make_ready_future<U>(aborted_error("ThreadPool::submit after shutdown"));
    }
    return f;
  }

  /// From now on, a worker that finds the queue empty spins up to `budget` for a new task before
  /// it sleeps, whenever `when()` is true (asked without the pool's lock, from the worker; it
  /// must be cheap and thread-safe). The spin's own bounds are src/core/spin_wait.hpp's. Call at
  /// most once, before the pool's tasks depend on it; a budget of 0 leaves the pool as it was.
  void spin_before_sleep(std::chrono::nanoseconds budget, std::function<bool()> when);

  /// Stops intake, runs the tasks already queued, joins the workers. Idempotent. Must not be
  /// called from one of this pool's own workers (aborts: it would join itself).
  void shutdown();

  std::size_t size() const noexcept { return thread_count_; }
  /// True when called from one of this pool's workers.
  bool in_pool() const noexcept;
  /// Exceptions thrown by tasks and caught by the pool.
  std::uint64_t exceptions() const noexcept { return exceptions_.load(std::memory_order_relaxed); }
  /// Tasks queued and not yet started.
  std::size_t queued() const;

 private:
  void worker_loop(std::stop_token stop, std::size_t index);

  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::mutex shutdown_mu_;  // serialises shutdown() calls (only one joins the workers)
  std::size_t thread_count_ = 0;
  std::vector<std::jthread> threads_;
  std::string name_;
  struct Spin {
    std::chrono::nanoseconds budget;
    std::function<bool()> when;
  };
  std::unique_ptr<const Spin> spin_;      // under mu_; set once, then lives as long as the pool
  std::atomic<std::uint64_t> posted_{0};  // tasks posted; written under mu_, read by spinners
  std::atomic<std::uint64_t> exceptions_{0};
};

/// Identifies one armed timer; pass it to DeadlineTimer::cancel.
struct TimerId {
  Clock::time_point when{};
  std::uint64_t seq = 0;  ///< 0: no timer
  explicit operator bool() const noexcept { return seq != 0; }
  friend auto operator<=>(const TimerId&, const TimerId&) = default;
};

class DeadlineTimer {
 public:
  explicit DeadlineTimer(std::string name = "asyncinfer-tm");
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  /// Arms `fn` to run on the timer thread at `when` (at once if `when` has passed). Timers with
  /// equal deadlines fire in the order they were added. After shutdown, returns an empty TimerId
  /// and destroys `fn` unrun.
  /// time_point::max() never fires (until cancelled or shut down).
  TimerId add(Clock::time_point when, Task fn);
  /// The same for a time point of any clock or unit, converted saturating (detail/chrono.hpp),
  /// so time_point::max() of any of them never fires.
  template <class C, class D>
  TimerId add(std::chrono::time_point<C, D> when, Task fn) {
    return add(detail::to_steady(when), std::move(fn));
  }
  /// Disarms a timer. True when it was pending (it will never run); false when it already ran,
  /// is running now, was cancelled, or is unknown. Never blocks on a running timer function.
  bool cancel(TimerId id);
  /// Stops the thread; pending timers are destroyed without running. Idempotent; must not be
  /// called from a timer function (aborts).
  void shutdown();

  /// Timers not yet fired.
  std::size_t pending() const;
  /// Timers fired: counted as each timer function starts, so a timer function (and whoever it
  /// signals) already sees itself counted.
  std::uint64_t fired() const noexcept { return fired_.load(std::memory_order_relaxed); }
  /// Timer functions that threw (reported, then dropped).
  std::uint64_t exceptions() const noexcept { return exceptions_.load(std::memory_order_relaxed); }

 private:
  void loop(std::stop_token stop);

  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::map<TimerId, Task> timers_;
  std::uint64_t next_seq_ = 1;
  bool stopping_ = false;
  std::atomic<std::uint64_t> fired_{0};
  std::atomic<std::uint64_t> exceptions_{0};
  std::string name_;
  std::jthread thread_;
};

namespace detail {
/// Names the calling thread (cut to 15 characters) and sets its timer slack to 1 µs.
void setup_thread(const std::string& name) noexcept;
/// CPU cores this process may run on (its affinity mask: taskset, cgroup cpusets), at least 1.
int available_cores() noexcept;
}  // namespace detail

}  // namespace asyncinfer
