// inference_server.hpp — the protocol-neutral core of `asyncinfer serve`: what the HTTP frontend
// (http_server.hpp) and a gRPC frontend share.
//
// It owns the model repository and answers, for any frontend:
//   - lookups: model and version (an empty version = the highest ready one), with the OIP's
//     not-found / not-ready errors;
//   - health: live (until stopped) and ready (not draining, and — with strict readiness, Triton's
//     default — every model version of the repository ready);
//   - the mapping of an inference request onto an engine request (one place, after Triton's
//     frontends): check_input() checks an input's name, datatype and shape against the model
//     before the frontend allocates or decodes anything; submit() checks the whole request
//     (missing / repeated / unknown inputs and outputs), turns the request parameters `timeout`
//     (µs) and `priority` into RequestOptions, submits, and hands back the selected outputs;
//   - the error mapping (status_mapping.hpp) and the Prometheus text of every engine, labelled
//     model and version, plus each frontend's ProtocolMetrics (server_metrics.hpp).
//
// Request flow: frontend decodes → check_input per input → submit → engine → Completion on the
// engine's completion executor (the frontend posts its response from there to its own I/O
// executor). A request refused by the engine at submit completes synchronously with the error
// (submit returns it; the callback is not called).
//
// Thread safety: every member may be called from any thread. The repository's served set may
// change (model control, model_repository.hpp): a request holds its version by ModelRef from
// find() to its response. One that reaches a version replaced meanwhile (retired) is sent to the
// version that replaced it, so that no request fails because of a reload.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/engine.hpp"
#include "limits.hpp"
#include "model_repository.hpp"
#include "observers.hpp"
#include "response_cache.hpp"
#include "server_metrics.hpp"
#include "shared_memory.hpp"

