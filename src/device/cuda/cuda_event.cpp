// Events of the cuda backend and the waiter streams behind Event::synchronize_for
// (cuda_event.hpp).
#include "device/cuda/cuda_event.hpp"

#include "device/backend.hpp"
#include "device/cuda/cuda_device.hpp"

namespace asyncinfer::detail::cuda {

// ---- EventCache -------------------------------------------------------------------------------

Result<cudaEvent_t> EventCache::take(bool timing) {
  {
    std::lock_guard lock(mu_);
    auto& list = free_[timing ? 1 : 0];
    if (!list.empty()) {
      cudaEvent_t e = list.back();
      list.pop_back();
      return e;
    }
  }
  CudaDeviceGuard guard(ordinal_);
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  cudaEvent_t e = nullptr;
  const unsigned flags = cudaEventBlockingSync | (timing ? 0u : cudaEventDisableTiming);
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
  return e;
}

// ---- WaiterPool -------------------------------------------------------------------------------

Result<cudaStream_t> WaiterPool::acquire() {
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      cudaStream_t s = free_.back();
      free_.pop_back();
      return s;
    }
  }
  cudaStream_t s = nullptr;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::lock_guard lock(mu_);
  all_.push_back(s);
  return s;
}

void WaiterPool::drain() {
  std::vector<cudaStream_t> all;
  {
    std::lock_guard lock(mu_);
    all = all_;
  }
  for (cudaStream_t s : all) (void)cudaStreamSynchronize(s);
}

Result<std::shared_ptr<Completion>> watch_point(Point& point,
                                                const std::shared_ptr<WaiterPool>& waiters) {
  if (auto c = point.completion()) return c;
  CudaDeviceGuard guard(point.ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  ASYNCINFER_ASSIGN_OR_RETURN(cudaStream_t ws, waiters->acquire());
  auto c = std::make_shared<Completion>();
  Status s = ASYNCINFER_CUDA_STATUS(cudaStreamWaitEvent(ws, point.event(), 0));
  if (s.ok()) {
    // The waiter stream is free again once this has run.
    s = launch_callback(ws, [done = c, pool = waiters, ws] {
      pool->give_back(ws);
      done->complete(Status());
    });
  }
  if (!s.ok()) {
    waiters->give_back(ws);  // a wait already enqueued on it only delays its next user
    return s;
  }
  // Two threads may race here; the loser's waiter signals a completion nobody waits for.
  return point.install_completion(std::move(c)).first;
}

// ---- CudaEvent --------------------------------------------------------------------------------

CudaEvent::CudaEvent(std::shared_ptr<CudaDevice> device, bool timing)
    : device_(std::move(device)), timing_(timing) {}

bool CudaEvent::query() {
  auto p = current();
  if (!p) return true;
  CudaDeviceGuard guard(p->ordinal());
  const cudaError_t e = cudaEventQuery(p->event());
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) (void)cudaGetLastError();  // failed: nothing more will happen
  return true;
}

Status CudaEvent::synchronize() {
  auto p = current();
  if (!p) return Status();
  CudaDeviceGuard guard(p->ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  // A blocking-sync event: the thread sleeps in the driver until the point completes.
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(p->event()));
  return p->status();
}

Status CudaEvent::synchronize_for(nanoseconds timeout) {
  auto p = current();
  if (!p) return Status();
  const Clock::time_point deadline = deadline_after(timeout);
  CudaDeviceGuard guard(p->ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  const cudaError_t first = cudaEventQuery(p->event());
  if (first == cudaSuccess) return p->status();
  if (first != cudaErrorNotReady) return ASYNCINFER_CUDA_STATUS(first);
  auto c = watch_point(*p, device_->waiters());
  const cudaEvent_t ev = p->event();
  Status s = await(
      c.ok() ? *c : nullptr, deadline, [ev] { return cudaEventQuery(ev); },
      "cudaEventQuery(event)");
  if (s.code() == StatusCode::deadline_exceeded) {
    return deadline_exceeded_error("event not reached within " + micros(timeout));
  }
  ASYNCINFER_RETURN_IF_ERROR(s);
  return p->status();
}

Result<double> CudaEvent::elapsed_us_since(Event& start) {
  ASYNCINFER_ASSIGN_OR_RETURN(const auto points, recorded_points(*this, start));
  const auto& [a, b] = points;
  if (a->ordinal() != b->ordinal()) {
    return failed_precondition_error(
        "elapsed_time_us: the events were recorded on different "
        "devices (cuda:" +
        std::to_string(a->ordinal()) + ", cuda:" + std::to_string(b->ordinal()) + ")");
  }
  CudaDeviceGuard guard(b->ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  for (const auto& p : {a, b}) {
    const cudaError_t e = cudaEventQuery(p->event());
    if (e == cudaErrorNotReady) {
      return failed_precondition_error("elapsed_time_us: an event has not completed yet");
    }
    ASYNCINFER_CUDA_RETURN_IF_ERROR(e);
  }
  float ms = 0;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a->event(), b->event()));
  return static_cast<double>(ms) * 1000.0;
}

}  // namespace asyncinfer::detail::cuda
