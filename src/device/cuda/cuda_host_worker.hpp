// cuda_host_worker.hpp (internal) — the host thread of a cuda stream, which runs its kernels'
// host functions and its host-side copy steps in stream order.
//
// Why a thread of the stream's own: CUDA runs a cudaLaunchHostFunc callback on a driver thread
// that it may share between all streams ("host functions without a mandated order ... may be
// serialized"), so a host_fn run there would block the host functions of every other stream
// while it runs (a blocked host_fn would stall unrelated streams). Instead a callback hands the
// job to this worker (HostWorker::post, host-only) and a host-wait kernel
// (launch_host_wait_kernel) holds the stream until the worker has counted the job as finished in
// the stream's mapped counter. Like the cpu backend, a host_fn may compute for real; it must still
// not call CUDA (it could wait on work queued behind itself).
//
// Invariants: jobs run one at a time in the order posted; every job posted is counted exactly
// once, run or dropped (a kernel whose spin was cut short, or any job while the stream closes), so
// the host-wait kernels that wait for the count are always released; a job's error becomes the
// stream's pending error (StreamState::fold).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "device/cuda/cuda_stream_state.hpp"

namespace asyncinfer::detail::cuda {

/// Work for the stream's host worker: a kernel's host_fn or a host-side copy step.
struct HostJob {
  detail::UniqueFunction<Status(std::stop_token)> fn;
  std::string what;  ///< "kernel 'name'" for error messages; empty for copies
  std::stop_token kernel_stop;
  bool skip = false;  ///< the kernel's spin was cut short: do not run (like the cpu backend)
};

/// The stream's host thread. Jobs arrive from CUDA callbacks in stream order; after each, the
/// finished count goes to the stream's mapped counter, which releases the host-wait kernel that
/// holds the stream. While the stream closes, jobs are dropped (counted, not run).
class HostWorker {
 public:
  HostWorker(std::shared_ptr<StreamState> state, std::string thread_name)
      : state_(std::move(state)), thread_name_(std::move(thread_name)) {
    thread_ = std::jthread([this](std::stop_token st) { loop(st); });
  }
  ~HostWorker() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
  }
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  /// From a CUDA callback: host-only.
  void post(HostJob job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop(std::stop_token stop);
  Status run(HostJob& job);

  std::shared_ptr<StreamState> state_;
  std::string thread_name_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<HostJob> jobs_;
  std::uint64_t finished_ = 0;
  std::jthread thread_;
};

}  // namespace asyncinfer::detail::cuda
