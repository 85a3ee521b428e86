// backend_modules.hpp (internal) — optional backends built as their own shared modules, loaded the
// first time a model or a device needs one, as Triton loads backends/<name>/libtriton_<name>.so.
//
// With ASYNCINFER_BACKEND_MODULES (the default for a shared libasyncinfer), each optional backend
// (cuda: the cuda device and builtin:gemm; torch; openvino; python) is the module
// libasyncinfer_<module>.so in backend_module_directory(), linked against libasyncinfer and
// against its own toolkit (libtorch, OpenVINO, the CUDA runtime). A process that never asks for
// such a kind never maps the toolkit: `asyncinfer --help`, `import asyncinfer` and a server whose
// repository holds Python models only load none of them. Without modules (a static libasyncinfer,
// or -DASYNCINFER_BACKEND_MODULES=OFF) the backends are folded into the library as before and
// register with the built-in ones (src/backends.cpp).
//
// A module exports one C function, asyncinfer_backend_module_v1 (declared below), that registers
// its backends in the two registries it is given; cmake's asyncinfer_add_backend writes it from the
// backend's register_<name>_*_backend functions, so a backend's own code is the same either way.
// Modules are never unloaded.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer::detail {

class DeviceBackendRegistry;
class ModelBackendRegistry;

/// One kind an optional backend module serves.
struct ModuleKind {
  std::string_view module;  ///< "torch": the file libasyncinfer_torch.so
  std::string_view kind;    ///< a device backend's name ("cuda") or a model kind ("torch")
  bool device = false;      ///< true: a device backend; false: a model kind
};

/// The kinds this library's modules serve (src/backends.cpp); empty without modules.
const std::vector<ModuleKind>& backend_module_kinds();

/// The module serving the device backend or model kind `kind`; "" when no module does.
std::string_view backend_module_for(std::string_view kind, bool device);

/// What device_backends() and model_backends() list: the first `builtin` of `registered` (the
/// registry's own, in registration order), then every kind this build's modules serve, loaded or
/// not, in backends.cpp's order, then the rest of `registered` (what applications added).
std::vector<std::string> list_backends(std::vector<std::string> registered, std::size_t builtin,
                                       bool device);

/// Where the modules are: $ASYNCINFER_BACKEND_DIRECTORY when set, else the folder
/// asyncinfer/backends beside libasyncinfer itself (the build tree and an install alike).
std::filesystem::path backend_module_directory();

/// Loads `module` and registers its backends, once per process; later calls return the first
/// call's status. unavailable when the file is missing or does not load (the loader's own words)
/// or has no entry point. Thread-safe: concurrent callers wait for the one that loads.
Status load_backend_module(std::string_view module);

}  // namespace asyncinfer::detail

/// The entry point every backend module defines (C linkage, so that dlsym finds it by this name).
extern "C" void asyncinfer_backend_module_v1(asyncinfer::detail::DeviceBackendRegistry& devices,
                                             asyncinfer::detail::ModelBackendRegistry& models);
