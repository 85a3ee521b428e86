// future.hpp — Future<T> / Promise<T>: one asynchronous Result<T>, with callbacks and cancel.
//
// Design: a Promise and its Future share one reference-counted state holding a mutex, a
// condition variable, the Result<T> once set, the completion callbacks and the cancel handlers.
// Completion is decided under the mutex (so a result is set exactly once: later sets return
// false), but nothing user-supplied ever runs under it: callbacks and cancel handlers are moved
// out first and run after the unlock. Waiters block on the condition variable (no polling) and
// are notified only when some are present.
//
// Where callbacks run:
//   - on_complete()/then() registered before completion run on the thread that completes the
//     promise, right after the result is stored, in registration order — or, when the producer
//     gave the promise a callback executor (the engine does: its completion executor), on that
//     executor, so a producer thread never runs user code;
//   - registered after completion, they run at once on the registering thread, before
//     on_complete() returns.
//   Each callback runs exactly once. An exception thrown by a callback is caught, counted in
//   unhandled_callback_exceptions() and reported through the log hook (log.hpp; stderr by
//   default); the other callbacks still run.
//
// Cancellation is cooperative and best effort (like std::stop_token): Future::cancel() marks the
// state and runs the producer's cancel handlers (Promise::on_cancel) on the cancelling thread.
// The producer decides what that means (the engine resolves the request as cancelled); a future
// whose result is already set ignores cancel.
//
// A Promise destroyed without a result resolves its future with `internal` ("broken promise"),
// so no future is left pending forever.
//
// A wait that could never end on the waiting thread: a producer may give the state a check
// (Promise::set_wait_check) that names such a wait. The engine does so with ordered delivery,
// where a callback waiting for a later request of its own key would wait for itself. Then, while
// the result is not set and the check says so, wait() returns at once, wait_for()/wait_until()
// return false at once and get() returns the check's error; the future stays valid and gets its
// result later as usual.
//
// Thread safety: every member of Future and Promise may be called from any thread. A Future is
// move-only (one owner), but get() may be called any number of times (it returns a copy).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "asyncinfer/detail/chrono.hpp"
#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/status.hpp"

namespace asyncinfer {

class Executor;

/// Number of exceptions thrown by user callbacks (future callbacks, executor tasks, timer
/// functions, engine callbacks) that the library caught, since the process started.
std::uint64_t unhandled_callback_exceptions() noexcept;

namespace detail {
/// Counts and reports (log.hpp) an exception caught from user code. `where` names the call site.
void report_callback_exception(const char* where, std::exception_ptr e) noexcept;
/// Posts `task` to `executor`; false (task untouched) when it has shut down. (executor.cpp)
bool post_to(Executor& executor, UniqueFunction<void()>& task);

template <class R>
struct is_result : std::false_type {};
template <class U>
struct is_result<Result<U>> : std::true_type {};

template <class T>
class FutureState : public std::enable_shared_from_this<FutureState<T>> {
 public:
  using Callback = UniqueFunction<void(const Result<T>&)>;
  using CancelHandler = UniqueFunction<void()>;

  /// Stores `r` and runs the callbacks. Returns false (and drops r) when already set.
  bool set(Result<T>&& r) {
    Callback first;
    std::vector<Callback> rest;
    CancelHandler cancel_first;
    std::vector<CancelHandler> cancel_rest;
    bool notify = false;
    {
      std::lock_guard lock(mu_);
      if (ready_.load(std::memory_order_relaxed)) return false;
      result_.emplace(std::move(r));
      ready_.store(true, std::memory_order_release);
      first = std::move(first_cb_);
      rest = std::move(more_cbs_);
      cancel_first = std::move(first_cancel_);
      cancel_rest = std::move(more_cancel_);
      notify = waiters_ > 0;
    }
    if (notify) cv_.notify_all();
    // The result is immutable from here on: read it without the lock.
    if (first && callback_executor_ != nullptr) {
      // Hand the callbacks to the executor (the producer's thread runs no user code).
      UniqueFunction<void()> task([self = this->shared_from_this(), first = std::move(first),
                                   rest = std::move(rest)]() mutable {
        self->run_callback(first);
        for (Callback& cb : rest) self->run_callback(cb);
      });
      if (post_to(*callback_executor_, task)) return true;
      task();  // the executor has shut down: run them here rather than never
      return true;
    }
    if (first) run_callback(first);
    for (Callback& cb : rest) run_callback(cb);
    return true;  // cancel handlers are destroyed here, outside the lock
  }

  /// Callbacks registered before completion run on `executor` instead of the completing thread.
  /// Set by the producer before the future is handed out.
  void set_callback_executor(Executor* executor) noexcept { callback_executor_ = executor; }

  bool is_ready() const noexcept { return ready_.load(std::memory_order_acquire); }

