// EngineCore's own part: submit, resolve (ending a request exactly once) and shutdown. The
// threads, the other parts and the locks are described in engine_core.hpp; the request life
// cycle in request.hpp; the engine life cycle (EngineState) in engine_core.hpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "asyncinfer/detail/chrono.hpp"
#include "engine/engine_core.hpp"
#include "engine/test_hooks.hpp"

namespace asyncinfer {

using detail::Batch;
using detail::deadline_after;
using detail::ms_text;
using detail::Pending;
using detail::Request;
using detail::saturating_add;
using detail::Stage;
using detail::Worker;

namespace {
/// The CallbackBatch alive on this thread, if any.
thread_local EngineCore::CallbackBatch* tl_callbacks = nullptr;

/// The ordered delivery this thread is running user code for, if any (drain_order): which
/// engine, which key, and the number of the request being delivered.
struct OrderedDrain {
  const EngineCore* core = nullptr;
  const std::string* key = nullptr;
  std::uint64_t delivering = 0;
};
thread_local const OrderedDrain* tl_drain = nullptr;
}  // namespace

Status EngineCore::ordered_wait_would_never_end(const Request& r) const {
  const OrderedDrain* d = tl_drain;
  if (d == nullptr || d->core != this || r.sequence_key != *d->key) return Status();
  // order_seq is written by accept() before the stage leaves `submitting` (release): read it
  // only after seeing that. A request still being submitted (by id, on another thread) has no
  // number yet: its wait is not refused.
  if (r.stage.load(std::memory_order_acquire) == Stage::submitting) return Status();
  if (r.order_seq <= d->delivering) return Status();
  return failed_precondition_error(
      context("waiting, inside the ordered callback of request #" + std::to_string(d->delivering) +
                  " of sequence key '" + r.sequence_key + "', for its later request #" +
                  std::to_string(r.order_seq) +
                  ", which is delivered only after that callback returns (EngineOptions::"
                  "ordered_delivery): the wait could never end, so it returns at once",
              r.tag));
}

void EngineCore::add_ordered_wait_check(Promise<Outputs>& p, const std::shared_ptr<Request>& r) {
  if (!opt_.ordered_delivery) return;
  p.set_wait_check([core = weak_from_this(), weak = std::weak_ptr<Request>(r)]() -> Status {
    if (tl_drain == nullptr) return Status();  // the common case: not inside a delivery
    auto c = core.lock();
    auto req = weak.lock();
    return c && req ? c->ordered_wait_would_never_end(*req) : Status();
  });
}

EngineCore::EngineCore(std::shared_ptr<Model> model, std::shared_ptr<Device> device,
                       EngineOptions options, std::int64_t max_rows)
    : model_(std::move(model)),
      device_(std::move(device)),
      opt_(std::move(options)),
      sig_(model_->signature()),
      max_rows_(max_rows),
      unified_(device_->info().unified_memory),
      inline_path_(device_->kind() == DeviceKind::cpu && opt_.watchdog.count() == 0),
      started_(Clock::now()),
      completion_(static_cast<std::size_t>(opt_.completion_threads), "ai-callback"),
      dispatcher_(1, "ai-dispatch"),
      timer_("ai-timer"),
      reaper_(reaper_threads(opt_), "ai-reaper"),
      scheduler_(opt_, sig_.batched),
      store_(opt_.result_store_capacity, opt_.result_ttl) {}

EngineCore::~EngineCore() { shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0)); }

std::size_t EngineCore::reaper_threads(const EngineOptions& o) {
  const int per_worker = std::max(1, o.recovery.max_abandoned_instances);
  return static_cast<std::size_t>(std::clamp(o.workers * per_worker, 1, 64));
}

// ---- submission ---------------------------------------------------------------------------------

Status EngineCore::start() {
  const int threads = std::max(1, opt_.intra_op_threads);  // resolved by Engine::create
  for (int i = 0; i < opt_.workers; ++i) {
    auto w = std::make_unique<Worker>();
    w->index = i;
    ASYNCINFER_RETURN_IF_ERROR(make_stream_and_instance(*w, threads));
    workers_.push_back(std::move(w));
  }
  intra_op_threads_ = threads;
  live_workers_.store(opt_.workers, std::memory_order_relaxed);
  for (auto& w : workers_) {
    Worker* wp = w.get();
    wp->thread = std::jthread([this, wp] { worker_loop(*wp); });
  }
  return Status();
}

