// openvino_form.hpp (internal) — how a Triton repository names an OpenVINO model
// (repository_form.hpp): Triton's OpenVINO backend (`backend: "openvino"`, <version>/model.xml),
// and a repository written for ONNX Runtime (`platform: "onnxruntime_onnx"` or
// `backend: "onnxruntime"`, <version>/model.onnx), which OpenVINO's ONNX front end reads: one
// backend serves both.
#pragma once

#include <vector>

#include "model/repository_form.hpp"

namespace asyncinfer::detail {

inline std::vector<RepositoryForm> openvino_repository_forms() {
  RepositoryForm ov;
  ov.name = "openvino";
  ov.platforms = {"openvino"};
  ov.kind = "openvino";
  ov.default_model_filename = "model.xml";
  ov.metadata_platform = "openvino";
  ov.config_platform = "openvino";
  ov.config_backend = "openvino";
  // The other config parameters are OpenVINO properties (NUM_STREAMS, PERFORMANCE_HINT, ...).
  ov.takes_backend_parameters = true;
  ov.own_instance_count = true;  // as many workers as OpenVINO's throughput hint has streams
  ov.batched_from_config = true;
  // A config without inputs or outputs is completed from the file (Triton's auto-complete).
  ov.completes_config = true;
  RepositoryForm onnx = ov;
  onnx.name = "onnxruntime";
  onnx.platforms = {"onnxruntime_onnx"};
  onnx.default_model_filename = "model.onnx";
  onnx.note =
      "is served by the openvino backend (OpenVINO's ONNX front end; ONNX Runtime is not built in)";
  return {ov, onnx};
}

}  // namespace asyncinfer::detail
