// backend.hpp (internal) — what a device backend author implements and how it registers.
//
// Users include <asyncinfer/device.hpp>; backends include this. A backend implements Device,
// Stream and Event (device.hpp), reports its DeviceCapabilities in its DeviceInfo (the engine and
// the model backends drive a device by those, never by its kind), and registers itself: its own
// folder defines a `void register_<name>_device_backend(DeviceBackendRegistry&)` that adds its
// opener(s), and src/backends.cpp calls it — one line, under the build's ASYNCINFER_HAVE_* define
// when the backend is optional. Adding a backend touches its own folder, that line and its
// CMake target, never the engine, the pipeline, the models or this header.
//
// Why an explicit list rather than static self-registering objects: the optional backends are
// object libraries folded into libasyncinfer, which may be built static; a static registrar in a
// .cpp that nothing references is dropped by the linker from a static library, and the order in
// which such objects run is unspecified. src/backends.cpp is referenced by the registry itself
// (the first use of the registry calls register_builtin_device_backends), so every backend built
// is linked and registered, in the order that file lists, before anything can look one up.
// Applications add their own at run time with register_device_backend (device.hpp).
//
// Host-thread backends (cpu, sim) reuse HostStream/HostEvent (host_stream.hpp), which implement
// the whole stream contract on one host thread per stream and leave only "run this kernel" and
// "run this copy" to the backend.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncinfer/device.hpp"
#include "core/backend_list.hpp"

namespace asyncinfer::detail {

class HostStream;

struct DeviceBackend {
  std::string name;   ///< "cpu", "sim", "cuda"
  std::string usage;  ///< spec forms for error messages: "cuda or cuda:<index>"
  DeviceOpener open;
};

/// The device backends open_device knows. The built-in ones are registered on first use
/// (register_builtin_device_backends); applications add theirs with register_device_backend.
/// Thread-safe: add() and snapshot() take a short lock; nothing is ever removed.
class DeviceBackendRegistry {
 public:
  /// The process's registry, with the built-in backends registered.
  static DeviceBackendRegistry& instance();

  /// invalid_argument for an empty name, a name with ':' or an empty opener; already_exists
  /// when the name is taken.
  Status add(DeviceBackend backend);
  /// A copy of the entries, in registration order (openers are called without the lock held).
  std::vector<DeviceBackend> snapshot() const;
  /// How many of the first entries are this build's own (registered by instance()); what
  /// applications add, and the backend modules that load later, come after them.
  std::size_t builtin_count() const noexcept { return builtin_; }

 private:
  DeviceBackendRegistry() = default;
  BackendList<DeviceBackend, &DeviceBackend::name> backends_;
  std::size_t builtin_ = 0;  // how many instance() registered before returning it
};

/// Registers every device backend this build has (src/backends.cpp: one call per backend, each
/// defined in the backend's own folder). Called once, by DeviceBackendRegistry::instance().
void register_builtin_device_backends(DeviceBackendRegistry& registry);

/// What a device with DeviceCapabilities::caller_run_streams implements (besides Device): a
/// stream with no thread of its own (caller-run mode, host_stream.hpp) whose work runs when the
/// owner calls run_pending(). Thread-safe like Device::create_stream.
class CallerRunStreams {
 public:
  virtual std::unique_ptr<HostStream> create_caller_run_stream(const StreamOptions& options) = 0;

 protected:
  ~CallerRunStreams() = default;
};

/// A caller-run stream of `device`: null unless the device reports
/// capabilities().caller_run_streams and implements CallerRunStreams. Used by the engine's inline
/// path (Worker::make_stream_and_instance).
std::unique_ptr<HostStream> create_caller_run_stream(Device& device, const StreamOptions& options);

/// Direction of a copy between two tensors' placements.
CopyKind copy_kind(const Tensor& dst, const Tensor& src) noexcept;
/// invalid_argument unless both are defined with equal byte sizes.
Status check_copy(const Tensor& dst, const Tensor& src);

/// The checks every backend's Event::elapsed_us_since makes before it reads a clock: `start` is an
/// `E` too (the same backend), both events were created with timing, and both were recorded.
/// Returns the two recorded points, start's first (`E::current()`: null when never recorded), or
/// invalid_argument / failed_precondition saying which check failed.
template <class E>
auto recorded_points(const E& end, Event& start)
    -> Result<std::pair<decltype(end.current()), decltype(end.current())>> {
  const auto* s = dynamic_cast<const E*>(&start);
  if (s == nullptr) {
    return invalid_argument_error("elapsed_time_us: the two events belong to different backends");
  }
  if (!end.timing_enabled() || !s->timing_enabled()) {
    return failed_precondition_error(
        "elapsed_time_us: timing is disabled on an event (create it with EventOptions{.timing = "
        "true})");
  }
  auto a = s->current();
  auto b = end.current();
  if (!a || !b) return failed_precondition_error("elapsed_time_us: an event was never recorded");
  return std::pair{std::move(a), std::move(b)};
}

}  // namespace asyncinfer::detail
