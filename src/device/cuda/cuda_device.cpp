// The cuda backend: device.hpp's Device, Stream and Event on the CUDA runtime.
//
// Mapping (CUDA Runtime API reference, "Stream Management", "Event Management", "Stream Ordered
// Memory Allocator"):
//   Stream            a non-blocking cudaStream_t (cudaStreamCreateWithPriority); priorities are
//                     clamped to cudaDeviceGetStreamPriorityRange (lower number = higher
//                     priority, as in device.hpp).
//   Event / record    a cudaEvent_t per recorded point (taken from a per-device cache), created
//                     with cudaEventBlockingSync so Event::synchronize() sleeps in the driver
//                     instead of spinning, and with cudaEventDisableTiming unless
//                     EventOptions::timing. A wait captures the point current when it is enqueued
//                     (cudaStreamWaitEvent), so re-recording never moves it; pending_waits() is
//                     therefore always 0.
//   launch_host_func  cudaLaunchHostFunc. The callback runs on a driver thread that CUDA forbids
//                     to call CUDA and may share between all streams ("host functions without a
//                     mandated order ... may be serialized"), so it only takes the stream's
//                     pending error and posts the HostFunc to the stream's executor (falls back to
//                     running it right there when the executor has shut down).
//   Kernel            duration > 0: a one-thread spin kernel on %globaltimer (cancellable: it
//                     polls a flag in mapped host memory that a std::stop_callback on
//                     Kernel::stop sets, and the stream's abort flag). host_fn: runs on the
//                     stream's own host thread ("host worker", started on first use), not on
//                     CUDA's callback thread: a cudaLaunchHostFunc callback hands it over and a
//                     host-wait kernel holds the stream until the worker has run it. Running it
//                     on the callback thread instead would block the host functions of every
//                     other stream while it runs (a blocked host_fn would stall unrelated
//                     streams). Like the cpu backend, the host_fn may compute for real; it must
//                     still not call CUDA (it could wait on work queued behind itself). A kernel
//                     whose spin was cut short does not run its host_fn (as on cpu). The
//                     host-wait kernel occupies one GPU thread while the host_fn runs; the
//                     backend's kernels are loaded when the device is opened, because a kernel
//                     loaded lazily (CUDA_MODULE_LOADING=LAZY, the default) may wait for running
//                     kernels such as a host-wait kernel. Library kernels loaded lazily later
//                     (cuBLAS) can still be delayed by one; CUDA_MODULE_LOADING=EAGER rules it out.
//   copy              cudaMemcpyAsync with the kind from the placements (copy_kind()). Pageable
//                     host memory is staged through pinned buffers by the host worker, in stream
//                     order, because cudaMemcpyAsync reads pageable sources at call time and
//                     blocks on pageable destinations; host-to-host copies run on the worker too.
//                     The stream keeps both tensors alive until it has passed the copy.
//   memory            device: cudaMallocFromPoolAsync from a per-device cudaMemPool (release
//                     threshold: keep everything) on an internal allocation stream, freed with
//                     cudaFreeAsync; pinned_host: cudaHostAlloc in size classes, cached and reused
//                     (returned to CUDA when the device and its last tensor are gone); host:
//                     Storage::allocate_host. Device storage is not host-accessible.
//
// Errors in stream order (device.hpp). Each stream keeps a host-side pending error (the first
// failure since the last host function): a host_fn's non-ok return or exception, a spin kernel
// cut short by its stop token (cancelled), and errors inherited through events. Host functions
// and the other stream-ordered callbacks below "settle" the work before them: they look at the
// cancellation flags of the spin kernels that precede them and release what the stream kept alive
// (stop callbacks, flag slots, copied tensors). launch_host_func delivers and clears the error.
// To let events carry errors cheaply, a recorded point gets a status snapshot only on streams
// where errors are possible: once a stream has run any Kernel (a host_fn can fail, a spin kernel
// can be cancelled) or waited on a point that can carry an error, each record() enqueues one
// extra host function before cudaEventRecord that copies the pending error into the point, and
// each wait() on such a point enqueues one after cudaStreamWaitEvent that folds the point's error
// into the waiting stream's. Streams that only copy between device and pinned memory, run cuBLAS,
// record and wait never pay for a host function (but one per 1024 copies, to release the tensors
// they keep). Device-side failures (a faulting kernel, a sticky context error) are not seen by
// host functions, which CUDA may no longer run at all; synchronize(), query() and the event waits
// report them (cudaStreamQuery / cudaEventQuery / cudaEventSynchronize).
//
// Destroying a stream (device.hpp; CUDA itself would let the work finish): it refuses new work,
// fires the stop token of a running host_fn, sets the stream's abort flag so its spin and
// host-wait kernels end at once, drops kernels' host functions and host-side copy steps not yet
// started, then waits until the stream has drained: DMA copies and cuBLAS calls already enqueued
// finish, every pending host function runs once with `aborted`, and points recorded after work
// that can fail complete carrying `aborted` (points on streams that only copy complete ok).
// The wait blocks the destroying thread; it cannot end early while the stream waits on an event
// of another stream that never completes (a cudaStreamWaitEvent cannot be cancelled), and it
// deadlocks if called from one of the stream's own kernel host functions.
//
// Waiting without spinning: Stream::synchronize[_for] enqueues a host function that signals a
// condition variable; Event::synchronize_for makes an internal "waiter" stream wait for the point
// (cudaStreamWaitEvent) and signal likewise; Event::synchronize uses cudaEventSynchronize on a
// blocking-sync event. Every timed wait wakes at least every 50 ms to check the stream or event
// with cudaStreamQuery / cudaEventQuery, so a context error ends it instead of the timeout.
//
// Thread safety: as device.hpp. A stream's enqueue calls are serialised by a mutex (several CUDA
// calls make up one operation); the stream-ordered callbacks share only mutex-protected state.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "device/backend.hpp"
#include "device/cuda/cuda_common.hpp"

