#include "grpc_server.hpp"

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "grpc_service.grpc.pb.h"
#include "health.grpc.pb.h"
#include "oip_grpc.hpp"
#include "status_mapping.hpp"

namespace asyncinfer::server {
namespace {

namespace pb = inference;
namespace hpb = grpc::health::v1;
using Clock = std::chrono::steady_clock;
using HealthStatus = hpb::HealthCheckResponse::ServingStatus;

constexpr const char* kServiceName = "inference.GRPCInferenceService";
/// How often the health status is compared with the server's readiness for the Watch calls (a
/// Check always answers the readiness of the moment).
constexpr auto kHealthRefresh = std::chrono::milliseconds(100);
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

grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(grpc_code(s.code())), std::string(s.message()));
}

/// The call's deadline on the engine's clock; none when the client set none.
std::optional<Clock::time_point> call_deadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  const auto now = std::chrono::system_clock::now();
  if (d == std::chrono::system_clock::time_point::max() || d - now > std::chrono::hours(24 * 365)) {
    return std::nullopt;
  }
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d - now);
}

double micros_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

}  // namespace

// ---- the calls --------------------------------------------------------------------------------

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

struct GrpcServer::Impl {
  Impl(InferenceServer& s, GrpcOptions o)
      : core(s), opt(std::move(o)), metrics(s.protocol_metrics("grpc", code_labels(), false)) {}

  InferenceServer& core;
  GrpcOptions opt;
  ProtocolMetrics& metrics;

  class Service;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Service> health_service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  mutable std::mutex mu;
  std::unordered_set<Call*> calls;    // inference calls: open_connections, drain, stop
  std::unordered_set<Call*> watches;  // health Watch calls
  std::atomic<bool> draining{false};
  std::thread shutdown_thread;
  bool shutdown_started = false;
  bool stopped = false;
  std::mutex shutdown_mu;
  std::condition_variable shutdown_cv;
  bool shutdown_done = false;  // grpc::Server::Shutdown has returned

  // Health: the last status sent to the watches, under health_mu (which also orders the
  // updates, so a watch's last message is the latest status). The refresher compares it with
  // the readiness every kHealthRefresh until stop.
  std::mutex health_mu;
  int health = hpb::HealthCheckResponse::UNKNOWN;
  std::mutex refresh_mu;
  std::condition_variable refresh_cv;
  bool refresh_stop = false;
  std::thread refresher;

  void add(Call* c, std::unordered_set<Call*>& set) {
    std::lock_guard lock(mu);
    set.insert(c);
  }
  void add(Call* c) { add(c, calls); }
  void remove(Call* c, std::unordered_set<Call*>& set) {
    std::lock_guard lock(mu);
    set.erase(c);
  }
  void remove(Call* c) { remove(c, calls); }
  /// The calls of `set` now, each with a reference the caller releases.
  std::vector<Call*> snapshot(const std::unordered_set<Call*>& set) {
    std::lock_guard lock(mu);
    std::vector<Call*> out(set.begin(), set.end());
    for (Call* c : out) c->ref();
    return out;
  }
  std::vector<Call*> snapshot() { return snapshot(calls); }
  void count(int code) { metrics.count_request(static_cast<std::size_t>(code)); }

  /// SERVING while the server is ready (InferenceServer::ready: every model loaded and its
  /// device healthy) and not draining; NOT_SERVING otherwise.
  int serving_status() const {
    return !draining.load(std::memory_order_acquire) && core.ready()
               ? hpb::HealthCheckResponse::SERVING
               : hpb::HealthCheckResponse::NOT_SERVING;
  }
  void publish_locked(int status) {
    if (status == health) return;
    health = status;
    for (Call* w : snapshot(watches)) {
      w->on_health(status);
      w->release();
    }
  }
  /// The status now; watches are told when it changed. Never blocks on a client.
  int refresh_health() {
    std::lock_guard lock(health_mu);
    const int status = serving_status();
    publish_locked(status);
    return status;
  }
  /// Registers a Watch and sends it the status now.
  void add_watch(Call* w) {
    std::lock_guard lock(health_mu);
    publish_locked(serving_status());
    add(w, watches);
    w->on_health(health);
  }
  void start_refresher() {
    refresher = std::thread([this] {
      std::unique_lock lock(refresh_mu);
      while (!refresh_cv.wait_for(lock, kHealthRefresh, [this] { return refresh_stop; })) {
        lock.unlock();
        refresh_health();
        lock.lock();
      }
    });
  }
  void stop_refresher() {
    {
      std::lock_guard lock(refresh_mu);
      refresh_stop = true;
    }
    refresh_cv.notify_all();
    if (refresher.joinable()) refresher.join();
  }

