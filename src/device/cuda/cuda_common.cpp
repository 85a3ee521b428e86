// CUDA errors as Status, the device guard, the callback flag, and the callback record through
// which the backend enqueues every host function (cuda_common.hpp).
#include <memory>

#include "device/cuda/cuda_common.hpp"

namespace asyncinfer::detail {

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

/// The one cudaLaunchHostFunc callback of the backend: runs and destroys a CudaCallback record
/// with the callback flag set. noexcept: a record that threw would have nowhere to report to (the
/// records catch what user code throws themselves).
void CUDART_CB run_callback(void* data) noexcept {
  set_in_cuda_callback(true);
  {
    std::unique_ptr<CudaCallback> record(static_cast<CudaCallback*>(data));
    (*record)();
  }
  set_in_cuda_callback(false);
}

}  // namespace

Status launch_callback(cudaStream_t stream, CudaCallback fn) {
  auto record = std::make_unique<CudaCallback>(std::move(fn));
  Status s = ASYNCINFER_CUDA_STATUS(cudaLaunchHostFunc(stream, &run_callback, record.get()));
  if (s.ok()) (void)record.release();  // owned by the callback now
  return s;
}

}  // namespace asyncinfer::detail
