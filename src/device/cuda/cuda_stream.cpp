// device.hpp's Stream on a CUDA stream (cuda_stream.hpp): enqueueing, the stream-ordered
// callbacks, destruction, and waiting for the stream.
#include "device/cuda/cuda_stream.hpp"

#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "device/backend.hpp"
#include "device/cuda/cuda_device.hpp"

namespace asyncinfer::detail::cuda {
namespace {

/// Settle items a stream may hold before it enqueues a host function just to release them.
constexpr std::size_t kMaxSettleItems = 1024;

// ---- the stream-ordered callbacks -------------------------------------------------------------
//
// Each builds the one CudaCallback record a stream enqueues for one purpose. A record holds the
// stream's state and its sequence number `seq`, settles every item enqueued before it, then does
// its job; it touches host state only (cuda_common.hpp).

/// launch_host_func: hands fn and the stream's pending error (or `aborted`) to the executor.
CudaCallback host_func_step(std::shared_ptr<StreamState> state, std::uint64_t seq, HostFunc fn) {
  return [state = std::move(state), seq, fn = std::move(fn)]() mutable {
    state->settle(seq);
    Status st = state->closing.load(std::memory_order_acquire) ? state->aborted() : state->take();
    Task task([fn = std::move(fn), st = std::move(st)]() mutable { fn(std::move(st)); });
    if (state->executor->post(std::move(task))) return;
    // The executor has shut down and left `task` untouched: run it here, exactly once. It must not
    // call CUDA (this is CUDA's callback thread).
    try {
      task();  // NOLINT(bugprone-use-after-move): post() moves only when it accepts
    } catch (...) {
      report_callback_exception("host function", std::current_exception());
    }
  };
}

/// Before a record on an error-capable stream: the point carries the stream's pending error.
CudaCallback snapshot_step(std::shared_ptr<StreamState> state, std::uint64_t seq,
                           std::shared_ptr<Point> point) {
  return [state = std::move(state), seq, point = std::move(point)] {
    state->settle(seq);
    point->set_status(state->closing.load(std::memory_order_acquire) ? state->aborted()
                                                                     : state->peek());
  };
}

/// After a wait on an error-carrying point: the waiting stream inherits the point's error.
CudaCallback inherit_step(std::shared_ptr<StreamState> state, std::uint64_t seq,
                          std::shared_ptr<Point> point) {
  return [state = std::move(state), seq, point = std::move(point)] {
    state->settle(seq);
    state->fold(point->status());
  };
}

/// Hands a host job to the worker (a host-wait kernel follows it on the stream).
CudaCallback trigger_step(std::shared_ptr<StreamState> state, std::uint64_t seq,
                          std::shared_ptr<HostWorker> worker, HostJob job, MappedSlot* own_slot) {
  return [state = std::move(state), seq, worker = std::move(worker), job = std::move(job),
          own_slot]() mutable {
    // The kernel's own spin slot is settled (and released) below: read it first.
    const bool cut = own_slot != nullptr && load_flag(own_slot->cut) != 0;
    state->settle(seq);
    job.skip = job.skip || cut;
    worker->post(std::move(job));
  };
}

/// Stream::synchronize[_for] and the destructor's drain: signals with the pending error (kept).
CudaCallback marker_step(std::shared_ptr<StreamState> state, std::uint64_t seq,
                         std::shared_ptr<Completion> done) {
  return [state = std::move(state), seq, done = std::move(done)]() mutable {
    state->settle(seq);
    Status st = state->peek();
    state.reset();  // the drain's marker must not hold the last reference past the signal
    done->complete(std::move(st));
  };
}

/// Releases settle items when a stream enqueues many without any other callback.
CudaCallback settle_step(std::shared_ptr<StreamState> state, std::uint64_t seq) {
  return [state = std::move(state), seq] { state->settle(seq); };
}

/// Where a tensor's bytes really are, by cudaPointerGetAttributes.
enum class Where { pageable, pinned, device };

struct Located {
  Where where = Where::pageable;
  int ordinal = -1;
};

Result<Located> locate(const Tensor& t, const char* role, int ordinal) {
  cudaPointerAttributes attr{};
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, t.data()));
  const bool placed_on_device = t.placement().kind == MemoryKind::device;
  const bool is_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (placed_on_device != is_device) {
    return invalid_argument_error(
        std::string("copy on a stream of cuda:") + std::to_string(ordinal) + ": " + role + " " +
        t.describe() + " is placed in " + std::string(to_string(t.placement().kind)) +
        " memory but " + (is_device ? "is CUDA device memory" : "is not CUDA device memory") +
        " (memory of another backend's device? copy through the host)");
  }
  if (is_device) return Located{Where::device, attr.device};
  return Located{attr.type == cudaMemoryTypeHost ? Where::pinned : Where::pageable, -1};
}

}  // namespace

CudaStream::CudaStream(std::shared_ptr<CudaDevice> device, cudaStream_t stream, int priority,
                       std::shared_ptr<StreamState> state)
    : device_(std::move(device)), stream_(stream), priority_(priority), state_(std::move(state)) {}

