// The device kernels of the cuda backend: the spin kernel (Kernel::duration) and the host-wait
// kernel (holds a stream while a host function runs on the stream's host thread). Both are tiny
// and use no shared memory. (builtin:gemm's weight initialiser is the model's:
// src/model/cuda/gemm_kernels.cu.)
//
// Host flags live in mapped page-locked host memory (cudaHostAllocMapped). The kernels read them
// through volatile loads, which PTX treats as relaxed loads at system scope (sm_70 and later), so
// a store by a host thread becomes visible to the polling kernel within the PCIe round trip.
// Polling loops sleep with __nanosleep between reads to keep that traffic negligible.
#include <cuda_runtime.h>

#include <initializer_list>

#include "device/cuda/cuda_kernels.hpp"

namespace asyncinfer::detail {
namespace {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned int load_flag(const unsigned int* p) {
  return *static_cast<const volatile unsigned int*>(p);
}

__device__ __forceinline__ unsigned long long load_counter(const unsigned long long* p) {
  return *static_cast<const volatile unsigned long long*>(p);
}

__global__ void spin_kernel(unsigned long long ns, const unsigned int* stop,
                            const unsigned int* abort, unsigned int* cut) {
  const unsigned long long start = global_timer_ns();
  for (;;) {
    if ((stop != nullptr && load_flag(stop) != 0u) || load_flag(abort) != 0u) {
      if (cut != nullptr) {
        *static_cast<volatile unsigned int*>(cut) = 1u;
        __threadfence_system();
      }
      return;
    }
    if (global_timer_ns() - start >= ns) return;
    __nanosleep(256);
  }
}

__global__ void host_wait_kernel(const unsigned long long* counter, unsigned long long target,
                                 const unsigned int* abort) {
  while (load_counter(counter) < target) {
    if (load_flag(abort) != 0u) return;
    __nanosleep(512);
  }
}

}  // namespace

// The flags are std::uint32_t / std::uint64_t on the host side; the kernels take the equivalent
// unsigned int / unsigned long long (same size and representation on every CUDA platform).
static_assert(sizeof(unsigned int) == sizeof(std::uint32_t));
static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));

cudaError_t launch_spin_kernel(cudaStream_t stream, std::uint64_t ns, const std::uint32_t* stop,
                               const std::uint32_t* abort, std::uint32_t* cut) {
  unsigned long long ns_arg = ns;
  const unsigned int* stop_arg = reinterpret_cast<const unsigned int*>(stop);
  const unsigned int* abort_arg = reinterpret_cast<const unsigned int*>(abort);
  unsigned int* cut_arg = reinterpret_cast<unsigned int*>(cut);
  void* args[] = {&ns_arg, &stop_arg, &abort_arg, &cut_arg};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&spin_kernel), dim3(1), dim3(1), args, 0,
                          stream);
}

cudaError_t launch_host_wait_kernel(cudaStream_t stream, const std::uint64_t* counter,
                                    std::uint64_t target, const std::uint32_t* abort) {
  const unsigned long long* counter_arg = reinterpret_cast<const unsigned long long*>(counter);
  unsigned long long target_arg = target;
  const unsigned int* abort_arg = reinterpret_cast<const unsigned int*>(abort);
  void* args[] = {&counter_arg, &target_arg, &abort_arg};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&host_wait_kernel), dim3(1), dim3(1), args,
                          0, stream);
}

cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  for (const void* k : {reinterpret_cast<const void*>(&spin_kernel),
                        reinterpret_cast<const void*>(&host_wait_kernel)}) {
    const cudaError_t e = cudaFuncGetAttributes(&attr, k);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace asyncinfer::detail
