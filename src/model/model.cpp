// Signatures, input validation, and the model backend registry that load_model dispatches through.
#include <algorithm>

#include "backend_modules.hpp"
#include "core/params.hpp"
#include "model/backend.hpp"

namespace asyncinfer {

std::string ModelSignature::to_string() const {
  auto list = [](const std::vector<TensorSpec>& specs) {
    std::string out;
    for (const auto& s : specs) {
      if (!out.empty()) out += ", ";
      out += s.name + " " + std::string(asyncinfer::to_string(s.dtype)) + shape_to_string(s.shape);
    }
    return out;
  };
  std::string out = "inputs: " + list(inputs) + "; outputs: " + list(outputs);
  if (batched) {
    out += "; batched, batch limit " +
           (batch_limit ? std::to_string(*batch_limit) : std::string("none"));
  } else {
    out += "; not batched";
  }
  if (decoupled) out += "; decoupled";
  return out;
}

Status validate_inputs(const ModelSignature& sig, std::span<const Tensor> inputs) {
  if (inputs.size() != sig.inputs.size()) {
    std::string names;
    for (const auto& s : sig.inputs) names += (names.empty() ? "" : ", ") + s.name;
    return invalid_argument_error("expected " + std::to_string(sig.inputs.size()) + " input(s) (" +
                                  names + "), got " + std::to_string(inputs.size()));
  }
  std::int64_t batch = -1;
  std::size_t batch_from = 0;  // the input that set `batch`
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TensorSpec& spec = sig.inputs[i];
    const Tensor& t = inputs[i];
    // Built only when an error needs it: this runs on every submit.
    auto expected = [&spec] {
      return std::string(to_string(spec.dtype)) + shape_to_string(spec.shape);
    };
    if (!t.defined()) {
      if (spec.optional) continue;  // left out, as the model allows
      return invalid_argument_error("input '" + spec.name + "' is undefined");
    }
    if (t.dtype() != spec.dtype) {
      return invalid_argument_error("input '" + spec.name + "': expected dtype " +
                                    std::string(to_string(spec.dtype)) + " (" + expected() +
                                    "), got " + t.describe());
    }
    if (t.rank() != spec.shape.size()) {
      return invalid_argument_error("input '" + spec.name + "': expected shape " +
                                    shape_to_string(spec.shape) + " (rank " +
                                    std::to_string(spec.shape.size()) + "), got " + t.describe());
    }
    for (std::size_t d = 0; d < spec.shape.size(); ++d) {
      if (spec.shape[d] >= 0 && spec.shape[d] != t.shape()[d]) {
        return invalid_argument_error("input '" + spec.name + "': dim " + std::to_string(d) +
                                      " is " + std::to_string(t.shape()[d]) +
                                      " but the model expects " + std::to_string(spec.shape[d]) +
                                      " (expected " + expected() + ", got " + t.describe() + ")");
      }
    }
    if (sig.batched) {
      const std::int64_t b = t.shape()[0];
      if (b < 1) {
        return invalid_argument_error("input '" + spec.name + "': batch dim 0 is " +
                                      std::to_string(b) + ", expected at least 1");
      }
      if (batch >= 0 && b != batch) {
        return invalid_argument_error(
            "input '" + spec.name + "': batch dim 0 is " + std::to_string(b) + " but input '" +
            sig.inputs[batch_from].name + "' has " + std::to_string(batch));
      }
      if (batch < 0) batch_from = i;
      batch = b;
      if (sig.batch_limit && b > *sig.batch_limit) {
        return invalid_argument_error("input '" + spec.name + "': batch of " + std::to_string(b) +
                                      " exceeds the model's batch limit " +
                                      std::to_string(*sig.batch_limit));
      }
    }
  }
  return Status();
}

Result<TensorSpec> parse_tensor_spec(std::string_view text, bool batched) {
  const auto parts = detail::split(text, ':');
  if (parts.size() != 3 || parts[0].empty()) {
    return invalid_argument_error("tensor spec '" + std::string(text) +
                                  "' is not of the form name:dtype:dims (e.g. x:f32:1x32x32)");
  }
  TensorSpec spec;
  spec.name = parts[0];
  ASYNCINFER_ASSIGN_OR_RETURN(spec.dtype, parse_dtype(parts[1]));
  if (batched) spec.shape.push_back(-1);
  if (!parts[2].empty()) {
    for (const std::string& d : detail::split(parts[2], 'x')) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (d.empty() || end != d.c_str() + d.size() || v < -1) {
        return invalid_argument_error("tensor spec '" + std::string(text) + "': dim '" + d +
                                      "' is not an integer >= -1");
      }
      spec.shape.push_back(v);
    }
  }
  return spec;
}

