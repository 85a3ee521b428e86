#include "frontend.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

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

/// Waits for a shutdown signal up to `timeout`; its number, or 0 on timeout.
int wait_signal(std::chrono::milliseconds timeout) {
  const sigset_t set = shutdown_set();
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000) * 1'000'000);
  for (;;) {
    const int s = sigtimedwait(&set, nullptr, &ts);
    if (s > 0) return s;
    if (errno == EINTR) continue;
    return 0;
  }
}

const char* signal_name(int s) {
  return s == SIGTERM ? "SIGTERM" : s == SIGINT ? "SIGINT" : "signal";
}

}  // namespace

void block_shutdown_signals() {
  const sigset_t set = shutdown_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int run_until_signalled(InferenceServer& server, std::span<Frontend* const> frontends,
                        std::chrono::milliseconds drain_timeout, const LogLine& log) {
  const sigset_t set = shutdown_set();
  int first = 0;
  while (first == 0) {
    if (sigwait(&set, &first) != 0) first = 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + drain_timeout;
  // Readiness false and the listeners closed before the log line says so (a probe or a client
  // racing the line must see both).
  server.begin_drain();
  for (Frontend* f : frontends) f->stop_accepting();
  log(std::string("received ") + signal_name(first) + ": not ready; draining for up to " +
      std::to_string(drain_timeout.count()) + " ms (a second signal cancels the drain)");

  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    server.shutdown(ShutdownMode::drain, drain_timeout);
    drained.store(true, std::memory_order_release);
  });
  bool cancelled = false;
  while (!drained.load(std::memory_order_acquire)) {
    const int s = wait_signal(std::chrono::milliseconds(20));
    if (s != 0 && !cancelled) {
      cancelled = true;
      log(std::string("received ") + signal_name(s) + " again: cancelling the drain");
      server.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    }
  }
  drainer.join();
  // Every engine has stopped, so every accepted request has its response; wait (bounded) for
  // the frontends to write them.
  // After a cancelled drain the last answers (503) get a short grace only.
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
  for (;;) {
    const std::string open = still_open();
    if (open.empty()) break;
    if (std::chrono::steady_clock::now() >= write_deadline) {
      log("closing what is still open: " + open);
      break;
    }
    const int s = wait_signal(std::chrono::milliseconds(5));
    if (s != 0) {
      // A second (or third) signal while the last responses are written: stop now.
      cancelled = true;
      log(std::string("received ") + signal_name(s) + " again: closing " + open + " now");
      break;
    }
  }
  for (Frontend* f : frontends) f->stop();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  log(std::string(cancelled ? "drain cancelled" : "drained") + "; stopped after " +
      std::to_string(took.count()) + " ms");
  return 0;
}

}  // namespace asyncinfer::server
