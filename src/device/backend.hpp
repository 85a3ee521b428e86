// backend.hpp (internal) — what a device backend author implements and how it registers.
//
// Users include <asyncinfer/device.hpp>; backends include this. A backend implements Device,
// Stream and Event (device.hpp) and registers an opener under its name. Adding a backend touches
// this registry only — never the engine, the pipeline or the models.
//
// Host-thread backends (cpu, sim) reuse HostStream/HostEvent (host_stream.hpp), which implement
// the whole stream contract on one host thread per stream and leave only "run this kernel" and
// "run this copy" to the backend.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/device.hpp"

namespace asyncinfer::detail {

class HostStream;

/// Opens a device of this backend; `args` is what followed "name:" in the spec ("" if none).
using DeviceOpener = Result<std::shared_ptr<Device>> (*)(std::string_view args);

struct DeviceBackend {
  std::string name;   ///< "cpu", "sim", "cuda"
  std::string usage;  ///< spec forms for error messages: "cuda or cuda:<index>"
  DeviceOpener open = nullptr;
};

/// The backends built into this library, in registration order.
const std::vector<DeviceBackend>& device_backend_registry();

/// Backends of this library (declared here, defined in each backend's directory).
Result<std::shared_ptr<Device>> open_cpu_device(std::string_view args);
Result<std::shared_ptr<Device>> open_sim_device(std::string_view args);
/// A stream of the built-in cpu device with no thread of its own (caller-run mode,
/// host_stream.hpp): its work runs when the owner calls run_pending(). Null when `device` is not
/// the built-in cpu device. Used by the engine's inline path
/// (EngineCore::make_stream_and_instance).
std::unique_ptr<HostStream> create_caller_run_stream(Device& device, const StreamOptions& options);
#if defined(ASYNCINFER_HAVE_CUDA)
Result<std::shared_ptr<Device>> open_cuda_device(std::string_view args);
#endif

/// Direction of a copy between two tensors' placements.
CopyKind copy_kind(const Tensor& dst, const Tensor& src) noexcept;
/// invalid_argument unless both are defined with equal byte sizes.
Status check_copy(const Tensor& dst, const Tensor& src);

}  // namespace asyncinfer::detail
