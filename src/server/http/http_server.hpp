// http_server.hpp — the HTTP/REST frontend of `asyncinfer serve`: the Open Inference Protocol
// (KServe v2) with Triton's binary tensor extension on one port, Prometheus /metrics on another.
//
// Design (after Boost.Beast's advanced server example, with nginx's worker model for the
// threads): a fixed pool of I/O threads, each running an io_context of its own; each connection
// is a session placed on one of them at accept (round robin) and kept there, and its life is a
// chain of completion handlers — wait for bytes, read the header, read the body, hand the request
// to the core, write the response — so no thread is ever parked on a connection or a request. An
// inference request goes to its engine (InferenceServer::submit); the engine's completion
// callback posts the response back to the session's I/O thread, and while the request runs the
// session keeps a read pending on the socket so a client that disconnects cancels its engine
// request at once. Requests of one connection are answered in order (keep-alive and pipelining:
// bytes read ahead stay in the session's buffer for the next request).
//
// Limits, each answered with a clear error and the connection closed (HttpOptions): request
// body (413), header size (431), a header not complete within header_timeout of its first byte
// or a body not complete within body_timeout (408: a slow client — slowloris — cannot hold a
// connection), a connection idle longer than idle_timeout (closed), connections over
// max_connections (429), JSON nesting over max_json_depth (400).
//
// Thread safety: start/stop_accepting/stop may be called from any thread; the server must stay
// alive until stop() has returned. Its owner shuts the engines down (InferenceServer::shutdown)
// before stop() and before destroying it: the engines' callbacks post to its sessions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "frontend.hpp"
#include "header_forward.hpp"
#include "inference_server.hpp"
#include "restricted_api.hpp"

namespace asyncinfer::server {

struct HttpOptions {
  /// Address to listen on (IPv4 or IPv6 literal, or "localhost").
  std::string host = "127.0.0.1";
  /// Triton's defaults; 0 = a free port (the real one is logged and returned by the accessors);
  /// metrics_port -1 = no metrics listener.
  int http_port = 8000;
  int metrics_port = 8002;
  /// I/O threads; 0 = one per core.
  int threads = 0;
  std::size_t max_body_bytes = 64u << 20;  ///< Triton's 64 MB default
  std::size_t max_header_bytes = 16u << 10;
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds idle_timeout{60'000};
  std::size_t max_connections = 4096;
  int max_json_depth = 64;
  /// How long an I/O thread whose one inference request is in an engine busy-polls its event
  /// loop (the answer, other connections' bytes) before it sleeps in epoll_wait; 0 = never (the
  /// default), at most 1,000 µs; never on a process allowed one core. Only at that load: a
  /// thread with more than one request in an engine, or none, sleeps at once. A latency mode
  /// for few connections, with the model's `spin_wait_us` at about a client's round trip, so
  /// that neither the engine's worker nor the I/O thread needs a wake-up per request: one
  /// connection's server-side p50 went from 74 to 36 µs, but 8 connections lost throughput
  /// (docs/performance.md, "One connection without wake-ups").
  std::chrono::microseconds spin_wait{0};
  /// Caller runs (RequestOptions::caller_run_max_compute): an I/O thread runs an inference
  /// request itself, instead of waking an engine worker, when the worker is asleep on an empty
  /// queue, the model runs on the cpu inline path and supports it (Model::supports_caller_runs)
  /// and its recent batches took at most this long (a moving average, weight 1/8), and the
  /// request's inputs are under 64 KiB (the size above which bodies are decoded off the I/O
  /// threads). The thread's other connections wait meanwhile; a run far over the bound turns caller
  /// runs off for that engine (RequestOptions::caller_run_max_compute). 0 = never; at most 1,000
  /// µs. Two wake-ups fewer a request where requests come one at a time: one connection's
  /// server-side p50 74 → 36–38 µs, CPU a request −25 % (docs/performance.md, "The I/O thread runs
  /// the request").
  std::chrono::microseconds caller_run{50};
  /// --http-restricted-api: the API categories that answer only a request carrying their header
  /// (restricted_api.hpp); 403 otherwise.
  RestrictedApis restricted;
  /// --http-header-forward-pattern: the request headers that reach the model as string request
  /// parameters (header_forward.hpp); null = none.
  std::shared_ptr<const HeaderForward> header_forward;
};

class HttpServer : public Frontend {
 public:
  HttpServer(InferenceServer& server, HttpOptions options);
  ~HttpServer() override;
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds the listeners and starts the I/O threads. invalid_argument for a bad host;
  /// unavailable when a port cannot be bound (the message says which and why).
  Status start();
  /// The bound ports (after start).
  int http_port() const noexcept;
  int metrics_port() const noexcept;
  /// I/O threads (HttpOptions::threads, or one per core this process may run on).
  int io_threads() const noexcept;

  std::string name() const override { return "http"; }
  void stop_accepting() override;
  std::size_t open_connections() const override;
  void stop() override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncinfer::server
