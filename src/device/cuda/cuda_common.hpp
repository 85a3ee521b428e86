// cuda_common.hpp (internal) — what the cuda backend's files share: CUDA errors as Status, the
// device guard, the device kernels the backend launches, the "am I on CUDA's callback thread"
// flag that keeps CUDA calls out of host functions, and the one way the backend enqueues a host
// function (launch_callback). builtin:gemm and the torch backend use the first two as well.
//
// Every CUDA runtime call of the backend goes through ASYNCINFER_CUDA_STATUS (or its RETURN
// form), so a failure becomes a Status that names the call, the file and the line, with CUDA's
// own error name and text ("cudaMallocFromPoolAsync(...) failed at cuda_device.cpp:123:
// cudaErrorMemoryAllocation: out of memory"). Nothing in the backend aborts on a CUDA error.
//
// Host functions (cudaLaunchHostFunc): the CUDA runtime forbids CUDA calls from them (they may
// fail with cudaErrorNotPermitted or deadlock) and may run the host functions of all streams on
// one driver thread. The backend's host functions therefore only touch host memory, mutexes and
// executors; while one runs, in_cuda_callback() is true, and code that might otherwise release
// CUDA resources (storage deleters, caches) defers the release instead.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/device.hpp"
#include "asyncinfer/status.hpp"
#include "device/cuda/cuda_kernels.hpp"

namespace asyncinfer::detail {

/// ok for cudaSuccess; otherwise a Status naming `call`, `file`:`line` and CUDA's error name and
/// text. Codes: out of memory -> resource_exhausted; no device, no or old driver, device busy or
/// unavailable -> unavailable; anything else -> internal. A non-sticky error is also cleared from
/// the thread's "last error" (cudaGetLastError) so it is reported exactly once.
Status cuda_status(cudaError_t error, const char* call, const char* file, int line);

/// CUDA's "cudaErrorName: text" for an error code.
std::string cuda_error_text(cudaError_t error);

#define ASYNCINFER_CUDA_STATUS(call) \
  ::asyncinfer::detail::cuda_status((call), #call, __FILE__, __LINE__)
#define ASYNCINFER_CUDA_RETURN_IF_ERROR(call) \
  ASYNCINFER_RETURN_IF_ERROR(ASYNCINFER_CUDA_STATUS(call))

/// Makes `ordinal` the calling thread's current CUDA device for the guard's lifetime and restores
/// the previous one afterwards (other code on the thread, e.g. libtorch, keeps its device).
/// Costs a cudaGetDevice, plus two cudaSetDevice calls only when the device differs.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int ordinal);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  /// Not ok when the device could not be made current; callers return it.
  const Status& status() const noexcept { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_;
};

/// True while the calling thread runs one of the backend's cudaLaunchHostFunc callbacks (where
/// CUDA calls are forbidden). Thread-local; never blocks.
bool in_cuda_callback() noexcept;

/// What one of the backend's cudaLaunchHostFunc callbacks runs: host-only work (host memory,
/// mutexes, executors; never a CUDA call), which must not throw.
using CudaCallback = UniqueFunction<void()>;

/// Enqueues `fn` on `stream` (cudaLaunchHostFunc). The callback record, a heap-allocated
/// CudaCallback, belongs to CUDA once enqueued: CUDA's callback thread runs it exactly once, with
/// in_cuda_callback() true, and destroys it there (so what it captured is released on that thread,
/// still flagged). On failure `fn` is destroyed unrun here and the error returned.
Status launch_callback(cudaStream_t stream, CudaCallback fn);

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

/// The CUDA ordinal of a device opened by the cuda backend; invalid_argument for any other
/// device (names it).
Result<int> cuda_device_ordinal(const Device& device);

}  // namespace asyncinfer::detail
