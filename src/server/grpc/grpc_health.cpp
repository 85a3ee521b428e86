// grpc.health.v1.Health (health.proto) of the gRPC frontend: Check, Watch (HealthWatch, one
// ServerWriteReactor per watch) and refresh_health, which the server's readiness changes are
// pushed to (grpc_server.hpp, "Health") and which tells the watches of each change.
#include <mutex>
#include <optional>
#include <string>

#include "grpc_server_impl.hpp"
#include "grpc_stream_state.hpp"

namespace asyncinfer::server {
namespace {

using HealthStatus = hpb::HealthCheckResponse::ServingStatus;

constexpr const char* kServiceName = "inference.GRPCInferenceService";

}  // namespace

int GrpcServer::Impl::serving_status() const {
  // Unannounced: it runs under health_mu, and the observers it would tell include this one.
  return !draining() && core.ready_unannounced() ? hpb::HealthCheckResponse::SERVING
                                                 : hpb::HealthCheckResponse::NOT_SERVING;
}

void GrpcServer::Impl::publish_locked(int status) {
  if (status == health) return;
  health = status;
  for (Call* w : snapshot(watches)) {
    w->on_health(status);
    w->release();
  }
}

int GrpcServer::Impl::refresh_health() {
  std::lock_guard lock(health_mu);
  const int status = serving_status();
  publish_locked(status);
  return status;
}

void GrpcServer::Impl::add_watch(Call* w) {
  std::lock_guard lock(health_mu);
  publish_locked(serving_status());
  add(w, watches);
  w->on_health(health);
}

namespace {

/// grpc.health.v1.Health/Watch: sends the status now, then each change, one write at a time (a
/// change during a write is sent after it, only the latest). An unknown service gets
/// SERVICE_UNKNOWN and the call stays open, as gRPC's health-checking protocol says. The server's
/// stop ends it with UNAVAILABLE after its last status.
class HealthWatch final : public grpc::ServerWriteReactor<hpb::HealthCheckResponse>, public Call {
 public:
  HealthWatch(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx, bool known)
      : Call(1), impl_(impl), account_(*impl.acceptor, ctx), known_(known) {
    // Counted as every call is (AcceptorAccount): watches opened past the stream limit, or reset
    // as fast as they are opened, meet the acceptor's limits.
    if (known_) {
      impl_.add_watch(this);  // calls on_health
    } else {
      send(hpb::HealthCheckResponse::SERVICE_UNKNOWN);
      impl_.add(this, impl_.watches);  // for stop
    }
  }

  void on_health(int status) override {
    if (known_) send(status);
  }

  void on_stop() override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      end_locked(StreamEnd::draining);
      a = next_locked();
    }
    run(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (!ok) end_locked(StreamEnd::broken);
      a = next_locked();
    }
    run(a);
  }

  void OnCancel() override {
    account_.cancelled();
    Actions a;
    {
      std::lock_guard lock(mu_);
      end_locked(StreamEnd::cancelled);
      a = next_locked();
    }
    run(a);
  }

  void OnDone() override {
    { std::lock_guard lock(mu_); }  // orders the destructor after Finish for ThreadSanitizer
    account_.ended();
    impl_.remove(this, impl_.watches);
    release();
  }

 private:
  struct Actions {
    bool write = false;
    std::optional<grpc::Status> finish;
  };

  /// Sends `status` (the latest only, after the write in progress).
  void send(int status) {
    Actions a;
    {
      std::lock_guard lock(mu_);
      want_ = status;
      a = next_locked();
    }
    run(a);
  }

  /// Moves the watch towards its end, unless it is already past `to` (a stop after the client
  /// left, a cancel after Finish): the first reason to end is the one it ends with.
  void end_locked(StreamEnd to) {
    if (kStreamEndMoves.allows(end_, to)) kStreamEndMoves.move(end_, to);
  }

  Actions next_locked() {
    Actions a;
    if (end_ == StreamEnd::finished || writing_) return a;
    const bool gone = end_ == StreamEnd::broken || end_ == StreamEnd::cancelled;
    if (!gone && want_ != sent_) {
      writing_ = true;
      sent_ = want_;
      out_.set_status(static_cast<HealthStatus>(want_));
      a.write = true;
    } else if (end_ != StreamEnd::open) {
      kStreamEndMoves.move(end_, StreamEnd::finished);
      a.finish = gone ? grpc::Status(grpc::StatusCode::CANCELLED, "the watch was cancelled")
                      : grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
    }
    return a;
  }

  void run(Actions& a) {
    if (a.write) StartWrite(&out_);
    if (a.finish) {
      account_.finished();
      Finish(std::move(*a.finish));
    }
  }

  GrpcServer::Impl& impl_;
  AcceptorAccount account_;
  const bool known_;
  std::mutex mu_;
  hpb::HealthCheckResponse out_;  // being written while writing_
  int want_ = -1;
  int sent_ = -1;
  bool writing_ = false;             // a write is in progress (one at a time)
  StreamEnd end_ = StreamEnd::open;  // kStreamEndMoves: draining is the server's stop
};

bool health_service_known(const std::string& service) {
  return service.empty() || service == kServiceName;
}

/// grpc.health.v1.Health for the service "" (the server) and inference.GRPCInferenceService; both
/// follow serving_status(). Its calls are not counted in asyncinfer_grpc_requests_total (probes
/// would swamp it).
class HealthService final : public hpb::Health::CallbackService {
 public:
  explicit HealthService(GrpcServer::Impl& impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const hpb::HealthCheckRequest* in,
                                  hpb::HealthCheckResponse* out) override {
    auto* r = new CountedUnary(impl_, ctx);
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::health); !s.ok()) {
      r->answer(s);
      return r;
    }
    if (!health_service_known(in->service())) {
      r->answer(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + in->service() +
                                                              "' (this server reports \"\" and " +
                                                              kServiceName + ")"));
      return r;
    }
    out->set_status(static_cast<HealthStatus>(impl_.refresh_health()));
    r->answer(grpc::Status::OK);
    return r;
  }

  grpc::ServerWriteReactor<hpb::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx, const hpb::HealthCheckRequest* in) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::health); !s.ok()) {
      return new RefusedCall<grpc::ServerWriteReactor<hpb::HealthCheckResponse>>(s);
    }
    return new HealthWatch(impl_, ctx, health_service_known(in->service()));
  }

 private:
  GrpcServer::Impl& impl_;
};

}  // namespace

std::unique_ptr<grpc::Service> make_health_service(GrpcServer::Impl& impl) {
  return std::make_unique<HealthService>(impl);
}

}  // namespace asyncinfer::server
