// host_stream.hpp (internal) — the stream contract of device.hpp on one host thread per stream.
//
// Used by the cpu and sim backends. The stream thread takes operations in order from a queue
// (kernel, copy, record, wait, host function). Waiting for an event parks only this stream's
// thread on the event's marker (a condition variable), never the caller. Host functions are
// handed to the stream's executor. Backends override run_kernel/run_copy (what "running" means)
// and the timeline hooks (sim keeps an ideal simulated timeline so that thread wake-up latency
// never accumulates into simulated time).
//
// Caller-run mode (StreamThread::caller, cpu only, for the engine's inline path): the stream has no
// thread. Enqueueing only appends to the queue, as always, and never blocks; the operations run,
// in order, on whichever thread calls run_pending() (the engine's worker, right after it enqueued
// a batch), or synchronize(). Every rule of device.hpp holds except where work runs: "waiting
// parks only the stream's thread" means the thread running run_pending(). run_pending() calls are
// serialized (a recursive mutex, so a host function may synchronize its own stream). A host wait
// on an event recorded on such a stream (Event::synchronize / synchronize_for, from any thread)
// runs the stream's work up to that point too (CallerRunGate), so that a model which waits for
// its own work on the host from enqueue or create_instance behaves as with a stream thread.
// Event::query(), Stream::query() and another stream's wait() never run it: a loop polling them
// waits for the owner's next run_pending().
//
// Each record() creates a new Marker; a wait() captures the marker current at enqueue time, so
// re-recording cannot move an earlier wait (CUDA semantics), and an event can be destroyed while
// waits on it are pending (the marker is reference-counted).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <variant>

#include "device/backend.hpp"

namespace asyncinfer::detail {

/// Memory of `kind` for a device whose memory is host memory (cpu, sim): host bytes labelled with
/// the kind asked for, still host-accessible.
Result<std::shared_ptr<Storage>> allocate_host_backed(std::size_t bytes, MemoryKind kind);

/// Sleeps until `deadline` without burning CPU; returns false when `stop` fired first.
bool sleep_until(Clock::time_point deadline, std::stop_token stop);
/// Busy-waits until `deadline` (a CPU-bound kernel); returns false when `stop` fired first.
bool spin_until(Clock::time_point deadline, const std::stop_token& stop);

class CallerRunGate;

/// One recorded point of a stream.
class Marker {
 public:
  /// A point of a caller-run stream: `gate` lets a host wait run that stream's work up to it
  /// (run_owner). Set before the marker is published (HostEvent::begin_record).
  void set_gate(std::shared_ptr<CallerRunGate> gate) noexcept { gate_ = std::move(gate); }
  /// When the point belongs to a caller-run stream and is not reached yet: runs that stream's
  /// pending work on the calling thread until it is (or the stream closes). Else nothing.
  void run_owner();
  /// Marks the point reached; `status` is the stream's pending error at that point; `when` its
  /// completion time (the simulated time on sim).
  void complete(Status status, Clock::time_point when);
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  /// Blocks until done or `stop` fires (then returns false).
  bool wait(std::stop_token stop);
  /// Blocks until done or `deadline`; false on expiry.
  bool wait_until(Clock::time_point deadline);
  /// Valid once done().
  const Status& status() const noexcept { return status_; }
  Clock::time_point when() const noexcept { return when_; }

 private:
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::atomic<bool> done_{false};
  Status status_;
  Clock::time_point when_{};
  std::shared_ptr<CallerRunGate> gate_;
};

class HostEvent final : public Event {
 public:
  HostEvent(const Device* device, bool timing) : device_(device), timing_(timing) {}

  bool query() override;
  Status synchronize() override;
  Status synchronize_for(std::chrono::nanoseconds timeout) override;
  int pending_waits() const noexcept override {
    return pending_waits_->load(std::memory_order_acquire);
  }
  bool timing_enabled() const noexcept override { return timing_; }
  Result<double> elapsed_us_since(Event& start) override;

  /// For HostStream: a fresh marker that becomes the current point; `gate`: the recording
  /// stream's, when it is caller-run (host waits on the event then run its work).
  std::shared_ptr<Marker> begin_record(std::shared_ptr<CallerRunGate> gate = nullptr);
  /// The current point, or null when never recorded.
  std::shared_ptr<Marker> current() const;
  const std::shared_ptr<std::atomic<int>>& pending_counter() const { return pending_waits_; }
  const Device* device() const noexcept { return device_; }

