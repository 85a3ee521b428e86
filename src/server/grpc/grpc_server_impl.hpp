// grpc_server_impl.hpp — what the files of the gRPC frontend share (internal to src/server/grpc):
// GrpcServer::Impl (the server's state: the core, the options, the tracked calls, the health
// status, the shutdown thread), Call (a tracked call in progress, reference-counted), the
// conversions every reactor uses, and the factories of the services and the stream reactor.
//
// The frontend's files, one concept each (grpc_server.hpp has the design):
//   grpc_server.cpp         GrpcServer: start (the port, the builder), stop_accepting, stop
//   grpc_infer_service.cpp  inference.GRPCInferenceService: the unary RPCs, ModelInfer's reactor
//   grpc_stream_call.cpp    ModelStreamInfer's reactor
//   grpc_health.cpp         grpc.health.v1.Health: Check, Watch, refresh_health
//   grpc_acceptor.cpp       the port's own accept loop (GrpcAcceptor, grpc_acceptor.hpp)
//
// Thread safety: Impl's sets of calls and its life cycle are under `mu` (the life cycle is read
// without it too: an atomic); the health status under `health_mu`.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "asyncinfer/executor.hpp"
#include "grpc_acceptor.hpp"
#include "grpc_server.hpp"
#include "grpc_server_state.hpp"
#include "grpc_service.grpc.pb.h"
#include "health.grpc.pb.h"
#include "status_mapping.hpp"

namespace asyncinfer::server {

namespace pb = inference;
namespace hpb = grpc::health::v1;
using Clock = std::chrono::steady_clock;

inline grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(grpc_code(s.code())), std::string(s.message()));
}

/// The call's deadline on the engine's clock; none when the client set none.
inline std::optional<Clock::time_point> call_deadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  const auto now = std::chrono::system_clock::now();
  if (d == std::chrono::system_clock::time_point::max() || d - now > std::chrono::hours(24 * 365)) {
    return std::nullopt;
  }
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d - now);
}

/// Whether a call cancelled now, which arrived at `started`, was cancelled by its deadline rather
/// than by the client (a client's RST_STREAM counts toward the reset limit; its deadline does
/// not): GrpcAcceptor::cancelled_by_deadline, for the transit and gRPC's rounding of the timeout.
inline bool deadline_passed(const grpc::CallbackServerContext* ctx,
                            std::chrono::system_clock::time_point started) {
  return GrpcAcceptor::cancelled_by_deadline(ctx->deadline(), started,
                                             std::chrono::system_clock::now());
}

/// One call's account with the acceptor's per-connection limits (grpc_acceptor.hpp). Every
/// reactor holds one, so that the calls of every method meet the same limits: made with the
/// reactor (call_started), `finished()` once its answer is in, just before Finish, `ended()` in
/// OnDone, and `cancelled()` in OnCancel, which counts a reset unless the deadline cancelled it
/// (deadline_passed). Thread safety: cancelled() may run on another thread than the others;
/// finished() and ended() are called once each, in that order. `acceptor` and `ctx` outlive it
/// (gRPC's shutdown waits for OnDone).
class AcceptorAccount {
 public:
  AcceptorAccount(GrpcAcceptor& acceptor, const grpc::CallbackServerContext* ctx)
      : acceptor_(acceptor), ctx_(ctx), peer_(ctx->peer()) {
    acceptor_.call_started(peer_);
  }
  AcceptorAccount(const AcceptorAccount&) = delete;
  AcceptorAccount& operator=(const AcceptorAccount&) = delete;

  /// In OnCancel: the client's cancellation counts, whether or not the server had finished the
  /// call (with a fast model a rapid-reset client's RST_STREAM mostly lands after Finish).
  void cancelled() { reset_.store(!deadline_passed(ctx_, started_), std::memory_order_release); }
  void finished() { acceptor_.call_finished(peer_); }
  void ended() { acceptor_.call_ended(peer_, reset_.load(std::memory_order_acquire)); }