namespace detail {

ModelBackendRegistry& ModelBackendRegistry::instance() {
  static ModelBackendRegistry* const registry = [] {
    auto* r = new ModelBackendRegistry();  // never destroyed: load_model may run at exit
    register_builtin_model_backends(*r);
    r->builtin_ = r->snapshot().size();
    return r;
  }();
  return *registry;
}

Status ModelBackendRegistry::add(ModelBackend backend) {
  if (backend.kind.empty()) return invalid_argument_error("model backend: empty kind");
  if (backend.load == nullptr) {
    return invalid_argument_error("model backend '" + backend.kind + "': no loader");
  }
  return backends_.add(std::move(backend), "model backend");
}

std::vector<ModelBackend> ModelBackendRegistry::snapshot() const { return backends_.snapshot(); }

Status ModelBackendRegistry::add_form(RepositoryForm form) {
  if (form.name.empty() || form.kind.empty() || form.default_model_filename.empty()) {
    return invalid_argument_error("repository form '" + form.name +
                                  "': needs a name, a model kind and a default model filename");
  }
  return forms_.add(std::move(form), "repository form");
}

std::vector<RepositoryForm> ModelBackendRegistry::forms() const { return forms_.snapshot(); }

ModelUri parse_model_uri(std::string_view uri) noexcept {
  constexpr std::string_view kBuiltin = "builtin:";
  constexpr std::string_view kTorch = "torch:";
  if (uri.starts_with(kBuiltin)) {
    const std::size_t q = uri.find('?');
    return {uri.substr(0, q), q == std::string_view::npos ? "" : uri.substr(q + 1)};
  }
  constexpr std::string_view kOpenVino = "openvino:";
  if (uri.starts_with(kTorch)) return {"torch", uri.substr(kTorch.size())};
  if (uri.starts_with(kOpenVino)) return {"openvino", uri.substr(kOpenVino.size())};
  constexpr std::string_view kPython = "python:";
  if (uri.starts_with(kPython)) return {"python", uri.substr(kPython.size())};
  if (uri == "model.py" || uri.ends_with("/model.py")) return {"python", uri};
  if (uri.size() > 3 && uri.ends_with(".pt")) return {"torch", uri};
  if ((uri.size() > 5 && uri.ends_with(".onnx")) || (uri.size() > 4 && uri.ends_with(".xml"))) {
    return {"openvino", uri};
  }
  // "<kind>:<path>" for any other kind a backend registered (a name of letters, digits and '_').
  const std::size_t colon = uri.find(':');
  if (colon != std::string_view::npos && colon > 0) {
    const std::string_view kind = uri.substr(0, colon);
    if (std::all_of(kind.begin(), kind.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_';
        })) {
      return {kind, uri.substr(colon + 1)};
    }
  }
  return {};
}

}  // namespace detail

namespace {

// The backends registered, after loading the module that serves `kind` when one does and it is not
// loaded yet (backend_modules.hpp). A module that does not load is the caller's error, in the
// model's name.
Result<std::vector<detail::ModelBackend>> backends_for(std::string_view uri,
                                                       std::string_view kind) {
  std::vector<detail::ModelBackend> backends = detail::ModelBackendRegistry::instance().snapshot();
  const std::string_view module = detail::backend_module_for(kind, /*device=*/false);
  if (module.empty()) return backends;
  for (const auto& b : backends) {
    if (b.kind == kind) return backends;
  }
  if (Status s = detail::load_backend_module(module); !s.ok()) {
    return unavailable_error("model '" + std::string(uri) + "' needs " + std::string(s.message()));
  }
  return detail::ModelBackendRegistry::instance().snapshot();
}

}  // namespace

