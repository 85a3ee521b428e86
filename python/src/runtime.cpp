// runtime.cpp — GIL hand-offs, deferred reference release, the exit hook (runtime.hpp).
#include "runtime.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace asyncinfer::python {
namespace {

std::atomic<bool> g_exiting{false};
unsigned long g_main_thread = 0;  // PyThread_get_thread_ident() of the importing (main) thread

// References dropped by threads without the GIL. Heap objects that are never destroyed, so that
// nothing here runs during static destruction after the interpreter has gone.
struct Releases {
  std::mutex mu;
  std::vector<PyObject*> pending;
  std::atomic<bool> any{false};
};
Releases& releases() {
  static auto* r = new Releases();
  return *r;
}

struct ExitRegistry {
  std::mutex mu;
  std::vector<std::pair<const ExitStoppable*, std::weak_ptr<ExitStoppable>>> live;
};
ExitRegistry& registry() {
  static auto* r = new ExitRegistry();
  return *r;
}

// Objects whose last reference died on a library thread (destroy_elsewhere), destroyed in turn by
// one thread: started with the first, joined by the exit hook once the queue is empty. It never
// takes the GIL (references dropped by the destructors are queued, see release_later), so it
// cannot deadlock against a Python thread; a destructor that waits for a library thread (an
// engine's completion threads, a pipeline's stages) waits here, never on the thread it is for.
struct Reaper {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<void>> doomed;  // under mu
  std::thread thread;                        // under mu; not joinable until the first object
  bool running = false;                      // under mu; the thread has not returned
  bool stopping = false;                     // under mu; set by the exit hook
};
Reaper& reaper() {
  static auto* r = new Reaper();
  return *r;
}

void reap() {
  pthread_setname_np(pthread_self(), "asyncinfer-reap");
  Reaper& r = reaper();
  std::unique_lock lock(r.mu);
  for (;;) {
    r.cv.wait(lock, [&] { return !r.doomed.empty() || r.stopping; });
    if (r.doomed.empty()) {  // stopping, and nothing left
      r.running = false;
      return;
    }
    std::shared_ptr<void> obj = std::move(r.doomed.front());
    r.doomed.pop_front();
    lock.unlock();
    obj.reset();  // may queue more (a callback that runs meanwhile drops another engine)
    lock.lock();
  }
}

// Called by the exit hook without the GIL: waits for every pending destruction, then for the
// thread.
void join_reaper() {
  Reaper& r = reaper();
  std::thread t;
  {
    std::lock_guard lock(r.mu);
    r.stopping = true;
    t = std::move(r.thread);
  }
  r.cv.notify_all();
  if (t.joinable()) t.join();
}

// One Python thread state per library thread, made on its first callback and deleted when the
// thread ends (see LibraryGil).
struct PinnedThreadState {
  PyThreadState* state = nullptr;
  bool checked = false;
  ~PinnedThreadState() {
    if (state == nullptr || g_exiting.load()) return;  // at exit: leaked with the interpreter
    PyEval_RestoreThread(state);
    PyGILState_Release(PyGILState_UNLOCKED);  // the first Ensure's: deletes the state, drops GIL
  }
};
thread_local PinnedThreadState tl_pinned;
thread_local const void* tl_callback_owner = nullptr;
std::atomic<std::uint64_t> g_reported{0};

[[noreturn]] void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// ---- Ctrl-C during the exit drain ---------------------------------------------------------------

// While the exit hook drains, the main thread waits in C++ without the GIL, so Python's own SIGINT
// handler (which only sets a flag for the interpreter loop) would be seen after the drain.
// ExitInterrupt takes SIGINT for that time: its handler writes to a pipe, a watcher thread reads
// it and cancels every object; the hook then restores Python's handler. The interrupted exit
// itself happens at the very end of finalization (interrupted_exit, a Py_AtExit function).
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_interrupt_fd{-1};  // the pipe's write end while an ExitInterrupt is active

void on_exit_sigint(int /*sig*/) {
  const int saved = errno;
  const char byte = 'i';
  if (g_interrupt_fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(g_interrupt_fd, &byte, 1);
  }
  errno = saved;
}

// A Py_AtExit function: after Py_FinalizeEx has flushed sys.stdout and sys.stderr. Ends the
// process as CPython ends one on an uncaught KeyboardInterrupt (Modules/main.c, exit_sigint).
void interrupted_exit() {
  if (!g_interrupted.load()) return;
  std::fflush(nullptr);
  ::signal(SIGINT, SIG_DFL);
  ::kill(::getpid(), SIGINT);
  ::_exit(128 + SIGINT);  // where the signal did not end it
}

class ExitInterrupt {
 public:
  /// Takes SIGINT (unless it is ignored) for `live`, which must outlive this.
  explicit ExitInterrupt(const std::vector<std::shared_ptr<ExitStoppable>>& live) {
    struct sigaction now {};
    if (::sigaction(SIGINT, nullptr, &now) != 0 || now.sa_handler == SIG_IGN) return;
    if (::pipe2(fds_, O_CLOEXEC) != 0) return;
    g_interrupt_fd = fds_[1];
    struct sigaction take {};
    take.sa_handler = &on_exit_sigint;
    sigemptyset(&take.sa_mask);
    take.sa_flags = SA_RESTART;
    if (::sigaction(SIGINT, &take, &old_) != 0) {
      close_pipe();
      return;
    }
    installed_ = true;
    watcher_ = std::thread([this, &live] {
      pthread_setname_np(pthread_self(), "asyncinfer-int");
      char byte = 0;
      for (;;) {
        const ssize_t n = ::read(fds_[0], &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1 || byte != 'i') return;  // 'q': the drain ended
        if (g_interrupted.exchange(true)) continue;
        static const char kSaid[] =
            "KeyboardInterrupt: asyncinfer's exit drain was interrupted; the requests left are "
            "cancelled\n";
        [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, kSaid, sizeof(kSaid) - 1);
        for (const auto& obj : live) obj->cancel_at_exit();
      }
    });
  }
  ~ExitInterrupt() {
    if (!installed_) return;
    ::sigaction(SIGINT, &old_, nullptr);
    const char byte = 'q';
    [[maybe_unused]] const ssize_t n = ::write(fds_[1], &byte, 1);
    watcher_.join();
    g_interrupt_fd = -1;
    close_pipe();
  }
  ExitInterrupt(const ExitInterrupt&) = delete;
  ExitInterrupt& operator=(const ExitInterrupt&) = delete;