Result<std::shared_ptr<Request>> EngineCore::prepare(Inputs&& inputs, const RequestOptions& o) {
  if (!accepting()) {
    return unavailable_error("engine is shut down: no new requests are accepted");
  }
  Status v = validate_inputs(sig_, inputs);
  if (!v.ok()) return v.with_context(context("bad input", o.tag));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].is_host_accessible()) {
      return invalid_argument_error(context("bad input", o.tag) + ": input '" +
                                    sig_.inputs[i].name +
                                    "' is in device memory; pass host tensors");
    }
  }
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
  if (sig_.decoupled) {
    r->on_response = o.on_response;
    r->response_stop = std::stop_source();
  }
  r->deadline = effective_deadline(o, now);
  r->rows = sig_.batched ? inputs[0].dim(0) : 1;
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
  r->shape_key = detail::compute_shape_key(r->inputs, sig_.batched);
  return r;
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
  std::optional<detail::Refusal> refusal = scheduler_.accept(r, [&] {
    // Under the scheduler's mutex, before the request is queued.
    if (opt_.ordered_delivery) r->order_seq = order_.assign(r->sequence_key);
    inflight_requests_.fetch_add(1, std::memory_order_relaxed);
    submitted_.fetch_add(1, std::memory_order_relaxed);
    if (r->deadline != Clock::time_point::max()) {
      // If it fires at once, its handler (try_resolve → Scheduler::withdraw) waits for the
      // scheduler's mutex, so for the request to be queued.
      std::lock_guard tl(r->timer_mu);
      r->deadline_timer = timer_.add(r->deadline, [this, r] { on_deadline(r); });
    }
  });
  if (refusal) return reject(refusal->reason, std::move(refusal->status));
  return Status();
}

Status EngineCore::reject(const char* reason, Status s) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(reasons_mu_);
  rejections_by_reason_[reason]++;
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
  if (!o.inline_callback) set_callback_executor(*r->promise);
  add_ordered_wait_check(*r->promise, r);
  r->promise->on_cancel([weak_core = weak_from_this(), weak_r = std::weak_ptr<Request>(r)] {
    auto core = weak_core.lock();
    auto req = weak_r.lock();
    if (core && req) {
      core->try_resolve(req, Stage::cancelled,
                        cancelled_error(core->context("cancelled by the caller", req->tag)));
    }
  });
  Status s = accept(r);
  if (!s.ok()) return s;  // refused: the future is dropped unseen
  return f;
}

void EngineCore::set_callback_executor(Promise<Outputs>& p) {
  if (!opt_.ordered_delivery) p.set_callback_executor(&completion_);
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
  set_callback_executor(*r->promise);
  add_ordered_wait_check(*r->promise, r);
  Status s = store_.insert(r);
  if (!s.ok())
    return reject(s.code() == StatusCode::already_exists ? "duplicate_id" : "store_full", s);
  if (const auto hook = detail::submit_hook()) hook(r->id);
  s = accept(r);
  if (!s.ok()) {
    store_.erase_refused(r->id, r.get());
    r->promise->set_error(s);
    return s;
  }
  return Status();
}

Result<Outputs> EngineCore::result(std::string_view id, std::chrono::nanoseconds timeout) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Request> r, store_.find(id));
  auto& state = *r->future_state;
  if (Status never = state.wait_would_never_end(); !never.ok()) return never;
  if (timeout == std::chrono::nanoseconds::max()) {
    state.wait();
  } else if (!state.wait_until(saturating_add(Clock::now(), timeout))) {
    return deadline_exceeded_error("request '" + std::string(id) + "' is still " +
                                   std::string(to_string(detail::to_state(r->stage.load()))) +
                                   " after waiting " + ms_text(timeout));
  }
  return state.result();
}

RequestState EngineCore::status(std::string_view id) {
  auto r = store_.find(id);
  if (!r.ok()) return RequestState::unknown;
  return detail::to_state((*r)->stage.load(std::memory_order_acquire));
}