CudaStream::~CudaStream() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  state_->closing.store(true, std::memory_order_release);
  state_->stop.request_stop();         // a running host_fn sees its token fire
  store_flag(state_->words->stop, 1);  // spin and host-wait kernels of this stream end now
  {
    CudaDeviceGuard guard(ordinal());
    // Drain: every callback enqueued so far runs (host functions with `aborted`).
    Status drained = await_marker(Clock::time_point::max(), "drain", /*internal=*/true);
    if (!drained.ok()) (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  worker_.reset();  // joins the host worker (it drops what is left)
  state_->settle(~std::uint64_t{0});
  state_.reset();
}

int CudaStream::ordinal() const noexcept { return device_->ordinal(); }

Device& CudaStream::device() noexcept { return *device_; }

Status CudaStream::enqueue(Kernel kernel) {
  if (kernel.duration.count() <= 0 && !kernel.host_fn) return Status();
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  errorable_ = true;
  MappedSlot* slot = nullptr;
  if (kernel.duration.count() > 0) {
    std::unique_ptr<StopFlagCallback> on_stop;
    if (kernel.stop.stop_possible()) {
      ASYNCINFER_ASSIGN_OR_RETURN(slot, device_->slots()->acquire());
      on_stop = std::make_unique<StopFlagCallback>(kernel.stop, SetFlag{&slot->stop});
    }
    const cudaError_t e =
        launch_spin_kernel(stream_, static_cast<std::uint64_t>(kernel.duration.count()),
                           slot != nullptr ? &slot->stop : nullptr, &state_->words->stop,
                           slot != nullptr ? &slot->cut : nullptr);
    if (e != cudaSuccess) {
      on_stop.reset();
      device_->slots()->release(slot);
      return cuda_status(e, "launch_spin_kernel (cudaLaunchKernel)", __FILE__, __LINE__)
          .with_context("kernel '" + kernel.name + "'");
    }
    if (slot != nullptr) {
      SettleItem item;
      item.seq = item_seq();
      item.slot = slot;
      item.on_stop = std::move(on_stop);
      item.kernel_name = kernel.name;
      state_->add_item(std::move(item));
    }
  }
  if (kernel.host_fn) {
    HostJob job;
    job.fn = std::move(kernel.host_fn);
    job.what = "kernel '" + kernel.name + "'";
    job.kernel_stop = kernel.stop;
    ASYNCINFER_RETURN_IF_ERROR(enqueue_host_job(std::move(job), slot));
  }
  bound_settle_items();
  return Status();
}

Status CudaStream::enqueue_host_job(HostJob job, MappedSlot* own_slot) {
  if (!worker_) {
    std::string thread_name = state_->name + "-h";
    worker_ = std::make_shared<HostWorker>(state_, std::move(thread_name));
  }
  const std::uint64_t target = host_jobs_ + 1;
  ASYNCINFER_RETURN_IF_ERROR(launch_callback(
      stream_, trigger_step(state_, callback_seq(), worker_, std::move(job), own_slot)));
  host_jobs_ = target;  // the job is bound to run (or be dropped) and count
  const cudaError_t e =
      launch_host_wait_kernel(stream_, &state_->words->counter, target, &state_->words->stop);
  return cuda_status(e, "launch_host_wait_kernel (cudaLaunchKernel)", __FILE__, __LINE__);
}

void CudaStream::bound_settle_items() {
  if (items_since_callback_ < kMaxSettleItems) return;
  (void)launch_callback(stream_, settle_step(state_, callback_seq()));
}

Status CudaStream::copy(const Tensor& dst, const Tensor& src) {
  ASYNCINFER_RETURN_IF_ERROR(check_copy(dst, src));
  const std::size_t bytes = src.byte_size();
  if (bytes == 0) return Status();
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  ASYNCINFER_ASSIGN_OR_RETURN(Located d, locate(dst, "destination", ordinal()));
  ASYNCINFER_ASSIGN_OR_RETURN(Located s, locate(src, "source", ordinal()));
  const CopyKind kind = copy_kind(dst, src);
  if ((kind == CopyKind::host_to_device && d.ordinal != ordinal()) ||
      (kind == CopyKind::device_to_host && s.ordinal != ordinal())) {
    return invalid_argument_error("copy on a stream of cuda:" + std::to_string(ordinal()) + ": " +
                                  dst.describe() + " <- " + src.describe() +
                                  " involves memory of another CUDA device; use a stream of that "
                                  "device");
  }
  std::shared_ptr<Storage> staging;
  if ((kind == CopyKind::host_to_device && s.where == Where::pageable) ||
      (kind == CopyKind::device_to_host && d.where == Where::pageable)) {
    ASYNCINFER_ASSIGN_OR_RETURN(staging, device_->memory()->allocate_pinned(bytes));
  }
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  void* const dp = dst.data();
  const void* const sp = src.data();
  const auto host_copy = [](void* to, const void* from, std::size_t n,
                            std::vector<std::shared_ptr<Storage>> keep) {
    HostJob job;
    job.fn = [to, from, n, keep = std::move(keep)](std::stop_token) {
      std::memmove(to, from, n);
      return Status();
    };
    return job;
  };
  switch (kind) {
    case CopyKind::host_to_host:
      ASYNCINFER_RETURN_IF_ERROR(
          enqueue_host_job(host_copy(dp, sp, bytes, {dst.storage(), src.storage()}), nullptr));
      break;
    case CopyKind::host_to_device:
      if (staging) {
        ASYNCINFER_RETURN_IF_ERROR(enqueue_host_job(
            host_copy(staging->data(), sp, bytes, {staging, src.storage()}), nullptr));
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, staging->data(), bytes, cudaMemcpyHostToDevice, stream_));
      } else {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, sp, bytes, cudaMemcpyHostToDevice, stream_));
      }
      break;
    case CopyKind::device_to_host:
      if (staging) {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(staging->data(), sp, bytes, cudaMemcpyDeviceToHost, stream_));
        ASYNCINFER_RETURN_IF_ERROR(enqueue_host_job(
            host_copy(dp, staging->data(), bytes, {staging, dst.storage()}), nullptr));
      } else {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, sp, bytes, cudaMemcpyDeviceToHost, stream_));
      }
      break;
    case CopyKind::device_to_device:
      if (d.ordinal == s.ordinal) {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dp, sp, bytes, cudaMemcpyDeviceToDevice, stream_));
      } else {
        ASYNCINFER_CUDA_RETURN_IF_ERROR(
            cudaMemcpyPeerAsync(dp, d.ordinal, sp, s.ordinal, bytes, stream_));
      }
      break;
  }
  // The stream keeps both tensors (and the staging buffer) until it has passed the copy.
  SettleItem item;
  item.seq = item_seq();
  item.keep_alive = {dst.storage(), src.storage()};
  if (staging) item.keep_alive.push_back(std::move(staging));
  state_->add_item(std::move(item));
  bound_settle_items();
  return Status();
}