 private:
  void close_pipe() {
    for (int& fd : fds_) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }
  int fds_[2] = {-1, -1};
  struct sigaction old_ {};
  bool installed_ = false;
  std::thread watcher_;
};

void at_exit() {
  std::vector<std::shared_ptr<ExitStoppable>> live;
  {
    std::lock_guard lock(registry().mu);
    for (auto& [key, weak] : registry().live) {
      if (auto p = weak.lock()) live.push_back(std::move(p));
    }
  }
  std::stable_sort(live.begin(), live.end(),
                   [](const auto& a, const auto& b) { return a->exit_order() < b->exit_order(); });
  without_gil([&] {
    ExitInterrupt interrupt(live);  // a Ctrl-C meanwhile cancels what is left
    for (auto& obj : live) obj->stop_at_exit();
    join_reaper();
  });
  drain_releases();
  g_exiting.store(true);
}

}  // namespace

bool exiting() noexcept { return g_exiting.load(std::memory_order_relaxed); }

void release_later(PyObject* obj) noexcept {
  if (g_exiting.load(std::memory_order_relaxed)) return;  // leaked: the interpreter is going
  if (PyGILState_Check()) {
    Py_DECREF(obj);
    return;
  }
  Releases& r = releases();
  std::lock_guard lock(r.mu);
  r.pending.push_back(obj);
  r.any.store(true, std::memory_order_release);
}

