// repository_form.hpp (internal) — how a model repository (Triton's layout: <model>/config.pbtxt,
// <model>/<version>/<file>) names a model backend's models, and what a server hands the backend
// when it loads one.
//
// Each model backend that reads a model file describes itself once, in its own folder (for
// example src/model/torch/torch_form.hpp), and src/backends.cpp registers that description with
// the backend (ModelBackendRegistry::add_form). The description is plain data with no toolkit in
// it, so a server plans a repository's models without loading a backend module; the module loads
// when the first model is (backend_modules.hpp). `asyncinfer serve` (src/server) plans and loads
// every model through these forms: adding a backend adds no branch to the server.
//
// The names follow Triton's: a config names its backend by `backend` (Triton's backend name,
// "pytorch", "onnxruntime", "python") or by `platform` ("pytorch_libtorch", "onnxruntime_onnx");
// Triton's core maps a platform to its backend the same way (its platform table).
#pragma once

#include <string>
#include <vector>

namespace asyncinfer::detail {

/// One way a repository names a backend's models. Immutable once registered.
struct RepositoryForm {
  /// Triton's backend name that selects this form (config `backend:`): "pytorch", "onnxruntime".
  std::string name;
  /// The config `platform:` values that select it too: "pytorch_libtorch", "onnxruntime_onnx".
  std::vector<std::string> platforms;
  /// The model kind load_model loads it as, and the URI prefix: "torch" ("torch:<file>").
  std::string kind;
  /// The file in each version folder unless default_model_filename says otherwise: "model.pt".
  std::string default_model_filename;
  /// What model metadata reports as "platform", and what GET .../config shows as `platform` and
  /// `backend` ("" = the field left out, as Triton's python models have no platform).
  std::string metadata_platform;
  std::string config_platform;
  std::string config_backend;
  /// A warning logged for every model that uses this form, after `platform "<p>" ` (the onnxruntime
  /// form: served by the openvino backend); "" = none.
  std::string note;
  /// The config's `parameters` that are not asyncinfer's own go to the backend
  /// (ModelOptions::backend_parameters); false: they are warned about and dropped.
  bool takes_backend_parameters = false;
  /// `optional: true` inputs are served (the backend hands the model only the inputs that came).
  bool takes_optional_inputs = false;
  /// `allow_ragged_batch: true` inputs are served (TensorSpec::ragged): the backend takes a
  /// batch's requests apart (Model::takes_requests_apart), each keeping its own tensors.
  bool takes_ragged_inputs = false;
  /// Instances are processes on the host, whatever instance_group's kind says: the engine runs on
  /// cpu (the python backend's model.py picks its own device, as in Triton).
  bool host_process_instances = false;
  /// Without an instance_group, the backend's own preferred instance count
  /// (Model::preferred_instances; OpenVINO's throughput streams) rather than one.
  bool own_instance_count = false;
  /// The config must list the inputs and outputs (the backend cannot read them from the file).
  bool needs_config_tensors = false;
  /// ModelOptions::batched is set from the config (max_batch_size > 0), Triton's rule that the
  /// config, not the file, says whether dim 0 is the batch dim.
  bool batched_from_config = false;
  /// The model gets the whole config (ModelOptions::model_config_json, which says whether it is
  /// decoupled) and the server that hosts it (ModelOptions::host: BLS, model control, custom
  /// metrics).
  bool takes_model_config = false;
  /// The backend completes a config (complete_model_config, Triton's auto-complete), and a model
  /// folder with no config.pbtxt whose version folder holds default_model_filename is one of its
  /// models.
  bool completes_config = false;
};

}  // namespace asyncinfer::detail