Status CudaStream::record(Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr) {
    return invalid_argument_error("record: the event belongs to another backend than stream '" +
                                  state_->name + "'");
  }
  if (e->device().ordinal() != ordinal()) {
    return invalid_argument_error(
        "record: the event belongs to cuda:" + std::to_string(e->device().ordinal()) +
        ", stream '" + state_->name + "' to cuda:" + std::to_string(ordinal()));
  }
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  ASYNCINFER_ASSIGN_OR_RETURN(cudaEvent_t ev, device_->events()->take(e->timing_enabled()));
  auto point = std::make_shared<Point>(device_->events(), ev, e->timing_enabled(), ordinal());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  if (errorable_) {
    point->errorable = true;
    ASYNCINFER_RETURN_IF_ERROR(
        launch_callback(stream_, snapshot_step(state_, callback_seq(), point)));
  }
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventRecord(point->event(), stream_));
  e->set_current(std::move(point));
  return Status();
}

Status CudaStream::wait(Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr) {
    return invalid_argument_error("wait: the event belongs to another backend than stream '" +
                                  state_->name + "'");
  }
  std::shared_ptr<Point> point = e->current();
  if (!point) return Status();  // never recorded: nothing to wait for (CUDA semantics)
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, point->event(), 0));
  if (point->errorable) {
    errorable_ = true;
    ASYNCINFER_RETURN_IF_ERROR(
        launch_callback(stream_, inherit_step(state_, callback_seq(), std::move(point))));
  }
  return Status();
}

Status CudaStream::launch_host_func(HostFunc fn) {
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  std::lock_guard lock(mu_);
  if (closing_) return closing_error();
  return launch_callback(stream_, host_func_step(state_, callback_seq(), std::move(fn)));
}

Status CudaStream::await_marker(Clock::time_point deadline, const std::string& what,
                                bool internal) {
  auto done = std::make_shared<Completion>();
  {
    std::lock_guard lock(mu_);
    if (closing_ && !internal) return closing_error();
    ASYNCINFER_RETURN_IF_ERROR(launch_callback(stream_, marker_step(state_, callback_seq(), done)));
  }
  cudaStream_t s = stream_;
  ASYNCINFER_RETURN_IF_ERROR(await(
      done, deadline, [s] { return cudaStreamQuery(s); }, "cudaStreamQuery(" + what + ")"));
  // Idle by cudaStreamQuery means the marker has run; allow for its signal still in flight.
  if (!done->wait_until(Clock::now() + std::chrono::seconds(1))) return state_->peek();
  return done->status();
}

Status CudaStream::synchronize_until(Clock::time_point deadline, nanoseconds timeout) {
  CudaDeviceGuard guard(ordinal());
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  Status s = await_marker(deadline, "stream '" + state_->name + "'", /*internal=*/false);
  if (s.code() == StatusCode::deadline_exceeded) {
    return deadline_exceeded_error("stream '" + state_->name + "' did not finish its work within " +
                                   micros(timeout));
  }
  return s;
}

bool CudaStream::query() {
  CudaDeviceGuard guard(ordinal());
  const cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) (void)cudaGetLastError();  // failed: nothing more will run
  return true;
}

}  // namespace asyncinfer::detail::cuda
