// grpc_server.hpp — the gRPC frontend of `asyncinfer serve`: inference.GRPCInferenceService
// (the Open Inference Protocol's gRPC service, with Triton's ModelStreamInfer and
// RepositoryIndex; grpc_service.proto) and the standard grpc.health.v1.Health service, on one port
// (Triton's default 8001).
//
// Design: gRPC C++'s callback API (Debian's libgrpc++ 1.51). Every call is a reactor driven by
// the library's own threads; no thread is parked on a call, a stream or a request. ModelInfer is a
// ServerUnaryReactor: the request is decoded (oip_grpc.hpp) and submitted to its engine
// (InferenceServer::submit), and the engine's completion callback encodes the response and
// finishes the reactor. ModelStreamInfer is a ServerBidiReactor that keeps reading while its
// requests run (up to max_stream_inflight at once, then reading pauses: HTTP/2 flow control pushes
// back on the client), writes each response as its request completes — so responses come back
// in completion order, matched by id — and writes one at a time from a queue. The two inference
// methods take the raw ByteBuffer and parse it themselves, so a message that is not a
// ModelInferRequest is INVALID_ARGUMENT with a message (the library would answer INTERNAL, or end
// a stream as if the client had half-closed).
//
// Mapping onto the engine: the call's deadline is the request's deadline (the earlier of it and
// the request parameter `timeout`); a client cancel or disconnect (OnCancel) cancels the engine
// request, so its slot is free at once; error codes map one to one (status_mapping.hpp); the
// deadline of a stream applies to each of its requests.
//
// Health: grpc.health.v1.Health (health.proto) is served here, not by gRPC's default service,
// so that it follows InferenceServer::ready() (a model whose device is lost turns the server not
// ready at run time): the service "" and "inference.GRPCInferenceService" are SERVING while the
// server is ready and not draining, NOT_SERVING otherwise (Kubernetes' gRPC probes ask for ""
// by default). Check reads the readiness of the moment; Watch is a ServerWriteReactor told of each
// change as it happens: every input of the readiness pushes it, on the thread that made the
// change — the listeners (ListenerHealth::on_change), the models and the engines' health
// (InferenceServer::on_readiness_change: a load, an unload, a poll, a worker lost or recovered
// via EngineOptions::on_health_change), a drain — and Check and stop_accepting too. No thread
// waits per call, and none wakes on a timer to look.
//
// Shutdown (frontend.hpp): stop_accepting() turns health to NOT_SERVING and starts
// grpc::Server::Shutdown on a thread of its own — the port closes, clients get GOAWAY, calls in
// progress go on — and finishes the streams that have nothing in flight (UNAVAILABLE "server is
// shutting down", so the client reopens elsewhere); a busy stream finishes once its requests are
// answered. stop() cancels what is left (streams, and the health watches, which end UNAVAILABLE),
// and, after a 100 ms grace, cancels every call still open and closes the connections
// (grpc_server_cancel_all_calls, what Shutdown(deadline) does at its deadline): Shutdown waits for
// every call and connection, so a Watch or an idle client channel would hold it for ever, or
// until the client lets go. stop() is bounded by the grace and its own reactors' ends.
//
// Thread safety: start/stop_accepting/stop may be called from any thread; the InferenceServer
// must outlive stop(). Its owner shuts the engines down (InferenceServer::shutdown) before stop()
// and before destroying it: the engines' callbacks finish its reactors.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "frontend.hpp"
#include "header_forward.hpp"
#include "inference_server.hpp"
#include "restricted_api.hpp"

namespace asyncinfer::server {

struct GrpcOptions {
  /// Address to listen on (IPv4 or IPv6 literal, or "localhost").
  std::string host = "127.0.0.1";
  /// Triton's default; 0 = a free port (grpc_port() returns it).
  int port = 8001;
  /// Largest message received or sent; gRPC's own default is 4 MB, Triton's inputs reach more.
  /// Over it: RESOURCE_EXHAUSTED.
  std::size_t max_message_bytes = 64u << 20;
  /// Requests of one stream running at once; reading pauses at the limit.
  std::size_t max_stream_inflight = 256;
  /// A ModelStreamInfer response whose write makes no progress for this long (the client reads
  /// nothing, so HTTP/2 flow control holds the write) cancels the stream: its requests are
  /// cancelled in the engine (a decoupled model waiting for room stops, its worker is freed),
  /// the HTTP/2 stream is reset (the client sees CANCELLED), and
  /// asyncinfer_grpc_stalled_streams_total counts it. 0 = never. The serve command passes
  /// --idle-timeout, as for HTTP's generate_stream.
  std::chrono::milliseconds stream_stall_timeout{0};
  /// GRPC_ARG_MAX_CONNECTION_AGE_MS: a connection older than this gets GOAWAY (its calls go on for
  /// max_connection_age_grace), so clients reconnect and a connection-level (L4) balancer spreads
  /// them again. 0 = never.
  /// GRPC_ARG_MAX_CONNECTION_IDLE_MS: a connection with no call in progress for this long gets
  /// GOAWAY and is closed (clients reconnect on their next call); 0 = never. The serve command
  /// passes --idle-timeout, as for HTTP.
  std::chrono::milliseconds max_connection_idle{0};
  std::chrono::milliseconds max_connection_age{0};
  std::chrono::milliseconds max_connection_age_grace{30'000};
  /// Connections at once (--grpc-max-connections); past it a new one is closed at once and the
  /// server is not ready until one ends (grpc_acceptor.hpp).
  std::size_t max_connections = 1024;
  /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls one connection may have open
  /// (--grpc-max-concurrent-streams); gRPC refuses the streams past it.
  std::size_t max_concurrent_streams = 100;
  /// Client cancellations (RST_STREAM) a connection may make within reset_window before it is
  /// closed (--grpc-max-resets; HTTP/2 rapid reset, CVE-2023-44487).
  std::size_t max_resets = 1000;
  std::chrono::milliseconds reset_window{10'000};
  /// grpc::ResourceQuota: memory gRPC's transports may take for their buffers, and threads
  /// (--grpc-memory-bytes; 0 = gRPC's default, unbounded).
  std::size_t memory_bytes = std::size_t{1} << 30;
  int max_threads = 0;  ///< 0 = gRPC's default
  /// --grpc-restricted-protocol: the API categories that answer only a call carrying their
  /// metadata key "triton-grpc-protocol-<key>" (restricted_api.hpp); UNAVAILABLE otherwise.
  RestrictedApis restricted;
  /// --grpc-header-forward-pattern: the call's metadata that reaches the model as string request
  /// parameters (header_forward.hpp); null = none.
  std::shared_ptr<const HeaderForward> header_forward;
};

class GrpcServer : public Frontend {
 public:
  GrpcServer(InferenceServer& server, GrpcOptions options);
  ~GrpcServer() override;
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  /// Binds the port and starts serving. invalid_argument for a bad host, port or message size;
  /// unavailable when the port cannot be bound (in use: the listener does not share ports, so a
  /// second server cannot silently take half of another's connections).
  Status start();
  /// The bound port (after start).
  int grpc_port() const noexcept;

  std::string name() const override { return "grpc"; }
  std::string open_unit() const override { return "call"; }
  void stop_accepting() override;
  /// Calls in progress (a stream counts as one until it ends).
  std::size_t open_connections() const override;
  /// Ends every call (cancelled after a 100 ms grace) and closes every connection; returns once
  /// the calls have ended, so about 100 ms at most.
  void stop() override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncinfer::server
