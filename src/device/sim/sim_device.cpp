// The sim backend: a simulated accelerator, for machines without one.
//
// The device has `compute_engines` compute engines and one or two copy engines (host->device and
// device->host; one engine serves both when copy_engines=1). Each stream is a host thread that
// feeds its work, in stream order, to the engines: a kernel occupies a compute engine for its
// stated duration (plus launch_overhead_us); a copy occupies a copy engine for
// copy_latency_us + bytes / copy_bytes_per_us (device-to-device copies use a compute engine at
// d2d_bytes_per_us). Items on different engines overlap, as on a real NPU or GPU. Occupancy is a
// timed sleep: no host CPU is burned, so a 2-core machine can show and test overlap exactly.
//
// Timeline: each stream keeps an ideal simulated clock (`ready_at_`): an item starts at the
// latest of when it was enqueued, when the previous item of its stream ended, and when its
// engine became free. The stream thread sleeps until that ideal end, so the few microseconds a
// thread takes to wake never accumulate into simulated time. Host functions of kernels run for
// real on the stream thread after the occupancy, in real time (they end no earlier than they
// really ended).
// Which engine an item takes is chosen best fit (engine_timeline.hpp), so that a stream thread
// that wakes late does not find its engine taken by one that ran ahead; stream priorities are
// recorded only.
//
// Memory: "device" memory is host memory labelled as device memory (still host-accessible, so
// the simulated kernels can compute real results). Documented as simulated in docs/backends.md.
#include <algorithm>
#include <cstring>

#include "core/params.hpp"
#include "device/host_stream.hpp"
#include "device/sim/engine_timeline.hpp"

namespace asyncinfer::detail {
namespace {

using std::chrono::duration_cast;
using std::chrono::nanoseconds;

struct SimConfig {
  int compute_engines = 1;
  int copy_engines = 2;
  double copy_bytes_per_us = 12000.0;  // 12 GB/s, a PCIe 4.0 x16 link in practice
  double d2d_bytes_per_us = 1.0e6;     // 1 TB/s device memory
  double copy_latency_us = 1.0;
  double launch_overhead_us = 0.0;
};

enum class EngineClass { compute, h2d, d2h };

struct Reservation {
  EngineClass cls;
  EngineSlot slot;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimConfig cfg)
      : cfg_(cfg),
        compute_(static_cast<std::size_t>(cfg.compute_engines)),
        h2d_(1),
        d2h_(1),
        host_pool_(1, "sim-hostfn") {
    info_.name = "sim";
    info_.kind = DeviceKind::sim;
    info_.description = "simulated accelerator: " + std::to_string(cfg.compute_engines) +
                        " compute engine(s), " + std::to_string(cfg.copy_engines) +
                        " copy engine(s), " + std::to_string(cfg.copy_bytes_per_us) +
                        " bytes/us copies";
    info_.async = true;
    info_.simulated = true;
    info_.unified_memory = false;
    info_.cancellable_work = true;
    info_.compute_engines = cfg.compute_engines;
    info_.copy_engines = cfg.copy_engines;
    // No caller-run streams: a stream's occupancy of the simulated engines is timed on its own
    // thread. Its streams are host threads, and its device memory is host memory.
    info_.capabilities.host_funcs_may_call_device = true;
    info_.capabilities.host_addressable_memory = true;
  }

  const DeviceInfo& info() const noexcept override { return info_; }
  const SimConfig& config() const noexcept { return cfg_; }

  Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options) override;

  Result<std::unique_ptr<Event>> create_event(const EventOptions& options) override {
    return std::unique_ptr<Event>(std::make_unique<HostEvent>(this, options.timing));
  }

  Result<std::shared_ptr<Storage>> allocate(std::size_t bytes, MemoryKind kind) override {
    return allocate_host_backed(bytes, kind);
  }

  Executor& host_func_executor() noexcept override { return host_pool_; }

  /// Reserves an engine of `cls` from `earliest` (or the first moment one is free) for
  /// `duration`.
  Reservation reserve(EngineClass cls, Clock::time_point earliest, nanoseconds duration) {
    std::lock_guard lock(mu_);
    return {cls, engines(cls).reserve(earliest, duration)};
  }

  /// Gives back the unused end of a reservation cut short at `at` (when nothing was reserved on
  /// that engine after it).
  void release_early(const Reservation& r, Clock::time_point at) {
    std::lock_guard lock(mu_);
    engines(r.cls).release_early(r.slot, at);
  }

 private:
  SimConfig cfg_;
  DeviceInfo info_;
  // One copy engine per direction, or one engine (h2d_) for both when copy_engines=1.
  EngineTimeline& engines(EngineClass cls) {
    if (cls == EngineClass::compute) return compute_;
    return cls == EngineClass::d2h && cfg_.copy_engines >= 2 ? d2h_ : h2d_;
  }

  std::mutex mu_;
  EngineTimeline compute_;
  EngineTimeline h2d_;
  EngineTimeline d2h_;
  ThreadPool host_pool_;
  std::atomic<int> next_stream_{0};
};

nanoseconds from_us(double us) {
  return saturating_cast<nanoseconds>(std::chrono::duration<double, std::micro>(us));
}

class SimStream final : public HostStream {
 public:
  SimStream(std::shared_ptr<Device> device, const StreamOptions& options, std::string name)
      : HostStream(device, options, std::move(name)), sim_(static_cast<SimDevice&>(*device)) {}
  ~SimStream() override { close(); }

