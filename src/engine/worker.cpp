// The worker (worker.hpp): its loop, launching a batch (assembly, enqueue, the completion point
// and the copies back), the completion point itself (splitting the outputs, ending the requests),
// and the checks of a model's outputs. What happens to a failed batch (split, requeue, retry) is
// in batch_failure.cpp; the watchdog, recycling and the breaker in worker_recovery.cpp.
#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"
#include "device/backend.hpp"
#include "device/host_stream.hpp"
#include "engine/batcher.hpp"
#include "engine/engine_core.hpp"
#include "engine/test_hooks.hpp"

namespace asyncinfer {

using detail::Batch;
using detail::Breaker;
using detail::ms_text;
using detail::Pending;
using detail::Request;
using detail::saturating_add;
using detail::Stage;
using detail::Worker;

namespace {

/// BatchIO::responses of a decoupled model's batch: hands each response to its request's
/// RequestOptions::on_response while the request is running.
class BatchResponseSender final : public ResponseSender {
 public:
  BatchResponseSender(const EngineCore& core, std::vector<std::shared_ptr<Request>> requests)
      : core_(core), requests_(std::move(requests)) {}

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
      return cancelled_error(core_.context("the request has ended; no more responses", r.tag));
    }
    ASYNCINFER_RETURN_IF_ERROR(core_.check_outputs(outputs, r.rows));
    r.responses_sent.fetch_add(1, std::memory_order_relaxed);
    return r.on_response(std::move(outputs), r.response_stop.get_token());
  }

 private:
  const EngineCore& core_;
  const std::vector<std::shared_ptr<Request>> requests_;
};

}  // namespace

Status EngineCore::make_stream_and_instance(Worker& w, int threads) {
  const std::string where = "worker " + std::to_string(w.index);
  StreamOptions so;
  so.host_func_executor = completion_point_executor();
  so.name = "ai-w" + std::to_string(w.index) + "-stream";
  Result<std::unique_ptr<Stream>> stream = internal_error("no stream");
  detail::HostStream* caller_stream = nullptr;
  try {
    std::unique_ptr<detail::HostStream> own;
    if (inline_path_) own = detail::create_caller_run_stream(*device_, so);
    if (own) {
      caller_stream = own.get();
      stream = std::unique_ptr<Stream>(std::move(own));
    } else {
      stream = device_->create_stream(so);  // not the inline path: a stream with its own thread
    }
  } catch (const std::exception& e) {
    stream = internal_error(std::string("device threw while creating a stream: ") + e.what());
  } catch (...) {
    stream = internal_error("device threw an unknown exception while creating a stream");
  }
  if (!stream.ok()) return stream.status().with_context(where);
  InstanceOptions io;
  io.worker_index = w.index;
  io.intra_op_threads = threads;
  Result<std::unique_ptr<ModelInstance>> instance = internal_error("no instance");
  try {
    instance = model_->create_instance(*device_, **stream, io);
  } catch (const std::exception& e) {
    model_exceptions_.fetch_add(1, std::memory_order_relaxed);
    instance = internal_error(std::string("model threw in create_instance: ") + e.what());
  } catch (...) {
    model_exceptions_.fetch_add(1, std::memory_order_relaxed);
    instance = internal_error("model threw an unknown exception in create_instance");
  }
  if (!instance.ok()) {
    return instance.status().with_context("worker " + std::to_string(w.index) + ": model '" +
                                          model_->name() + "' on " + device_->name());
  }
  w.stream = std::move(*stream);
  w.caller_stream = caller_stream;
  w.instance = std::move(*instance);
  return Status();
}

Executor* EngineCore::completion_point_executor() {
  // The completion point enqueues copies, records events and frees the batch's device memory:
  // it runs on the thread that reaches it in the stream only where that thread may call the
  // device (DeviceCapabilities::host_funcs_may_call_device); elsewhere the dispatcher runs it.
  return device_->capabilities().host_funcs_may_call_device ? static_cast<Executor*>(&inline_)
                                                            : &dispatcher_;
}

