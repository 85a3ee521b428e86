// gemm_kernels.hpp (internal) — the device kernel of builtin:gemm (gemm_kernels.cu): the weight
// initialiser. Kept free of asyncinfer headers so nvcc compiles only what it must.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace asyncinfer::detail {

/// Element types the gemm weight initialiser writes.
enum class GemmElem : int { f32 = 0, f16 = 1, bf16 = 2 };

/// Fills `count` elements of `out` with gemm_weight_value(seed, i) (gemm_weights.hpp) converted
/// to `elem`, on `stream`.
cudaError_t launch_gemm_weight_init(cudaStream_t stream, void* out, std::uint64_t count,
                                    GemmElem elem, std::uint64_t seed);

/// Loads the initialiser on the calling thread's current device now (cudaFuncGetAttributes), so
/// a GPU the build has no code for is reported when an instance is made. It is loaded when the
/// first instance on a device is made, not when the device is opened (the cuda backend knows
/// nothing of models), so, like cuBLAS's kernels, that first load can be delayed by a running
/// host-wait kernel of the cuda backend (device/cuda/cuda_kernels.hpp); CUDA_MODULE_LOADING=EAGER
/// rules it out.
cudaError_t preload_gemm_kernels();

}  // namespace asyncinfer::detail
