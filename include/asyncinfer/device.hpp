// device.hpp — devices, streams and events: the primitives the article's §2 builds on
// (torch.npu.Stream / torch.npu.Event; aclrtStream / aclrtEvent; cudaStream_t / cudaEvent_t).
//
// Design: a Stream is an in-order queue of work on a device. Work is one of: a kernel (occupies a
// compute engine for a stated duration and/or runs a host function), a copy, an event record, a
// wait on an event (a cross-stream dependency that blocks only the waiting stream), or a host
// function that is handed to an Executor once the stream reaches it. Every call that enqueues
// returns at once; nothing here busy-waits.
//
// Semantics follow CUDA, so that a CUDA or Ascend backend maps one to one:
//   - record(e) captures a new point in the stream; a wait(e) enqueued earlier keeps the point it
//     captured (re-recording never moves an earlier wait). An event never recorded is complete.
//   - launch_host_func(fn) runs fn on the stream's executor once all earlier work on the stream
//     has finished; the stream is held only for the hand-off, never while fn runs.
//   - Errors flow in stream order: a kernel or copy that fails makes the next host function on
//     that stream receive the error (then it is cleared); an event recorded after a failure
//     carries the failure, and a stream that waits on that event inherits it. So a failure reaches
//     the completion point of whatever depends on it, and nothing else.
//   - Destroying a stream stops its running kernel where the backend can, drops work not yet
//     started, completes its pending events as failed (aborted) and runs every pending host
//     function with an aborted status: nothing is left pending. (cuda: device work already
//     launched runs to its end; events recorded on a stream that only copies complete normally.
//     Destruction waits for the stream, so it must not be called from that stream's own host
//     function, and it waits for a cross-stream wait that has not been satisfied.)
//
// Backends: "cpu" (each stream is one host thread), "sim" (a simulated accelerator: compute and
// copy engines whose occupancy is simulated in real time without burning host CPU), and "cuda"
// where built. The internal header src/device/backend.hpp is what a backend author implements;
// the registry lists what was built, and register_device_backend adds an application's own.
// The engine and the models never ask which kind a device is: they ask its DeviceCapabilities. An
// Ascend backend maps aclrtStream/aclrtEvent/ aclrtLaunchCallback onto the same interface
// (docs/backends.md keeps the mapping).
//
// Thread safety: Device, Stream and Event members are thread-safe. Work enqueued on one stream
// from several threads runs in the order the enqueue calls returned.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/executor.hpp"
#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer {

enum class DeviceKind : std::uint8_t { cpu, sim, cuda, npu };
std::string_view to_string(DeviceKind kind) noexcept;

/// What the engine and the model backends may rely on when they drive a device. They ask these,
/// never DeviceInfo::kind (which is for people, metrics labels and errors), so a new backend that
/// reports the right capabilities needs no change outside its own folder. The defaults are the
/// conservative answers: a device that sets none of them is driven as a cuda-like accelerator
/// (its own stream threads, completion code handed off its callback thread, copies to and from
/// memory the host cannot touch). Plain data, fixed when the device is opened.
struct DeviceCapabilities {
  /// The device can make a stream with no thread of its own, whose work runs on whichever thread
  /// calls its run_pending() (a "caller-run" stream: detail::CallerRunStreams in
  /// src/device/backend.hpp, which such a device implements). Whether to use one is the caller's
  /// choice: the engine does (its inline path: each worker runs the batch it launched on its own
  /// thread) only when EngineOptions::watchdog is off, since a hung batch would then hang the
  /// worker that must replace it. cpu: yes; sim (a stream waits out its simulated occupancy on
  /// its own thread, which is what lets the host prepare the next batch meanwhile) and cuda: no.
  bool caller_run_streams = false;
  /// A host function handed to an inline executor (StreamOptions::host_func_executor) runs on
  /// the thread that reaches it in the stream, and that thread may call this device's API:
  /// enqueue work, record events, allocate and free its memory. The engine then runs a batch's
  /// completion point right there (one hand-off fewer); otherwise its dispatcher thread does.
  /// cpu, sim: yes (the stream's own host thread). cuda: no (cudaLaunchHostFunc's callback
  /// thread must not call CUDA, and freeing a batch's device memory does).
  bool host_funcs_may_call_device = false;
  /// Memory of MemoryKind::device is addressable by host code: a kernel's host function may read
  /// and write a device tensor's data() directly. The torch and openvino backends compute on the
  /// host (on the stream's thread, reading and writing the batch's device tensors in place) only
  /// where this holds. cpu: yes; sim: yes (its device memory is host memory; copies are
  /// simulated); cuda: no. DeviceInfo::unified_memory is the stronger property (no copies at all).
  bool host_addressable_memory = false;
};

