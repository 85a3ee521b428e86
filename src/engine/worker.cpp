// The worker (worker.hpp): its loop, launching a batch (assembly, enqueue, the completion point
// and the copies back), the completion point itself (splitting the outputs, ending the requests),
// and the checks of a model's outputs. What happens to a failed batch (split, requeue, retry) is
// in batch_failure.cpp; the watchdog, recycling and the breaker in worker_recovery.cpp.
#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"
#include "device/backend.hpp"
#include "device/host_stream.hpp"
#include "engine/batcher.hpp"
#include "engine/test_hooks.hpp"
#include "engine/worker.hpp"

namespace asyncinfer::detail {

namespace {

/// BatchIO::responses of a decoupled model's batch: hands each response to its request's
/// RequestOptions::on_response while the request is running.
class BatchResponseSender final : public ResponseSender {
 public:
  BatchResponseSender(const EngineContext& ctx, std::vector<std::shared_ptr<Request>> requests)
      : ctx_(ctx), requests_(std::move(requests)) {}

  std::size_t requests() const noexcept override { return requests_.size(); }
  std::int64_t rows(std::size_t request) const noexcept override {
    return request < requests_.size() ? requests_[request]->rows : 0;
  }
  bool is_cancelled(std::size_t request) const noexcept override {
    return request >= requests_.size() ||
           detail::is_final(requests_[request]->stage.load(std::memory_order_acquire));
  }

  Status send(std::size_t request, std::vector<Tensor> outputs) override {
    if (request >= requests_.size()) {
      return invalid_argument_error("response for request " + std::to_string(request) +
                                    " of a batch of " + std::to_string(requests_.size()));
    }
    Request& r = *requests_[request];
    // Under the request's gate (request.hpp): the stage cannot end, and the final result cannot
    // be delivered, until on_response returns. Checked first: a request that has ended may
    // belong to an engine that is gone.
    std::lock_guard gate(r.response_mu);
    if (is_cancelled(request)) {
      return cancelled_error(with_tag("the request has ended; no more responses", r.tag));
    }
    ASYNCINFER_RETURN_IF_ERROR(ctx_.check_outputs(outputs, r.rows));
    r.responses_sent.fetch_add(1, std::memory_order_relaxed);
    return r.on_response(std::move(outputs), r.response_stop.get_token());
  }