 private:
  const Device* device_;
  const bool timing_;
  mutable std::mutex mu_;
  std::shared_ptr<Marker> current_;
  // Shared with pending waits, so a wait that outlives the event can still count down.
  std::shared_ptr<std::atomic<int>> pending_waits_ = std::make_shared<std::atomic<int>>(0);
};

/// Caller-run mode: what a host wait on an event recorded on the stream (HostEvent::synchronize,
/// from any thread: the model's enqueue or create_instance, say) uses to run the stream's work up
/// to that point, since no thread of the stream's own would. Outlives the stream (markers hold
/// it); close() detaches it, waiting for the runs in progress.
class CallerRunGate {
 public:
  explicit CallerRunGate(HostStream& stream) : stream_(&stream) {}
  void run_until(const Marker& point);
  void close();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  HostStream* stream_;  // under mu_; null once the stream closes
  int active_ = 0;      // under mu_: run_until calls in progress
};

/// Who runs a HostStream's operations (see the header comment).
enum class StreamThread : std::uint8_t {
  own,     ///< the stream's own thread
  caller,  ///< whoever calls run_pending() or synchronize()
};

class HostStream : public Stream {
 public:
  HostStream(std::shared_ptr<Device> device, const StreamOptions& options, std::string thread_name,
             StreamThread thread = StreamThread::own);
  /// Stops the thread: see device.hpp for what happens to pending work. Derived destructors
  /// must call close() first, so the hooks never run on a half-destroyed object.
  ~HostStream() override;

  Status enqueue(Kernel kernel) override;
  Status copy(const Tensor& dst, const Tensor& src) override;
  Status record(Event& event) override;
  Status wait(Event& event) override;
  Status launch_host_func(HostFunc fn) override;
  Status synchronize() override;
  Status synchronize_for(std::chrono::nanoseconds timeout) override;
  bool query() override;
  int priority() const noexcept override { return priority_; }
  Device& device() noexcept override { return *device_; }

  /// Caller-run mode: runs what is queued, in order, on the calling thread, until the queue is
  /// empty (host functions run on the stream's executor, inline when it is the engine's). Blocks
  /// for as long as that work takes. A no-op for a stream with its own thread.
  void run_pending() { run_pending(nullptr); }
  /// The same, stopping as soon as `until` is reached (null: when the queue is empty).
  void run_pending(const Marker* until);

 protected:
  /// Runs `kernel` on the stream thread: its occupancy, then its host function (run_host_fn).
  /// `start_at` is the simulated time at which it may start (sim); `stop` combines the kernel's
  /// token and the stream's closing. Returns the failure to record as pending, or ok.
  virtual Status run_kernel(Kernel& kernel, Clock::time_point enqueued_at,
                            std::stop_token stop) = 0;
  virtual Status run_copy(const Tensor& dst, const Tensor& src, CopyKind kind,
                          Clock::time_point enqueued_at, std::stop_token stop) = 0;
  /// The completion time to stamp on a recorded marker (cpu: now; sim: its simulated timeline).
  virtual Clock::time_point point_time(Clock::time_point /*enqueued_at*/) { return Clock::now(); }
  /// Called after a wait on a marker completed at `when` has passed (sim: advance the timeline).
  virtual void after_wait(Clock::time_point /*when*/) {}
  /// Runs the kernel's host function with exceptions turned into a Status.
  static Status run_host_fn(Kernel& kernel, std::stop_token stop);
  /// Joins the thread and fails what is left. Idempotent.
  void close();

  std::shared_ptr<Device> device_;

 private:
  struct KernelOp {
    Kernel kernel;
  };
  struct CopyOp {
    Tensor dst;
    Tensor src;
    CopyKind kind;
  };
  struct RecordOp {
    std::shared_ptr<Marker> marker;
  };
  struct WaitOp {
    std::shared_ptr<Marker> marker;
    std::shared_ptr<std::atomic<int>> pending;
  };
  struct HostFuncOp {
    HostFunc fn;
  };
  struct Op {
    std::variant<KernelOp, CopyOp, RecordOp, WaitOp, HostFuncOp> what;
    Clock::time_point enqueued_at;
  };

  Status push(Op op);
  void loop(std::stop_token stop);
  /// Runs one op; true when it already counted itself finished.
  bool execute(Op& op, std::stop_token stop);
  void fail_unstarted(Op& op);
  void deliver_host_func(HostFunc fn, Status status);

  const int priority_;
  const bool caller_run_;
  Executor* executor_;
  std::string name_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Op> ops_;
  bool closing_ = false;
  std::uint64_t enqueued_ = 0;
  std::atomic<std::uint64_t> finished_{0};
  Status pending_error_;           // touched only by the thread running the operations
  std::recursive_mutex run_mu_;    // caller-run mode: one run_pending() at a time
  std::stop_source close_source_;  // caller-run mode: what the stream thread's token is otherwise
  std::shared_ptr<CallerRunGate> gate_;  // caller-run mode: host waits on its events run its work
  std::jthread thread_;
};

}  // namespace asyncinfer::detail