  /// Starts grpc::Server::Shutdown on its own thread (once): the port closes, clients get
  /// GOAWAY, calls in progress go on; it returns once every call has ended and every connection
  /// has closed (stop() cancels what is left, so it does not wait on a client).
  void start_shutdown() {
    std::lock_guard lock(mu);
    if (shutdown_started || !server) return;
    shutdown_started = true;
    shutdown_thread = std::thread([this] {
      server->Shutdown();
      {
        std::lock_guard done(shutdown_mu);
        shutdown_done = true;
      }
      shutdown_cv.notify_all();
    });
  }
  /// Waits up to `timeout` for Shutdown to return.
  bool wait_shutdown(std::chrono::milliseconds timeout) {
    std::unique_lock lock(shutdown_mu);
    return shutdown_cv.wait_for(lock, timeout, [this] { return shutdown_done; });
  }
};

namespace {

/// resource_exhausted when an encoded response is over --grpc-max-message-bytes (gRPC would end
/// the call, or the whole stream, with RESOURCE_EXHAUSTED when writing it).
Status check_response_size(const grpc::ByteBuffer& response, std::size_t max_bytes) {
  if (response.Length() <= max_bytes) return Status();
  return resource_exhausted_error("the response is " + std::to_string(response.Length()) +
                                  " bytes, over the largest message this server sends (" +
                                  std::to_string(max_bytes) +
                                  " bytes, --grpc-max-message-bytes); ask for fewer or smaller "
                                  "outputs, or raise the limit");
}

/// ModelInfer: decode, submit; the engine's completion callback writes the response and finishes.
class InferCall final : public grpc::ServerUnaryReactor, public Call {
 public:
  InferCall(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response)
      : Call(2), impl_(impl), ctx_(ctx), response_(response), start_(Clock::now()) {
    impl_.add(this);
  }

  /// Runs in the method handler; drops the handler's reference at the end.
  void start(const grpc::ByteBuffer& request) {
    run(request);
    release();
  }

  void OnCancel() override {
    bool have = false;
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
      have = inflight_.valid();
    }
    // inflight_ is set once, before `have` can be true, and never changed after.
    if (have) inflight_.cancel();
  }

  void OnDone() override {
    int code = 0;
    double micros = 0;
    {
      // gRPC orders Finish before OnDone; the lock makes that visible to ThreadSanitizer too
      // (gRPC's own synchronization is not instrumented).
      std::lock_guard lock(mu_);
      code = code_;
      micros = micros_;
    }
    impl_.count(code);
    impl_.metrics.observe_infer_us(micros);
    impl_.remove(this);
    release();
  }

 private:
  void run(const grpc::ByteBuffer& request) {
    grpc::ByteBuffer buffer(request);  // shares the slices
    ParsedInfer parsed = parse_infer_request(buffer, impl_.core, "the request");
    if (!parsed.status.ok()) return finish(parsed.status);
    parsed.request.deadline = call_deadline(ctx_);
    auto accepted = impl_.core.submit(*parsed.model, std::move(parsed.request),
                                      [this](Result<InferResponse> r) { complete(std::move(r)); });
    if (!accepted.ok()) return finish(accepted.status());
    bool cancel_now = false;
    {
      std::lock_guard lock(mu_);
      inflight_ = std::move(*accepted);
      cancel_now = cancelled_;
    }
    if (cancel_now) inflight_.cancel();
  }

  /// On the engine's completion executor.
  void complete(Result<InferResponse> r) {
    if (!r.ok()) return finish(r.status());
    *response_ = encode_infer_response(*r, false);
    if (Status too_big = check_response_size(*response_, impl_.opt.max_message_bytes);
        !too_big.ok()) {
      response_->Clear();
      return finish(too_big);
    }
    finish(Status());
  }

