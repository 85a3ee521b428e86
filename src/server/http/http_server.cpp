// HttpServer (http_server.hpp): start (the address, the ports, the I/O threads), the listeners
// (one acceptor each, on the first I/O thread; the connection limit), the set of open sessions,
// drain and stop. A connection's life is in http_session.cpp, the routing in http_routes.cpp.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <string>
#include <thread>

#include "asyncinfer/executor.hpp"
#include "core/spin_wait.hpp"
#include "http_server_impl.hpp"

namespace asyncinfer::server {
namespace {

const ProtocolMetrics::Labels& status_class_labels() {
  static const ProtocolMetrics::Labels labels{"status_class", {"1xx", "2xx", "3xx", "4xx", "5xx"}};
  return labels;
}

}  // namespace

/// An I/O thread's loop: io_context::run, except that while `policy` says so (exactly one
/// inference request of its sessions is in an engine: SpinPolicy::worth_polling), the thread
/// busy-polls the context (poll_one: posted handlers, then the reactor without blocking) for up
/// to HttpOptions::spin_wait before it sleeps in epoll_wait. An answer posted while the thread is
/// outside the context's scheduler costs the engine's thread no eventfd write and this thread no
/// wake-up (Asio's scheduler interrupts its reactor only while a thread waits in it); other
/// connections' bytes are read meanwhile. `spin` is this thread's own. Returns when the context
/// is stopped.
static void run_io_loop(HttpServer::Impl::IoLoop& loop, const detail::SpinPolicy& policy,
                        detail::SpinWait& spin) {
  for (;;) {
    // One awaited (SpinPolicy::worth_polling): poll the context (posted handlers, then the
    // reactor without blocking) until something runs, the answer or another connection's bytes,
    // for up to the budget.
    if (policy.worth_polling(loop.submitted - loop.received) &&
        spin.spin([&] { return loop.ioc.poll_one() > 0; })) {
      continue;
    }
    if (loop.ioc.run_one() == 0) return;  // stopped
  }
}

HttpServer::Impl::Impl(InferenceServer& s, HttpOptions o)
    : core(s),
      opt(std::move(o)),
      metrics(s.protocol_metrics("http", status_class_labels())),
      codec_pool(static_cast<std::size_t>(opt.threads > 0 ? opt.threads : 1)) {
  // Each context is run by one thread. The hint says so to Asio's scheduler, which then queues
  // work posted from that thread without its lock and never wakes another thread for it.
  for (int i = 0; i < (opt.threads > 0 ? opt.threads : 1); ++i) {
    loops.push_back(std::make_unique<IoLoop>());
    // Its reactor (an epoll descriptor, an eventfd and a timerfd) opens now, with the server,
    // not when the first connection is placed on it: that may be when descriptors run out, and
    // the failure would then escape the listener's accept handler and stop it accepting.
    tcp::socket open_reactor(loops.back()->ioc);
  }
}

// ---- listeners -------------------------------------------------------------------------------

class HttpServer::Impl::Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(Impl& impl, bool metrics)
      : impl_(impl),
        metrics_(metrics),
        acceptor_(impl.loops.front()->ioc.get_executor()),
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
  const char* name() const noexcept { return metrics_ ? "metrics" : "http"; }

  void accept() {
    Impl::IoLoop& loop = impl_.pick_loop();
    acceptor_.async_accept(loop.ioc.get_executor(),
                           [self = shared_from_this(), &loop](beast::error_code ec, Socket s) {
                             self->on_accept(ec, std::move(s), loop);
                           });
  }

