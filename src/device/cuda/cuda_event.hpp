// cuda_event.hpp (internal) — events of the cuda backend, and how its host threads wait for a
// stream or an event without spinning.
//
// Each record() makes a new Point: its own cudaEvent_t (taken from a per-device EventCache),
// created with cudaEventBlockingSync so Event::synchronize() sleeps in the driver instead of
// spinning, and with cudaEventDisableTiming unless EventOptions::timing. A wait captures the point
// current when it is enqueued (cudaStreamWaitEvent), so re-recording never moves it;
// pending_waits() is therefore always 0. A point also carries the recording stream's error there
// (cuda_stream_state.hpp says when it is snapshotted).
//
// Waiting without spinning: Stream::synchronize[_for] enqueues a host function that signals a
// Completion; Event::synchronize_for makes an internal "waiter" stream (WaiterPool) wait for the
// point (cudaStreamWaitEvent) and signal likewise; Event::synchronize uses cudaEventSynchronize on
// a blocking-sync event. Every timed wait (await) wakes at least every kWakeEvery to check the
// stream or event with cudaStreamQuery / cudaEventQuery, so a context error ends it instead of the
// timeout.
//
// Invariants: the caches and pools are per device and outlive every point and waiter stream of
// it; what CUDA callbacks call here (give_back, Completion::complete) touches host memory only.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asyncinfer/detail/chrono.hpp"
#include "device/cuda/cuda_common.hpp"

namespace asyncinfer::detail::cuda {

using std::chrono::nanoseconds;

/// The longest a timed wait sleeps before it checks the stream or event with a CUDA query.
constexpr auto kWakeEvery = std::chrono::milliseconds(50);

inline std::string micros(nanoseconds t) {
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(t).count()) + " us";
}

// ---- events ---------------------------------------------------------------------------------

/// Reusable cudaEvent_t handles of one device: take() creates when empty (user threads only);
/// give_back() only touches host memory, so it may run anywhere.
class EventCache {
 public:
  explicit EventCache(int ordinal) : ordinal_(ordinal) {}
  ~EventCache() {
    run_outside_callbacks([timed = std::move(free_[1]), untimed = std::move(free_[0])] {
      for (cudaEvent_t e : timed) (void)cudaEventDestroy(e);
      for (cudaEvent_t e : untimed) (void)cudaEventDestroy(e);
    });
  }
  EventCache(const EventCache&) = delete;
  EventCache& operator=(const EventCache&) = delete;

  Result<cudaEvent_t> take(bool timing);

  void give_back(cudaEvent_t e, bool timing) noexcept {
    std::lock_guard lock(mu_);
    free_[timing ? 1 : 0].push_back(e);
  }

 private:
  const int ordinal_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_[2];
};