  /// The last thing done with the call: OnDone may run (on another thread) as soon as it is in.
  void finish(const Status& s) {
    {
      std::lock_guard lock(mu_);
      code_ = grpc_code(s.code());
      micros_ = micros_since(start_);
    }
    Finish(to_grpc(s));
  }

  GrpcServer::Impl& impl_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* response_;
  Clock::time_point start_;
  std::mutex mu_;
  InflightRequest inflight_;
  bool cancelled_ = false;
  int code_ = 0;
  double micros_ = 0;
};

/// ModelStreamInfer: reads requests one after another while earlier ones run, writes each
/// response when its request completes (completion order), one write at a time.
///
/// All state is under mu_; library operations (StartRead, StartWrite, Finish) are started after
/// mu_ is released, in that order (a read is started before a write, and both before Finish, so
/// the call cannot end while one is being started), because a reaction may run inline in them.
class StreamCall final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                         public Call {
 public:
  StreamCall(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx)
      : Call(1), impl_(impl), ctx_(ctx), deadline_(call_deadline(ctx)) {
    impl_.add(this);
    Actions a;
    {
      std::lock_guard lock(mu_);
      draining_ = impl_.draining.load(std::memory_order_acquire);
      a = next_locked();
    }
    run(a);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed (or the call ended).
      Actions a;
      {
        std::lock_guard lock(mu_);
        reading_ = false;
        reads_done_ = true;
        a = next_locked();
      }
      return run(a);
    }
    {
      std::lock_guard lock(mu_);
      if (finished_) {  // ended (drained or cancelled) while this message arrived: dropped
        reading_ = false;
        return;
      }
    }
    const std::uint64_t index = received_++;
    ParsedInfer message =
        parse_infer_request(read_buf_, impl_.core, "stream message " + std::to_string(index + 1));
    if (!message.well_formed) {
      const Status& parsed = message.status;
      // Garbage: stop reading; answer what was accepted, then end the stream with the error.
      Actions a;
      {
        std::lock_guard lock(mu_);
        reading_ = false;
        stop_reading_ = true;
        if (end_status_.ok()) end_status_ = parsed;
        a = next_locked();
      }
      impl_.count(grpc_code(parsed.code()));
      return run(a);
    }
    handle(std::move(message));
    Actions a;
    {
      std::lock_guard lock(mu_);
      reading_ = false;
      a = next_locked();
    }
    run(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      queue_.pop_front();
      if (!ok) {
        // The client is gone: nothing more can be written.
        broken_ = true;
        drop_queued_locked();
      }
      a = next_locked();
    }
    if (!ok) cancel_inflight();
    run(a);
  }

  void OnCancel() override {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
      drop_queued_locked();
    }
    cancel_inflight();
    Actions a;
    {
      std::lock_guard lock(mu_);
      a = next_locked();
    }
    run(a);
  }

  void OnDone() override {
    {
      std::lock_guard lock(ctx_mu_);
      done_ = true;
    }
    {
      // Everything before Finish happened under mu_: taking it orders the destructor after it
      // for ThreadSanitizer as well (gRPC's own synchronization is not instrumented).
      std::lock_guard lock(mu_);
    }
    impl_.remove(this);
    release();
  }

  void on_drain() override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      draining_ = true;
      a = next_locked();
    }
    run(a);
  }

  void on_stop() override {
    // TryCancel may run OnCancel inline (which takes mu_, not ctx_mu_); OnDone runs on another
    // thread and waits here, so ctx_ is valid throughout.
    std::lock_guard lock(ctx_mu_);
    if (!done_) ctx_->TryCancel();
  }

 private:
  struct Actions {
    bool read = false;
    grpc::ByteBuffer* write = nullptr;
    std::optional<grpc::Status> finish;
  };

  void handle(ParsedInfer message) {
    const Clock::time_point start = Clock::now();
    auto fail = [&](const Status& s) {
      impl_.count(grpc_code(s.code()));
      enqueue(encode_stream_error(s, message.model_name, message.model_version, message.id));
    };
    if (!message.status.ok()) return fail(message.status);
    const ModelVersion& mv = *message.model;
    message.request.deadline = deadline_;
    std::uint64_t seq = 0;
    {
      // The gate: once the request is in inflight_ the stream cannot finish until it completes.
      std::lock_guard lock(mu_);
      if (finished_ || cancelled_ || broken_) return;
      seq = next_seq_++;
      inflight_.emplace(seq, InflightRequest());
    }
    const ModelVersion* mvp = &mv;
    auto accepted = impl_.core.submit(
        mv, std::move(message.request),
        [this, seq, start, mvp, id = message.id](Result<InferResponse> r) mutable {
          complete(seq, start, *mvp, id, std::move(r));
        });
    if (!accepted.ok()) {
      {
        std::lock_guard lock(mu_);
        inflight_.erase(seq);
      }
      return fail(accepted.status());
    }
    InflightRequest cancel_now;
    {
      std::lock_guard lock(mu_);
      auto it = inflight_.find(seq);
      if (it != inflight_.end()) {  // else it has completed already
        if (cancelled_ || broken_) {
          cancel_now = std::move(*accepted);
        } else {
          it->second = std::move(*accepted);
        }
      }
    }
    cancel_now.cancel();
  }

  /// On the engine's completion executor.
  void complete(std::uint64_t seq, Clock::time_point start, const ModelVersion& mv,
                const std::string& id, Result<InferResponse> r) {
    grpc::ByteBuffer out;
    Status status = r.ok() ? Status() : r.status();
    if (r.ok()) {
      out = encode_infer_response(*r, true);
      status = check_response_size(out, impl_.opt.max_message_bytes);
    }
    // A failed request is answered on the stream with error_message; the stream goes on.
    if (!status.ok()) {
      out = encode_stream_error(status, mv.model_name, mv.version_text, id);
      // An id too long to echo in the error (the rest of the request was large too) is left out
      // rather than end the stream.
      if (!check_response_size(out, impl_.opt.max_message_bytes).ok()) {
        out = encode_stream_error(status, mv.model_name, mv.version_text, "");
      }
    }
    impl_.count(grpc_code(status.code()));
    impl_.metrics.observe_infer_us(micros_since(start));
    Actions a;
    {
      std::lock_guard lock(mu_);
      inflight_.erase(seq);
      if (!cancelled_ && !broken_) queue_.push_back(std::move(out));
      a = next_locked();
    }
    run(a);
  }

  void enqueue(grpc::ByteBuffer out) {
    std::lock_guard lock(mu_);
    if (!cancelled_ && !broken_ && !finished_) queue_.push_back(std::move(out));
    // The caller (OnReadDone) computes the next actions.
  }

  /// Drops the responses not yet written; the one being written stays until OnWriteDone.
  void drop_queued_locked() {
    if (writing_) {
      queue_.erase(queue_.begin() + 1, queue_.end());
    } else {
      queue_.clear();
    }
  }

  void cancel_inflight() {
    std::vector<InflightRequest> cancel;
    {
      std::lock_guard lock(mu_);
      for (auto& [seq, f] : inflight_) {
        if (f.valid()) cancel.push_back(std::move(f));
      }
    }
    for (InflightRequest& f : cancel) f.cancel();
  }

  /// What to start next; marks it started.
  Actions next_locked() {
    Actions a;
    if (finished_) return a;
    const bool ending = cancelled_ || broken_ || draining_ || stop_reading_ || reads_done_;
    if (!reading_ && !ending && inflight_.size() + queue_.size() < impl_.opt.max_stream_inflight) {
      reading_ = true;
      a.read = true;
    }
    if (!writing_ && !queue_.empty() && !cancelled_ && !broken_) {
      writing_ = true;
      a.write = &queue_.front();
    }
    // End once nothing is running or waiting to be written; a read may still be pending when the
    // stream is cancelled or drained (it then completes with ok = false).
    if (ending && !a.read && !writing_ && queue_.empty() && inflight_.empty() &&
        (!reading_ || cancelled_ || broken_ || draining_)) {
      finished_ = true;
      if (cancelled_ || broken_) {
        a.finish = grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled");
      } else if (!end_status_.ok()) {
        a.finish = to_grpc(end_status_);
      } else if (draining_ && !reads_done_) {
        a.finish = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "server is shutting down; the requests of this stream that were "
                                "accepted have been answered, reopen the stream elsewhere");
      } else {
        a.finish = grpc::Status::OK;
      }
    }
    return a;
  }

  void run(Actions& a) {
    if (a.read) StartRead(&read_buf_);
    if (a.write != nullptr) StartWrite(a.write);
    if (a.finish) Finish(std::move(*a.finish));
  }

  GrpcServer::Impl& impl_;
  grpc::CallbackServerContext* ctx_;
  const std::optional<Clock::time_point> deadline_;
  grpc::ByteBuffer read_buf_;  // only the read path touches it
  std::uint64_t received_ = 0;

  std::mutex mu_;
  std::unordered_map<std::uint64_t, InflightRequest> inflight_;
  std::deque<grpc::ByteBuffer> queue_;  // front() is being written while writing_
  std::uint64_t next_seq_ = 0;
  Status end_status_;
  bool reading_ = false;
  bool writing_ = false;
  bool reads_done_ = false;
  bool stop_reading_ = false;
  bool draining_ = false;
  bool cancelled_ = false;
  bool broken_ = false;
  bool finished_ = false;

  std::mutex ctx_mu_;
  bool done_ = false;
};