void EngineCore::worker_loop(Worker& w) {
  detail::setup_thread("ai-worker-" + std::to_string(w.index));
  for (;;) {
    std::int64_t cap = max_rows_;
    bool do_recycle = false;
    {
      std::unique_lock lock(w.mu);
      for (;;) {
        // Leave at once when cancelling (shutdown(cancel), or a drain that ended), whatever else is
        // pending (a recycle, a backoff, a breaker cool-down): nothing is left for this worker to
        // do.
        if (cancelling()) return;
        if (w.gave_up) {
          // Unhealthy for good: serves nothing and waits for shutdown.
          if (!accepting()) return;
          w.cv.wait(lock);
          continue;
        }
        if (w.recycle) {
          // Replacing an instance abandons the old one: only within the limit (header).
          if (w.abandoned > 0 && w.abandoned >= opt_.recovery.max_abandoned_instances) {
            w.cv.wait(lock);  // the reaper notifies when an abandoned instance is destroyed
            continue;
          }
          if (Clock::now() < w.next_recycle) {
            w.cv.wait_until(lock, w.next_recycle);  // backoff after a failed attempt
            continue;
          }
          do_recycle = true;
          break;
        }
        if (w.abandoned > opt_.recovery.max_abandoned_instances) {
          w.cv.wait(lock);  // max_abandoned_instances 0: the replaced instance's work first
          continue;
        }
        const std::optional<int> limit =
            w.breaker.admit(opt_.max_inflight_per_worker, Clock::now());
        if (!limit) {
          w.cv.wait_until(lock, w.breaker.open_until());  // the cool-down
          continue;
        }
        if (w.inflight < *limit) {
          if (w.breaker.state() == Breaker::half_open) cap = 1;  // probe with one request
          break;
        }
        w.cv.wait(lock);
      }
    }
    if (do_recycle) {
      recycle(w);
      continue;
    }
    std::shared_ptr<Batch> batch =
        scheduler_.next_batch({w.index, cap, &w.recycle_wanted, w.breaker.open_flag()});
    if (!batch) {
      if (cancelling()) return;
      // A recycle, or a breaker that opened while the worker waited for work: back to the
      // loop above, which handles them.
      if (w.recycle_wanted.load(std::memory_order_acquire)) continue;
      if (w.breaker.open_flag()->load(std::memory_order_acquire)) continue;
      return;
    }
    launch(w, batch);
    if (w.caller_stream != nullptr) w.caller_stream->run_pending();  // the inline path
  }
}

void EngineCore::launch(Worker& w, const std::shared_ptr<Batch>& batch) {
  {
    std::lock_guard lock(w.mu);
    batch->generation = w.generation;
    ++w.inflight;
    w.running.push_back(batch);
  }
  const Clock::time_point now = Clock::now();
  batch->dispatched = now;
  for (const auto& r : batch->requests) {
    ++r->attempts;
    queue_us_.observe(detail::us_between(r->enqueued, now));
    r->queue_ns += detail::ns_between(r->waiting_since, now);
  }
  attempts_.fetch_add(batch->requests.size(), std::memory_order_relaxed);
  auto io = std::make_shared<BatchIO>();
  batch->io = io;
  io->stop = batch->stop.get_token();
  Status s = assemble(w, *batch, *io);
  batch->inputs_ready = Clock::now();
  if (s.ok() && batch->requests.empty()) {  // every request failed in assembly
    end_without_running(w, batch, Status());
    return;
  }
  if (s.ok()) {
    if (sig_.decoupled)
      io->responses = std::make_shared<BatchResponseSender>(*this, batch->requests);
    batches_.fetch_add(1, std::memory_order_relaxed);
    w.batches.fetch_add(1, std::memory_order_relaxed);
    batch_size_.observe(static_cast<double>(batch->rows));
    // On the stream from here until its completion point runs (or it never gets one).
    batch->on_stream.store(true, std::memory_order_relaxed);
    w.stream_batches.fetch_add(1, std::memory_order_relaxed);
    try {
      s = w.instance->enqueue(*w.stream, io);
    } catch (const std::exception& e) {
      model_exceptions_.fetch_add(1, std::memory_order_relaxed);
      s = internal_error(std::string("model threw during enqueue: ") + e.what());
    } catch (...) {
      model_exceptions_.fetch_add(1, std::memory_order_relaxed);
      s = internal_error("model threw an unknown exception during enqueue");
    }
    if (!s.ok()) s = s.with_context("model '" + model_->name() + "'");
  }
  if (s.ok() && !unified_) s = enqueue_copies_back(w, *batch, *io);
  if (!s.ok()) {
    end_without_running(w, batch, s);
    return;
  }
  batch->compute_start = Clock::now();
  if (opt_.watchdog.count() > 0) {
    std::lock_guard wl(batch->watchdog_mu);
    batch->watchdog = timer_.add(saturating_add(batch->compute_start, opt_.watchdog),
                                 [this, batch] { on_watchdog(batch); });
  }
  s = w.stream->launch_host_func([this, batch](Status st) { on_batch_done(batch, std::move(st)); });
  if (!s.ok()) end_without_running(w, batch, s);
}