/// What a device is and can do.
struct DeviceInfo {
  std::string name;  ///< as opened: "cpu", "sim", "cuda:0"
  /// For display, metrics labels and errors. Code that drives the device asks `capabilities`.
  DeviceKind kind = DeviceKind::cpu;
  std::string description;        ///< one line for people ("NVIDIA H200, 132 SMs, 140 GiB")
  bool async = true;              ///< enqueue returns before the work runs
  bool simulated = false;         ///< true for "sim": timings are simulated, not measured hardware
  /// Device memory is plain host memory: no copies are needed, and a model may allocate its
  /// outputs while its batch runs (the engine skips the copies back; the python backend, whose
  /// processes decide their outputs' shapes, needs it). Implies
  /// capabilities.host_addressable_memory.
  bool unified_memory = false;
  bool cancellable_work = false;  ///< running kernels end early when their stop token fires
  int compute_engines = 1;
  int copy_engines = 0;  ///< engines that overlap host<->device copies with compute
  DeviceCapabilities capabilities;
};

/// Options for Device::create_event.
struct EventOptions {
  bool timing = false;  ///< record completion times so elapsed_time_us() works (costs a little)
};

/// Options for Device::create_stream.
struct StreamOptions {
  /// Lower number = higher priority (CUDA's convention). cuda: clamped to the device's range.
  /// cpu: values > 0 lower the stream thread's scheduling priority (nice); sim: recorded only
  /// (its engines serve work first come, first served).
  int priority = 0;
  /// Where host functions run; null = the device's own host-function executor. The executor
  /// must outlive the stream.
  Executor* host_func_executor = nullptr;
  /// Label used in thread names and errors.
  std::string name;
};

/// Direction of a copy, derived from the tensors' placements.
enum class CopyKind : std::uint8_t {
  host_to_host,
  host_to_device,
  device_to_host,
  device_to_device
};
std::string_view to_string(CopyKind kind) noexcept;

/// One unit of work on a stream.
struct Kernel {
  /// Label for errors and traces.
  std::string name = "kernel";
  /// Time the kernel occupies a compute engine: sim — simulated occupancy; cpu — the stream
  /// thread spins (spin = true) or sleeps for it; cuda — a device spin kernel of that length.
  /// nanoseconds::max() occupies it until `stop` fires (or the stream is destroyed).
  std::chrono::nanoseconds duration{0};
  bool spin = false;
  /// Optional host function, run in stream order after the occupancy (cpu, sim: on the stream's
  /// thread, so it may compute for real; cuda: on the stream's own host thread, handed over by
  /// cudaLaunchHostFunc while a small kernel holds the stream, so it must not call CUDA). The
  /// token fires when `stop` does or when the stream is destroyed. A non-ok return or an
  /// exception becomes the stream's pending error (see the header comment).
  detail::UniqueFunction<Status(std::stop_token)> host_fn;
  /// Cancellation: where the backend can (cpu, sim), the occupancy ends early when it fires.
  std::stop_token stop;
};

/// A host function for launch_host_func: receives ok, or the first error of the work enqueued on
/// the stream since the previous host function, or `aborted` when the stream was destroyed
/// before reaching it. Runs exactly once.
using HostFunc = detail::UniqueFunction<void(Status)>;

class Device;

