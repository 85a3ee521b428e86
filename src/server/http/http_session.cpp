// One HTTP connection (Session, http_server_impl.hpp): the chain of completion handlers that
// reads a request (header, then body, with their limits and timeouts), writes its response a
// piece at a time, keeps one moving deadline on one timer, and closes the connection gracefully
// (lingering so the client reads the answer rather than a reset). What a request asks for is
// answered in http_routes.cpp.
#include <sys/ioctl.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "http_server_impl.hpp"
#include "trace.hpp"

namespace asyncinfer::server {

Session::Session(HttpServer::Impl& impl, Socket socket, Kind kind, HttpServer::Impl::IoLoop& loop)
    : impl_(impl),
      socket_(std::move(socket)),
      loop_(loop),
      timer_(socket_.get_executor()),
      kind_(kind) {
  if (kind_ == Kind::api) impl_.metrics.connection_opened();
}

Session::~Session() {
  if (kind_ == Kind::api) impl_.metrics.connection_closed();
  impl_.connection_closed(kind_);
  impl_.remove(this);
}

void Session::start() {
  beast::error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);
  if (kind_ == Kind::rejected) {
    impl_.metrics.connection_rejected();
    keep_alive_ = false;
    version_ = 11;
    respond_error(429, "too many connections: the server holds " +
                           std::to_string(impl_.opt.max_connections) +
                           " (its connection limit), or is out of file descriptors for them; "
                           "retry later");
    return;
  }
  wait_request();
}

void Session::on_drain() {
  close_for(CloseReason::draining);
  if (phase_ == Phase::idle) close();
}

void Session::on_stop() {
  if (inflight_.valid()) inflight_.cancel();
  close();
}

// ---- reading ---------------------------------------------------------------------------------

void Session::wait_request() {
  set_phase(Phase::idle);
  if (draining()) {
    close();
    return;
  }
  if (buffer_.size() > 0) {
    start_request();
    return;
  }
  set_deadline(impl_.opt.idle_timeout);
  if (!reading_) read_some();
}

void Session::read_some() {
  reading_ = true;
  socket_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                            self->on_read_some(ec, n);
                          });
}

void Session::on_read_some(beast::error_code ec, std::size_t n) {
  reading_ = false;
  if (closed()) return;
  if (ec) {
    if (phase_ == Phase::handling) {
      // The client went away while its request ran: cancel it in the engine; the response
      // that comes back is dropped.
      close_for(CloseReason::client_gone);
      inflight_.cancel();
    } else if (phase_ == Phase::writing) {
      close_for(CloseReason::client_gone);
      if (events_) close();  // generate_stream: stop the model now, not at the next event
    } else if (phase_ == Phase::header || phase_ == Phase::body) {
      on_read_error(ec);
    } else {
      close();
    }
    return;
  }
  buffer_.commit(n);
  if (phase_ == Phase::idle) {
    start_request();
  } else if (phase_ == Phase::header || phase_ == Phase::body) {
    parse();
  }
  // Otherwise a pipelined request waits in the buffer for the current one to be answered.
}

void Session::start_request() {
  set_phase(Phase::header);
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(impl_.opt.max_header_bytes));
  parser_->body_limit(impl_.opt.max_body_bytes);
  parser_->eager(false);  // stop after the header, so that its size is known
  header_bytes_ = 0;
  method_ = http::verb::unknown;
  recv_start_ns_ = impl_.core.tracer().active() ? trace_ns(Clock::now()) : 0;
  lease_ = impl_.core.memory().lease();
  set_deadline(impl_.opt.header_timeout);
  parse();
}

void Session::parse() {
  beast::error_code ec;
  try {
    while (!parser_->is_done() && buffer_.size() > 0) {
      const bool had_header = parser_->is_header_done();
      const std::size_t n = parser_->put(buffer_.data(), ec);
      buffer_.consume(n);
      if (!had_header && parser_->is_header_done()) {
        header_bytes_ = n;
        // Answered, or waiting for the 100 Continue's write, which resumes parsing.
        if (on_header() != HeaderVerdict::read_body) return;
        parser_->eager(true);
        continue;
      }
      if (ec) break;
    }
  } catch (const std::length_error&) {
    // Beast keeps a field's name and value in 16-bit offsets; a longer one throws.
    clear_deadline();
    keep_alive_ = false;
    return respond_error(431, "a request header or trailer field is longer than 65535 bytes");
  }
  if (ec && ec != http::error::need_more) return on_read_error(ec);
  if (parser_->is_done()) return on_request();
  if (parser_->is_header_done()) {
    // Bytes the parser leaves in the buffer after the header are a chunk's size line or the
    // trailer fields, which it takes only once they are whole: they count against the header's
    // limit together with the header.
    const std::size_t room =
        impl_.opt.max_header_bytes - std::min(header_bytes_, impl_.opt.max_header_bytes);
    if (buffer_.size() > room) {
      clear_deadline();
      keep_alive_ = false;
      return respond_error(431,
                           "request header and trailer fields exceed the maximum allowed "
                           "value of " +
                               std::to_string(impl_.opt.max_header_bytes) + " bytes together");
    }
    // The body counts against the server's memory budget as its bytes arrive (not from its
    // Content-Length: a header alone must not hold the budget for the body timeout).
    const std::size_t body = parser_->get().body().size();
    if (body > lease_.bytes() && !lease_.reserve(body)) {
      clear_deadline();
      keep_alive_ = false;
      return respond_error(503, impl_.core.memory().exhausted_message(body - lease_.bytes()));
    }
  }
  if (!reading_) read_some();
}

