// GrpcAcceptor (grpc_acceptor.hpp): the gRPC port's own accept loop, its admission of
// connections, the duplicates that see them end, and the reset limit.
#include "grpc_acceptor.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "asyncinfer/detail/transitions.hpp"

namespace asyncinfer::server {
namespace {

using Clock = std::chrono::steady_clock;

/// epoll user data of the listening socket and of the eventfd; connections have ids above.
constexpr std::uint64_t kListenId = 0;
constexpr std::uint64_t kWakeId = 1;
/// Descriptors one connection holds: gRPC's and our duplicate.
constexpr std::size_t kFdsPerConnection = 2;

std::string errno_text(int e) { return std::strerror(e); }

/// The accept loop's life cycle (GrpcAcceptor::Impl::life, under its mu):
///
///   accepting --stop_accepting--> closing --the loop closed the socket--> closed
///   accepting | closing | closed --stop--> stopped (the loop ends)
enum class AcceptorLife : std::uint8_t { accepting, closing, closed, stopped };

inline constexpr detail::Transitions<AcceptorLife, 4> kAcceptorLifeMoves{
    "gRPC acceptor",
    {"accepting", "closing", "closed", "stopped"},
    {
        {AcceptorLife::accepting, AcceptorLife::closing},
        {AcceptorLife::closing, AcceptorLife::closed},
        {AcceptorLife::accepting, AcceptorLife::stopped},
        {AcceptorLife::closing, AcceptorLife::stopped},
        {AcceptorLife::closed, AcceptorLife::stopped},
    }};

}  // namespace

struct GrpcAcceptor::Impl {
  Impl(InferenceServer& c, ProtocolMetrics& m, GrpcAcceptorOptions o)
      : core(c), metrics(m), opt(o) {}

  /// One connection handed to gRPC.
  struct Connection {
    int fd = -1;              ///< the descriptor gRPC has; its number names the connection ("fd:N")
    int dup = -1;             ///< ours, on the epoll set
    std::size_t calls = 0;    ///< started, not ended (OnDone)
    std::size_t running = 0;  ///< started, not finished (Finish)
    std::size_t resets = 0;
    Clock::time_point window_start;
    bool closing = false;
  };

  enum class Refusing : std::uint8_t { none, full, accept_failed };

  InferenceServer& core;
  ProtocolMetrics& metrics;
  const GrpcAcceptorOptions opt;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int port = 0;
  grpc::Server* server = nullptr;
  std::thread thread;
  SpareDescriptor spare;

  // Under mu: the connections (the reactors' threads count their calls), the requests to the
  // loop, and the loop's acknowledgement of a closed listener.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<std::uint64_t, Connection> connections;
  std::unordered_map<std::string, std::uint64_t> by_peer;
  std::uint64_t next_id = 2;
  AcceptorLife life = AcceptorLife::accepting;  // kAcceptorLifeMoves

  // The loop's own.
  Refusing refusing = Refusing::none;
  bool paused = false;  ///< the listening socket is off the epoll set until a descriptor frees
  std::size_t subscription = 0;  ///< to the ConnectionBudget: wakes the loop
  bool subscribed = false;

  // ---- the loop ---------------------------------------------------------------------------------

