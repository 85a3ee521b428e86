// The cpu backend: each stream is one host thread that runs its work in order. Kernels are host
// functions (the model computes on the stream's thread); a kernel's stated duration is spent
// spinning (a CPU-bound kernel) or sleeping. Device memory is host memory (unified).
#include <cstring>

#include "device/backend.hpp"
#include "device/host_stream.hpp"

namespace asyncinfer::detail {
namespace {

class CpuStream final : public HostStream {
 public:
  using HostStream::HostStream;
  ~CpuStream() override { close(); }

 protected:
  Status run_kernel(Kernel& kernel, Clock::time_point /*enqueued_at*/,
                    std::stop_token stop) override {
    if (kernel.duration.count() > 0) {
      const auto end = deadline_after(kernel.duration);  // max(): until stopped
      const bool done = kernel.spin ? spin_until(end, stop) : sleep_until(end, stop);
      if (!done) return cancelled_error("kernel '" + kernel.name + "' stopped before completion");
    }
    return run_host_fn(kernel, std::move(stop));
  }

  Status run_copy(const Tensor& dst, const Tensor& src, CopyKind /*kind*/,
                  Clock::time_point /*enqueued_at*/, std::stop_token /*stop*/) override {
    if (src.byte_size() > 0) std::memmove(dst.data(), src.data(), src.byte_size());
    return Status();
  }
};

class CpuDevice final : public Device, public CallerRunStreams {
 public:
  CpuDevice() : host_pool_(1, "cpu-hostfn") {
    info_.name = "cpu";
    info_.kind = DeviceKind::cpu;
    info_.description = "CPU: each stream is one host thread";
    info_.async = true;
    info_.unified_memory = true;
    info_.cancellable_work = true;
    info_.compute_engines = 1;
    info_.copy_engines = 0;
    info_.capabilities.caller_run_streams = true;          // create_caller_run_stream below
    info_.capabilities.host_funcs_may_call_device = true;  // streams are plain host threads
    info_.capabilities.host_addressable_memory = true;     // device memory is host memory
  }

  const DeviceInfo& info() const noexcept override { return info_; }

  Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options) override {
    return std::unique_ptr<Stream>(make_stream(options, StreamThread::own));
  }

  std::unique_ptr<HostStream> create_caller_run_stream(const StreamOptions& options) override {
    return make_stream(options, StreamThread::caller);
  }

  std::unique_ptr<HostStream> make_stream(const StreamOptions& options, StreamThread thread) {
    std::string name =
        options.name.empty() ? "cpu-s" + std::to_string(next_stream_++) : options.name;
    return std::make_unique<CpuStream>(shared_from_this(), options, std::move(name), thread);
  }

  Result<std::unique_ptr<Event>> create_event(const EventOptions& options) override {
    return std::unique_ptr<Event>(std::make_unique<HostEvent>(this, options.timing));
  }

  Result<std::shared_ptr<Storage>> allocate(std::size_t bytes, MemoryKind kind) override {
    return allocate_host_backed(bytes, kind);
  }

  Executor& host_func_executor() noexcept override { return host_pool_; }

 private:
  DeviceInfo info_;
  ThreadPool host_pool_;
  std::atomic<int> next_stream_{0};
};

Result<std::shared_ptr<Device>> open_cpu_device(std::string_view args) {
  if (!args.empty()) {
    return invalid_argument_error("the cpu device takes no options, got 'cpu:" + std::string(args) +
                                  "'");
  }
  return std::shared_ptr<Device>(std::make_shared<CpuDevice>());
}

}  // namespace

void register_cpu_device_backend(DeviceBackendRegistry& registry) {
  (void)registry.add({"cpu", "cpu", &open_cpu_device});
}

}  // namespace asyncinfer::detail