namespace asyncinfer::server {

/// An OIP parameter value (JSON: string, number or boolean; gRPC: InferParameter's oneof).
using ParameterValue = std::variant<bool, std::int64_t, std::uint64_t, double, std::string>;
using Parameters = std::map<std::string, ParameterValue, std::less<>>;

/// One input of a request: its name and a host tensor holding its dtype, shape and data (for an
/// input in shared memory, a view of the client's region).
struct InferInput {
  std::string name;
  Tensor tensor;
  /// Its bytes hold a lease of the server's MemoryBudget of their own, for as long as the tensor
  /// lives (an input copied out of shared memory: SharedMemoryManager::read_tensor), so
  /// input_bytes() leaves them out: a frontend must not count them twice.
  bool counted = false;
};

/// An output the client asked for (OIP "outputs"); frontends read their own parameters from it
/// (HTTP: binary_data).
struct RequestedOutput {
  std::string name;
  Parameters parameters;
  /// Where to write it (its shared_memory_* parameters), and the region, checked to exist when
  /// the request was decoded and held until the response is written.
  std::optional<SharedMemoryTensor> shared_memory;
  SharedMemoryRef region;
};

struct InferResponse;
class Trace;
class TraceManager;

struct InferRequest {
  std::string id;
  Parameters parameters;
  /// The transport's own deadline (gRPC's call deadline); the earlier of it and the parameter
  /// `timeout` applies. None for HTTP.
  std::optional<Clock::time_point> deadline;
  std::vector<InferInput> inputs;        ///< any order
  std::vector<RequestedOutput> outputs;  ///< empty = every output, in signature order
  /// The caller's `done` only hands the response over (a post to a connection's I/O thread): then,
  /// unless outputs go to shared memory or into the response cache (copies), `done` runs on the
  /// thread that ends the request instead of the engine's completion executor
  /// (RequestOptions::inline_callback), one thread hand-off fewer.
  bool completion_hands_off = false;
  /// With completion_hands_off: the submitting thread may run the request itself
  /// (RequestOptions::caller_run_max_compute), unless its outputs go to shared memory or into the
  /// response cache. 0 = never.
  std::chrono::microseconds caller_run_max_compute{0};
  /// Decoupled models (ModelSignature::decoupled), where it is required: each response before
  /// the final one (which the Completion carries, maybe with no outputs: the final flag alone,
  /// delivered after any on_response in progress has returned). Runs on the model's thread; may
  /// block for back-pressure, waiting on `stop` too (it fires when the request ends); a non-ok
  /// return says the client is gone (RequestOptions::on_response). Must not call into the server.
  std::function<Status(InferResponse, std::stop_token stop)> on_response;
  /// Handed to the model (RequestOptions::context). Null: submit() makes one for a python model
  /// from `id` and `parameters` (its InferenceRequest.request_id() and parameters()). A model's
  /// own request (business logic scripting, model_host.cpp) gives one with its callers.
  std::shared_ptr<const RequestContext> context;
  /// A sampled request's trace (trace.hpp): set by a frontend only when the server's
  /// TraceManager is active() and sampled it, after recording its own receive activities.
  /// submit() records REQUEST_START, has the engine fill its timeline, records the engine's
  /// phases and REQUEST_END at completion, and hands it back in the response (InferResponse::
  /// trace), where the frontend records its send activities. Null (always, with tracing off):
  /// nothing of this happens.
  std::shared_ptr<Trace> trace;
};

/// "model 'm' is decoupled: ..." — the answer to a one-response protocol call (HTTP infer, gRPC
/// ModelInfer) on a decoupled model (Triton: 501 / UNIMPLEMENTED).
std::string decoupled_message(const std::string& model_name);

struct InferOutput {
  const TensorSpec* spec = nullptr;  ///< the model's description of it
  Tensor tensor;
  /// Index into InferRequest::outputs, or -1 when the request named none.
  int requested = -1;
  /// Set when the output was written into the client's shared memory region (byte_size: the
  /// bytes written): the response carries no data for it.
  std::optional<SharedMemoryTensor> shared_memory;
};

/// The shared_memory_region, shared_memory_byte_size and shared_memory_offset parameters of
/// tensor `what` (Triton's system shared memory extension); nullopt without
/// shared_memory_region. invalid_argument for a region that is not a string, a byte size
/// missing or not an integer >= 0, an offset not an integer >= 0, or a size or offset without a
/// region.
Result<std::optional<SharedMemoryTensor>> shared_memory_parameters(const Parameters& parameters,
                                                                   const std::string& what);

struct InferResponse {
  ModelRef model;
  std::string id;
  std::vector<InferOutput> outputs;
  /// InferRequest::trace, back for the frontend's send activities (the final response only).
  std::shared_ptr<Trace> trace;
};

/// What check_input() found out: where the input goes and how big its data is.
struct InputSlot {
  std::size_t index = 0;  ///< in the model's signature
  const TensorSpec* spec = nullptr;
  DType dtype = DType::f32;
  std::size_t element_count = 0;
  /// The data's size in bytes; for BYTES (variable-length elements), the least it can be: the
  /// 4-byte length prefixes of element_count empty elements.
  std::size_t byte_size = 0;
};

/// An accepted request: cancel() ends it in the engine (a client that went away). Empty (not
/// valid) for one answered before submit() returned (a response-cache hit).
class InflightRequest {
 public:
  /// A request that waits elsewhere than in an engine (a response-cache follower).
  class Handle {
   public:
    virtual ~Handle() = default;
    /// As InflightRequest::cancel().
    virtual void cancel() = 0;
  };

  InflightRequest() = default;
  explicit InflightRequest(Future<Outputs> future) : future_(std::move(future)) {}
  explicit InflightRequest(std::shared_ptr<Handle> handle) : handle_(std::move(handle)) {}
  /// Resolves the request as cancelled where it has not ended yet. Thread-safe; idempotent.
  void cancel() {
    if (future_.valid()) future_.cancel();
    if (handle_) handle_->cancel();
  }
  bool valid() const noexcept { return future_.valid() || handle_ != nullptr; }

