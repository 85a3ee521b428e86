// cuda_stream.hpp (internal) — device.hpp's Stream on a CUDA stream.
//
// Mapping (CUDA Runtime API reference, "Stream Management"): a non-blocking cudaStream_t
// (cudaStreamCreateWithPriority); kernels are a spin kernel and/or a host function run by the
// stream's HostWorker (cuda_host_worker.hpp); copies are cudaMemcpyAsync, with pageable host
// memory staged through pinned buffers by the host worker in stream order; record/wait are
// cudaEventRecord / cudaStreamWaitEvent on a new Point per record (cuda_event.hpp);
// launch_host_func is cudaLaunchHostFunc, whose callback only settles the stream's items, takes
// its pending error and posts the HostFunc to the stream's executor (or runs it right there when
// the executor has shut down). Every callback the stream enqueues is one CudaCallback record
// (cuda_common.hpp) built by one of the step functions in cuda_stream.cpp; each settles the items
// enqueued before it (its sequence number) and then does its one job.
//
// Destroying a stream (device.hpp; CUDA itself would let the work finish): it refuses new work,
// fires the stop token of a running host_fn, sets the stream's abort flag so its spin and
// host-wait kernels end at once, drops kernels' host functions and host-side copy steps not yet
// started, then waits until the stream has drained: DMA copies and cuBLAS calls already enqueued
// finish, every pending host function runs once with `aborted`, and points recorded after work
// that can fail complete carrying `aborted` (points on streams that only copy complete ok).
// The wait blocks the destroying thread; it cannot end early while the stream waits on an event
// of another stream that never completes (a cudaStreamWaitEvent cannot be cancelled), and it
// deadlocks if called from one of the stream's own kernel host functions.
//
// Thread safety: as device.hpp. A stream's enqueue calls are serialised by a mutex (several CUDA
// calls make up one operation); the stream-ordered callbacks share only mutex-protected state
// (StreamState).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "device/cuda/cuda_event.hpp"
#include "device/cuda/cuda_host_worker.hpp"
#include "device/cuda/cuda_stream_state.hpp"

namespace asyncinfer::detail::cuda {

class CudaDevice;

class CudaStream final : public Stream {
 public:
  CudaStream(std::shared_ptr<CudaDevice> device, cudaStream_t stream, int priority,
             std::shared_ptr<StreamState> state);
  ~CudaStream() override;

  Status enqueue(Kernel kernel) override;
  Status copy(const Tensor& dst, const Tensor& src) override;
  Status record(Event& event) override;
  Status wait(Event& event) override;
  Status launch_host_func(HostFunc fn) override;
  Status synchronize() override { return synchronize_until(Clock::time_point::max(), {}); }
  Status synchronize_for(nanoseconds timeout) override {
    return synchronize_until(deadline_after(timeout), timeout);
  }
  bool query() override;
  int priority() const noexcept override { return priority_; }
  void* native_handle() noexcept override { return stream_; }
  Device& device() noexcept override;

 private:
  Status closing_error() const {
    return failed_precondition_error("stream '" + state_->name + "' is closing");
  }
  Status synchronize_until(Clock::time_point deadline, nanoseconds timeout);
  /// Enqueues a marker callback and waits for it (mu_ not held).
  Status await_marker(Clock::time_point deadline, const std::string& what, bool internal);
  /// Trigger callback + host-wait kernel for `job` (mu_ held).
  Status enqueue_host_job(HostJob job, MappedSlot* own_slot);
  /// Sequence number for a callback; a callback settles every item before it (mu_ held).
  std::uint64_t callback_seq() {
    items_since_callback_ = 0;
    return seq_++;
  }
  /// Sequence number for a settle item (mu_ held).
  std::uint64_t item_seq() {
    ++items_since_callback_;
    return seq_++;
  }
  /// Enqueues a settle-only callback after kMaxSettleItems items without any callback (mu_ held).
  void bound_settle_items();
  int ordinal() const noexcept;

  std::shared_ptr<CudaDevice> device_;
  cudaStream_t stream_;
  const int priority_;
  std::shared_ptr<StreamState> state_;

  std::mutex mu_;  // serialises enqueues; guards the fields below
  bool closing_ = false;
  bool errorable_ = false;  // see the header comment: points get a status snapshot
  std::uint64_t seq_ = 0;
  std::size_t items_since_callback_ = 0;
  std::uint64_t host_jobs_ = 0;
  std::shared_ptr<HostWorker> worker_;
};

}  // namespace asyncinfer::detail::cuda
