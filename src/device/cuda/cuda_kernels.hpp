// cuda_kernels.hpp (internal) — launchers of the cuda backend's device kernels
// (cuda_kernels.cu). Kept free of asyncinfer headers so nvcc compiles only what it must.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace asyncinfer::detail {

/// Launches a one-thread kernel that spins on the GPU's global nanosecond timer (%globaltimer)
/// for `ns`. It ends early when `*stop` (may be null) or `*abort` becomes non-zero; then it writes
/// 1 to `*cut` (may be null). The flags live in mapped page-locked host memory, so host threads
/// set them with plain atomic stores. Returns the launch's error (cudaLaunchKernel).
cudaError_t launch_spin_kernel(cudaStream_t stream, std::uint64_t ns, const std::uint32_t* stop,
                               const std::uint32_t* abort, std::uint32_t* cut);

/// Launches a one-thread kernel that holds `stream` until `*counter >= target` or `*abort` is
/// non-zero (both in mapped host memory, polled about every microsecond with __nanosleep). This
/// is how a host function that must finish before later stream work (Kernel::host_fn, copies
/// staged through the host) keeps the stream without blocking CUDA's callback thread.
cudaError_t launch_host_wait_kernel(cudaStream_t stream, const std::uint64_t* counter,
                                    std::uint64_t target, const std::uint32_t* abort);

/// Loads the kernels above on the calling thread's current device now (cudaFuncGetAttributes).
/// With lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a kernel is loaded
/// on first launch, which may wait for work already running on the device (the CUDA Programming
/// Guide's lazy-loading hazards); the backend's host-wait kernels can run for as long as a host
/// function takes, so the backend's own kernels are loaded up front when a device is opened.
cudaError_t preload_kernels();

}  // namespace asyncinfer::detail