Session::HeaderVerdict Session::on_header() {
  auto& req = parser_->get();
  version_ = req.version();
  auto refuse = [&](int status, std::string message) {
    clear_deadline();
    keep_alive_ = false;
    respond_error(status, message);
    return HeaderVerdict::answered;
  };
  if (req.count(http::field::transfer_encoding) > 0) {
    const std::string te(req[http::field::transfer_encoding]);
    // RFC 9112 §6.3: a request whose final transfer coding is not chunked has no length the
    // server can trust; read as a zero-length body, its bytes would be taken for the next
    // request (smuggling). Refuse it and close.
    if (!parser_->chunked()) {
      return refuse(400, "Transfer-Encoding '" + te +
                             "' is not supported: only chunked may be the final transfer coding "
                             "of a request (or give Content-Length)");
    }
    // RFC 9112 §6.1: a transfer coding the server does not understand is 501. Only chunked is
    // decoded here; "gzip, chunked" would hand the gzip bytes on as the body. (HTTP/1.0 with
    // chunked framing closes after its answer: on_request.)
    for (const auto& coding : http::token_list(te)) {
      if (!beast::iequals(coding, "chunked")) {
        return refuse(501, "Transfer-Encoding '" + te + "': the transfer coding '" +
                               std::string(coding) +
                               "' is not implemented; only chunked is (send Content-Encoding for "
                               "a compressed body)");
      }
    }
  }
  // RFC 9112 §3.2: an HTTP/1.1 request without Host, or any with several, is 400.
  const std::size_t hosts = req.count(http::field::host);
  if (hosts > 1 || (hosts == 0 && req.version() >= 11)) {
    return refuse(400, hosts > 1 ? "the request has more than one Host header field"
                                 : "an HTTP/1.1 request needs a Host header field (RFC 9112 "
                                   "§3.2)");
  }
  if (req.count("Inference-Header-Content-Length") > 1) {
    return refuse(400, "Inference-Header-Content-Length is given more than once");
  }
  if (parser_->is_done()) return HeaderVerdict::read_body;
  set_phase(Phase::body);
  set_deadline(impl_.opt.body_timeout);
  if (beast::iequals(req[http::field::expect], "100-continue") && buffer_.size() == 0) {
    // curl and others wait for this before sending a large body.
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    parser_->eager(true);
    net::async_write(socket_, net::buffer(kContinue),
                     [self = shared_from_this()](beast::error_code wec, std::size_t) {
                       if (self->closed()) return;
                       if (wec) return self->close();
                       self->parse();
                     });
    return HeaderVerdict::wait_continue;
  }
  return HeaderVerdict::read_body;
}

void Session::on_read_error(beast::error_code ec) {
  const bool timed_out = close_reason_ == CloseReason::timed_out;
  const char* part = phase_ == Phase::header ? "header" : "body";
  clear_deadline();
  keep_alive_ = false;
  if (timed_out) {
    const auto limit = phase_ == Phase::header ? impl_.opt.header_timeout : impl_.opt.body_timeout;
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

// ---- writing ---------------------------------------------------------------------------------

void Session::respond(int status, std::string body, const char* content_type) {
  Response res{static_cast<http::status>(status), version_};
  if (content_type != nullptr && *content_type != '\0') {
    res.set(http::field::content_type, content_type);
  }
  res.body() = std::move(body);
  send(std::move(res));
}

void Session::send(Response res) {
  set_phase(Phase::writing);
  const bool keep = keep_alive_ && !draining();
  res.keep_alive(keep);
  keep_alive_ = keep;
  res.prepare_payload();
  // HEAD: the header GET would send, Content-Length included, and no body.
  if (method_ == http::verb::head) res.body() = std::string();
  const int status = static_cast<int>(res.result_int());
  if (kind_ == Kind::api) {  // scrapes are not API requests (as for the connection gauges)
    impl_.metrics.count_request(static_cast<std::size_t>(std::clamp(status / 100, 1, 5) - 1));
  }
  // The response counts against the memory budget while it is written.
  lease_.hold(res.body().size());
  response_.emplace(std::move(res));
  serializer_.emplace(*response_);
  write_some();
}

void Session::write_some() {
  set_deadline(impl_.opt.idle_timeout);
  http::async_write_some(socket_, *serializer_,
                         [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                           self->written_ += n;
                           if (!ec && !self->closed() && !self->serializer_->is_done()) {
                             return self->write_some();
                           }
                           self->on_write(ec);
                         });
}

void Session::on_write(beast::error_code ec) {
  clear_deadline();
  serializer_.reset();
  response_.reset();
  lease_.release();
  if (trace_) [[unlikely]] {
    trace_->record_now("HTTP_SEND_END");
    trace_.reset();  // written now, if the engine is done with it too
  }
  if (request_kind_ != RequestKind::other && !ec) {
    impl_.metrics.observe_infer_us(
        std::chrono::duration<double, std::micro>(Clock::now() - request_read_at_).count());
  }
  if (closed()) return;
  if (ec || client_gone()) return close();
  if (!keep_alive_) return linger();
  wait_request();
}

// ---- timers and closing ----------------------------------------------------------------------

// One timer per session, and a deadline that moves: setting a later deadline (the common
// case: header, then write, then idle) does not touch the timer; when it fires early it waits
// again until the current deadline. So a request costs no timer cancellations.

void Session::set_deadline(std::chrono::milliseconds after) {
  if (close_reason_ == CloseReason::timed_out)
    kCloseReasonMoves.move(close_reason_, CloseReason::none);
  deadline_ = Clock::now() + after;
  if (timer_waiting_ && timer_at_ <= deadline_) return;  // it fires first, then waits again
  start_timer(deadline_);
}

void Session::start_timer(Clock::time_point at) {
  timer_at_ = at;
  timer_waiting_ = true;
  timer_.expires_at(at);  // a wait still pending ends with operation_aborted
  timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->on_timer(ec); });
}

