// GrpcServer (grpc_server.hpp): start (the address, the port, the builder's options), drain and
// stop, and GrpcServer::Impl's shutdown thread. The services and the reactors are in their own
// files (grpc_server_impl.hpp lists them).
#include <absl/synchronization/mutex.h>
#include <grpc/grpc.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include "grpc_server_impl.hpp"

namespace asyncinfer::server {
namespace {

/// What a stopping server gives its calls to end by themselves before it cancels them.
constexpr auto kStopGrace = std::chrono::milliseconds(100);

/// The request counter's label: grpc::StatusCode names, indexed by code.
const ProtocolMetrics::Labels& code_labels() {
  static const ProtocolMetrics::Labels labels{
      "grpc_code",
      {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
       "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
       "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
       "UNAUTHENTICATED"}};
  return labels;
}

}  // namespace

// ---- CountedUnary ------------------------------------------------------------------------------

CountedUnary::CountedUnary(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx)
    : account_(*impl.acceptor, ctx) {}

void CountedUnary::answer(grpc::Status s) {
  account_.finished();
  Finish(std::move(s));
}

void CountedUnary::OnCancel() { account_.cancelled(); }

void CountedUnary::OnDone() {
  account_.ended();
  delete this;
}

void GrpcServer::Impl::forward_headers(const grpc::CallbackServerContext* ctx,
                                       Parameters& parameters) const {
  if (!opt.header_forward) return;
  for (const auto& [key, value] : ctx->client_metadata()) {
    opt.header_forward->forward(std::string_view(key.data(), key.size()),
                                std::string_view(value.data(), value.size()), parameters);
  }
}

grpc::Status GrpcServer::Impl::restricted(const grpc::CallbackServerContext* ctx,
                                          ApiCategory category) const {
  const ApiRestriction* r = opt.restricted.find(category);
  if (r == nullptr) return grpc::Status::OK;
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(r->key);
  const std::string_view got = it == metadata.end()
                                   ? std::string_view()
                                   : std::string_view(it->second.data(), it->second.size());
  if (restriction_met(*r, it == metadata.end() ? nullptr : &got)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "This protocol is restricted, expecting header '" + r->key + "'");
}

GrpcServer::Impl::Impl(InferenceServer& s, GrpcOptions o)
    : core(s), opt(std::move(o)), metrics(s.protocol_metrics("grpc", code_labels())) {}

void GrpcServer::Impl::start_shutdown() {
  std::lock_guard lock(mu);
  if (shutdown_thread.joinable() || !server) return;
  shutdown_thread = std::thread([this] {
    server->Shutdown();
    {
      std::lock_guard done(mu);
      set_life_locked(life.load(std::memory_order_relaxed) == ServerLife::stopping
                          ? ServerLife::stopped
                          : ServerLife::drained);
    }
    shutdown_cv.notify_all();
  });
}

bool GrpcServer::Impl::wait_shutdown(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu);
  return shutdown_cv.wait_for(lock, timeout, [this] {
    const ServerLife at = life.load(std::memory_order_relaxed);
    return at == ServerLife::drained || at == ServerLife::stopped;
  });
}

// ---- GrpcServer -------------------------------------------------------------------------------

GrpcServer::GrpcServer(InferenceServer& server, GrpcOptions options)
    : impl_(std::make_unique<Impl>(server, std::move(options))) {
  impl_->on_closed = [this] { closed(); };
}

GrpcServer::~GrpcServer() { stop(); }

