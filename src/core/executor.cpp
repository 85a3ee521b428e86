#include "asyncinfer/executor.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>

#include "core/spin_wait.hpp"

namespace asyncinfer {
namespace {
thread_local const ThreadPool* tl_current_pool = nullptr;
thread_local const DeadlineTimer* tl_current_timer = nullptr;
}  // namespace

namespace detail {
bool post_to(Executor& executor, UniqueFunction<void()>& task) {
  return executor.post(std::move(task));
}

int available_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
}

void setup_thread(const std::string& name) noexcept {
  std::string cut = name.substr(0, 15);
  pthread_setname_np(pthread_self(), cut.c_str());
  // Timed waits (deadlines, simulated device occupancy) should wake within microseconds.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
}
}  // namespace detail

bool InlineExecutor::post(Task&& task) {
  Task run = std::move(task);
  try {
    run();
  } catch (...) {
    detail::report_callback_exception("inline task", std::current_exception());
  }
  return true;
}

ThreadPool::ThreadPool(std::size_t threads, std::string name) : name_(std::move(name)) {
  ASYNCINFER_CHECK(threads >= 1);
  thread_count_ = threads;
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i](std::stop_token st) { worker_loop(st, i); });
  }
}

ThreadPool::~ThreadPool() { shutdown(); }

bool ThreadPool::post(Task&& task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(task));
    posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  cv_.notify_one();
  return true;
}

void ThreadPool::spin_before_sleep(std::chrono::nanoseconds budget, std::function<bool()> when) {
  if (budget.count() <= 0 || !when) return;
  std::lock_guard lock(mu_);
  ASYNCINFER_CHECK(spin_ == nullptr);  // once: workers use it without the lock
  spin_ = std::make_unique<const Spin>(Spin{budget, std::move(when)});
}

void ThreadPool::shutdown() {
  ASYNCINFER_CHECK(!in_pool());
  // Concurrent calls: the first joins the workers, the others wait for it, then return.
  std::lock_guard serial(shutdown_mu_);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();  // workers drain the queue, then exit (see worker_loop)
  }
  threads_.clear();  // threads_ is touched only here (under shutdown_mu_) and at construction
}

bool ThreadPool::in_pool() const noexcept { return tl_current_pool == this; }

std::size_t ThreadPool::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void ThreadPool::worker_loop(std::stop_token /*stop*/, std::size_t index) {
  // Workers do not use the jthread stop token to leave: shutdown() sets stopping_ and the
  // workers exit only once the queue is empty, so every accepted task runs exactly once.
  detail::setup_thread(name_ + "-" + std::to_string(index));
  tl_current_pool = this;
  std::optional<detail::SpinWait> spinner;  // this worker's, once spin_before_sleep was called
  std::unique_lock lock(mu_);
  for (;;) {
    if (spin_ != nullptr && queue_.empty() && !stopping_) {
      // Stay awake briefly for the next task (spin_wait.hpp): its post() then wakes nobody.
      const Spin* spin = spin_.get();  // never replaced nor freed before the workers are joined
      const std::uint64_t seen = posted_.load(std::memory_order_relaxed);
      lock.unlock();
      if (!spinner) spinner.emplace(spin->budget);
      if (spin->when()) {
        spinner->spin([&] { return posted_.load(std::memory_order_acquire) != seen; });
      }
      lock.lock();
    }
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      task();
    } catch (...) {
      exceptions_.fetch_add(1, std::memory_order_relaxed);
      detail::report_callback_exception("thread pool task", std::current_exception());
    }
    task = nullptr;  // destroy captured state outside the lock
    lock.lock();
  }
  tl_current_pool = nullptr;
}

DeadlineTimer::DeadlineTimer(std::string name) : name_(std::move(name)) {
  thread_ = std::jthread([this](std::stop_token st) { loop(st); });
}

DeadlineTimer::~DeadlineTimer() { shutdown(); }

TimerId DeadlineTimer::add(Clock::time_point when, Task fn) {
  TimerId id;
  bool earliest = false;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return TimerId{};  // fn destroyed on return, outside the lock
    id = TimerId{when, next_seq_++};
    auto it = timers_.emplace(id, std::move(fn)).first;
    earliest = it == timers_.begin();
  }
  if (earliest) cv_.notify_one();
  return id;
}

bool DeadlineTimer::cancel(TimerId id) {
  if (!id) return false;
  Task dropped;
  {
    std::lock_guard lock(mu_);
    auto it = timers_.find(id);
    if (it == timers_.end()) return false;
    dropped = std::move(it->second);
    timers_.erase(it);
  }
  return true;  // `dropped` is destroyed here, outside the lock
}

void DeadlineTimer::shutdown() {
  std::map<TimerId, Task> dropped;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    dropped.swap(timers_);
  }
  ASYNCINFER_CHECK(tl_current_timer != this);
  thread_.request_stop();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::size_t DeadlineTimer::pending() const {
  std::lock_guard lock(mu_);
  return timers_.size();
}

void DeadlineTimer::loop(std::stop_token stop) {
  detail::setup_thread(name_);
  tl_current_timer = this;
  std::unique_lock lock(mu_);
  while (!stop.stop_requested()) {
    if (timers_.empty()) {
      cv_.wait(lock, stop, [this] { return !timers_.empty(); });
      continue;
    }
    const Clock::time_point next = timers_.begin()->first.when;
    if (Clock::now() < next) {
      // Woken early when an earlier timer is added (add() notifies) or on stop.
      cv_.wait_until(lock, stop, next, [this, next] {
        return !timers_.empty() && timers_.begin()->first.when < next;
      });
      continue;
    }
    auto node = timers_.extract(timers_.begin());
    lock.unlock();
    fired_.fetch_add(1, std::memory_order_relaxed);
    try {
      node.mapped()();
    } catch (...) {
      exceptions_.fetch_add(1, std::memory_order_relaxed);
      detail::report_callback_exception("timer function", std::current_exception());
    }
    node = {};  // destroy the function outside the lock
    lock.lock();
  }
  tl_current_timer = nullptr;
}

}  // namespace asyncinfer
