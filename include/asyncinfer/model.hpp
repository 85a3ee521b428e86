// model.hpp — what a model is to the engine: a signature and a way to put one batch on a stream.
//
// Design: a Model is the loaded definition (signature, weights); it creates one ModelInstance per
// engine worker, bound to that worker's device and stream (AscendCL cannot run one loaded model on
// two streams at once, and a libtorch module is best not shared across intra-op pools, so neither
// do we). ModelInstance::enqueue puts one batch's work on the stream and returns at once; the
// outputs are valid once the stream passes that point, and failures during execution reach the
// stream's next host function (see device.hpp: errors flow in stream order).
//
// Shapes follow the convention (and ONNX's): a signature lists full shapes with -1 for a
// dynamic dim; when `batched` is true, dim 0 of every input and output is the batch dim (-1).
//
// Built-in models (URI "builtin:<kind>?key=value&..."), for tests, benchmarks and capacity
// planning; docs/models.md lists every key:
//   builtin:identity                   outputs equal inputs (a device-side copy)
//   builtin:fixed_cost?base_us=&per_item_us=   occupies the device base + per_item × batch µs
//   builtin:faulty?mode=&code=&every=&first=&poison=   fails chosen calls (error, throw, hang)
// Other backends: "torch:<path>.pt" or a path ending in .pt (TorchScript through libtorch, where
// built); "openvino:<path>" or a path ending in .onnx or .xml (ONNX and OpenVINO IR through
// OpenVINO's runtime, where built; docs/backends.md); "builtin:gemm?m=&n=&k=&dtype=" (cuBLAS on the
// cuda device, where built); "python:<path>/model.py" (a Triton model.py, each instance in its own
// Python process; docs/serving.md).
//
// Thread safety: Model is immutable after load and may be shared; each ModelInstance is used by
// one worker thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer {

namespace detail {
class ModelHostLink;  // src/model/model_host.hpp: what a model may ask of its server
}  // namespace detail

/// A sequence's correlation ID (Triton's sequence_id, the CORRID control): an unsigned integer or
/// a string. 0 and "" are not IDs (Triton reserves them for requests outside any sequence). IDs of
/// the two kinds never equal each other (1 and "1" are two sequences).
using CorrelationId = std::variant<std::uint64_t, std::string>;
/// "1001", or the string itself.
std::string to_string(const CorrelationId& id);

/// A request's place in a sequence, for a stateful model (EngineOptions::sequence_batching): the
/// request parameters sequence_id, sequence_start and sequence_end of Triton's sequence extension.
struct SequenceFlags {
  CorrelationId id = std::uint64_t{0};
  bool start = false;  ///< the first request of the sequence: its state starts afresh
  bool end = false;    ///< the last: the sequence's slot is freed once it has run
};

/// A traced request's trace (Triton's trace extension), opaque outside the server that traces
/// it: the server's Trace (src/server/trace.hpp) is the only kind. RequestContext carries it to
/// the model, and a python model's business logic scripting call made with
/// `trace=request.trace()` carries it back (detail::HostRequest::trace), so that the server
/// traces the call as a child of that request's trace. Neither copied nor deleted through this
/// type.
class TraceHandle {
 protected:
  TraceHandle() = default;
  ~TraceHandle() = default;

 public:
  TraceHandle(const TraceHandle&) = delete;
  TraceHandle& operator=(const TraceHandle&) = delete;
};

/// What a request carries to its model besides its tensors, for backends that hand a model its
/// requests one by one (the python backend's InferenceRequest.request_id(), parameters(), and
/// business logic scripting): set by whoever submits it (RequestOptions::context), read by the
/// model through BatchIO::contexts. Immutable once submitted; shared, never copied.
struct RequestContext {
  std::string id;  ///< the client's request id (the protocol's "id"), may be empty
  /// The request's parameters as a JSON object's text (Triton's InferenceRequest.parameters()),
  /// e.g. {"custom":"x","n":3}; empty = none.
  std::string parameters_json;
  /// Business logic scripting: the models whose execution made this request, outermost first
  /// (a client's request has none). What a model's own BLS calls extend, and what their cycle
  /// and depth checks read (docs/design.md, "Business logic scripting").
  std::vector<std::string> callers;
  /// The request's trace when the server traces it (null otherwise): what its model's calls
  /// made with trace=request.trace(), and an ensemble's steps, are traced under.
  std::shared_ptr<TraceHandle> trace;
};

