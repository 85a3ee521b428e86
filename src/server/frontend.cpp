#include "frontend.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "inference_server.hpp"

namespace asyncinfer::server {
namespace {

sigset_t shutdown_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

/// StartupSignalWatch's wake-up, as the value of its own SIGTERM.
constexpr int kWake = 0x57a7;

const char* signal_name(int s) {
  return s == SIGTERM ? "SIGTERM" : s == SIGINT ? "SIGINT" : "signal";
}

}  // namespace

StartupSignalWatch::StartupSignalWatch(std::function<void(int)> on_signal)
    : thread_([this, on_signal = std::move(on_signal)] {
        const sigset_t set = shutdown_set();
        for (;;) {
          siginfo_t info{};
          const int s = sigwaitinfo(&set, &info);
          if (s < 0) continue;
          // The destructor's own wake-up (pthread_sigqueue with kWake): no signal of a user's is
          // lost to it.
          if (info.si_code == SI_QUEUE && info.si_value.sival_int == kWake &&
              stopping_.load(std::memory_order_acquire)) {
            return;
          }
          int none = 0;
          if (signal_.compare_exchange_strong(none, s, std::memory_order_acq_rel) && on_signal) {
            on_signal(s);
          }
        }
      }) {}

StartupSignalWatch::~StartupSignalWatch() {
  stopping_.store(true, std::memory_order_release);
  // Blocked in every thread: sigwaitinfo takes it, and tells it from a user's by its value.
  sigval wake{};
  wake.sival_int = kWake;
  pthread_sigqueue(thread_.native_handle(), SIGTERM, wake);
  thread_.join();
}

const char* StartupSignalWatch::name(int s) noexcept { return signal_name(s); }

void block_shutdown_signals() {
  const sigset_t set = shutdown_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

namespace {

/// What the shutdown sequence waits for, on one condition variable: further signals (from the
/// signal thread), the end of the drain (from the drainer) and closed connections (from the
/// frontends' threads).
class ShutdownEvents {
 public:
  void signal(int s) {
    {
      std::lock_guard lock(mu_);
      signals_.push_back(s);
    }
    cv_.notify_all();
  }
  void changed() {
    { std::lock_guard lock(mu_); }  // a waiter between its check and its wait sees this
    cv_.notify_all();
  }
  /// Waits until `done()` or a signal or `deadline`; the signal's number, or 0.
  template <class Done>
  int wait(std::chrono::steady_clock::time_point deadline, Done done) {
    std::unique_lock lock(mu_);
    auto ready = [&] { return !signals_.empty() || done(); };
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock, ready);
    } else {
      cv_.wait_until(lock, deadline, ready);
    }
    if (signals_.empty()) return 0;
    const int s = signals_.front();
    signals_.erase(signals_.begin());
    return s;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> signals_;
};

/// Takes the signals that arrive after the first one (sigwait, as the main thread did) and
/// hands them to `events` until destroyed; the destructor wakes it with a signal of its own.
class SignalThread {
 public:
  explicit SignalThread(ShutdownEvents& events)
      : thread_([this, &events] {
          const sigset_t set = shutdown_set();
          for (;;) {
            int s = 0;
            if (sigwait(&set, &s) != 0) continue;
            if (stopping_.load(std::memory_order_acquire)) return;
            events.signal(s);
          }
        }) {}
  ~SignalThread() {
    stopping_.store(true, std::memory_order_release);
    pthread_kill(thread_.native_handle(), SIGTERM);  // blocked in every thread: sigwait takes it
    thread_.join();
  }
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace

int run_until_signalled(InferenceServer& server, std::span<Frontend* const> frontends,
                        std::chrono::milliseconds drain_timeout, const LogLine& log) {
  const sigset_t set = shutdown_set();
  int first = 0;
  while (first == 0) {
    if (sigwait(&set, &first) != 0) first = 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + drain_timeout;
  ShutdownEvents events;
  for (Frontend* f : frontends) f->on_close([&events] { events.changed(); });
  // Readiness false and the listeners closed before the log line says so (a probe or a client
  // racing the line must see both).
  server.begin_drain();
  for (Frontend* f : frontends) f->stop_accepting();
  log(std::string("received ") + signal_name(first) + ": not ready; draining for up to " +
      std::to_string(drain_timeout.count()) + " ms (a second signal cancels the drain)");

  bool cancelled = false;
  {
    SignalThread signals(events);
    std::atomic<bool> drained{false};
    std::thread drainer([&] {
      server.shutdown(ShutdownMode::drain, drain_timeout);
      drained.store(true, std::memory_order_release);
      events.changed();
    });
    // The drain ends by itself within drain_timeout (the engines cancel what is left then).
    const auto never = std::chrono::steady_clock::time_point::max();
    while (!drained.load(std::memory_order_acquire)) {
      const int s = events.wait(never, [&] { return drained.load(std::memory_order_acquire); });
      if (s != 0 && !cancelled) {
        cancelled = true;
        log(std::string("received ") + signal_name(s) + " again: cancelling the drain");
        server.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
      }
    }
    drainer.join();
    // Every engine has stopped, so every accepted request has its response; wait (bounded) for
    // the frontends to write them. After a cancelled drain the last answers (503) get a short
    // grace only.
    const auto write_deadline =
        cancelled
            ? std::chrono::steady_clock::now() + std::chrono::milliseconds(200)
            : std::max(deadline, std::chrono::steady_clock::now()) + std::chrono::milliseconds(500);
    // "2 http connection(s), 1 grpc call(s)": what each frontend still has open.
    auto still_open = [&] {
      std::string text;
      for (Frontend* f : frontends) {
        const std::size_t n = f->open_connections();
        if (n == 0) continue;
        if (!text.empty()) text += ", ";
        text += std::to_string(n) + " " + f->name() + " " + f->open_unit() + "(s)";
      }
      return text;
    };
    auto all_closed = [&] {
      return std::all_of(frontends.begin(), frontends.end(),
                         [](Frontend* f) { return f->open_connections() == 0; });
    };
    const int s = events.wait(write_deadline, all_closed);
    if (const std::string open = still_open(); !open.empty()) {
      if (s != 0) {
        // A second (or third) signal while the last responses are written: stop now.
        cancelled = true;
        log(std::string("received ") + signal_name(s) + " again: closing " + open + " now");
      } else {
        log("closing what is still open: " + open);
      }
    }
  }  // the signal thread ends here
  for (Frontend* f : frontends) {
    f->on_close(nullptr);
    f->stop();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  log(std::string(cancelled ? "drain cancelled" : "drained") + "; stopped after " +
      std::to_string(took.count()) + " ms");
  return 0;
}

}  // namespace asyncinfer::server