/// A one-shot signal with a status, set from a CUDA callback and awaited by host threads.
class Completion {
 public:
  void complete(Status status) {
    {
      std::lock_guard lock(mu_);
      if (done_) return;
      status_ = std::move(status);
      done_ = true;
    }
    cv_.notify_all();
  }
  /// True once completed; false when `deadline` passed first.
  bool wait_until(Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    if (deadline == Clock::time_point::max()) {
      cv_.wait(lock, [this] { return done_; });
      return true;
    }
    return cv_.wait_until(lock, deadline, [this] { return done_; });
  }
  Status status() {
    std::lock_guard lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

/// One recorded point of an Event: its own cudaEvent_t (back to the cache when the last holder —
/// the Event, a pending snapshot or inherit callback — lets go) and the stream's error there.
class Point {
 public:
  Point(std::shared_ptr<EventCache> cache, cudaEvent_t event, bool timing, int ordinal)
      : cache_(std::move(cache)), event_(event), timing_(timing), ordinal_(ordinal) {}
  ~Point() { cache_->give_back(event_, timing_); }
  Point(const Point&) = delete;
  Point& operator=(const Point&) = delete;

  cudaEvent_t event() const noexcept { return event_; }
  bool timing() const noexcept { return timing_; }
  int ordinal() const noexcept { return ordinal_; }
  /// Whether a snapshot callback precedes the record (set before the point is published).
  bool errorable = false;

  void set_status(Status s) {
    std::lock_guard lock(mu_);
    status_ = std::move(s);
  }
  Status status() {
    std::lock_guard lock(mu_);
    return status_;
  }
  /// The completion signalled by a waiter stream, if one was set up (Event::synchronize_for).
  std::shared_ptr<Completion> completion() {
    std::lock_guard lock(mu_);
    return completion_;
  }
  /// Installs `c` unless one is there; returns the one in place and whether it was `c`.
  std::pair<std::shared_ptr<Completion>, bool> install_completion(std::shared_ptr<Completion> c) {
    std::lock_guard lock(mu_);
    if (completion_) return {completion_, false};
    completion_ = std::move(c);
    return {completion_, true};
  }

 private:
  std::shared_ptr<EventCache> cache_;
  const cudaEvent_t event_;
  const bool timing_;
  const int ordinal_;
  std::mutex mu_;
  Status status_;
  std::shared_ptr<Completion> completion_;
};

// ---- waiting ----------------------------------------------------------------------------------

/// Internal streams that turn "this point completed" into a host signal for Event::
/// synchronize_for: one waits on the point (cudaStreamWaitEvent), then a host function signals.
/// A stream is busy until its host function has run.
class WaiterPool {
 public:
  explicit WaiterPool(int ordinal) : ordinal_(ordinal) {}
  ~WaiterPool() {
    run_outside_callbacks([all = std::move(all_)] {
      for (cudaStream_t s : all) (void)cudaStreamDestroy(s);
    });
  }
  WaiterPool(const WaiterPool&) = delete;
  WaiterPool& operator=(const WaiterPool&) = delete;

  Result<cudaStream_t> acquire();
  /// Host memory only: CUDA callbacks may call it.
  void give_back(cudaStream_t s) noexcept {
    std::lock_guard lock(mu_);
    free_.push_back(s);
  }
  /// Waits for every waiter stream (device teardown: by then all points have completed).
  void drain();
  int ordinal() const noexcept { return ordinal_; }

 private:
  const int ordinal_;
  std::mutex mu_;
  std::vector<cudaStream_t> free_;
  std::vector<cudaStream_t> all_;
};

/// A Completion signalled once `point` completes, set up on first use (one waiter stream per
/// point, however many threads wait for it).
Result<std::shared_ptr<Completion>> watch_point(Point& point,
                                                const std::shared_ptr<WaiterPool>& waiters);

/// Waits for `c` (may be null) until `deadline`, waking at least every kWakeEvery to run `query`
/// (cudaStreamQuery / cudaEventQuery): cudaSuccess ends the wait, an error other than
/// cudaErrorNotReady is returned. When `c` is null (no host function could be enqueued), the wait
/// sleeps with a back-off from 50 us to 5 ms between queries instead. Returns ok once done (the
/// completion's own status is the caller's to read), deadline_exceeded on expiry.
template <class Query>
Status await(const std::shared_ptr<Completion>& c, Clock::time_point deadline, Query query,
             const std::string& what) {
  auto backoff = std::chrono::microseconds(50);
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (c) {
      const Clock::time_point slice = deadline - now > kWakeEvery ? now + kWakeEvery : deadline;
      if (c->wait_until(slice)) return Status();
    } else if (now < deadline) {
      const auto slice = std::min<nanoseconds>(backoff, deadline - now);
      std::this_thread::sleep_for(slice);
      backoff = std::min<std::chrono::microseconds>(backoff * 2, std::chrono::milliseconds(5));
    }
    const cudaError_t e = query();
    if (e == cudaSuccess) return Status();
    if (e != cudaErrorNotReady) return cuda_status(e, what.c_str(), __FILE__, __LINE__);
    if (Clock::now() >= deadline) return deadline_exceeded_error(what + ": not done in time");
  }
}

// ---- the event ----------------------------------------------------------------------------------

class CudaDevice;

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<CudaDevice> device, bool timing);
  ~CudaEvent() override = default;

  bool query() override;
  Status synchronize() override;
  Status synchronize_for(nanoseconds timeout) override;
  int pending_waits() const noexcept override { return 0; }
  bool timing_enabled() const noexcept override { return timing_; }
  Result<double> elapsed_us_since(Event& start) override;

  std::shared_ptr<Point> current() const {
    std::lock_guard lock(mu_);
    return current_;
  }
  void set_current(std::shared_ptr<Point> p) {
    std::lock_guard lock(mu_);
    current_ = std::move(p);
  }
  CudaDevice& device() const noexcept { return *device_; }

 private:
  std::shared_ptr<CudaDevice> device_;
  const bool timing_;
  mutable std::mutex mu_;
  std::shared_ptr<Point> current_;
};

}  // namespace asyncinfer::detail::cuda