/// One named input or output: dtype and full shape (-1 = dynamic dim).
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  /// An input a request may leave out (Triton's `optional: true`): its slot in the request's
  /// inputs is then an undefined Tensor, and a batch holds it only when every request of the
  /// batch left it out. Only backends that say so take such inputs (the python backend hands
  /// the model the inputs that came). Ignored on outputs.
  bool optional = false;
  /// Requests whose non-batch dims of this input differ may share a batch (Triton's
  /// `allow_ragged_batch: true`): the dynamic batcher then matches only its dtype and rank. Only
  /// a model that takes a batch's requests apart (Model::takes_requests_apart) on a
  /// unified-memory device serves such an input (Engine::create refuses it otherwise): each
  /// request keeps its own tensor. Ignored on outputs.
  bool ragged = false;
};

struct ModelSignature {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  /// Dim 0 of every input and output is the batch dim.
  bool batched = true;
  /// The model's batch limit: the largest batch (sum of dim 0 over the requests of a batch) it
  /// accepts, >= 1; nullopt = the model sets no limit of its own (the engine then forms batches
  /// of up to kDefaultMaxBatchSize unless told otherwise: BatchingOptions::max_batch_size in
  /// engine.hpp is the one rule). Ignored when not batched. Not Triton's max_batch_size, whose 0
  /// means "no batch dim": here `batched` says that (docs/design.md, "Batch sizes: one name per
  /// meaning").
  std::optional<std::int64_t> batch_limit;
  /// Decoupled (Triton's model_transaction_policy { decoupled: true }): the model sends zero, one
  /// or many responses per request through BatchIO::responses while the batch runs, and its
  /// final result (the batch's outputs at the completion point) may have no outputs at all: the
  /// final flag alone. Requests need RequestOptions::on_response (engine.hpp).
  bool decoupled = false;

  /// "inputs: x f32[-1,1,32,32]; outputs: logits f32[-1,10]; batched, batch limit 64".
  std::string to_string() const;
};

/// Checks one request's inputs against the signature: count, dtypes, ranks, fixed dims, and
/// (when batched) that every input has the same dim 0 of at least 1 and at most batch_limit.
/// invalid_argument names the input, the expected and the received dtype/shape.
Status validate_inputs(const ModelSignature& signature, std::span<const Tensor> inputs);

/// How a decoupled model (ModelSignature::decoupled) sends the responses of the requests of one
/// batch before their final one (Triton's response sender: TRITONBACKEND_ResponseSend, the Python
/// backend's get_response_sender()). Made by the engine, one per batch; the model may call it
/// from any thread until the batch's completion point, and from several threads at once.
class ResponseSender {
 public:
  virtual ~ResponseSender() = default;
  /// Requests in the batch, in batch order (their rows are consecutive in BatchIO's tensors).
  virtual std::size_t requests() const noexcept = 0;
  /// Rows (dim 0) of request `request` (1 for unbatched models). 0 for an index out of range.
  virtual std::int64_t rows(std::size_t request) const noexcept = 0;
  /// Sends one response of request `request`: one host tensor per signature output, in signature
  /// order, with that request's rows only (dtypes and fixed dims as the signature says). Blocks
  /// while the receiver holds as many responses as it buffers (back-pressure: a slow client
  /// slows its model down instead of growing the server's memory). Errors: cancelled when the
  /// request has ended (cancelled, timed out, its client gone: stop sending for it);
  /// invalid_argument for an index out of range; internal for outputs that do not match the
  /// signature (nothing is sent). Responses sent after the completion point are refused
  /// (cancelled): the final response is always the last.
  virtual Status send(std::size_t request, std::vector<Tensor> outputs) = 0;
  /// Whether request `request` has ended (Triton's is_cancelled()). Never blocks.
  virtual bool is_cancelled(std::size_t request) const noexcept = 0;
};