  /// Valid only once is_ready() is true.
  const Result<T>& result() const noexcept { return *result_; }

  /// Set by the producer before the future is handed out (Promise::set_wait_check).
  void set_wait_check(UniqueFunction<Status()> check) noexcept { wait_check_ = std::move(check); }

  /// ok, or why a wait for the result on this thread would never end (the result is not set and
  /// the producer's check says so).
  Status wait_would_never_end() {
    if (!wait_check_ || is_ready()) return Status();
    return wait_check_();
  }

  void wait() {
    if (is_ready()) return;
    if (!wait_would_never_end().ok()) return;
    std::unique_lock lock(mu_);
    ++waiters_;
    cv_.wait(lock, [this] { return ready_.load(std::memory_order_relaxed); });
    --waiters_;
  }

  /// Blocks until ready or `deadline`; time_point::max() waits without a limit.
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    if (is_ready()) return true;
    if (!wait_would_never_end().ok()) return false;
    if (no_limit(deadline)) {
      wait();
      return true;
    }
    std::unique_lock lock(mu_);
    ++waiters_;
    const bool ok =
        cv_.wait_until(lock, deadline, [this] { return ready_.load(std::memory_order_relaxed); });
    --waiters_;
    return ok;
  }

  void add_callback(Callback cb) {
    {
      std::lock_guard lock(mu_);
      if (!ready_.load(std::memory_order_relaxed)) {
        if (!first_cb_) {
          first_cb_ = std::move(cb);
        } else {
          more_cbs_.push_back(std::move(cb));
        }
        return;
      }
    }
    // Already complete: run now, on this thread. The callback may destroy the last Future that
    // refers to this state (erasing it from a map, say): keep the state, and so the result it
    // reads, alive until it returns.
    const auto keep = this->shared_from_this();
    run_callback(cb);
  }

  /// Marks cancellation and runs the cancel handlers. False when already set or cancelled.
  bool request_cancel() {
    CancelHandler first;
    std::vector<CancelHandler> rest;
    {
      std::lock_guard lock(mu_);
      if (ready_.load(std::memory_order_relaxed) || cancel_.load(std::memory_order_relaxed)) {
        return false;
      }
      cancel_.store(true, std::memory_order_release);
      first = std::move(first_cancel_);
      rest = std::move(more_cancel_);
    }
    if (first) run_handler(first);
    for (CancelHandler& h : rest) run_handler(h);
    return true;
  }

  bool cancel_requested() const noexcept { return cancel_.load(std::memory_order_acquire); }

  /// Registers a cancel handler; runs it at once when cancel was already requested (and the
  /// result is not set yet). Dropped without running once the result is set.
  void on_cancel(CancelHandler h) {
    {
      std::lock_guard lock(mu_);
      if (ready_.load(std::memory_order_relaxed)) return;
      if (!cancel_.load(std::memory_order_relaxed)) {
        if (!first_cancel_) {
          first_cancel_ = std::move(h);
        } else {
          more_cancel_.push_back(std::move(h));
        }
        return;
      }
    }
    run_handler(h);
  }

 private:
  void run_callback(Callback& cb) noexcept {
    try {
      cb(*result_);
    } catch (...) {
      report_callback_exception("future callback", std::current_exception());
    }
  }
  static void run_handler(CancelHandler& h) noexcept {
    try {
      h();
    } catch (...) {
      report_callback_exception("cancel handler", std::current_exception());
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> cancel_{false};
  int waiters_ = 0;
  std::optional<Result<T>> result_;
  Callback first_cb_;  // the common case, one callback, needs no vector allocation
  std::vector<Callback> more_cbs_;
  CancelHandler first_cancel_;
  std::vector<CancelHandler> more_cancel_;
  Executor* callback_executor_ = nullptr;
  UniqueFunction<Status()> wait_check_;  // set before the state is shared; read-only afterwards
};
}  // namespace detail

template <class T>
class Promise;

/// The consumer side of one asynchronous Result<T>.
template <class T>
class [[nodiscard]] Future {
 public:
  using value_type = T;

  /// An invalid future (valid() is false): waits return at once, get() is failed_precondition.
  Future() = default;
  Future(Future&&) noexcept = default;
  Future& operator=(Future&&) noexcept = default;
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  bool valid() const noexcept { return state_ != nullptr; }
  /// True once the result is set. Never blocks.
  bool is_ready() const noexcept { return state_ && state_->is_ready(); }

