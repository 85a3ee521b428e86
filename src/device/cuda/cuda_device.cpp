// The cuda backend: device.hpp's Device, Stream and Event on the CUDA runtime. This file opens a
// device (open_cuda_device) and holds CudaDevice's larger members; overview of the backend here.
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
// Files (each header opens with its part of the design):
//   cuda_common.hpp       CUDA errors as Status, the device guard, the callback flag, and
//                         launch_callback: the one callback record (a CudaCallback, i.e. a
//                         UniqueFunction) through which every host function is enqueued
//   cuda_memory.hpp       device memory pool, pinned cache, mapped flag slots
//   cuda_event.hpp        points, the event cache, waiter streams, timed waits, CudaEvent
//   cuda_stream_state.hpp errors in stream order; what a stream keeps alive until passed
//   cuda_host_worker.hpp  the per-stream host thread that runs kernels' host functions
//   cuda_stream.hpp       CudaStream: enqueue, copy, record/wait, host functions, destruction
//   cuda_device.hpp       CudaDevice: the per-device pools, streams, events, allocation
//   cuda_kernels.cu       the spin and host-wait kernels
#include "device/cuda/cuda_device.hpp"

#include <algorithm>
#include <thread>

#include "device/backend.hpp"
#include "device/cuda/cuda_stream.hpp"

namespace asyncinfer::detail {
namespace cuda {

CudaDevice::~CudaDevice() {
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

Result<std::unique_ptr<Stream>> CudaDevice::create_stream(const StreamOptions& options) {
  CudaDeviceGuard guard(ordinal_);
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  // CUDA: numerically lower is higher priority; "greatest" is the lowest number.
  const int priority = std::clamp(options.priority, greatest_priority_, least_priority_);
  std::string name = options.name.empty()
                         ? "cuda" + std::to_string(ordinal_) + "-s" + std::to_string(next_stream_++)
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

Result<std::shared_ptr<Device>> open_cuda_device(std::string_view args);

}  // namespace cuda

void register_cuda_device_backend(DeviceBackendRegistry& registry) {
  (void)registry.add({"cuda", "cuda or cuda:<index>", &cuda::open_cuda_device});
}

Result<std::shared_ptr<Device>> cuda::open_cuda_device(std::string_view args) {
  using namespace cuda;
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
  // Streams are CUDA streams (no caller-run mode); host functions reach the host through
  // cudaLaunchHostFunc, whose thread must not call CUDA; device memory is GPU memory.
  info.capabilities.caller_run_streams = false;
  info.capabilities.host_funcs_may_call_device = false;
  info.capabilities.host_addressable_memory = false;
  return std::shared_ptr<Device>(
      std::make_shared<CudaDevice>(ordinal, std::move(info), least, greatest, std::move(slots),
                                   std::make_shared<EventCache>(ordinal), std::move(memory),
                                   std::make_shared<WaiterPool>(ordinal)));
}

Result<int> cuda_device_ordinal(const Device& device) {
  const auto* d = dynamic_cast<const cuda::CudaDevice*>(&device);
  if (d == nullptr) {
    return invalid_argument_error("device '" + device.name() + "' is not a cuda device");
  }
  return d->ordinal();
}

}  // namespace asyncinfer::detail