/// One batch's data, shared between the engine and the model's stream work.
struct BatchIO {
  /// One tensor per signature input, in signature order, where the model's stream can read them
  /// (device memory on devices without unified memory; host memory otherwise).
  std::vector<Tensor> inputs;
  /// The same inputs on the host (equal to `inputs` on unified-memory devices). Read-only.
  std::vector<Tensor> host_inputs;
  /// One tensor per signature output. The model fills it either during enqueue() (required on
  /// devices without unified memory, so the engine can enqueue the copies back) or, in stream
  /// order, from its stream work before the stream passes the batch.
  std::vector<Tensor> outputs;
  /// For a model that takes a batch's requests apart (Model::takes_requests_apart) on a
  /// unified-memory device, a batch of more than one request: each request's own inputs, in batch
  /// order, one host tensor per signature input (undefined for an optional input that request
  /// left out), with that request's rows and shapes. `inputs` and `host_inputs` are then empty:
  /// the engine does not join the requests, so requests whose shapes differ may share a batch.
  /// Empty otherwise.
  std::vector<std::vector<Tensor>> request_inputs;
  /// Set by the model in place of `outputs` when `request_inputs` is not empty: each request's
  /// own outputs, in batch order, one tensor per signature output with that request's rows (none
  /// for a request failed by `request_errors`). Read like `outputs`.
  std::vector<std::vector<Tensor>> request_outputs;
  /// Batch size (dim 0 of the inputs), 1 for unbatched models.
  std::int64_t batch_size = 1;
  /// Rows (dim 0) of each request of the batch, in batch order: their rows are consecutive in
  /// `inputs` and must be in `outputs` (1 each for unbatched models), or each request's are its
  /// own tensors' (`request_inputs`, `request_outputs`). Sums to batch_size. For
  /// backends that hand a model its requests one by one (the python backend's execute(requests)).
  std::vector<std::int64_t> request_rows;
  /// For a batch of several requests of a model that takes them apart
  /// (Model::takes_requests_apart), null otherwise: whether request `i` (batch order) has ended
  /// (cancelled, timed out, its client gone), as `stop` says it of the whole batch (Triton's
  /// is_cancelled() of one request). Never blocks; any thread; true for an index out of range.
  std::function<bool(std::size_t)> request_ended;
  /// The requests were coalesced, not batched (Model::coalesced_requests): the engine does not
  /// batch this model, and the model runs each request of `request_inputs` on its own, in batch
  /// order, as if each had been a batch of its own. false for a batch of one request, and
  /// whenever the engine batched.
  bool coalesced = false;
  /// Fires when every request of the batch has been cancelled or has timed out, or the engine is
  /// recycling the worker. Pass it to Kernel::stop so cancellable backends end early.
  std::stop_token stop;
  /// Decoupled models only (null otherwise): sends responses before the final one. A decoupled
  /// model may leave `outputs` empty, for a final flag without a response.
  std::shared_ptr<ResponseSender> responses;
  /// Sequence batching only (empty otherwise): each request's sequence, in batch order, for
  /// backends that hand a model its requests one by one (the python backend's
  /// correlation_id() and flags()).
  std::vector<SequenceFlags> sequences;
  /// Each request's RequestContext, in batch order (null where its submitter gave none); empty
  /// when no request of the batch has one.
  std::vector<std::shared_ptr<const RequestContext>> contexts;
  /// The latest deadline of the batch's requests (the batch runs while one of them lives);
  /// max() when one of them has none. What a model's own requests (business logic scripting)
  /// inherit.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  /// Empty, or one status per request in batch order, set by the model when the batch
  /// succeeds: a non-ok one fails that request alone, with that status as it is and without a
  /// retry (Triton's error response: the python backend's InferenceResponse(error=...)); the
  /// others complete. The failed request's rows of `outputs` are still there but not read.
  std::vector<Status> request_errors;
};

/// A model bound to one device and stream (one per engine worker).
class ModelInstance {
 public:
  virtual ~ModelInstance() = default;
  /// Puts one batch's work on `stream`, the stream this instance was created for. Returns at once
  /// (on the cpu backend the work itself runs on the stream's thread). A non-ok return means
  /// nothing usable was enqueued; errors during execution reach the stream's next host function.
  /// Exceptions are not part of the contract; the engine catches and reports them anyway.
  virtual Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) = 0;
};

