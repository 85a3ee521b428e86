// The device kernel of builtin:gemm: the weight initialiser, a grid-stride loop writing
// gemm_weight_value(seed, i) in the model's dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "model/cuda/gemm_kernels.hpp"
#include "model/cuda/gemm_weights.hpp"

namespace asyncinfer::detail {
namespace {

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

cudaError_t preload_gemm_kernels() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&gemm_weight_init_kernel));
}

}  // namespace asyncinfer::detail