namespace asyncinfer::detail {

// ---- errors, device guard, callback flag
// ----------------------------------------------------------

std::string cuda_error_text(cudaError_t error) {
  const char* name = cudaGetErrorName(error);
  const char* text = cudaGetErrorString(error);
  return std::string(name != nullptr ? name : "cudaError?") + ": " +
         (text != nullptr ? text : "unknown CUDA error");
}

Status cuda_status(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return Status();
  (void)cudaGetLastError();  // a non-sticky error is reported here, once
  StatusCode code = StatusCode::internal;
  switch (error) {
    case cudaErrorMemoryAllocation:
      code = StatusCode::resource_exhausted;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      code = StatusCode::unavailable;
      break;
    default:
      break;
  }
  std::string_view where(file);
  const std::size_t slash = where.rfind('/');
  if (slash != std::string_view::npos) where.remove_prefix(slash + 1);
  return Status(code, std::string(call) + " failed at " + std::string(where) + ":" +
                          std::to_string(line) + ": " + cuda_error_text(error));
}

CudaDeviceGuard::CudaDeviceGuard(int ordinal) {
  status_ = ASYNCINFER_CUDA_STATUS(cudaGetDevice(&previous_));
  if (!status_.ok() || previous_ == ordinal) return;
  status_ = ASYNCINFER_CUDA_STATUS(cudaSetDevice(ordinal));
  switched_ = status_.ok();
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

namespace {
thread_local bool tl_in_cuda_callback = false;
void set_in_cuda_callback(bool value) noexcept { tl_in_cuda_callback = value; }
}  // namespace

bool in_cuda_callback() noexcept { return tl_in_cuda_callback; }

namespace {

using std::chrono::nanoseconds;

constexpr auto kWakeEvery = std::chrono::milliseconds(50);
/// Settle items a stream may hold before it enqueues a host function just to release them.
constexpr std::size_t kMaxSettleItems = 1024;

/// Runs `fn` here, or on a short-lived thread of its own when called from a CUDA callback (where
/// the CUDA calls that release resources are forbidden). The destructors of the per-device
/// resource owners use it; by construction their last reference is never dropped on a callback
/// thread (the device outlives its streams, and a stream outlives its callbacks), so this is only
/// a safety net and costs nothing on the normal path.
template <class Fn>
void run_outside_callbacks(Fn fn) {
  if (!in_cuda_callback()) {
    fn();
    return;
  }
  std::thread([fn = std::move(fn)]() mutable { fn(); }).detach();
}

std::string micros(nanoseconds t) {
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(t).count()) + " us";
}

// ---- flags in mapped host memory ----------------------------------------------------------------

/// 16 bytes of mapped page-locked host memory, read by device kernels and written by host threads
/// (or the reverse for `cut`). For a cancellable spin kernel: stop (host sets), cut (kernel sets
/// when it ended early). For a stream: stop is the stream's abort flag, counter the number of host
/// worker jobs finished (the host-wait kernel's target).
struct alignas(16) MappedSlot {
  std::uint32_t stop;
  std::uint32_t cut;
  std::uint64_t counter;
};
static_assert(sizeof(MappedSlot) == 16);

void store_flag(std::uint32_t& flag, std::uint32_t value) noexcept {
  std::atomic_ref<std::uint32_t>(flag).store(value, std::memory_order_seq_cst);
}
std::uint32_t load_flag(std::uint32_t& flag) noexcept {
  return std::atomic_ref<std::uint32_t>(flag).load(std::memory_order_acquire);
}

/// What a std::stop_callback on Kernel::stop does: sets the spin kernel's stop flag.
struct SetFlag {
  std::uint32_t* flag;
  void operator()() const noexcept { store_flag(*flag, 1); }
};
using StopFlagCallback = std::stop_callback<SetFlag>;

/// Mapped slots of one device, allocated in chunks (cudaHostAlloc with cudaHostAllocMapped; with
/// unified addressing, which every 64-bit CUDA 13 platform has, the device sees them at the host
/// address). acquire() may allocate (user threads only); release() only touches host memory, so
/// CUDA callbacks may call it.
class SlotPool {
 public:
  explicit SlotPool(int ordinal) : ordinal_(ordinal) {}
  ~SlotPool() {
    run_outside_callbacks([chunks = std::move(chunks_)] {
      for (void* c : chunks) (void)cudaFreeHost(c);
    });
  }
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  /// A zeroed slot. The calling thread's current device must be this pool's.
  Result<MappedSlot*> acquire() {
    std::lock_guard lock(mu_);
    if (free_.empty()) ASYNCINFER_RETURN_IF_ERROR(grow());
    MappedSlot* s = free_.back();
    free_.pop_back();
    store_flag(s->stop, 0);
    store_flag(s->cut, 0);
    std::atomic_ref<std::uint64_t>(s->counter).store(0, std::memory_order_seq_cst);
    return s;
  }

  void release(MappedSlot* s) noexcept {
    if (s == nullptr) return;
    std::lock_guard lock(mu_);
    free_.push_back(s);
  }

 private:
  static constexpr std::size_t kChunkSlots = 256;

  Status grow() {
    void* chunk = nullptr;
    ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&chunk, kChunkSlots * sizeof(MappedSlot),
                                                  cudaHostAllocMapped | cudaHostAllocPortable));
    void* device_view = nullptr;
    Status s = ASYNCINFER_CUDA_STATUS(cudaHostGetDevicePointer(&device_view, chunk, 0));
    if (s.ok() && device_view != chunk) {
      s = unavailable_error("cuda:" + std::to_string(ordinal_) +
                            ": mapped host memory has a different device address (the backend "
                            "needs unified virtual addressing)");
    }
    if (!s.ok()) {
      (void)cudaFreeHost(chunk);
      return s;
    }
    chunks_.push_back(chunk);
    auto* slots = static_cast<MappedSlot*>(chunk);
    for (std::size_t i = 0; i < kChunkSlots; ++i) free_.push_back(&slots[i]);
    return Status();
  }

  const int ordinal_;
  std::mutex mu_;
  std::vector<void*> chunks_;
  std::vector<MappedSlot*> free_;
};

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

  Result<cudaEvent_t> take(bool timing) {
    {
      std::lock_guard lock(mu_);
      auto& list = free_[timing ? 1 : 0];
      if (!list.empty()) {
        cudaEvent_t e = list.back();
        list.pop_back();
        return e;
      }
    }
    CudaDeviceGuard guard(ordinal_);
    ASYNCINFER_RETURN_IF_ERROR(guard.status());
    cudaEvent_t e = nullptr;
    const unsigned flags = cudaEventBlockingSync | (timing ? 0u : cudaEventDisableTiming);
    ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
    return e;
  }

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

// ---- CUDA callbacks -----------------------------------------------------------------------------

/// What a cudaLaunchHostFunc callback does. run() touches only host state (no CUDA calls).
struct CallbackBox {
  virtual ~CallbackBox() = default;
  virtual void run() noexcept = 0;
};

void CUDART_CB run_callback_box(void* data) {
  set_in_cuda_callback(true);
  {
    std::unique_ptr<CallbackBox> box(static_cast<CallbackBox*>(data));
    box->run();
  }
  set_in_cuda_callback(false);
}

/// Enqueues `box` on `stream`; on failure the box is destroyed unrun.
Status launch_box(cudaStream_t stream, std::unique_ptr<CallbackBox> box) {
  Status s = ASYNCINFER_CUDA_STATUS(cudaLaunchHostFunc(stream, &run_callback_box, box.get()));
  if (s.ok()) (void)box.release();  // owned by the callback now
  return s;
}

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

  Result<cudaStream_t> acquire() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        cudaStream_t s = free_.back();
        free_.pop_back();
        return s;
      }
    }
    cudaStream_t s = nullptr;
    ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::lock_guard lock(mu_);
    all_.push_back(s);
    return s;
  }
  void give_back(cudaStream_t s) noexcept {
    std::lock_guard lock(mu_);
    free_.push_back(s);
  }
  /// Waits for every waiter stream (device teardown: by then all points have completed).
  void drain() {
    std::vector<cudaStream_t> all;
    {
      std::lock_guard lock(mu_);
      all = all_;
    }
    for (cudaStream_t s : all) (void)cudaStreamSynchronize(s);
  }
  int ordinal() const noexcept { return ordinal_; }

 private:
  const int ordinal_;
  std::mutex mu_;
  std::vector<cudaStream_t> free_;
  std::vector<cudaStream_t> all_;
};