/// grpc.health.v1.Health/Watch: sends the status now, then each change, one write at a time (a
/// change during a write is sent after it, only the latest). An unknown service gets
/// SERVICE_UNKNOWN and the call stays open, as gRPC's health-checking protocol says. The server's
/// stop ends it with UNAVAILABLE after its last status.
class HealthWatch final : public grpc::ServerWriteReactor<hpb::HealthCheckResponse>, public Call {
 public:
  HealthWatch(GrpcServer::Impl& impl, bool known) : Call(1), impl_(impl), known_(known) {
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
      stopping_ = true;
      a = next_locked();
    }
    run(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (!ok) broken_ = true;
      a = next_locked();
    }
    run(a);
  }

  void OnCancel() override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      broken_ = true;
      a = next_locked();
    }
    run(a);
  }

  void OnDone() override {
    {
      std::lock_guard lock(mu_);  // orders the destructor after Finish for ThreadSanitizer
    }
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

  Actions next_locked() {
    Actions a;
    if (finished_ || writing_) return a;
    if (!broken_ && want_ != sent_) {
      writing_ = true;
      sent_ = want_;
      out_.set_status(static_cast<HealthStatus>(want_));
      a.write = true;
    } else if (broken_ || stopping_) {
      finished_ = true;
      a.finish = broken_ ? grpc::Status(grpc::StatusCode::CANCELLED, "the watch was cancelled")
                         : grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
    }
    return a;
  }

  void run(Actions& a) {
    if (a.write) StartWrite(&out_);
    if (a.finish) Finish(std::move(*a.finish));
  }

  GrpcServer::Impl& impl_;
  const bool known_;
  std::mutex mu_;
  hpb::HealthCheckResponse out_;  // being written while writing_
  int want_ = -1;
  int sent_ = -1;
  bool writing_ = false;
  bool stopping_ = false;
  bool broken_ = false;
  bool finished_ = false;
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
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    if (!health_service_known(in->service())) {
      r->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + in->service() +
                                                              "' (this server reports \"\" and " +
                                                              kServiceName + ")"));
      return r;
    }
    out->set_status(static_cast<HealthStatus>(impl_.refresh_health()));
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerWriteReactor<hpb::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext*, const hpb::HealthCheckRequest* in) override {
    return new HealthWatch(impl_, health_service_known(in->service()));
  }

 private:
  GrpcServer::Impl& impl_;
};

}  // namespace

