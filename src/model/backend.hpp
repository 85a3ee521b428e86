// backend.hpp (internal) — what a model backend author implements and how load_model finds it.
//
// Users include <asyncinfer/model.hpp>; backends include this. A backend implements Model and
// ModelInstance (model.hpp) and registers one loader per model kind in model_backend_registry()
// (model.cpp), the way device backends register an opener (device/backend.hpp). Adding a backend
// touches that table only — never the engine or the devices.
//
// A URI names its kind: "builtin:<name>[?<query>]" is kind "builtin:<name>"; "torch:<path>" and a
// path ending in ".pt" are kind "torch"; "openvino:<path>" and a path ending in ".onnx" or ".xml"
// are kind "openvino"; "python:<path>" and a path ending in "model.py" are kind "python".
// load_model looks the kind up in the table and hands the loader the rest (the query, or the path).
// Optional backends (torch; openvino; cuda's builtin:gemm) are their own CMake targets and appear
// in the table only when built; load_model says how to build a known kind that is missing.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/model.hpp"

namespace asyncinfer::detail {

/// Loads a model of one kind. `uri` is the whole URI (the model's name); `args` is what follows
/// the kind: the query after "builtin:<name>?" ("" if none), or the file path for torch and
/// openvino.
using ModelLoader = Result<std::shared_ptr<Model>> (*)(std::string_view uri, std::string_view args,
                                                       const ModelOptions& options);

struct ModelBackend {
  std::string kind;   ///< "builtin:identity", "builtin:gemm", "torch"
  std::string usage;  ///< URI forms for error messages: "torch:<file.pt> or a path ending in .pt"
  ModelLoader load = nullptr;
};

/// The model kinds built into this library, in registration order.
const std::vector<ModelBackend>& model_backend_registry();

/// Splits a URI into its kind and the loader's `args` (see above). The kind is empty when the URI
/// has no recognisable form.
struct ModelUri {
  std::string_view kind;
  std::string_view args;
};
ModelUri parse_model_uri(std::string_view uri) noexcept;

/// Backends of this library (declared here, defined in each backend's directory).
/// builtin:identity, builtin:fixed_cost, builtin:faulty (model/builtin/).
Result<std::shared_ptr<Model>> load_builtin_model(std::string_view uri, std::string_view query,
                                                  const ModelOptions& options);
#if defined(ASYNCINFER_HAVE_TORCH)
/// A TorchScript file (model/torch/).
Result<std::shared_ptr<Model>> load_torch_model(std::string_view uri, std::string_view path,
                                                const ModelOptions& options);
#endif
#if defined(ASYNCINFER_HAVE_OPENVINO)
/// An ONNX file or OpenVINO IR through OpenVINO's runtime (model/openvino/).
Result<std::shared_ptr<Model>> load_openvino_model(std::string_view uri, std::string_view path,
                                                   const ModelOptions& options);
#endif
#if defined(ASYNCINFER_HAVE_PYTHON_BACKEND)
/// A Triton model.py, each instance in its own Python process (model/python/).
Result<std::shared_ptr<Model>> load_python_model(std::string_view uri, std::string_view path,
                                                 const ModelOptions& options);
#endif
#if defined(ASYNCINFER_HAVE_CUDA)
/// builtin:gemm, cuBLAS on the cuda device (model/cuda/).
Result<std::shared_ptr<Model>> load_gemm_model(std::string_view uri, std::string_view query,
                                               const ModelOptions& options);
#endif

}  // namespace asyncinfer::detail