 private:
  GrpcAcceptor& acceptor_;
  const grpc::CallbackServerContext* const ctx_;
  const std::string peer_;  ///< its connection
  /// When it arrived, on the deadline's clock (deadline_passed).
  const std::chrono::system_clock::time_point started_ = std::chrono::system_clock::now();
  std::atomic<bool> reset_{false};  ///< the client cancelled it
};

inline double micros_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

/// resource_exhausted when an encoded response is over --grpc-max-message-bytes (gRPC would end
/// the call, or the whole stream, with RESOURCE_EXHAUSTED when writing it).
inline Status check_response_size(const grpc::ByteBuffer& response, std::size_t max_bytes) {
  if (response.Length() <= max_bytes) return Status();
  return resource_exhausted_error("the response is " + std::to_string(response.Length()) +
                                  " bytes, over the largest message this server sends (" +
                                  std::to_string(max_bytes) +
                                  " bytes, --grpc-max-message-bytes); ask for fewer or smaller "
                                  "outputs, or raise the limit");
}

/// A call in progress that the frontend tracks (for open_connections, drain and stop). Freed when
/// its last reference goes: the library's (released in OnDone) and any taken by snapshot().
class Call {
 public:
  explicit Call(int refs) : refs_(refs) {}
  virtual ~Call() = default;
  /// The server started draining.
  virtual void on_drain() {}
  /// The server is stopping: end the call now.
  virtual void on_stop() {}
  /// A health Watch: the status is now `status` (a HealthCheckResponse::ServingStatus).
  virtual void on_health(int /*status*/) {}
  void ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  std::atomic<int> refs_;
};

/// A unary call answered without the engine (readiness, metadata, configuration, statistics,
/// the repository, shared memory, the health Check): the acceptor counts it as it counts an
/// inference call (AcceptorAccount), so that a client resetting the calls of any method meets
/// the same per-connection limits. Answer it once with answer(), from any thread; it frees
/// itself in OnDone. `impl` outlives it (gRPC's shutdown waits for OnDone).
class CountedUnary final : public grpc::ServerUnaryReactor {
 public:
  CountedUnary(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx);
  void answer(grpc::Status s);
  void OnCancel() override;
  void OnDone() override;

 private:
  AcceptorAccount account_;
};

struct GrpcServer::Impl {
  Impl(InferenceServer& s, GrpcOptions o);  // grpc_server.cpp

  InferenceServer& core;
  GrpcOptions opt;
  ProtocolMetrics& metrics;

  /// OK, or Triton's UNAVAILABLE when `category` is restricted (--grpc-restricted-protocol) and
  /// the call lacks its metadata (grpc_server.cpp).
  grpc::Status restricted(const grpc::CallbackServerContext* ctx, ApiCategory category) const;
  /// Adds the call's metadata that --grpc-header-forward-pattern forwards to `parameters`.
  void forward_headers(const grpc::CallbackServerContext* ctx, Parameters& parameters) const;

  class Service;  // inference.GRPCInferenceService (grpc_infer_service.cpp)
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Service> health_service;
  std::unique_ptr<grpc::Server> server;
  /// The port's accept loop (grpc_acceptor.hpp); gRPC has no listening port of its own.
  std::unique_ptr<GrpcAcceptor> acceptor;
  int port = 0;

  mutable std::mutex mu;
  std::unordered_set<Call*> calls;    // inference calls: open_connections, drain, stop
  std::unordered_set<Call*> watches;  // health Watch calls
  /// Where the server is in its life (kServerLifeMoves); changed under mu by set_life_locked
  /// only, read anywhere.
  std::atomic<ServerLife> life{ServerLife::serving};
  /// grpc::Server::Shutdown's thread, started once (start_shutdown, under mu), joined by stop.
  std::thread shutdown_thread;
  std::condition_variable shutdown_cv;  ///< notified (under mu) when Shutdown has returned

