// The device kernels of the cuda backend: the spin kernel (Kernel::duration), the host-wait kernel
// (holds a stream while a host function runs on the stream's host thread) and the gemm weight
// initialiser. All are tiny; none uses shared memory.
//
// Host flags live in mapped page-locked host memory (cudaHostAllocMapped). The kernels read them
// through volatile loads, which PTX treats as relaxed loads at system scope (sm_70 and later), so
// a store by a host thread becomes visible to the polling kernel within the PCIe round trip.
// Polling loops sleep with __nanosleep between reads to keep that traffic negligible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <initializer_list>

#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/gemm_weights.hpp"

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

__global__ void gemm_weight_init_kernel(void* out, unsigned long long count, int elem,
                                        unsigned long long seed) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i =
           static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    const float v = gemm_weight_value(seed, i);
    if (elem == static_cast<int>(GemmElem::f16)) {
      static_cast<__half*>(out)[i] = __float2half_rn(v);
    } else if (elem == static_cast<int>(GemmElem::bf16)) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
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

cudaError_t launch_gemm_weight_init(cudaStream_t stream, void* out, std::uint64_t count,
                                    GemmElem elem, std::uint64_t seed) {
  if (count == 0) return cudaSuccess;
  constexpr unsigned int kThreads = 256;
  const unsigned long long want = (count + kThreads - 1) / kThreads;
  const unsigned int blocks = static_cast<unsigned int>(want < 4096ull ? want : 4096ull);
  void* out_arg = out;
  unsigned long long count_arg = count;
  int elem_arg = static_cast<int>(elem);
  unsigned long long seed_arg = seed;
  void* args[] = {&out_arg, &count_arg, &elem_arg, &seed_arg};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gemm_weight_init_kernel), dim3(blocks),
                          dim3(kThreads), args, 0, stream);
}

cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  for (const void* k : {reinterpret_cast<const void*>(&spin_kernel),
                        reinterpret_cast<const void*>(&host_wait_kernel),
                        reinterpret_cast<const void*>(&gemm_weight_init_kernel)}) {
    const cudaError_t e = cudaFuncGetAttributes(&attr, k);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace asyncinfer::detail
