#include "http_server.hpp"

#include <sys/ioctl.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "oip_json.hpp"
#include "status_mapping.hpp"

namespace asyncinfer::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using Response = http::response<http::string_body>;
// Concrete executor types: the type-erased any_io_executor costs a few percent per request.
using Strand = net::strand<net::io_context::executor_type>;
using Socket = net::basic_stream_socket<tcp, Strand>;
using Timer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Strand>;
using Acceptor = net::basic_socket_acceptor<tcp, Strand>;

constexpr std::size_t kReadChunk = 16 * 1024;
/// Bytes of a pipelined next request read ahead while one is being answered.
constexpr std::size_t kReadAhead = 64 * 1024;
/// How long a connection that is being closed keeps draining what the client still sends, so
/// that the client reads our answer instead of a reset (nginx's lingering close).
constexpr std::chrono::milliseconds kLinger{2000};

const ProtocolMetrics::Labels& status_class_labels() {
  static const ProtocolMetrics::Labels labels{"status_class", {"1xx", "2xx", "3xx", "4xx", "5xx"}};
  return labels;
}

/// Percent-decodes one path segment ("my%20model" → "my model"); false for a bad escape.
bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    unsigned v = 0;
    auto [p, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, v, 16);
    if (ec != std::errc() || p != in.data() + i + 3) return false;
    out += static_cast<char>(v);
    i += 2;
  }
  return true;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  std::size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    const std::size_t j = path.find('/', i);
    const std::size_t end = j == std::string_view::npos ? path.size() : j;
    if (end > i) parts.push_back(path.substr(i, end - i));
    i = end;
  }
  return parts;
}

}  // namespace

class Session;

struct HttpServer::Impl {
  Impl(InferenceServer& s, HttpOptions o)
      : core(s),
        opt(std::move(o)),
        metrics(s.protocol_metrics("http", status_class_labels())),
        ioc(opt.threads > 0 ? opt.threads : 1) {}

  InferenceServer& core;
  HttpOptions opt;
  ProtocolMetrics& metrics;
  // Before the io_context: destroying it destroys the handlers that still own sessions, whose
  // destructors use these.
  mutable std::mutex mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  std::atomic<std::size_t> connections{0};
  std::atomic<bool> draining{false};
  bool stopped = false;

  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;

  class Listener;
  std::shared_ptr<Listener> http_listener;
  std::shared_ptr<Listener> metrics_listener;

  void add(const std::shared_ptr<Session>& s);
  void remove(Session* s);
  std::vector<std::shared_ptr<Session>> snapshot() const;
};

// ---- one connection ----------------------------------------------------------------------------

class Session : public std::enable_shared_from_this<Session> {
 public:
  enum class Phase : std::uint8_t { idle, header, body, handling, writing, closing };

  Session(HttpServer::Impl& impl, Socket socket, bool metrics_port, bool reject)
      : impl_(impl),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        metrics_port_(metrics_port),
        reject_(reject) {}

  ~Session() {
    if (counted_) {
      impl_.metrics.connection_closed();
      impl_.connections.fetch_sub(1, std::memory_order_relaxed);
    }
    impl_.remove(this);
  }

  /// Runs on the session's strand.
  void start() {
    beast::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    if (reject_) {
      impl_.metrics.connection_rejected();
      keep_alive_ = false;
      respond_error(429, "too many connections: the server holds " +
                             std::to_string(impl_.opt.max_connections) +
                             " (its connection limit); retry later");
      return;
    }
    counted_ = !metrics_port_;  // the metrics port is not an API connection
    if (counted_) impl_.metrics.connection_opened();
    wait_request();
  }

  /// Posted by the server when it starts draining.
  void on_drain() {
    draining_ = true;
    if (phase_ == Phase::idle) close();
  }

  /// Posted by the server when it stops.
  void on_stop() {
    if (inflight_.valid()) inflight_.cancel();
    close();
  }

  Strand executor() { return socket_.get_executor(); }

