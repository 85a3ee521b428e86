// future.hpp — asyncinfer.Future: a C++ Future as a concurrent.futures.Future look-alike.
//
// Why native: a concurrent.futures.Future is resolved by calling set_result() with the GIL, so
// every request would cost a GIL hand-off from the completion thread to Python, plus a Condition
// and its lock per future (docs/performance.md measures both designs). asyncinfer.Future wraps
// the engine's own Future<T>: the engine fulfils it without the GIL, and result() waits on it
// with the GIL released. The GIL is taken on the completion thread only for what needs Python:
// add_done_callback functions, asyncio waiters, concurrent.futures.wait/as_completed waiters.
//
// Protocol kept: result(timeout), exception(timeout), done(), cancelled(), running(), cancel(),
// add_done_callback(fn) (fn(future), once; at once when already done), and the three internals
// concurrent.futures.wait() and as_completed() use on any future they are given (_condition,
// _waiters, _state), which are made the first time they are touched. It is awaitable: awaiting
// makes an asyncio future on the running loop, resolved on the loop's thread through
// loop.call_soon_threadsafe; cancelling the awaiting task cancels the request. It is not an
// instance of concurrent.futures.Future (so asyncio.wrap_future does not take it; await it).
//
// Outcome: the value (converted once, then the same objects on every call) or the exception
// (make_exception of the status, or for pipelines the exception a Python stage raised).
//
// Thread safety: methods run with the GIL; waits release it. The C++ future is thread-safe.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/status.hpp"
#include "runtime.hpp"

namespace asyncinfer::python {

namespace py = pybind11;

/// What an asyncinfer.Future waits on: a C++ Future<T> and how to turn its value into Python.
class FutureSource {
 public:
  virtual ~FutureSource() = default;
  virtual bool ready() const noexcept = 0;
  /// Block (the caller has released the GIL).
  virtual void wait() = 0;
  virtual bool wait_for(std::chrono::nanoseconds timeout) = 0;
  /// ok, or why a wait on this thread could never end (the engine's ordered delivery: a
  /// callback waiting for a later request of its own key); the wait is then not started.
  virtual Status wait_refused() { return Status(); }
  /// Requests cancellation; true when it reached a request that had not ended.
  virtual bool cancel() = 0;
  /// Once ready: ok, or the error.
  virtual Status status() const = 0;
  /// Once ready and ok: the value as Python (GIL held).
  virtual py::object value() = 0;
  /// Once ready and failed: an exception to raise instead of the status's (null: none).
  virtual py::object python_error() { return {}; }
  /// Runs fn once when ready (on the producer's completion executor; at once if already ready).
  virtual void on_complete(detail::UniqueFunction<void()> fn) = 0;

  /// CallbackScope owner of the threads that run on_complete functions.
  const void* owner = nullptr;
  std::shared_ptr<BindingStats> stats;
};

/// The Python object. Construct through make_future.
class PyFuture {
 public:
  explicit PyFuture(std::unique_ptr<FutureSource> source) : src(std::move(source)) {}
  std::unique_ptr<FutureSource> src;
  // Filled on first use (GIL held).
  bool has_outcome = false;
  bool failed = false;
  py::object outcome;
  py::object condition;  // threading.Condition, for concurrent.futures.wait / as_completed
  py::object waiters;    // their waiter objects
  // Set under `condition` by the completion hook, together with telling the waiters: once the
  // internals exist, _state follows this flag, not the C++ future, so that concurrent.futures
  // (which reads _state and installs waiters under the condition) never sees a future finished
  // whose waiters have not been told, or the other way round.
  bool notified = false;
  // cancel() returned True: the request ends Cancelled for Python whatever the engine delivers
  // (a result that was already on its way when the cancel landed is dropped), as
  // concurrent.futures promises. GIL held.
  bool cancel_won = false;
};

void init_future(py::module_& m);
/// A new asyncinfer.Future owning `src`.
py::object make_future(std::unique_ptr<FutureSource> src);

}  // namespace asyncinfer::python