 private:
  const EngineContext& ctx_;
  const std::vector<std::shared_ptr<Request>> requests_;
};

}  // namespace

Worker::Worker(int index, int intra_op_threads, EngineContext& ctx)
    : index_(index),
      intra_op_threads_(intra_op_threads),
      ctx_(ctx),
      scheduler_(ctx.scheduler),
      resolver_(ctx.resolver),
      breaker_(ctx.opt.breaker),
      spin_(ctx.spin.waiter()) {}

Status Worker::open() { return make_stream_and_instance(ctx_.opt.create_stop); }

void Worker::start() {
  thread_ = std::jthread([this] { loop(); });
}

void Worker::wake() {
  { std::lock_guard lock(mu_); }
  cv_.notify_all();
  // A batch waiting at the execution gate leaves it once the engine is cancelling.
  if (ctx_.opt.execution_gate != nullptr && scheduler_.cancelling()) gate_stop_.request_stop();
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::close() {
  stream_.reset();
  instance_.reset();
}

void Worker::append_running(std::vector<std::shared_ptr<Request>>& out) const {
  std::lock_guard lock(mu_);
  for (const auto& b : running_) {
    for (const auto& r : b->requests) out.push_back(r);
  }
}

std::pair<WorkerHealth, std::string> Worker::health() const {
  std::lock_guard lock(mu_);
  return health_locked();
}

WorkerMetrics Worker::metrics() const {
  WorkerMetrics wm;
  wm.index = index_;
  {
    std::lock_guard lock(mu_);
    wm.breaker = to_string(breaker_.state());
    wm.inflight_batches = inflight_;
    wm.abandoned_instances = abandoned_;
    auto [health, reason] = health_locked();
    wm.health = std::string(asyncinfer::to_string(health));
    wm.health_reason = std::move(reason);
  }
  wm.batches = batches_.load();
  wm.failed_batches = failed_batches_.load();
  wm.recycles = recycles_.load();
  wm.recycle_failures = recycle_attempts_failed_.load();
  wm.stream_batches = stream_batches_.load();
  return wm;
}

Status Worker::make_stream_and_instance(std::stop_token stop) {
  const std::string where = "worker " + std::to_string(index_);
  StreamOptions so;
  so.host_func_executor = &ctx_.completion_point;
  so.name = "ai-w" + std::to_string(index_) + "-stream";
  Result<std::unique_ptr<Stream>> stream = internal_error("no stream");
  detail::HostStream* caller_stream = nullptr;
  try {
    std::unique_ptr<detail::HostStream> own;
    if (ctx_.inline_path) own = detail::create_caller_run_stream(ctx_.device, so);
    if (own) {
      caller_stream = own.get();
      stream = std::unique_ptr<Stream>(std::move(own));
    } else {
      stream = ctx_.device.create_stream(so);  // not the inline path: a stream with its own thread
    }
  } catch (const std::exception& e) {
    stream = internal_error(std::string("device threw while creating a stream: ") + e.what());
  } catch (...) {
    stream = internal_error("device threw an unknown exception while creating a stream");
  }
  if (!stream.ok()) return stream.status().with_context(where);
  InstanceOptions io;
  io.worker_index = index_;
  io.intra_op_threads = intra_op_threads_;
  io.stop = std::move(stop);
  Result<std::unique_ptr<ModelInstance>> instance = internal_error("no instance");
  try {
    instance = ctx_.model.create_instance(ctx_.device, **stream, io);
  } catch (const std::exception& e) {
    ctx_.counters.model_exceptions.fetch_add(1, std::memory_order_relaxed);
    instance = internal_error(std::string("model threw in create_instance: ") + e.what());
  } catch (...) {
    ctx_.counters.model_exceptions.fetch_add(1, std::memory_order_relaxed);
    instance = internal_error("model threw an unknown exception in create_instance");
  }
  if (!instance.ok()) {
    return instance.status().with_context("worker " + std::to_string(index_) + ": model '" +
                                          ctx_.model.name() + "' on " + ctx_.device.name());
  }
  stream_ = std::move(*stream);
  caller_stream_ = caller_stream;
  instance_ = std::move(*instance);
  return Status();
}

void Worker::loop() {
  detail::setup_thread("ai-worker-" + std::to_string(index_));
  for (;;) {
    std::int64_t cap = ctx_.max_rows;
    int coalesce = ctx_.coalesce;
    bool do_recycle = false;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        // Leave at once when cancelling (shutdown(cancel), or a drain that ended), whatever else is
        // pending (a recycle, a backoff, a breaker cool-down): nothing is left for this worker to
        // do.
        if (scheduler_.cancelling()) return;
        if (life_ == WorkerLife::gave_up) {
          // Unhealthy for good: serves nothing and waits for shutdown.
          if (!scheduler_.accepting()) return;
          cv_.wait(lock);
          continue;
        }
        if (life_ == WorkerLife::recycling) {
          // Replacing an instance abandons the old one: only within the limit (header).
          if (abandoned_ > 0 && abandoned_ >= ctx_.opt.recovery.max_abandoned_instances) {
            cv_.wait(lock);  // the reaper notifies when an abandoned instance is destroyed
            continue;
          }
          if (Clock::now() < next_recycle_) {
            cv_.wait_until(lock, next_recycle_);  // backoff after a failed attempt
            continue;
          }
          do_recycle = true;
          break;
        }
        if (abandoned_ > ctx_.opt.recovery.max_abandoned_instances) {
          cv_.wait(lock);  // max_abandoned_instances 0: the replaced instance's work first
          continue;
        }
        const std::optional<int> limit =
            breaker_.admit(ctx_.opt.max_inflight_per_worker, Clock::now());
        if (!limit) {
          cv_.wait_until(lock, breaker_.open_until());  // the cool-down
          continue;
        }
        if (inflight_ < *limit) {
          if (breaker_.state() == Breaker::half_open) {  // probe with one request
            cap = 1;
            coalesce = 0;
          }
          break;
        }
        cv_.wait(lock);
      }
    }
    if (do_recycle) {
      recycle();
      continue;
    }
    // Spin before sleeping on an empty queue only where the engine's SpinPolicy says so (low
    // load, spin_wait.hpp).
    const bool spin = ctx_.spin.worth_spinning(resolver_.undelivered(), ctx_.opt.workers);
    std::shared_ptr<Batch> batch = scheduler_.next_batch(
        {index_, cap, &recycle_wanted_, breaker_.open_flag(), spin ? &spin_ : nullptr, coalesce});
    if (!batch) {
      if (scheduler_.cancelling()) return;
      // A recycle, or a breaker that opened while the worker waited for work: back to the
      // loop above, which handles them.
      if (recycle_wanted_.load(std::memory_order_acquire)) continue;
      if (breaker_.open_flag()->load(std::memory_order_acquire)) continue;
      return;
    }
    launch(batch);
    if (caller_stream_ != nullptr) caller_stream_->run_pending();  // the inline path
  }
}