Status EngineCore::assemble(Worker& w, Batch& batch, BatchIO& io) {
  const detail::AssemblyHook hook = detail::assembly_hook();
  if (hook != nullptr) {
    std::vector<std::shared_ptr<Request>> kept;
    for (auto& r : batch.requests) {
      try {
        hook(r->inputs);
        kept.push_back(r);
      } catch (const std::exception& e) {
        fail_alone(r, internal_error(context("batch assembly failed for this request", r->tag) +
                                     ": " + e.what()));
      } catch (...) {
        fail_alone(r, internal_error(context("batch assembly failed for this request", r->tag)));
      }
    }
    if (kept.size() != batch.requests.size()) {
      batch.requests.swap(kept);
      batch.rows = 0;
      for (auto& r : batch.requests) batch.rows += r->rows;
    }
    if (batch.requests.empty()) return Status();
  }
  io.batch_size = sig_.batched ? batch.rows : 1;
  io.request_rows.reserve(batch.requests.size());
  for (const auto& r : batch.requests) io.request_rows.push_back(sig_.batched ? r->rows : 1);
  try {
    if (batch.requests.size() == 1) {
      io.host_inputs = batch.requests[0]->inputs;
    } else {
      io.host_inputs.reserve(sig_.inputs.size());
      std::vector<Tensor> parts(batch.requests.size());
      for (std::size_t i = 0; i < sig_.inputs.size(); ++i) {
        for (std::size_t j = 0; j < batch.requests.size(); ++j) {
          parts[j] = batch.requests[j]->inputs[i];
        }
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, concat_dim0(parts));
        io.host_inputs.push_back(std::move(t));
      }
    }
    if (unified_) {
      io.inputs = io.host_inputs;
    } else {
      io.inputs.reserve(io.host_inputs.size());
      for (const Tensor& h : io.host_inputs) {
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor d, device_->empty_like(h, MemoryKind::device));
        ASYNCINFER_RETURN_IF_ERROR(w.stream->copy(d, h));
        io.inputs.push_back(std::move(d));
      }
    }
  } catch (const std::exception& e) {
    return internal_error(std::string("batch assembly failed: ") + e.what());
  }
  return Status();
}

void EngineCore::fail_alone(const std::shared_ptr<Request>& r, Status s) {
  // The request is running (it was dispatched): end it here.
  const Status copy = s;
  if (!resolver_.try_resolve(r, detail::stage_for_error(s.code()), std::move(s)))
    late_failure(1, copy, *r);
}

Status EngineCore::enqueue_copies_back(Worker& w, Batch& batch, BatchIO& io) {
  if (sig_.decoupled && io.outputs.empty()) return Status();  // the final flag alone
  if (io.outputs.size() != sig_.outputs.size()) {
    return internal_error("model '" + model_->name() + "' gave " +
                          std::to_string(io.outputs.size()) + " outputs during enqueue on " +
                          device_->name() + ", its signature has " +
                          std::to_string(sig_.outputs.size()) +
                          " (on devices without unified memory the outputs must exist when "
                          "enqueue returns)");
  }
  batch.host_outputs.reserve(io.outputs.size());
  for (const Tensor& out : io.outputs) {
    if (!out.defined())
      return internal_error("model '" + model_->name() + "' left an output undefined");
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor host, device_->empty_like(out, MemoryKind::pinned_host));
    ASYNCINFER_RETURN_IF_ERROR(w.stream->copy(host, out));
    batch.host_outputs.push_back(std::move(host));
  }
  return Status();
}