 private:
  Future<Outputs> future_;
  std::shared_ptr<Handle> handle_;
};

/// The protocol extensions served (Triton's names, in Triton's order): what GET /v2 and gRPC
/// ServerMetadata list, exactly.
inline constexpr std::array<std::string_view, 10> kServerExtensions = {"classification",
                                                                       "sequence",
                                                                       "sequence(string_id)",
                                                                       "model_repository",
                                                                       "model_configuration",
                                                                       "system_shared_memory",
                                                                       "binary_tensor_data",
                                                                       "statistics",
                                                                       "trace",
                                                                       "logging"};

class ServerLog;
class ServerModelHost;

struct ServerOptions {
  std::string name = "asyncinfer";
  std::string version = "0.1.0";
  /// Triton's --strict-readiness: ready only when every model version loaded.
  bool strict_readiness = true;
  /// --max-inflight-bytes: the MemoryBudget of every frontend (limits.hpp); 0 = no limit.
  std::size_t max_inflight_bytes = std::size_t{1} << 30;
  /// --max-shm-regions: system shared memory regions registered at once (each holds one
  /// descriptor; shared_memory.hpp); 0 = no limit.
  std::size_t max_shm_regions = 256;
  /// Descriptors client connections may take, all frontends together (ConnectionBudget); 0 = no
  /// limit. The serve command sets it from RLIMIT_NOFILE less a reserve.
  std::size_t connection_fds = 0;
  /// Triton's --cache-config local,size=BYTES: the response cache's size (response_cache.hpp)
  /// for the models whose config enables it; 0 = no cache.
  std::size_t response_cache_bytes = 0;
  /// The server's log (server_log.hpp): what the logging extension (GET/POST /v2/logging, gRPC
  /// LogSettings) reads and changes. Null: the server makes one of its own, writing to standard
  /// error. Must outlive the server.
  ServerLog* log = nullptr;
  /// Triton's trace extension (trace.hpp): what GET/POST /v2[/models/{m}]/trace/setting and
  /// gRPC TraceSetting read and change, and what samples requests. Null: the server makes one of
  /// its own with tracing off. Must outlive the server.
  TraceManager* trace = nullptr;
};

class InferenceServer {
 public:
  using Completion = detail::UniqueFunction<void(Result<InferResponse>)>;

  InferenceServer(std::unique_ptr<ModelRepository> repository, ServerOptions options);
  /// Shuts the engines down (cancel) if shutdown() was not called.
  ~InferenceServer();
  InferenceServer(const InferenceServer&) = delete;
  InferenceServer& operator=(const InferenceServer&) = delete;

  const ServerOptions& options() const noexcept { return options_; }
  /// The server's log (ServerOptions::log, or its own).
  ServerLog& log() const noexcept { return *options_.log; }
  /// The server's traces (ServerOptions::trace, or its own).
  TraceManager& tracer() const noexcept { return *options_.trace; }
  const ModelRepository& repository() const noexcept { return *repository_; }
  /// Model control (load_model, unload_model) goes through it.
  ModelRepository& repository() noexcept { return *repository_; }

  /// Live until shutdown() has run.
  bool live() const noexcept { return !stopped_.load(std::memory_order_acquire); }
  /// Ready when not draining, every listener accepts (ListenerHealth), and (strict readiness)
  /// every model version is ready, else at least one is. A listener's recovery that only this
  /// question finds (ListenerHealth::recheck_descriptors) is told to the readiness observers
  /// (on_readiness_change), on this thread.
  bool ready() const;
  /// As ready(), but a recovery it finds is not told to the observers: for an observer that asks
  /// under a lock of its own and publishes what it reads (the gRPC health service), which would
  /// otherwise be called back from inside its own question.
  bool ready_unannounced() const;
  /// Why ready() is false, for the readiness endpoints' answers.
  std::string unready_reason() const;
  /// Readiness turns false at once (the readiness observers are told); requests go on being
  /// served (frontends stop accepting).
  void begin_drain() noexcept;
  bool draining() const noexcept { return draining_.load(std::memory_order_acquire); }
  /// Shuts every engine down (Engine::shutdown); blocks until they have stopped. A second call
  /// with cancel cuts a drain in progress short. After it live() is false.
  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout);