void Session::on_timer(beast::error_code ec) {
  if (ec == net::error::operation_aborted) return;  // a newer wait replaced this one
  timer_waiting_ = false;
  if (closed() || deadline_ == Clock::time_point::max()) return;
  if (Clock::now() < deadline_) return start_timer(deadline_);
  if (phase_ == Phase::idle || phase_ == Phase::writing || phase_ == Phase::lingering) {
    // A response may sit in the kernel's send queue (megabytes on loopback) while the client
    // reads it; a write waits for room meanwhile. As long as the client takes bytes of it between
    // two timeouts it is reading, not idle. (The queue's length alone is no measure: a
    // generate_stream's writes grow it while the client reads nothing.)
    const std::size_t unsent = unsent_bytes();
    const std::uint64_t taken = taken_bytes();
    if (unsent > 0 && taken != taken_at_last_timeout_) {
      taken_at_last_timeout_ = taken;
      return set_deadline(phase_ == Phase::lingering ? kLinger : impl_.opt.idle_timeout);
    }
    if (phase_ == Phase::writing && events_ && unsent == 0) {
      // generate_stream, the client has taken everything: waiting for the model (whose own
      // deadline applies), or a write about to complete.
      if (sse_writing_) return set_deadline(impl_.opt.idle_timeout);
      return clear_deadline();
    }
  }
  close_for(CloseReason::timed_out);
  if (phase_ == Phase::idle) {
    // Idle after a response: the client may still be reading its tail from the kernel's
    // buffers, which an abrupt close can discard (a reset); end it the graceful way.
    linger();
  } else if (phase_ == Phase::writing || phase_ == Phase::lingering) {
    // A generate_stream whose client reads nothing: closing it cancels its request (close()),
    // so that a decoupled model waiting for room frees its worker.
    if (phase_ == Phase::writing && events_) impl_.metrics.stream_stalled();
    close();
  } else {
    beast::error_code ignored;
    socket_.cancel(ignored);  // the pending read's handler answers 408
  }
}

std::uint64_t Session::taken_bytes() {
  const std::uint64_t unsent = unsent_bytes();
  return written_ > unsent ? written_ - unsent : 0;
}

void Session::arm_stream_check() {
  if (deadline_ == Clock::time_point::max()) set_deadline(impl_.opt.idle_timeout);
}

std::size_t Session::unsent_bytes() {
  int n = 0;
  if (::ioctl(socket_.native_handle(), TIOCOUTQ, &n) != 0 || n < 0) return 0;
  return static_cast<std::size_t>(n);
}

void Session::linger() {
  set_phase(Phase::lingering);
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return close();
  set_deadline(kLinger);
  discard();
}

void Session::discard() {
  if (closed()) return;
  if (reading_) return;  // a read is pending; its end closes or re-enters here
  reading_ = true;
  buffer_.clear();
  socket_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code ec, std::size_t) {
                            self->reading_ = false;
                            if (ec || self->closed()) return self->close();
                            self->discard();
                          });
}

void Session::close() {
  if (closed()) return;
  set_phase(Phase::closed);
  lease_.release();
  if (events_) events_->close();  // a model waiting to send a generate_stream event stops
  if (inflight_.valid()) inflight_.cancel();
  beast::error_code ec;
  clear_deadline();
  timer_.cancel();  // the pending wait holds this session
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

}  // namespace asyncinfer::server