/// A point in a stream's work. Created by Device::create_event.
class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// True when the last recorded point has completed (or the event was never recorded). Never
  /// blocks.
  virtual bool query() = 0;
  /// Blocks until the last recorded point completes. Returns the error the point carries.
  virtual Status synchronize() = 0;
  /// Blocks at most `timeout`; deadline_exceeded when the point has not completed by then.
  /// nanoseconds::max() (or a timeout too long to represent) means no limit.
  virtual Status synchronize_for(std::chrono::nanoseconds timeout) = 0;
  /// The same for a timeout in any unit, converted saturating (milliseconds::max() = no limit).
  template <class Rep, class Period>
  Status synchronize_for(std::chrono::duration<Rep, Period> timeout) {
    return synchronize_for(detail::saturating_cast<std::chrono::nanoseconds>(timeout));
  }
  /// Stream waits enqueued on this event that the waiting stream has not yet passed. (cuda: 0,
  /// since a CUDA wait captures the event's point when it is enqueued.)
  virtual int pending_waits() const noexcept = 0;
  virtual bool timing_enabled() const noexcept = 0;
  /// Microseconds from `start`'s completion to this event's. Both must have timing enabled,
  /// be recorded on the same device, and have completed; failed_precondition otherwise.
  virtual Result<double> elapsed_us_since(Event& start) = 0;

 protected:
  Event() = default;
};

/// Microseconds between two completed, timing-enabled events (cudaEventElapsedTime).
inline Result<double> elapsed_time_us(Event& start, Event& end) {
  return end.elapsed_us_since(start);
}

/// An in-order queue of work on a device. Created by Device::create_stream.
class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// Enqueues a kernel. Non-blocking. failed_precondition when the stream is closing.
  virtual Status enqueue(Kernel kernel) = 0;
  /// Enqueues a copy of src's bytes into dst (same dtype and byte size; the direction comes from
  /// their placements). Non-blocking; both tensors must stay alive until the stream passes the
  /// copy (cpu and sim keep references themselves). invalid_argument on a mismatch.
  virtual Status copy(const Tensor& dst, const Tensor& src) = 0;
  /// Records `event` here: it completes when the stream reaches this point.
  virtual Status record(Event& event) = 0;
  /// Makes later work on this stream wait until `event`'s current point completes. Blocks only
  /// this stream, never the calling thread. An event never recorded is a no-op.
  virtual Status wait(Event& event) = 0;
  /// Runs `fn` on the stream's executor once the stream reaches this point (see HostFunc).
  virtual Status launch_host_func(HostFunc fn) = 0;
  /// Blocks until all work enqueued so far has finished; returns the first error of that work
  /// not yet delivered to a host function. A host function counts as finished once handed to its
  /// executor: it may not have run yet when this returns (unlike cudaStreamSynchronize, which
  /// waits for it); wait on what the function itself signals.
  virtual Status synchronize() = 0;
  /// Like synchronize() but waits at most `timeout`: deadline_exceeded on expiry, and the stream
  /// stays usable (aclrtSynchronizeStreamWithTimeout). nanoseconds::max() means no limit.
  virtual Status synchronize_for(std::chrono::nanoseconds timeout) = 0;
  /// The same for a timeout in any unit, converted saturating (milliseconds::max() = no limit).
  template <class Rep, class Period>
  Status synchronize_for(std::chrono::duration<Rep, Period> timeout) {
    return synchronize_for(detail::saturating_cast<std::chrono::nanoseconds>(timeout));
  }
  /// True when all work enqueued so far has finished. Never blocks.
  virtual bool query() = 0;
  virtual int priority() const noexcept = 0;
  /// The backend's handle (cudaStream_t on cuda; null on cpu and sim).
  virtual void* native_handle() noexcept { return nullptr; }
  virtual Device& device() noexcept = 0;

 protected:
  Stream() = default;
};

