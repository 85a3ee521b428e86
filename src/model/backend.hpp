// backend.hpp (internal) — model backends and how load_model finds them.
//
// A model backend implements Model and ModelInstance (model.hpp) and a loader below. Optional
// backends (torch, cuda's gemm) are declared only when built.
#pragma once

#include <memory>
#include <string_view>

#include "asyncinfer/model.hpp"

namespace asyncinfer::detail {

/// "builtin:<kind>?<query>": `rest` is what follows "builtin:".
Result<std::shared_ptr<Model>> load_builtin_model(std::string_view rest,
                                                  const ModelOptions& options);
#if defined(ASYNCINFER_HAVE_TORCH)
/// A TorchScript file.
Result<std::shared_ptr<Model>> load_torch_model(std::string_view path, const ModelOptions& options);
#endif
#if defined(ASYNCINFER_HAVE_CUDA)
/// "builtin:gemm?<query>" (cuBLAS on the cuda device).
Result<std::shared_ptr<Model>> load_gemm_model(std::string_view query, const ModelOptions& options);
#endif

}  // namespace asyncinfer::detail
