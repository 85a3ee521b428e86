// The device backend registry, the parts of device.hpp shared by every backend, and the event pool.
#include <algorithm>
#include <deque>
#include <mutex>

#include "asyncinfer/detail/enum_names.hpp"
#include "backend_modules.hpp"
#include "device/backend.hpp"
#include "device/host_stream.hpp"

namespace asyncinfer {

namespace {
constexpr detail::EnumNames<DeviceKind, 4> kDeviceKindNames{{"cpu", "sim", "cuda", "npu"}};
constexpr detail::EnumNames<CopyKind, 4> kCopyKindNames{
    {"host_to_host", "host_to_device", "device_to_host", "device_to_device"}};
}  // namespace

std::string_view to_string(DeviceKind kind) noexcept { return kDeviceKindNames.name(kind); }

std::string_view to_string(CopyKind kind) noexcept { return kCopyKindNames.name(kind); }

Result<Tensor> Device::empty(DType dtype, Shape shape, MemoryKind kind) {
  if (dtype == DType::bytes) {
    return invalid_argument_error(
        "Device::empty: a bytes tensor's size is not given by its shape " + shape_to_string(shape) +
        "; use empty_like");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t bytes, checked_byte_size(dtype, shape));
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, allocate(bytes, kind));
  return Tensor::from_storage(std::move(storage), dtype, std::move(shape));
}

Result<Tensor> Device::empty_like(const Tensor& like, MemoryKind kind) {
  if (!like.defined()) return invalid_argument_error("Device::empty_like: undefined tensor");
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, allocate(like.byte_size(), kind));
  return Tensor::from_storage_sized(std::move(storage), like.dtype(), like.shape(), 0,
                                    like.byte_size());
}

namespace detail {

DeviceBackendRegistry& DeviceBackendRegistry::instance() {
  static DeviceBackendRegistry* const registry = [] {
    auto* r = new DeviceBackendRegistry();  // never destroyed: open_device may run at exit
    register_builtin_device_backends(*r);
    r->builtin_ = r->snapshot().size();
    return r;
  }();
  return *registry;
}

Status DeviceBackendRegistry::add(DeviceBackend backend) {
  if (backend.name.empty() || backend.name.find(':') != std::string::npos) {
    return invalid_argument_error("device backend name '" + backend.name +
                                  "': must be non-empty and without ':'");
  }
  if (!backend.open) {
    return invalid_argument_error("device backend '" + backend.name + "': no opener");
  }
  return backends_.add(std::move(backend), "device backend");
}

std::vector<DeviceBackend> DeviceBackendRegistry::snapshot() const { return backends_.snapshot(); }

std::unique_ptr<HostStream> create_caller_run_stream(Device& device, const StreamOptions& options) {
  if (!device.capabilities().caller_run_streams) return nullptr;
  auto* source = dynamic_cast<CallerRunStreams*>(&device);
  return source == nullptr ? nullptr : source->create_caller_run_stream(options);
}

CopyKind copy_kind(const Tensor& dst, const Tensor& src) noexcept {
  const bool d = dst.placement().kind == MemoryKind::device;
  const bool s = src.placement().kind == MemoryKind::device;
  if (d && s) return CopyKind::device_to_device;
  if (d) return CopyKind::host_to_device;
  if (s) return CopyKind::device_to_host;
  return CopyKind::host_to_host;
}

Status check_copy(const Tensor& dst, const Tensor& src) {
  if (!dst.defined() || !src.defined()) {
    return invalid_argument_error("copy: source and destination must be defined tensors");
  }
  if (dst.byte_size() != src.byte_size()) {
    return invalid_argument_error("copy: destination " + dst.describe() + " (" +
                                  std::to_string(dst.byte_size()) + " bytes) and source " +
                                  src.describe() + " (" + std::to_string(src.byte_size()) +
                                  " bytes) differ in size");
  }
  return Status();
}

}  // namespace detail

std::vector<std::string> device_backends() {
  const auto& registry = detail::DeviceBackendRegistry::instance();
  std::vector<std::string> names;
  for (const auto& b : registry.snapshot()) names.push_back(b.name);
  return detail::list_backends(std::move(names), registry.builtin_count(), /*device=*/true);
}

Status register_device_backend(std::string name, std::string usage, DeviceOpener open) {
  return detail::DeviceBackendRegistry::instance().add(
      {std::move(name), std::move(usage), std::move(open)});
}

