// http_server_impl.hpp — what the files of the HTTP frontend share (internal to src/server/http):
// the Beast types, HttpServer::Impl (the server's state: the core, the options, the io_context
// and its threads, the listeners, the open sessions) and Session (one connection: its socket on
// its I/O thread's io_context, its buffer, the request being read or answered, its one timer).
//
// The frontend's files, one concept each (http_server.hpp has the design):
//   http_server.cpp    HttpServer: start (the address, the ports), the listeners, drain, stop
//   http_session.cpp   a connection's life: reading, writing, the deadline timer, closing
//   http_routes.cpp    what a request asks for: the OIP's endpoints, /metrics, inference
//
// Thread safety: a Session is used on its I/O thread only; Impl's set of sessions is under `mu`.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include <boost/asio.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http_compression.hpp"
#include "http_server.hpp"
#include "http_session_state.hpp"
#include "oip_json.hpp"
#include "status_mapping.hpp"

namespace asyncinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using Response = http::response<http::string_body>;
// Concrete executor types: the type-erased any_io_executor costs a few percent per request.
// No strand: each io_context is run by one thread (HttpServer::Impl::iocs), which already
// serializes a connection's handlers, and a strand on it only added a lock per handler.
using IoExecutor = net::io_context::executor_type;
using Socket = net::basic_stream_socket<tcp, IoExecutor>;
using Timer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, IoExecutor>;
using Acceptor = net::basic_socket_acceptor<tcp, IoExecutor>;

constexpr std::size_t kReadChunk = 16 * 1024;
/// How long a connection that is being closed keeps draining what the client still sends, so
/// that the client reads our answer instead of a reset (nginx's lingering close).
constexpr std::chrono::milliseconds kLinger{2000};

/// What a connection is for: the API port, the metrics port, or one refused at the connection
/// limit and answered 429 (from the descriptors held in reserve).
enum class SessionKind : std::uint8_t { api, metrics, rejected };

class Session;

struct HttpServer::Impl {
  Impl(InferenceServer& s, HttpOptions o);  // http_server.cpp

  InferenceServer& core;
  HttpOptions opt;
  ProtocolMetrics& metrics;
  // Before the io_context: destroying it destroys the handlers that still own sessions, whose
  // destructors use these.
  mutable std::mutex mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  std::condition_variable sessions_closed;  ///< notified (under mu) as each session goes
  std::function<void()> on_closed;          ///< Frontend::closed of the HttpServer
  std::atomic<std::size_t> connections{0};  ///< API connections admitted
  std::atomic<std::size_t> rejecting{0};    ///< refused connections being answered 429
  std::atomic<bool> draining{false};
  bool stopped = false;

  /// One io_context per I/O thread, each run by its own thread alone (nginx's worker model):
  /// a connection stays on the context it was given at accept, so its reads, handlers and writes
  /// never hand over between I/O threads, and no thread sleeps on a context another one polls.
  /// One context run by every thread (Asio's default) woke a second thread through the
  /// scheduler's condition variable for most completions: docs/performance.md, "The HTTP hot
  /// path: one io_context per I/O thread".
  struct IoLoop {
    net::io_context ioc{1};
    /// Inference requests of this loop's sessions submitted to an engine, and their answers run
    /// on this loop (Session::on_infer_done): the I/O thread's alone (HttpOptions::spin_wait).
    std::uint64_t submitted = 0;
    std::uint64_t received = 0;
  };
  std::vector<std::unique_ptr<IoLoop>> loops;
  std::vector<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::atomic<std::size_t> next_loop{0};
  /// The loop for a new connection: round robin. Any thread.
  IoLoop& pick_loop() {
    return *loops[next_loop.fetch_add(1, std::memory_order_relaxed) % loops.size()];
  }
  /// Where large bodies are decoded and large responses encoded, off the I/O threads.
  net::thread_pool codec_pool;
  net::thread_pool::executor_type codec() { return codec_pool.get_executor(); }

  class Listener;  // http_server.cpp
  std::shared_ptr<Listener> http_listener;
  std::shared_ptr<Listener> metrics_listener;

  /// A session of `kind` ended: its connection slot and descriptor come back.
  void connection_closed(SessionKind kind);  // http_server.cpp
  void add(const std::shared_ptr<Session>& s);
  void remove(Session* s);
  std::vector<std::shared_ptr<Session>> snapshot() const;
};

// ---- one connection ----------------------------------------------------------------------------

/// The responses of one generate / generate_stream request between the model's thread and the
/// session's I/O thread: at most kMaxQueuedEvents not yet written, then the model's send waits
/// (back-pressure). Thread-safe.
class EventQueue {
 public:
  static constexpr std::size_t kMaxQueuedEvents = 64;

