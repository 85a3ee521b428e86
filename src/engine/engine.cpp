// EngineCore's own part: start, submit and shutdown (ending a request is the Resolver's). The
// threads, the other parts and the locks are described in engine_core.hpp; the request life
// cycle in request.hpp; the engine life cycle (EngineState) in engine_core.hpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "asyncinfer/detail/chrono.hpp"
#include "engine/engine_core.hpp"
#include "engine/test_hooks.hpp"

namespace asyncinfer {

using detail::deadline_after;
using detail::Request;
using detail::saturating_add;
using detail::Stage;

namespace {
/// A sequence engine's plan (EngineOptions::sequence_batching, checked by Engine::create before);
/// unset otherwise.
std::optional<detail::SequencePlan> make_sequence_plan(const EngineOptions& opt,
                                                       const ModelSignature& sig) {
  if (!opt.sequence_batching) return std::nullopt;
  Result<detail::SequencePlan> plan = detail::SequencePlan::make(*opt.sequence_batching, sig);
  if (!plan.ok()) return std::nullopt;
  return std::move(*plan);
}

/// Which inputs of `sig` are ragged (TensorSpec::ragged); empty when none is.
std::vector<bool> ragged_inputs(const ModelSignature& sig) {
  std::vector<bool> ragged;
  for (const TensorSpec& s : sig.inputs) ragged.push_back(s.ragged);
  if (std::find(ragged.begin(), ragged.end(), true) == ragged.end()) ragged.clear();
  return ragged;
}
}  // namespace

EngineCore::EngineCore(std::shared_ptr<Model> model, std::shared_ptr<Device> device,
                       EngineOptions options, std::int64_t max_rows)
    : model_(std::move(model)),
      device_(std::move(device)),
      opt_(std::move(options)),
      sig_(model_->signature()),
      max_rows_(max_rows),
      sequence_plan_(make_sequence_plan(opt_, sig_)),
      ragged_(ragged_inputs(request_signature())),
      // The device says whether it can run a stream on the caller's thread; the engine decides
      // whether to: not with a hang watchdog, which must find the worker free to replace a hung
      // stream (worker.hpp), nor for a model whose instances gain from a batch launched while
      // one runs (Model::pipelined_batches).
      inline_path_(device_->capabilities().caller_run_streams && opt_.watchdog.count() == 0 &&
                   model_->pipelined_batches() == 0),
      // Where a caller may run a request alone and at once, as a worker would
      // (RequestOptions::caller_run_max_compute); Scheduler::accept decides the rest.
      caller_run_(
          detail::CallerRun::applies(inline_path_, sig_, opt_, model_->supports_caller_runs()),
          model_->name()),
      started_(Clock::now()),
      completion_(static_cast<std::size_t>(opt_.completion_threads), "ai-callback"),
      dispatcher_(1, "ai-dispatch"),
      timer_("ai-timer"),
      reaper_(reaper_threads(opt_), "ai-reaper"),
      scheduler_(opt_, sig_.batched),
      resolver_(opt_, scheduler_, timer_, completion_),
      ctx_(*model_, *device_, opt_, sig_, sequence_plan_ ? &*sequence_plan_ : nullptr, max_rows_,
           inline_path_, dispatcher_, timer_, reaper_, scheduler_, resolver_) {}

EngineCore::~EngineCore() { shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0)); }

std::size_t EngineCore::reaper_threads(const EngineOptions& o) {
  const int per_worker = std::max(1, o.recovery.max_abandoned_instances);
  return static_cast<std::size_t>(std::clamp(o.workers * per_worker, 1, 64));
}

// ---- submission ---------------------------------------------------------------------------------

Status EngineCore::start() {
  const int threads = std::max(1, opt_.intra_op_threads);  // resolved by Engine::create
  for (int i = 0; i < opt_.workers; ++i) {
    auto w = std::make_unique<Worker>(i, threads, ctx_);
    ASYNCINFER_RETURN_IF_ERROR(w->open());
    workers_.push_back(std::move(w));
  }
  ctx_.counters.live_workers.store(opt_.workers, std::memory_order_relaxed);
  // The completion threads spin before sleeping under the workers' policy (Worker::loop).
  completion_.spin_before_sleep(ctx_.spin.budget(), [this] {
    return ctx_.spin.worth_spinning(resolver_.undelivered(), opt_.workers);
  });
  for (auto& w : workers_) w->start();
  return Status();
}

