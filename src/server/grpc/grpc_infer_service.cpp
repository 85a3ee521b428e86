// inference.GRPCInferenceService (grpc_service.proto) of the gRPC frontend: the unary RPCs
// (liveness, readiness, metadata, RepositoryIndex) answered at once, ModelInfer's reactor
// (InferCall: decode, submit, and the engine's completion callback answers), and the hand-off of
// ModelStreamInfer to its reactor (grpc_stream_call.cpp).
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "grpc_server_impl.hpp"
#include "oip_grpc.hpp"
#include "server_log.hpp"
#include "trace.hpp"

namespace asyncinfer::server {
namespace {

/// ModelInfer: decode, submit; the engine's completion callback writes the response and finishes.
class InferCall final : public grpc::ServerUnaryReactor, public Call {
 public:
  InferCall(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response)
      : Call(2),
        impl_(impl),
        ctx_(ctx),
        response_(response),
        start_(Clock::now()),
        account_(*impl.acceptor, ctx),
        lease_(impl.core.memory().lease()) {
    impl_.add(this);
  }

  /// Runs in the method handler; drops the handler's reference at the end.
  void start(const grpc::ByteBuffer& request) {
    run(request);
    release();
  }

  void OnCancel() override {
    bool have = false;
    account_.cancelled();
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
      have = inflight_.valid();
    }
    // inflight_ is set once, before `have` can be true, and never changed after.
    if (have) inflight_.cancel();
  }

  /// OnDone and OnCancel run on the gRPC thread that sees the call end (a completion-queue
  /// thread), not after a hand-off to gRPC's default executor: that hand-off cost a futex wake
  /// and a context switch a call, 3-4 µs of server CPU (docs/performance.md, "gRPC: no
  /// executor hop at the end of a call"). Both reactions are short and never block: OnDone
  /// counts and frees; OnCancel marks the call and cancels the engine request, whose completion
  /// runs on the engine's completion executor. gRPC 1.51's header calls this hook internal, not
  /// API: a gRPC without it fails to compile here (`override`), it cannot change meaning
  /// silently.
  bool InternalInlineable() override { return true; }

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
    account_.ended();
    if (trace_) [[unlikely]] {
      trace_->record_now("GRPC_SEND_END");
      trace_.reset();
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
    if (parsed.model->signature.decoupled) {  // Triton: UNIMPLEMENTED, use ModelStreamInfer
      return finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 decoupled_message(parsed.model->model_name)));
    }
    // The request's tensors count against the server's memory budget until the call ends.
    const std::size_t bytes = input_bytes(parsed.request);
    if (!lease_.reserve(bytes)) {
      return finish(resource_exhausted_error(impl_.core.memory().exhausted_message(bytes)));
    }
    parsed.request.deadline = call_deadline(ctx_);
    impl_.forward_headers(ctx_, parsed.request.parameters);
    if (impl_.core.tracer().active()) [[unlikely]] {  // Triton's trace extension (trace.hpp)
      std::optional<TraceParent> parent;
      const auto& md = ctx_->client_metadata();
      if (auto it = md.find("traceparent"); it != md.end()) {
        parent = parse_traceparent(std::string_view(it->second.data(), it->second.size()));
      }
      trace_ = impl_.core.tracer().sample(parsed.model->model_name, parent);
      if (trace_) {
        trace_->record("GRPC_WAITREAD_START", trace_ns(start_));
        trace_->record_now("GRPC_WAITREAD_END");
        parsed.request.trace = trace_;
      }
    }
    // complete() runs on the thread that ends the request (the model's worker), not after a
    // hand-off to the engine's completion executor: its work (encoding the response, handing it
    // to gRPC, which writes it on its own threads) costs less than the wake-up it saves.
    parsed.request.completion_hands_off = true;
    auto accepted = impl_.core.submit(parsed.model, std::move(parsed.request),
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

  /// On the thread that ended the request (completion_hands_off), or the engine's completion
  /// executor where the server copies outputs (shared memory, the response cache).
  void complete(Result<InferResponse> r) {
    if (!r.ok()) return finish(r.status());
    if (trace_) [[unlikely]]
      trace_->record_now("GRPC_SEND_START");
    *response_ = encode_infer_response(*r, false);
    lease_.hold(response_->Length());
    if (Status too_big = check_response_size(*response_, impl_.opt.max_message_bytes);
        !too_big.ok()) {
      response_->Clear();
      return finish(too_big);
    }
    finish(Status());
  }

  /// The last thing done with the call: OnDone may run (on another thread) as soon as it is in.
  void finish(const Status& s) { finish(to_grpc(s)); }
  void finish(grpc::Status s) {
    {
      std::lock_guard lock(mu_);
      code_ = static_cast<int>(s.error_code());
      micros_ = micros_since(start_);
    }
    account_.finished();
    Finish(std::move(s));
  }

  GrpcServer::Impl& impl_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* response_;
  Clock::time_point start_;
  /// A sampled call's trace (trace.hpp): set in run() before submit, ended in OnDone.
  std::shared_ptr<Trace> trace_;
  AcceptorAccount account_;
  /// Its share of the server's memory budget (the request's tensors, then the response); set
  /// before the request is submitted and after it completes, never both at once.
  MemoryBudget::Lease lease_;
  std::mutex mu_;
  InflightRequest inflight_;
  bool cancelled_ = false;
  int code_ = 0;
  double micros_ = 0;
};

}  // namespace