  /// On the model's thread: waits for room; false once the client is gone or the request has
  /// ended (`stop`).
  bool reserve(const std::stop_token& stop) {
    std::unique_lock lock(mu_);
    room_.wait(lock, stop, [&] { return gone_ || queued_ < kMaxQueuedEvents; });
    if (gone_ || stop.stop_requested()) return false;
    ++queued_;
    return true;
  }
  /// On the session's I/O thread, once an event is written (or dropped).
  void written() {
    {
      std::lock_guard lock(mu_);
      if (queued_ > 0) --queued_;
    }
    room_.notify_all();
  }
  void close() {
    {
      std::lock_guard lock(mu_);
      gone_ = true;
    }
    room_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable_any room_;
  std::size_t queued_ = 0;
  bool gone_ = false;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Phase = SessionPhase;  // http_session_state.hpp: the phases and their legal moves

  using Kind = SessionKind;

  /// `loop`: the one whose context `socket` was accepted on.
  Session(HttpServer::Impl& impl, Socket socket, Kind kind, HttpServer::Impl::IoLoop& loop);

  ~Session();

  /// Runs on the session's I/O thread.
  void start();

  /// Posted by the server when it starts draining.
  void on_drain();

  /// Posted by the server when it stops.
  void on_stop();

  IoExecutor executor() { return socket_.get_executor(); }

 private:
  // ---- reading ----------------------------------------------------------------------------------
  void wait_request();

  /// A read that waits for the next bytes: the start of the next request, or — while a request
  /// is being answered — the client's disconnect.
  void read_some();
  void on_read_some(beast::error_code ec, std::size_t n);
  /// The first bytes of a request are in the buffer: a new parser, the header's deadline.
  void start_request();
  /// Feeds the buffer to the parser (our own loop over Beast's put(), so that every byte it
  /// holds counts against a limit): the header, its checks (on_header), then the body, reading
  /// more while the request is incomplete; answers the request once it is whole.
  void parse();
  enum class HeaderVerdict : std::uint8_t { read_body, wait_continue, answered };
  /// The header is whole: the framing checks (Transfer-Encoding, Host), the body's lease of the
  /// memory budget, 100-continue.
  HeaderVerdict on_header();
  void on_read_error(beast::error_code ec);

  // ---- handling (http_routes.cpp) ---------------------------------------------------------------
  void on_request();
  void handle_metrics();
  void handle_api();
  void handle_infer(const std::string& model, const std::string& version);
  /// An inference request (infer, generate, generate_stream) to `model` is read: when the
  /// server traces (TraceManager::active), samples it into trace_ and records its receipt
  /// (HTTP_RECV_START, HTTP_RECV_END).
  void sample_trace(const std::string& model);
  /// GET/POST /v2/trace/setting (`model` empty) and /v2/models/{m}/trace/setting.
  void handle_trace_setting(const std::string& model);
  /// `body_too_large`: inflating the body passed --max-body-bytes (413); `inflated`: the body
  /// was compressed, so its tensors are counted against the memory budget only now.
  void on_decoded(const ModelRef& model, Result<DecodedInfer> decoded, bool body_too_large = false,
                  bool inflated = false);
  /// POST /v2/repository/models/{m}/load or /unload: answered from the control thread.
  void handle_repository(const std::string& model, bool load);
  /// Triton's system shared memory endpoints (and the CUDA ones, which hold no region here).
  void handle_shared_memory(const std::vector<std::string_view>& path, bool cuda,
                            http::verb method);
  void on_repository_done(const Status& s);
  // generate and generate_stream (http_generate.cpp).
  void handle_generate(const std::string& model, const std::string& version, bool stream);
  /// A decoupled model's response before the final one (its JSON, or why it has none).
  void on_generate_response(const std::shared_ptr<EventQueue>& events, Result<std::string> text,
                            bool stream);
  void on_generate_done(Result<InferResponse> r);
  /// Writes what generate_stream has to write next: the header, an event, the last chunk.
  void pump_events();
  void on_event_written(beast::error_code ec, bool event);
  void on_infer_done(Result<InferResponse> r);
  void send_infer(EncodedResponse enc);
  /// Adds the request's headers that --http-header-forward-pattern forwards to `parameters`.
  void forward_headers(Parameters& parameters) const;

  // ---- writing (not_found and respond_method: http_routes.cpp) ----------------------------------
  void not_found(std::string_view target);
  void respond_method(const char* allowed);
  void respond_status(const Status& s) { respond_error(http_status(s.code()), s.message()); }
  void respond_error(int status, std::string_view message) { respond(status, error_json(message)); }
  void respond(int status, std::string body, const char* content_type = "application/json");
  void send(Response res);

  /// Writes the response a piece at a time; each piece written moves the deadline, so a client
  /// that reads slowly but steadily gets the whole of a large response, and one that stops
  /// reading is closed after --idle-timeout without progress.
  void write_some();
  void on_write(beast::error_code ec);

  // ---- state ------------------------------------------------------------------------------------
  /// The one place phase_ changes: checked against kSessionPhaseMoves (an illegal change aborts).
  void set_phase(Phase to) { kSessionPhaseMoves.move(phase_, to); }
  /// The one place sse_ changes: checked against kSseMoves.
  void set_sse(SseState to) { kSseMoves.move(sse_, to); }
  bool closed() const { return phase_ == Phase::closed; }
  /// Records `why` the connection ends early unless a stronger reason already holds (the order of
  /// CloseReason); checked against kCloseReasonMoves.
  void close_for(CloseReason why) {
    if (why > close_reason_) kCloseReasonMoves.move(close_reason_, why);
  }
  bool client_gone() const { return close_reason_ == CloseReason::client_gone; }
  /// The connection closes after the current response: this session was told of the drain, or the
  /// server drains (told or not yet).
  bool draining() const {
    return close_reason_ == CloseReason::draining || impl_.draining.load(std::memory_order_acquire);
  }

  // ---- timers and closing -----------------------------------------------------------------------
  void set_deadline(std::chrono::milliseconds after);

  /// No deadline while the engine has the request (its own deadline applies).
  void clear_deadline() { deadline_ = Clock::time_point::max(); }

  void start_timer(Clock::time_point at);
  void on_timer(beast::error_code ec);

  /// Bytes written to the socket that the client has not acknowledged yet (the kernel's send
  /// queue, TIOCOUTQ: unsent and in flight; 0 when unknown).
  std::size_t unsent_bytes();
  /// Bytes the client has taken of what this session wrote (written_ less unsent_bytes()).
  std::uint64_t taken_bytes();
  /// generate_stream: arms the progress check unless armed (a write does not move it, so that a
  /// client that reads nothing is found even while the kernel still takes the writes).
  void arm_stream_check();

  /// Stops sending, then reads and discards what the client still sends (for up to kLinger)
  /// before closing, so that it reads the answer rather than a connection reset.
  void linger();
  void discard();
  void close();

  // ---- state (used on the session's I/O thread only) --------------------------------------------
  HttpServer::Impl& impl_;
  Socket socket_;
  HttpServer::Impl::IoLoop& loop_;  ///< the loop whose context runs socket_
  Timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::optional<Response> response_;
  std::optional<http::response_serializer<http::string_body>> serializer_;
  DecodedInfer decoded_;
  InflightRequest inflight_;
  /// The request's share of the server's memory budget: its body while it is read and
  /// decoded, its tensors while it runs, its response while it is written.
  MemoryBudget::Lease lease_;
  std::size_t header_bytes_ = 0;  ///< the current request's header, for the trailers' limit
  Clock::time_point request_read_at_;
  /// Tracing (trace.hpp), only while the server's TraceManager is active: when the current
  /// request's first byte was parsed (0 otherwise), and its trace if it was sampled (until its
  /// response is written: HTTP_SEND_END).
  std::int64_t recv_start_ns_ = 0;
  std::shared_ptr<Trace> trace_;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point timer_at_;
  /// A wait of timer_ is pending (an outstanding operation, whatever the phase; not a phase).
  bool timer_waiting_ = false;
  /// Bytes this session's writes handed to the kernel (the serializer's and generate_stream's);
  /// less what the kernel still holds (unsent_bytes), what the client has taken: its progress.
  std::uint64_t written_ = 0;
  std::uint64_t taken_at_last_timeout_ = 0;
  unsigned version_ = 11;
  /// The current request's method (HEAD is answered without a body); unknown until its header.
  http::verb method_ = http::verb::unknown;
  /// Where the connection is in its life; changed by set_phase() only.
  Phase phase_ = Phase::idle;
  const Kind kind_;
  // Facts beside the phase, not phases of their own: each holds in several phases, and which
  // phase comes next does not depend on them alone.
  /// The connection stays open after this response: from the request's header (Connection,
  /// HTTP/1.0), cleared by a refusal or a drain.
  bool keep_alive_ = true;
  /// A read of the socket is pending (an outstanding operation: in idle, header, body, and while
  /// a request is handled or answered, where it watches for the client's disconnect).
  bool reading_ = false;
  /// Why the connection ends early, if it does (http_session_state.hpp); changed by
  /// close_for() and set_deadline() only.
  CloseReason close_reason_ = CloseReason::none;
  /// What the current request asks for (an inference's latency is observed when its response is
  /// written; generate_stream answers with events).
  RequestKind request_kind_ = RequestKind::other;
  /// The coding of the current /infer response, from the request's Accept-Encoding.
  ContentCoding response_coding_ = ContentCoding::identity;
  // generate / generate_stream: the responses on their way from the model (its back-pressure),
  // the events not yet written, the chunked response's header.
  std::shared_ptr<EventQueue> events_;
  std::deque<std::string> sse_pending_;
  std::optional<http::response<http::empty_body>> sse_header_;
  /// The status the event stream's header carries: 200, or the error's when the model's first
  /// response is an error (Triton's: the events still follow, the error one among them).
  int sse_status_ = 200;
  std::optional<http::response_serializer<http::empty_body>> sse_serializer_;
  Result<std::string> generate_answer_{std::string()};
  std::uint64_t generated_ = 0;  ///< responses before the final one
  /// Where the generate_stream response is; changed by set_sse() only.
  SseState sse_ = SseState::none;
  /// A write of the event stream is pending (an outstanding operation: always in SseState's
  /// header and last, while an event is written in events and final).
  bool sse_writing_ = false;
};

}  // namespace asyncinfer::server