 private:
  // ---- reading ---------------------------------------------------------------------------------

  void wait_request() {
    phase_ = Phase::idle;
    if (draining_ || impl_.draining.load(std::memory_order_acquire)) {
      close();
      return;
    }
    if (buffer_.size() > 0) {
      read_header();
      return;
    }
    set_deadline(impl_.opt.idle_timeout);
    if (!reading_) read_some();
  }

  /// A read that waits for the next bytes: the start of the next request, or — while a request
  /// is being answered — the client's disconnect.
  void read_some() {
    reading_ = true;
    socket_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->on_read_some(ec, n);
                            });
  }

  void on_read_some(beast::error_code ec, std::size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      if (phase_ == Phase::handling) {
        // The client went away while its request ran: cancel it in the engine; the response
        // that comes back is dropped.
        client_gone_ = true;
        inflight_.cancel();
      } else if (phase_ == Phase::writing) {
        client_gone_ = true;
      } else {
        close();
      }
      return;
    }
    buffer_.commit(n);
    if (phase_ == Phase::idle) {
      read_header();
    } else if (phase_ == Phase::handling && buffer_.size() == 0) {
      read_some();
    }
    // Otherwise a pipelined request waits in the buffer for the current one to be answered.
  }

  void read_header() {
    phase_ = Phase::header;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(impl_.opt.max_header_bytes));
    parser_->body_limit(impl_.opt.max_body_bytes);
    set_deadline(impl_.opt.header_timeout);
    http::async_read_header(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (ec) return on_read_error(ec, "header");
    auto& req = parser_->get();
    // RFC 9112 §6.3: a request whose final transfer coding is not chunked has no length the
    // server can trust; read as a zero-length body, its bytes would be taken for the next
    // request (smuggling). Refuse it and close.
    if (req.count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
      keep_alive_ = false;
      version_ = req.version();
      return respond_error(400, "Transfer-Encoding '" +
                                    std::string(req[http::field::transfer_encoding]) +
                                    "' is not supported: only chunked may be the final transfer "
                                    "coding of a request (or give Content-Length)");
    }
    if (req.count("Inference-Header-Content-Length") > 1) {
      keep_alive_ = false;
      version_ = req.version();
      return respond_error(400, "Inference-Header-Content-Length is given more than once");
    }
    if (parser_->is_done()) return on_request();
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      // curl and others wait for this before sending a large body.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(socket_, net::buffer(kContinue),
                       [self = shared_from_this()](beast::error_code wec, std::size_t) {
                         if (self->closed_) return;
                         if (wec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    phase_ = Phase::body;
    set_deadline(impl_.opt.body_timeout);
    http::async_read(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    if (closed_) return;
    if (ec) return on_read_error(ec, "body");
    on_request();
  }

  void on_read_error(beast::error_code ec, const char* part) {
    const bool timed_out = timed_out_;
    clear_deadline();
    keep_alive_ = false;
    if (timed_out) {
      const auto limit =
          phase_ == Phase::header ? impl_.opt.header_timeout : impl_.opt.body_timeout;
      return respond_error(408, std::string("request ") + part + " not received within " +
                                    std::to_string(limit.count()) + " ms");
    }
    if (ec == http::error::body_limit) {
      return respond_error(413, "request body exceeds the maximum allowed value of " +
                                    std::to_string(impl_.opt.max_body_bytes) + " bytes");
    }
    if (ec == http::error::header_limit) {
      return respond_error(431, "request header exceeds the maximum allowed value of " +
                                    std::to_string(impl_.opt.max_header_bytes) + " bytes");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == http::error::partial_message) {
      return close();  // the client went away
    }
    respond_error(400, std::string("malformed HTTP request ") + part + ": " + ec.message());
  }

  // ---- handling --------------------------------------------------------------------------------

  void on_request() {
    clear_deadline();
    request_read_at_ = Clock::now();
    request_ = parser_->release();
    parser_.reset();
    keep_alive_ = request_.keep_alive();
    version_ = request_.version();
    is_infer_ = false;
    if (metrics_port_) return handle_metrics();
    handle_api();
  }

  void handle_metrics() {
    std::string_view target = request_.target();
    target = target.substr(0, target.find('?'));
    if (target != "/metrics")
      return respond_error(404, "not found: the metrics port serves /metrics");
    if (request_.method() != http::verb::get) return respond_method("GET");
    respond(200, impl_.core.metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  }

  void handle_api() {
    std::string_view target = request_.target();
    target = target.substr(0, target.find('?'));
    const std::vector<std::string_view> p = split_path(target);
    const http::verb method = request_.method();
    auto is = [&](std::size_t n, std::initializer_list<std::string_view> fixed) {
      if (p.size() != n) return false;
      std::size_t i = 0;
      for (std::string_view f : fixed) {
        if (!f.empty() && p[i] != f) return false;
        ++i;
      }
      return true;
    };
    auto need = [&](http::verb v) {
      if (method == v) return true;
      respond_method(v == http::verb::get ? "GET" : "POST");
      return false;
    };
    if (p.empty() || p[0] != "v2") return not_found(target);
    if (p.size() == 1) {
      if (need(http::verb::get)) respond(200, server_metadata_json(impl_.core));
      return;
    }
    if (is(3, {"v2", "health", "live"})) {
      if (!need(http::verb::get)) return;
      if (impl_.core.live()) return respond(200, "", "");
      return respond_error(503, "server is not live");
    }
    if (is(3, {"v2", "health", "ready"})) {
      if (!need(http::verb::get)) return;
      if (impl_.core.ready()) return respond(200, "", "");
      return respond_error(503, impl_.core.draining()
                                    ? "server is shutting down"
                                    : "server is not ready: a model version failed to load or "
                                      "cannot serve (POST /v2/repository/index gives each "
                                      "version's state and reason)");
    }
    if (is(3, {"v2", "repository", "index"})) {
      if (!need(http::verb::post)) return;
      auto ready_only = parse_index_request(request_.body(), impl_.opt.max_json_depth);
      if (!ready_only.ok()) return respond_status(ready_only.status());
      return respond(200, repository_index_json(impl_.core.repository(), *ready_only));
    }
    if (p.size() < 3 || p[1] != "models") return not_found(target);
    // /v2/models/{m}[/versions/{v}][/ready|/infer|/config]
    std::string model;
    std::string version;
    if (!percent_decode(p[2], model)) return respond_error(400, "bad percent-escape in model name");
    std::size_t next = 3;
    if (p.size() >= 5 && p[3] == "versions") {
      if (!percent_decode(p[4], version))
        return respond_error(400, "bad percent-escape in version");
      next = 5;
    } else if (p.size() == 4 && p[3] == "versions") {
      return not_found(target);
    }
    std::string_view action = next < p.size() ? p[next] : std::string_view();
    if (next + (action.empty() ? 0 : 1) != p.size()) return not_found(target);

    if (action.empty()) {
      if (!need(http::verb::get)) return;
      auto mv = impl_.core.find(model, version);
      if (!mv.ok()) return respond_status(mv.status());
      const ServedModel* sm = impl_.core.repository().find(model);
      return respond(200, model_metadata_json(*sm, **mv, version.empty() ? nullptr : *mv));
    }
    if (action == "ready") {
      if (!need(http::verb::get)) return;
      auto mv = impl_.core.find(model, version);
      if (mv.ok()) return respond(200, "", "");
      // Triton: a known model that is not ready answers 400.
      const int status =
          mv.status().code() == StatusCode::unavailable ? 400 : http_status(mv.status().code());
      return respond_error(status, mv.status().message());
    }
    if (action == "infer") {
      if (!need(http::verb::post)) return;
      return handle_infer(model, version);
    }
    not_found(target);
  }

  void handle_infer(const std::string& model, const std::string& version) {
    is_infer_ = true;
    auto mv = impl_.core.find(model, version);
    if (!mv.ok()) return respond_status(mv.status());
    std::optional<std::size_t> header_length;
    if (auto it = request_.find("Inference-Header-Content-Length"); it != request_.end()) {
      const std::string_view v = it->value();
      std::size_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || p != v.data() + v.size()) {
        return respond_error(400, "Inference-Header-Content-Length '" + std::string(v) +
                                      "' is not a non-negative integer");
      }
      header_length = n;
    }
    auto decoded =
        decode_infer_request(**mv, request_.body(), header_length, impl_.opt.max_json_depth);
    // The inputs were copied into tensors: the body can go.
    request_.body() = std::string();
    if (!decoded.ok()) return respond_status(decoded.status());
    decoded_ = std::move(*decoded);
    auto self = shared_from_this();
    auto accepted = impl_.core.submit(
        **mv, std::move(decoded_.request), [self](Result<InferResponse> r) mutable {
          // On the engine's completion executor: hand the result to this session's strand.
          net::post(self->executor(),
                    [self, r = std::move(r)]() mutable { self->on_infer_done(std::move(r)); });
        });
    if (!accepted.ok()) return respond_status(accepted.status());
    inflight_ = std::move(*accepted);
    phase_ = Phase::handling;
    // Watch the socket meanwhile: a disconnect cancels the request.
    if (!reading_ && buffer_.size() == 0) read_some();
  }

  void on_infer_done(Result<InferResponse> r) {
    inflight_ = InflightRequest();
    if (closed_) return;
    if (client_gone_) return close();
    if (!r.ok()) return respond_status(r.status());
    EncodedResponse enc = encode_infer_response(*r, decoded_);
    Response res{http::status::ok, version_};
    res.set(http::field::content_type,
            enc.binary ? "application/octet-stream" : "application/json");
    if (enc.binary) res.set("Inference-Header-Content-Length", std::to_string(enc.json_size));
    res.body() = std::move(enc.body);
    send(std::move(res));
  }

  // ---- writing ---------------------------------------------------------------------------------

  void not_found(std::string_view target) {
    respond_error(404, "unknown endpoint " + std::string(request_.method_string()) + " " +
                           std::string(target) + " (docs/serving.md lists the endpoints)");
  }

  void respond_method(const char* allowed) {
    Response res{http::status::method_not_allowed, version_};
    res.set(http::field::allow, allowed);
    res.set(http::field::content_type, "application/json");
    res.body() = error_json(std::string(request_.method_string()) + " is not allowed here (" +
                            allowed + ")");
    send(std::move(res));
  }

  void respond_status(const Status& s) { respond_error(http_status(s.code()), s.message()); }

  void respond_error(int status, std::string_view message) { respond(status, error_json(message)); }

  void respond(int status, std::string body, const char* content_type = "application/json") {
    Response res{static_cast<http::status>(status), version_};
    if (content_type != nullptr && *content_type != '\0') {
      res.set(http::field::content_type, content_type);
    }
    res.body() = std::move(body);
    send(std::move(res));
  }

  void send(Response res) {
    phase_ = Phase::writing;
    const bool keep = keep_alive_ && !draining_ && !impl_.draining.load(std::memory_order_acquire);
    res.keep_alive(keep);
    keep_alive_ = keep;
    res.prepare_payload();
    const int status = static_cast<int>(res.result_int());
    if (!metrics_port_) {  // scrapes are not API requests (as for the connection gauges)
      impl_.metrics.count_request(static_cast<std::size_t>(std::clamp(status / 100, 1, 5) - 1));
    }
    response_.emplace(std::move(res));
    serializer_.emplace(*response_);
    write_some();
  }

  /// Writes the response a piece at a time; each piece written moves the deadline, so a client
  /// that reads slowly but steadily gets the whole of a large response, and one that stops
  /// reading is closed after --idle-timeout without progress.
  void write_some() {
    set_deadline(impl_.opt.idle_timeout);
    http::async_write_some(socket_, *serializer_,
                           [self = shared_from_this()](beast::error_code ec, std::size_t) {
                             if (!ec && !self->closed_ && !self->serializer_->is_done()) {
                               return self->write_some();
                             }
                             self->on_write(ec);
                           });
  }

  void on_write(beast::error_code ec) {
    clear_deadline();
    serializer_.reset();
    response_.reset();
    if (is_infer_ && !ec) {
      impl_.metrics.observe_infer_us(
          std::chrono::duration<double, std::micro>(Clock::now() - request_read_at_).count());
    }
    if (closed_) return;
    if (ec || client_gone_) return close();
    if (!keep_alive_) return linger();
    wait_request();
  }

  // ---- timers and closing ----------------------------------------------------------------------

  // One timer per session, and a deadline that moves: setting a later deadline (the common
  // case: header, then write, then idle) does not touch the timer; when it fires early it waits
  // again until the current deadline. So a request costs no timer cancellations.

  void set_deadline(std::chrono::milliseconds after) {
    timed_out_ = false;
    deadline_ = Clock::now() + after;
    if (timer_waiting_ && timer_at_ <= deadline_) return;  // it fires first, then waits again
    start_timer(deadline_);
  }

  /// No deadline while the engine has the request (its own deadline applies).
  void clear_deadline() { deadline_ = Clock::time_point::max(); }

  void start_timer(Clock::time_point at) {
    timer_at_ = at;
    timer_waiting_ = true;
    timer_.expires_at(at);  // a wait still pending ends with operation_aborted
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->on_timer(ec); });
  }

  void on_timer(beast::error_code ec) {
    if (ec == net::error::operation_aborted) return;  // a newer wait replaced this one
    timer_waiting_ = false;
    if (closed_ || deadline_ == Clock::time_point::max()) return;
    if (Clock::now() < deadline_) return start_timer(deadline_);
    if (phase_ == Phase::idle || phase_ == Phase::writing || phase_ == Phase::closing) {
      // A response may sit in the kernel's send queue (megabytes on loopback) while the client
      // reads it; a write waits for room meanwhile. As long as that queue shrinks between two
      // timeouts the client is reading, not idle.
      const std::size_t unsent = unsent_bytes();
      if (unsent > 0 && unsent != unsent_at_last_timeout_) {
        unsent_at_last_timeout_ = unsent;
        return set_deadline(phase_ == Phase::closing ? kLinger : impl_.opt.idle_timeout);
      }
    }
    timed_out_ = true;
    if (phase_ == Phase::idle) {
      // Idle after a response: the client may still be reading its tail from the kernel's
      // buffers, which an abrupt close can discard (a reset); end it the graceful way.
      linger();
    } else if (phase_ == Phase::writing || phase_ == Phase::closing) {
      close();
    } else {
      beast::error_code ignored;
      socket_.cancel(ignored);  // the pending read's handler answers 408
    }
  }

  /// Bytes written to the socket that the kernel has not sent yet (0 when unknown).
  std::size_t unsent_bytes() {
    int n = 0;
    if (::ioctl(socket_.native_handle(), TIOCOUTQ, &n) != 0 || n < 0) return 0;
    return static_cast<std::size_t>(n);
  }

  /// Stops sending, then reads and discards what the client still sends (for up to kLinger)
  /// before closing, so that it reads the answer rather than a connection reset.
  void linger() {
    phase_ = Phase::closing;
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    set_deadline(kLinger);
    discard();
  }

  void discard() {
    if (closed_) return;
    if (reading_) return;  // a read is pending; its end closes or re-enters here
    reading_ = true;
    buffer_.clear();
    socket_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              self->reading_ = false;
                              if (ec || self->closed_) return self->close();
                              self->discard();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    phase_ = Phase::closing;
    if (inflight_.valid()) inflight_.cancel();
    beast::error_code ec;
    clear_deadline();
    timer_.cancel();  // the pending wait holds this session
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  HttpServer::Impl& impl_;
  Socket socket_;
  Timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::optional<Response> response_;
  std::optional<http::response_serializer<http::string_body>> serializer_;
  DecodedInfer decoded_;
  InflightRequest inflight_;
  Clock::time_point request_read_at_;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point timer_at_;
  bool timer_waiting_ = false;
  std::size_t unsent_at_last_timeout_ = 0;
  unsigned version_ = 11;
  Phase phase_ = Phase::idle;
  bool metrics_port_;
  bool reject_;
  bool counted_ = false;
  bool keep_alive_ = true;
  bool reading_ = false;
  bool timed_out_ = false;
  bool client_gone_ = false;
  bool draining_ = false;
  bool closed_ = false;
  bool is_infer_ = false;
};

// ---- listeners -------------------------------------------------------------------------------

class HttpServer::Impl::Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(Impl& impl, bool metrics)
      : impl_(impl),
        metrics_(metrics),
        acceptor_(net::make_strand(impl.ioc)),
        retry_(acceptor_.get_executor()) {}

  Status open(const tcp::endpoint& endpoint) {
    beast::error_code ec;
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return unavailable_error("cannot listen on " + endpoint.address().to_string() + ":" +
                               std::to_string(endpoint.port()) + ": " + ec.message() +
                               (metrics_ ? " (choose another with --metrics-port; 0 = a free "
                                           "port, -1 = no metrics listener)"
                                         : " (choose another with --http-port; 0 = a free port)"));
    }
    port_ = acceptor_.local_endpoint(ec).port();
    return Status();
  }

  int port() const noexcept { return port_; }

  void accept() {
    acceptor_.async_accept(net::make_strand(impl_.ioc),
                           [self = shared_from_this()](beast::error_code ec, Socket s) {
                             self->on_accept(ec, std::move(s));
                           });
  }

  /// Closes the acceptor on its strand; the future is ready once it is closed (or, should the
  /// io_context have stopped, at once: the promise is then broken).
  std::future<void> close() {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> closed = done->get_future();
    net::post(acceptor_.get_executor(), [self = shared_from_this(), done] {
      beast::error_code ec;
      self->closed_ = true;
      self->retry_.cancel();
      self->acceptor_.close(ec);
      done->set_value();
    });
    return closed;
  }

 private:
  void on_accept(beast::error_code ec, Socket socket) {
    if (closed_ || !acceptor_.is_open()) return;
    if (ec) {
      // Out of file descriptors and the like: try again shortly rather than spin.
      retry_.expires_after(std::chrono::milliseconds(50));
      retry_.async_wait([self = shared_from_this()](beast::error_code wec) {
        if (!wec && !self->closed_) self->accept();
      });
      return;
    }
    bool over = false;
    if (!metrics_) {  // the metrics port does not count toward the limit
      over = impl_.connections.fetch_add(1, std::memory_order_relaxed) >= impl_.opt.max_connections;
      if (over) impl_.connections.fetch_sub(1, std::memory_order_relaxed);
    }
    auto session = std::make_shared<Session>(impl_, std::move(socket), metrics_, over);
    impl_.add(session);
    net::dispatch(session->executor(), [session] { session->start(); });
    accept();
  }

  Impl& impl_;
  bool metrics_;
  Acceptor acceptor_;
  Timer retry_;
  int port_ = 0;
  bool closed_ = false;
};

