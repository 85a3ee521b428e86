// gemm_weights.hpp (internal) — the fixed weight of builtin:gemm, shared by the device
// initialiser (cuda_kernels.cu) and host code (the tests' float64 reference).
//
// B[i] (row-major index i of the k x n weight) = (top 8 bits of splitmix64(seed + i) - 128) / 128:
// a deterministic pseudo-random value in [-1, 1) with at most 8 significant bits, so f32, f16 and
// bf16 all hold it exactly and every dtype computes with the same weight.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ASYNCINFER_HOST_DEVICE __host__ __device__
#else
#define ASYNCINFER_HOST_DEVICE
#endif

namespace asyncinfer::detail {

/// The seed builtin:gemm uses for its weight.
inline constexpr std::uint64_t kGemmWeightSeed = 0x5eed'ca11'ab1e'f00dULL;

/// splitmix64 (Steele, Lea, Flood 2014): a good 64-bit mix of a counter.
ASYNCINFER_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Weight element `index` for `seed`: a multiple of 1/128 in [-1, 1).
ASYNCINFER_HOST_DEVICE inline float gemm_weight_value(std::uint64_t seed, std::uint64_t index) {
  const int top = static_cast<int>(splitmix64(seed + index) >> 56);  // 0..255
  return static_cast<float>(top - 128) * (1.0f / 128.0f);
}

}  // namespace asyncinfer::detail