  void run() {
    epoll_event events[64];
    for (;;) {
      // Paused for want of any descriptor, it also tries again every 250 ms: descriptors may come
      // back from outside the server (a raised limit), which nothing announces.
      const int n = epoll_wait(epoll_fd, events, 64, paused ? 250 : -1);
      if (n == 0 && paused) {
        resume();
        continue;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "asyncinfer serve: grpc: epoll_wait failed: %s\n",
                     errno_text(errno).c_str());
        return;
      }
      for (int i = 0; i < n; ++i) {
        const std::uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          accept_all();
        } else if (id == kWakeId) {
          std::uint64_t count = 0;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &count, sizeof count);
          if (!on_wake()) return;
        } else if (events[i].events & (EPOLLHUP | EPOLLERR)) {
          end(id);
        } else {
          client_closed(id);
        }
      }
    }
  }

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_fd, &one, sizeof one);
  }

  /// False when the loop is to end.
  bool on_wake() {
    bool close_listener = false;
    {
      std::lock_guard lock(mu);
      if (life == AcceptorLife::stopped) return false;
      close_listener = life == AcceptorLife::closing;
    }
    if (close_listener) {
      close_listening_socket();
      return true;
    }
    if (paused) resume();  // a descriptor came back: accept again
    if (refusing == Refusing::full) recheck();
    return true;
  }

  void close_listening_socket() {
    if (listen_fd >= 0) {
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
      ::close(listen_fd);
      listen_fd = -1;
    }
    {
      std::lock_guard lock(mu);
      // Unless stop() came meanwhile: the loop ends at its next wake.
      if (life == AcceptorLife::closing) kAcceptorLifeMoves.move(life, AcceptorLife::closed);
    }
    cv.notify_all();
  }

  void accept_all() {
    while (listen_fd >= 0) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(fd);
        continue;
      }
      const int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK) return;
      if (!accept_out_of_resources(e)) continue;  // the client went away first, and the like
      refuse(Refusing::accept_failed, "accept() failed: " + errno_text(e));
      // Drain the pending connection with the spare descriptor, so the socket does not stay
      // readable; when none was waiting (Linux fails accept() with EMFILE before it looks), the
      // socket's next readiness brings the next; without the spare, wait for descriptors.
      switch (spare.shed_one(listen_fd)) {
        case SpareDescriptor::Shed::shed:
          continue;
        case SpareDescriptor::Shed::none_waiting:
          return;
        case SpareDescriptor::Shed::no_spare:
          pause();
          return;
      }
    }
  }

  void resume() {
    paused = false;
    if (listen_fd < 0) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, listen_fd, &ev);
    accept_all();
  }

  void pause() {
    paused = true;
    epoll_event ev{};
    ev.events = 0;
    ev.data.u64 = kListenId;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, listen_fd, &ev);
    wait_for_release();
  }

  void admit(int fd) {
    const std::string peer = "fd:" + std::to_string(fd);
    std::size_t open = 0;
    {
      std::lock_guard lock(mu);
      // The number is free again, so gRPC has closed the connection that had it, whose
      // duplicate's hang-up this loop has not seen yet.
      if (auto it = by_peer.find(peer); it != by_peer.end()) end_locked(it->second);
      open = connections.size();
    }
    std::string refused;
    if (open >= opt.max_connections) {
      refused = "at its connection limit of " + std::to_string(opt.max_connections) +
                " (--grpc-max-connections)";
    } else if (!core.connection_budget().try_acquire(kFdsPerConnection)) {
      refused = core.connection_budget().exhausted_message();
    }
    if (!refused.empty()) {
      ::close(fd);
      metrics.connection_rejected();
      return refuse(Refusing::full, std::move(refused));
    }
    const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) {
      const int e = errno;
      ::close(fd);
      core.connection_budget().release(kFdsPerConnection);
      return refuse(Refusing::accept_failed, "cannot duplicate a connection: " + errno_text(e));
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::uint64_t id = 0;
    {
      std::lock_guard lock(mu);
      id = next_id++;
      Connection& c = connections[id];
      c.fd = fd;
      c.dup = dup;
      c.window_start = Clock::now();
      by_peer[peer] = id;
    }
    // EPOLLHUP and EPOLLERR (always reported) are the ends; EPOLLRDHUP is the client's FIN, which
    // no HTTP/2 client sends while it still wants answers: the connection is shut down at once
    // rather than left for gRPC to notice (connect/close churn filled the slots otherwise).
    epoll_event ev{};
    ev.events = EPOLLRDHUP;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, dup, &ev);
    if (refusing == Refusing::full ||
        (refusing == Refusing::accept_failed && descriptors_recovered())) {
      accepting_again();
    }
    metrics.connection_opened();
    grpc::AddInsecureChannelFromFd(server, fd);
  }

  /// The client closed its side: shut the connection down (its hang-up follows).
  void client_closed(std::uint64_t id) {
    std::lock_guard lock(mu);
    auto it = connections.find(id);
    if (it == connections.end() || it->second.closing) return;
    it->second.closing = true;
    ::shutdown(it->second.dup, SHUT_RDWR);
  }

  /// The connection `id` ended (its duplicate hung up): its descriptors come back.
  void end(std::uint64_t id) {
    {
      std::lock_guard lock(mu);
      if (!end_locked(id)) return;
    }
    if (refusing == Refusing::full) recheck();
  }

  bool end_locked(std::uint64_t id) {
    auto it = connections.find(id);
    if (it == connections.end()) return false;
    // Off the epoll set first: the registration belongs to the socket, which gRPC's descriptor
    // keeps open until gRPC has released every call of the connection (epoll(7), "Will closing a
    // file descriptor cause it to be removed from all epoll interest lists?"). Closing the
    // duplicate alone left its EPOLLHUP, level-triggered, waking this loop without pause until
    // then: a third of the server's CPU under a rapid-reset attack (docs/performance.md).
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, it->second.dup, nullptr);
    ::close(it->second.dup);
    by_peer.erase("fd:" + std::to_string(it->second.fd));
    connections.erase(it);
    core.connection_budget().release(kFdsPerConnection);
    metrics.connection_closed();
    return true;
  }

  /// The port cannot take connections: not ready, logged once. Readiness changes before the
  /// line is written, so that whoever acts on the line finds the server not ready.
  void refuse(Refusing why, std::string reason) {
    const bool first = refusing == Refusing::none;
    refusing = why;
    if (why == Refusing::full) wait_for_release();
    core.listeners().set_failing("grpc", reason, why == Refusing::accept_failed);
    if (first) {
      std::fprintf(stderr,
                   "asyncinfer serve: grpc: refusing connections: %s; not ready until it "
                   "accepts again\n",
                   reason.c_str());
    }
  }

  /// Wakes the loop when a descriptor comes back.
  void wait_for_release() { core.connection_budget().arm(subscription); }

  void accepting_again() {
    refusing = Refusing::none;
    core.listeners().set_accepting("grpc");
    std::fprintf(stderr, "asyncinfer serve: grpc: accepting connections again\n");
  }

  /// Room again for one more connection?
  void recheck() {
    std::size_t open = 0;
    {
      std::lock_guard lock(mu);
      open = connections.size();
    }
    const ConnectionBudget& b = core.connection_budget();
    const bool room = b.capacity() == 0 || b.used() + kFdsPerConnection <= b.capacity();
    if (room && open < opt.max_connections) {
      accepting_again();
    } else if (!room) {
      wait_for_release();
    }
  }

  // ---- the reactors' reports --------------------------------------------------------------------

  Connection* find_locked(std::string_view peer) {
    auto it = by_peer.find(std::string(peer));
    if (it == by_peer.end()) return nullptr;
    auto c = connections.find(it->second);
    return c == connections.end() ? nullptr : &c->second;
  }

  /// Shuts the connection down: gRPC sees its socket end and closes it; the loop then sees the
  /// duplicate hang up.
  void close_locked(Connection& c, std::string_view why) {
    if (c.closing) return;
    c.closing = true;
    std::fprintf(stderr, "asyncinfer serve: grpc: closing connection %d: %.*s\n", c.fd,
                 static_cast<int>(why.size()), why.data());
    ::shutdown(c.dup, SHUT_RDWR);
  }
};