void HttpServer::Impl::add(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(mu);
  sessions.emplace(s.get(), s);
}

void HttpServer::Impl::remove(Session* s) {
  std::lock_guard lock(mu);
  sessions.erase(s);
}

std::vector<std::shared_ptr<Session>> HttpServer::Impl::snapshot() const {
  std::vector<std::shared_ptr<Session>> out;
  std::lock_guard lock(mu);
  for (const auto& [p, w] : sessions) {
    if (auto s = w.lock()) out.push_back(std::move(s));
  }
  return out;
}

// ---- HttpServer --------------------------------------------------------------------------------

HttpServer::HttpServer(InferenceServer& server, HttpOptions options) {
  if (options.threads <= 0) {
    options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  impl_ = std::make_unique<Impl>(server, std::move(options));
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  Impl& im = *impl_;
  beast::error_code ec;
  std::string host = im.opt.host == "localhost" ? "127.0.0.1" : im.opt.host;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (ec) {
    return invalid_argument_error("--host '" + im.opt.host +
                                  "' is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)");
  }
  auto check_port = [](int port, const char* what, bool allow_off) -> Status {
    if (port < (allow_off ? -1 : 0) || port > 65535) {
      return invalid_argument_error(std::string(what) + " " + std::to_string(port) +
                                    " is not a port (0 = any free port" +
                                    (allow_off ? ", -1 = off)" : ")"));
    }
    return Status();
  };
  ASYNCINFER_RETURN_IF_ERROR(check_port(im.opt.http_port, "--http-port", false));
  ASYNCINFER_RETURN_IF_ERROR(check_port(im.opt.metrics_port, "--metrics-port", true));
  im.http_listener = std::make_shared<Impl::Listener>(im, false);
  ASYNCINFER_RETURN_IF_ERROR(
      im.http_listener->open({address, static_cast<unsigned short>(im.opt.http_port)}));
  if (im.opt.metrics_port >= 0) {
    im.metrics_listener = std::make_shared<Impl::Listener>(im, true);
    ASYNCINFER_RETURN_IF_ERROR(
        im.metrics_listener->open({address, static_cast<unsigned short>(im.opt.metrics_port)}));
  }
  im.http_listener->accept();
  if (im.metrics_listener) im.metrics_listener->accept();
  im.work.emplace(net::make_work_guard(im.ioc));
  for (int i = 0; i < im.opt.threads; ++i) {
    im.threads.emplace_back([&im] {
      // A handler that throws (out of memory, say) loses its connection, not the server.
      for (;;) {
        try {
          im.ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "asyncinfer serve: http: a connection failed: %s\n", e.what());
        }
      }
    });
  }
  return Status();
}