/// A device. Opened with open_device(); shared by the streams and events it creates.
class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual const DeviceInfo& info() const noexcept = 0;
  const std::string& name() const noexcept { return info().name; }
  DeviceKind kind() const noexcept { return info().kind; }
  const DeviceCapabilities& capabilities() const noexcept { return info().capabilities; }

  virtual Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options = {}) = 0;
  virtual Result<std::unique_ptr<Event>> create_event(const EventOptions& options = {}) = 0;
  /// `bytes` of memory of `kind`: host (pageable), pinned_host (page-locked, for fast async
  /// copies), or device. resource_exhausted when it cannot be had.
  virtual Result<std::shared_ptr<Storage>> allocate(std::size_t bytes, MemoryKind kind) = 0;
  /// A tensor of uninitialised memory of `kind` on this device. invalid_argument for bytes,
  /// whose size the shape does not give: use empty_like.
  Result<Tensor> empty(DType dtype, Shape shape, MemoryKind kind = MemoryKind::device);
  /// A tensor of `like`'s dtype, shape and byte size in uninitialised memory of `kind` on this
  /// device: the destination of a copy of `like` (bytes tensors included).
  Result<Tensor> empty_like(const Tensor& like, MemoryKind kind = MemoryKind::device);
  /// The executor that runs host functions of streams created without one.
  virtual Executor& host_func_executor() noexcept = 0;

 protected:
  Device() = default;
};

/// Opens a device: "cpu", "sim", "sim:<key>=<value>,..." (see docs/backends.md for the keys),
/// "cuda" or "cuda:<index>". invalid_argument for an unknown name (listing the backends built),
/// unavailable for a known backend that was not built or has no hardware (with the reason).
Result<std::shared_ptr<Device>> open_device(std::string_view spec);

/// Names of the device backends open_device knows, in registration order: those built into this
/// library (e.g. {"cpu", "sim", "cuda"}), then those added by register_device_backend.
/// Thread-safe.
std::vector<std::string> device_backends();

/// Opens a device of one backend; `args` is what followed "name:" in the spec ("" if none).
using DeviceOpener = std::function<Result<std::shared_ptr<Device>>(std::string_view args)>;

/// Adds a device backend at run time (an application's own device): open_device("name") and
/// open_device("name:<args>") then call `open`, and device_backends() lists it. `usage` is the
/// spec forms for error messages ("mydev or mydev:<unit>"). invalid_argument when `name` is empty,
/// contains ':' or `open` is empty; already_exists when a backend of that name is registered
/// (built-in names included). Thread-safe; does not block beyond a short lock, and `open` is
/// called without it held (it may open other devices). A backend stays registered for the life of
/// the process.
Status register_device_backend(std::string name, std::string usage, DeviceOpener open);

class EventPool;

/// An event on loan from an EventPool; goes back to the pool when destroyed. Move-only.
class PooledEvent {
 public:
  PooledEvent() = default;
  PooledEvent(PooledEvent&&) noexcept = default;
  PooledEvent& operator=(PooledEvent&& other) noexcept;
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;
  ~PooledEvent();

  Event& operator*() const noexcept { return *event_; }
  Event* operator->() const noexcept { return event_.get(); }
  Event* get() const noexcept { return event_.get(); }
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  friend class EventPool;
  struct Shared;
  PooledEvent(std::shared_ptr<Shared> pool, std::unique_ptr<Event> e)
      : pool_(std::move(pool)), event_(std::move(e)) {}
  std::shared_ptr<Shared> pool_;
  std::unique_ptr<Event> event_;
};

/// Recycles events safely: a returned event goes back to the free list only once its last
/// recorded point has completed and no stream wait on it is still pending, so a new user can
/// never move a point that someone still waits on (the article's §4.1 reuses one event for every
/// item, which races as soon as two items are in flight).
///
/// Thread safety: acquire() and returns are thread-safe; loans may outlive the pool object.
class EventPool {
 public:
  /// At most `capacity` events are ever created.
  EventPool(std::shared_ptr<Device> device, EventOptions options, std::size_t capacity);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  /// An event that is safe to record. Never blocks: resource_exhausted when all `capacity` events
  /// are on loan or still awaiting completion.
  Result<PooledEvent> acquire();
  std::size_t created() const;
  std::size_t available() const;  ///< free now, after recycling what is safe

 private:
  std::shared_ptr<PooledEvent::Shared> shared_;
};

}  // namespace asyncinfer
