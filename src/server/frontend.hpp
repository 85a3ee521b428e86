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
// Thread safety: Frontend members may be called from any thread; run_until_signalled is called
// once, from the thread that owns the frontends.
#pragma once

#include <chrono>
#include <functional>
#include <span>
#include <string>

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
  virtual void stop() = 0;
};

/// Blocks SIGTERM and SIGINT in the calling thread, so threads started afterwards inherit the
/// mask and the signals wait for run_until_signalled. Also ignores SIGPIPE. Call first thing.
void block_shutdown_signals();

using LogLine = std::function<void(const std::string& line)>;

/// Waits for SIGTERM or SIGINT, then runs the shutdown sequence above over `frontends` and
/// returns the exit code (0). `drain_timeout` bounds steps 3 and 4 together.
int run_until_signalled(InferenceServer& server, std::span<Frontend* const> frontends,
                        std::chrono::milliseconds drain_timeout, const LogLine& log);

}  // namespace asyncinfer::server
