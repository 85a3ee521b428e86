// future.cpp — asyncinfer.Future (future.hpp).
#include "future.hpp"

#include <string>
#include <vector>

#include "convert.hpp"

namespace asyncinfer::python {
namespace {

PyObject* g_condition_type = nullptr;  // threading.Condition
PyObject* g_resolve_aio = nullptr;     // resolves an asyncio future from an asyncinfer.Future
PyObject* g_get_running_loop = nullptr;

PyFuture& cast(py::handle self) { return self.cast<PyFuture&>(); }

/// The request's status as Python sees it (cancel_won turns a late success into Cancelled).
Status status_of(PyFuture& f) {
  Status s = f.src->status();
  if (f.cancel_won && s.code() != StatusCode::cancelled) {
    return Status(StatusCode::cancelled,
                  "cancelled by Future.cancel() (the request's own outcome, " +
                      std::string(to_string(s.code())) + ", arrived after it and is dropped)");
  }
  return s;
}

/// The outcome, converted on first use.
void settle(PyFuture& f) {
  if (f.has_outcome) return;
  const Status s = status_of(f);
  if (s.ok()) {
    f.outcome = f.src->value();
    f.failed = false;
  } else {
    py::object pe = f.cancel_won ? py::object() : f.src->python_error();
    f.outcome = pe ? pe : make_exception(s);
    f.failed = true;
  }
  f.has_outcome = true;
}

bool is_cancelled(PyFuture& f) {
  return f.src->ready() && status_of(f).code() == StatusCode::cancelled;
}

/// Waits for the result with the GIL released; TimeoutError when `timeout` passes first, and
/// FailedPrecondition at once when the wait could never end on this thread (FutureSource::
/// wait_refused: an ordered callback waiting for a later request of its own key).
void wait(PyFuture& f, const py::object& timeout) {
  if (f.src->ready()) return;
  auto t = to_duration(timeout, "timeout");
  if (Status refused = f.src->wait_refused(); !refused.ok()) raise_status(refused);
  if (!t) {
    without_gil([&] { f.src->wait(); });
    if (!f.src->ready()) {  // refused inside the wait (the check above raced nothing: defensive)
      raise_status(
          failed_precondition_error("the wait for this request returned without its "
                                    "result (EngineOptions::ordered_delivery)"));
    }
    return;
  }
  const auto limit = *t < std::chrono::nanoseconds::zero() ? std::chrono::nanoseconds::zero() : *t;
  if (!without_gil([&] { return f.src->wait_for(limit); })) {
    raise_wait_timeout("the request did not end within " + std::to_string(to_seconds(limit)) +
                       " s of waiting (the request goes on; cancel() stops it)");
  }
}

[[noreturn]] void raise_outcome(PyFuture& f) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(f.outcome.ptr())), f.outcome.ptr());
  throw py::error_already_set();
}

/// Tells concurrent.futures waiters that `self` is done (GIL held).
void notify_waiters(const py::object& self) {
  PyFuture& f = cast(self);
  settle(f);
  const bool cancelled = is_cancelled(f);
  f.condition.attr("acquire")();
  try {
    f.notified = true;
    for (py::handle w : py::list(f.waiters)) {
      if (cancelled) {
        w.attr("add_cancelled")(self);
      } else if (f.failed) {
        w.attr("add_exception")(self);
      } else {
        w.attr("add_result")(self);
      }
    }
    f.condition.attr("notify_all")();
  } catch (...) {
    f.condition.attr("release")();
    throw;
  }
  f.condition.attr("release")();
}

/// Makes the concurrent.futures internals and the completion hook that serves them.
void arm_waiters(const py::object& self) {
  PyFuture& f = cast(self);
  if (f.condition) return;
  f.condition = py::reinterpret_borrow<py::object>(g_condition_type)();
  f.waiters = py::list();
  f.src->on_complete([self = PyRef(self), owner = f.src->owner, stats = f.src->stats]() mutable {
    LibraryGil gil(owner);
    if (!gil) return self.leak();
    try {
      notify_waiters(self.object());
    } catch (py::error_already_set& e) {
      report_callback_exception(e, "a concurrent.futures waiter", stats.get());
    }
    self.reset();
  });
}

void call_done_callback(const py::object& fn, const py::object& self, BindingStats* stats) {
  try {
    fn(self);
  } catch (py::error_already_set& e) {
    report_callback_exception(e, "done callback " + py::repr(fn).cast<std::string>(), stats);
  }
}