  /// The model version a request names. `version` empty = the model's highest ready version.
  /// not_found for an unknown model or version (the message lists what exists); unavailable for
  /// one that failed to load (with the reason); invalid_argument for a version that is not a
  /// positive integer.
  /// A model that is not loaded (explicit mode, or unloaded) is not_found too.
  /// With --model-namespacing a name that two namespaces serve is invalid_argument, in Triton's
  /// words (RepositorySnapshot::ambiguity); `prefer_ns` (an ensemble's namespace, for its steps)
  /// finds that namespace's model first (RepositorySnapshot::find_from).
  Result<ModelRef> find(std::string_view model, std::string_view version,
                        std::string_view prefer_ns = {}) const;

  /// The model that holds `version` (a version find() gave), as the current snapshot has it:
  /// looked up by its id (name and namespace), never by the name again, so that the metadata of
  /// a request describes the model find() resolved. Null once that model left the repository.
  std::shared_ptr<const ServedModel> model_of(const ModelVersion& version) const;

  /// Triton's check before a model's trace settings (its server asks
  /// TRITONSERVER_ServerModelIsReady): ok when find(model, "") finds a version; otherwise the
  /// ambiguity error find() gives for a name that two namespaces serve, or invalid_argument
  /// "Request for unknown model : NAME" (Triton's words).
  Status check_trace_model(std::string_view model) const;

  /// The versions a statistics request covers (Triton's statistics extension): `model` empty =
  /// every loaded version of every model; `version` empty = every loaded version of `model`.
  /// invalid_argument (Triton's 400 / INVALID_ARGUMENT) naming what is wrong for an unknown
  /// model, a model with no loaded version, or a version that is unknown, malformed or not
  /// loaded.
  Result<std::vector<ModelRef>> stats_versions(std::string_view model,
                                               std::string_view version) const;

  /// Checks input `name` of OIP `datatype` and `shape` against the model without allocating:
  /// the name exists, the datatype is the model's, the shape has the model's rank, its fixed
  /// dims, a batch dim within max_batch_size, and an element count × size that fits in 64 bits.
  /// invalid_argument names the input, what was expected and what came.
  static Result<InputSlot> check_input(const ModelVersion& model, std::string_view name,
                                       std::string_view datatype,
                                       std::span<const std::int64_t> shape);
  /// BYTES input `name` of `model` from its serialized elements (each a 4-byte little-endian
  /// length, then that many bytes), as many as `shape` holds. invalid_argument in Triton's words
  /// (its core's request validation; qa/L0_input_validation) when fewer come ("expected 16 string
  /// elements for inference input 'X' for model 'M', got 14") or more ("unexpected number of
  /// string elements 17 ..., expecting 16"), or when a length runs past the end.
  static Result<Tensor> bytes_input(const ModelVersion& model, std::string_view name, Shape shape,
                                    std::string serialized);
  /// The words Triton uses when an input's data is not the size its shape and datatype need.
  static Status byte_size_mismatch(const ModelVersion& model, std::string_view name,
                                   std::size_t expected, std::size_t got);
  /// Whether the model has output `name`; invalid_argument listing the outputs otherwise.
  static Result<const TensorSpec*> check_output(const ModelVersion& model, std::string_view name);

  /// Request parameters onto the engine's options: `timeout` (µs, integer >= 0; 0 = none) and
  /// `priority` (integer >= 0; 0 = the model's default level). Other parameters are ignored, as
  /// Triton passes them to backends. invalid_argument for a bad value.
  static Result<RequestOptions> request_options(const Parameters& parameters);

  /// Submits `request` to the model's engine. On success the request is accepted: `done` runs
  /// exactly once, on the engine's completion executor (or, with completion_hands_off, on the
  /// thread that ends the request), with the outputs (only those requested,
  /// in the order asked) or the error. For a model with response_cache (and a server with a
  /// cache), a hit runs `done` on the calling thread before submit() returns (an empty
  /// InflightRequest), and a request that waits for an identical one runs it on that one's
  /// completion executor. An error returned here means nothing was submitted and
  /// `done` is destroyed without being called: bad input (invalid_argument naming it), the
  /// engine refusing it (queue full: resource_exhausted; shut down: unavailable).
  /// A request for a version that has been replaced (a reload) goes to its successor: the same
  /// version number where it is still served, else the model's default version.
  Result<InflightRequest> submit(const ModelRef& model, InferRequest request, Completion done);

