// cuda_stream_state.hpp (internal) — the part of a cuda stream that its CUDA callbacks and its host
// worker share: the pending error and the "settle items" the stream keeps alive until it has
// passed them.
//
// Errors in stream order (device.hpp). Each stream keeps a host-side pending error (the first
// failure since the last host function): a host_fn's non-ok return or exception, a spin kernel
// cut short by its stop token (cancelled), and errors inherited through events. Host functions
// and the other stream-ordered callbacks (cuda_stream.cpp) "settle" the work before them: they
// look at the cancellation flags of the spin kernels that precede them and release what the
// stream kept alive (stop callbacks, flag slots, copied tensors). launch_host_func delivers and
// clears the error. To let events carry errors cheaply, a recorded point gets a status snapshot
// only on streams where errors are possible: once a stream has run any Kernel (a host_fn can
// fail, a spin kernel can be cancelled) or waited on a point that can carry an error, each
// record() enqueues one extra host function before cudaEventRecord that copies the pending error
// into the point, and each wait() on such a point enqueues one after cudaStreamWaitEvent that
// folds the point's error into the waiting stream's. Streams that only copy between device and
// pinned memory, run cuBLAS, record and wait never pay for a host function (but one per 1024
// copies, to release the tensors they keep). Device-side failures (a faulting kernel, a sticky
// context error) are not seen by host functions, which CUDA may no longer run at all;
// synchronize(), query() and the event waits report them (cudaStreamQuery / cudaEventQuery /
// cudaEventSynchronize).
//
// Thread safety: every member is either const, atomic, or guarded by the state's mutex; nothing
// here calls CUDA, so CUDA callbacks may use all of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "asyncinfer/executor.hpp"
#include "device/cuda/cuda_memory.hpp"

namespace asyncinfer::detail::cuda {

/// What a std::stop_callback on Kernel::stop does: sets the spin kernel's stop flag.
struct SetFlag {
  std::uint32_t* flag;
  void operator()() const noexcept { store_flag(*flag, 1); }
};
using StopFlagCallback = std::stop_callback<SetFlag>;

/// Something the stream keeps until the stream has passed the point where it was enqueued.
struct SettleItem {
  std::uint64_t seq = 0;
  MappedSlot* slot = nullptr;  ///< a cancellable spin kernel's flags
  std::unique_ptr<StopFlagCallback> on_stop;
  std::string kernel_name;
  std::vector<std::shared_ptr<Storage>> keep_alive;
};

/// The part of a stream that its callbacks and host worker use. Held by the CudaStream and by
/// every callback record, so callbacks never touch a destroyed stream; the CudaStream outlives
/// all its callbacks (its destructor drains the stream).
class StreamState {
 public:
  StreamState(std::string stream_name, Executor* host_executor, std::shared_ptr<SlotPool> slot_pool,
              MappedSlot* mapped_words)
      : name(std::move(stream_name)),
        executor(host_executor),
        slots(std::move(slot_pool)),
        words(mapped_words) {}
  ~StreamState() {
    settle(~std::uint64_t{0});
    slots->release(words);
  }
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  const std::string name;
  Executor* const executor;
  std::shared_ptr<SlotPool> slots;
  MappedSlot* const words;  ///< stop = the stream's abort flag; counter = host jobs finished
  std::atomic<bool> closing{false};
  std::stop_source stop;  ///< fires when the stream is destroyed

  /// Records `s` as the pending error unless one is pending already (the first error wins).
  void fold(Status s) {
    if (s.ok()) return;
    std::lock_guard lock(mu_);
    if (pending_.ok()) pending_ = std::move(s);
  }
  /// The pending error, cleared (for a host function).
  Status take() {
    std::lock_guard lock(mu_);
    return std::exchange(pending_, Status());
  }
  /// The pending error, kept.
  Status peek() {
    std::lock_guard lock(mu_);
    return pending_;
  }
  Status aborted() const {
    return aborted_error("stream '" + name + "' was destroyed before reaching this point");
  }

  void add_item(SettleItem item) {
    std::lock_guard lock(mu_);
    items_.push_back(std::move(item));
  }

  /// Processes the items enqueued before sequence number `limit` (the stream has passed them):
  /// a spin kernel that ended early becomes a `cancelled` pending error; stop callbacks are
  /// deregistered, flag slots returned and kept tensors released. Host-only work.
  void settle(std::uint64_t limit) noexcept;

 private:
  std::mutex mu_;
  Status pending_;
  std::deque<SettleItem> items_;
};

}  // namespace asyncinfer::detail::cuda