  /// Blocks until the result is set (or returns at once, the result unset, when the wait could
  /// never end on this thread: see the header comment).
  void wait() const {
    if (state_) state_->wait();
  }
  /// Blocks at most `timeout`; true when the result is set. `duration::max()` (of any unit)
  /// means no limit; a timeout too long to represent saturates to no limit (detail/chrono.hpp).
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return !state_ || state_->wait_until(detail::deadline_after(timeout));
  }
  /// Blocks until `deadline` (any clock; measured on the steady clock as the same distance from
  /// now); true when the result is set. `time_point::max()` means no limit.
  template <class Clock, class Duration>
  bool wait_until(const std::chrono::time_point<Clock, Duration>& deadline) const {
    return !state_ || state_->wait_until(detail::to_steady(deadline));
  }

  /// Blocks until the result is set and returns a copy of it. May be called repeatedly. Returns
  /// the producer's error at once instead when the wait could never end on this thread (see the
  /// header comment; the engine's ordered delivery).
  Result<T> get() const {
    if (!state_) return failed_precondition_error("Future::get on an invalid future");
    if (Status never = state_->wait_would_never_end(); !never.ok()) return never;
    state_->wait();
    return state_->result();
  }

  /// Runs `fn(const Result<T>&)` once the result is set (see the header comment for the thread).
  /// On an invalid future, runs it at once with failed_precondition.
  template <class F>
  void on_complete(F&& fn) {
    if (!state_) {
      Result<T> r = failed_precondition_error("on_complete on an invalid future");
      fn(r);
      return;
    }
    state_->add_callback(typename detail::FutureState<T>::Callback(std::forward<F>(fn)));
  }

  /// Chains `fn` to run on completion; returns a future of what it returns. `fn` takes either
  /// `const Result<T>&` (sees errors) or `const T&` (runs only on success; errors pass through).
  /// It returns U or Result<U>. An exception from fn resolves the new future with `internal`.
  /// Cancelling the returned future cancels this one.
  template <class F>
  auto then(F&& fn);

  /// Requests cancellation (best effort; see the header comment). Returns true when the request
  /// reached a future whose result was not yet set and not already cancelled.
  bool cancel() const { return state_ && state_->request_cancel(); }
  bool cancel_requested() const noexcept { return state_ && state_->cancel_requested(); }