// ---- the service ------------------------------------------------------------------------------

using CudaSharedMemoryBase = pb::GRPCInferenceService::WithCallbackMethod_CudaSharedMemoryStatus<
    pb::GRPCInferenceService::WithCallbackMethod_CudaSharedMemoryRegister<
        pb::GRPCInferenceService::WithCallbackMethod_CudaSharedMemoryUnregister<
            pb::GRPCInferenceService::WithCallbackMethod_LogSettings<
                pb::GRPCInferenceService::WithCallbackMethod_TraceSetting<
                    pb::GRPCInferenceService::Service>>>>>;
using SharedMemoryBase = pb::GRPCInferenceService::WithCallbackMethod_SystemSharedMemoryStatus<
    pb::GRPCInferenceService::WithCallbackMethod_SystemSharedMemoryRegister<
        pb::GRPCInferenceService::WithCallbackMethod_SystemSharedMemoryUnregister<
            CudaSharedMemoryBase>>>;
using ServiceBase = pb::GRPCInferenceService::WithCallbackMethod_ServerLive<
    pb::GRPCInferenceService::WithCallbackMethod_ServerReady<
        pb::GRPCInferenceService::WithCallbackMethod_ModelReady<
            pb::GRPCInferenceService::WithCallbackMethod_ServerMetadata<
                pb::GRPCInferenceService::WithCallbackMethod_ModelMetadata<
                    pb::GRPCInferenceService::WithCallbackMethod_ModelConfig<
                        pb::GRPCInferenceService::WithCallbackMethod_ModelStatistics<
                            pb::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
                                pb::GRPCInferenceService::WithRawCallbackMethod_ModelStreamInfer<
                                    pb::GRPCInferenceService::WithCallbackMethod_RepositoryIndex<
                                        pb::GRPCInferenceService::
                                            WithCallbackMethod_RepositoryModelLoad<
                                                pb::GRPCInferenceService::
                                                    WithCallbackMethod_RepositoryModelUnload<
                                                        SharedMemoryBase>>>>>>>>>>>>;

class GrpcServer::Impl::Service final : public ServiceBase {
 public:
  explicit Service(Impl& impl) : impl_(impl) {}