Result<std::shared_ptr<Request>> EngineCore::prepare(Inputs&& inputs, const RequestOptions& o) {
  if (!accepting()) {
    return unavailable_error("engine is shut down: no new requests are accepted");
  }
  const ModelSignature& given = sequence_plan_ ? sequence_plan_->request_signature : sig_;
  Status v = validate_inputs(given, inputs);
  if (!v.ok()) return v.with_context(context("bad input", o.tag));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && !inputs[i].is_host_accessible()) {
      return invalid_argument_error(context("bad input", o.tag) + ": input '" +
                                    given.inputs[i].name +
                                    "' is in device memory; pass host tensors");
    }
  }
  if (Status s = check_sequence(inputs, o); !s.ok()) return s;
  if (sig_.decoupled && !o.on_response) {
    return invalid_argument_error(context("bad option", o.tag) + ": model '" + model_->name() +
                                  "' is decoupled (it sends many responses per request): set "
                                  "RequestOptions::on_response to receive them");
  }
  int level = o.priority == 0 ? opt_.default_priority : o.priority;
  if (level < 1 || level > opt_.priority_levels) {
    return invalid_argument_error(context("bad option", o.tag) + ": priority " +
                                  std::to_string(o.priority) + " is outside 1.." +
                                  std::to_string(opt_.priority_levels) +
                                  " (1 = highest; 0 = the engine's default)");
  }
  auto r = std::make_shared<Request>();
  const Clock::time_point now = Clock::now();
  r->submitted = now;
  r->level = level - 1;
  r->tag = o.tag;
  r->sequence_key = o.sequence_key;
  r->sequence_flags = o.sequence;
  r->context = o.context;
  r->timeline = o.timeline;
  if (o.sequence && r->sequence_key.empty()) {
    // Delivered in the sequence's order (Engine::create turns ordered delivery on).
    r->sequence_key = (std::holds_alternative<std::string>(o.sequence->id) ? "s:" : "u:") +
                      to_string(o.sequence->id);
  }
  if (sig_.decoupled) {
    r->on_response = o.on_response;
    r->response_stop = std::stop_source();
  }
  r->deadline = effective_deadline(o, now);
  r->caller_run_max = caller_run_.bound(o);
  r->rows = sig_.batched ? detail::request_rows(inputs) : 1;
  // Guarantee 6: the caller may overwrite its buffers once submit returns. A tensor still
  // referenced elsewhere is copied; one moved in is used as it is.
  bool copied = false;
  for (Tensor& t : inputs) {
    if (t.storage().use_count() > 1) {
      auto copy = t.clone();
      if (!copy.ok()) return copy.status().with_context(context("copying input", o.tag));
      t = std::move(*copy);
      copied = true;
    }
  }
  // When the request enters the queue, unless its submit waits for room (accept()): a moment
  // from now, so the clock is read again only when a copy took time.
  r->enqueued = copied ? Clock::now() : now;
  r->waiting_since = r->enqueued;
  r->inputs = std::move(inputs);
  r->ragged = ragged_.empty() ? nullptr : &ragged_;
  r->shape_key = detail::compute_shape_key(r->inputs, sig_.batched, r->ragged);
  return r;
}