 protected:
  Status run_kernel(Kernel& kernel, Clock::time_point enqueued_at, std::stop_token stop) override {
    // duration::max() occupies the engine until the kernel is stopped.
    const nanoseconds occupancy =
        saturating_sum(kernel.duration, from_us(sim_.config().launch_overhead_us));
    ASYNCINFER_RETURN_IF_ERROR(
        occupy(EngineClass::compute, enqueued_at, occupancy, stop, "kernel '" + kernel.name + "'"));
    return timed_host_fn(kernel, stop);
  }

  Status run_copy(const Tensor& dst, const Tensor& src, CopyKind kind,
                  Clock::time_point enqueued_at, std::stop_token stop) override {
    const auto& cfg = sim_.config();
    const double bytes = static_cast<double>(src.byte_size());
    if (kind == CopyKind::host_to_host) {
      ready_at_ = std::max(ready_at_, enqueued_at);
    } else if (kind == CopyKind::device_to_device) {
      ASYNCINFER_RETURN_IF_ERROR(occupy(EngineClass::compute, enqueued_at,
                                        from_us(bytes / cfg.d2d_bytes_per_us), stop, "copy"));
    } else {
      const EngineClass cls =
          kind == CopyKind::host_to_device ? EngineClass::h2d : EngineClass::d2h;
      ASYNCINFER_RETURN_IF_ERROR(
          occupy(cls, enqueued_at, from_us(cfg.copy_latency_us + bytes / cfg.copy_bytes_per_us),
                 stop, "copy"));
    }
    if (src.byte_size() > 0) std::memmove(dst.data(), src.data(), src.byte_size());
    return Status();
  }

  Clock::time_point point_time(Clock::time_point enqueued_at) override {
    ready_at_ = std::max(ready_at_, enqueued_at);
    return ready_at_;
  }

  void after_wait(Clock::time_point when) override { ready_at_ = std::max(ready_at_, when); }

 private:
  Status occupy(EngineClass cls, Clock::time_point enqueued_at, nanoseconds duration,
                const std::stop_token& stop, const std::string& what) {
    const Clock::time_point earliest = std::max(enqueued_at, ready_at_);
    if (duration.count() <= 0) {
      ready_at_ = earliest;
      return Status();
    }
    const Reservation r = sim_.reserve(cls, earliest, duration);
    if (!sleep_until(r.slot.end, stop)) {
      const Clock::time_point now = Clock::now();
      sim_.release_early(r, now);
      ready_at_ = std::min(std::max(now, r.slot.start), r.slot.end);
      return cancelled_error(what + " stopped before completion");
    }
    ready_at_ = r.slot.end;
    return Status();
  }

  Status timed_host_fn(Kernel& kernel, std::stop_token stop) {
    if (!kernel.host_fn) return Status();
    // A host function runs in real time: it ends no earlier than its simulated start plus its
    // real duration, and no earlier than the moment it actually ended.
    const Clock::time_point t0 = Clock::now();
    Status s = run_host_fn(kernel, std::move(stop));
    const Clock::time_point t1 = Clock::now();
    ready_at_ = std::max(saturating_add(ready_at_, t1 - t0), t1);
    return s;
  }

  SimDevice& sim_;
  Clock::time_point ready_at_{};  // the stream's ideal simulated clock (stream thread only)
};

Result<std::unique_ptr<Stream>> SimDevice::create_stream(const StreamOptions& options) {
  std::string name = options.name.empty() ? "sim-s" + std::to_string(next_stream_++) : options.name;
  return std::unique_ptr<Stream>(
      std::make_unique<SimStream>(shared_from_this(), options, std::move(name)));
}

Result<std::shared_ptr<Device>> open_sim_device(std::string_view args) {
  ASYNCINFER_ASSIGN_OR_RETURN(Params p, Params::parse(args, ',', "sim device"));
  ASYNCINFER_RETURN_IF_ERROR(
      p.check_known({"compute_engines", "copy_engines", "copy_bytes_per_us", "d2d_bytes_per_us",
                     "copy_latency_us", "launch_overhead_us"}));
  SimConfig cfg;
  ASYNCINFER_ASSIGN_OR_RETURN(auto engines, p.get_int("compute_engines", 1, 1, 64));
  ASYNCINFER_ASSIGN_OR_RETURN(auto copies, p.get_int("copy_engines", 2, 1, 2));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.copy_bytes_per_us,
                              p.get_double("copy_bytes_per_us", cfg.copy_bytes_per_us, 1e-3, 1e12));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.d2d_bytes_per_us,
                              p.get_double("d2d_bytes_per_us", cfg.d2d_bytes_per_us, 1e-3, 1e12));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.copy_latency_us,
                              p.get_double("copy_latency_us", cfg.copy_latency_us, 0, 1e9));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.launch_overhead_us,
                              p.get_double("launch_overhead_us", cfg.launch_overhead_us, 0, 1e9));
  cfg.compute_engines = static_cast<int>(engines);
  cfg.copy_engines = static_cast<int>(copies);
  return std::shared_ptr<Device>(std::make_shared<SimDevice>(cfg));
}

}  // namespace

void register_sim_device_backend(DeviceBackendRegistry& registry) {
  (void)registry.add({"sim",
                      "sim or sim:<key>=<value>,... (keys: compute_engines, copy_engines, "
                      "copy_bytes_per_us, d2d_bytes_per_us, copy_latency_us, launch_overhead_us)",
                      &open_sim_device});
}

}  // namespace asyncinfer::detail