void Worker::run_lent(const std::shared_ptr<Batch>& batch) {
  launch(batch);
  if (caller_stream_ != nullptr) caller_stream_->run_pending();
}

void Worker::launch(const std::shared_ptr<Batch>& batch) {
  {
    std::lock_guard lock(mu_);
    batch->generation = generation_;
    ++inflight_;
    running_.push_back(batch);
  }
  if (ctx_.opt.execution_gate != nullptr && !pass_gate(batch)) return;
  const Clock::time_point now = Clock::now();
  batch->dispatched = now;
  for (const auto& r : batch->requests) {
    ++r->attempts;
    ctx_.counters.queue_us.observe(detail::us_between(r->enqueued, now));
    r->queue_ns += detail::ns_between(r->waiting_since, now);
  }
  ctx_.counters.attempts.fetch_add(batch->requests.size(), std::memory_order_relaxed);
  auto io = std::make_shared<BatchIO>();
  batch->io = io;
  io->stop = batch->stop.get_token();
  Status s = assemble(*batch, *io);
  batch->inputs_ready = Clock::now();
  if (s.ok() && batch->requests.empty()) {  // every request failed in assembly
    end_without_running(batch, Status());
    return;
  }
  if (s.ok()) {
    if (ctx_.sig.decoupled)
      io->responses = std::make_shared<BatchResponseSender>(ctx_, batch->requests);
    ctx_.counters.batches.fetch_add(1, std::memory_order_relaxed);
    batches_.fetch_add(1, std::memory_order_relaxed);
    ctx_.counters.batch_size.observe(static_cast<double>(batch->rows));
    // On the stream from here until its completion point runs (or it never gets one).
    batch->on_stream.store(true, std::memory_order_relaxed);
    stream_batches_.fetch_add(1, std::memory_order_relaxed);
    try {
      s = instance_->enqueue(*stream_, io);
    } catch (const std::exception& e) {
      ctx_.counters.model_exceptions.fetch_add(1, std::memory_order_relaxed);
      s = internal_error(std::string("model threw during enqueue: ") + e.what());
    } catch (...) {
      ctx_.counters.model_exceptions.fetch_add(1, std::memory_order_relaxed);
      s = internal_error("model threw an unknown exception during enqueue");
    }
    if (!s.ok()) s = s.with_context("model '" + ctx_.model.name() + "'");
  }
  if (s.ok() && !ctx_.unified) s = enqueue_copies_back(*batch, *io);
  if (!s.ok()) {
    end_without_running(batch, s);
    return;
  }
  batch->compute_start = Clock::now();
  if (ctx_.opt.watchdog.count() > 0) {
    std::lock_guard wl(batch->watchdog_mu);
    batch->watchdog = ctx_.timer.add(saturating_add(batch->compute_start, watchdog_limit(*batch)),
                                     [this, batch] { on_watchdog(batch); });
  }
  s = stream_->launch_host_func([this, batch](Status st) { on_batch_done(batch, std::move(st)); });
  if (!s.ok()) end_without_running(batch, s);
}

bool Worker::pass_gate(const std::shared_ptr<Batch>& batch) {
  if (ctx_.opt.execution_gate->acquire(index_, gate_stop_.get_token())) {
    batch->gate_held.store(true, std::memory_order_release);
    return true;
  }
  // Cancelling: its requests end here (shutdown's cancel may already have ended them, from
  // running_), then it leaves the worker without running.
  for (const auto& r : batch->requests) {
    resolver_.try_resolve(
        r, Stage::shut_down,
        aborted_error(detail::with_tag(
            "engine shut down while the request waited for its instance's rate-limiter resources",
            r->tag)));
  }
  end_without_running(batch, Status());
  return false;
}

void Worker::leave_gate(Batch& batch) noexcept {
  if (batch.gate_held.exchange(false, std::memory_order_acq_rel)) {
    ctx_.opt.execution_gate->release(index_);
  }
}

