// The engine (engine.hpp). Threads, all fixed at creation:
//   - one worker thread per worker: forms batches from the queue and enqueues them on its stream;
//   - the device's stream threads (cpu/sim: one per worker stream);
//   - one dispatcher thread: runs the streams' completion points (library code only: splits the
//     outputs, ends requests, fulfils futures — waking waiters — and hands callbacks on);
//   - completion_threads completion threads: run user callbacks and future continuations, so a
//     callback may block on another future without starving the dispatcher (docs/design.md,
//     guarantee 2);
//   - one deadline timer thread (deadlines, retry backoff, hang watchdog);
//   - reaper threads (workers × max(1, max_abandoned_instances), at most 64): destroy streams and
//     model instances replaced by the watchdog; each destruction waits for the work on that stream
//     that could not be stopped, and the worker counts it as abandoned until then.
//
// Locks: qmu_ (queue, retry set, shutdown state) → order_mu_ / budget / timer internals; worker
// mutexes are never held together with qmu_. No user code runs under any of them; messages go to
// the log hook (log.hpp) with no lock held.
//
// Worker loop (worker_loop): leaves at once when shutdown(cancel) begins (or a drain has
// finished), whatever else is pending; otherwise, in order: an unhealthy worker (it gave up)
// waits for shutdown; a pending recycle waits for its backoff and for the abandoned-instance
// limit, then replaces the stream and model instance (bounded attempts, then unhealthy); an open
// breaker waits for its cool-down; then the worker takes a batch when it has a free slot.
#include "asyncinfer/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "asyncinfer/detail/chrono.hpp"
#include "asyncinfer/log.hpp"
#include "engine/request.hpp"
#include "engine/request_queue.hpp"
#include "engine/result_store.hpp"
#include "engine/retry.hpp"
#include "engine/test_hooks.hpp"