struct WaiterBox final : CallbackBox {
  WaiterBox(std::shared_ptr<Completion> d, std::shared_ptr<WaiterPool> p, cudaStream_t s)
      : done(std::move(d)), pool(std::move(p)), stream(s) {}
  void run() noexcept override {
    pool->give_back(stream);
    done->complete(Status());
  }
  std::shared_ptr<Completion> done;
  std::shared_ptr<WaiterPool> pool;
  cudaStream_t stream;
};

/// A Completion signalled once `point` completes, set up on first use (one waiter stream per
/// point, however many threads wait for it).
Result<std::shared_ptr<Completion>> watch_point(Point& point,
                                                const std::shared_ptr<WaiterPool>& waiters) {
  if (auto c = point.completion()) return c;
  CudaDeviceGuard guard(point.ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  ASYNCINFER_ASSIGN_OR_RETURN(cudaStream_t ws, waiters->acquire());
  auto c = std::make_shared<Completion>();
  Status s = ASYNCINFER_CUDA_STATUS(cudaStreamWaitEvent(ws, point.event(), 0));
  if (s.ok()) s = launch_box(ws, std::make_unique<WaiterBox>(c, waiters, ws));
  if (!s.ok()) {
    waiters->give_back(ws);  // a wait already enqueued on it only delays its next user
    return s;
  }
  // Two threads may race here; the loser's waiter signals a completion nobody waits for.
  return point.install_completion(std::move(c)).first;
}

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

// ---- memory ---------------------------------------------------------------------------------

/// Device and pinned host memory of one device. Storage deleters hold it, so it outlives the
/// device while tensors remain. Releases from a CUDA callback (a stream letting go of a copied
/// tensor) are deferred to the next allocation or to teardown.
class MemoryCore : public std::enable_shared_from_this<MemoryCore> {
 public:
  static Result<std::shared_ptr<MemoryCore>> create(int ordinal) {
    auto core = std::shared_ptr<MemoryCore>(new MemoryCore(ordinal));
    int supported = 0;
    ASYNCINFER_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ordinal));
    ASYNCINFER_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&core->alloc_stream_, cudaStreamNonBlocking));
    if (supported != 0) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = ordinal;
      ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&core->pool_, &props));
      // Keep freed memory in the pool (like a caching allocator): no release at synchronisation.
      std::uint64_t keep_all = ~std::uint64_t{0};
      ASYNCINFER_CUDA_RETURN_IF_ERROR(
          cudaMemPoolSetAttribute(core->pool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
    }
    return core;
  }

  ~MemoryCore() {
    run_outside_callbacks([ordinal = ordinal_, pool = pool_, stream = alloc_stream_,
                           device = std::move(deferred_device_), pinned = std::move(pinned_all_)] {
      CudaDeviceGuard guard(ordinal);
      for (void* p : device) {
        if (pool != nullptr) {
          (void)cudaFreeAsync(p, stream);
        } else {
          (void)cudaFree(p);
        }
      }
      if (stream != nullptr) {
        (void)cudaStreamSynchronize(stream);
        (void)cudaStreamDestroy(stream);
      }
      // Released once no allocation from it is outstanding (cudaMemPoolDestroy).
      if (pool != nullptr) (void)cudaMemPoolDestroy(pool);
      for (void* p : pinned) (void)cudaFreeHost(p);
      (void)cudaGetLastError();
    });
  }
  MemoryCore(const MemoryCore&) = delete;
  MemoryCore& operator=(const MemoryCore&) = delete;

  Result<std::shared_ptr<Storage>> allocate_device(std::size_t bytes) {
    const Placement where{MemoryKind::device, ordinal_};
    if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, where, nullptr, false);
    CudaDeviceGuard guard(ordinal_);
    ASYNCINFER_RETURN_IF_ERROR(guard.status());
    flush_deferred();
    void* p = nullptr;
    Status s;
    if (pool_ != nullptr) {
      s = ASYNCINFER_CUDA_STATUS(cudaMallocFromPoolAsync(&p, bytes, pool_, alloc_stream_));
      // Usable by every stream once the allocating stream has passed it (it holds no kernels).
      if (s.ok()) s = ASYNCINFER_CUDA_STATUS(cudaStreamSynchronize(alloc_stream_));
    } else {
      s = ASYNCINFER_CUDA_STATUS(cudaMalloc(&p, bytes));
    }
    if (!s.ok()) {
      return Status(s.code() == StatusCode::internal ? StatusCode::resource_exhausted : s.code(),
                    "allocating " + std::to_string(bytes) + " bytes of device memory on cuda:" +
                        std::to_string(ordinal_) + ": " + std::string(s.message()));
    }
    auto self = shared_from_this();
    return std::make_shared<Storage>(
        p, bytes, where, [self](void* q) { release(self, q, 0, true); }, false);
  }

  Result<std::shared_ptr<Storage>> allocate_pinned(std::size_t bytes) {
    const Placement where{MemoryKind::pinned_host, -1};
    if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, where, nullptr, true);
    const std::size_t cls = size_class(bytes);
    void* p = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = pinned_free_.find(cls);
      if (it != pinned_free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    if (p == nullptr) {
      CudaDeviceGuard guard(ordinal_);
      ASYNCINFER_RETURN_IF_ERROR(guard.status());
      Status s = ASYNCINFER_CUDA_STATUS(cudaHostAlloc(&p, cls, cudaHostAllocPortable));
      if (!s.ok()) {
        return Status(s.code() == StatusCode::internal ? StatusCode::resource_exhausted : s.code(),
                      "allocating " + std::to_string(bytes) +
                          " bytes of pinned host memory: " + std::string(s.message()));
      }
      std::lock_guard lock(mu_);
      pinned_all_.push_back(p);
    }
    auto self = shared_from_this();
    return std::make_shared<Storage>(
        p, bytes, where, [self, cls](void* q) { release(self, q, cls, false); }, true);
  }

 private:
  explicit MemoryCore(int ordinal) : ordinal_(ordinal) {}

  /// Pinned blocks come in size classes: 4 KiB, then four steps per power of two (at most 25%
  /// slack), so freed blocks are reused by requests of similar size.
  static std::size_t size_class(std::size_t bytes) {
    constexpr std::size_t kMin = 4096;
    if (bytes <= kMin) return kMin;
    const int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes - 1));
    const std::size_t step = std::size_t{1} << (log2 - 2);
    return (bytes + step - 1) / step * step;
  }

  /// The deleter of every storage (only touches host state on a CUDA callback thread).
  static void release(const std::shared_ptr<MemoryCore>& self, void* p, std::size_t cls,
                      bool device) {
    if (device) {
      self->free_device(p);
    } else {
      std::lock_guard lock(self->mu_);
      self->pinned_free_[cls].push_back(p);  // cached until teardown: cudaFreeHost can synchronise
    }
  }

  void free_device(void* p) {
    if (in_cuda_callback()) {
      std::lock_guard lock(mu_);
      deferred_device_.push_back(p);
      return;
    }
    CudaDeviceGuard guard(ordinal_);
    // The caller kept the tensor alive until the streams using it passed that use (device.hpp),
    // so freeing on the allocation stream cannot overlap them.
    if (pool_ != nullptr) {
      (void)ASYNCINFER_CUDA_STATUS(cudaFreeAsync(p, alloc_stream_));
    } else {
      (void)ASYNCINFER_CUDA_STATUS(cudaFree(p));
    }
  }

  void flush_deferred() {
    std::vector<void*> frees;
    {
      std::lock_guard lock(mu_);
      frees.swap(deferred_device_);
    }
    for (void* p : frees) free_device(p);
  }

  const int ordinal_;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t alloc_stream_ = nullptr;
  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> pinned_free_;
  std::vector<void*> pinned_all_;
  std::vector<void*> deferred_device_;
};

