// cuda_device.hpp (internal) — device.hpp's Device on one CUDA device: the owner of the
// per-device pools (mapped slots, event cache, memory, waiter streams) and of the default executor
// of host functions, and the factory of streams and events. Backend overview: cuda_device.cpp.
//
// Invariants: streams and events hold the device (shared_ptr), so the device and its pools
// outlive all of them; storages hold the memory core, which may outlive the device.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "asyncinfer/executor.hpp"
#include "device/cuda/cuda_event.hpp"
#include "device/cuda/cuda_memory.hpp"

namespace asyncinfer::detail::cuda {

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, DeviceInfo info, int least_priority, int greatest_priority,
             std::shared_ptr<SlotPool> slots, std::shared_ptr<EventCache> events,
             std::shared_ptr<MemoryCore> memory, std::shared_ptr<WaiterPool> waiters)
      : ordinal_(ordinal),
        info_(std::move(info)),
        least_priority_(least_priority),
        greatest_priority_(greatest_priority),
        slots_(std::move(slots)),
        events_(std::move(events)),
        memory_(std::move(memory)),
        waiters_(std::move(waiters)),
        host_pool_(std::make_unique<ThreadPool>(1, "cuda" + std::to_string(ordinal) + "-hostfn")) {}

  ~CudaDevice() override;

  const DeviceInfo& info() const noexcept override { return info_; }

  Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options) override;

  Result<std::unique_ptr<Event>> create_event(const EventOptions& options) override {
    auto self = std::static_pointer_cast<CudaDevice>(shared_from_this());
    return std::unique_ptr<Event>(std::make_unique<CudaEvent>(std::move(self), options.timing));
  }

  Result<std::shared_ptr<Storage>> allocate(std::size_t bytes, MemoryKind kind) override {
    switch (kind) {
      case MemoryKind::host:
        return Storage::allocate_host(bytes);
      case MemoryKind::pinned_host:
        return memory_->allocate_pinned(bytes);
      case MemoryKind::device:
        return memory_->allocate_device(bytes);
    }
    return invalid_argument_error("allocate: unknown memory kind");
  }

  Executor& host_func_executor() noexcept override { return *host_pool_; }

  int ordinal() const noexcept { return ordinal_; }
  const std::shared_ptr<SlotPool>& slots() const noexcept { return slots_; }
  const std::shared_ptr<EventCache>& events() const noexcept { return events_; }
  const std::shared_ptr<MemoryCore>& memory() const noexcept { return memory_; }
  const std::shared_ptr<WaiterPool>& waiters() const noexcept { return waiters_; }

 private:
  const int ordinal_;
  const DeviceInfo info_;
  const int least_priority_;
  const int greatest_priority_;
  std::shared_ptr<SlotPool> slots_;
  std::shared_ptr<EventCache> events_;
  std::shared_ptr<MemoryCore> memory_;
  std::shared_ptr<WaiterPool> waiters_;
  std::unique_ptr<ThreadPool> host_pool_;
  std::atomic<int> next_stream_{0};
};

}  // namespace asyncinfer::detail::cuda