std::vector<std::string> model_backends() {
  const auto& registry = detail::ModelBackendRegistry::instance();
  std::vector<std::string> kinds;
  for (const auto& b : registry.snapshot()) kinds.push_back(b.kind);
  return detail::list_backends(std::move(kinds), registry.builtin_count(), /*device=*/false);
}

Result<std::string> complete_model_config(std::string_view uri, std::string_view config_json,
                                          const ModelOptions& options) {
  const detail::ModelUri parsed = detail::parse_model_uri(uri);
  ASYNCINFER_ASSIGN_OR_RETURN(auto backends, backends_for(uri, parsed.kind));
  for (const auto& b : backends) {
    if (b.kind == parsed.kind && b.complete != nullptr) {
      return b.complete(uri, parsed.args, config_json, options);
    }
  }
  return std::string(config_json);
}

Result<std::shared_ptr<Model>> load_model(std::string_view uri, const ModelOptions& options) {
  const detail::ModelUri parsed = detail::parse_model_uri(uri);
  if (options.batch_limit && *options.batch_limit < 1) {
    return invalid_argument_error("model '" + std::string(uri) + "': batch_limit " +
                                  std::to_string(*options.batch_limit) +
                                  " must be >= 1 (unset = the model's own)");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(const std::vector<detail::ModelBackend> backends,
                              backends_for(uri, parsed.kind));
  for (const auto& b : backends) {
    if (b.kind != parsed.kind) continue;
    if (!options.backend_parameters.empty() && !b.takes_backend_parameters) {
      // The backends that do, loaded or not (a module's form says so before it loads).
      std::vector<std::string> takers;
      auto add = [&](const std::string& kind) {
        if (std::find(takers.begin(), takers.end(), kind) == takers.end()) takers.push_back(kind);
      };
      for (const auto& f : detail::ModelBackendRegistry::instance().forms()) {
        if (f.takes_backend_parameters) add(f.kind);
      }
      for (const auto& t : backends) {
        if (t.takes_backend_parameters) add(t.kind);
      }
      std::string list;
      for (std::size_t i = 0; i < takers.size(); ++i) {
        list += (i == 0 ? "" : i + 1 == takers.size() ? " and " : ", ") + takers[i];
      }
      return invalid_argument_error("model '" + std::string(uri) + "': backend parameter '" +
                                    options.backend_parameters.front().first + "' given, but " +
                                    (takers.empty() ? std::string("no backend of this build")
                                                    : "only the " + list + " backends") +
                                    " take backend parameters");
    }
    return b.load(uri, parsed.args, options);
  }
  // Known kinds whose optional backend was not built.
  if (parsed.kind == "builtin:gemm") {
    return unavailable_error("model '" + std::string(uri) +
                             "': builtin:gemm needs the cuda backend, which was not built into "
                             "this library (rebuild with -DASYNCINFER_WITH_CUDA=ON where the CUDA "
                             "toolkit is installed)");
  }
  if (parsed.kind == "torch") {
    return unavailable_error("model '" + std::string(uri) +
                             "': the torch backend was not built into this library (install "
                             "Debian's libtorch-dev and rebuild with -DASYNCINFER_WITH_TORCH=ON)");
  }
  if (parsed.kind == "python") {
    return unavailable_error("model '" + std::string(uri) +
                             "': the python backend was not built into this library (it needs "
                             "Linux and nlohmann_json's headers: Debian's nlohmann-json3-dev)");
  }
  if (parsed.kind == "openvino") {
    return unavailable_error("model '" + std::string(uri) +
                             "': the openvino backend was not built into this library (run "
                             "scripts/setup.sh, which installs OpenVINO's runtime into "
                             ".venv/openvino, and rebuild with -DASYNCINFER_WITH_OPENVINO=ON)");
  }
  const bool builtin = parsed.kind.starts_with("builtin:");
  std::string usage;
  for (const auto& b : backends) {
    if (builtin && !b.kind.starts_with("builtin:")) continue;
    usage += (usage.empty() ? "" : ", ") + b.usage;
  }
  if (builtin) {
    return invalid_argument_error(
        "unknown builtin model '" +
        std::string(parsed.kind.substr(std::string_view("builtin:").size())) + "': expected " +
        usage);
  }
  return invalid_argument_error("unknown model '" + std::string(uri) + "': expected " + usage);
}

}  // namespace asyncinfer