Status GrpcServer::start() {
  Impl& im = *impl_;
  if (im.opt.port < 0 || im.opt.port > 65535) {
    return invalid_argument_error("--grpc-port " + std::to_string(im.opt.port) +
                                  " is not a port (0 = any free port)");
  }
  if (im.opt.max_message_bytes == 0 ||
      im.opt.max_message_bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    return invalid_argument_error("--grpc-max-message-bytes " +
                                  std::to_string(im.opt.max_message_bytes) +
                                  " is out of range (1 .. 2147483647)");
  }
  std::string host = im.opt.host == "localhost" ? "127.0.0.1" : im.opt.host;
  // An IP literal only, as the HTTP frontend: gRPC would resolve names itself.
  const bool v6 = host.find(':') != std::string::npos;
  const bool v4 = !v6 && !host.empty() &&
                  host.find_first_not_of("0123456789.") == std::string::npos &&
                  std::count(host.begin(), host.end(), '.') == 3;
  if (!v4 && !v6) {
    return invalid_argument_error("--host '" + im.opt.host +
                                  "' is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)");
  }
  if (im.opt.max_concurrent_streams == 0 ||
      im.opt.max_concurrent_streams > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    return invalid_argument_error("--grpc-max-concurrent-streams " +
                                  std::to_string(im.opt.max_concurrent_streams) +
                                  " is out of range (1 .. 2147483647)");
  }

  GrpcAcceptorOptions ao;
  ao.max_connections = im.opt.max_connections;
  ao.max_concurrent_streams = im.opt.max_concurrent_streams;
  ao.max_resets = im.opt.max_resets;
  ao.reset_window = im.opt.reset_window;
  im.acceptor = std::make_unique<GrpcAcceptor>(im.core, im.metrics, ao);
  ASYNCINFER_RETURN_IF_ERROR(im.acceptor->listen(host, im.opt.port));
  im.port = im.acceptor->port();

  im.service = make_inference_service(im);
  im.health_service = make_health_service(im);
  // Debian builds Abseil without NDEBUG, so every absl::Mutex that gRPC locks also updates a
  // process-wide lock-order graph (absl's deadlock detector, meant for debug builds): ~1 % of
  // the server's CPU under load in `perf`. Off, as in Abseil's release builds.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ServerBuilder builder;
  // No listening port of gRPC's own: the acceptor hands each connection over.
  builder.RegisterService(im.service.get());
  builder.RegisterService(im.health_service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(im.opt.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(im.opt.max_message_bytes));
  // gRPC shares a port between processes (SO_REUSEPORT) by default: a second server on the same
  // port would silently take half of the connections. Refuse instead, as the HTTP port does.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // channelz (gRPC's introspection service) is not served; its per-call counters cost for nothing.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // Streams per connection: without it a client may open any number (gRPC's default has none).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(im.opt.max_concurrent_streams));
  if (im.opt.memory_bytes > 0 || im.opt.max_threads > 0) {
    grpc::ResourceQuota quota("asyncinfer-grpc");
    if (im.opt.memory_bytes > 0) quota.Resize(im.opt.memory_bytes);
    if (im.opt.max_threads > 0) quota.SetMaxThreads(im.opt.max_threads);
    builder.SetResourceQuota(quota);
  }
  if (im.opt.max_connection_idle.count() > 0) {
    // A connection with no call in progress for this long gets GOAWAY and is closed: one that
    // never sends anything (not even the HTTP/2 preface) holds no slot for ever.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(im.opt.max_connection_idle.count()));
  }
  if (im.opt.max_connection_age.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(im.opt.max_connection_age.count()));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(im.opt.max_connection_age_grace.count()));
  }
  im.server = builder.BuildAndStart();
  if (!im.server) {
    im.acceptor.reset();
    return unavailable_error("cannot start the gRPC server (see gRPC's log above)");
  }
  im.acceptor->start(im.server.get());
  // A listener that cannot accept, a model loaded or unloaded, an engine whose workers are lost
  // or recover, a drain: each turns the health status at once (pushed, never polled).
  im.health_observer = im.core.listeners().on_change([&im] { im.refresh_health(); });
  im.readiness_observer = im.core.on_readiness_change([&im] { im.refresh_health(); });
  im.refresh_health();
  return Status();
}

int GrpcServer::grpc_port() const noexcept { return impl_->port; }

void GrpcServer::stop_accepting() {
  Impl& im = *impl_;
  if (!im.server) return;
  {
    std::lock_guard lock(im.mu);
    if (im.life.load(std::memory_order_relaxed) == ServerLife::serving) {
      im.set_life_locked(ServerLife::draining);
    }
  }
  im.refresh_health();  // NOT_SERVING to every watch
  im.acceptor->stop_accepting();
  im.start_shutdown();
  for (Call* c : im.snapshot()) {
    c->on_drain();
    c->release();
  }
}

std::size_t GrpcServer::open_connections() const {
  std::lock_guard lock(impl_->mu);
  return impl_->calls.size();
}

void GrpcServer::stop() {
  Impl& im = *impl_;
  if (!im.server) return;
  {
    std::lock_guard lock(im.mu);
    const ServerLife at = im.life.load(std::memory_order_relaxed);
    if (at == ServerLife::stopping || at == ServerLife::stopped) return;
    // Drained: Shutdown has returned already, so nothing is left to wait for.
    im.set_life_locked(at == ServerLife::drained ? ServerLife::stopped : ServerLife::stopping);
  }
  im.core.listeners().remove_observer(im.health_observer);
  im.core.remove_readiness_observer(im.readiness_observer);
  im.refresh_health();
  im.start_shutdown();
  for (Call* c : im.snapshot()) {
    c->on_stop();
    c->release();
  }
  for (Call* w : im.snapshot(im.watches)) {
    w->on_stop();
    w->release();
  }
  // Shutdown returns once every call has ended and every connection has closed: a client that
  // keeps a Watch or an idle channel open would hold it (for ever, or until the client lets go).
  // After a short grace for the calls just ended to send their status, cancel what is left and
  // close the connections (what Shutdown(deadline) does at its deadline; the deadline is the
  // caller's, who calls stop() at the end of the drain).
  if (!im.wait_shutdown(kStopGrace)) {
    // Shutting the connections down from our side ends those a client holds without reading
    // (a zero flow-control window: gRPC's own cancel would wait for its writes).
    im.acceptor->stop();
    do {
      grpc_server_cancel_all_calls(im.server->c_server());
    } while (!im.wait_shutdown(kStopGrace));
  }
  im.shutdown_thread.join();
  im.acceptor->stop();
  im.server.reset();
}

}  // namespace asyncinfer::server