/// How the engine asks for an instance.
struct InstanceOptions {
  /// Index of the engine worker the instance serves (for names and logs).
  int worker_index = 0;
  /// Threads the instance may use for one forward pass (libtorch intra-op threads):
  /// EngineOptions::intra_op_threads, 1 unless the user set it.
  int intra_op_threads = 1;
  /// Fires when the creation is to be abandoned (EngineOptions::create_stop: the load was
  /// cancelled or timed out). A backend whose create_instance may block for long watches it and
  /// then returns cancelled promptly, leaving nothing behind; a quick one may ignore it.
  std::stop_token stop;
};

/// A loaded model.
class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSignature& signature() const noexcept = 0;
  /// The URI or path it was loaded from.
  virtual const std::string& name() const noexcept = 0;
  /// Whether running work stops early when BatchIO::stop fires (a libtorch call cannot).
  virtual bool cancellable() const noexcept { return false; }
  /// Whether a submitting thread may run a batch with an instance of this model, in place of the
  /// worker that owns the instance (RequestOptions::caller_run_max_compute), one thread at a
  /// time: the instance's enqueue and kernels keep no per-thread state (libtorch sets the
  /// running thread's OpenMP thread count, so torch says no), and a batch's cost follows its
  /// inputs' size, not their values, and always ends (no injected hang), so that the model's
  /// recent compute time predicts the next batch's. false by default.
  virtual bool supports_caller_runs() const noexcept { return false; }
  /// How many batches an instance gains from having launched at once: its instances start a
  /// batch's work in ModelInstance::enqueue and finish it in the batch's kernel, so a worker gains
  /// by launching the next batches while one runs (the python backend sends its process the next
  /// batch ahead). 0 (the default): none. Otherwise the engine gives each worker a stream with a
  /// thread of its own on every device (on cpu it would otherwise run each batch on the worker's
  /// thread, one at a time), and at least this many batches in flight
  /// (EngineOptions::max_inflight_per_worker, raised to it; Engine::options() says). Never blocks.
  virtual int pipelined_batches() const noexcept { return 0; }
  /// Whether the model's instances read a batch's requests one by one and answer each with
  /// outputs of its own (BatchIO::request_inputs and request_outputs), as Triton's python backend
  /// hands model.py's execute() a list of requests that each keep their own tensors. The engine
  /// then neither joins the requests' inputs nor splits the outputs, on unified-memory devices.
  /// false by default. Never blocks.
  virtual bool takes_requests_apart() const noexcept { return false; }
  /// How many requests one launch of the model may carry when the engine does not batch it (an
  /// unbatched model, or a max batch size of 1): the engine then hands one launch the requests
  /// already queued, up to this many and without waiting for more, and the model runs each on
  /// its own, in order (BatchIO::coalesced), so that requests that arrive together share one
  /// trip to where the model runs (the python backend: one message to its process and one back,
  /// where each request was one execute() of its own and two messages). Only for a model that
  /// takes requests apart on a unified-memory device, outside sequence batching. 0 or 1 (the
  /// default): one request a launch. Never blocks.
  virtual int coalesced_requests() const noexcept { return 0; }
  /// Whether the model's work runs on the host's CPU cores when its instances use `device`
  /// (libtorch on the cpu and sim devices) rather than on an accelerator or a simulated
  /// engine. EngineOptions::workers = 0 (auto) starts one worker per core for such a model.
  virtual bool uses_host_cores(const Device& device) const noexcept {
    (void)device;
    return false;
  }
  /// How many instances (engine workers) the model runs best with on `device`; 0 = no view, and
  /// EngineOptions::workers = 0 (auto) then follows uses_host_cores. OpenVINO: the compiled
  /// model's optimal number of infer requests (one per OpenVINO stream), so that every stream of
  /// its throughput hint has one request in flight. Never blocks.
  virtual int preferred_instances(const Device& device) const noexcept {
    (void)device;
    return 0;
  }
  /// A new instance for `stream` of `device`. unavailable when the model cannot run on that kind
  /// of device (the message says which devices it supports).
  virtual Result<std::unique_ptr<ModelInstance>> create_instance(
      Device& device, Stream& stream, const InstanceOptions& options) = 0;
};

/// Settings of a backend's own library, by name: ModelOptions::backend_parameters.
using BackendParameters = std::vector<std::pair<std::string, std::string>>;