Status Worker::assemble(Batch& batch, BatchIO& io) {
  const detail::AssemblyHook hook = detail::assembly_hook();
  if (hook != nullptr) {
    std::vector<std::shared_ptr<Request>> kept;
    for (auto& r : batch.requests) {
      try {
        hook(r->inputs);
        kept.push_back(r);
      } catch (const std::exception& e) {
        ctx_.failures.fail_alone(
            r, internal_error(detail::with_tag("batch assembly failed for this request", r->tag) +
                              ": " + e.what()));
      } catch (...) {
        ctx_.failures.fail_alone(
            r, internal_error(detail::with_tag("batch assembly failed for this request", r->tag)));
      }
    }
    if (kept.size() != batch.requests.size()) {
      batch.requests.swap(kept);
      batch.rows = 0;
      for (auto& r : batch.requests) batch.rows += r->rows;
    }
    if (batch.requests.empty()) return Status();
  }
  if (ctx_.sequence_plan != nullptr) {
    // The control inputs and the sequence's state join each request's own (sequence_batcher.hpp).
    std::vector<std::shared_ptr<Request>> kept;
    kept.reserve(batch.requests.size());
    for (auto& r : batch.requests) {
      Result<Inputs> full = ctx_.sequence_plan->model_inputs(*r);
      if (!full.ok()) {
        ctx_.failures.fail_alone(r, full.status());
        continue;
      }
      r->inputs = std::move(*full);
      kept.push_back(r);
    }
    if (kept.size() != batch.requests.size()) {
      batch.requests.swap(kept);
      batch.rows = static_cast<std::int64_t>(batch.requests.size());
    }
    if (batch.requests.empty()) return Status();
    io.sequences.reserve(batch.requests.size());
    for (const auto& r : batch.requests) io.sequences.push_back(*r->sequence_flags);
  }
  io.batch_size = ctx_.sig.batched ? batch.rows : 1;
  io.request_rows.reserve(batch.requests.size());
  bool contexts = false;
  io.deadline = Clock::time_point::min();
  for (const auto& r : batch.requests) {
    io.request_rows.push_back(ctx_.sig.batched ? r->rows : 1);
    contexts = contexts || r->context != nullptr;
    io.deadline = std::max(io.deadline, r->deadline);
  }
  if (contexts) {
    io.contexts.reserve(batch.requests.size());
    for (const auto& r : batch.requests) io.contexts.push_back(r->context);
  }
  try {
    if (batch.requests.size() == 1) {
      io.host_inputs = batch.requests[0]->inputs;
    } else if (ctx_.apart) {  // each request keeps its own tensors (Model::takes_requests_apart)
      io.coalesced = ctx_.coalesce > 1;  // not batched: each runs alone (batcher.hpp)
      // Request::batch is a weak pointer: no cycle through the requests held here.
      io.request_ended = [requests = batch.requests](std::size_t i) {
        return i >= requests.size() ||
               detail::is_final(requests[i]->stage.load(std::memory_order_acquire));
      };
      io.request_inputs.reserve(batch.requests.size());
      for (const auto& r : batch.requests) io.request_inputs.push_back(r->inputs);
      return Status();
    } else {
      io.host_inputs.reserve(ctx_.sig.inputs.size());
      std::vector<Tensor> parts(batch.requests.size());
      for (std::size_t i = 0; i < ctx_.sig.inputs.size(); ++i) {
        for (std::size_t j = 0; j < batch.requests.size(); ++j) {
          parts[j] = batch.requests[j]->inputs[i];
        }
        if (!parts[0].defined()) {  // an optional input that the whole batch left out
          io.host_inputs.emplace_back();
          continue;
        }
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, concat_dim0(parts));
        io.host_inputs.push_back(std::move(t));
      }
    }
    if (ctx_.unified) {
      io.inputs = io.host_inputs;
    } else {
      io.inputs.reserve(io.host_inputs.size());
      for (const Tensor& h : io.host_inputs) {
        if (!h.defined()) {
          io.inputs.emplace_back();
          continue;
        }
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor d, ctx_.device.empty_like(h, MemoryKind::device));
        ASYNCINFER_RETURN_IF_ERROR(stream_->copy(d, h));
        io.inputs.push_back(std::move(d));
      }
    }
  } catch (const std::exception& e) {
    return internal_error(std::string("batch assembly failed: ") + e.what());
  }
  return Status();
}

