// The engine (engine.hpp). Threads, all fixed at creation:
//   - one worker thread per worker: forms batches from the queue and enqueues them on its stream;
//   - the device's stream threads (cpu/sim: one per worker stream);
//   - one dispatcher thread: runs the streams' completion points (library code only: splits the
//     outputs, ends requests, fulfils futures — waking waiters — and hands callbacks on);
//   - completion_threads completion threads: run user callbacks and future continuations, so a
//     callback may block on another future without starving the dispatcher (docs/design.md,
//     guarantee 2);
//   - one deadline timer thread (deadlines, retry backoff, hang watchdog);
//   - one reaper thread: destroys streams and model instances replaced by the watchdog.
//
// Locks: qmu_ (queue, retry set, shutdown state) → order_mu_ / budget / timer internals; worker
// mutexes are never held together with qmu_. No user code runs under any of them.
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

namespace detail {
namespace {
std::atomic<AssemblyHook> g_assembly_hook{nullptr};
}  // namespace

inline double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// `t + d` without overflow: a duration too long to represent means "never" (time_point::max).
template <class Rep, class Period>
Clock::time_point saturating_add(Clock::time_point t, std::chrono::duration<Rep, Period> d) {
  if (d <= std::chrono::duration<Rep, Period>::zero()) return t;
  const auto room = Clock::time_point::max() - t;
  if (d >= std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(room)) {
    return Clock::time_point::max();
  }
  return t + std::chrono::duration_cast<Clock::duration>(d);
}

inline std::string ms_text(std::chrono::nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", std::chrono::duration<double, std::milli>(d).count());
  return buf;
}

void set_assembly_hook(AssemblyHook hook) noexcept { g_assembly_hook.store(hook); }
}  // namespace detail

