// The backends this library has: one registration call per built-in backend, and one row per
// optional backend, each defined in the backend's own folder. Adding a backend adds its line here
// (under its ASYNCINFER_HAVE_* define when it is optional) and nothing elsewhere outside its folder
// and its CMake stanza (asyncinfer_add_backend in src/CMakeLists.txt).
//
// An explicit list, not static objects that register themselves: libasyncinfer may be a static
// library, and a linker keeps an object from a static library only when something references it —
// a self-registering object nobody names would silently vanish. This file is referenced by the
// registries (their first use calls the functions below), so every backend it names is linked, and
// the order here is the order device_backends() and model_backends() list them in.
//
// The optional backends are either folded into libasyncinfer and registered here with the built-in
// ones, or (ASYNCINFER_BACKEND_MODULES) their own modules, which the registries load the first time
// one of the kinds in backend_module_kinds() is asked for (backend_modules.hpp).
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "backend_modules.hpp"
#include "device/backend.hpp"
#include "model/backend.hpp"
#include "model/openvino/openvino_form.hpp"
#include "model/python/python_form.hpp"
#include "model/torch/torch_form.hpp"

namespace asyncinfer::detail {

// Each is defined in its backend's folder (src/device/<name>/, src/model/<name>/).
void register_cpu_device_backend(DeviceBackendRegistry& registry);
void register_sim_device_backend(DeviceBackendRegistry& registry);
void register_builtin_model_backend(ModelBackendRegistry& registry);

#if !defined(ASYNCINFER_BACKEND_MODULES)
#if defined(ASYNCINFER_HAVE_CUDA)
void register_cuda_device_backend(DeviceBackendRegistry& registry);
void register_gemm_model_backend(ModelBackendRegistry& registry);
#endif
#if defined(ASYNCINFER_HAVE_TORCH)
void register_torch_model_backend(ModelBackendRegistry& registry);
#endif
#if defined(ASYNCINFER_HAVE_OPENVINO)
void register_openvino_model_backend(ModelBackendRegistry& registry);
#endif
#if defined(ASYNCINFER_HAVE_PYTHON_BACKEND)
void register_python_model_backend(ModelBackendRegistry& registry);
#endif
#endif

void register_builtin_device_backends(DeviceBackendRegistry& registry) {
  register_cpu_device_backend(registry);
  register_sim_device_backend(registry);
#if defined(ASYNCINFER_HAVE_CUDA) && !defined(ASYNCINFER_BACKEND_MODULES)
  register_cuda_device_backend(registry);
#endif
}

void register_builtin_model_backends(ModelBackendRegistry& registry) {
  // How a repository names the file backends' models (repository_form.hpp): plain data, known
  // before their modules load, and whether or not this build has the backend, so that a
  // repository plans the same everywhere and a model of a backend not built fails at its load,
  // saying how to build it (load_model).
  for (auto forms :
       {torch_repository_forms(), openvino_repository_forms(), python_repository_forms()}) {
    for (RepositoryForm& f : forms) (void)registry.add_form(std::move(f));
  }

  register_builtin_model_backend(registry);  // builtin:identity, fixed_cost, faulty, stream
#if !defined(ASYNCINFER_BACKEND_MODULES)
#if defined(ASYNCINFER_HAVE_CUDA)
  register_gemm_model_backend(registry);  // builtin:gemm on cuBLAS
#endif
#if defined(ASYNCINFER_HAVE_TORCH)
  register_torch_model_backend(registry);
#endif
#if defined(ASYNCINFER_HAVE_OPENVINO)
  register_openvino_model_backend(registry);
#endif
#if defined(ASYNCINFER_HAVE_PYTHON_BACKEND)
  register_python_model_backend(registry);
#endif
#endif
}

const std::vector<ModuleKind>& backend_module_kinds() {
  static const std::vector<ModuleKind> kinds = {
#if defined(ASYNCINFER_BACKEND_MODULES)
#if defined(ASYNCINFER_HAVE_CUDA)
    {"cuda", "cuda", true},           // src/device/cuda
    {"cuda", "builtin:gemm", false},  // src/model/cuda, on the cuda device's internals
#endif
#if defined(ASYNCINFER_HAVE_TORCH)
    {"torch", "torch", false},  // src/model/torch
#endif
#if defined(ASYNCINFER_HAVE_OPENVINO)
    {"openvino", "openvino", false},  // src/model/openvino
#endif
#if defined(ASYNCINFER_HAVE_PYTHON_BACKEND)
    {"python", "python", false},  // src/model/python
#endif
#endif
  };
  return kinds;
}

std::string_view backend_module_for(std::string_view kind, bool device) {
  for (const ModuleKind& k : backend_module_kinds()) {
    if (k.kind == kind && k.device == device) return k.module;
  }
  return {};
}

std::vector<std::string> list_backends(std::vector<std::string> registered, std::size_t builtin,
                                       bool device) {
  builtin = std::min(builtin, registered.size());
  std::vector<std::string> names(registered.begin(),
                                 registered.begin() + static_cast<std::ptrdiff_t>(builtin));
  for (const ModuleKind& k : backend_module_kinds()) {
    if (k.device == device) names.emplace_back(k.kind);
  }
  for (std::size_t i = builtin; i < registered.size(); ++i) {
    if (backend_module_for(registered[i], device).empty()) names.push_back(registered[i]);
  }
  return names;
}

std::filesystem::path backend_module_directory() {
  if (const char* dir = std::getenv("ASYNCINFER_BACKEND_DIRECTORY"); dir != nullptr && *dir) {
    return dir;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&backend_module_directory), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "asyncinfer/backends";
  }
  return std::filesystem::path(info.dli_fname).parent_path() / "asyncinfer" / "backends";
}

Status load_backend_module(std::string_view module) {
  static std::mutex mu;
  static std::map<std::string, Status, std::less<>> loaded;  // never shrinks: modules stay
  std::lock_guard lock(mu);
  if (auto it = loaded.find(module); it != loaded.end()) return it->second;
  const std::filesystem::path file =
      backend_module_directory() / ("libasyncinfer_" + std::string(module) + ".so");
  Status status;
  // RTLD_LOCAL: the module's toolkit (libtorch, OpenVINO) stays out of the global namespace;
  // RTLD_NOW: a module that cannot resolve a symbol fails here, not in the middle of a request.
  if (void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL); handle == nullptr) {
    const char* why = dlerror();
    status = unavailable_error("the " + std::string(module) + " backend module " + file.string() +
                               " did not load: " + (why != nullptr ? why : "unknown reason") +
                               " (it is built beside libasyncinfer, in asyncinfer/backends/; "
                               "ASYNCINFER_BACKEND_DIRECTORY names another folder)");
  } else if (auto* entry = reinterpret_cast<decltype(&asyncinfer_backend_module_v1)>(
                 dlsym(handle, "asyncinfer_backend_module_v1"));
             entry == nullptr) {
    status = unavailable_error("the " + std::string(module) + " backend module " + file.string() +
                               " has no entry point asyncinfer_backend_module_v1: it was not "
                               "built by this asyncinfer");
  } else {
    entry(DeviceBackendRegistry::instance(), ModelBackendRegistry::instance());
  }
  loaded.emplace(std::string(module), status);
  return status;
}

}  // namespace asyncinfer::detail