Status Worker::enqueue_copies_back(Batch& batch, BatchIO& io) {
  if (ctx_.sig.decoupled && io.outputs.empty()) return Status();  // the final flag alone
  if (io.outputs.size() != ctx_.sig.outputs.size()) {
    return internal_error("model '" + ctx_.model.name() + "' gave " +
                          std::to_string(io.outputs.size()) + " outputs during enqueue on " +
                          ctx_.device.name() + ", its signature has " +
                          std::to_string(ctx_.sig.outputs.size()) +
                          " (on devices without unified memory the outputs must exist when "
                          "enqueue returns)");
  }
  batch.host_outputs.reserve(io.outputs.size());
  for (const Tensor& out : io.outputs) {
    if (!out.defined())
      return internal_error("model '" + ctx_.model.name() + "' left an output undefined");
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor host, ctx_.device.empty_like(out, MemoryKind::pinned_host));
    ASYNCINFER_RETURN_IF_ERROR(stream_->copy(host, out));
    batch.host_outputs.push_back(std::move(host));
  }
  return Status();
}

void Worker::off_stream(Batch& batch) {
  if (batch.on_stream.exchange(false, std::memory_order_relaxed)) {
    stream_batches_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void Worker::end_without_running(const std::shared_ptr<Batch>& batch, Status s) {
  if (ctx_.opt.execution_gate != nullptr) leave_gate(*batch);
  off_stream(*batch);
  if (batch->done.exchange(true)) return;
  if (!s.ok()) {
    failed_batches_.fetch_add(1, std::memory_order_relaxed);
    breaker_failure(s.code());
  }
  release_slot(*batch);
  if (!s.ok()) ctx_.failures.batch_failed(batch, s);
  scheduler_.batch_finished(*batch);
}

void Worker::on_batch_done(const std::shared_ptr<Batch>& batch, Status st) {
  // The model's work for the batch has ended (even when the watchdog ended its requests first).
  if (ctx_.opt.execution_gate != nullptr) leave_gate(*batch);
  off_stream(*batch);
  if (batch->done.exchange(true)) {
    // The watchdog ended it first: its requests have ended; what it brings is late.
    ctx_.failures.late_outcome(*batch, st);
    return;
  }
  TimerId wd;
  {
    std::lock_guard wl(batch->watchdog_mu);
    wd = std::exchange(batch->watchdog, TimerId{});
  }
  ctx_.timer.cancel(wd);
  const Clock::time_point now = Clock::now();
  const double compute = detail::us_between(batch->compute_start, now);
  ctx_.counters.compute_us.observe(compute);
  // The breaker is updated before the slot is freed, so a worker that just failed its probe
  // cannot take another request in between.
  if (st.ok()) {
    breaker_success();
  } else if (st.code() != StatusCode::aborted) {
    failed_batches_.fetch_add(1, std::memory_order_relaxed);
    breaker_failure(st.code());
  }
  const bool stale = release_slot(*batch);
  const Clock::time_point previous(std::chrono::nanoseconds(last_completion_ns_.exchange(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
      std::memory_order_relaxed)));
  detail::Resolver::CallbackBatch callbacks(resolver_);
  if (st.ok()) {
    complete(batch, compute, now, previous);
  } else if (stale && st.code() == StatusCode::aborted) {
    // Its stream was replaced under it: run it again on the new one.
    ctx_.failures.requeue_all(batch);
  } else {
    ctx_.failures.batch_failed(batch, st);
  }
  scheduler_.batch_finished(*batch);
}

bool Worker::release_slot(const Batch& batch) {
  bool stale = false;
  {
    std::lock_guard lock(mu_);
    --inflight_;
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const std::shared_ptr<Batch>& b) { return b.get() == &batch; });
    if (it != running_.end()) running_.erase(it);
    stale = batch.generation != generation_;
  }
  cv_.notify_one();
  return stale;
}

