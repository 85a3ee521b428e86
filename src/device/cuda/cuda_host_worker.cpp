// The host thread of a cuda stream (cuda_host_worker.hpp).
#include "device/cuda/cuda_host_worker.hpp"

#include <atomic>
#include <exception>

namespace asyncinfer::detail::cuda {

void HostWorker::loop(std::stop_token stop) {
  setup_thread(thread_name_);
  for (;;) {
    HostJob job;
    {
      std::unique_lock lock(mu_);
      // Jobs still queued when stopping are drained (dropped) before the thread ends.
      if (!cv_.wait(lock, stop, [this] { return !jobs_.empty(); })) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (!job.skip && !state_->closing.load(std::memory_order_acquire)) {
      state_->fold(run(job));
    }
    job = HostJob{};  // release what it holds before the stream moves on
    std::atomic_ref<std::uint64_t>(state_->words->counter)
        .store(++finished_, std::memory_order_release);
  }
}

Status HostWorker::run(HostJob& job) {
  std::stop_token closing = state_->stop.get_token();
  try {
    Status s;
    if (job.kernel_stop.stop_possible()) {
      std::stop_source both;
      std::stop_callback on_kernel(job.kernel_stop, [&both] { both.request_stop(); });
      std::stop_callback on_close(closing, [&both] { both.request_stop(); });
      s = job.fn(both.get_token());
    } else {
      s = job.fn(closing);
    }
    return s.ok() || job.what.empty() ? s : s.with_context(job.what);
  } catch (const std::exception& e) {
    return internal_error(job.what + " threw: " + e.what());
  } catch (...) {
    return internal_error(job.what + " threw an unknown exception");
  }
}

}  // namespace asyncinfer::detail::cuda
