// The state a cuda stream shares with its callbacks (cuda_stream_state.hpp).
#include "device/cuda/cuda_stream_state.hpp"

namespace asyncinfer::detail::cuda {

void StreamState::settle(std::uint64_t limit) noexcept {
  std::vector<SettleItem> done;
  {
    std::lock_guard lock(mu_);
    while (!items_.empty() && items_.front().seq < limit) {
      done.push_back(std::move(items_.front()));
      items_.pop_front();
    }
  }
  std::vector<std::shared_ptr<Storage>> last_refs;
  for (SettleItem& item : done) {
    item.on_stop.reset();  // before the slot can be reused by another kernel
    if (item.slot != nullptr) {
      if (load_flag(item.slot->cut) != 0) {
        fold(cancelled_error("kernel '" + item.kernel_name + "' stopped before completion"));
      }
      slots->release(item.slot);
    }
    for (auto& storage : item.keep_alive) {
      // Usually the caller still holds the tensor (device.hpp asks it to) and dropping our
      // reference frees nothing. When ours is the last, the storage's deleter runs: ours only
      // touch host state on a callback thread, but a foreign storage's might call CUDA, so the
      // release goes to the stream's executor instead.
      if (storage && storage.use_count() == 1) last_refs.push_back(std::move(storage));
    }
  }
  done.clear();
  if (last_refs.empty()) return;
  if (!in_cuda_callback()) return;  // released here, on leaving
  Task release([refs = std::move(last_refs)]() mutable { refs.clear(); });
  if (!executor->post(std::move(release))) {
    release();  // NOLINT(bugprone-use-after-move): post() moves only when it accepts
  }
}

}  // namespace asyncinfer::detail::cuda