// ---- stream state shared with callbacks ---------------------------------------------------------

/// Something the stream keeps until the stream has passed the point where it was enqueued.
struct SettleItem {
  std::uint64_t seq = 0;
  MappedSlot* slot = nullptr;  ///< a cancellable spin kernel's flags
  std::unique_ptr<StopFlagCallback> on_stop;
  std::string kernel_name;
  std::vector<std::shared_ptr<Storage>> keep_alive;
};

/// The part of a stream that its callbacks and host worker use. Held by the CudaStream and by
/// every callback box, so callbacks never touch a destroyed stream; the CudaStream outlives all its
/// callbacks (its destructor drains the stream).
class StreamState {
 public:
  StreamState(std::string stream_name, Executor* host_executor, std::shared_ptr<SlotPool> slot_pool,
              MappedSlot* mapped_words)
      : name(std::move(stream_name)),
        executor(host_executor),
        slots(std::move(slot_pool)),
        words(mapped_words) {}
  ~StreamState() {
    settle(~std::uint64_t{0});
    slots->release(words);
  }
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  const std::string name;
  Executor* const executor;
  std::shared_ptr<SlotPool> slots;
  MappedSlot* const words;  ///< stop = the stream's abort flag; counter = host jobs finished
  std::atomic<bool> closing{false};
  std::stop_source stop;  ///< fires when the stream is destroyed

  /// Records `s` as the pending error unless one is pending already (the first error wins).
  void fold(Status s) {
    if (s.ok()) return;
    std::lock_guard lock(mu_);
    if (pending_.ok()) pending_ = std::move(s);
  }
  /// The pending error, cleared (for a host function).
  Status take() {
    std::lock_guard lock(mu_);
    return std::exchange(pending_, Status());
  }
  /// The pending error, kept.
  Status peek() {
    std::lock_guard lock(mu_);
    return pending_;
  }
  Status aborted() const {
    return aborted_error("stream '" + name + "' was destroyed before reaching this point");
  }

  void add_item(SettleItem item) {
    std::lock_guard lock(mu_);
    items_.push_back(std::move(item));
  }

  /// Processes the items enqueued before sequence number `limit` (the stream has passed them):
  /// a spin kernel that ended early becomes a `cancelled` pending error; stop callbacks are
  /// deregistered, flag slots returned and kept tensors released. Host-only work.
  void settle(std::uint64_t limit) noexcept {
    std::vector<SettleItem> done;
    {
      std::lock_guard lock(mu_);
      while (!items_.empty() && items_.front().seq < limit) {
        done.push_back(std::move(items_.front()));
        items_.pop_front();
      }
    }
    std::vector<std::shared_ptr<Storage>> last_refs;
    for (SettleItem& item : done) {
      item.on_stop.reset();  // before the slot can be reused by another kernel
      if (item.slot != nullptr) {
        if (load_flag(item.slot->cut) != 0) {
          fold(cancelled_error("kernel '" + item.kernel_name + "' stopped before completion"));
        }
        slots->release(item.slot);
      }
      for (auto& storage : item.keep_alive) {
        // Usually the caller still holds the tensor (device.hpp asks it to) and dropping our
        // reference frees nothing. When ours is the last, the storage's deleter runs: ours only
        // touch host state on a callback thread, but a foreign storage's might call CUDA, so the
        // release goes to the stream's executor instead.
        if (storage && storage.use_count() == 1) last_refs.push_back(std::move(storage));
      }
    }
    done.clear();
    if (last_refs.empty()) return;
    if (!in_cuda_callback()) return;  // released here, on leaving
    Task release([refs = std::move(last_refs)]() mutable { refs.clear(); });
    if (!executor->post(std::move(release))) {
      release();  // NOLINT(bugprone-use-after-move): post() moves only when it accepts
    }
  }

 private:
  std::mutex mu_;
  Status pending_;
  std::deque<SettleItem> items_;
};

/// Work for the stream's host worker: a kernel's host_fn or a host-side copy step.
struct HostJob {
  detail::UniqueFunction<Status(std::stop_token)> fn;
  std::string what;  ///< "kernel 'name'" for error messages; empty for copies
  std::stop_token kernel_stop;
  bool skip = false;  ///< the kernel's spin was cut short: do not run (like the cpu backend)
};

