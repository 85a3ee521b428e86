// frontend.hpp — what every network frontend of `asyncinfer serve` (HTTP now, gRPC next) offers
// the shutdown sequence, and the sequence itself.
//
// Graceful shutdown (issue 16; what Kubernetes and load balancers expect):
//   1. SIGTERM or SIGINT: readiness turns false at once (InferenceServer::begin_drain);
//   2. every frontend stops accepting: its listeners close, so new connections are refused, and
//      idle connections are closed; a connection busy with a request finishes it and closes;
//   3. the engines drain (Engine::shutdown(drain)) for at most the drain timeout, after which
//      what is left is cancelled and answered (503), so in-flight requests end within it;
//   4. the frontends finish writing their last responses, then stop; the process exits 0.
//   A second signal during the drain cancels it: the engines stop at once (shut-down requests
//   are answered 503) and the sequence goes on from step 4; one during step 4 ends its wait for
//   the last responses (the frontends stop at once).
//
// Signals are taken synchronously (sigwait on one thread) after block_shutdown_signals() has
// blocked them, before any thread is started, so no thread is interrupted and no handler runs
// in signal context.
//
// Nothing polls: the sequence waits on one condition variable that a signal, the end of the
// drain and each connection that closes (Frontend::on_close) notify, with the drain timeout as
// its deadline. The order is decided here, not in the frontends: stop accepting, drain the
// engines (InferenceServer::shutdown), let the frontends finish writing, then stop them. A
// frontend's stop() never shuts an engine down; whoever owns the frontends shuts the engines
// down first (an engine's callbacks write to the frontend's connections).
//
// Thread safety: Frontend members may be called from any thread; run_until_signalled is called
// once, from the thread that owns the frontends.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "asyncinfer/status.hpp"

namespace asyncinfer::server {

class InferenceServer;

class Frontend {
 public:
  virtual ~Frontend() = default;
  /// "http", "grpc": for log lines.
  virtual std::string name() const = 0;
  /// Closes the listeners (new connections are refused) and idle connections; busy connections
  /// close once their response is written. Returns once the listeners are closed (bounded: at
  /// most about a second if the frontend's threads are stuck); does not wait for connections.
  virtual void stop_accepting() = 0;
  /// What is still open: connections (HTTP) or calls (gRPC, whose library does not show its
  /// connections to the drain), as open_unit() names them.
  virtual std::size_t open_connections() const = 0;
  /// "connection", "call": what open_connections() counts, for log lines.
  virtual std::string open_unit() const { return "connection"; }
  /// Closes every connection and stops the frontend's threads. Blocks until they have ended.
  /// Precondition: the engines whose callbacks reach this frontend have stopped
  /// (InferenceServer::shutdown); stop() does not stop them.
  virtual void stop() = 0;

  /// Calls `listener` each time a connection (HTTP) or call (gRPC) closes, so that a wait for
  /// open_connections() to reach 0 needs no polling. Any thread; the listener runs on the
  /// frontend's threads with no frontend lock held and must not block. One listener; an empty
  /// function removes it.
  void on_close(std::function<void()> listener) {
    std::lock_guard lock(close_mu_);
    close_listener_ = std::move(listener);
  }

 protected:
  /// For implementations: a connection or call has closed (call with no lock held).
  void closed() {
    std::lock_guard lock(close_mu_);
    if (close_listener_) close_listener_();
  }

 private:
  std::mutex close_mu_;
  std::function<void()> close_listener_;
};

/// Blocks SIGTERM and SIGINT in the calling thread, so threads started afterwards inherit the
/// mask and the signals wait for run_until_signalled. Also ignores SIGPIPE. Call first thing.
void block_shutdown_signals();

using LogLine = std::function<void(const std::string& line)>;

/// Takes SIGTERM and SIGINT while the models load at start, before run_until_signalled does
/// (block_shutdown_signals first): the first one runs `on_signal` with its number, on the
/// watcher's own thread (e.g. to cancel the loads: RepositoryOptions::start_stop); later ones
/// are taken and ignored. The destructor stops the watcher (blocks until it has ended).
/// signal() is thread-safe.
class StartupSignalWatch {
 public:
  explicit StartupSignalWatch(std::function<void(int)> on_signal);
  ~StartupSignalWatch();
  StartupSignalWatch(const StartupSignalWatch&) = delete;
  StartupSignalWatch& operator=(const StartupSignalWatch&) = delete;

  /// The signal that came (SIGTERM or SIGINT), or 0 while none has.
  int signal() const noexcept { return signal_.load(std::memory_order_acquire); }
  /// "SIGTERM", "SIGINT" or "signal".
  static const char* name(int s) noexcept;

 private:
  std::atomic<int> signal_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

/// Waits for SIGTERM or SIGINT, then runs the shutdown sequence above over `frontends` and
/// returns the exit code (0). `drain_timeout` bounds steps 3 and 4 together.
int run_until_signalled(InferenceServer& server, std::span<Frontend* const> frontends,
                        std::chrono::milliseconds drain_timeout, const LogLine& log);

}  // namespace asyncinfer::server
