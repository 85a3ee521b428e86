// The Resolver (resolver.hpp): ending a request once, its bookkeeping, and delivering its result.
#include "engine/resolver.hpp"

#include <utility>

#include "asyncinfer/detail/chrono.hpp"

namespace asyncinfer::detail {

namespace {
/// The CallbackBatch alive on this thread, if any.
thread_local Resolver::CallbackBatch* tl_callbacks = nullptr;

/// The ordered delivery this thread is running user code for, if any (drain_order): which
/// resolver, which key, and the number of the request being delivered.
struct OrderedDrain {
  const Resolver* resolver = nullptr;
  const std::string* key = nullptr;
  std::uint64_t delivering = 0;
};
thread_local const OrderedDrain* tl_drain = nullptr;
}  // namespace

Resolver::Resolver(const EngineOptions& o, Scheduler& scheduler, DeadlineTimer& timer,
                   Executor& completion)
    : ordered_(o.ordered_delivery),
      scheduler_(scheduler),
      timer_(timer),
      completion_(completion),
      store_(o.result_store_capacity, o.result_ttl) {}

// ---- accepting ----------------------------------------------------------------------------------

void Resolver::admit(const std::shared_ptr<Request>& r) {
  if (ordered_) r->order_seq = order_.assign(r->sequence_key);
  inflight_requests_.fetch_add(1, std::memory_order_relaxed);
  if (r->deadline != Clock::time_point::max()) {
    // If it fires at once, its handler (try_resolve → Scheduler::withdraw) waits for the
    // scheduler's mutex, held by our caller, so for the request to be queued.
    std::lock_guard tl(r->timer_mu);
    r->deadline_timer = timer_.add(r->deadline, [this, r] { on_deadline(r); });
  }
}

void Resolver::bind_promise(Promise<Outputs>& p, const std::shared_ptr<Request>& r,
                            bool inline_continuations, std::weak_ptr<const void> owner) {
  if (!ordered_) {
    if (!inline_continuations) p.set_callback_executor(&completion_);
    return;
  }
  p.set_wait_check([this, owner = std::move(owner), weak = std::weak_ptr<Request>(r)]() -> Status {
    if (tl_drain == nullptr) return Status();  // the common case: not inside a delivery
    auto alive = owner.lock();
    auto req = weak.lock();
    return alive && req ? ordered_wait_would_never_end(*req) : Status();
  });
}

Status Resolver::ordered_wait_would_never_end(const Request& r) const {
  const OrderedDrain* d = tl_drain;
  if (d == nullptr || d->resolver != this || r.sequence_key != *d->key) return Status();
  // order_seq is written by admit() before the stage leaves `submitting` (release): read it
  // only after seeing that. A request still being submitted (by id, on another thread) has no
  // number yet: its wait is not refused.
  if (r.stage.load(std::memory_order_acquire) == Stage::submitting) return Status();
  if (r.order_seq <= d->delivering) return Status();
  return failed_precondition_error(
      with_tag("waiting, inside the ordered callback of request #" + std::to_string(d->delivering) +
                   " of sequence key '" + r.sequence_key + "', for its later request #" +
                   std::to_string(r.order_seq) +
                   ", which is delivered only after that callback returns (EngineOptions::"
                   "ordered_delivery): the wait could never end, so it returns at once",
               r.tag));
}

// ---- ending -------------------------------------------------------------------------------------

bool Resolver::try_resolve(const std::shared_ptr<Request>& r, Stage to, Result<Outputs> result,
                           Clock::time_point now) {
  std::shared_ptr<Request> withdrawn;  // the scheduler's reference, dropped after finish()
  // Sequence engines: the rest of a backlogged sequence that expired with `r` (Scheduler::
  // withdraw), already moved to `to`.
  std::vector<std::shared_ptr<Request>> also;
  bool expired = false;
  for (;;) {
    Stage cur = r->stage.load(std::memory_order_acquire);
    if (is_final(cur)) return false;
    if (cur == Stage::running) {
      if (!transition_running(*r, to)) continue;
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
    const Withdrawal w = scheduler_.withdraw(r, to, why, withdrawn, &also, &expired);
    if (w == Withdrawal::refused) return true;  // its submit refuses it: no finish
    if (w == Withdrawal::already_refused) return false;
    if (w == Withdrawal::from_retry_wait) {
      TimerId id;
      {
        std::lock_guard tl(r->timer_mu);
        id = std::exchange(r->retry_timer, TimerId{});
      }
      timer_.cancel(id);
    }
    if (w != Withdrawal::not_waiting) break;
    // running or ended meanwhile: look again
  }
  if (expired) {
    result = SequenceTable::backlog_expired();
    for (const auto& p : also) finish(p, to, SequenceTable::backlog_expired(), now);
  }
  finish(r, to, std::move(result), now);
  return true;
}

void Resolver::on_deadline(const std::shared_ptr<Request>& r) {
  const Stage at = r->stage.load(std::memory_order_acquire);
  const char* where = at == Stage::running      ? "while running"
                      : at == Stage::retry_wait ? "while waiting to retry"
                                                : "while queued";
  std::string msg = with_tag("request timed out", r->tag) + " after " +
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

void Resolver::finish(const std::shared_ptr<Request>& r, Stage to, Result<Outputs>&& result,
                      Clock::time_point now) {
  TimerId deadline;
  {
    std::lock_guard tl(r->timer_mu);
    deadline = std::exchange(r->deadline_timer, TimerId{});
  }
  timer_.cancel(deadline);
  if (now == Clock::time_point{}) now = Clock::now();
  request_us_.observe(us_between(r->submitted, now));
  (to == Stage::completed ? stat_success_ : stat_fail_).add(1, ns_between(r->submitted, now));
  outcomes_.count(outcome_of(to));
  if (!result.ok()) {
    std::lock_guard lock(reasons_mu_);
    failures_by_reason_[std::string(to_string(result.status().code()))]++;
  }
  inflight_requests_.fetch_sub(1, std::memory_order_relaxed);
  if (!r->id.empty()) store_.mark_finished(*r);
  if (ordered_) {
    deliver_ordered(r, std::move(result));
  } else {
    run_sink(r, std::move(result));
  }
}

void Resolver::post(Task task) {
  if (!completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
}

void Resolver::run_sink(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
  if (r->has_callback) {
    if (r->inline_callback) {  // a hand-off: run here (RequestOptions::inline_callback)
      invoke_callback(*r, result);
      return;
    }
    if (tl_callbacks != nullptr && &tl_callbacks->resolver_ == this) {
      tl_callbacks->pending_.push_back(Pending{r, std::move(result)});  // posted with its batch
      return;
    }
    queued_callbacks_.fetch_add(1, std::memory_order_relaxed);
    post(Task([this, r, res = std::move(result)]() mutable {
      invoke_callback(*r, res);
      queued_callbacks_.fetch_sub(1, std::memory_order_relaxed);
    }));
  } else if (r->promise) {
    r->promise->set_result(std::move(result));
  }
}

void Resolver::invoke_callback(Request& r, const Result<Outputs>& result) {
  try {
    r.callback(result);
  } catch (...) {
    callback_exceptions_.fetch_add(1, std::memory_order_relaxed);
    report_callback_exception("engine callback", std::current_exception());
  }
  r.callback = nullptr;  // release what it captured, here on the completion thread
}

Resolver::CallbackBatch::CallbackBatch(Resolver& resolver)
    : resolver_(resolver), prev_(tl_callbacks) {
  tl_callbacks = this;
}

Resolver::CallbackBatch::~CallbackBatch() {
  tl_callbacks = prev_;
  if (pending_.empty()) return;
  const auto n = static_cast<std::int64_t>(pending_.size());
  resolver_.queued_callbacks_.fetch_add(n, std::memory_order_relaxed);
  resolver_.post(Task([&resolver = resolver_, pending = std::move(pending_), n]() mutable {
    for (Pending& p : pending) resolver.invoke_callback(*p.request, p.result);
    resolver.queued_callbacks_.fetch_sub(n, std::memory_order_relaxed);
  }));
}

// ---- ordered delivery ---------------------------------------------------------------------------

void Resolver::deliver_ordered(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
  // The key's running drain, if any, delivers it.
  if (!order_.add(r->sequence_key, r->order_seq, Pending{r, std::move(result)})) return;
  post(Task([this, key = r->sequence_key] { drain_order(key); }));
}

void Resolver::drain_order(const std::string& key) {
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

// ---- requests by id -----------------------------------------------------------------------------

Status Resolver::register_id(const std::shared_ptr<Request>& r) { return store_.insert(r); }

void Resolver::unregister_refused(const std::string& id, const Request* r) {
  store_.erase_refused(id, r);
}

Result<Outputs> Resolver::result(std::string_view id, std::chrono::nanoseconds timeout) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Request> r, store_.find(id));
  auto& state = *r->future_state;
  if (Status never = state.wait_would_never_end(); !never.ok()) return never;
  if (timeout == std::chrono::nanoseconds::max()) {
    state.wait();
  } else if (!state.wait_until(saturating_add(Clock::now(), timeout))) {
    return deadline_exceeded_error("request '" + std::string(id) + "' is still " +
                                   std::string(to_string(to_state(r->stage.load()))) +
                                   " after waiting " + ms_text(timeout));
  }
  return state.result();
}

RequestState Resolver::status(std::string_view id) {
  auto r = store_.find(id);
  if (!r.ok()) return RequestState::unknown;
  return to_state((*r)->stage.load(std::memory_order_acquire));
}

Status Resolver::cancel(std::string_view id, const char* message) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Request> r, store_.find(id));
  if (try_resolve(r, Stage::cancelled, cancelled_error(with_tag(message, r->tag)))) {
    return Status();
  }
  return failed_precondition_error("request '" + std::string(id) + "' has already ended (" +
                                   std::string(to_string(to_state(r->stage.load()))) + ")");
}

// ---- counters -----------------------------------------------------------------------------------

void Resolver::add_metrics(EngineMetrics& m) const {
  m.completed = outcomes_.completed.load();
  m.failed = outcomes_.failed.load();
  m.timed_out = outcomes_.timed_out.load();
  m.cancelled = outcomes_.cancelled.load();
  m.shut_down = outcomes_.shut_down.load();
  {
    std::lock_guard lock(reasons_mu_);
    m.failures_by_reason = failures_by_reason_;
  }
  m.callback_exceptions = callback_exceptions_.load();
  m.inflight_requests = inflight_requests_.load();
  m.result_store_size = static_cast<std::int64_t>(store_.size());
  if (ordered_) {
    constexpr std::size_t kMaxKeys = 64;  // bounded: keys may be one per client
    order_.backlog(m.ordered_backlog_total, m.ordered_backlog, kMaxKeys);
  }
  m.request_us = request_us_.snapshot();
  m.stats.success = stat_success_.load();
  m.stats.fail = stat_fail_.load();
}

}  // namespace asyncinfer::detail