  /// The response cache; null without --cache-config.
  const ResponseCache* response_cache() const noexcept { return cache_.get(); }
  /// The system shared memory regions clients registered (Triton's extension).
  SharedMemoryManager& shared_memory() noexcept { return shared_memory_; }
  const SharedMemoryManager& shared_memory() const noexcept { return shared_memory_; }
  /// The bytes requests in flight hold, every frontend together (--max-inflight-bytes).
  MemoryBudget& memory() noexcept { return memory_; }
  /// The descriptors client connections hold, every frontend together.
  ConnectionBudget& connection_budget() noexcept { return connections_; }
  /// Whether each listener accepts; readiness follows it.
  ListenerHealth& listeners() noexcept { return listeners_; }

  /// Runs `f` whenever ready() may have changed because of the models or the server's state: a
  /// repository snapshot was published (a load, an unload, a poll: ModelRepository::on_change),
  /// a served engine's health changed (a worker taken out by the hang watchdog, recovered, given
  /// up: EngineOptions::on_health_change), a drain or shutdown began. The listeners' changes
  /// have their own observers (ListenerHealth::on_change). A hint: `f` calls ready() for the
  /// value, and may be told when nothing changed. It runs on the thread that made the change (the
  /// repository's control thread, a model-control caller, an engine's timer, worker or reaper
  /// thread, the caller of begin_drain or shutdown) with no lock held that ready() takes, under
  /// the rules of ObserverList::notify (observers.hpp): short, never blocking, and not adding or
  /// removing an observer from inside. Returns an id for remove_readiness_observer().
  std::size_t on_readiness_change(std::function<void()> f) {
    return readiness_observers_.add(std::move(f));
  }
  /// After it returns `f` runs no more (a call in progress has ended). A frontend removes its
  /// observer before it goes (GrpcServer::stop).
  void remove_readiness_observer(std::size_t id) { readiness_observers_.remove(id); }

  /// Frontend metrics by protocol name ("http", "grpc"); created on first use, never freed.
  /// `connections`: whether the frontend counts connections (gRPC's library does not show them).
  ProtocolMetrics& protocol_metrics(std::string_view protocol, ProtocolMetrics::Labels labels,
                                    bool connections = true);
  /// The whole /metrics page (Prometheus text format 0.0.4).
  std::string metrics_text() const;

 private:
  class CacheFollower;
  class EnsembleRun;
  /// Called with the engine's result before `done` (the response cache's bookkeeping).
  using Finished = detail::UniqueFunction<void(const Result<Outputs>&)>;

  /// Submits checked inputs to the model's engine; `finished` (if any) runs after `done`, with the
  /// engine's result, and also on a refusal at submit (then `done` is destroyed uncalled and the
  /// error returned).
  Result<InflightRequest> run(ModelRef model, Inputs inputs, const RequestOptions& options,
                              std::string id, std::vector<std::size_t> selected, Completion done,
                              Finished finished = {});
  /// run() for an ensemble (EnsembleRun, at the end of inference_server.cpp): its steps, each
  /// submitted to its model as soon as the tensors it reads exist, under the request's deadline
  /// and priority; the request's cancellation cancels the steps in flight. A step's failure fails
  /// the request, naming the step. invalid_argument for inputs the ensemble's signature refuses.
  /// `depth`: how many ensembles this one is inside. A traced request (trace_request put its
  /// trace in options.context) records its QUEUE_START here, and each step is a child trace.
  Result<InflightRequest> run_ensemble(ModelRef model, Inputs inputs, const RequestOptions& options,
                                       std::string id, std::vector<std::size_t> selected,
                                       Completion done, int depth = 0);
  /// A traced request's (or ensemble step's) trace around its run (trace.hpp): names `model`
  /// and `id` in the trace, records REQUEST_START and (TENSORS) the inputs, has the engine fill
  /// the trace's timeline (options.timeline), and gives a python model or an ensemble the trace
  /// in options.context (a copy of the context given, if any), under which its calls and steps
  /// are traced as children. Returns `done` wrapped to record the engine's phases, REQUEST_END
  /// and (TENSORS) the outputs, and to hand the trace back in the response.
  static Completion trace_request(std::shared_ptr<Trace> trace, const ModelVersion& model,
                                  const std::string& id, const Inputs& inputs,
                                  RequestOptions& options, Completion done);
  /// `done`, after writing each output that `requested` places in shared memory into its
  /// region (a response whose output does not fit its window fails with invalid_argument).
  static Completion write_to_shared_memory(std::vector<RequestedOutput> requested, Completion done);
  /// submit() for a model with response_cache enabled: a hit answers at once; a miss runs (or
  /// follows an identical request in flight) and fills the cache.
  Result<InflightRequest> submit_cached(const ModelRef& model, Inputs inputs,
                                        const RequestOptions& options, std::string id,
                                        std::vector<std::size_t> selected, Completion done);
  /// The `finished` of a request that computes for the cache key `key` (as the flight's leader
  /// when `led`): stores the result, counts the miss, and answers the flight's followers.
  Finished fill_cache(const ModelVersion& model, std::shared_ptr<const CacheKey> key, bool led,
                      std::uint64_t lookup_ns);