Status EngineCore::cancel(std::string_view id) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Request> r, store_.find(id));
  if (try_resolve(r, Stage::cancelled,
                  cancelled_error(context("cancelled by the caller", r->tag)))) {
    return Status();
  }
  return failed_precondition_error("request '" + std::string(id) + "' has already ended (" +
                                   std::string(to_string(detail::to_state(r->stage.load()))) + ")");
}

Status EngineCore::release(std::string_view id) { return store_.release(id); }

// ---- ending a request ---------------------------------------------------------------------------

bool EngineCore::try_resolve(const std::shared_ptr<Request>& r, Stage to, Result<Outputs> result,
                             Clock::time_point now) {
  std::shared_ptr<Request> withdrawn;  // the scheduler's reference, dropped after finish()
  for (;;) {
    Stage cur = r->stage.load(std::memory_order_acquire);
    if (detail::is_final(cur)) return false;
    if (cur == Stage::running) {
      if (!detail::transition_running(*r, to)) continue;
      if (r->on_response) {
        // Decoupled: a send blocked on its receiver returns; one in progress ends first.
        r->response_stop.request_stop();
        std::lock_guard gate(r->response_mu);
      }
      if (to != Stage::completed) {
        // Ended early: once every request of its batch has, stop the batch's device work.
        if (auto b = r->batch.lock()) {
          if (b->live.fetch_sub(1, std::memory_order_acq_rel) == 1) b->stop.request_stop();
        }
      }
      break;
    }
    const Status why =
        result.ok() ? internal_error("request ended before it was accepted") : result.status();
    const detail::Withdrawal w = scheduler_.withdraw(r, to, why, withdrawn);
    if (w == detail::Withdrawal::refused) return true;  // its submit refuses it: no finish
    if (w == detail::Withdrawal::already_refused) return false;
    if (w == detail::Withdrawal::from_retry_wait) {
      TimerId id;
      {
        std::lock_guard tl(r->timer_mu);
        id = std::exchange(r->retry_timer, TimerId{});
      }
      timer_.cancel(id);
    }
    if (w != detail::Withdrawal::not_waiting) break;
    // running or ended meanwhile: look again
  }
  finish(r, to, std::move(result), now);
  return true;
}

void EngineCore::finish(const std::shared_ptr<Request>& r, Stage to, Result<Outputs>&& result,
                        Clock::time_point now) {
  TimerId deadline;
  {
    std::lock_guard tl(r->timer_mu);
    deadline = std::exchange(r->deadline_timer, TimerId{});
  }
  timer_.cancel(deadline);
  if (now == Clock::time_point{}) now = Clock::now();
  request_us_.observe(detail::us_between(r->submitted, now));
  (to == Stage::completed ? stat_success_ : stat_fail_)
      .add(1, detail::ns_between(r->submitted, now));
  outcomes_.count(detail::outcome_of(to));
  if (!result.ok()) {
    std::lock_guard lock(reasons_mu_);
    failures_by_reason_[std::string(to_string(result.status().code()))]++;
  }
  inflight_requests_.fetch_sub(1, std::memory_order_relaxed);
  if (!r->id.empty()) store_.mark_finished(*r);
  if (opt_.ordered_delivery) {
    deliver_ordered(r, std::move(result));
  } else {
    run_sink(r, std::move(result));
  }
}