Status EngineCore::check_sequence(const Inputs& inputs, const RequestOptions& o) const {
  if (!sequence_plan_) {
    if (!o.sequence) return Status();
    return invalid_argument_error(context("bad option", o.tag) + ": model '" + model_->name() +
                                  "' has no sequence batching: RequestOptions::sequence must be "
                                  "unset");
  }
  // Triton's wording (sequence_batch_scheduler.cc, sequence extension).
  const std::string& model = sequence_plan_->model_name;
  const auto* n = o.sequence ? std::get_if<std::uint64_t>(&o.sequence->id) : nullptr;
  const auto* text = o.sequence ? std::get_if<std::string>(&o.sequence->id) : nullptr;
  if (!o.sequence || (n != nullptr && *n == 0) || (text != nullptr && text->empty())) {
    return invalid_argument_error("inference request to model '" + model +
                                  "' must specify a non-zero or non-empty correlation ID");
  }
  if (sig_.batched && detail::request_rows(inputs) != 1) {
    return invalid_argument_error("inference request to model '" + model +
                                  "' must specify batch-size 1 due to requirements of sequence "
                                  "batcher");
  }
  if (text != nullptr) {
    for (const SequenceControl& c : sequence_plan_->controls) {
      if (c.kind == SequenceControl::Kind::corrid && c.dtype != DType::bytes) {
        return invalid_argument_error(
            "sequence batching control '" + c.input + "' of model '" + model +
            "' has an integer data type (" + std::string(to_string(c.dtype)) +
            "), but the request's correlation ID is a string ('" + *text + "')");
      }
    }
  }
  return Status();
}

Clock::time_point EngineCore::effective_deadline(const RequestOptions& o,
                                                 Clock::time_point now) const {
  std::optional<std::chrono::microseconds> timeout = o.timeout;
  if (opt_.default_timeout) {
    if (!timeout || (!opt_.allow_timeout_override && *timeout > *opt_.default_timeout)) {
      timeout = opt_.default_timeout;  // a request may only shorten the engine's default
    }
  }
  Clock::time_point d = Clock::time_point::max();
  if (timeout) d = saturating_add(now, *timeout);  // a negative timeout is already past
  if (timeout && timeout->count() <= 0) d = now;
  if (o.deadline && *o.deadline < d) d = *o.deadline;
  return d;
}

Status EngineCore::accept(const std::shared_ptr<Request>& r) {
  detail::Lent lent;
  std::optional<detail::Refusal> refusal = scheduler_.accept(
      r,
      [&] {
        // Under the scheduler's mutex, before the request is queued.
        resolver_.admit(r);
        ctx_.counters.submitted.fetch_add(1, std::memory_order_relaxed);
      },
      r->caller_run_max.count() > 0 ? &lent : nullptr);
  if (refusal) return reject(refusal->reason, std::move(refusal->status));
  if (lent.batch) {
    // A worker asleep on an empty queue, lent to this thread: its batch runs here, no wake-up.
    caller_run_.run(
        r->caller_run_max,
        [&] { workers_[static_cast<std::size_t>(lent.worker)]->run_lent(lent.batch); },
        [&] { scheduler_.give_back(lent.worker); });
  }
  return Status();
}

Status EngineCore::reject(const char* reason, Status s) {
  ctx_.counters.count_rejection(reason);
  return s;
}

Future<Outputs> EngineCore::submit_future(Inputs&& inputs, const RequestOptions& o) {
  Result<Future<Outputs>> f = try_submit_future(std::move(inputs), o);
  if (!f.ok()) return make_ready_future<Outputs>(f.status());
  return std::move(*f);
}

Result<Future<Outputs>> EngineCore::try_submit_future(Inputs&& inputs, const RequestOptions& o) {
  auto prepared = prepare(std::move(inputs), o);
  if (!prepared.ok()) return reject("bad_request", prepared.status());
  std::shared_ptr<Request> r = std::move(*prepared);
  r->promise.emplace();
  Future<Outputs> f = r->promise->get_future();
  resolver_.bind_promise(*r->promise, r, o.inline_callback, weak_from_this());
  r->promise->on_cancel([weak_core = weak_from_this(), weak_r = std::weak_ptr<Request>(r)] {
    auto core = weak_core.lock();
    auto req = weak_r.lock();
    if (core && req) {
      core->resolver_.try_resolve(
          req, Stage::cancelled,
          cancelled_error(core->context("cancelled by the caller", req->tag)));
    }
  });
  Status s = accept(r);
  if (!s.ok()) return s;  // refused: the future is dropped unseen
  return f;
}

Status EngineCore::submit_callback(Inputs&& inputs, Engine::Callback&& cb,
                                   const RequestOptions& o) {
  auto prepared = prepare(std::move(inputs), o);
  if (!prepared.ok()) return reject("bad_request", prepared.status());
  std::shared_ptr<Request> r = std::move(*prepared);
  r->callback = std::move(cb);
  r->has_callback = true;
  r->inline_callback = o.inline_callback && !opt_.ordered_delivery;
  Status s = accept(r);
  if (!s.ok()) r->callback = nullptr;  // refused: destroyed, never called
  return s;
}