  /// ready() and ready_unannounced().
  bool ready(bool announce) const;
  /// find() on one snapshot; `retired` tells that the version it found cannot serve because it
  /// was replaced meanwhile.
  Result<ModelRef> find_once(std::string_view model, std::string_view version,
                             std::string_view prefer_ns, bool* retired) const;
  /// The version that serves in place of `retired` (a reload replaced it), checked to take
  /// `inputs` (the same names, dtypes and shapes); not_found / unavailable / invalid_argument
  /// saying why there is none.
  Result<ModelRef> successor(const ModelVersion& retired, const Inputs& inputs) const;

  std::unique_ptr<ModelRepository> repository_;
  ServerOptions options_;
  std::unique_ptr<ServerLog> own_log_;       // when options_.log is null
  std::unique_ptr<TraceManager> own_trace_;  // when options_.trace is null
  std::unique_ptr<ResponseCache> cache_;
  MemoryBudget memory_;  // before shared_memory_, which counts input copies against it
  SharedMemoryManager shared_memory_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  // Mutable: readiness, a const question, re-examines a failure for want of descriptors and
  // wakes a listener that waits for one (ListenerHealth::recheck_descriptors).
  mutable ConnectionBudget connections_;
  mutable ListenerHealth listeners_;
  mutable ObserverList readiness_observers_;  // mutable: ready() tells it of what it finds
  std::size_t repository_observer_ = 0;       ///< ours on the repository: forwards to the above
  mutable std::mutex metrics_mu_;
  // Ensemble requests in flight (EnsembleRun): a draining shutdown waits for them before the
  // step models' engines stop taking requests.
  std::mutex ensembles_mu_;
  std::condition_variable ensembles_cv_;
  std::int64_t live_ensembles_ = 0;  // under ensembles_mu_
  std::map<std::string, std::unique_ptr<ProtocolMetrics>, std::less<>> protocols_;
  /// What its python models ask of it (model_host.hpp), bound to the repository's host link
  /// for the server's life.
  std::unique_ptr<ServerModelHost> host_;
};

/// The bytes of a request's input tensors (those without a lease of their own:
/// InferInput::counted), of a response's output tensors: what a frontend holds of the server's
/// MemoryBudget for them.
std::size_t input_bytes(const InferRequest& request);
std::size_t output_bytes(const InferResponse& response);

/// Reads an integer parameter (JSON numbers arrive as int64 or uint64); invalid_argument
/// naming it when it is of another type or out of [lo, hi].
Result<std::int64_t> parameter_int(const ParameterValue& value, std::string_view name,
                                   std::int64_t lo, std::int64_t hi);
/// Reads a boolean parameter; invalid_argument naming it otherwise.
Result<bool> parameter_bool(const ParameterValue& value, std::string_view name);

}  // namespace asyncinfer::server