  /// Closes the acceptor on its I/O thread; the future is ready once it is closed (or, should the
  /// io_context have stopped, at once: the promise is then broken).
  std::future<void> close() {
    // From now on nothing is posted to the acceptor from outside (the io_context may be going).
    if (open_.exchange(false)) impl_.core.connection_budget().unsubscribe(subscription_);
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

  /// A connection of this listener closed: if it was refusing connections for want of room, it
  /// checks (on its I/O thread) whether there is room again. Any thread.
  void connection_closed() {
    if (!full_.load(std::memory_order_acquire) || !open_.load(std::memory_order_acquire)) return;
    net::post(acceptor_.get_executor(), [self = shared_from_this()] { self->recheck(); });
  }

  /// Subscribes to the descriptor budget (once the listener is shared: after make_shared).
  void subscribe() {
    std::weak_ptr<Listener> weak = weak_from_this();
    subscription_ = impl_.core.connection_budget().subscribe([weak] {
      if (auto self = weak.lock()) {
        net::post(self->acceptor_.get_executor(), [self] { self->on_budget_release(); });
      }
    });
    open_.store(true, std::memory_order_release);
  }

 private:
  enum class Refusing : std::uint8_t { none, full, accept_failed };

  void on_accept(beast::error_code ec, Socket socket, Impl::IoLoop& loop) {
    if (closed_ || !acceptor_.is_open()) return;
    if (ec) return on_accept_error(ec);
    if (refusing_ == Refusing::accept_failed && descriptors_recovered()) accepting_again();
    Session::Kind kind = Session::Kind::api;
    std::string refused;
    if (metrics_) {
      kind = Session::Kind::metrics;
      if (!impl_.core.connection_budget().try_acquire(1)) refused = no_descriptors();
    } else if (impl_.connections.fetch_add(1, std::memory_order_relaxed) >=
               impl_.opt.max_connections) {
      impl_.connections.fetch_sub(1, std::memory_order_relaxed);
      refused = "at its connection limit of " + std::to_string(impl_.opt.max_connections) +
                " (--max-connections)";
    } else if (!impl_.core.connection_budget().try_acquire(1)) {
      impl_.connections.fetch_sub(1, std::memory_order_relaxed);
      refused = no_descriptors();
    }
    if (!refused.empty()) {
      refuse(Refusing::full, std::move(refused));
      // A few refused connections are told why (429) from the descriptors held in reserve;
      // past that they are closed at once, so refusing never uses up descriptors itself.
      if (metrics_ || impl_.rejecting.fetch_add(1, std::memory_order_relaxed) >= kMaxRejecting) {
        if (!metrics_) impl_.rejecting.fetch_sub(1, std::memory_order_relaxed);
        beast::error_code ignored;
        socket.close(ignored);
        return accept();
      }
      kind = Session::Kind::rejected;
    } else if (refusing_ == Refusing::full) {
      accepting_again();
    }
    auto session = std::make_shared<Session>(impl_, std::move(socket), kind, loop);
    impl_.add(session);
    net::post(session->executor(), [session] { session->start(); });
    accept();
  }

  void on_accept_error(beast::error_code ec) {
    if (!accept_out_of_resources(ec.value())) return accept();  // the client went away first
    refuse(Refusing::accept_failed, "accept() failed: " + ec.message());
    // Drain the connection waiting in the backlog with the spare descriptor, so the socket
    // does not stay readable (a spin); when none was waiting, wait until one is; without the
    // spare, wait for a descriptor to come back.
    switch (spare_.shed_one(acceptor_.native_handle())) {
      case SpareDescriptor::Shed::shed:
        return accept();
      case SpareDescriptor::Shed::none_waiting:
        acceptor_.async_wait(net::socket_base::wait_read,
                             [self = shared_from_this()](beast::error_code wec) {
                               if (!wec && !self->closed_) self->accept();
                             });
        return;
      case SpareDescriptor::Shed::no_spare:
        break;
    }
    paused_ = true;
    impl_.core.connection_budget().arm(subscription_);
    // Descriptors may also come back from outside the server (a raised limit, files closed
    // elsewhere), which nothing announces: while paused, the listener also tries again every
    // 250 ms (readiness queries recheck too, limits.hpp).
    retry_.expires_after(kPausedRetry);
    retry_.async_wait([self = shared_from_this()](beast::error_code wec) {
      if (!wec) self->on_budget_release();
    });
  }

  /// On the acceptor's thread: descriptors came back (a subscription armed by a pause or a
  /// refusal).
  void on_budget_release() {
    if (closed_) return;
    if (paused_) {
      paused_ = false;
      accept();
    }
    recheck();
  }

  std::string no_descriptors() const { return impl_.core.connection_budget().exhausted_message(); }

  /// The listener cannot take connections: not ready (ListenerHealth), logged once. Readiness
  /// changes before the line is written, so that whoever acts on the line finds it not ready.
  void refuse(Refusing why, std::string reason) {
    const bool first = refusing_ == Refusing::none;
    refusing_ = why;
    if (why == Refusing::full) {
      full_.store(true, std::memory_order_release);
      wait_for_release();
    }
    impl_.core.listeners().set_failing(name(), reason, why == Refusing::accept_failed);
    if (first) {
      std::fprintf(stderr,
                   "asyncinfer serve: %s: refusing connections: %s; not ready until it "
                   "accepts again\n",
                   name(), reason.c_str());
    }
  }

  /// Descriptors may come back from the other listeners' connections too: recheck then.
  void wait_for_release() { impl_.core.connection_budget().arm(subscription_); }

  void accepting_again() {
    refusing_ = Refusing::none;
    full_.store(false, std::memory_order_release);
    impl_.core.listeners().set_accepting(name());
    std::fprintf(stderr, "asyncinfer serve: %s: accepting connections again\n", name());
  }

  /// On the acceptor's thread: room again for one more connection?
  void recheck() {
    if (closed_ || refusing_ != Refusing::full) return;
    const ConnectionBudget& b = impl_.core.connection_budget();
    const bool room = b.capacity() == 0 || b.used() < b.capacity();
    const bool below_limit =
        metrics_ || impl_.connections.load(std::memory_order_relaxed) < impl_.opt.max_connections;
    if (room && below_limit) {
      accepting_again();
    } else if (!room) {
      wait_for_release();
    }
  }

  /// Refused connections answered 429 at once, at most (the rest are closed unanswered).
  static constexpr std::size_t kMaxRejecting = 16;

  /// How often a listener paused for want of any descriptor tries again.
  static constexpr std::chrono::milliseconds kPausedRetry{250};

  Impl& impl_;
  bool metrics_;
  Acceptor acceptor_;
  Timer retry_;  ///< while paused
  SpareDescriptor spare_;
  int port_ = 0;
  bool closed_ = false;
  Refusing refusing_ = Refusing::none;  // on the acceptor's thread
  bool paused_ = false;                 // on the acceptor's thread: accept() waits for a descriptor
  std::size_t subscription_ = 0;        // to the ConnectionBudget
  std::atomic<bool> open_{false};       // subscribed, not closed
  std::atomic<bool> full_{false};       // refusing_ == full, for connection_closed()
};

void HttpServer::Impl::connection_closed(SessionKind kind) {
  switch (kind) {
    case Session::Kind::api:
      connections.fetch_sub(1, std::memory_order_relaxed);
      core.connection_budget().release(1);
      if (http_listener) http_listener->connection_closed();
      break;
    case Session::Kind::metrics:
      core.connection_budget().release(1);
      break;
    case Session::Kind::rejected:
      rejecting.fetch_sub(1, std::memory_order_relaxed);
      break;
  }
}

void HttpServer::Impl::add(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(mu);
  sessions.emplace(s.get(), s);
}

void HttpServer::Impl::remove(Session* s) {
  {
    std::lock_guard lock(mu);
    sessions.erase(s);
    sessions_closed.notify_all();
  }
  if (on_closed) on_closed();
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
    // The cores this process may run on (taskset, cgroup cpusets), not the machine's.
    options.threads = detail::available_cores();
  }
  impl_ = std::make_unique<Impl>(server, std::move(options));
  impl_->on_closed = [this] { closed(); };
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
  auto check_us = [](std::chrono::microseconds us, const char* what) -> Status {
    if (us < std::chrono::microseconds(0) || us > std::chrono::microseconds(1000)) {
      return invalid_argument_error(std::string(what) + " " + std::to_string(us.count()) +
                                    " is out of range (0 .. 1000)");
    }
    return Status();
  };
  ASYNCINFER_RETURN_IF_ERROR(check_us(im.opt.spin_wait, "--http-spin-wait-us"));
  ASYNCINFER_RETURN_IF_ERROR(check_us(im.opt.caller_run, "--http-caller-run-us"));
  im.http_listener = std::make_shared<Impl::Listener>(im, false);
  ASYNCINFER_RETURN_IF_ERROR(
      im.http_listener->open({address, static_cast<unsigned short>(im.opt.http_port)}));
  if (im.opt.metrics_port >= 0) {
    im.metrics_listener = std::make_shared<Impl::Listener>(im, true);
    ASYNCINFER_RETURN_IF_ERROR(
        im.metrics_listener->open({address, static_cast<unsigned short>(im.opt.metrics_port)}));
  }
  im.http_listener->subscribe();
  im.http_listener->accept();
  if (im.metrics_listener) {
    im.metrics_listener->subscribe();
    im.metrics_listener->accept();
  }
  for (auto& loop : im.loops) im.work.push_back(net::make_work_guard(loop->ioc));
  const detail::SpinPolicy spin_policy = detail::SpinPolicy::from_option(im.opt.spin_wait);
  for (auto& loop : im.loops) {
    im.threads.emplace_back([loop = loop.get(), spin_policy] {
      detail::SpinWait spin = spin_policy.waiter();
      // A handler that throws (out of memory, say) loses its connection, not the server.
      for (;;) {
        try {
          run_io_loop(*loop, spin_policy, spin);
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "asyncinfer serve: http: a connection failed: %s\n", e.what());
        }
      }
    });
  }
  return Status();
}

int HttpServer::io_threads() const noexcept { return impl_->opt.threads; }

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
  im.draining.store(true, std::memory_order_release);
  if (im.http_listener) im.http_listener->close();
  if (im.metrics_listener) im.metrics_listener->close();
  for (auto& s : im.snapshot()) net::post(s->executor(), [s] { s->on_stop(); });
  im.work.clear();
  // Closing finishes every session's pending operations; give it a moment, then stop.
  {
    std::unique_lock lock(im.mu);
    im.sessions_closed.wait_for(lock, std::chrono::milliseconds(1000),
                                [&im] { return im.sessions.empty(); });
  }
  // Decodes and encodes still queued are dropped (their sessions are closed); one running ends.
  im.codec_pool.stop();
  im.codec_pool.join();
  for (auto& loop : im.loops) loop->ioc.stop();
  for (std::thread& t : im.threads) t.join();
  im.threads.clear();
}

}  // namespace asyncinfer::server