Result<std::shared_ptr<Device>> open_device(std::string_view spec) {
  const std::size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  const std::string_view args = colon == std::string_view::npos ? "" : spec.substr(colon + 1);
  std::vector<detail::DeviceBackend> backends =
      detail::DeviceBackendRegistry::instance().snapshot();
  // The module that serves `name`, loaded the first time it is asked for (backend_modules.hpp).
  if (const std::string_view module = detail::backend_module_for(name, /*device=*/true);
      !module.empty() && std::none_of(backends.begin(), backends.end(),
                                      [&](const auto& b) { return b.name == name; })) {
    if (Status s = detail::load_backend_module(module); !s.ok()) {
      return unavailable_error("device '" + std::string(spec) + "' needs " +
                               std::string(s.message()));
    }
    backends = detail::DeviceBackendRegistry::instance().snapshot();
  }
  std::string built;
  for (const auto& b : backends) {
    built += (built.empty() ? "" : ", ") + b.name;
  }
  for (const auto& b : backends) {
    if (b.name == name) {
      auto r = b.open(args);
      if (!r.ok()) return r.status().with_context("open_device(\"" + std::string(spec) + "\")");
      return r;
    }
  }
  if (name == "cuda") {
    return unavailable_error(
        "device '" + std::string(spec) +
        "': the cuda backend was not built into this library (built: " + built +
        "); rebuild with -DASYNCINFER_WITH_CUDA=ON where the CUDA "
        "toolkit is installed");
  }
  if (name == "npu") {
    return unavailable_error(
        "device '" + std::string(spec) +
        "': the Ascend (npu) backend is not built: it needs the CANN toolkit, which is not "
        "installed on this machine (built: " +
        built + "; docs/backends.md maps the interface onto AscendCL)");
  }
  std::string usage;
  for (const auto& b : backends) {
    usage += (usage.empty() ? "" : "; ") + b.usage;
  }
  return invalid_argument_error("unknown device '" + std::string(spec) + "': expected " + usage);
}

// ---- EventPool -------------------------------------------------------------------------------

struct PooledEvent::Shared {
  std::shared_ptr<Device> device;
  EventOptions options;
  std::size_t capacity = 0;
  std::mutex mu;
  std::size_t created = 0;
  std::vector<std::unique_ptr<Event>> free;
  std::deque<std::unique_ptr<Event>> retiring;  // returned, maybe still pending

  // Moves every retiring event that is safe to reuse to the free list. Called under mu.
  void recycle() {
    for (auto it = retiring.begin(); it != retiring.end();) {
      if ((*it)->pending_waits() == 0 && (*it)->query()) {
        free.push_back(std::move(*it));
        it = retiring.erase(it);
      } else {
        ++it;
      }
    }
  }
};

PooledEvent& PooledEvent::operator=(PooledEvent&& other) noexcept {
  if (this != &other) {
    PooledEvent dying(std::move(*this));
    pool_ = std::move(other.pool_);
    event_ = std::move(other.event_);
  }
  return *this;
}

PooledEvent::~PooledEvent() {
  if (pool_ && event_) {
    std::lock_guard lock(pool_->mu);
    pool_->retiring.push_back(std::move(event_));
  }
}

EventPool::EventPool(std::shared_ptr<Device> device, EventOptions options, std::size_t capacity)
    : shared_(std::make_shared<PooledEvent::Shared>()) {
  shared_->device = std::move(device);
  shared_->options = options;
  shared_->capacity = capacity;
}

EventPool::~EventPool() = default;

Result<PooledEvent> EventPool::acquire() {
  std::unique_lock lock(shared_->mu);
  shared_->recycle();
  if (!shared_->free.empty()) {
    std::unique_ptr<Event> e = std::move(shared_->free.back());
    shared_->free.pop_back();
    return PooledEvent(shared_, std::move(e));
  }
  if (shared_->created >= shared_->capacity) {
    return resource_exhausted_error(
        "event pool exhausted: all " + std::to_string(shared_->capacity) +
        " events are on loan or still awaiting completion or a pending stream wait");
  }
  ++shared_->created;
  lock.unlock();
  auto e = shared_->device->create_event(shared_->options);
  if (!e.ok()) {
    std::lock_guard relock(shared_->mu);
    --shared_->created;
    return e.status();
  }
  return PooledEvent(shared_, std::move(*e));
}

std::size_t EventPool::created() const {
  std::lock_guard lock(shared_->mu);
  return shared_->created;
}

std::size_t EventPool::available() const {
  std::lock_guard lock(shared_->mu);
  shared_->recycle();
  return shared_->free.size() + (shared_->capacity - shared_->created);
}

}  // namespace asyncinfer