/// The stream's host thread. Jobs arrive from CUDA callbacks in stream order; after each, the
/// finished count goes to the stream's mapped counter, which releases the host-wait kernel that
/// holds the stream. While the stream closes, jobs are dropped (counted, not run).
class HostWorker {
 public:
  HostWorker(std::shared_ptr<StreamState> state, std::string thread_name)
      : state_(std::move(state)), thread_name_(std::move(thread_name)) {
    thread_ = std::jthread([this](std::stop_token st) { loop(st); });
  }
  ~HostWorker() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
  }
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  /// From a CUDA callback: host-only.
  void post(HostJob job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop(std::stop_token stop) {
    setup_thread(thread_name_);
    for (;;) {
      HostJob job;
      {
        std::unique_lock lock(mu_);
        // Jobs still queued when stopping are drained (dropped) before the thread ends.
        if (!cv_.wait(lock, stop, [this] { return !jobs_.empty(); })) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      if (!job.skip && !state_->closing.load(std::memory_order_acquire)) {
        state_->fold(run(job));
      }
      job = HostJob{};  // release what it holds before the stream moves on
      std::atomic_ref<std::uint64_t>(state_->words->counter)
          .store(++finished_, std::memory_order_release);
    }
  }

  Status run(HostJob& job) {
    std::stop_token closing = state_->stop.get_token();
    try {
      Status s;
      if (job.kernel_stop.stop_possible()) {
        std::stop_source both;
        std::stop_callback on_kernel(job.kernel_stop, [&both] { both.request_stop(); });
        std::stop_callback on_close(closing, [&both] { both.request_stop(); });
        s = job.fn(both.get_token());
      } else {
        s = job.fn(closing);
      }
      return s.ok() || job.what.empty() ? s : s.with_context(job.what);
    } catch (const std::exception& e) {
      return internal_error(job.what + " threw: " + e.what());
    } catch (...) {
      return internal_error(job.what + " threw an unknown exception");
    }
  }

  std::shared_ptr<StreamState> state_;
  std::string thread_name_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<HostJob> jobs_;
  std::uint64_t finished_ = 0;
  std::jthread thread_;
};

// ---- the stream-ordered callbacks -------------------------------------------------------------

/// Base of a stream's callbacks: `seq` orders them against the stream's settle items.
struct StreamBox : CallbackBox {
  StreamBox(std::shared_ptr<StreamState> s, std::uint64_t q) : state(std::move(s)), seq(q) {}
  std::shared_ptr<StreamState> state;
  std::uint64_t seq;
};

/// launch_host_func: hands fn and the stream's pending error (or `aborted`) to the executor.
struct HostFuncBox final : StreamBox {
  HostFuncBox(std::shared_ptr<StreamState> s, std::uint64_t q, HostFunc f)
      : StreamBox(std::move(s), q), fn(std::move(f)) {}
  void run() noexcept override {
    state->settle(seq);
    Status st = state->closing.load(std::memory_order_acquire) ? state->aborted() : state->take();
    Task task([fn = std::move(fn), st = std::move(st)]() mutable { fn(std::move(st)); });
    if (state->executor->post(std::move(task))) return;
    // The executor has shut down and left `task` untouched: run it here, exactly once. It must not
    // call CUDA (this is CUDA's callback thread).
    try {
      task();  // NOLINT(bugprone-use-after-move): post() moves only when it accepts
    } catch (...) {
      report_callback_exception("host function", std::current_exception());
    }
  }
  HostFunc fn;
};

/// Before a record on an error-capable stream: the point carries the stream's pending error.
struct SnapshotBox final : StreamBox {
  SnapshotBox(std::shared_ptr<StreamState> s, std::uint64_t q, std::shared_ptr<Point> p)
      : StreamBox(std::move(s), q), point(std::move(p)) {}
  void run() noexcept override {
    state->settle(seq);
    point->set_status(state->closing.load(std::memory_order_acquire) ? state->aborted()
                                                                     : state->peek());
  }
  std::shared_ptr<Point> point;
};

/// After a wait on an error-carrying point: the waiting stream inherits the point's error.
struct InheritBox final : StreamBox {
  InheritBox(std::shared_ptr<StreamState> s, std::uint64_t q, std::shared_ptr<Point> p)
      : StreamBox(std::move(s), q), point(std::move(p)) {}
  void run() noexcept override {
    state->settle(seq);
    state->fold(point->status());
  }
  std::shared_ptr<Point> point;
};

/// Hands a host job to the worker (a host-wait kernel follows it on the stream).
struct TriggerBox final : StreamBox {
  TriggerBox(std::shared_ptr<StreamState> s, std::uint64_t q, std::shared_ptr<HostWorker> w,
             HostJob j, MappedSlot* own)
      : StreamBox(std::move(s), q), worker(std::move(w)), job(std::move(j)), own_slot(own) {}
  void run() noexcept override {
    // The kernel's own spin slot is settled (and released) below: read it first.
    const bool cut = own_slot != nullptr && load_flag(own_slot->cut) != 0;
    state->settle(seq);
    job.skip = job.skip || cut;
    worker->post(std::move(job));
  }
  std::shared_ptr<HostWorker> worker;
  HostJob job;
  MappedSlot* own_slot;
};

/// Stream::synchronize[_for] and the destructor's drain: signals with the pending error (kept).
struct MarkerBox final : StreamBox {
  MarkerBox(std::shared_ptr<StreamState> s, std::uint64_t q, std::shared_ptr<Completion> d)
      : StreamBox(std::move(s), q), done(std::move(d)) {}
  void run() noexcept override {
    state->settle(seq);
    Status st = state->peek();
    state.reset();  // the drain's marker must not hold the last reference past the signal
    done->complete(std::move(st));
  }
  std::shared_ptr<Completion> done;
};

/// Releases settle items when a stream enqueues many without any other callback.
struct SettleBox final : StreamBox {
  using StreamBox::StreamBox;
  void run() noexcept override { state->settle(seq); }
};

// ---- device, event, stream ---------------------------------------------------------------------

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

class CudaStream final : public Stream {
 public:
  CudaStream(std::shared_ptr<CudaDevice> device, cudaStream_t stream, int priority,
             std::shared_ptr<StreamState> state);
  ~CudaStream() override;

  Status enqueue(Kernel kernel) override;
  Status copy(const Tensor& dst, const Tensor& src) override;
  Status record(Event& event) override;
  Status wait(Event& event) override;
  Status launch_host_func(HostFunc fn) override;
  Status synchronize() override { return synchronize_until(Clock::time_point::max(), {}); }
  Status synchronize_for(nanoseconds timeout) override {
    return synchronize_until(deadline_after(timeout), timeout);
  }
  bool query() override;
  int priority() const noexcept override { return priority_; }
  void* native_handle() noexcept override { return stream_; }
  Device& device() noexcept override;

 private:
  Status closing_error() const {
    return failed_precondition_error("stream '" + state_->name + "' is closing");
  }
  Status synchronize_until(Clock::time_point deadline, nanoseconds timeout);
  /// Enqueues a marker callback and waits for it (mu_ not held).
  Status await_marker(Clock::time_point deadline, const std::string& what, bool internal);
  /// Trigger callback + host-wait kernel for `job` (mu_ held).
  Status enqueue_host_job(HostJob job, MappedSlot* own_slot);
  /// Sequence number for a callback box; a box settles every item before it (mu_ held).
  std::uint64_t box_seq() {
    items_since_box_ = 0;
    return seq_++;
  }
  /// Sequence number for a settle item (mu_ held).
  std::uint64_t item_seq() {
    ++items_since_box_;
    return seq_++;
  }
  /// Enqueues a settle-only callback after kMaxSettleItems items without any callback (mu_ held).
  void bound_settle_items();
  int ordinal() const noexcept;

  std::shared_ptr<CudaDevice> device_;
  cudaStream_t stream_;
  const int priority_;
  std::shared_ptr<StreamState> state_;

  std::mutex mu_;  // serialises enqueues; guards the fields below
  bool closing_ = false;
  bool errorable_ = false;  // see the header comment: points get a status snapshot
  std::uint64_t seq_ = 0;
  std::size_t items_since_box_ = 0;
  std::uint64_t host_jobs_ = 0;
  std::shared_ptr<HostWorker> worker_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, DeviceInfo info, int least_priority, int greatest_priority,
             std::shared_ptr<SlotPool> slots, std::shared_ptr<EventCache> events,
             std::shared_ptr<MemoryCore> memory, std::shared_ptr<WaiterPool> waiters)
      : ordinal_(ordinal),
        info_(std::move(info)),
        least_priority_(least_priority),
        greatest_priority_(greatest_priority),
        slots_(std::move(slots)),
        events_(std::move(events)),
        memory_(std::move(memory)),
        waiters_(std::move(waiters)),
        host_pool_(std::make_unique<ThreadPool>(1, "cuda" + std::to_string(ordinal) + "-hostfn")) {}

  ~CudaDevice() override {
    // Streams and events hold the device, so they are all gone: every stream has drained, every
    // point completed. Waiter streams may still be running their last host function.
    {
      CudaDeviceGuard guard(ordinal_);
      waiters_->drain();
      // Storages may keep the memory core alive beyond this point; the rest goes now.
      waiters_.reset();
      events_.reset();
      memory_.reset();
      slots_.reset();
    }
    if (host_pool_->in_pool()) {
      // The last reference went in a host function on our own pool: it cannot join itself.
      std::thread([pool = std::move(host_pool_)]() mutable { pool.reset(); }).detach();
    }
  }

  const DeviceInfo& info() const noexcept override { return info_; }

  Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options) override {
    CudaDeviceGuard guard(ordinal_);
    ASYNCINFER_RETURN_IF_ERROR(guard.status());
    // CUDA: numerically lower is higher priority; "greatest" is the lowest number.
    const int priority = std::clamp(options.priority, greatest_priority_, least_priority_);
    std::string name = options.name.empty() ? "cuda" + std::to_string(ordinal_) + "-s" +
                                                  std::to_string(next_stream_++)
                                            : options.name;
    ASYNCINFER_ASSIGN_OR_RETURN(MappedSlot * words, slots_->acquire());
    cudaStream_t s = nullptr;
    Status created =
        ASYNCINFER_CUDA_STATUS(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
    if (!created.ok()) {
      slots_->release(words);
      return created.with_context("creating stream '" + name + "'");
    }
    Executor* executor =
        options.host_func_executor != nullptr ? options.host_func_executor : host_pool_.get();
    auto state = std::make_shared<StreamState>(std::move(name), executor, slots_, words);
    auto self = std::static_pointer_cast<CudaDevice>(shared_from_this());
    return std::unique_ptr<Stream>(
        std::make_unique<CudaStream>(std::move(self), s, priority, std::move(state)));
  }

  Result<std::unique_ptr<Event>> create_event(const EventOptions& options) override {
    auto self = std::static_pointer_cast<CudaDevice>(shared_from_this());
    return std::unique_ptr<Event>(std::make_unique<CudaEvent>(std::move(self), options.timing));
  }

  Result<std::shared_ptr<Storage>> allocate(std::size_t bytes, MemoryKind kind) override {
    switch (kind) {
      case MemoryKind::host:
        return Storage::allocate_host(bytes);
      case MemoryKind::pinned_host:
        return memory_->allocate_pinned(bytes);
      case MemoryKind::device:
        return memory_->allocate_device(bytes);
    }
    return invalid_argument_error("allocate: unknown memory kind");
  }

  Executor& host_func_executor() noexcept override { return *host_pool_; }

  int ordinal() const noexcept { return ordinal_; }
  const std::shared_ptr<SlotPool>& slots() const noexcept { return slots_; }
  const std::shared_ptr<EventCache>& events() const noexcept { return events_; }
  const std::shared_ptr<MemoryCore>& memory() const noexcept { return memory_; }
  const std::shared_ptr<WaiterPool>& waiters() const noexcept { return waiters_; }

 private:
  const int ordinal_;
  const DeviceInfo info_;
  const int least_priority_;
  const int greatest_priority_;
  std::shared_ptr<SlotPool> slots_;
  std::shared_ptr<EventCache> events_;
  std::shared_ptr<MemoryCore> memory_;
  std::shared_ptr<WaiterPool> waiters_;
  std::unique_ptr<ThreadPool> host_pool_;
  std::atomic<int> next_stream_{0};
};