GrpcAcceptor::GrpcAcceptor(InferenceServer& core, ProtocolMetrics& metrics,
                           GrpcAcceptorOptions options)
    : impl_(std::make_unique<Impl>(core, metrics, options)) {}

GrpcAcceptor::~GrpcAcceptor() {
  stop();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

Status GrpcAcceptor::listen(const std::string& host, int port) {
  Impl& im = *impl_;
  sockaddr_storage addr{};
  socklen_t len = 0;
  const bool v6 = host.find(':') != std::string::npos;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) != 1) {
      return invalid_argument_error("--host '" + host + "' is not an IPv6 address");
    }
    len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1) {
      return invalid_argument_error("--host '" + host + "' is not an IPv4 address");
    }
    len = sizeof(sockaddr_in);
  }
  const std::string where = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  auto fail = [&](const char* what) {
    const int e = errno;
    if (im.listen_fd >= 0) ::close(im.listen_fd);
    im.listen_fd = -1;
    return unavailable_error("cannot listen on " + where + " for gRPC: " + what + ": " +
                             errno_text(e) +
                             " (choose another with --grpc-port; 0 = a free port, "
                             "-1 = no gRPC)");
  };
  im.listen_fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (im.listen_fd < 0) return fail("socket");
  const int one = 1;
  ::setsockopt(im.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(im.listen_fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) return fail("bind");
  if (::listen(im.listen_fd, SOMAXCONN) != 0) return fail("listen");
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  ::getsockname(im.listen_fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  im.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  im.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  im.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (im.epoll_fd < 0 || im.wake_fd < 0) return fail("epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(im.epoll_fd, EPOLL_CTL_ADD, im.listen_fd, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(im.epoll_fd, EPOLL_CTL_ADD, im.wake_fd, &ev);
  return Status();
}

int GrpcAcceptor::port() const noexcept { return impl_->port; }

void GrpcAcceptor::start(grpc::Server* server) {
  impl_->server = server;
  impl_->subscription =
      impl_->core.connection_budget().subscribe([im = impl_.get()] { im->wake(); });
  impl_->subscribed = true;
  impl_->thread = std::thread([this] {
    // Named, so that its CPU time can be told apart (/proc/PID/task/*/comm; server.hostile).
    pthread_setname_np(pthread_self(), "ai-grpc-accept");
    impl_->run();
  });
}

void GrpcAcceptor::stop_accepting() {
  Impl& im = *impl_;
  if (!im.thread.joinable()) return;
  std::unique_lock lock(im.mu);
  if (im.life == AcceptorLife::accepting) kAcceptorLifeMoves.move(im.life, AcceptorLife::closing);
  im.wake();
  im.cv.wait_for(lock, std::chrono::seconds(1), [&] {
    return im.life == AcceptorLife::closed || im.life == AcceptorLife::stopped;
  });
}

void GrpcAcceptor::stop() {
  Impl& im = *impl_;
  if (im.subscribed) {
    im.core.connection_budget().unsubscribe(im.subscription);
    im.subscribed = false;
  }
  if (im.thread.joinable()) {
    {
      std::lock_guard lock(im.mu);
      if (im.life != AcceptorLife::stopped) kAcceptorLifeMoves.move(im.life, AcceptorLife::stopped);
    }
    im.wake();
    im.thread.join();
  }
  std::lock_guard lock(im.mu);
  for (auto& [id, c] : im.connections) {
    ::shutdown(c.dup, SHUT_RDWR);
    ::close(c.dup);
    im.core.connection_budget().release(kFdsPerConnection);
    im.metrics.connection_closed();
  }
  im.connections.clear();
  im.by_peer.clear();
}

std::size_t GrpcAcceptor::connections() const {
  std::lock_guard lock(impl_->mu);
  return impl_->connections.size();
}

void GrpcAcceptor::call_started(std::string_view peer) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  Impl::Connection* c = im.find_locked(peer);
  if (c == nullptr) return;
  ++c->calls;
  // More calls running than the streams HTTP/2 lets a client open: streams were reset while
  // their calls still run, faster than they end.
  if (++c->running > 2 * im.opt.max_concurrent_streams) {
    im.close_locked(*c,
                    "calls in progress passed twice its stream limit while still running (HTTP/2 "
                    "rapid reset)");
  } else if (c->calls > 2 * im.opt.max_concurrent_streams + kEndLag) {
    im.close_locked(*c, "calls in progress passed twice its stream limit plus " +
                            std::to_string(kEndLag) +
                            " with their answers not delivered (streams opened past the limit, "
                            "answers not read)");
  }
}

void GrpcAcceptor::call_finished(std::string_view peer) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  Impl::Connection* c = im.find_locked(peer);
  if (c != nullptr && c->running > 0) --c->running;
}

void GrpcAcceptor::call_ended(std::string_view peer, bool reset) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  Impl::Connection* c = im.find_locked(peer);
  if (c == nullptr) return;
  if (c->calls > 0) --c->calls;
  if (!reset) return;
  const auto now = Clock::now();
  if (now - c->window_start > im.opt.reset_window) {
    c->window_start = now;
    c->resets = 0;
  }
  if (++c->resets > im.opt.max_resets) {
    im.close_locked(*c,
                    "the client cancelled more calls than --grpc-max-resets allows within "
                    "its window (HTTP/2 rapid reset)");
  }
}

}  // namespace asyncinfer::server