/// Runs fn(self) now, unless a done callback is running on this thread already (it added a
/// callback to a future that is done): then right after it returns, on this thread. A chain of
/// callbacks that each add the next to a future already done thus runs in a loop, not as a
/// recursion that Python's limit ends (test_future_chain_from_done_callbacks: 2000 links). With
/// the GIL.
void run_done_callback(const py::object& fn, const py::object& self, BindingStats* stats) {
  struct Pending {
    py::object fn;
    py::object self;
    BindingStats* stats;
  };
  static thread_local std::vector<Pending>* pending = nullptr;
  if (pending != nullptr) {
    pending->push_back({fn, self, stats});
    return;
  }
  std::vector<Pending> queue;
  pending = &queue;
  struct Reset {
    ~Reset() { pending = nullptr; }
  } reset;
  call_done_callback(fn, self, stats);
  for (std::size_t i = 0; i < queue.size(); ++i) {
    Pending next = std::move(queue[i]);  // moved out: the call may add to the queue
    call_done_callback(next.fn, next.self, next.stats);
  }
}

void add_done_callback(const py::object& self, const py::object& fn) {
  PyFuture& f = cast(self);
  if (!PyCallable_Check(fn.ptr())) raise_invalid("add_done_callback: fn is not callable");
  if (f.src->ready()) {
    run_done_callback(fn, self, f.src->stats.get());
    return;
  }
  f.src->on_complete(
      [self = PyRef(self), fn = PyRef(fn), owner = f.src->owner, stats = f.src->stats]() mutable {
        LibraryGil gil(owner);
        if (!gil) {
          self.leak();
          fn.leak();
          return;
        }
        run_done_callback(fn.object(), self.object(), stats.get());
        fn.reset();
        self.reset();
      });
}

/// Sets asyncio future `aio` from `self` (on the loop's thread).
void resolve_aio(const py::object& aio, const py::object& self) {
  if (aio.attr("done")().cast<bool>()) return;
  PyFuture& f = cast(self);
  settle(f);
  if (is_cancelled(f)) {
    aio.attr("cancel")();  // as asyncio.wrap_future does: the awaiting task gets CancelledError
  } else if (f.failed) {
    aio.attr("set_exception")(f.outcome);
  } else {
    aio.attr("set_result")(f.outcome);
  }
}

py::object await_future(const py::object& self) {
  PyFuture& f = cast(self);
  if (g_get_running_loop == nullptr) {
    g_get_running_loop =
        py::object(py::module_::import("asyncio").attr("get_running_loop")).release().ptr();
  }
  py::object loop = py::reinterpret_borrow<py::object>(g_get_running_loop)();
  py::object aio = loop.attr("create_future")();
  if (f.src->ready()) {
    resolve_aio(aio, self);
    return aio.attr("__await__")();
  }
  f.src->on_complete([loop = PyRef(loop), aio = PyRef(aio), self = PyRef(self),
                      owner = f.src->owner, stats = f.src->stats]() mutable {
    LibraryGil gil(owner);
    if (!gil) {
      loop.leak();
      aio.leak();
      self.leak();
      return;
    }
    try {
      // An awaiting task cancelled meanwhile has nobody left to resolve for, and its loop may be
      // closing: asyncio.run cancels the tasks left when it ends, which cancels their requests
      // (below), whose completions then come here while the loop closes its self-pipe. CPython
      // closes that socket and call_soon_threadsafe writes to it each without the GIL: a race
      // on the descriptor (ThreadSanitizer saw it in tests/python/test_exit.py). So no wake-up
      // for a future already done.
      if (!aio.object().attr("done")().cast<bool>()) {
        loop.object().attr("call_soon_threadsafe")(py::handle(g_resolve_aio), aio.object(),
                                                   self.object());
      }
    } catch (py::error_already_set& e) {
      // A closed loop has nobody left to resolve for; anything else is reported.
      if (!e.matches(PyExc_RuntimeError) || !loop.object().attr("is_closed")().cast<bool>()) {
        report_callback_exception(e, "resolving an awaited asyncinfer.Future", stats.get());
      }
    }
    loop.reset();
    aio.reset();
    self.reset();
  });
  // Cancelling the task that awaits cancels the request.
  aio.attr("add_done_callback")(py::cpp_function([self](const py::object& done) {
    if (done.attr("cancelled")().cast<bool>()) cast(self).src->cancel();
  }));
  return aio.attr("__await__")();
}

std::string state_name(PyFuture& f) {
  if (!f.src->ready()) return "pending";
  switch (status_of(f).code()) {
    case StatusCode::ok:
      return "finished";
    case StatusCode::cancelled:
      return "cancelled";
    default:
      return "failed (" + std::string(to_string(status_of(f).code())) + ")";
  }
}

}  // namespace

py::object make_future(std::unique_ptr<FutureSource> src) {
  return py::cast(PyFuture(std::move(src)));
}