// ---- CudaEvent
// ------------------------------------------------------------------------------------

CudaEvent::CudaEvent(std::shared_ptr<CudaDevice> device, bool timing)
    : device_(std::move(device)), timing_(timing) {}

bool CudaEvent::query() {
  auto p = current();
  if (!p) return true;
  CudaDeviceGuard guard(p->ordinal());
  const cudaError_t e = cudaEventQuery(p->event());
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) (void)cudaGetLastError();  // failed: nothing more will happen
  return true;
}

Status CudaEvent::synchronize() {
  auto p = current();
  if (!p) return Status();
  CudaDeviceGuard guard(p->ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  // A blocking-sync event: the thread sleeps in the driver until the point completes.
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(p->event()));
  return p->status();
}

Status CudaEvent::synchronize_for(nanoseconds timeout) {
  auto p = current();
  if (!p) return Status();
  const Clock::time_point deadline = deadline_after(timeout);
  CudaDeviceGuard guard(p->ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  const cudaError_t first = cudaEventQuery(p->event());
  if (first == cudaSuccess) return p->status();
  if (first != cudaErrorNotReady) return ASYNCINFER_CUDA_STATUS(first);
  auto c = watch_point(*p, device_->waiters());
  const cudaEvent_t ev = p->event();
  Status s = await(
      c.ok() ? *c : nullptr, deadline, [ev] { return cudaEventQuery(ev); },
      "cudaEventQuery(event)");
  if (s.code() == StatusCode::deadline_exceeded) {
    return deadline_exceeded_error("event not reached within " + micros(timeout));
  }
  ASYNCINFER_RETURN_IF_ERROR(s);
  return p->status();
}

Result<double> CudaEvent::elapsed_us_since(Event& start) {
  auto* s = dynamic_cast<CudaEvent*>(&start);
  if (s == nullptr) {
    return invalid_argument_error("elapsed_time_us: the two events belong to different backends");
  }
  if (!timing_ || !s->timing_) {
    return failed_precondition_error(
        "elapsed_time_us: timing is disabled on an event (create it with EventOptions{.timing = "
        "true})");
  }
  auto a = s->current();
  auto b = current();
  if (!a || !b) return failed_precondition_error("elapsed_time_us: an event was never recorded");
  if (a->ordinal() != b->ordinal()) {
    return failed_precondition_error(
        "elapsed_time_us: the events were recorded on different "
        "devices (cuda:" +
        std::to_string(a->ordinal()) + ", cuda:" + std::to_string(b->ordinal()) + ")");
  }
  CudaDeviceGuard guard(b->ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  for (const auto& p : {a, b}) {
    const cudaError_t e = cudaEventQuery(p->event());
    if (e == cudaErrorNotReady) {
      return failed_precondition_error("elapsed_time_us: an event has not completed yet");
    }
    ASYNCINFER_CUDA_RETURN_IF_ERROR(e);
  }
  float ms = 0;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a->event(), b->event()));
  return static_cast<double>(ms) * 1000.0;
}

// ---- CudaStream
// -----------------------------------------------------------------------------------

CudaStream::CudaStream(std::shared_ptr<CudaDevice> device, cudaStream_t stream, int priority,
                       std::shared_ptr<StreamState> state)
    : device_(std::move(device)), stream_(stream), priority_(priority), state_(std::move(state)) {}