void drain_releases() noexcept {
  Releases& r = releases();
  if (!r.any.load(std::memory_order_acquire)) return;
  std::vector<PyObject*> batch;
  {
    std::lock_guard lock(r.mu);
    batch.swap(r.pending);
    r.any.store(false, std::memory_order_relaxed);
  }
  // A destructor run here may queue more (it runs Python code): they wait for the next drain.
  for (PyObject* o : batch) Py_DECREF(o);
}

void restore_thread(PyThreadState* state) {
  if (g_exiting.load() && PyThread_get_thread_ident() != g_main_thread) park_forever();
  PyEval_RestoreThread(state);
}

LibraryGil::LibraryGil(const void* owner) {
  if (g_exiting.load(std::memory_order_relaxed)) return;
  if (!tl_pinned.checked) {
    tl_pinned.checked = true;
    // Only a thread Python does not know gets a pinned state; a Python thread has its own.
    if (PyGILState_GetThisThreadState() == nullptr) {
      PyGILState_Ensure();
      tl_pinned.state = PyThreadState_Get();
      PyEval_SaveThread();
    }
  }
  state_ = PyGILState_Ensure();
  held_ = true;
  if (tl_pinned.state != nullptr) {  // a library thread (not a Python one running it inline)
    marked_ = true;
    prev_owner_ = tl_callback_owner;
    tl_callback_owner = owner;
  }
  drain_releases();
}

LibraryGil::~LibraryGil() {
  if (marked_) tl_callback_owner = prev_owner_;
  if (held_) PyGILState_Release(state_);
}

bool CallbackScope::inside(const void* owner) noexcept {
  return owner != nullptr && tl_callback_owner == owner;
}
const void* CallbackScope::current() noexcept { return tl_callback_owner; }

void report_callback_exception(py::error_already_set& e, const std::string& what,
                               BindingStats* stats) noexcept {
  // Counted per engine (or pipeline); the first ten of each are logged in full, then every
  // thousandth, so a callback that always raises cannot flood the log; the counters keep the
  // exact number.
  const std::uint64_t n =
      (stats != nullptr ? stats->callback_exceptions : g_reported).fetch_add(1) + 1;
  if (n > 10 && n % 1000 != 0) return;
  try {
    py::object logger = py::module_::import("logging").attr("getLogger")("asyncinfer");
    std::string msg = "exception in " + what + " (caught and counted; " + std::to_string(n) +
                      " so far from this engine)";
    logger.attr("error")(msg, py::arg("exc_info") = py::make_tuple(e.type(), e.value(), e.trace()));
  } catch (py::error_already_set& again) {
    again.discard_as_unraisable(what.c_str());
  } catch (...) {
  }
}

void register_for_exit(const std::shared_ptr<ExitStoppable>& obj) {
  std::lock_guard lock(registry().mu);
  registry().live.emplace_back(obj.get(), obj);
}

void unregister_for_exit(const ExitStoppable* obj) {
  std::lock_guard lock(registry().mu);
  auto& live = registry().live;
  live.erase(std::remove_if(live.begin(), live.end(),
                            [&](const auto& e) { return e.first == obj || e.second.expired(); }),
             live.end());
}

void destroy_elsewhere(std::shared_ptr<void> obj) {
  Reaper& r = reaper();
  {
    std::lock_guard lock(r.mu);
    if (!r.running && r.stopping) {
      // Handed over after the exit hook's reaper returned (nothing should be, once every engine
      // has stopped): a thread of its own that nobody waits for, as if the interpreter had gone
      // a moment earlier.
      std::thread([o = std::move(obj)]() mutable { o.reset(); }).detach();
      return;
    }
    r.doomed.push_back(std::move(obj));
    if (!r.running) {
      r.running = true;
      r.thread = std::thread(reap);
    }
  }
  r.cv.notify_one();
}

void init_runtime(py::module_& m) {
  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  m.def("_at_exit", &at_exit,
        "Stops every engine and pipeline (drain). Registered with atexit; not for users.");
  py::module_::import("atexit").attr("register")(m.attr("_at_exit"));
  Py_AtExit(&interrupted_exit);
}

}  // namespace asyncinfer::python