void EngineCore::off_stream(Worker& w, Batch& batch) {
  if (batch.on_stream.exchange(false, std::memory_order_relaxed)) {
    w.stream_batches.fetch_sub(1, std::memory_order_relaxed);
  }
}

void EngineCore::end_without_running(Worker& w, const std::shared_ptr<Batch>& batch, Status s) {
  off_stream(w, *batch);
  if (batch->done.exchange(true)) return;
  if (!s.ok()) {
    w.failed_batches.fetch_add(1, std::memory_order_relaxed);
    breaker_failure(w, s.code());
  }
  release_slot(w, *batch);
  if (!s.ok()) batch_failed(batch, s);
  scheduler_.batch_finished();
}

void EngineCore::on_batch_done(const std::shared_ptr<Batch>& batch, Status st) {
  Worker& wk = *workers_[static_cast<std::size_t>(batch->worker)];
  off_stream(wk, *batch);
  if (batch->done.exchange(true)) {
    // The watchdog ended it first: its requests have ended; what it brings is late.
    late_outcome(*batch, st);
    return;
  }
  TimerId wd;
  {
    std::lock_guard wl(batch->watchdog_mu);
    wd = std::exchange(batch->watchdog, TimerId{});
  }
  timer_.cancel(wd);
  const Clock::time_point now = Clock::now();
  const double compute = detail::us_between(batch->compute_start, now);
  compute_us_.observe(compute);
  Worker& w = *workers_[static_cast<std::size_t>(batch->worker)];
  // The breaker is updated before the slot is freed, so a worker that just failed its probe
  // cannot take another request in between.
  if (st.ok()) {
    breaker_success(w);
  } else if (st.code() != StatusCode::aborted) {
    w.failed_batches.fetch_add(1, std::memory_order_relaxed);
    breaker_failure(w, st.code());
  }
  const bool stale = release_slot(w, *batch);
  const Clock::time_point previous(std::chrono::nanoseconds(w.last_completion_ns.exchange(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
      std::memory_order_relaxed)));
  detail::Resolver::CallbackBatch callbacks(resolver_);
  if (st.ok()) {
    complete(batch, compute, now, previous);
  } else if (stale && st.code() == StatusCode::aborted) {
    requeue_all(batch);  // its stream was replaced under it: run it again on the new one
  } else {
    batch_failed(batch, st);
  }
  scheduler_.batch_finished();
}

bool EngineCore::release_slot(Worker& w, const Batch& batch) {
  bool stale = false;
  {
    std::lock_guard lock(w.mu);
    --w.inflight;
    auto it = std::find_if(w.running.begin(), w.running.end(),
                           [&](const std::shared_ptr<Batch>& b) { return b.get() == &batch; });
    if (it != w.running.end()) w.running.erase(it);
    stale = batch.generation != w.generation;
  }
  w.cv.notify_one();
  return stale;
}

