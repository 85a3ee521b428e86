#include "device/host_stream.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <exception>

#include "device/backend.hpp"

namespace asyncinfer::detail {

Result<std::shared_ptr<Storage>> allocate_host_backed(std::size_t bytes, MemoryKind kind) {
  ASYNCINFER_ASSIGN_OR_RETURN(auto host, Storage::allocate_host(bytes));
  if (kind == MemoryKind::host) return host;
  void* p = host->data();
  return std::make_shared<Storage>(
      p, bytes, Placement{kind, kind == MemoryKind::device ? 0 : -1},
      [keep = std::move(host)](void*) {}, true);
}

bool sleep_until(Clock::time_point deadline, std::stop_token stop) {
  if (Clock::now() >= deadline) return !stop.stop_requested();
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  // The predicate is only ever made true by the stop token (wait_until checks it).
  cv.wait_until(lock, stop, deadline, [] { return false; });
  return !stop.stop_requested();
}

bool spin_until(Clock::time_point deadline, const std::stop_token& stop) {
  while (Clock::now() < deadline) {
    if (stop.stop_requested()) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return !stop.stop_requested();
}

// ---- Marker ----------------------------------------------------------------------------------

void Marker::complete(Status status, Clock::time_point when) {
  {
    std::lock_guard lock(mu_);
    status_ = std::move(status);
    when_ = when;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool Marker::wait(std::stop_token stop) {
  if (done()) return true;
  std::unique_lock lock(mu_);
  return cv_.wait(lock, stop, [this] { return done_.load(std::memory_order_relaxed); });
}

bool Marker::wait_until(Clock::time_point deadline) {
  if (done()) return true;
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [this] { return done_.load(std::memory_order_relaxed); });
}

void Marker::run_owner() {
  if (gate_ && !done()) gate_->run_until(*this);
}

void CallerRunGate::run_until(const Marker& point) {
  HostStream* stream = nullptr;
  {
    std::lock_guard lock(mu_);
    if (stream_ == nullptr) return;  // closed: its close() completed or fails the point
    stream = stream_;
    ++active_;
  }
  stream->run_pending(&point);
  {
    std::lock_guard lock(mu_);
    --active_;
  }
  cv_.notify_all();
}

void CallerRunGate::close() {
  std::unique_lock lock(mu_);
  stream_ = nullptr;
  cv_.wait(lock, [this] { return active_ == 0; });
}

// ---- HostEvent -------------------------------------------------------------------------------

std::shared_ptr<Marker> HostEvent::begin_record(std::shared_ptr<CallerRunGate> gate) {
  auto m = std::make_shared<Marker>();
  m->set_gate(std::move(gate));
  std::lock_guard lock(mu_);
  current_ = m;
  return m;
}

std::shared_ptr<Marker> HostEvent::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

bool HostEvent::query() {
  auto m = current();
  return !m || m->done();
}

Status HostEvent::synchronize() {
  auto m = current();
  if (!m) return Status();
  m->run_owner();  // a caller-run stream's point: its work runs here
  m->wait_until(Clock::time_point::max());
  return m->status();
}

Status HostEvent::synchronize_for(std::chrono::nanoseconds timeout) {
  auto m = current();
  if (!m) return Status();
  m->run_owner();  // a caller-run stream's point: its work runs here, whatever the timeout
  if (!m->wait_until(deadline_after(timeout))) {
    return deadline_exceeded_error(
        "event not reached within " +
        std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(timeout).count()) +
        " us");
  }
  return m->status();
}

Result<double> HostEvent::elapsed_us_since(Event& start) {
  ASYNCINFER_ASSIGN_OR_RETURN(const auto points, recorded_points(*this, start));
  const auto& [a, b] = points;
  if (!a->done() || !b->done()) {
    return failed_precondition_error("elapsed_time_us: an event has not completed yet");
  }
  return std::chrono::duration<double, std::micro>(b->when() - a->when()).count();
}

// ---- HostStream ------------------------------------------------------------------------------

HostStream::HostStream(std::shared_ptr<Device> device, const StreamOptions& options,
                       std::string thread_name, StreamThread thread)
    : device_(std::move(device)),
      priority_(options.priority),
      caller_run_(thread == StreamThread::caller),
      executor_(options.host_func_executor != nullptr ? options.host_func_executor
                                                      : &device_->host_func_executor()),
      name_(std::move(thread_name)) {
  if (caller_run_) {
    gate_ = std::make_shared<CallerRunGate>(*this);
  } else {
    thread_ = std::jthread([this](std::stop_token st) { loop(st); });
  }
}

HostStream::~HostStream() { close(); }

void HostStream::close() {
  {
    std::lock_guard lock(mu_);
    if (closing_ && !thread_.joinable()) return;
    closing_ = true;
  }
  thread_.request_stop();        // wakes the thread and fires the running kernel's stop token
  close_source_.request_stop();  // the same for a run_pending() in progress (caller-run mode)
  if (thread_.joinable()) thread_.join();
  if (gate_) gate_->close();  // host waits on its events no longer run its work
  if (caller_run_) std::lock_guard wait_for_runner(run_mu_);
  std::deque<Op> rest;
  {
    std::lock_guard lock(mu_);
    rest.swap(ops_);
  }
  for (Op& op : rest) fail_unstarted(op);
}

Status HostStream::push(Op op) {
  {
    std::lock_guard lock(mu_);
    if (closing_) return failed_precondition_error("stream '" + name_ + "' is closing");
    ops_.push_back(std::move(op));
    ++enqueued_;
  }
  if (!caller_run_) cv_.notify_one();
  return Status();
}

void HostStream::run_pending(const Marker* until) {
  if (!caller_run_) return;
  std::lock_guard runner(run_mu_);
  const std::stop_token stop = close_source_.get_token();
  for (;;) {
    Op op;
    {
      std::lock_guard lock(mu_);
      if (ops_.empty() || stop.stop_requested()) return;  // close() fails what is left
      if (until != nullptr && until->done()) return;      // the point waited for is reached
      op = std::move(ops_.front());
      ops_.pop_front();
    }
    const bool counted = execute(op, stop);
    op = Op{};  // release tensors and functions before counting the op finished
    if (!counted) finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

Status HostStream::enqueue(Kernel kernel) {
  return push(Op{KernelOp{std::move(kernel)}, Clock::now()});
}

Status HostStream::copy(const Tensor& dst, const Tensor& src) {
  ASYNCINFER_RETURN_IF_ERROR(check_copy(dst, src));
  if (!dst.is_host_accessible() || !src.is_host_accessible()) {
    return invalid_argument_error("copy on a " + std::string(to_string(device_->kind())) +
                                  " stream: " + dst.describe() + " <- " + src.describe() +
                                  " involves memory of another device; copy through the host");
  }
  return push(Op{CopyOp{dst, src, copy_kind(dst, src)}, Clock::now()});
}

Status HostStream::record(Event& event) {
  auto* e = dynamic_cast<HostEvent*>(&event);
  if (e == nullptr) {
    return invalid_argument_error("record: the event belongs to another backend than stream '" +
                                  name_ + "'");
  }
  return push(Op{RecordOp{e->begin_record(gate_)}, Clock::now()});
}

Status HostStream::wait(Event& event) {
  auto* e = dynamic_cast<HostEvent*>(&event);
  if (e == nullptr) {
    return invalid_argument_error("wait: the event belongs to another backend than stream '" +
                                  name_ + "'");
  }
  std::shared_ptr<Marker> marker = e->current();
  if (!marker) return Status();  // never recorded: nothing to wait for (CUDA semantics)
  auto counter = e->pending_counter();
  counter->fetch_add(1, std::memory_order_acq_rel);
  Status s = push(Op{WaitOp{std::move(marker), counter}, Clock::now()});
  if (!s.ok()) counter->fetch_sub(1, std::memory_order_acq_rel);
  return s;
}

Status HostStream::launch_host_func(HostFunc fn) {
  return push(Op{HostFuncOp{std::move(fn)}, Clock::now()});
}

Status HostStream::synchronize() {
  auto marker = std::make_shared<Marker>();
  ASYNCINFER_RETURN_IF_ERROR(push(Op{RecordOp{marker}, Clock::now()}));
  run_pending();  // caller-run mode: the work runs here
  marker->wait_until(Clock::time_point::max());
  return marker->status();
}

Status HostStream::synchronize_for(std::chrono::nanoseconds timeout) {
  auto marker = std::make_shared<Marker>();
  ASYNCINFER_RETURN_IF_ERROR(push(Op{RecordOp{marker}, Clock::now()}));
  run_pending();  // caller-run mode: the work runs here, whatever the timeout
  if (!marker->wait_until(deadline_after(timeout))) {
    return deadline_exceeded_error(
        "stream '" + name_ + "' did not finish its work within " +
        std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(timeout).count()) +
        " us");
  }
  return marker->status();
}

bool HostStream::query() {
  std::lock_guard lock(mu_);
  return finished_.load(std::memory_order_acquire) == enqueued_;
}

Status HostStream::run_host_fn(Kernel& kernel, std::stop_token stop) {
  if (!kernel.host_fn) return Status();
  try {
    Status s = kernel.host_fn(std::move(stop));
    return s.ok() ? s : s.with_context("kernel '" + kernel.name + "'");
  } catch (const std::exception& e) {
    return internal_error("kernel '" + kernel.name + "' threw: " + e.what());
  } catch (...) {
    return internal_error("kernel '" + kernel.name + "' threw an unknown exception");
  }
}

void HostStream::loop(std::stop_token stop) {
  setup_thread(name_);
  if (priority_ > 0) {
    // Lower priority streams get a higher nice value (raising priority needs privileges).
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), std::min(priority_, 19));
  }
  for (;;) {
    Op op;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, stop, [this] { return !ops_.empty(); });
      if (stop.stop_requested()) return;  // close() fails what is left
      op = std::move(ops_.front());
      ops_.pop_front();
    }
    const bool counted = execute(op, stop);
    op = Op{};  // release tensors and functions before counting the op finished
    if (!counted) finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

bool HostStream::execute(Op& op, std::stop_token stop) {
  if (auto* k = std::get_if<KernelOp>(&op.what)) {
    Status s;
    if (k->kernel.stop.stop_possible()) {
      // One token that fires when either the kernel is cancelled or the stream closes.
      std::stop_source both;
      std::stop_callback on_kernel(k->kernel.stop, [&both] { both.request_stop(); });
      std::stop_callback on_close(stop, [&both] { both.request_stop(); });
      s = run_kernel(k->kernel, op.enqueued_at, both.get_token());
    } else {
      s = run_kernel(k->kernel, op.enqueued_at, stop);
    }
    if (!s.ok() && pending_error_.ok()) pending_error_ = std::move(s);
  } else if (auto* c = std::get_if<CopyOp>(&op.what)) {
    Status s = run_copy(c->dst, c->src, c->kind, op.enqueued_at, stop);
    if (!s.ok() && pending_error_.ok()) pending_error_ = std::move(s);
  } else if (auto* r = std::get_if<RecordOp>(&op.what)) {
    // Count the op first: whoever wakes on the marker (synchronize) must see query() true.
    finished_.fetch_add(1, std::memory_order_acq_rel);
    r->marker->complete(pending_error_, point_time(op.enqueued_at));
    return true;
  } else if (auto* w = std::get_if<WaitOp>(&op.what)) {
    const bool reached = w->marker->wait(stop);
    w->pending->fetch_sub(1, std::memory_order_acq_rel);
    if (!reached) return false;  // closing
    if (!w->marker->status().ok() && pending_error_.ok()) pending_error_ = w->marker->status();
    after_wait(w->marker->when());
  } else if (auto* h = std::get_if<HostFuncOp>(&op.what)) {
    deliver_host_func(std::move(h->fn), std::exchange(pending_error_, Status()));
  }
  return false;
}

void HostStream::fail_unstarted(Op& op) {
  const Status aborted =
      aborted_error("stream '" + name_ + "' was destroyed before reaching this point");
  if (auto* r = std::get_if<RecordOp>(&op.what)) {
    finished_.fetch_add(1, std::memory_order_acq_rel);
    r->marker->complete(aborted, Clock::now());
    return;
  } else if (auto* w = std::get_if<WaitOp>(&op.what)) {
    w->pending->fetch_sub(1, std::memory_order_acq_rel);
  } else if (auto* h = std::get_if<HostFuncOp>(&op.what)) {
    deliver_host_func(std::move(h->fn), aborted);
  }
  // Kernels and copies not started are dropped; the host functions after them report it.
  finished_.fetch_add(1, std::memory_order_acq_rel);
}

void HostStream::deliver_host_func(HostFunc fn, Status status) {
  Task task([fn = std::move(fn), status = std::move(status)]() mutable { fn(std::move(status)); });
  if (executor_->post(std::move(task))) return;
  // The executor has shut down and left `task` untouched: the host function still runs, here,
  // exactly once.
  try {
    task();  // NOLINT(bugprone-use-after-move): post() moves only when it accepts
  } catch (...) {
    report_callback_exception("host function", std::current_exception());
  }
}

}  // namespace asyncinfer::detail