  /// The one place `life` changes: checked against kServerLifeMoves (an illegal move aborts).
  /// The caller holds mu.
  void set_life_locked(ServerLife to) {
    kServerLifeMoves.check(life.load(std::memory_order_relaxed), to);
    life.store(to, std::memory_order_release);
  }
  /// stop_accepting or stop was called: no new calls; NOT_SERVING. Never blocks.
  bool draining() const noexcept {
    return life.load(std::memory_order_acquire) != ServerLife::serving;
  }

  // Health: the last status sent to the watches, under health_mu (which also orders the
  // updates, so a watch's last message is the latest status). Every input of the readiness
  // pushes its changes to refresh_health (grpc_server.hpp, "Health"); nothing polls it.
  std::mutex health_mu;
  int health = hpb::HealthCheckResponse::UNKNOWN;
  std::size_t health_observer = 0;  ///< ListenerHealth's observer: pushes changes to the watches
  /// InferenceServer's readiness observer (models, engines' health, drain): the same. Both are
  /// added by start and removed by stop, before this goes.
  std::size_t readiness_observer = 0;

  void add(Call* c, std::unordered_set<Call*>& set) {
    std::lock_guard lock(mu);
    set.insert(c);
  }
  void add(Call* c) { add(c, calls); }
  void remove(Call* c, std::unordered_set<Call*>& set) {
    {
      std::lock_guard lock(mu);
      set.erase(c);
    }
    if (&set == &calls && on_closed) on_closed();
  }
  void remove(Call* c) { remove(c, calls); }
  std::function<void()> on_closed;  ///< Frontend::closed of the GrpcServer (set before start)
  /// The streams' write watchdogs (GrpcOptions::stream_stall_timeout); a timer holds a reference
  /// to its call, and every call has ended (OnDone) before this goes.
  DeadlineTimer stall_timer{"ai-grpc-stall"};
  /// The calls of `set` now, each with a reference the caller releases.
  std::vector<Call*> snapshot(const std::unordered_set<Call*>& set) {
    std::lock_guard lock(mu);
    std::vector<Call*> out(set.begin(), set.end());
    for (Call* c : out) c->ref();
    return out;
  }
  std::vector<Call*> snapshot() { return snapshot(calls); }
  void count(int code) { metrics.count_request(static_cast<std::size_t>(code)); }

  // Health (grpc_health.cpp).
  /// SERVING while the server is ready (InferenceServer::ready: every model loaded and its
  /// device healthy) and not draining; NOT_SERVING otherwise.
  int serving_status() const;
  void publish_locked(int status);
  /// The status now; watches are told when it changed. Never blocks on a client. What the
  /// readiness observers call, on the thread that made the change (an engine's, the repository's
  /// control thread, a listener's), and Check; they hold no lock it takes.
  int refresh_health();
  /// Registers a Watch and sends it the status now.
  void add_watch(Call* w);

  // Shutdown (grpc_server.cpp).
  /// Starts grpc::Server::Shutdown on its own thread (once): the port closes, clients get
  /// GOAWAY, calls in progress go on; it returns once every call has ended and every connection
  /// has closed (stop() cancels what is left, so it does not wait on a client).
  void start_shutdown();
  /// Waits up to `timeout` for Shutdown to return (drained or stopped); false if it has not.
  bool wait_shutdown(std::chrono::milliseconds timeout);
};

/// inference.GRPCInferenceService over `impl` (grpc_infer_service.cpp).
std::unique_ptr<grpc::Service> make_inference_service(GrpcServer::Impl& impl);
/// grpc.health.v1.Health over `impl` (grpc_health.cpp).
std::unique_ptr<grpc::Service> make_health_service(GrpcServer::Impl& impl);
/// A ModelStreamInfer call's reactor (grpc_stream_call.cpp); the library owns it until OnDone.
/// A streaming call refused before it started (a restricted category): it ends with `status`.
template <class Reactor>
class RefusedCall final : public Reactor {
 public:
  explicit RefusedCall(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* new_stream_call(
    GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx);

}  // namespace asyncinfer::server
