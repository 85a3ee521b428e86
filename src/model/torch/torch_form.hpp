// torch_form.hpp (internal) — how a Triton repository names a TorchScript model
// (repository_form.hpp): Triton's PyTorch backend, `platform: "pytorch_libtorch"` or
// `backend: "pytorch"`, <version>/model.pt, inputs and outputs listed in the config.
#pragma once

#include <vector>

#include "model/repository_form.hpp"

namespace asyncinfer::detail {

inline std::vector<RepositoryForm> torch_repository_forms() {
  RepositoryForm f;
  f.name = "pytorch";
  f.platforms = {"pytorch_libtorch"};
  f.kind = "torch";  // "torch:<file>" whatever the file's extension (model.pth loads too)
  f.default_model_filename = "model.pt";
  f.metadata_platform = "pytorch_libtorch";
  f.config_platform = "pytorch_libtorch";
  f.config_backend = "pytorch";
  f.needs_config_tensors = true;
  return {f};
}

}  // namespace asyncinfer::detail
