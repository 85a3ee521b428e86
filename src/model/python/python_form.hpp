// python_form.hpp (internal) — how a Triton repository names a Python model
// (repository_form.hpp): Triton's Python backend, `backend: "python"` and no platform,
// <version>/model.py, each instance in its own process. model.py gets the whole config and may
// complete it (auto_complete_config); a folder with <version>/model.py and no config.pbtxt is one.
#pragma once

#include <vector>

#include "model/repository_form.hpp"

namespace asyncinfer::detail {

inline std::vector<RepositoryForm> python_repository_forms() {
  RepositoryForm f;
  f.name = "python";
  f.kind = "python";
  f.default_model_filename = "model.py";
  f.metadata_platform = "python";
  f.config_backend = "python";  // Triton's python models have a backend and no platform
  // python_interpreter is the backend's; the rest reach model.py (args["model_config"]).
  f.takes_backend_parameters = true;
  f.takes_optional_inputs = true;
  f.takes_ragged_inputs = true;
  f.host_process_instances = true;
  f.batched_from_config = true;
  f.takes_model_config = true;
  f.completes_config = true;
  return {f};
}

}  // namespace asyncinfer::detail