namespace asyncinfer {

std::string_view to_string(RequestState state) noexcept {
  switch (state) {
    case RequestState::unknown:
      return "unknown";
    case RequestState::pending:
      return "pending";
    case RequestState::running:
      return "running";
    case RequestState::completed:
      return "completed";
    case RequestState::failed:
      return "failed";
    case RequestState::timed_out:
      return "timed_out";
    case RequestState::cancelled:
      return "cancelled";
    case RequestState::shut_down:
      return "shut_down";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, RequestState state) { return os << to_string(state); }

bool is_terminal(RequestState state) noexcept { return state >= RequestState::completed; }

std::string_view to_string(WorkerHealth health) noexcept {
  switch (health) {
    case WorkerHealth::healthy:
      return "healthy";
    case WorkerHealth::recovering:
      return "recovering";
    case WorkerHealth::paused:
      return "paused";
    case WorkerHealth::unhealthy:
      return "unhealthy";
  }
  return "unknown";
}

namespace detail {
namespace {
std::atomic<AssemblyHook> g_assembly_hook{nullptr};
std::atomic<SubmitHook> g_submit_hook{nullptr};
}  // namespace

inline double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// "12.5 ms" for a duration of any unit (a double conversion: max() cannot overflow).
template <class Rep, class Period>
std::string ms_text(std::chrono::duration<Rep, Period> d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f ms", std::chrono::duration<double, std::milli>(d).count());
  return buf;
}

void set_assembly_hook(AssemblyHook hook) noexcept { g_assembly_hook.store(hook); }
void set_submit_hook(SubmitHook hook) noexcept { g_submit_hook.store(hook); }
}  // namespace detail

using detail::Batch;
using detail::deadline_after;
using detail::ms_text;
using detail::Request;
using detail::saturating_add;
using detail::saturating_cast;
using detail::Stage;
using detail::us_between;

namespace {

enum class Breaker : std::uint8_t { closed, open, half_open };

struct Worker {
  int index = 0;
  std::unique_ptr<Stream> stream;  // replaced only by the worker thread (recycle)
  std::unique_ptr<ModelInstance> instance;
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;                 // under mu
  int inflight = 0;                             // under mu
  std::vector<std::shared_ptr<Batch>> running;  // under mu
  bool recycle = false;                         // under mu: a new stream + instance is needed
  std::atomic<bool> recycle_wanted{false};      // the same, readable without mu (next_batch)
  int recycle_failures = 0;                     // under mu: failed attempts in a row
  Clock::time_point next_recycle{};             // under mu: backoff after a failed attempt
  bool gave_up = false;                         // under mu: unhealthy for good
  std::string last_error;                       // under mu: why the last attempt failed
  int abandoned = 0;                            // under mu: replaced instances not yet destroyed
  Breaker breaker = Breaker::closed;            // under mu
  std::atomic<bool> breaker_open{false};        // breaker == open, readable without mu
  int consecutive_failures = 0;                 // under mu
  Clock::time_point open_until{};               // under mu
  std::atomic<std::uint64_t> batches{0};
  std::atomic<std::uint64_t> failed_batches{0};
  std::atomic<std::uint64_t> recycles{0};
  std::atomic<std::uint64_t> recycle_attempts_failed{0};
  std::atomic<std::int64_t> stream_batches{0};  // launched, completion point not yet run
  std::jthread thread;
};

struct Pending {
  std::shared_ptr<Request> request;
  Result<Outputs> result;
};

struct OrderQueue {
  std::uint64_t next_assign = 0;
  std::uint64_t next_deliver = 0;
  std::map<std::uint64_t, Pending> ready;
  bool draining = false;
};

}  // namespace

namespace {
/// Callbacks collected while a batch's requests are ended (see EngineCore::CallbackBatch).
struct Scope {
  const EngineCore* core = nullptr;
  std::vector<Pending> pending;
};
thread_local Scope* tl_callbacks = nullptr;
}  // namespace

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  EngineCore(std::shared_ptr<Model> model, std::shared_ptr<Device> device, EngineOptions options,
             std::int64_t max_rows)
      : model_(std::move(model)),
        device_(std::move(device)),
        opt_(std::move(options)),
        sig_(model_->signature()),
        max_rows_(max_rows),
        unified_(device_->info().unified_memory),
        started_(Clock::now()),
        completion_(static_cast<std::size_t>(opt_.completion_threads), "ai-callback"),
        dispatcher_(1, "ai-dispatch"),
        timer_("ai-timer"),
        reaper_(reaper_threads(opt_), "ai-reaper"),
        queue_(opt_.priority_levels),
        store_(opt_.result_store_capacity, opt_.result_ttl),
        budget_(opt_.retry),
        rng_(std::random_device{}()) {}

  ~EngineCore() { shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0)); }

  /// One reaper thread per abandoned instance the workers may hold at once (see the header).
  static std::size_t reaper_threads(const EngineOptions& o) {
    const int per_worker = std::max(1, o.recovery.max_abandoned_instances);
    return static_cast<std::size_t>(std::clamp(o.workers * per_worker, 1, 64));
  }

  Status start() {
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

  // ---- submission -------------------------------------------------------------------------

  Result<std::shared_ptr<Request>> prepare(Inputs&& inputs, const RequestOptions& o) {
    if (stopping_flag_.load(std::memory_order_acquire)) {
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
    r->deadline = effective_deadline(o, now);
    r->rows = sig_.batched ? inputs[0].dim(0) : 1;
    // Guarantee 6: the caller may overwrite its buffers once submit returns. A tensor still
    // referenced elsewhere is copied; one moved in is used as it is.
    for (Tensor& t : inputs) {
      if (t.storage().use_count() > 1) {
        auto copy = t.clone();
        if (!copy.ok()) return copy.status().with_context(context("copying input", o.tag));
        t = std::move(*copy);
      }
    }
    r->inputs = std::move(inputs);
    r->shape_key = detail::compute_shape_key(r->inputs, sig_.batched);
    return r;
  }

  Clock::time_point effective_deadline(const RequestOptions& o, Clock::time_point now) const {
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

  /// Accepts a prepared request into the queue, or refuses it (nothing registered). Acceptance
  /// is one step under qmu_: the stage leaves `submitting`, the request gets its place in the
  /// ordered-delivery sequence and in the queue. Whatever ended the request before (see
  /// request.hpp, `refusal`) makes it a refusal instead.
  Status accept(const std::shared_ptr<Request>& r) {
    std::unique_lock lock(qmu_);
    if (r->refusal) return refuse_ended(*r);
    if (stopping_) return reject("shut_down", unavailable_error("engine is shut down"));
    if (no_workers_) return reject("unavailable", *no_workers_);
    if (queue_.size() >= opt_.queue_capacity) {
      if (opt_.queue_full_policy == QueueFullPolicy::reject) {
        return reject("queue_full",
                      resource_exhausted_error(context("queue full", r->tag) + ": " +
                                               std::to_string(queue_.size()) +
                                               " requests queued (queue_capacity " +
                                               std::to_string(opt_.queue_capacity) + ")"));
      }
      // Wait for room, but not past the request's own deadline: a request whose deadline passes
      // here ends before it is accepted, so it is refused.
      const Clock::time_point until = std::min(deadline_after(opt_.submit_timeout), r->deadline);
      const auto ready = [&] {
        return stopping_ || r->refusal.has_value() || no_workers_.has_value() ||
               queue_.size() < opt_.queue_capacity;
      };
      if (detail::no_limit(until)) {
        space_cv_.wait(lock, ready);
      } else {
        space_cv_.wait_until(lock, until, ready);
      }
      if (r->refusal) return refuse_ended(*r);
      if (stopping_) return reject("shut_down", unavailable_error("engine is shut down"));
      if (no_workers_) return reject("unavailable", *no_workers_);
      if (queue_.size() >= opt_.queue_capacity) {
        if (Clock::now() >= r->deadline) {
          return reject("deadline",
                        deadline_exceeded_error(context("request timed out", r->tag) + " after " +
                                                ms_text(Clock::now() - r->submitted) +
                                                " while its submit waited for room in the queue "
                                                "(not accepted)"));
        }
        return reject("queue_full",
                      resource_exhausted_error(context("queue full", r->tag) + ": still " +
                                               std::to_string(queue_.size()) +
                                               " requests queued after waiting " +
                                               ms_text(opt_.submit_timeout) + " (submit_timeout)"));
      }
    }
    const Clock::time_point now = Clock::now();
    if (opt_.admission_control && r->deadline != Clock::time_point::max()) {
      const double service = service_us_.load(std::memory_order_relaxed);
      const double predicted_us =
          static_cast<double>(queue_.size()) * service / static_cast<double>(opt_.workers);
      const double left_us = us_between(now, r->deadline);
      if (predicted_us > left_us) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "admission control: predicted queue wait %.1f ms (%zu queued x %.3f ms "
                      "per request / %d workers) exceeds the %.1f ms left to the deadline",
                      predicted_us / 1000.0, queue_.size(), service / 1000.0, opt_.workers,
                      left_us / 1000.0);
        return reject("admission", resource_exhausted_error(context(buf, r->tag)));
      }
    }
    // Accepted from here on: nothing below can refuse it.
    r->seq = next_seq_++;
    if (opt_.ordered_delivery) {
      std::lock_guard olock(order_mu_);
      r->order_seq = orders_[r->sequence_key].next_assign++;
    }
    r->enqueued = now;
    r->stage.store(Stage::queued, std::memory_order_release);
    inflight_requests_.fetch_add(1, std::memory_order_relaxed);
    submitted_.fetch_add(1, std::memory_order_relaxed);
    if (opt_.retry.max_attempts > 1) budget_.on_request(now);
    if (r->deadline != Clock::time_point::max()) {
      // Armed under qmu_: if it fires at once, its handler waits for this push to finish.
      std::lock_guard tl(r->timer_mu);
      r->deadline_timer = timer_.add(r->deadline, [this, r] { on_deadline(r); });
    }
    queue_.push_back(r);
    lock.unlock();
    qcv_.notify_one();
    return Status();
  }

  /// The refusal of a request ended while its submit was still running (under qmu_).
  Status refuse_ended(const Request& r) {
    const Status& s = *r.refusal;
    return reject(s.code() == StatusCode::cancelled ? "cancelled" : "ended_before_accepted", s);
  }

  Status reject(const char* reason, Status s) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(reasons_mu_);
    rejections_by_reason_[reason]++;
    return s;
  }

  Future<Outputs> submit_future(Inputs&& inputs, const RequestOptions& o) {
    auto prepared = prepare(std::move(inputs), o);
    if (!prepared.ok()) {
      return make_ready_future<Outputs>(reject("bad_request", prepared.status()));
    }
    std::shared_ptr<Request> r = std::move(*prepared);
    r->promise.emplace();
    Future<Outputs> f = r->promise->get_future();
    set_callback_executor(*r->promise);
    r->promise->on_cancel([weak_core = weak_from_this(), weak_r = std::weak_ptr<Request>(r)] {
      auto core = weak_core.lock();
      auto req = weak_r.lock();
      if (core && req) {
        core->try_resolve(req, Stage::cancelled,
                          cancelled_error(core->context("cancelled by the caller", req->tag)));
      }
    });
    Status s = accept(r);
    if (!s.ok()) r->promise->set_error(std::move(s));
    return f;
  }

  /// Future continuations run on the completion executor. With ordered delivery the promise is
  /// already set on a completion thread, in order, so its continuations run right there (posting
  /// them would let two completion threads reorder them).
  void set_callback_executor(Promise<Outputs>& p) {
    if (!opt_.ordered_delivery) p.set_callback_executor(&completion_);
  }

  Status submit_callback(Inputs&& inputs, Engine::Callback&& cb, const RequestOptions& o) {
    auto prepared = prepare(std::move(inputs), o);
    if (!prepared.ok()) return reject("bad_request", prepared.status());
    std::shared_ptr<Request> r = std::move(*prepared);
    r->callback = std::move(cb);
    r->has_callback = true;
    Status s = accept(r);
    if (!s.ok()) r->callback = nullptr;  // refused: destroyed, never called
    return s;
  }

  Status submit_id(std::string&& id, Inputs&& inputs, const RequestOptions& o) {
    if (id.empty()) return reject("bad_request", invalid_argument_error("request id is empty"));
    auto prepared = prepare(std::move(inputs), o);
    if (!prepared.ok()) return reject("bad_request", prepared.status());
    std::shared_ptr<Request> r = std::move(*prepared);
    r->id = std::move(id);
    if (r->tag.empty()) r->tag = r->id;
    r->promise.emplace();
    r->future_state = r->promise->get_future().state();
    set_callback_executor(*r->promise);
    Status s = store_.insert(r);
    if (!s.ok())
      return reject(s.code() == StatusCode::already_exists ? "duplicate_id" : "store_full", s);
    if (const auto hook = detail::g_submit_hook.load(std::memory_order_relaxed)) hook(r->id);
    s = accept(r);
    if (!s.ok()) {
      store_.erase_refused(r->id, r.get());
      r->promise->set_error(s);
      return s;
    }
    return Status();
  }

  Result<Outputs> result(std::string_view id, std::chrono::nanoseconds timeout) {
    ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Request> r, store_.find(id));
    auto& state = *r->future_state;
    if (timeout == std::chrono::nanoseconds::max()) {
      state.wait();
    } else if (!state.wait_until(saturating_add(Clock::now(), timeout))) {
      return deadline_exceeded_error("request '" + std::string(id) + "' is still " +
                                     std::string(to_string(detail::to_state(r->stage.load()))) +
                                     " after waiting " + ms_text(timeout));
    }
    return state.result();
  }

  RequestState status(std::string_view id) {
    auto r = store_.find(id);
    if (!r.ok()) return RequestState::unknown;
    return detail::to_state((*r)->stage.load(std::memory_order_acquire));
  }

  Status cancel(std::string_view id) {
    ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Request> r, store_.find(id));
    if (try_resolve(r, Stage::cancelled,
                    cancelled_error(context("cancelled by the caller", r->tag)))) {
      return Status();
    }
    return failed_precondition_error("request '" + std::string(id) + "' has already ended (" +
                                     std::string(to_string(detail::to_state(r->stage.load()))) +
                                     ")");
  }

  Status release(std::string_view id) { return store_.release(id); }

  // ---- ending a request -------------------------------------------------------------------

  /// Ends `r` in stage `to` with `result` unless something else ended it first (then false).
  bool try_resolve(const std::shared_ptr<Request>& r, Stage to, Result<Outputs> result) {
    Stage cur = r->stage.load(std::memory_order_acquire);
    std::shared_ptr<Request> queue_ref;
    std::shared_ptr<Request> retry_ref;
    for (;;) {
      if (detail::is_final(cur)) return false;
      if (cur == Stage::running) {
        if (r->stage.compare_exchange_weak(cur, to, std::memory_order_acq_rel)) {
          if (to != Stage::completed) {
            // Ended early: once every request of its batch has, stop the batch's device work.
            if (auto b = r->batch.lock()) {
              if (b->live.fetch_sub(1, std::memory_order_acq_rel) == 1) b->stop.request_stop();
            }
          }
          break;
        }
        continue;
      }
      std::unique_lock lock(qmu_);
      cur = r->stage.load(std::memory_order_acquire);
      if (cur == Stage::submitting) {
        // Its submit has not accepted it yet (request.hpp): it never will. The submit refuses it
        // with this error; no terminal state, no place in the delivery order.
        if (r->refusal) return false;
        Status why =
            result.ok() ? internal_error("request ended before it was accepted") : result.status();
        r->refusal =
            Status(why.code(), std::string(why.message()) + " (before its submit accepted it)");
        lock.unlock();
        space_cv_.notify_all();  // its submit may be waiting for room
        return true;
      }
      if (cur == Stage::queued) {
        queue_ref = queue_.remove(r.get());
        r->stage.store(to, std::memory_order_release);
        lock.unlock();
        if (opt_.queue_full_policy == QueueFullPolicy::block) space_cv_.notify_one();
        if (stopping_flag_.load(std::memory_order_acquire)) notify_progress();
        break;
      }
      if (cur == Stage::retry_wait) {
        auto it = retry_waiting_.find(r.get());
        if (it != retry_waiting_.end()) {
          retry_ref = std::move(it->second);
          retry_waiting_.erase(it);
        }
        r->stage.store(to, std::memory_order_release);
        lock.unlock();
        TimerId id;
        {
          std::lock_guard tl(r->timer_mu);
          id = std::exchange(r->retry_timer, TimerId{});
        }
        timer_.cancel(id);
        if (stopping_flag_.load(std::memory_order_acquire)) notify_progress();
        break;
      }
      // running or final: go round again without the lock
    }
    finish(r, to, std::move(result));
    return true;
  }

  void finish(const std::shared_ptr<Request>& r, Stage to, Result<Outputs>&& result) {
    TimerId deadline;
    {
      std::lock_guard tl(r->timer_mu);
      deadline = std::exchange(r->deadline_timer, TimerId{});
    }
    timer_.cancel(deadline);
    const Clock::time_point now = Clock::now();
    request_us_.observe(us_between(r->submitted, now));
    switch (to) {
      case Stage::completed:
        completed_.fetch_add(1, std::memory_order_relaxed);
        break;
      case Stage::timed_out:
        timed_out_.fetch_add(1, std::memory_order_relaxed);
        break;
      case Stage::cancelled:
        cancelled_.fetch_add(1, std::memory_order_relaxed);
        break;
      case Stage::shut_down:
        shut_down_.fetch_add(1, std::memory_order_relaxed);
        break;
      default:
        failed_.fetch_add(1, std::memory_order_relaxed);
        break;
    }
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

  /// Fulfils the future (waking waiters; its continuations go to the completion executor) or
  /// hands the callback to the completion executor.
  void run_sink(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
    if (r->has_callback) {
      if (tl_callbacks != nullptr && tl_callbacks->core == this) {
        tl_callbacks->pending.push_back(Pending{r, std::move(result)});  // posted with its batch
        return;
      }
      Task task([this, r, res = std::move(result)]() mutable { invoke_callback(*r, res); });
      if (!completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
    } else if (r->promise) {
      r->promise->set_result(std::move(result));
    }
  }

  /// While alive on a thread, callbacks of this engine's requests ended on that thread are
  /// collected and handed to the completion executor as one task when it goes (one hand-off per
  /// batch instead of one per request). Order within the batch is kept.
  class CallbackBatch {
   public:
    explicit CallbackBatch(EngineCore& core) : core_(core), prev_(tl_callbacks) {
      scope_.core = &core;
      tl_callbacks = &scope_;
    }
    ~CallbackBatch() {
      tl_callbacks = prev_;
      if (scope_.pending.empty()) return;
      Task task([&core = core_, pending = std::move(scope_.pending)]() mutable {
        for (Pending& p : pending) core.invoke_callback(*p.request, p.result);
      });
      if (!core_.completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
    }
    CallbackBatch(const CallbackBatch&) = delete;
    CallbackBatch& operator=(const CallbackBatch&) = delete;

   private:
    EngineCore& core_;
    Scope* prev_;
    Scope scope_;
  };

  void invoke_callback(Request& r, const Result<Outputs>& result) {
    try {
      r.callback(result);
    } catch (...) {
      callback_exceptions_.fetch_add(1, std::memory_order_relaxed);
      detail::report_callback_exception("engine callback", std::current_exception());
    }
    r.callback = nullptr;  // release what it captured, here on the completion thread
  }

  void deliver_ordered(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
    {
      std::lock_guard lock(order_mu_);
      OrderQueue& q = orders_[r->sequence_key];
      q.ready.emplace(r->order_seq, Pending{r, std::move(result)});
      if (q.draining) return;
      q.draining = true;
    }
    Task task([this, key = r->sequence_key] { drain_order(key); });
    if (!completion_.post(std::move(task))) task();  // NOLINT(bugprone-use-after-move)
  }

  /// Delivers, in sequence, every result of `key` whose predecessors have been delivered. One
  /// drain per key runs at a time (the `draining` flag), so order holds with any number of
  /// completion threads.
  void drain_order(const std::string& key) {
    for (;;) {
      std::vector<Pending> run;
      {
        std::lock_guard lock(order_mu_);
        OrderQueue& q = orders_[key];
        while (!q.ready.empty() && q.ready.begin()->first == q.next_deliver) {
          run.push_back(std::move(q.ready.begin()->second));
          q.ready.erase(q.ready.begin());
          ++q.next_deliver;
        }
        if (run.empty()) {
          q.draining = false;
          if (q.ready.empty() && q.next_assign == q.next_deliver) orders_.erase(key);
          return;
        }
      }
      for (Pending& p : run) {
        if (p.request->has_callback) {
          invoke_callback(*p.request, p.result);
        } else if (p.request->promise) {
          p.request->promise->set_result(std::move(p.result));
        }
      }
    }
  }

  void on_deadline(const std::shared_ptr<Request>& r) {
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

  // ---- workers ----------------------------------------------------------------------------

  /// A new stream and model instance for `w` (at start and on every recycle attempt). An
  /// exception from the device or the model is a failed attempt, never an escape.
  Status make_stream_and_instance(Worker& w, int threads) {
    const std::string where = "worker " + std::to_string(w.index);
    StreamOptions so;
    so.host_func_executor = completion_point_executor();
    so.name = "ai-w" + std::to_string(w.index) + "-stream";
    Result<std::unique_ptr<Stream>> stream = internal_error("no stream");
    try {
      stream = device_->create_stream(so);
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
    w.instance = std::move(*instance);
    return Status();
  }

  /// Where the streams' completion points run: on cpu and sim the stream thread itself runs the
  /// (library-only) completion code, saving a thread hand-off per batch; elsewhere (cuda, whose
  /// callback thread must not call CUDA) the dispatcher thread.
  Executor* completion_point_executor() {
    const DeviceKind k = device_->kind();
    if (k == DeviceKind::cpu || k == DeviceKind::sim) return &inline_;
    return &dispatcher_;
  }

  void worker_loop(Worker& w) {
    detail::setup_thread("ai-worker-" + std::to_string(w.index));
    for (;;) {
      std::int64_t cap = max_rows_;
      bool do_recycle = false;
      {
        std::unique_lock lock(w.mu);
        for (;;) {
          // Leave at once on shutdown(cancel) or after a drain, whatever else is pending (a
          // recycle, a backoff, a breaker cool-down): nothing is left for this worker to do.
          if (workers_exit_.load(std::memory_order_acquire)) return;
          if (w.gave_up) {
            // Unhealthy for good: serves nothing and waits for shutdown.
            if (stopping_flag_.load(std::memory_order_acquire)) return;
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
          if (w.breaker == Breaker::open) {
            if (Clock::now() >= w.open_until) {
              w.breaker = Breaker::half_open;
              w.breaker_open.store(false, std::memory_order_release);
              continue;
            }
            w.cv.wait_until(lock, w.open_until);
            continue;
          }
          const int limit = w.breaker == Breaker::half_open ? 1 : opt_.max_inflight_per_worker;
          if (w.inflight < limit) {
            if (w.breaker == Breaker::half_open) cap = 1;  // probe with one request
            break;
          }
          w.cv.wait(lock);
        }
      }
      if (do_recycle) {
        recycle(w);
        continue;
      }
      std::shared_ptr<Batch> batch = next_batch(w, cap);
      if (!batch) {
        if (workers_exit_.load(std::memory_order_acquire)) return;
        // A recycle, or a breaker that opened while the worker waited for work: back to the
        // loop above, which handles them.
        if (w.recycle_wanted.load(std::memory_order_acquire)) continue;
        if (w.breaker_open.load(std::memory_order_acquire)) continue;
        return;
      }
      launch(w, batch);
    }
  }

  bool stop_workers() const {
    return stopping_flag_.load(std::memory_order_acquire) &&
           cancel_mode_.load(std::memory_order_acquire);
  }

  /// Blocks until a batch is ready for `w` (or the engine stops: null).
  std::shared_ptr<Batch> next_batch(Worker& w, std::int64_t cap) {
    std::unique_lock lock(qmu_);
    for (;;) {
      if (stopping_ && mode_ == ShutdownMode::cancel) return nullptr;
      if (w.recycle_wanted.load(std::memory_order_acquire)) return nullptr;  // see worker_loop
      if (w.breaker_open.load(std::memory_order_acquire)) return nullptr;
      if (queue_.empty()) {
        if (stopping_ && retry_waiting_.empty() && inflight_batches_ == 0) return nullptr;
        qcv_.wait(lock);
        continue;
      }
      const Clock::time_point now = Clock::now();
      Request* head = queue_.next(now, opt_.priority_aging);
      std::vector<Request*> picked{head};
      std::int64_t rows = head->rows;
      Clock::time_point oldest = head->enqueued;
      Clock::time_point nearest_deadline = head->deadline;
      const bool batching = sig_.batched && cap > 1 && !head->solo;
      if (batching && rows < cap) {
        // Shape-compatible requests in priority order, FIFO within a level; bounded scan.
        std::size_t scanned = 0;
        const std::size_t scan_limit = static_cast<std::size_t>(4 * cap + 64);
        for (int l = 0; l < queue_.levels() && rows < cap && scanned < scan_limit; ++l) {
          for (Request* r = queue_.head(l); r != nullptr && rows < cap && scanned < scan_limit;
               r = r->next) {
            ++scanned;
            if (r == head || r->solo || rows + r->rows > cap ||
                !detail::batch_compatible(*head, *r)) {
              continue;
            }
            picked.push_back(r);
            rows += r->rows;
            oldest = std::min(oldest, r->enqueued);
            nearest_deadline = std::min(nearest_deadline, r->deadline);
          }
        }
      }
      bool dispatch =
          !batching || rows >= cap || stopping_ || opt_.batching.max_queue_delay.count() <= 0;
      Clock::time_point wake = Clock::time_point::max();
      if (!dispatch && !opt_.batching.preferred_batch_sizes.empty()) {
        std::int64_t best = 0;
        for (std::int64_t p : opt_.batching.preferred_batch_sizes) {
          if (p <= rows) best = std::max(best, p);
        }
        if (best > 0) {
          // Take the requests (in order) that fit the largest reachable preferred size.
          std::vector<Request*> fit;
          std::int64_t fit_rows = 0;
          for (Request* r : picked) {
            if (fit_rows + r->rows <= best) {
              fit.push_back(r);
              fit_rows += r->rows;
            }
          }
          picked.swap(fit);
          rows = fit_rows;
          dispatch = true;
        }
      }
      if (!dispatch) {
        // max_queue_delay max(): wait for a full batch or a preferred size (saturating).
        const auto delay = saturating_cast<Clock::duration>(opt_.batching.max_queue_delay);
        wake = saturating_add(oldest, delay);
        // Never hold a request in a forming batch past its deadline minus the delay.
        if (nearest_deadline != Clock::time_point::max()) {
          wake = std::min(wake, saturating_add(nearest_deadline, -delay));
        }
        dispatch = now >= wake;
      }
      if (!dispatch) {
        if (detail::no_limit(wake)) {
          qcv_.wait(lock);  // a new request, a stopping engine or a recycle wakes it
        } else {
          qcv_.wait_until(lock, wake);
        }
        continue;
      }
      auto batch = std::make_shared<Batch>();
      batch->worker = w.index;
      batch->requests.reserve(picked.size());
      for (Request* r : picked) {
        std::shared_ptr<Request> ref = queue_.remove(r);
        r->batch = batch;  // before the stage store: whoever sees `running` sees the batch
        r->stage.store(Stage::running, std::memory_order_release);
        batch->requests.push_back(std::move(ref));
      }
      batch->rows = rows;
      batch->live.store(static_cast<int>(batch->requests.size()), std::memory_order_relaxed);
      ++inflight_batches_;
      lock.unlock();
      if (opt_.queue_full_policy == QueueFullPolicy::block) space_cv_.notify_all();
      return batch;
    }
  }

  void launch(Worker& w, const std::shared_ptr<Batch>& batch) {
    {
      std::lock_guard lock(w.mu);
      batch->generation = w.generation;
      ++w.inflight;
      w.running.push_back(batch);
    }
    const Clock::time_point now = Clock::now();
    for (const auto& r : batch->requests) {
      ++r->attempts;
      queue_us_.observe(us_between(r->enqueued, now));
    }
    attempts_.fetch_add(batch->requests.size(), std::memory_order_relaxed);
    auto io = std::make_shared<BatchIO>();
    batch->io = io;
    io->stop = batch->stop.get_token();
    Status s = assemble(w, *batch, *io);
    if (s.ok() && batch->requests.empty()) {  // every request failed in assembly
      end_without_running(w, batch, Status());
      return;
    }
    if (s.ok()) {
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
    s = w.stream->launch_host_func(
        [this, batch](Status st) { on_batch_done(batch, std::move(st)); });
    if (!s.ok()) end_without_running(w, batch, s);
  }

  /// Builds the batch's inputs. Requests whose preparation throws fail alone and leave the batch.
  Status assemble(Worker& w, Batch& batch, BatchIO& io) {
    const detail::AssemblyHook hook = detail::g_assembly_hook.load(std::memory_order_acquire);
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
          ASYNCINFER_ASSIGN_OR_RETURN(Tensor d,
                                      device_->empty(h.dtype(), h.shape(), MemoryKind::device));
          ASYNCINFER_RETURN_IF_ERROR(w.stream->copy(d, h));
          io.inputs.push_back(std::move(d));
        }
      }
    } catch (const std::exception& e) {
      return internal_error(std::string("batch assembly failed: ") + e.what());
    }
    return Status();
  }

  void fail_alone(const std::shared_ptr<Request>& r, Status s) {
    // The request is running (it was dispatched): end it here.
    const Status copy = s;
    if (!try_resolve(r, detail::stage_for_error(s.code()), std::move(s))) late_failure(1, copy, *r);
  }

  /// A failure that reached `n` requests which had already ended (timed out, cancelled, shut
  /// down): counted per request by reason; its message is logged once, rate-limited.
  void late_failure(std::size_t n, const Status& st, const Request& example) {
    late_failures_.fetch_add(n, std::memory_order_relaxed);
    {
      std::lock_guard lock(reasons_mu_);
      late_failures_by_reason_[std::string(to_string(st.code()))] += n;
    }
    const Stage at = example.stage.load(std::memory_order_acquire);
    late_log_.log(LogLevel::warning,
                  context("engine: a failure arrived after its request had ended", example.tag) +
                      " (" + std::string(to_string(detail::to_state(at))) +
                      (n > 1 ? ", " + std::to_string(n) + " requests of one batch" : "") +
                      "): " + st.to_string());
  }

  /// The completion point of a batch the watchdog already ended: its result is late.
  void late_outcome(const Batch& batch, const Status& st) {
    if (batch.requests.empty()) return;
    if (st.ok()) {
      late_completions_.fetch_add(batch.requests.size(), std::memory_order_relaxed);
    } else if (!own_stop(batch, st)) {
      late_failure(batch.requests.size(), st, *batch.requests.front());
    }
  }

  /// Whether `st` is only the engine's own doing, not a failure: the batch's work stopped because
  /// its stop token fired (all its requests ended, or the watchdog), or its stream was destroyed
  /// (a recycle, shutdown).
  static bool own_stop(const Batch& batch, const Status& st) {
    return st.code() == StatusCode::aborted ||
           (st.code() == StatusCode::cancelled && batch.stop.stop_requested());
  }

  Status enqueue_copies_back(Worker& w, Batch& batch, BatchIO& io) {
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
      ASYNCINFER_ASSIGN_OR_RETURN(
          Tensor host, device_->empty(out.dtype(), out.shape(), MemoryKind::pinned_host));
      ASYNCINFER_RETURN_IF_ERROR(w.stream->copy(host, out));
      batch.host_outputs.push_back(std::move(host));
    }
    return Status();
  }

  /// Counts the batch off its worker's stream (once).
  void off_stream(Worker& w, Batch& batch) {
    if (batch.on_stream.exchange(false, std::memory_order_relaxed)) {
      w.stream_batches.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  /// A batch that never reached its stream (or whose completion point could not be enqueued).
  void end_without_running(Worker& w, const std::shared_ptr<Batch>& batch, Status s) {
    off_stream(w, *batch);
    if (batch->done.exchange(true)) return;
    if (!s.ok()) {
      w.failed_batches.fetch_add(1, std::memory_order_relaxed);
      breaker_failure(w, s.code());
    }
    release_slot(w, *batch);
    if (!s.ok()) batch_failed(batch, s);
    batch_finished();
  }

  void on_batch_done(const std::shared_ptr<Batch>& batch, Status st) {
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
    const double compute = us_between(batch->compute_start, now);
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
    CallbackBatch callbacks(*this);
    if (st.ok()) {
      complete(batch, compute);
    } else if (stale && st.code() == StatusCode::aborted) {
      requeue_all(batch);  // its stream was replaced under it: run it again on the new one
    } else {
      batch_failed(batch, st);
    }
    batch_finished();
  }

  /// Frees the batch's in-flight slot on its worker; true when the worker's stream was replaced
  /// since the batch was launched.
  bool release_slot(Worker& w, const Batch& batch) {
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

  /// Called once a batch's outcome has been handled (requests ended or re-queued).
  void batch_finished() {
    {
      std::lock_guard lock(qmu_);
      --inflight_batches_;
    }
    if (stopping_flag_.load(std::memory_order_acquire)) notify_progress();
  }

  void notify_progress() {
    { std::lock_guard lock(qmu_); }
    qcv_.notify_all();
    drain_cv_.notify_all();
  }

  void complete(const std::shared_ptr<Batch>& batch, double compute_us) {
    const std::vector<Tensor>& outs = unified_ ? batch->io->outputs : batch->host_outputs;
    Status check = check_outputs(outs, batch->rows);
    if (!check.ok()) {
      batch_failed(batch, check);
      return;
    }
    // Recent service time per request, for admission control (EWMA, weight 1/8).
    const double per_request = compute_us / static_cast<double>(batch->requests.size());
    const double old = service_us_.load(std::memory_order_relaxed);
    service_us_.store(old == 0 ? per_request : old + (per_request - old) / 8.0,
                      std::memory_order_relaxed);
    const bool split = sig_.batched && batch->requests.size() > 1;
    std::int64_t offset = 0;
    for (const auto& r : batch->requests) {
      Outputs mine;
      if (split) {
        mine.reserve(outs.size());
        for (const Tensor& o : outs) mine.push_back(*o.slice(offset, offset + r->rows));
      } else {
        mine = outs;
      }
      offset += r->rows;
      if (!try_resolve(r, Stage::completed, std::move(mine))) {
        late_completions_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  Status check_outputs(const std::vector<Tensor>& outs, std::int64_t rows) const {
    if (outs.size() != sig_.outputs.size()) {
      return internal_error("model '" + model_->name() + "' produced " +
                            std::to_string(outs.size()) + " outputs, its signature has " +
                            std::to_string(sig_.outputs.size()));
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
    }
    return Status();
  }

  void batch_failed(const std::shared_ptr<Batch>& batch, const Status& st) {
    std::vector<std::shared_ptr<Request>> live;
    std::size_t ended = 0;
    const Request* first_ended = nullptr;
    for (const auto& r : batch->requests) {
      const Stage at = r->stage.load(std::memory_order_acquire);
      if (at == Stage::running) {
        live.push_back(r);
      } else if (detail::is_final(at)) {
        if (ended++ == 0) first_ended = r.get();
      }
    }
    if (ended > 0 && !own_stop(*batch, st)) late_failure(ended, st, *first_ended);
    const StatusCode code = st.code();
    if (live.size() > 1 && opt_.batching.split_failed_batches && !opt_.retry.is_retryable(code) &&
        code != StatusCode::cancelled && code != StatusCode::aborted &&
        code != StatusCode::deadline_exceeded) {
      split_batches_.fetch_add(1, std::memory_order_relaxed);
      requeue(live, /*solo=*/true);
      return;
    }
    for (const auto& r : live) retry_or_fail(r, st);
  }

  /// Puts running requests back at the front of their levels (in their order), without counting
  /// the attempt. With solo, each will run in a batch of its own.
  void requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo) {
    std::vector<std::shared_ptr<Request>> refused;
    std::optional<Status> unavailable;
    {
      std::lock_guard lock(qmu_);
      unavailable = no_workers_;
      for (auto it = rs.rbegin(); it != rs.rend(); ++it) {
        const std::shared_ptr<Request>& r = *it;
        Stage exp = Stage::running;
        if ((stopping_ && mode_ == ShutdownMode::cancel) || unavailable) {
          refused.push_back(r);
          continue;
        }
        if (!r->stage.compare_exchange_strong(exp, Stage::queued, std::memory_order_acq_rel)) {
          continue;
        }
        r->solo = r->solo || solo;
        --r->attempts;
        r->batch.reset();
        queue_.push_front(r);
      }
    }
    qcv_.notify_all();
    for (auto& r : refused) {
      if (unavailable) {
        try_resolve(
            r, Stage::failed,
            Status(unavailable->code(), context(std::string(unavailable->message()), r->tag)));
      } else {
        try_resolve(
            r, Stage::shut_down,
            aborted_error(context("engine shut down before the request completed", r->tag)));
      }
    }
  }

  void requeue_all(const std::shared_ptr<Batch>& batch) {
    std::vector<std::shared_ptr<Request>> live;
    for (const auto& r : batch->requests) {
      if (r->stage.load(std::memory_order_acquire) == Stage::running) live.push_back(r);
    }
    requeue(live, /*solo=*/false);
  }

  void retry_or_fail(const std::shared_ptr<Request>& r, const Status& st) {
    {
      std::lock_guard tl(r->timer_mu);
      r->last_error = st;
    }
    const Clock::time_point now = Clock::now();
    const int attempts = r->attempts.load(std::memory_order_relaxed);
    std::string why_not;
    if (attempts < opt_.retry.max_attempts && opt_.retry.is_retryable(st.code()) &&
        !stop_workers()) {
      std::chrono::microseconds wait;
      {
        std::lock_guard lock(rng_mu_);
        wait = opt_.retry.backoff(attempts + 1, rng_);
      }
      const Clock::time_point retry_at = saturating_add(now, wait);
      if (retry_at >= r->deadline) {
        why_not = "no time left before the deadline for attempt " + std::to_string(attempts + 1);
      } else if (!budget_.try_retry(now)) {
        retries_denied_.fetch_add(1, std::memory_order_relaxed);
        why_not = "retry budget exhausted";
      } else {
        {
          std::unique_lock lock(qmu_);
          Stage exp = Stage::running;
          if (!r->stage.compare_exchange_strong(exp, Stage::retry_wait,
                                                std::memory_order_acq_rel)) {
            lock.unlock();
            late_failure(1, st, *r);  // ended meanwhile (deadline, cancel)
            return;
          }
          r->batch.reset();
          retry_waiting_.emplace(r.get(), r);
        }
        retries_.fetch_add(1, std::memory_order_relaxed);
        TimerId id = timer_.add(retry_at, [this, r] { requeue_after_backoff(r); });
        std::lock_guard tl(r->timer_mu);
        r->retry_timer = id;
        return;
      }
    }
    Status final = st;
    if (attempts > 1 || !why_not.empty()) {
      std::string msg =
          "failed after " + std::to_string(attempts) + " attempt" + (attempts == 1 ? "" : "s");
      if (!why_not.empty()) msg += " (" + why_not + ")";
      msg += "; last error: " + st.to_string();
      final = Status(st.code(), context(msg, r->tag));
    }
    const Status copy = final;
    if (!try_resolve(r, detail::stage_for_error(final.code()), std::move(final))) {
      late_failure(1, copy, *r);  // ended meanwhile (deadline, cancel)
    }
  }

  void requeue_after_backoff(const std::shared_ptr<Request>& r) {
    bool shut = false;
    std::optional<Status> unavailable;
    {
      std::lock_guard lock(qmu_);
      auto it = retry_waiting_.find(r.get());
      if (it == retry_waiting_.end()) return;  // ended meanwhile
      unavailable = no_workers_;
      if ((stopping_ && mode_ == ShutdownMode::cancel) || unavailable) {
        shut = true;
      } else {
        retry_waiting_.erase(it);
        Stage exp = Stage::retry_wait;
        if (!r->stage.compare_exchange_strong(exp, Stage::queued, std::memory_order_acq_rel)) {
          return;
        }
        r->enqueued = Clock::now();
        queue_.push_back(r);  // retries do not count against queue_capacity
      }
    }
    if (shut && unavailable) {
      try_resolve(
          r, Stage::failed,
          Status(unavailable->code(), context(std::string(unavailable->message()), r->tag)));
      return;
    }
    if (shut) {
      try_resolve(
          r, Stage::shut_down,
          aborted_error(context("engine shut down while the request waited to retry", r->tag)));
      return;
    }
    qcv_.notify_one();
  }

  void on_watchdog(const std::shared_ptr<Batch>& batch) {
    if (batch->done.load(std::memory_order_acquire)) return;
    {
      // A batch queued on the stream behind an older one that has not finished has not started:
      // its time runs from when the one ahead ends. Check again later instead of failing it.
      Worker& w = *workers_[static_cast<std::size_t>(batch->worker)];
      std::lock_guard lock(w.mu);
      bool behind = w.recycle || batch->generation != w.generation;  // its stream is going away:
      // it comes back through requeue_all when that stream is destroyed
      for (const auto& other : w.running) {
        if (behind) break;
        if (other.get() == batch.get()) break;  // `running` is in launch order
        if (!other->done.load(std::memory_order_acquire) &&
            other->generation == batch->generation) {
          behind = true;
        }
      }
      if (behind) {
        std::lock_guard wl(batch->watchdog_mu);
        batch->watchdog = timer_.add(saturating_add(Clock::now(), opt_.watchdog),
                                     [this, batch] { on_watchdog(batch); });
        return;
      }
    }
    if (batch->done.exchange(true)) return;
    watchdog_fired_.fetch_add(1, std::memory_order_relaxed);
    Worker& w = *workers_[static_cast<std::size_t>(batch->worker)];
    {
      std::lock_guard lock(w.mu);
      if (batch->generation == w.generation) {
        w.recycle = true;
        w.recycle_wanted.store(true, std::memory_order_release);
      }
    }
    w.failed_batches.fetch_add(1, std::memory_order_relaxed);
    breaker_failure(w, StatusCode::deadline_exceeded);
    { std::lock_guard lock(qmu_); }  // a worker waiting for work in next_batch sees the flag
    qcv_.notify_all();
    release_slot(w, *batch);
    batch->stop.request_stop();  // cancellable backends end the hung work
    const Status st = deadline_exceeded_error(
        "worker " + std::to_string(w.index) +
        ": the batch did not reach its completion point "
        "within the " +
        std::to_string(opt_.watchdog.count()) +
        " ms hang watchdog; the worker's stream and model instance are being replaced");
    for (const auto& r : batch->requests) try_resolve(r, Stage::timed_out, st);
    batch_finished();
  }

  /// Replaces a hung worker's stream and model instance (worker thread only). The old ones are
  /// destroyed by a reaper thread, so a kernel that ignores its stop token cannot block this
  /// worker; until that destruction returns they count as abandoned (worker_loop bounds them).
  /// Batches still queued on the old stream come back through requeue_all. A failed attempt is
  /// retried after a backoff; after RecoveryOptions::max_recycle_attempts in a row the worker
  /// gives up (worker_gave_up).
  void recycle(Worker& w) {
    std::unique_ptr<Stream> old_stream = std::move(w.stream);
    std::unique_ptr<ModelInstance> old_instance = std::move(w.instance);
    const bool abandon = old_stream != nullptr || old_instance != nullptr;
    {
      std::lock_guard lock(w.mu);
      ++w.generation;
      if (abandon) ++w.abandoned;
    }
    if (abandon) {
      w.recycles.fetch_add(1, std::memory_order_relaxed);
      Task reap([&w, s = std::move(old_stream), i = std::move(old_instance)]() mutable {
        s.reset();  // waits for its running work where the backend cannot stop it
        i.reset();
        {
          std::lock_guard lock(w.mu);
          --w.abandoned;
        }
        w.cv.notify_all();
      });
      if (!reaper_.post(std::move(reap))) reap();  // NOLINT(bugprone-use-after-move)
    }
    const Status s = make_stream_and_instance(w, intra_op_threads_);
    int failures = 0;
    bool gave_up = false;
    std::chrono::milliseconds wait{0};
    {
      std::lock_guard lock(w.mu);
      if (s.ok()) {
        w.recycle = false;
        w.recycle_wanted.store(false, std::memory_order_release);
        w.recycle_failures = 0;
        w.last_error.clear();
      } else {
        failures = ++w.recycle_failures;
        w.last_error = s.to_string();
        if (failures >= opt_.recovery.max_recycle_attempts) {
          w.gave_up = true;
          gave_up = true;
        } else {
          wait = recycle_backoff(failures);
          w.next_recycle = deadline_after(wait);
        }
      }
    }
    if (s.ok()) return;
    w.recycle_attempts_failed.fetch_add(1, std::memory_order_relaxed);
    if (gave_up) {
      worker_gave_up(w, "worker " + std::to_string(w.index) +
                            " is unhealthy: no model instance after " + std::to_string(failures) +
                            " attempt" + (failures == 1 ? "" : "s") +
                            "; last error: " + s.to_string());
      return;
    }
    recycle_log_.log(LogLevel::warning,
                     "engine: worker " + std::to_string(w.index) +
                         " could not replace its stream and model instance (attempt " +
                         std::to_string(failures) + " of " +
                         std::to_string(opt_.recovery.max_recycle_attempts) + "; next in " +
                         ms_text(wait) + "): " + s.to_string());
  }

  /// The wait after `failures` failed attempts in a row: recycle_backoff doubled per further
  /// failure, capped (saturating: max() waits for good).
  std::chrono::milliseconds recycle_backoff(int failures) const {
    std::chrono::milliseconds wait = opt_.recovery.recycle_backoff;
    for (int i = 1; i < failures && wait < opt_.recovery.max_recycle_backoff; ++i) {
      wait = detail::saturating_sum(wait, wait);
    }
    return std::min(wait, opt_.recovery.max_recycle_backoff);
  }

  /// A worker gave up for good. When it was the last one that could serve, everything queued or
  /// waiting to retry fails `unavailable` with `cause`, and later submits are refused with it.
  void worker_gave_up(Worker& w, const std::string& cause) {
    log(LogLevel::error, "engine: " + cause);
    w.cv.notify_all();
    if (live_workers_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    const Status st = unavailable_error("no worker of the engine can serve requests: " + cause);
    std::vector<std::shared_ptr<Request>> victims;
    {
      std::lock_guard lock(qmu_);
      no_workers_ = st;
      for (Request* r : queue_.all()) victims.push_back(r->queue_ref);
      for (auto& [ptr, ref] : retry_waiting_) victims.push_back(ref);
    }
    space_cv_.notify_all();  // blocked submits are refused now
    for (auto& r : victims) {
      try_resolve(r, Stage::failed, Status(st.code(), context(std::string(st.message()), r->tag)));
    }
    notify_progress();
  }

  /// A worker's health and why (under w.mu).
  std::pair<WorkerHealth, std::string> health_of(const Worker& w) const {
    if (w.gave_up) {
      return {WorkerHealth::unhealthy, "no model instance after " +
                                           std::to_string(w.recycle_failures) +
                                           " attempts; last error: " + w.last_error};
    }
    const int max_abandoned = opt_.recovery.max_abandoned_instances;
    if ((w.recycle && w.abandoned > 0 && w.abandoned >= max_abandoned) ||
        w.abandoned > max_abandoned) {
      return {WorkerHealth::paused, "waiting for " + std::to_string(w.abandoned) +
                                        " abandoned model instance(s) to finish their work "
                                        "(max_abandoned_instances " +
                                        std::to_string(max_abandoned) + ")"};
    }
    if (w.recycle) {
      return {WorkerHealth::recovering,
              w.last_error.empty()
                  ? std::string("replacing its stream and model instance after a hang")
                  : "replacing its stream and model instance after a hang; attempt " +
                        std::to_string(w.recycle_failures) + " failed: " + w.last_error};
    }
    return {WorkerHealth::healthy, std::string()};
  }

  void breaker_success(Worker& w) {
    if (opt_.breaker.failure_threshold <= 0) return;
    std::lock_guard lock(w.mu);
    w.consecutive_failures = 0;
    if (w.breaker == Breaker::half_open) w.breaker = Breaker::closed;
  }

  void breaker_failure(Worker& w, StatusCode code) {
    if (opt_.breaker.failure_threshold <= 0) return;
    if (code == StatusCode::invalid_argument || code == StatusCode::cancelled ||
        code == StatusCode::aborted) {
      return;  // the request's fault or the caller's choice, not the worker's health
    }
    bool opened = false;
    {
      std::lock_guard lock(w.mu);
      ++w.consecutive_failures;
      if (w.breaker == Breaker::half_open ||
          w.consecutive_failures >= opt_.breaker.failure_threshold) {
        w.breaker = Breaker::open;
        w.breaker_open.store(true, std::memory_order_release);
        w.open_until = deadline_after(opt_.breaker.cooldown);  // max(): open for good
        w.consecutive_failures = 0;
        opened = true;
      }
    }
    if (opened) {
      // A worker waiting for work in next_batch must not take the next request now.
      { std::lock_guard lock(qmu_); }
      qcv_.notify_all();
    }
  }

  // ---- shutdown ---------------------------------------------------------------------------

  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout) {
    std::unique_lock guard(shutdown_mu_, std::try_to_lock);
    if (!guard.owns_lock()) {
      // Another thread is shutting down. A cancel escalates its drain (the queued and running
      // work ends now), then both wait for that shutdown to finish.
      if (mode == ShutdownMode::cancel) escalate_to_cancel();
      guard.lock();
    }
    if (shut_) return;
    {
      std::lock_guard lock(qmu_);
      stopping_ = true;
      mode_ = mode;
    }
    cancel_mode_.store(mode == ShutdownMode::cancel, std::memory_order_release);
    if (mode == ShutdownMode::cancel) workers_exit_.store(true, std::memory_order_release);
    stopping_flag_.store(true, std::memory_order_release);
    wake_everyone();
    if (mode == ShutdownMode::drain) {
      std::unique_lock lock(qmu_);
      const Clock::time_point until = deadline_after(drain_timeout);
      const auto drained_or_cancelled = [this] {
        return mode_ == ShutdownMode::cancel ||
               (queue_.empty() && retry_waiting_.empty() && inflight_batches_ == 0);
      };
      bool drained = true;
      if (detail::no_limit(until)) {
        drain_cv_.wait(lock, drained_or_cancelled);
      } else {
        drained = drain_cv_.wait_until(lock, until, drained_or_cancelled);
      }
      if (!drained || mode_ == ShutdownMode::cancel) {
        lock.unlock();
        escalate_to_cancel();
      } else {
        // Drained: workers still waiting (a breaker cool-down, a recycle backoff, abandoned
        // work) have nothing left to do.
        lock.unlock();
        workers_exit_.store(true, std::memory_order_release);
        wake_everyone();
      }
    } else {
      cancel_all();
    }
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
    shut_ = true;
  }

  /// Switches a shutdown in progress to cancel: the queued and running requests end now.
  void escalate_to_cancel() {
    {
      std::lock_guard lock(qmu_);
      stopping_ = true;
      mode_ = ShutdownMode::cancel;
    }
    cancel_mode_.store(true, std::memory_order_release);
    workers_exit_.store(true, std::memory_order_release);
    stopping_flag_.store(true, std::memory_order_release);
    wake_everyone();
    cancel_all();
  }

  void wake_everyone() {
    { std::lock_guard lock(qmu_); }
    qcv_.notify_all();
    space_cv_.notify_all();
    drain_cv_.notify_all();
    for (auto& w : workers_) {
      { std::lock_guard lock(w->mu); }
      w->cv.notify_all();
    }
  }

  void cancel_all() {
    std::vector<std::shared_ptr<Request>> victims;
    {
      std::lock_guard lock(qmu_);
      for (Request* r : queue_.all()) victims.push_back(r->queue_ref);
      for (auto& [ptr, ref] : retry_waiting_) victims.push_back(ref);
    }
    for (auto& w : workers_) {
      std::lock_guard lock(w->mu);
      for (auto& b : w->running) {
        for (auto& r : b->requests) victims.push_back(r);
      }
    }
    for (auto& r : victims) {
      const bool was_running = r->stage.load(std::memory_order_acquire) == Stage::running;
      try_resolve(
          r, Stage::shut_down,
          aborted_error(context(was_running ? "engine shut down before the request completed"
                                            : "engine shut down before the request ran",
                                r->tag)));
    }
  }

  // ---- metrics ----------------------------------------------------------------------------

  EngineMetrics metrics() const {
    EngineMetrics m;
    m.model = model_->name();
    m.uptime_s = std::chrono::duration<double>(Clock::now() - started_).count();
    m.submitted = submitted_.load();
    m.rejected = rejected_.load();
    m.completed = completed_.load();
    m.failed = failed_.load();
    m.timed_out = timed_out_.load();
    m.cancelled = cancelled_.load();
    m.shut_down = shut_down_.load();
    {
      std::lock_guard lock(reasons_mu_);
      m.failures_by_reason = failures_by_reason_;
      m.rejections_by_reason = rejections_by_reason_;
      m.late_failures_by_reason = late_failures_by_reason_;
    }
    m.batches = batches_.load();
    m.attempts = attempts_.load();
    m.retries = retries_.load();
    m.retries_denied_by_budget = retries_denied_.load();
    m.split_batches = split_batches_.load();
    m.late_completions = late_completions_.load();
    m.late_failures = late_failures_.load();
    m.callback_exceptions = callback_exceptions_.load();
    m.model_exceptions = model_exceptions_.load();
    m.watchdog_fired = watchdog_fired_.load();
    {
      std::lock_guard lock(qmu_);
      m.queue_depth = static_cast<std::int64_t>(queue_.size());
      m.retry_waiting = static_cast<std::int64_t>(retry_waiting_.size());
    }
    m.inflight_requests = inflight_requests_.load();
    m.batches_per_s = m.uptime_s > 0 ? static_cast<double>(m.batches) / m.uptime_s : 0;
    m.result_store_size = static_cast<std::int64_t>(store_.size());
    if (opt_.ordered_delivery) {
      std::vector<std::pair<std::int64_t, const std::string*>> keys;
      std::lock_guard lock(order_mu_);
      for (const auto& [key, q] : orders_) {
        const auto n = static_cast<std::int64_t>(q.next_assign - q.next_deliver);
        m.ordered_backlog_total += n;
        if (n > 0) keys.emplace_back(n, &key);
      }
      constexpr std::size_t kMaxKeys = 64;  // bounded: keys may be one per client
      if (keys.size() > kMaxKeys) {
        std::nth_element(keys.begin(), keys.begin() + kMaxKeys, keys.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        keys.resize(kMaxKeys);
      }
      for (const auto& [n, key] : keys) m.ordered_backlog.emplace(*key, n);
    }
    m.live_workers = live_workers_.load();
    for (const auto& w : workers_) {
      WorkerMetrics wm;
      wm.index = w->index;
      {
        std::lock_guard lock(w->mu);
        wm.breaker = w->breaker == Breaker::closed ? "closed"
                     : w->breaker == Breaker::open ? "open"
                                                   : "half_open";
        wm.inflight_batches = w->inflight;
        wm.abandoned_instances = w->abandoned;
        auto [health, reason] = health_of(*w);
        wm.health = std::string(to_string(health));
        wm.health_reason = std::move(reason);
      }
      wm.batches = w->batches.load();
      wm.failed_batches = w->failed_batches.load();
      wm.recycles = w->recycles.load();
      wm.recycle_failures = w->recycle_attempts_failed.load();
      wm.stream_batches = w->stream_batches.load();
      m.workers.push_back(std::move(wm));
    }
    m.queue_us = queue_us_.snapshot();
    m.compute_us = compute_us_.snapshot();
    m.request_us = request_us_.snapshot();
    m.batch_size = batch_size_.snapshot();
    return m;
  }

  EngineHealth health() const {
    EngineHealth h;
    h.live = !stopping_flag_.load(std::memory_order_acquire);
    int healthy = 0;
    std::string first_reason;
    for (const auto& w : workers_) {
      WorkerStatus ws;
      ws.index = w->index;
      {
        std::lock_guard lock(w->mu);
        auto [health, reason] = health_of(*w);
        ws.health = health;
        ws.reason = std::move(reason);
      }
      if (ws.health == WorkerHealth::healthy) {
        ++healthy;
      } else if (first_reason.empty()) {
        first_reason = "worker " + std::to_string(ws.index) + " " +
                       std::string(to_string(ws.health)) + ": " + ws.reason;
      }
      h.workers.push_back(std::move(ws));
    }
    h.ready = h.live && healthy > 0;
    if (!h.live) {
      h.reason = "the engine is shut down";
    } else if (!h.ready) {
      h.reason = "no healthy worker (" + first_reason + ")";
    }
    return h;
  }

  std::string context(const std::string& what, const std::string& tag) const {
    return tag.empty() ? what : what + " [" + tag + "]";
  }

  // ---- state ------------------------------------------------------------------------------

  std::shared_ptr<Model> model_;
  std::shared_ptr<Device> device_;
  EngineOptions opt_;
  ModelSignature sig_;
  std::int64_t max_rows_;
  bool unified_;
  Clock::time_point started_;
  int intra_op_threads_ = 1;

  // Executors. Destroyed in reverse order; shutdown() stops them in the right order first.
  ThreadPool completion_;
  ThreadPool dispatcher_;
  InlineExecutor inline_;
  DeadlineTimer timer_;
  ThreadPool reaper_;

  mutable std::mutex qmu_;
  std::condition_variable qcv_;
  std::condition_variable space_cv_;
  std::condition_variable drain_cv_;
  detail::RequestQueue queue_;
  bool stopping_ = false;                                                 // under qmu_
  ShutdownMode mode_ = ShutdownMode::drain;                               // under qmu_
  std::unordered_map<Request*, std::shared_ptr<Request>> retry_waiting_;  // under qmu_
  std::int64_t inflight_batches_ = 0;                                     // under qmu_
  std::uint64_t next_seq_ = 0;                                            // under qmu_
  std::optional<Status> no_workers_;  // under qmu_: every worker gave up (worker_gave_up)
  std::atomic<bool> stopping_flag_{false};
  std::atomic<bool> cancel_mode_{false};
  std::atomic<bool> workers_exit_{false};  // shutdown(cancel) began or a drain finished
  std::atomic<int> live_workers_{0};       // workers that have not given up

  std::vector<std::unique_ptr<Worker>> workers_;
  detail::ResultStore store_;

  mutable std::mutex order_mu_;
  std::unordered_map<std::string, OrderQueue> orders_;

  detail::RetryBudget budget_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::atomic<double> service_us_{0};

  // Hot counters live on their own cache lines: they are bumped from several threads at once.
  alignas(64) std::atomic<std::int64_t> inflight_requests_{0};
  alignas(64) std::atomic<std::uint64_t> submitted_{0};
  alignas(64) std::atomic<std::uint64_t> completed_{0};
  alignas(64) std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> timed_out_{0};
  std::atomic<std::uint64_t> cancelled_{0};
  std::atomic<std::uint64_t> shut_down_{0};
  std::atomic<std::uint64_t> retries_{0};
  std::atomic<std::uint64_t> retries_denied_{0};
  std::atomic<std::uint64_t> split_batches_{0};
  std::atomic<std::uint64_t> late_completions_{0};
  std::atomic<std::uint64_t> late_failures_{0};
  std::atomic<std::uint64_t> callback_exceptions_{0};
  std::atomic<std::uint64_t> model_exceptions_{0};
  std::atomic<std::uint64_t> watchdog_fired_{0};
  mutable std::mutex reasons_mu_;
  std::map<std::string, std::uint64_t> failures_by_reason_;
  std::map<std::string, std::uint64_t> rejections_by_reason_;
  std::map<std::string, std::uint64_t> late_failures_by_reason_;  // under reasons_mu_
  LogLimiter late_log_;     // late failures: their messages, rate-limited
  LogLimiter recycle_log_;  // failed recycle attempts
  Histogram queue_us_;
  Histogram compute_us_;
  Histogram request_us_;
  Histogram batch_size_{Histogram::batch_size_bounds()};

  std::mutex shutdown_mu_;
  bool shut_ = false;
};

// ---- Engine -----------------------------------------------------------------------------------

namespace {
Status validate_options(const EngineOptions& o, const ModelSignature& sig, std::int64_t max_rows) {
  auto bad = [](const std::string& m) { return invalid_argument_error("EngineOptions: " + m); };
  if (o.workers < 1 || o.workers > 1024) return bad("workers must be in 1..1024");
  if (o.max_inflight_per_worker < 1) return bad("max_inflight_per_worker must be >= 1");
  if (o.queue_capacity < 1) return bad("queue_capacity must be >= 1");
  if (o.completion_threads < 1 || o.completion_threads > 256) {
    return bad("completion_threads must be in 1..256");
  }
  if (o.priority_levels < 1 || o.priority_levels > 64)
    return bad("priority_levels must be in 1..64");
  if (o.default_priority < 1 || o.default_priority > o.priority_levels) {
    return bad("default_priority must be in 1..priority_levels (" +
               std::to_string(o.priority_levels) + ")");
  }
  if (o.priority_aging.count() < 0) return bad("priority_aging must be >= 0");
  if (o.batching.max_batch_size < 0) return bad("batching.max_batch_size must be >= 0");
  if (o.batching.max_queue_delay.count() < 0) return bad("batching.max_queue_delay must be >= 0");
  for (std::int64_t p : o.batching.preferred_batch_sizes) {
    if (p < 1 || p > max_rows) {
      return bad("preferred batch size " + std::to_string(p) + " is outside 1.." +
                 std::to_string(max_rows) + " (the max batch size" +
                 (sig.batched ? "" : "; the model is not batched") + ")");
    }
  }
  if (o.submit_timeout.count() < 0) return bad("submit_timeout must be >= 0");
  if (o.default_timeout && o.default_timeout->count() <= 0)
    return bad("default_timeout must be > 0");
  if (o.watchdog.count() < 0) return bad("watchdog must be >= 0");
  Status rec = o.recovery.validate();
  if (!rec.ok()) return rec.with_context("EngineOptions");
  if (o.breaker.failure_threshold < 0) return bad("breaker.failure_threshold must be >= 0");
  if (o.result_store_capacity < 1) return bad("result_store_capacity must be >= 1");
  if (o.result_ttl.count() < 0) return bad("result_ttl must be >= 0");
  if (o.intra_op_threads < 0) return bad("intra_op_threads must be >= 0");
  if (o.drain_timeout.count() < 0) return bad("drain_timeout must be >= 0");
  Status r = o.retry.validate();
  if (!r.ok()) return r.with_context("EngineOptions");
  return Status();
}
}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<Model> model,
                                               std::shared_ptr<Device> device,
                                               EngineOptions options) {
  if (!model) return invalid_argument_error("Engine::create: model is null");
  if (!device) return invalid_argument_error("Engine::create: device is null");
  const ModelSignature& sig = model->signature();
  // The max batch size rule (BatchingOptions::max_batch_size, engine.hpp).
  std::int64_t max_rows = 1;
  if (sig.batched) {
    const std::int64_t asked = options.batching.max_batch_size;
    const std::int64_t model_max = sig.max_batch_size;
    if (asked > 0 && model_max > 0 && asked > model_max) {
      return invalid_argument_error("EngineOptions: batching.max_batch_size " +
                                    std::to_string(asked) + " exceeds the model's max_batch_size " +
                                    std::to_string(model_max) + " (0 = the model's)");
    }
    max_rows = asked > 0 ? asked : (model_max > 0 ? model_max : kDefaultMaxBatchSize);
  }
  if (options.workers < 0) return invalid_argument_error("EngineOptions: workers must be >= 0");
  options = resolve_options(*model, *device, std::move(options));
  ASYNCINFER_RETURN_IF_ERROR(validate_options(options, sig, max_rows));
  options.batching.max_batch_size = max_rows;  // what Engine::options() reports
  auto core = std::make_shared<EngineCore>(std::move(model), std::move(device), std::move(options),
                                           max_rows);
  Status s = core->start();
  if (!s.ok()) {
    core->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    return s;
  }
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

EngineOptions Engine::resolve_options(const Model& model, const Device& device,
                                      EngineOptions options) {
  // The thread rule (docs/models.md, "Threads"): single-thread instances, one per core where the
  // model computes on host cores. A team of intra-op threads spins at every parallel region for
  // its slowest member and collapses when another process takes a core; workers do not.
  constexpr int kMaxAutoWorkers = 16;  // each worker holds its own copy of the model
  if (options.workers == 0) {
    options.workers =
        model.uses_host_cores(device) ? std::min(detail::available_cores(), kMaxAutoWorkers) : 1;
  }
  if (options.intra_op_threads == 0) options.intra_op_threads = 1;
  return options;
}

Engine::Engine(std::shared_ptr<EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() {
  if (core_) core_->shutdown(ShutdownMode::drain, core_->opt_.drain_timeout);
}

Result<Outputs> Engine::infer(Inputs inputs, const RequestOptions& options) {
  return core_->submit_future(std::move(inputs), options).get();
}

Future<Outputs> Engine::submit(Inputs inputs, const RequestOptions& options) {
  return core_->submit_future(std::move(inputs), options);
}

Status Engine::submit(Inputs inputs, Callback callback, const RequestOptions& options) {
  return core_->submit_callback(std::move(inputs), std::move(callback), options);
}

Status Engine::submit(std::string id, Inputs inputs, const RequestOptions& options) {
  return core_->submit_id(std::move(id), std::move(inputs), options);
}

Result<Outputs> Engine::result(std::string_view id, std::chrono::nanoseconds timeout) {
  return core_->result(id, timeout);
}

RequestState Engine::status(std::string_view id) const { return core_->status(id); }

Status Engine::cancel(std::string_view id) { return core_->cancel(id); }

Status Engine::release(std::string_view id) { return core_->release(id); }

void Engine::shutdown(ShutdownMode mode, std::optional<std::chrono::milliseconds> drain_timeout) {
  core_->shutdown(mode, drain_timeout.value_or(core_->opt_.drain_timeout));
}

EngineMetrics Engine::metrics() const { return core_->metrics(); }

EngineHealth Engine::health() const { return core_->health(); }

const ModelSignature& Engine::signature() const noexcept { return core_->sig_; }

const EngineOptions& Engine::options() const noexcept { return core_->opt_; }

Device& Engine::device() const noexcept { return *core_->device_; }

}  // namespace asyncinfer