int HttpServer::http_port() const noexcept {
  return impl_->http_listener ? impl_->http_listener->port() : 0;
}

int HttpServer::metrics_port() const noexcept {
  return impl_->metrics_listener ? impl_->metrics_listener->port() : -1;
}

void HttpServer::stop_accepting() {
  Impl& im = *impl_;
  im.draining.store(true, std::memory_order_release);
  std::vector<std::future<void>> closed;
  if (im.http_listener) closed.push_back(im.http_listener->close());
  if (im.metrics_listener) closed.push_back(im.metrics_listener->close());
  for (auto& s : im.snapshot()) net::post(s->executor(), [s] { s->on_drain(); });
  // New connections are refused once this returns (docs/serving.md, "Shutdown").
  const auto until = Clock::now() + std::chrono::seconds(1);
  for (auto& c : closed) c.wait_until(until);
}

std::size_t HttpServer::open_connections() const {
  std::lock_guard lock(impl_->mu);
  return impl_->sessions.size();
}

void HttpServer::stop() {
  Impl& im = *impl_;
  if (im.stopped) return;
  im.stopped = true;
  // Engine callbacks post to sessions' strands: no engine may outlive the io_context.
  if (im.core.live()) im.core.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
  im.draining.store(true, std::memory_order_release);
  if (im.http_listener) im.http_listener->close();
  if (im.metrics_listener) im.metrics_listener->close();
  for (auto& s : im.snapshot()) net::post(s->executor(), [s] { s->on_stop(); });
  im.work.reset();
  // Closing finishes every session's pending operations; give it a moment, then stop.
  const auto until = Clock::now() + std::chrono::milliseconds(1000);
  while (open_connections() > 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  im.ioc.stop();
  for (std::thread& t : im.threads) t.join();
  im.threads.clear();
}

}  // namespace asyncinfer::server