CudaStream::~CudaStream() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  state_->closing.store(true, std::memory_order_release);
  state_->stop.request_stop();         // a running host_fn sees its token fire
  store_flag(state_->words->stop, 1);  // spin and host-wait kernels of this stream end now
  {
    CudaDeviceGuard guard(ordinal());
    // Drain: every callback enqueued so far runs (host functions with `aborted`).
    Status drained = await_marker(Clock::time_point::max(), "drain", /*internal=*/true);
    if (!drained.ok()) (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  worker_.reset();  // joins the host worker (it drops what is left)
  state_->settle(~std::uint64_t{0});
  state_.reset();
}

int CudaStream::ordinal() const noexcept { return device_->ordinal(); }

Device& CudaStream::device() noexcept { return *device_; }

Status CudaStream::enqueue(Kernel kernel) {
  if (kernel.duration.count() <= 0 && !kernel.host_fn) return Status();
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  errorable_ = true;
  MappedSlot* slot = nullptr;
  if (kernel.duration.count() > 0) {
    std::unique_ptr<StopFlagCallback> on_stop;
    if (kernel.stop.stop_possible()) {
      ASYNCINFER_ASSIGN_OR_RETURN(slot, device_->slots()->acquire());
      on_stop = std::make_unique<StopFlagCallback>(kernel.stop, SetFlag{&slot->stop});
    }
    const cudaError_t e =
        launch_spin_kernel(stream_, static_cast<std::uint64_t>(kernel.duration.count()),
                           slot != nullptr ? &slot->stop : nullptr, &state_->words->stop,
                           slot != nullptr ? &slot->cut : nullptr);
    if (e != cudaSuccess) {
      on_stop.reset();
      device_->slots()->release(slot);
      return cuda_status(e, "launch_spin_kernel (cudaLaunchKernel)", __FILE__, __LINE__)
          .with_context("kernel '" + kernel.name + "'");
    }
    if (slot != nullptr) {
      SettleItem item;
      item.seq = item_seq();
      item.slot = slot;
      item.on_stop = std::move(on_stop);
      item.kernel_name = kernel.name;
      state_->add_item(std::move(item));
    }
  }
  if (kernel.host_fn) {
    HostJob job;
    job.fn = std::move(kernel.host_fn);
    job.what = "kernel '" + kernel.name + "'";
    job.kernel_stop = kernel.stop;
    ASYNCINFER_RETURN_IF_ERROR(enqueue_host_job(std::move(job), slot));
  }
  bound_settle_items();
  return Status();
}

Status CudaStream::enqueue_host_job(HostJob job, MappedSlot* own_slot) {
  if (!worker_) {
    std::string thread_name = state_->name + "-h";
    worker_ = std::make_shared<HostWorker>(state_, std::move(thread_name));
  }
  const std::uint64_t target = host_jobs_ + 1;
  ASYNCINFER_RETURN_IF_ERROR(launch_box(
      stream_, std::make_unique<TriggerBox>(state_, box_seq(), worker_, std::move(job), own_slot)));
  host_jobs_ = target;  // the job is bound to run (or be dropped) and count
  const cudaError_t e =
      launch_host_wait_kernel(stream_, &state_->words->counter, target, &state_->words->stop);
  return cuda_status(e, "launch_host_wait_kernel (cudaLaunchKernel)", __FILE__, __LINE__);
}

void CudaStream::bound_settle_items() {
  if (items_since_box_ < kMaxSettleItems) return;
  (void)launch_box(stream_, std::make_unique<SettleBox>(state_, box_seq()));
}

namespace {
/// Where a tensor's bytes really are, by cudaPointerGetAttributes.
enum class Where { pageable, pinned, device };

struct Located {
  Where where = Where::pageable;
  int ordinal = -1;
};
}  // namespace

Result<Located> locate(const Tensor& t, const char* role, int ordinal) {
  cudaPointerAttributes attr{};
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, t.data()));
  const bool placed_on_device = t.placement().kind == MemoryKind::device;
  const bool is_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (placed_on_device != is_device) {
    return invalid_argument_error(
        std::string("copy on a stream of cuda:") + std::to_string(ordinal) + ": " + role + " " +
        t.describe() + " is placed in " + std::string(to_string(t.placement().kind)) +
        " memory but " + (is_device ? "is CUDA device memory" : "is not CUDA device memory") +
        " (memory of another backend's device? copy through the host)");
  }
  if (is_device) return Located{Where::device, attr.device};
  return Located{attr.type == cudaMemoryTypeHost ? Where::pinned : Where::pageable, -1};
}

Status CudaStream::copy(const Tensor& dst, const Tensor& src) {
  ASYNCINFER_RETURN_IF_ERROR(check_copy(dst, src));
  const std::size_t bytes = src.byte_size();
  if (bytes == 0) return Status();
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  ASYNCINFER_ASSIGN_OR_RETURN(Located d, locate(dst, "destination", ordinal()));
  ASYNCINFER_ASSIGN_OR_RETURN(Located s, locate(src, "source", ordinal()));
  const CopyKind kind = copy_kind(dst, src);
  if ((kind == CopyKind::host_to_device && d.ordinal != ordinal()) ||
      (kind == CopyKind::device_to_host && s.ordinal != ordinal())) {
    return invalid_argument_error("copy on a stream of cuda:" + std::to_string(ordinal()) + ": " +
                                  dst.describe() + " <- " + src.describe() +
                                  " involves memory of another CUDA device; use a stream of that "
                                  "device");
  }
  std::shared_ptr<Storage> staging;
  if ((kind == CopyKind::host_to_device && s.where == Where::pageable) ||
      (kind == CopyKind::device_to_host && d.where == Where::pageable)) {
    ASYNCINFER_ASSIGN_OR_RETURN(staging, device_->memory()->allocate_pinned(bytes));
  }
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  void* const dp = dst.data();
  const void* const sp = src.data();
  const auto host_copy = [](void* to, const void* from, std::size_t n,
                            std::vector<std::shared_ptr<Storage>> keep) {
    HostJob job;
    job.fn = [to, from, n, keep = std::move(keep)](std::stop_token) {
      std::memmove(to, from, n);
      return Status();
    };
    return job;
  };
  switch (kind) {
    case CopyKind::host_to_host:
      ASYNCINFER_RETURN_IF_ERROR(
          enqueue_host_job(host_copy(dp, sp, bytes, {dst.storage(), src.storage()}), nullptr));
      break;
    case CopyKind::host_to_device:
      if (staging) {
        ASYNCINFER_RETURN_IF_ERROR(enqueue_host_job(
            host_copy(staging->data(), sp, bytes, {staging, src.storage()}), nullptr));
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, staging->data(), bytes, cudaMemcpyHostToDevice, stream_));
      } else {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, sp, bytes, cudaMemcpyHostToDevice, stream_));
      }
      break;
    case CopyKind::device_to_host:
      if (staging) {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(staging->data(), sp, bytes, cudaMemcpyDeviceToHost, stream_));
        ASYNCINFER_RETURN_IF_ERROR(enqueue_host_job(
            host_copy(dp, staging->data(), bytes, {staging, dst.storage()}), nullptr));
      } else {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, sp, bytes, cudaMemcpyDeviceToHost, stream_));
      }
      break;
    case CopyKind::device_to_device:
      if (d.ordinal == s.ordinal) {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, sp, bytes, cudaMemcpyDeviceToDevice, stream_));
      } else {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyPeerAsync(dp, d.ordinal, sp, s.ordinal, bytes, stream_));
      }
      break;
  }
  // The stream keeps both tensors (and the staging buffer) until it has passed the copy.
  SettleItem item;
  item.seq = item_seq();
  item.keep_alive = {dst.storage(), src.storage()};
  if (staging) item.keep_alive.push_back(std::move(staging));
  state_->add_item(std::move(item));
  bound_settle_items();
  return Status();
}

