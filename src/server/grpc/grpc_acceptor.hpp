// grpc_acceptor.hpp — the gRPC port's accept loop, owned by the frontend instead of by gRPC
// (issue 23).
//
// Why: gRPC 1.51's listener (Debian's) gives up for good after one failed accept() — on EMFILE its
// tcp_server_posix logs "Failed accept4" and destroys the port (grpc/grpc#16058, #20418, #31080),
// so the server stops taking connections while its readiness still says 200 — and it has neither
// a cap on connections nor a way to close one from outside (no channel argument for either, and
// no mitigation of HTTP/2 rapid reset, CVE-2023-44487, which came with 1.57).
//
// What: GrpcAcceptor listens on the port itself, accepts each connection, admits it against the
// gRPC connection limit and the server's descriptor budget (limits.hpp: two descriptors each, its
// own and the duplicate below), and hands the socket to gRPC with grpc::AddInsecureChannelFromFd,
// which builds the same HTTP/2 transport with the server's channel arguments. It keeps a
// duplicate of each connection's descriptor on an epoll set: gRPC shuts a socket down before it
// closes it, so the duplicate reports EPOLLHUP when the connection ends (and keeps the descriptor
// number from being reused meanwhile), and shutting the duplicate down closes a connection from
// here (the reset limit). A connection over the limits is closed at once; an accept() that fails
// for want of descriptors drains one pending connection through a spare descriptor
// (SpareDescriptor) instead of spinning, and the listener resumes once one comes back. Either
// case makes the server not ready (ListenerHealth) until the port accepts again.
//
// Rapid reset (CVE-2023-44487): a client that cancels its calls (RST_STREAM) as fast as it opens
// them keeps the server working for streams that are gone, which HTTP/2's MAX_CONCURRENT_STREAMS
// does not bound. The reactors of every method (inference, the other unary methods through
// CountedUnary, health Check and Watch) tell the acceptor of each call they start, finish and
// end, and of each that the client cancelled (call_started, call_finished, call_ended with
// `reset`), each through its AcceptorAccount (grpc_server_impl.hpp). A connection is closed when:
//   - its calls still running (started, not finished) pass twice its stream limit: streams were
//     reset while their work runs (the rule of gRPC-Go's fix);
//   - its calls not yet ended (OnDone) pass twice its stream limit plus kEndLag: answers the
//     client does not read, on streams it opened past the limit (a client that never
//     acknowledges SETTINGS). gRPC ends a call only some time after the client has its answer,
//     and on a starved machine a well-behaved client's next calls arrive long before: with every
//     core busy, 4 calls in flight on one connection were counted as up to 52 not ended, 64 as
//     up to 192. That lag is a number of calls (rate times delay) whatever the stream limit, so
//     it is an allowance added to the limit, not a multiple of it;
//   - its cancellations pass max_resets within reset_window, counted whether the server had
//     finished the call or not (Netty's maxRstFramesPerWindow): with a fast model the client's
//     RST_STREAM mostly lands after the server finished.
//
// Threads: one, blocked in epoll_wait on the listening socket, the duplicates and an eventfd
// (stop, or a descriptor come back); no timeouts, no polling. call_started, call_finished and
// call_ended may be called from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "inference_server.hpp"

namespace asyncinfer::server {

struct GrpcAcceptorOptions {
  /// Connections at once (--grpc-max-connections).
  std::size_t max_connections = 1024;
  /// HTTP/2 MAX_CONCURRENT_STREAMS the server sends (its own limit is enforced by gRPC).
  std::size_t max_concurrent_streams = 100;
  /// Client cancellations a connection may make within reset_window before it is closed.
  std::size_t max_resets = 1000;
  std::chrono::milliseconds reset_window{10'000};
};

class GrpcAcceptor {
 public:
  /// `metrics`: the gRPC frontend's, whose connection gauge and counters this loop keeps.
  GrpcAcceptor(InferenceServer& core, ProtocolMetrics& metrics, GrpcAcceptorOptions options);
  ~GrpcAcceptor();
  GrpcAcceptor(const GrpcAcceptor&) = delete;
  GrpcAcceptor& operator=(const GrpcAcceptor&) = delete;

  /// Binds and listens (`host` an IP literal; `port` 0 = a free one). unavailable when the port
  /// cannot be bound (in use: SO_REUSEPORT is not set, so a second server cannot take half of
  /// another's connections).
  Status listen(const std::string& host, int port);
  int port() const noexcept;

  /// Starts the accept loop; connections go to `server`, which must outlive stop().
  void start(grpc::Server* server);
  /// Closes the listening socket: new connections are refused. Connections stay.
  void stop_accepting();
  /// Stops the loop and shuts every connection down (gRPC then closes them). Blocks until the
  /// loop's thread has ended.
  void stop();

  /// Connections open now.
  std::size_t connections() const;

  /// Calls not yet ended past twice the stream limit plus this many close a connection (see
  /// above): the allowance for gRPC's lag between answering a call and ending it.
  static constexpr std::size_t kEndLag = 256;

  /// Whether a call that the client cancelled at `now` (RST_STREAM) was ended by its deadline
  /// (`deadline`: the server's, for a call that arrived at `started`) rather than by the client:
  /// a deadline does not count toward max_resets. The client's RST for an expired deadline can
  /// come before the server's deadline by the request's transit, and by how much gRPC rounded
  /// the grpc-timeout header up (about three significant digits in gRPC's C core: 100.5 s is
  /// sent as 101 s, 1,000.5 s as 1,010 s): within 100 ms or 2 % of the timeout, whichever is
  /// larger, counts as the deadline. No deadline (max()): never.
  static bool cancelled_by_deadline(std::chrono::system_clock::time_point deadline,
                                    std::chrono::system_clock::time_point started,
                                    std::chrono::system_clock::time_point now) {
    using std::chrono::system_clock;
    if (deadline == system_clock::time_point::max()) return false;
    if (deadline <= now) return true;
    const system_clock::duration timeout =
        deadline > started ? deadline - started : system_clock::duration::zero();
    const system_clock::duration slack =
        std::max<system_clock::duration>(std::chrono::milliseconds(100), timeout / 50);
    return deadline - now <= slack;
  }

  /// A call of the connection whose peer (CallbackServerContext::peer()) is `peer` started, was
  /// finished by the server (Finish: its work is over, its answer may still wait to be sent), or
  /// ended (OnDone); `reset`: the client cancelled it before it ended. Each call reports each
  /// once, in that order. Any thread; cheap.
  void call_started(std::string_view peer);
  void call_finished(std::string_view peer);
  void call_ended(std::string_view peer, bool reset);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncinfer::server