// ---- the service ------------------------------------------------------------------------------

using ServiceBase = pb::GRPCInferenceService::WithCallbackMethod_ServerLive<
    pb::GRPCInferenceService::WithCallbackMethod_ServerReady<
        pb::GRPCInferenceService::WithCallbackMethod_ModelReady<
            pb::GRPCInferenceService::WithCallbackMethod_ServerMetadata<
                pb::GRPCInferenceService::WithCallbackMethod_ModelMetadata<
                    pb::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
                        pb::GRPCInferenceService::WithRawCallbackMethod_ModelStreamInfer<
                            pb::GRPCInferenceService::WithCallbackMethod_RepositoryIndex<
                                pb::GRPCInferenceService::Service>>>>>>>>;

class GrpcServer::Impl::Service final : public ServiceBase {
 public:
  explicit Service(Impl& impl) : impl_(impl) {}

  using ServiceBase::ModelInfer;
  using ServiceBase::ModelMetadata;
  using ServiceBase::ModelReady;
  using ServiceBase::ModelStreamInfer;
  using ServiceBase::RepositoryIndex;
  using ServiceBase::ServerLive;
  using ServiceBase::ServerMetadata;
  using ServiceBase::ServerReady;

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* out) override {
    out->set_live(impl_.core.live());
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* out) override {
    out->set_ready(impl_.core.ready());
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const pb::ModelReadyRequest* in,
                                       pb::ModelReadyResponse* out) override {
    auto mv = impl_.core.find(in->name(), in->version());
    // A known model (version) that is not ready answers ready = false; an unknown one is
    // NOT_FOUND and a malformed version INVALID_ARGUMENT, as over HTTP.
    if (!mv.ok() && mv.status().code() != StatusCode::unavailable) return done(ctx, mv.status());
    out->set_ready(mv.ok());
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* out) override {
    server_metadata(impl_.core, out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const pb::ModelMetadataRequest* in,
                                          pb::ModelMetadataResponse* out) override {
    auto mv = impl_.core.find(in->name(), in->version());
    if (!mv.ok()) return done(ctx, mv.status());
    const ServedModel* sm = impl_.core.repository().find(in->name());
    model_metadata(*sm, **mv, in->version().empty() ? nullptr : *mv, out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const pb::RepositoryIndexRequest* in,
                                            pb::RepositoryIndexResponse* out) override {
    if (!in->repository_name().empty()) {
      return done(ctx, not_found_error("unknown repository '" + in->repository_name() +
                                       "' (asyncinfer serves one; leave repository_name empty)"));
    }
    repository_index(impl_.core.repository(), in->ready(), out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    auto* call = new InferCall(impl_, ctx, response);
    call->start(*request);
    return call;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* ctx) override {
    return new StreamCall(impl_, ctx);
  }

 private:
  grpc::ServerUnaryReactor* done(grpc::CallbackServerContext* ctx, const Status& s) {
    impl_.count(grpc_code(s.code()));
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(to_grpc(s));
    return r;
  }

  Impl& impl_;
};

// ---- GrpcServer -------------------------------------------------------------------------------

GrpcServer::GrpcServer(InferenceServer& server, GrpcOptions options)
    : impl_(std::make_unique<Impl>(server, std::move(options))) {}

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
  const std::string address = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(im.opt.port);

  im.service = std::make_unique<Impl::Service>(im);
  im.health_service = std::make_unique<HealthService>(im);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &im.port);
  builder.RegisterService(im.service.get());
  builder.RegisterService(im.health_service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(im.opt.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(im.opt.max_message_bytes));
  // gRPC shares a port between processes (SO_REUSEPORT) by default: a second server on the same
  // port would silently take half of the connections. Refuse instead, as the HTTP port does.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // channelz (gRPC's introspection service) is not served; its per-call counters cost for nothing.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  if (im.opt.max_connection_age.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(im.opt.max_connection_age.count()));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(im.opt.max_connection_age_grace.count()));
  }
  im.server = builder.BuildAndStart();
  if (!im.server || im.port == 0) {
    im.server.reset();
    return unavailable_error("cannot listen on " + address +
                             " for gRPC (the port is in use, or the address is not local)");
  }
  im.refresh_health();
  im.start_refresher();
  return Status();
}

int GrpcServer::grpc_port() const noexcept { return impl_->port; }

void GrpcServer::stop_accepting() {
  Impl& im = *impl_;
  if (!im.server) return;
  im.draining.store(true, std::memory_order_release);
  im.refresh_health();  // NOT_SERVING to every watch
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
  if (im.stopped || !im.server) return;
  im.stopped = true;
  // Engine callbacks finish our reactors: every engine ends (and answers) before the server.
  if (im.core.live()) im.core.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
  im.draining.store(true, std::memory_order_release);
  im.stop_refresher();
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
    do {
      grpc_server_cancel_all_calls(im.server->c_server());
    } while (!im.wait_shutdown(kStopGrace));
  }
  im.shutdown_thread.join();
  im.server.reset();
}

}  // namespace asyncinfer::server