Status EngineCore::submit_id(std::string&& id, Inputs&& inputs, const RequestOptions& o) {
  if (id.empty()) return reject("bad_request", invalid_argument_error("request id is empty"));
  auto prepared = prepare(std::move(inputs), o);
  if (!prepared.ok()) return reject("bad_request", prepared.status());
  std::shared_ptr<Request> r = std::move(*prepared);
  r->id = std::move(id);
  if (r->tag.empty()) r->tag = r->id;
  r->promise.emplace();
  r->future_state = r->promise->get_future().state();
  resolver_.bind_promise(*r->promise, r, /*inline_continuations=*/false, weak_from_this());
  Status s = resolver_.register_id(r);
  if (!s.ok())
    return reject(s.code() == StatusCode::already_exists ? "duplicate_id" : "store_full", s);
  if (const auto hook = detail::submit_hook()) hook(r->id);
  s = accept(r);
  if (!s.ok()) {
    resolver_.unregister_refused(r->id, r.get());
    r->promise->set_error(s);
    return s;
  }
  return Status();
}

Result<Outputs> EngineCore::result(std::string_view id, std::chrono::nanoseconds timeout) {
  return resolver_.result(id, timeout);
}

RequestState EngineCore::status(std::string_view id) { return resolver_.status(id); }

Status EngineCore::cancel(std::string_view id) {
  return resolver_.cancel(id, "cancelled by the caller");
}

Status EngineCore::release(std::string_view id) { return resolver_.release(id); }

// ---- engine life cycle and shutdown -------------------------------------------------------------

void EngineCore::shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout) {
  std::unique_lock guard(shutdown_mu_, std::try_to_lock);
  if (!guard.owns_lock()) {
    // Another thread is shutting down. A cancel escalates its drain (the queued and running
    // work ends now), then both wait for that shutdown to finish.
    if (mode == ShutdownMode::cancel) escalate_to_cancel();
    guard.lock();
  }
  if (state() == EngineState::stopped) return;
  const EngineState want =
      mode == ShutdownMode::cancel ? EngineState::cancelling : EngineState::draining;
  const bool was_running = scheduler_.begin_shutdown(want) == EngineState::running;
  if (was_running) ctx_.health_changed();  // not live, so not ready, from now on
  wake_everyone();
  if (state() == EngineState::draining) {
    // Drained, timed out, or escalated by a cancel: then cancelling (Scheduler::wait_drained).
    scheduler_.wait_drained(deadline_after(drain_timeout));
    wake_everyone();
  }
  cancel_all();
  for (auto& w : workers_) w->join();
  // Destroying the streams stops what still runs (cancellable backends) and delivers their
  // pending completion points (as aborted) to the dispatcher; their requests have ended.
  for (auto& w : workers_) w->close();
  reaper_.shutdown();
  dispatcher_.shutdown();
  completion_.shutdown();
  timer_.shutdown();
  scheduler_.stopped();
}

void EngineCore::escalate_to_cancel() {
  // Already cancelling: its shutdown cancels what is left. Running: that shutdown has not
  // changed the state yet.
  const EngineState was = scheduler_.begin_shutdown(EngineState::cancelling);
  if (was >= EngineState::cancelling) return;
  if (was == EngineState::running) ctx_.health_changed();
  wake_everyone();
  cancel_all();
}

void EngineCore::wake_everyone() {
  scheduler_.wake_all();
  for (auto& w : workers_) w->wake();
}

void EngineCore::cancel_all() {
  std::vector<std::shared_ptr<Request>> victims = scheduler_.waiting();
  for (auto& w : workers_) w->append_running(victims);
  for (auto& r : victims) {
    const bool was_running = r->stage.load(std::memory_order_acquire) == Stage::running;
    resolver_.try_resolve(
        r, Stage::shut_down,
        aborted_error(context(was_running ? "engine shut down before the request completed"
                                          : "engine shut down before the request ran",
                              r->tag)));
  }
}

}  // namespace asyncinfer