void Worker::complete(const std::shared_ptr<Batch>& batch, double compute_us, Clock::time_point now,
                      Clock::time_point previous) {
  const std::vector<Tensor>& outs = ctx_.unified ? batch->io->outputs : batch->host_outputs;
  // The requests the model answered with an error of their own (BatchIO::request_errors).
  std::vector<Status>& errors = batch->io->request_errors;
  const auto failed_alone = [&](std::size_t k) { return k < errors.size() && !errors[k].ok(); };
  // A model that took the batch apart answers each request with outputs of its own.
  std::vector<std::vector<Tensor>>& apart = batch->io->request_outputs;
  Status check;
  if (!batch->io->request_inputs.empty() && !(ctx_.sig.decoupled && apart.empty())) {
    if (apart.size() != batch->requests.size()) {
      check = internal_error("model '" + ctx_.model.name() + "' answered " +
                             std::to_string(apart.size()) + " of a batch's " +
                             std::to_string(batch->requests.size()) + " requests");
    }
    for (std::size_t k = 0; check.ok() && k < apart.size(); ++k) {
      if (failed_alone(k)) continue;
      check = ctx_.check_outputs(apart[k], batch->requests[k]->rows);
      if (!check.ok() && batch->io->coalesced) {
        // Its own execution answered wrongly (Model::coalesced_requests): it fails alone.
        if (errors.empty()) errors.resize(batch->requests.size());
        errors[k] = std::exchange(check, Status());
      }
    }
  } else if (!(ctx_.sig.decoupled && outs.empty())) {
    // (A decoupled model's final result may carry no response: the final flag alone.)
    check = ctx_.check_outputs(outs, batch->rows);
  }
  if (!check.ok()) {
    ctx_.failures.batch_failed(batch, check);
    return;
  }
  scheduler_.observe_batch(compute_us, batch->requests.size());  // for admission control
  const bool split = ctx_.sig.batched && batch->requests.size() > 1;
  std::int64_t offset = 0;
  std::vector<Outputs> split_outputs(batch->requests.size());
  for (std::size_t k = 0; k < batch->requests.size(); ++k) {
    const auto& r = batch->requests[k];
    Outputs& mine = split_outputs[k];
    if (!apart.empty()) {
      mine = std::move(apart[k]);
    } else if (split) {
      mine.reserve(outs.size());
      for (const Tensor& o : outs) mine.push_back(*o.slice(offset, offset + r->rows));
    } else {
      mine = outs;
    }
    offset += r->rows;
    // A sequence's state outputs stay with the sequence, for its next request.
    if (ctx_.sequence_plan != nullptr && !failed_alone(k)) ctx_.sequence_plan->keep_state(*r, mine);
  }
  // compute_output ends here, and with it each request's time (its success duration).
  const Clock::time_point split_done = Clock::now();

  // Triton's statistics, added before any request is handed over (a caller that has its result
  // sees them): each request still running is charged its batch's compute parts. compute_infer
  // starts when the batch's inputs were ready or the batch before it on the stream ended,
  // whichever is later; the wait between is queue time.
  const auto ns = detail::ns_between;
  const Clock::time_point infer_start = std::max(batch->inputs_ready, previous);
  // A coalesced launch (Model::coalesced_requests) was an execution a request, each of its own
  // rows: the launch's compute times are shared among them.
  const std::uint64_t executions = batch->io->coalesced ? batch->requests.size() : 1;
  const std::uint64_t input_ns = ns(batch->dispatched, batch->inputs_ready) / executions;
  const std::uint64_t stream_wait_ns = ns(batch->inputs_ready, infer_start);
  const std::uint64_t infer_ns = ns(infer_start, now) / executions;
  const std::uint64_t output_ns = ns(now, split_done) / executions;
  if (executions > 1) {
    ctx_.counters.execution_count.fetch_add(executions, std::memory_order_relaxed);
    for (const auto& r : batch->requests) {
      ctx_.counters.batch_stats.add(ctx_.sig.batched ? r->rows : 1, input_ns, infer_ns, output_ns);
    }
  } else {
    ctx_.counters.execution_count.fetch_add(1, std::memory_order_relaxed);
    ctx_.counters.batch_stats.add(ctx_.sig.batched ? batch->rows : 1, input_ns, infer_ns,
                                  output_ns);
  }
  ctx_.counters.last_inference_ms.store(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count(),
                                        std::memory_order_relaxed);
  std::vector<std::uint64_t> counted(batch->requests.size(), 0);  // queue ns, +1 when counted
  std::uint64_t n = 0;
  std::uint64_t rows = 0;
  std::uint64_t queue_ns = 0;
  for (std::size_t k = 0; k < batch->requests.size(); ++k) {
    const Request& r = *batch->requests[k];
    if (r.stage.load(std::memory_order_acquire) != Stage::running || failed_alone(k)) continue;
    counted[k] = r.queue_ns + stream_wait_ns + 1;
    if (r.timeline != nullptr) [[unlikely]] {  // a traced request (RequestOptions::timeline)
      auto at = [](Clock::time_point t) -> std::int64_t {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
      };
      RequestTimeline& t = *r.timeline;
      t.queue_start_ns.store(at(r.enqueued), std::memory_order_relaxed);
      t.compute_start_ns.store(at(batch->dispatched), std::memory_order_relaxed);
      t.compute_input_end_ns.store(at(batch->inputs_ready), std::memory_order_relaxed);
      t.compute_output_start_ns.store(at(now), std::memory_order_relaxed);
      t.compute_end_ns.store(at(split_done), std::memory_order_relaxed);
    }
    ++n;
    rows += static_cast<std::uint64_t>(ctx_.sig.batched ? r.rows : 1);
    queue_ns += counted[k] - 1;
  }
  auto charge = [&](std::uint64_t requests, std::uint64_t request_rows, std::uint64_t queued,
                    bool add) {
    if (requests == 0) return;
    auto apply = [add](std::atomic<std::uint64_t>& a, std::uint64_t v) {
      if (add) {
        a.fetch_add(v, std::memory_order_relaxed);
      } else {
        a.fetch_sub(v, std::memory_order_relaxed);
      }
    };
    apply(ctx_.counters.inference_count, request_rows);
    apply(ctx_.counters.stat_queue.count, requests);
    apply(ctx_.counters.stat_queue.ns, queued);
    for (auto [c, each] : {std::pair{&ctx_.counters.stat_input, input_ns},
                           std::pair{&ctx_.counters.stat_infer, infer_ns},
                           std::pair{&ctx_.counters.stat_output, output_ns}}) {
      apply(c->count, requests);
      apply(c->ns, requests * each);
    }
  };
  charge(n, rows, queue_ns, true);

  for (std::size_t k = 0; k < batch->requests.size(); ++k) {
    const auto& r = batch->requests[k];
    if (failed_alone(k)) {
      (void)resolver_.try_resolve(r, detail::stage_for_error(errors[k].code()), errors[k],
                                  split_done);
      continue;
    }
    if (!resolver_.try_resolve(r, Stage::completed, std::move(split_outputs[k]), split_done)) {
      ctx_.counters.late_completions.fetch_add(1, std::memory_order_relaxed);
      // It ended (deadline, cancel) between the count and here: not a success after all.
      if (counted[k] != 0) {
        charge(1, static_cast<std::uint64_t>(ctx_.sig.batched ? r->rows : 1), counted[k] - 1,
               false);
      }
    }
  }
}