  using ServiceBase::CudaSharedMemoryRegister;
  using ServiceBase::CudaSharedMemoryStatus;
  using ServiceBase::CudaSharedMemoryUnregister;
  using ServiceBase::LogSettings;
  using ServiceBase::ModelConfig;
  using ServiceBase::ModelInfer;
  using ServiceBase::ModelMetadata;
  using ServiceBase::ModelReady;
  using ServiceBase::ModelStatistics;
  using ServiceBase::ModelStreamInfer;
  using ServiceBase::RepositoryIndex;
  using ServiceBase::RepositoryModelLoad;
  using ServiceBase::RepositoryModelUnload;
  using ServiceBase::ServerLive;
  using ServiceBase::ServerMetadata;
  using ServiceBase::ServerReady;
  using ServiceBase::SystemSharedMemoryRegister;
  using ServiceBase::SystemSharedMemoryStatus;
  using ServiceBase::SystemSharedMemoryUnregister;
  using ServiceBase::TraceSetting;

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::health); !s.ok()) return done(ctx, s);
    out->set_live(impl_.core.live());
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::health); !s.ok()) return done(ctx, s);
    out->set_ready(impl_.core.ready());
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const pb::ModelReadyRequest* in,
                                       pb::ModelReadyResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::health); !s.ok()) return done(ctx, s);
    auto mv = impl_.core.find(in->name(), in->version());
    // A known model (version) that is not ready answers ready = false; an unknown one is
    // NOT_FOUND and a malformed version INVALID_ARGUMENT, as over HTTP.
    // A model of the repository that is not loaded (explicit mode, unloaded) is not ready.
    const bool known =
        mv.ok() || mv.status().code() == StatusCode::unavailable ||
        (mv.status().code() == StatusCode::not_found &&
         impl_.core.repository().snapshot()->find(in->name()) != nullptr && in->version().empty());
    if (!known) return done(ctx, mv.status());
    out->set_ready(mv.ok());
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::metadata); !s.ok()) return done(ctx, s);
    server_metadata(impl_.core, out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const pb::ModelMetadataRequest* in,
                                          pb::ModelMetadataResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::metadata); !s.ok()) return done(ctx, s);
    auto mv = impl_.core.find(in->name(), in->version());
    if (!mv.ok()) return done(ctx, mv.status());
    // The model of the version found (its namespace's), not the name looked up again.
    auto sm = impl_.core.model_of(**mv);
    if (sm == nullptr) return done(ctx, not_found_error("unknown model '" + in->name() + "'"));
    model_metadata(*sm, **mv, in->version().empty() ? nullptr : mv->get(), out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const pb::ModelConfigRequest* in,
                                        pb::ModelConfigResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::model_config); !s.ok())
      return done(ctx, s);
    auto mv = impl_.core.find(in->name(), in->version());
    if (!mv.ok()) return done(ctx, mv.status());
    return done(ctx, model_config(**mv, out));
  }

  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const pb::ModelStatisticsRequest* in,
                                            pb::ModelStatisticsResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::statistics); !s.ok())
      return done(ctx, s);
    auto versions = impl_.core.stats_versions(in->name(), in->version());
    if (!versions.ok()) return done(ctx, versions.status());
    model_statistics(*versions, out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const pb::RepositoryIndexRequest* in,
                                            pb::RepositoryIndexResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::model_repository); !s.ok())
      return done(ctx, s);
    if (!in->repository_name().empty()) {
      return done(ctx, not_found_error("unknown repository '" + in->repository_name() +
                                       "' (asyncinfer serves one; leave repository_name empty)"));
    }
    repository_index(impl_.core.repository(), in->ready(), out);
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const pb::RepositoryModelLoadRequest* in,
                                                pb::RepositoryModelLoadResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::model_repository); !s.ok())
      return done(ctx, s);
    LoadParameters params;
    if (grpc::Status s = load_request_parameters(*in, &params); !s.ok()) return done(ctx, s);
    // Answered from the repository's control thread once the model serves (or failed).
    auto* r = new CountedUnary(impl_, ctx);
    impl_.core.repository().load_model(model_name_of(*in), std::move(params),
                                       [this, r](const Status& s) { finish(r, s); });
    return r;
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const pb::RepositoryModelUnloadRequest* in,
                                                  pb::RepositoryModelUnloadResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::model_repository); !s.ok())
      return done(ctx, s);
    if (grpc::Status s = check_unload_request(*in); !s.ok()) return done(ctx, s);
    auto* r = new CountedUnary(impl_, ctx);
    impl_.core.repository().unload_model(model_name_of(*in),
                                         [this, r](const Status& s) { finish(r, s); });
    return r;
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryStatusRequest* in,
      pb::SystemSharedMemoryStatusResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::shared_memory); !s.ok())
      return done(ctx, s);
    auto regions = impl_.core.shared_memory().status(in->name());
    if (!regions.ok()) return done(ctx, regions.status());
    for (const SharedMemoryRef& r : *regions) {
      auto& entry = (*out->mutable_regions())[r->name()];
      entry.set_name(r->name());
      entry.set_key(r->key());
      entry.set_offset(r->offset());
      entry.set_byte_size(r->byte_size());
    }
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryRegisterRequest* in,
      pb::SystemSharedMemoryRegisterResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::shared_memory); !s.ok())
      return done(ctx, s);
    return done(ctx, impl_.core.shared_memory().register_region(
                         in->name(), in->key(), static_cast<std::size_t>(in->offset()),
                         static_cast<std::size_t>(in->byte_size())));
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryUnregisterRequest* in,
      pb::SystemSharedMemoryUnregisterResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::shared_memory); !s.ok())
      return done(ctx, s);
    impl_.core.shared_memory().unregister(in->name());
    return done(ctx, Status());
  }

  // No CUDA regions here (the extension is not listed), as HTTP's /v2/cudasharedmemory: the
  // status is empty, unregistering succeeds (there is nothing to unregister: Triton's clients
  // and perf_analyzer unregister everything first), registering is UNIMPLEMENTED.
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                   const pb::CudaSharedMemoryStatusRequest* in,
                                                   pb::CudaSharedMemoryStatusResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::shared_memory); !s.ok())
      return done(ctx, s);
    if (!in->name().empty()) {
      return done(ctx, invalid_argument_error("no CUDA shared memory region '" + in->name() +
                                              "' is registered"));
    }
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryRegisterRequest*,
      pb::CudaSharedMemoryRegisterResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::shared_memory); !s.ok())
      return done(ctx, s);
    return done(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                  "CUDA shared memory is not supported by this server; use "
                                  "system shared memory (SystemSharedMemoryRegister)"));
  }

  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryUnregisterRequest*,
      pb::CudaSharedMemoryUnregisterResponse*) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::shared_memory); !s.ok())
      return done(ctx, s);
    return done(ctx, Status());
  }

  // Triton's logging extension: the settings given change (all or none), and the answer has
  // every setting.
  grpc::ServerUnaryReactor* LogSettings(grpc::CallbackServerContext* ctx,
                                        const pb::LogSettingsRequest* in,
                                        pb::LogSettingsResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::logging); !s.ok()) return done(ctx, s);
    Parameters changes;
    for (const auto& [name, value] : in->settings()) {
      switch (value.parameter_choice_case()) {
        case pb::LogSettingsRequest::SettingValue::kBoolParam:
          changes[name] = value.bool_param();
          break;
        case pb::LogSettingsRequest::SettingValue::kUint32Param:
          changes[name] = static_cast<std::int64_t>(value.uint32_param());
          break;
        case pb::LogSettingsRequest::SettingValue::kStringParam:
          changes[name] = value.string_param();
          break;
        default:
          return done(ctx, invalid_argument_error("log setting '" + name + "' has no value"));
      }
    }
    auto settings = impl_.core.log().update(changes);
    if (!settings.ok()) return done(ctx, settings.status());
    auto& m = *out->mutable_settings();
    m["log_file"].set_string_param(settings->log_file);
    m["log_info"].set_bool_param(settings->log_info);
    m["log_warning"].set_bool_param(settings->log_warning);
    m["log_error"].set_bool_param(settings->log_error);
    m["log_verbose_level"].set_uint32_param(settings->log_verbose_level);
    m["log_format"].set_string_param(std::string(to_string(settings->log_format)));
    return done(ctx, Status());
  }

  // Triton's trace extension (trace.hpp): a model's settings need the model to be ready; an
  // empty value clears a setting.
  grpc::ServerUnaryReactor* TraceSetting(grpc::CallbackServerContext* ctx,
                                         const pb::TraceSettingRequest* in,
                                         pb::TraceSettingResponse* out) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::trace); !s.ok()) return done(ctx, s);
    const std::string& model = in->model_name();
    if (!model.empty()) {
      if (Status s = impl_.core.check_trace_model(model); !s.ok()) return done(ctx, s);
    }
    TraceManager& tracer = impl_.core.tracer();
    TraceSettings settings;
    if (in->settings().empty()) {
      settings = tracer.settings(model);
    } else {
      std::map<std::string, std::optional<std::vector<std::string>>, std::less<>> given;
      for (const auto& [name, value] : in->settings()) {
        given[name] = std::vector<std::string>(value.value().begin(), value.value().end());
      }
      auto update = parse_trace_setting_update(given);
      if (!update.ok()) return done(ctx, update.status());
      auto updated = tracer.update(model, *update);
      if (!updated.ok()) return done(ctx, updated.status());
      settings = std::move(*updated);
    }
    auto& m = *out->mutable_settings();
    for (auto& [name, values] : trace_settings_values(settings)) {
      for (std::string& v : values) m[name].add_value(std::move(v));
    }
    return done(ctx, Status());
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::inference); !s.ok())
      return done(ctx, s);
    auto* call = new InferCall(impl_, ctx, response);
    call->start(*request);
    return call;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* ctx) override {
    if (grpc::Status s = impl_.restricted(ctx, ApiCategory::inference); !s.ok()) {
      impl_.count(s.error_code());
      return new RefusedCall<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(s);
    }
    return new_stream_call(impl_, ctx);
  }

 private:
  grpc::ServerUnaryReactor* done(grpc::CallbackServerContext* ctx, const Status& s) {
    auto* r = new CountedUnary(impl_, ctx);
    finish(r, s);
    return r;
  }

  grpc::ServerUnaryReactor* done(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
    impl_.count(s.error_code());
    auto* r = new CountedUnary(impl_, ctx);
    r->answer(s);
    return r;
  }

  void finish(CountedUnary* r, const Status& s) {
    impl_.count(grpc_code(s.code()));
    r->answer(to_grpc(s));
  }

  Impl& impl_;
};

std::unique_ptr<grpc::Service> make_inference_service(GrpcServer::Impl& impl) {
  return std::make_unique<GrpcServer::Impl::Service>(impl);
}

}  // namespace asyncinfer::server