Status CudaStream::record(Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr) {
    return invalid_argument_error("record: the event belongs to another backend than stream '" +
                                  state_->name + "'");
  }
  if (e->device().ordinal() != ordinal()) {
    return invalid_argument_error(
        "record: the event belongs to cuda:" + std::to_string(e->device().ordinal()) +
        ", stream '" + state_->name + "' to cuda:" + std::to_string(ordinal()));
  }
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  ASYNCINFER_ASSIGN_OR_RETURN(cudaEvent_t ev, device_->events()->take(e->timing_enabled()));
  auto point = std::make_shared<Point>(device_->events(), ev, e->timing_enabled(), ordinal());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  if (errorable_) {
    point->errorable = true;
    ASYNCINFER_RETURN_IF_ERROR(
        launch_box(stream_, std::make_unique<SnapshotBox>(state_, box_seq(), point)));
  }
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventRecord(point->event(), stream_));
  e->set_current(std::move(point));
  return Status();
}

Status CudaStream::wait(Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr) {
    return invalid_argument_error("wait: the event belongs to another backend than stream '" +
                                  state_->name + "'");
  }
  std::shared_ptr<Point> point = e->current();
  if (!point) return Status();  // never recorded: nothing to wait for (CUDA semantics)
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, point->event(), 0));
  if (point->errorable) {
    errorable_ = true;
    ASYNCINFER_RETURN_IF_ERROR(
        launch_box(stream_, std::make_unique<InheritBox>(state_, box_seq(), std::move(point))));
  }
  return Status();
}

Status CudaStream::launch_host_func(HostFunc fn) {
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  return launch_box(stream_, std::make_unique<HostFuncBox>(state_, box_seq(), std::move(fn)));
}

Status CudaStream::await_marker(Clock::time_point deadline, const std::string& what,
                                bool internal) {
  auto done = std::make_shared<Completion>();
  {
    std::lock_guard lock(mu_);
    if (closing_ && !internal) return closing_error();
    ASYNCINFER_RETURN_IF_ERROR(
        launch_box(stream_, std::make_unique<MarkerBox>(state_, box_seq(), done)));
  }
  cudaStream_t s = stream_;
  ASYNCINFER_RETURN_IF_ERROR(await(
      done, deadline, [s] { return cudaStreamQuery(s); }, "cudaStreamQuery(" + what + ")"));
  // Idle by cudaStreamQuery means the marker has run; allow for its signal still in flight.
  if (!done->wait_until(Clock::now() + std::chrono::seconds(1))) return state_->peek();
  return done->status();
}

Status CudaStream::synchronize_until(Clock::time_point deadline, nanoseconds timeout) {
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  Status s = await_marker(deadline, "stream '" + state_->name + "'", /*internal=*/false);
  if (s.code() == StatusCode::deadline_exceeded) {
    return deadline_exceeded_error("stream '" + state_->name + "' did not finish its work within " +
                                   micros(timeout));
  }
  return s;
}

bool CudaStream::query() {
  CudaDeviceGuard guard(ordinal());
  const cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) (void)cudaGetLastError();  // failed: nothing more will run
  return true;
}

Result<int> parse_ordinal(std::string_view args) {
  if (args.empty()) return 0;
  int value = 0;
  for (char c : args) {
    if (c < '0' || c > '9' || value > 100000) {
      return invalid_argument_error(
          "cuda device: expected cuda or cuda:<index>, got 'cuda:" + std::string(args) + "'");
    }
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

Result<std::shared_ptr<Device>> open_cuda_device(std::string_view args) {
  ASYNCINFER_ASSIGN_OR_RETURN(const int ordinal, parse_ordinal(args));
  // No GPU or no driver is an expected condition here: unavailable with CUDA's own words.
  auto unavailable = [](const Status& s) { return Status(StatusCode::unavailable, s.message()); };
  int count = 0;
  Status s = ASYNCINFER_CUDA_STATUS(cudaGetDeviceCount(&count));
  if (!s.ok()) return unavailable(s);
  if (count == 0) {
    return unavailable_error(
        "no CUDA device is visible (cudaGetDeviceCount returned 0; check "
        "CUDA_VISIBLE_DEVICES)");
  }
  if (ordinal >= count) {
    return unavailable_error("cuda:" + std::to_string(ordinal) + " does not exist: " +
                             std::to_string(count) + " CUDA device(s) visible");
  }
  CudaDeviceGuard guard(ordinal);
  if (!guard.status().ok()) return unavailable(guard.status());
  cudaDeviceProp prop{};
  s = ASYNCINFER_CUDA_STATUS(cudaGetDeviceProperties(&prop, ordinal));
  if (!s.ok()) return unavailable(s);
  s = ASYNCINFER_CUDA_STATUS(preload_kernels());
  if (!s.ok()) {
    // Typically no machine code or PTX for this GPU in the build (ASYNCINFER_CUDA_ARCHITECTURES).
    return unavailable(s.with_context("cuda:" + std::to_string(ordinal) + " (" + prop.name +
                                      ", compute " + std::to_string(prop.major) + "." +
                                      std::to_string(prop.minor) + ")"));
  }
  int least = 0;
  int greatest = 0;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  if (prop.unifiedAddressing == 0) {
    return unavailable_error("cuda:" + std::to_string(ordinal) + " (" + prop.name +
                             ") lacks unified virtual addressing, which the backend needs");
  }

  auto slots = std::make_shared<SlotPool>(ordinal);
  // A first chunk now, so the first streams and kernels never allocate pinned memory.
  ASYNCINFER_ASSIGN_OR_RETURN(MappedSlot * warm, slots->acquire());
  slots->release(warm);
  ASYNCINFER_ASSIGN_OR_RETURN(auto memory, MemoryCore::create(ordinal));

  DeviceInfo info;
  info.name = "cuda:" + std::to_string(ordinal);
  info.kind = DeviceKind::cuda;
  const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  info.description = std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) +
                     " SMs, " + std::to_string(static_cast<long long>(gib + 0.5)) +
                     " GiB, compute " + std::to_string(prop.major) + "." +
                     std::to_string(prop.minor) + ", " + std::to_string(prop.asyncEngineCount) +
                     " copy engine(s)";
  info.async = true;
  info.simulated = false;
  info.unified_memory = false;
  info.cancellable_work = true;  // spin kernels poll their stop flag; host_fns get stop tokens
  info.compute_engines = 1;      // one GPU; it runs kernels of several streams concurrently
  info.copy_engines = prop.asyncEngineCount;
  return std::shared_ptr<Device>(
      std::make_shared<CudaDevice>(ordinal, std::move(info), least, greatest, std::move(slots),
                                   std::make_shared<EventCache>(ordinal), std::move(memory),
                                   std::make_shared<WaiterPool>(ordinal)));
}

Result<int> cuda_device_ordinal(const Device& device) {
  const auto* d = dynamic_cast<const CudaDevice*>(&device);
  if (d == nullptr) {
    return invalid_argument_error("device '" + device.name() + "' is not a cuda device");
  }
  return d->ordinal();
}

}  // namespace asyncinfer::detail