  /// For combinators in this library.
  const std::shared_ptr<detail::FutureState<T>>& state() const noexcept { return state_; }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<detail::FutureState<T>> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::FutureState<T>> state_;
};

/// The producer side of one asynchronous Result<T>.
template <class T>
class Promise {
 public:
  Promise() : state_(std::make_shared<detail::FutureState<T>>()) {}
  Promise(Promise&& other) noexcept = default;
  Promise& operator=(Promise&& other) noexcept {
    if (this != &other) {
      break_if_unset();
      state_ = std::move(other.state_);
      future_taken_ = other.future_taken_;
    }
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { break_if_unset(); }

  /// The future of this promise. May be called once; a second call aborts (programming error).
  Future<T> get_future() {
    ASYNCINFER_CHECK(state_ != nullptr && !future_taken_);
    future_taken_ = true;
    return Future<T>(state_);
  }

  /// Sets the result and runs the callbacks on this thread. False when already set.
  bool set_result(Result<T> r) {
    // Keep the state alive through the notify and the callbacks: a woken waiter may destroy this
    // promise's owner (and so the promise) while set() is still running.
    std::shared_ptr<detail::FutureState<T>> keep = state_;
    return keep && keep->set(std::move(r));
  }
  bool set_value(T v) { return set_result(Result<T>(std::move(v))); }
  bool set_error(Status s) { return set_result(Result<T>(std::move(s))); }

  bool is_set() const noexcept { return state_ && state_->is_ready(); }
  /// Makes callbacks registered before completion run on `executor` (which must outlive the
  /// result being set) instead of on the thread that sets the result.
  void set_callback_executor(Executor* executor) noexcept {
    if (state_) state_->set_callback_executor(executor);
  }
  bool is_cancel_requested() const noexcept { return state_ && state_->cancel_requested(); }
  /// Gives waits a check, called on the waiting thread while the result is not set: a non-ok
  /// Status says that this thread's wait could never end, and the wait returns at once (get()
  /// with that Status). Call before handing out the future. `check` must be cheap, must not
  /// block, and may run on any thread that waits.
  void set_wait_check(detail::UniqueFunction<Status()> check) noexcept {
    if (state_) state_->set_wait_check(std::move(check));
  }
  /// Runs `h` when the consumer cancels (at once, on this thread, if it already did). Dropped
  /// unrun once the result is set.
  void on_cancel(detail::UniqueFunction<void()> h) {
    if (state_) state_->on_cancel(std::move(h));
  }

 private:
  void break_if_unset() {
    if (state_ && !state_->is_ready()) {
      state_->set(Result<T>(
          internal_error("broken promise: the producer was destroyed without setting a result")));
    }
  }
  std::shared_ptr<detail::FutureState<T>> state_;
  bool future_taken_ = false;
};

/// A future that is already complete with `r`.
template <class T>
Future<T> make_ready_future(Result<T> r) {
  Promise<T> p;
  Future<T> f = p.get_future();
  p.set_result(std::move(r));
  return f;
}

namespace detail {
template <class R>
struct unwrap_result {
  using type = R;
};
template <class U>
struct unwrap_result<Result<U>> {
  using type = U;
};

template <class T, class F>
auto invoke_then(F& fn, const Result<T>& r) {
  if constexpr (std::is_invocable_v<F&, const Result<T>&>) {
    using R = std::invoke_result_t<F&, const Result<T>&>;
    using U = typename unwrap_result<R>::type;
    return Result<U>(fn(r));
  } else {
    using R = std::invoke_result_t<F&, const T&>;
    using U = typename unwrap_result<R>::type;
    if (!r.ok()) return Result<U>(r.status());
    return Result<U>(fn(r.value()));
  }
}
}  // namespace detail

template <class T>
template <class F>
auto Future<T>::then(F&& fn) {
  using FD = std::decay_t<F>;
  using R = decltype(detail::invoke_then<T>(std::declval<FD&>(), std::declval<const Result<T>&>()));
  using U = typename R::value_type;
  Promise<U> p;
  Future<U> out = p.get_future();
  // Cancelling the continuation cancels the upstream producer too.
  p.on_cancel([weak = std::weak_ptr<detail::FutureState<T>>(state_)] {
    if (auto s = weak.lock()) s->request_cancel();
  });
  on_complete([p = std::move(p), f = FD(std::forward<F>(fn))](const Result<T>& r) mutable {
    try {
      p.set_result(detail::invoke_then<T>(f, r));
    } catch (const std::exception& e) {
      p.set_error(internal_error(std::string("exception in then() continuation: ") + e.what()));
    } catch (...) {
      p.set_error(internal_error("unknown exception in then() continuation"));
    }
  });
  return out;
}

/// Completes when every input has completed; holds each input's Result in input order (a failed
/// input does not fail the others). Cancelling it cancels every input. Empty input: ready at once.
template <class T>
Future<std::vector<Result<T>>> when_all(std::vector<Future<T>> futures) {
  using Out = std::vector<Result<T>>;
  struct Ctx {
    std::mutex mu;
    std::vector<std::optional<Result<T>>> slots;
    std::size_t remaining = 0;
    Promise<Out> promise;
  };
  if (futures.empty()) return make_ready_future<Out>(Out{});
  auto ctx = std::make_shared<Ctx>();
  ctx->slots.resize(futures.size());
  ctx->remaining = futures.size();
  Future<Out> out = ctx->promise.get_future();
  std::vector<std::weak_ptr<detail::FutureState<T>>> inputs;
  inputs.reserve(futures.size());
  for (auto& f : futures) inputs.push_back(f.state());
  ctx->promise.on_cancel([inputs = std::move(inputs)] {
    for (auto& w : inputs) {
      if (auto s = w.lock()) s->request_cancel();
    }
  });
  for (std::size_t i = 0; i < futures.size(); ++i) {
    futures[i].on_complete([ctx, i](const Result<T>& r) {
      bool last = false;
      {
        std::lock_guard lock(ctx->mu);
        ctx->slots[i].emplace(r);
        last = --ctx->remaining == 0;
      }
      if (!last) return;
      Out results;
      results.reserve(ctx->slots.size());
      for (auto& s : ctx->slots) results.push_back(std::move(*s));
      ctx->promise.set_value(std::move(results));
    });
  }
  return out;
}

/// The first input to complete, with its index.
template <class T>
struct AnyResult {
  std::size_t index;
  Result<T> result;
};

/// Completes with the first input to complete (success or error). invalid_argument for an empty
/// input. Cancelling it cancels every input; the later results are dropped.
template <class T>
Future<AnyResult<T>> when_any(std::vector<Future<T>> futures) {
  if (futures.empty()) {
    return make_ready_future<AnyResult<T>>(invalid_argument_error("when_any of no futures"));
  }
  auto promise = std::make_shared<Promise<AnyResult<T>>>();
  Future<AnyResult<T>> out = promise->get_future();
  std::vector<std::weak_ptr<detail::FutureState<T>>> inputs;
  for (auto& f : futures) inputs.push_back(f.state());
  promise->on_cancel([inputs = std::move(inputs)] {
    for (auto& w : inputs) {
      if (auto s = w.lock()) s->request_cancel();
    }
  });
  for (std::size_t i = 0; i < futures.size(); ++i) {
    futures[i].on_complete([promise, i](const Result<T>& r) {
      promise->set_value(AnyResult<T>{i, r});  // only the first set wins
    });
  }
  return out;
}

}  // namespace asyncinfer