void EngineCore::complete(const std::shared_ptr<Batch>& batch, double compute_us,
                          Clock::time_point now, Clock::time_point previous) {
  const std::vector<Tensor>& outs = unified_ ? batch->io->outputs : batch->host_outputs;
  // A decoupled model's final result may carry no response: the final flag alone.
  Status check = sig_.decoupled && outs.empty() ? Status() : check_outputs(outs, batch->rows);
  if (!check.ok()) {
    batch_failed(batch, check);
    return;
  }
  scheduler_.observe_batch(compute_us, batch->requests.size());  // for admission control
  const bool split = sig_.batched && batch->requests.size() > 1;
  std::int64_t offset = 0;
  std::vector<Outputs> split_outputs(batch->requests.size());
  for (std::size_t k = 0; k < batch->requests.size(); ++k) {
    const auto& r = batch->requests[k];
    Outputs& mine = split_outputs[k];
    if (split) {
      mine.reserve(outs.size());
      for (const Tensor& o : outs) mine.push_back(*o.slice(offset, offset + r->rows));
    } else {
      mine = outs;
    }
    offset += r->rows;
  }
  // compute_output ends here, and with it each request's time (its success duration).
  const Clock::time_point split_done = Clock::now();

  // Triton's statistics, added before any request is handed over (a caller that has its result
  // sees them): each request still running is charged its batch's compute parts. compute_infer
  // starts when the batch's inputs were ready or the batch before it on the stream ended,
  // whichever is later; the wait between is queue time.
  const auto ns = detail::ns_between;
  const Clock::time_point infer_start = std::max(batch->inputs_ready, previous);
  const std::uint64_t input_ns = ns(batch->dispatched, batch->inputs_ready);
  const std::uint64_t stream_wait_ns = ns(batch->inputs_ready, infer_start);
  const std::uint64_t infer_ns = ns(infer_start, now);
  const std::uint64_t output_ns = ns(now, split_done);
  execution_count_.fetch_add(1, std::memory_order_relaxed);
  batch_stats_.add(sig_.batched ? batch->rows : 1, input_ns, infer_ns, output_ns);
  last_inference_ms_.store(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count(),
                           std::memory_order_relaxed);
  std::vector<std::uint64_t> counted(batch->requests.size(), 0);  // queue ns, +1 when counted
  std::uint64_t n = 0;
  std::uint64_t rows = 0;
  std::uint64_t queue_ns = 0;
  for (std::size_t k = 0; k < batch->requests.size(); ++k) {
    const Request& r = *batch->requests[k];
    if (r.stage.load(std::memory_order_acquire) != Stage::running) continue;
    counted[k] = r.queue_ns + stream_wait_ns + 1;
    ++n;
    rows += static_cast<std::uint64_t>(sig_.batched ? r.rows : 1);
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
    apply(inference_count_, request_rows);
    apply(stat_queue_.count, requests);
    apply(stat_queue_.ns, queued);
    for (auto [c, each] : {std::pair{&stat_input_, input_ns}, std::pair{&stat_infer_, infer_ns},
                           std::pair{&stat_output_, output_ns}}) {
      apply(c->count, requests);
      apply(c->ns, requests * each);
    }
  };
  charge(n, rows, queue_ns, true);

  for (std::size_t k = 0; k < batch->requests.size(); ++k) {
    const auto& r = batch->requests[k];
    if (!resolver_.try_resolve(r, Stage::completed, std::move(split_outputs[k]), split_done)) {
      late_completions_.fetch_add(1, std::memory_order_relaxed);
      // It ended (deadline, cancel) between the count and here: not a success after all.
      if (counted[k] != 0) {
        charge(1, static_cast<std::uint64_t>(sig_.batched ? r->rows : 1), counted[k] - 1, false);
      }
    }
  }
}

Status EngineCore::check_outputs(const std::vector<Tensor>& outs, std::int64_t rows) const {
  if (outs.size() != sig_.outputs.size()) {
    return internal_error("model '" + model_->name() + "' produced " + std::to_string(outs.size()) +
                          " outputs, its signature has " + std::to_string(sig_.outputs.size()));
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const TensorSpec& spec = sig_.outputs[i];
    const Tensor& t = outs[i];
    bool ok = t.defined() && t.is_host_accessible() && t.dtype() == spec.dtype &&
              t.rank() == spec.shape.size();
    for (std::size_t d = 0; ok && d < spec.shape.size(); ++d) {
      if (spec.shape[d] >= 0 && spec.shape[d] != t.shape()[d]) ok = false;
    }
    if (ok && sig_.batched && t.dim(0) != rows) ok = false;
    if (!ok) {
      return internal_error("model '" + model_->name() + "' returned output '" + spec.name +
                            "' as " + t.describe() + " but its signature says " +
                            std::string(to_string(spec.dtype)) + shape_to_string(spec.shape) +
                            (sig_.batched ? " with " + std::to_string(rows) + " rows" : ""));
    }
    if (t.dtype() == DType::bytes) {
      // The model wrote the elements after the tensor was made: check them once here, so that
      // splitting the batch and every encoder may walk them.
      auto size = serialized_bytes_size(t.data(), t.byte_size(), t.numel());
      if (!size.ok() || *size != t.byte_size()) {
        return internal_error("model '" + model_->name() + "' returned BYTES output '" +
                              spec.name + "' whose elements are malformed: " +
                              (size.ok() ? std::to_string(t.byte_size() - *size) +
                                               " bytes follow the last element"
                                         : std::string(size.status().message())));
      }
    }
  }
  return Status();
}

}  // namespace asyncinfer