void init_future(py::module_& m) {
  g_condition_type = py::object(py::module_::import("threading").attr("Condition")).release().ptr();

  py::class_<PyFuture>(m, "Future", R"doc(
The result of Engine.submit or Pipeline.submit: behaves as a concurrent.futures.Future.

result(), exception(), done(), cancelled(), running(), cancel() and add_done_callback() follow
concurrent.futures; concurrent.futures.wait() and as_completed() accept it, and asyncio code
awaits it (``await engine.submit(x)``, ``asyncio.gather(...)``): it is resolved on the loop's
thread through loop.call_soon_threadsafe. It is native (not a concurrent.futures.Future
subclass): the engine fulfils it without taking the GIL, and waits release the GIL.
)doc")
      .def(
          "result",
          [](const py::object& self, const py::object& timeout) -> py::object {
            drain_releases();
            PyFuture& f = cast(self);
            wait(f, timeout);
            settle(f);
            if (f.failed) raise_outcome(f);
            return f.outcome;
          },
          py::arg("timeout") = py::none(), R"doc(
The outputs (a list of numpy arrays, one per model output; a pipeline's final value).

Blocks, without the GIL, until the request ends or ``timeout`` seconds pass (None: no limit).
Raises the request's error (an asyncinfer.Error subclass: Cancelled, DeadlineExceeded,
Aborted, ...), or the built-in TimeoutError when the wait runs out (the request goes on).
)doc")
      .def(
          "exception",
          [](const py::object& self, const py::object& timeout) -> py::object {
            PyFuture& f = cast(self);
            wait(f, timeout);
            settle(f);
            if (f.failed && is_cancelled(f)) raise_outcome(f);  // as concurrent.futures does
            return f.failed ? f.outcome : py::none();
          },
          py::arg("timeout") = py::none(), R"doc(
The request's exception, or None when it succeeded. Blocks like result(); raises Cancelled
(a concurrent.futures.CancelledError) for a cancelled request, TimeoutError when the wait runs
out.
)doc")
      .def(
          "done", [](const PyFuture& f) { return f.src->ready(); },
          "True once the request has ended (completed, failed, timed out, cancelled or shut "
          "down). Never blocks.")
      .def(
          "cancelled", [](PyFuture& f) { return is_cancelled(f); },
          "True when the request ended cancelled.")
      .def(
          "running", [](const PyFuture& f) { return !f.src->ready(); },
          "True while the request is accepted and not yet ended (queued or running: a future "
          "does not tell them apart; Engine.status(id) does).")
      .def(
          "cancel",
          [](PyFuture& f) {
            const bool reached = f.src->cancel();
            if (reached) f.cancel_won = true;
            return reached || is_cancelled(f);
          },
          R"doc(
Cancels the request: a queued request leaves the queue at once, a running one ends Cancelled
at once (its work is stopped where the backend can). True when the request had not ended yet:
this future then ends Cancelled, even if the engine's result was already on its way (it is
dropped), as concurrent.futures promises (with ordered delivery it ends in its turn); False when
it had already ended. Never blocks.
)doc")
      .def("add_done_callback", &add_done_callback, py::arg("fn"), R"doc(
Calls ``fn(future)`` once the request ends: on the engine's completion thread, holding the
GIL, or at once on this thread when it has already ended (called from another done callback,
right after that one returns: a chain of callbacks loops instead of recursing). An exception fn
raises is logged
(logger 'asyncinfer', with its traceback) and counted in the engine's callback_exceptions.
)doc")
      .def("__await__", &await_future,
           "Awaitable in asyncio: resolved on the running loop's thread "
           "(loop.call_soon_threadsafe). Cancelling the awaiting task cancels the request; "
           "awaiting a cancelled future raises asyncio.CancelledError (as asyncio.wrap_future).")
      .def_property_readonly(
          "_condition",
          [](const py::object& self) {
            arm_waiters(self);
            return cast(self).condition;
          },
          "For concurrent.futures.wait/as_completed.")
      .def_property_readonly(
          "_waiters",
          [](const py::object& self) {
            arm_waiters(self);
            return cast(self).waiters;
          },
          "For concurrent.futures.wait/as_completed.")
      .def_property_readonly(
          "_state",
          [](PyFuture& f) {
            // Read by concurrent.futures under _condition, after it made the internals.
            const bool finished = f.condition ? f.notified : f.src->ready();
            if (!finished) return "PENDING";
            return is_cancelled(f) ? "CANCELLED_AND_NOTIFIED" : "FINISHED";
          },
          "For concurrent.futures.wait/as_completed.")
      .def("__repr__", [](PyFuture& f) { return "<asyncinfer.Future " + state_name(f) + ">"; });

  g_resolve_aio = py::cpp_function(&resolve_aio).release().ptr();
}

}  // namespace asyncinfer::python
