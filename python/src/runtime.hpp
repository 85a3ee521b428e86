// runtime.hpp — how the binding shares threads with the Python interpreter.
//
// The engine's threads (completion executor, pipeline stages) are C++ threads; Python code runs
// on them only inside the three helpers below, and Python objects reach them only inside PyRef.
//
//   - without_gil(f): a Python thread runs f (a blocking engine call) with the GIL released, so
//     other Python threads and the engine's callbacks run meanwhile (pybind11 docs, "Global
//     Interpreter Lock"). The GIL is taken back in ordinary control flow, never in a destructor:
//     a daemon thread that the interpreter ends while it waits for the GIL at exit unwinds
//     cleanly instead of terminating in a noexcept destructor.
//   - LibraryGil: a library thread takes the GIL to run a Python callback. The thread's Python
//     thread state is made once and kept until the thread ends (PyGILState_Ensure alone would
//     create and destroy one per callback, microseconds each).
//   - PyRef: an owned Python reference that may be destroyed on any thread. With the GIL held it
//     is released at once; without it, it is queued and released by the next binding call that
//     holds the GIL (drain_releases), so no library thread ever waits for the GIL to drop a
//     reference (and none deadlocks against a Python thread that holds it while it waits for us).
//
// Interpreter exit (guarantee 5 from Python): an atexit hook stops every live pipeline and engine
// (drain, bounded by its drain_timeout) with the GIL released, so callbacks still owed run; then
// it sets exiting(). From then on no library thread calls into Python (a callback is dropped and
// its references leaked), and a non-main thread that comes back from a blocking call parks
// instead of taking the GIL of an interpreter that is being torn down. A Ctrl-C (SIGINT) during
// that drain cuts it short: the hook takes SIGINT for its duration (unless it is ignored), a
// watcher thread then cancels every object (cancel_at_exit), and once the interpreter has
// finalized (stdout flushed) the process ends as an uncaught KeyboardInterrupt ends CPython:
// killed by SIGINT (a shell shows 130).
//
// Callbacks of an engine run on that engine's completion threads; LibraryGil marks them with
// their engine (CallbackScope), so the binding refuses shutdown() from one (it would wait for
// itself) and hands the destruction of an engine or pipeline whose last reference dies on any
// library thread (the garbage collector runs anywhere; a pipeline waits for its engines' threads)
// to the module's one reaper thread (destroy_elsewhere), which the exit hook joins.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace asyncinfer::python {

namespace py = pybind11;

/// True once the atexit hook has stopped every engine (the interpreter is finalizing).
bool exiting() noexcept;

/// Releases every PyRef queued by threads that did not hold the GIL. Call with the GIL held.
void drain_releases() noexcept;
/// Drops `obj` now if this thread holds the GIL, else queues it for drain_releases().
void release_later(PyObject* obj) noexcept;

/// An owned reference that any thread may destroy (see the header comment).
class PyRef {
 public:
  PyRef() = default;
  /// Takes a new reference to `h` (GIL held).
  explicit PyRef(py::handle h) : p_(h.inc_ref().ptr()) {}
  PyRef(PyRef&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  PyRef& operator=(PyRef&& other) noexcept {
    if (this != &other) {
      reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { reset(); }

  explicit operator bool() const noexcept { return p_ != nullptr; }
  py::handle get() const noexcept { return p_; }
  /// A new strong reference (GIL held).
  py::object object() const { return py::reinterpret_borrow<py::object>(p_); }
  void reset() noexcept {
    if (p_ != nullptr) release_later(std::exchange(p_, nullptr));
  }
  /// Forgets the reference without releasing it (at interpreter exit, when it may not be).
  void leak() noexcept { p_ = nullptr; }

 private:
  PyObject* p_ = nullptr;
};

/// Takes the GIL back on a Python thread that released it (see without_gil).
void restore_thread(PyThreadState* state);

/// Runs f() with the GIL released and returns what it returns. f must not touch Python.
template <class F>
auto without_gil(F&& f) -> decltype(f()) {
  PyThreadState* state = PyEval_SaveThread();
  if constexpr (std::is_void_v<decltype(f())>) {
    try {
      f();
    } catch (...) {
      restore_thread(state);
      throw;
    }
    restore_thread(state);
  } else {
    auto result = [&] {
      try {
        return f();
      } catch (...) {
        restore_thread(state);
        throw;
      }
    }();
    restore_thread(state);
    return result;
  }
}

/// Holds the GIL on a library thread (or on a Python thread, which may already hold it) to run
/// Python code for `owner` (the engine or pipeline whose thread this is; see CallbackScope).
/// Converts to false when the interpreter is exiting: the caller must then skip Python.
class LibraryGil {
 public:
  explicit LibraryGil(const void* owner);
  ~LibraryGil();
  LibraryGil(const LibraryGil&) = delete;
  LibraryGil& operator=(const LibraryGil&) = delete;
  explicit operator bool() const noexcept { return held_; }

 private:
  bool held_ = false;
  bool marked_ = false;
  const void* prev_owner_ = nullptr;
  PyGILState_STATE state_{};
};

/// Counters the binding keeps beside the engine's own metrics.
struct BindingStats {
  /// Exceptions raised by Python callbacks (submit(callback=), add_done_callback, queue and
  /// pipeline callbacks); added to the engine's callback_exceptions in metrics().
  std::atomic<std::uint64_t> callback_exceptions{0};
};

/// Which library thread is running Python code now. LibraryGil marks a library thread (not a
/// Python thread that runs a callback inline) with the engine or pipeline it belongs to.
class CallbackScope {
 public:
  /// True when this thread is a library thread of `owner` running Python code.
  static bool inside(const void* owner) noexcept;
  /// The owner of the library thread running Python code now, or null on a Python thread.
  static const void* current() noexcept;
};

/// Reports the Python exception `e` raised by callback `what` (logger "asyncinfer", with its
/// traceback: the first ten of each engine in full, then every thousandth) and counts it in
/// `stats`.
void report_callback_exception(py::error_already_set& e, const std::string& what,
                               BindingStats* stats) noexcept;

/// Something the atexit hook stops. Registered objects must stay alive while registered (the
/// registry keeps shared ownership).
class ExitStoppable {
 public:
  virtual ~ExitStoppable() = default;
  /// Lower runs first (pipelines before the engines their stages use).
  virtual int exit_order() const noexcept = 0;
  /// Stops the object (drain); called without the GIL.
  virtual void stop_at_exit() noexcept = 0;
  /// Cuts that drain short (cancel): what is left ends at once. Called without the GIL, on
  /// another thread while stop_at_exit() runs (a Ctrl-C during the exit drain).
  virtual void cancel_at_exit() noexcept = 0;
};
void register_for_exit(const std::shared_ptr<ExitStoppable>& obj);
void unregister_for_exit(const ExitStoppable* obj);

/// Destroys `obj` on the module's reaper thread: one thread for every such object, started with the
/// first, destroying them in turn; the exit hook waits for those pending, then joins it. For an
/// engine or pipeline whose last reference dies on a library thread (one of its own completion
/// threads, where its destructor would wait for itself). Does not wait for the destruction.
void destroy_elsewhere(std::shared_ptr<void> obj);

/// Installs the atexit hook and records the main thread. Called once at import.
void init_runtime(py::module_& m);

}  // namespace asyncinfer::python
