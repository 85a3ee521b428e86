// backend.hpp (internal) — what a model backend author implements and how load_model finds it.
//
// Users include <asyncinfer/model.hpp>; backends include this. A backend implements Model and
// ModelInstance (model.hpp) and registers itself: its own folder defines a
// `void register_<name>_model_backend(ModelBackendRegistry&)` that adds one loader per model kind
// it serves, and src/backends.cpp calls it — one line, under the build's ASYNCINFER_HAVE_* define
// when the backend is optional (see device/backend.hpp for why an explicit list, not static
// self-registering objects). Adding a backend touches its own folder, that line and its CMake
// target — never the engine, the devices or this header. A backend decides where it can run from
// the device's DeviceCapabilities (device.hpp), not from its kind.
//
// A URI names its kind: "builtin:<name>[?<query>]" is kind "builtin:<name>"; "torch:<path>" and a
// path ending in ".pt" are kind "torch"; "openvino:<path>" and a path ending in ".onnx" or ".xml"
// are kind "openvino"; "python:<path>" and a path ending in "model.py" are kind "python"; and
// "<kind>:<path>" is kind <kind> for any other backend registered under that name.
// load_model looks the kind up in the registry and hands the loader the rest (the query, or the
// path). Optional backends (torch; openvino; python; cuda's builtin:gemm) are their own CMake
// targets and are registered only when built; load_model says how to build a known kind that is
// missing.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/model.hpp"
#include "core/backend_list.hpp"
#include "model/repository_form.hpp"

namespace asyncinfer::detail {

/// Loads a model of one kind. `uri` is the whole URI (the model's name); `args` is what follows
/// the kind: the query after "builtin:<name>?" ("" if none), or the file path for torch and
/// openvino.
using ModelLoader = Result<std::shared_ptr<Model>> (*)(std::string_view uri, std::string_view args,
                                                       const ModelOptions& options);

/// Completes a model's configuration (complete_model_config in model.hpp); `args` as ModelLoader's.
using ConfigCompleter = Result<std::string> (*)(std::string_view uri, std::string_view args,
                                                std::string_view config_json,
                                                const ModelOptions& options);

struct ModelBackend {
  std::string kind;   ///< "builtin:identity", "builtin:gemm", "torch"
  std::string usage;  ///< URI forms for error messages: "torch:<file.pt> or a path ending in .pt"
  ModelLoader load = nullptr;
  ConfigCompleter complete = nullptr;  ///< null: the config is taken as it is
  /// It reads ModelOptions::backend_parameters; load_model refuses a non-empty list otherwise.
  bool takes_backend_parameters = false;
};

/// The model kinds load_model knows, registered on first use (register_builtin_model_backends).
/// Thread-safe: add() and snapshot() take a short lock; nothing is ever removed.
class ModelBackendRegistry {
 public:
  /// The process's registry, with the built-in backends registered.
  static ModelBackendRegistry& instance();

  /// invalid_argument for an empty kind or a null loader; already_exists when the kind is taken.
  Status add(ModelBackend backend);
  /// A copy of the entries, in registration order.
  std::vector<ModelBackend> snapshot() const;
  /// Adds how a repository names one of the backends' models (repository_form.hpp):
  /// invalid_argument for an empty name, kind or default_model_filename; already_exists when the
  /// name is taken. The form's kind need not be loaded yet (a module's is not).
  Status add_form(RepositoryForm form);
  /// A copy of the forms, in registration order.
  std::vector<RepositoryForm> forms() const;
  /// How many of the first entries are this build's own (registered by instance()); what
  /// applications add, and the backend modules that load later, come after them.
  std::size_t builtin_count() const noexcept { return builtin_; }

 private:
  ModelBackendRegistry() = default;
  BackendList<ModelBackend, &ModelBackend::kind> backends_;
  BackendList<RepositoryForm, &RepositoryForm::name> forms_;
  std::size_t builtin_ = 0;  // how many instance() registered before returning it
};

/// Registers every model backend this build has (src/backends.cpp: one call per backend, each
/// defined in the backend's own folder). Called once, by ModelBackendRegistry::instance().
void register_builtin_model_backends(ModelBackendRegistry& registry);

/// Splits a URI into its kind and the loader's `args` (see above). The kind is empty when the URI
/// has no recognisable form.
struct ModelUri {
  std::string_view kind;
  std::string_view args;
};
ModelUri parse_model_uri(std::string_view uri) noexcept;

}  // namespace asyncinfer::detail