Status EngineContext::check_outputs(const std::vector<Tensor>& outs, std::int64_t rows) const {
  if (outs.size() != sig.outputs.size()) {
    return internal_error("model '" + model.name() + "' produced " + std::to_string(outs.size()) +
                          " outputs, its signature has " + std::to_string(sig.outputs.size()));
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const TensorSpec& spec = sig.outputs[i];
    const Tensor& t = outs[i];
    bool ok = t.defined() && t.is_host_accessible() && t.dtype() == spec.dtype &&
              t.rank() == spec.shape.size();
    for (std::size_t d = 0; ok && d < spec.shape.size(); ++d) {
      if (spec.shape[d] >= 0 && spec.shape[d] != t.shape()[d]) ok = false;
    }
    if (ok && sig.batched && t.dim(0) != rows) ok = false;
    if (!ok) {
      return internal_error("model '" + model.name() + "' returned output '" + spec.name + "' as " +
                            t.describe() + " but its signature says " +
                            std::string(to_string(spec.dtype)) + shape_to_string(spec.shape) +
                            (sig.batched ? " with " + std::to_string(rows) + " rows" : ""));
    }
    if (t.dtype() == DType::bytes) {
      // The model wrote the elements after the tensor was made: check them once here, so that
      // splitting the batch and every encoder may walk them.
      auto size = serialized_bytes_size(t.data(), t.byte_size(), t.numel());
      if (!size.ok() || *size != t.byte_size()) {
        return internal_error(
            "model '" + model.name() + "' returned BYTES output '" + spec.name +
            "' whose elements are malformed: " +
            (size.ok() ? std::to_string(t.byte_size() - *size) + " bytes follow the last element"
                       : std::string(size.status().message())));
      }
    }
  }
  return Status();
}

}  // namespace asyncinfer::detail