void EngineCore::run_sink(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
  if (r->has_callback) {
    if (r->inline_callback) {  // a hand-off: run here (RequestOptions::inline_callback)
      invoke_callback(*r, result);
      return;
    }
    if (tl_callbacks != nullptr && &tl_callbacks->core_ == this) {
      tl_callbacks->pending_.push_back(Pending{r, std::move(result)});  // posted with its batch
      return;
    }
    Task task([this, r, res = std::move(result)]() mutable { invoke_callback(*r, res); });
    if (!completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
  } else if (r->promise) {
    r->promise->set_result(std::move(result));
  }
}

void EngineCore::invoke_callback(Request& r, const Result<Outputs>& result) {
  try {
    r.callback(result);
  } catch (...) {
    callback_exceptions_.fetch_add(1, std::memory_order_relaxed);
    detail::report_callback_exception("engine callback", std::current_exception());
  }
  r.callback = nullptr;  // release what it captured, here on the completion thread
}

void EngineCore::on_deadline(const std::shared_ptr<Request>& r) {
  const Stage at = r->stage.load(std::memory_order_acquire);
  const char* where = at == Stage::running      ? "while running"
                      : at == Stage::retry_wait ? "while waiting to retry"
                                                : "while queued";
  std::string msg = context("request timed out", r->tag) + " after " +
                    ms_text(Clock::now() - r->submitted) + " " + where;
  const int attempts = r->attempts.load(std::memory_order_relaxed);
  if (attempts > 0) msg += " (attempt " + std::to_string(attempts) + ")";
  Status last;
  {
    std::lock_guard tl(r->timer_mu);
    last = r->last_error;
  }
  if (!last.ok() && at != Stage::running) msg += "; last error: " + last.to_string();
  try_resolve(r, Stage::timed_out, deadline_exceeded_error(msg));
}

EngineCore::CallbackBatch::CallbackBatch(EngineCore& core) : core_(core), prev_(tl_callbacks) {
  tl_callbacks = this;
}

EngineCore::CallbackBatch::~CallbackBatch() {
  tl_callbacks = prev_;
  if (pending_.empty()) return;
  Task task([&core = core_, pending = std::move(pending_)]() mutable {
    for (Pending& p : pending) core.invoke_callback(*p.request, p.result);
  });
  if (!core_.completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
}

// ---- ordered delivery ---------------------------------------------------------------------------

void EngineCore::deliver_ordered(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
  // The key's running drain, if any, delivers it.
  if (!order_.add(r->sequence_key, r->order_seq, Pending{r, std::move(result)})) return;
  Task task([this, key = r->sequence_key] { drain_order(key); });
  if (!completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
}

void EngineCore::drain_order(const std::string& key) {
  // User code below (callbacks, the futures' continuations) learns, through tl_drain, that it
  // runs inside this key's delivery (ordered_wait_would_never_end). Nested drains restore it.
  OrderedDrain here{this, &key, 0};
  const OrderedDrain* outer = tl_drain;
  tl_drain = &here;
  struct Restore {
    const OrderedDrain* outer;
    ~Restore() { tl_drain = outer; }
  } restore{outer};
  for (;;) {
    std::vector<Pending> run = order_.take_ready(key);
    if (run.empty()) return;
    for (Pending& p : run) {
      here.delivering = p.request->order_seq;
      if (p.request->has_callback) {
        invoke_callback(*p.request, p.result);
      } else if (p.request->promise) {
        p.request->promise->set_result(std::move(p.result));
      }
    }
  }
}

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
  if (was_running) health_changed();  // not live, so not ready, from now on
  wake_everyone();
  if (state() == EngineState::draining) {
    // Drained, timed out, or escalated by a cancel: then cancelling (Scheduler::wait_drained).
    scheduler_.wait_drained(deadline_after(drain_timeout));
    wake_everyone();
  }
  cancel_all();
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
  // Destroying the streams stops what still runs (cancellable backends) and delivers their
  // pending completion points (as aborted) to the dispatcher; their requests have ended.
  for (auto& w : workers_) {
    w->stream.reset();
    w->instance.reset();
  }
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
  if (was == EngineState::running) health_changed();
  wake_everyone();
  cancel_all();
}

void EngineCore::wake_everyone() {
  scheduler_.wake_all();
  for (auto& w : workers_) {
    { std::lock_guard lock(w->mu); }
    w->cv.notify_all();
  }
}

void EngineCore::cancel_all() {
  std::vector<std::shared_ptr<Request>> victims = scheduler_.waiting();
  for (auto& w : workers_) {
    std::lock_guard lock(w->mu);
    for (auto& b : w->running) {
      for (auto& r : b->requests) victims.push_back(r);
    }
  }
  for (auto& r : victims) {
    const bool was_running = r->stage.load(std::memory_order_acquire) == Stage::running;
    try_resolve(r, Stage::shut_down,
                aborted_error(context(was_running ? "engine shut down before the request completed"
                                                  : "engine shut down before the request ran",
                                      r->tag)));
  }
}

}  // namespace asyncinfer