/// Options used by load_model (backends ignore what does not apply to them).
struct ModelOptions {
  /// The model's inputs and outputs, for a backend that cannot read them from its file
  /// (TorchScript's command-line specs, a python model's config): empty = the backend's own
  /// (its file, or a signature file named by its backend parameters). Backends that read the
  /// signature from the model itself ignore them.
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  /// The model's batch limit (ModelSignature::batch_limit), >= 1; nullopt = the model's own
  /// (TorchScript: its signature file's; the other backends: none). Set, it replaces the
  /// model's own. A backend may take a set value as "batched" unless `batched` says otherwise
  /// (python), and ignores it on an unbatched model. load_model refuses a value below 1
  /// (invalid_argument).
  std::optional<std::int64_t> batch_limit;
  /// Whether dim 0 is the batch dim (Triton's max_batch_size > 0); unset = the backend decides
  /// from the model (openvino: batched when dim 0 is dynamic on every input and output; python:
  /// when batch_limit is set). openvino reshapes a static dim 0 to dynamic when true. Backends
  /// whose signature says it ignore it.
  std::optional<bool> batched;
  /// The model's configuration as Triton's JSON form (a ModelConfig, protobuf's JSON names);
  /// empty = none. A backend reads what it needs from it (python: hands it to model.py as
  /// args["model_config"], and its model_transaction_policy.decoupled says whether the model is
  /// decoupled, ModelSignature::decoupled); the others ignore it.
  std::string model_config_json;
  /// The backend's own settings, by name, as Triton's config.pbtxt `parameters` carry them to a
  /// backend: each backend reads its keys and refuses one it does not know (invalid_argument
  /// naming the key); load_model refuses a non-empty list for a backend that takes none.
  /// docs/backends.md lists each backend's keys (torch: signature_path, warmup_runs; openvino:
  /// NUM_STREAMS, INFERENCE_NUM_THREADS, PERFORMANCE_HINT and any OpenVINO CPU property; python:
  /// python_interpreter, EXECUTION_ENV_PATH, and model.py's own).
  BackendParameters backend_parameters;
  /// The server that hosts the model, for a backend whose models call back into it (python:
  /// model.py's business logic scripting, model loading API and custom metrics; internal:
  /// src/model/model_host.hpp); null = none (those calls then fail with unavailable). The other
  /// backends ignore it.
  std::shared_ptr<detail::ModelHostLink> host;
};

/// Loads a model by URI: "builtin:<kind>?...", "torch:<path>", a path ending in ".pt",
/// "openvino:<path>", a path ending in ".onnx" or ".xml", or "python:<path>" or a path ending in
/// "model.py" (a Triton model.py run in its own Python processes; docs/serving.md).
/// invalid_argument names what was wrong in the URI and the accepted forms; not_found for a
/// missing file; unavailable for a backend that was not built.
Result<std::shared_ptr<Model>> load_model(std::string_view uri, const ModelOptions& options = {});

/// Triton's auto-complete: the backend of the model at `uri` completes `config_json` (a Triton
/// ModelConfig in protobuf's JSON form, proto field names) from what the model says of itself,
/// and returns the completed config (the same text when it has nothing to add). python: runs
/// model.py's TritonPythonModel.auto_complete_config(config) in a process of its own (the
/// interpreter of options.backend_parameters' python_interpreter), when model.py defines it;
/// invalid_argument with model.py's message when it raises (a config that contradicts the given
/// one: Triton's errors), unavailable when the process fails. Other backends return it unchanged.
/// Blocks while the process runs (up to 120 s).
Result<std::string> complete_model_config(std::string_view uri, std::string_view config_json,
                                          const ModelOptions& options = {});

/// The model kinds built into this library, in registration order ("builtin:identity", ...,
/// "builtin:gemm" where the cuda backend is built, "torch" where libtorch is). Never blocks.
std::vector<std::string> model_backends();

/// Parses "x:f32:1x32x32" style specs used on the command line: name, dtype and the dims after
/// the batch dim separated by 'x' (-1 for dynamic). For batched models the batch dim is added.
Result<TensorSpec> parse_tensor_spec(std::string_view text, bool batched);

}  // namespace asyncinfer
