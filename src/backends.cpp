// The backends built into this library: one registration call per backend, each defined in the
// backend's own folder. Adding a backend adds its line here (under its ASYNCINFER_HAVE_* define
// when it is optional) and nothing elsewhere outside its folder and its CMake target.
//
// An explicit list, not static objects that register themselves: the optional backends are object
// libraries folded into libasyncinfer, which may be a static library, and a linker keeps an object
// from a static library only when something references it — a self-registering object nobody
// names would silently vanish. This file is referenced by the registries (their first use calls
// the functions below), so every backend it names is linked, and the order here is the order
// device_backends() and model_backends() list them in.
#include "device/backend.hpp"
#include "model/backend.hpp"

namespace asyncinfer::detail {

// Each is defined in its backend's folder (src/device/<name>/, src/model/<name>/).
void register_cpu_device_backend(DeviceBackendRegistry& registry);
void register_sim_device_backend(DeviceBackendRegistry& registry);
#if defined(ASYNCINFER_HAVE_CUDA)
void register_cuda_device_backend(DeviceBackendRegistry& registry);
#endif

void register_builtin_model_backend(ModelBackendRegistry& registry);
#if defined(ASYNCINFER_HAVE_CUDA)
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

void register_builtin_device_backends(DeviceBackendRegistry& registry) {
  register_cpu_device_backend(registry);
  register_sim_device_backend(registry);
#if defined(ASYNCINFER_HAVE_CUDA)
  register_cuda_device_backend(registry);
#endif
}

void register_builtin_model_backends(ModelBackendRegistry& registry) {
  register_builtin_model_backend(registry);  // builtin:identity, fixed_cost, faulty, stream
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
}

}  // namespace asyncinfer::detail