using detail::Batch;
using detail::ms_text;
using detail::Request;
using detail::saturating_add;
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
  bool recycle = false;                         // under mu
  std::atomic<bool> recycle_wanted{false};      // the same, readable without mu (next_batch)
  Breaker breaker = Breaker::closed;            // under mu
  int consecutive_failures = 0;                 // under mu
  Clock::time_point open_until{};               // under mu
  std::atomic<std::uint64_t> batches{0};
  std::atomic<std::uint64_t> failed_batches{0};
  std::atomic<std::uint64_t> recycles{0};
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
        reaper_(1, "ai-reaper"),
        queue_(opt_.priority_levels),
        store_(opt_.result_store_capacity, opt_.result_ttl),
        budget_(opt_.retry),
        rng_(std::random_device{}()) {}

  ~EngineCore() { shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0)); }

  Status start() {
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    const int threads = opt_.intra_op_threads > 0
                            ? opt_.intra_op_threads
                            : std::max(1, static_cast<int>(cores) / opt_.workers);
    for (int i = 0; i < opt_.workers; ++i) {
      auto w = std::make_unique<Worker>();
      w->index = i;
      ASYNCINFER_RETURN_IF_ERROR(make_stream_and_instance(*w, threads));
      workers_.push_back(std::move(w));
    }
    intra_op_threads_ = threads;
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

  /// Accepts a prepared request into the queue, or refuses it (nothing registered).
  Status accept(const std::shared_ptr<Request>& r) {
    std::unique_lock lock(qmu_);
    if (stopping_) return reject("shut_down", unavailable_error("engine is shut down"));
    if (queue_.size() >= opt_.queue_capacity) {
      if (opt_.queue_full_policy == QueueFullPolicy::reject) {
        return reject("queue_full",
                      resource_exhausted_error(context("queue full", r->tag) + ": " +
                                               std::to_string(queue_.size()) +
                                               " requests queued (queue_capacity " +
                                               std::to_string(opt_.queue_capacity) + ")"));
      }
      const Clock::time_point until = saturating_add(Clock::now(), opt_.submit_timeout);
      const bool room = space_cv_.wait_until(
          lock, until, [this] { return stopping_ || queue_.size() < opt_.queue_capacity; });
      if (stopping_) return reject("shut_down", unavailable_error("engine is shut down"));
      if (!room) {
        return reject("queue_full",
                      resource_exhausted_error(context("queue full", r->tag) + ": still " +
                                               std::to_string(queue_.size()) +
                                               " requests queued after waiting " +
                                               ms_text(opt_.submit_timeout) + " (submit_timeout)"));
      }
    }
    const Clock::time_point now = Clock::now();
    if (detail::is_final(r->stage.load(std::memory_order_acquire))) {
      // Ended before it reached the queue (cancel(id) between the result store and here; the
      // check is under qmu_, as is try_resolve's for queued requests): it is accepted and already
      // resolved, and queueing it would run it and end it a second time. finish() counted it
      // out of the requests in flight, so count it in.
      inflight_requests_.fetch_add(1, std::memory_order_relaxed);
      submitted_.fetch_add(1, std::memory_order_relaxed);
      return Status();
    }
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
    r->seq = next_seq_++;
    if (opt_.ordered_delivery) {
      std::lock_guard olock(order_mu_);
      r->order_seq = orders_[r->sequence_key].next_assign++;
    }
    r->enqueued = now;
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

  Status make_stream_and_instance(Worker& w, int threads) {
    StreamOptions so;
    so.host_func_executor = completion_point_executor();
    so.name = "ai-w" + std::to_string(w.index) + "-stream";
    auto stream = device_->create_stream(so);
    if (!stream.ok()) return stream.status().with_context("worker " + std::to_string(w.index));
    InstanceOptions io;
    io.worker_index = w.index;
    io.intra_op_threads = threads;
    auto instance = model_->create_instance(*device_, **stream, io);
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
          if (stop_workers()) break;
          // An open breaker first: a recycle that failed opened it, and is tried again only
          // after the cool-down (never in a tight loop).
          if (w.breaker == Breaker::open) {
            if (Clock::now() >= w.open_until) {
              w.breaker = Breaker::half_open;
              continue;
            }
            w.cv.wait_until(lock, w.open_until);
            continue;
          }
          if (w.recycle) {
            do_recycle = true;
            break;
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
        if (w.recycle_wanted.load(std::memory_order_acquire)) continue;  // recycle, then go on
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
        const auto delay = opt_.batching.max_queue_delay;
        wake = oldest + delay;
        // Never hold a request in a forming batch past its deadline minus the delay.
        if (nearest_deadline != Clock::time_point::max() && nearest_deadline - delay < wake) {
          wake = nearest_deadline - delay;
        }
        dispatch = now >= wake;
      }
      if (!dispatch) {
        qcv_.wait_until(lock, wake);
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
    try_resolve(r, detail::stage_for_error(s.code()), std::move(s));
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

  /// A batch that never reached its stream (or whose completion point could not be enqueued).
  void end_without_running(Worker& w, const std::shared_ptr<Batch>& batch, Status s) {
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
    if (batch->done.exchange(true)) return;  // the watchdog ended it first
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
    for (const auto& r : batch->requests) {
      if (r->stage.load(std::memory_order_acquire) == Stage::running) live.push_back(r);
    }
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
    {
      std::lock_guard lock(qmu_);
      for (auto it = rs.rbegin(); it != rs.rend(); ++it) {
        const std::shared_ptr<Request>& r = *it;
        Stage exp = Stage::running;
        if (stopping_ && mode_ == ShutdownMode::cancel) {
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
      try_resolve(r, Stage::shut_down,
                  aborted_error(context("engine shut down before the request completed", r->tag)));
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
      if (now + wait >= r->deadline) {
        why_not = "no time left before the deadline for attempt " + std::to_string(attempts + 1);
      } else if (!budget_.try_retry(now)) {
        retries_denied_.fetch_add(1, std::memory_order_relaxed);
        why_not = "retry budget exhausted";
      } else {
        {
          std::lock_guard lock(qmu_);
          Stage exp = Stage::running;
          if (!r->stage.compare_exchange_strong(exp, Stage::retry_wait,
                                                std::memory_order_acq_rel)) {
            return;  // ended meanwhile (deadline, cancel)
          }
          r->batch.reset();
          retry_waiting_.emplace(r.get(), r);
        }
        retries_.fetch_add(1, std::memory_order_relaxed);
        TimerId id = timer_.add(now + wait, [this, r] { requeue_after_backoff(r); });
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
    try_resolve(r, detail::stage_for_error(final.code()), std::move(final));
  }

  void requeue_after_backoff(const std::shared_ptr<Request>& r) {
    bool shut = false;
    {
      std::lock_guard lock(qmu_);
      auto it = retry_waiting_.find(r.get());
      if (it == retry_waiting_.end()) return;  // ended meanwhile
      if (stopping_ && mode_ == ShutdownMode::cancel) {
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
  /// destroyed by the reaper thread, so a kernel that ignores its stop token cannot block this
  /// worker; batches still queued on the old stream come back through requeue_all.
  void recycle(Worker& w) {
    std::unique_ptr<Stream> old_stream = std::move(w.stream);
    std::unique_ptr<ModelInstance> old_instance = std::move(w.instance);
    {
      std::lock_guard lock(w.mu);
      ++w.generation;
    }
    Status s = make_stream_and_instance(w, intra_op_threads_);
    {
      std::lock_guard lock(w.mu);
      if (s.ok()) {
        w.recycle = false;
        w.recycle_wanted.store(false, std::memory_order_release);
      } else {
        // Try again after a cool-down; meanwhile the other workers serve the queue.
        w.breaker = Breaker::open;
        w.open_until =
            Clock::now() + std::max(opt_.breaker.cooldown, std::chrono::milliseconds(100));
        std::fprintf(stderr, "asyncinfer: worker %d could not be recycled: %s\n", w.index,
                     s.to_string().c_str());
      }
    }
    w.recycles.fetch_add(1, std::memory_order_relaxed);
    Task reap([s = std::move(old_stream), i = std::move(old_instance)]() mutable {
      s.reset();
      i.reset();
    });
    if (!reaper_.post(std::move(reap))) reap();  // NOLINT(bugprone-use-after-move)
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
    {
      std::lock_guard lock(w.mu);
      ++w.consecutive_failures;
      if (w.breaker == Breaker::half_open ||
          w.consecutive_failures >= opt_.breaker.failure_threshold) {
        w.breaker = Breaker::open;
        w.open_until = Clock::now() + opt_.breaker.cooldown;
        w.consecutive_failures = 0;
      }
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
    stopping_flag_.store(true, std::memory_order_release);
    wake_everyone();
    if (mode == ShutdownMode::drain) {
      std::unique_lock lock(qmu_);
      const Clock::time_point until = saturating_add(Clock::now(), drain_timeout);
      const bool drained = drain_cv_.wait_until(lock, until, [this] {
        return mode_ == ShutdownMode::cancel ||
               (queue_.empty() && retry_waiting_.empty() && inflight_batches_ == 0);
      });
      if (!drained || mode_ == ShutdownMode::cancel) {
        lock.unlock();
        escalate_to_cancel();
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
    }
    m.batches = batches_.load();
    m.attempts = attempts_.load();
    m.retries = retries_.load();
    m.retries_denied_by_budget = retries_denied_.load();
    m.split_batches = split_batches_.load();
    m.late_completions = late_completions_.load();
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
    for (const auto& w : workers_) {
      WorkerMetrics wm;
      wm.index = w->index;
      {
        std::lock_guard lock(w->mu);
        wm.breaker = w->breaker == Breaker::closed ? "closed"
                     : w->breaker == Breaker::open ? "open"
                                                   : "half_open";
        wm.inflight_batches = w->inflight;
      }
      wm.batches = w->batches.load();
      wm.failed_batches = w->failed_batches.load();
      wm.recycles = w->recycles.load();
      m.workers.push_back(std::move(wm));
    }
    m.queue_us = queue_us_.snapshot();
    m.compute_us = compute_us_.snapshot();
    m.request_us = request_us_.snapshot();
    m.batch_size = batch_size_.snapshot();
    return m;
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
  std::atomic<bool> stopping_flag_{false};
  std::atomic<bool> cancel_mode_{false};

  std::vector<std::unique_ptr<Worker>> workers_;
  detail::ResultStore store_;

  std::mutex order_mu_;
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
  std::atomic<std::uint64_t> callback_exceptions_{0};
  std::atomic<std::uint64_t> model_exceptions_{0};
  std::atomic<std::uint64_t> watchdog_fired_{0};
  mutable std::mutex reasons_mu_;
  std::map<std::string, std::uint64_t> failures_by_reason_;
  std::map<std::string, std::uint64_t> rejections_by_reason_;
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

const ModelSignature& Engine::signature() const noexcept { return core_->sig_; }

const EngineOptions& Engine::options() const noexcept { return core_->opt_; }

Device& Engine::device() const noexcept { return *core_->device_; }

}  // namespace asyncinfer
