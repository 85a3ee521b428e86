// model_config.hpp — a model's config.pbtxt (Triton's ModelConfig in protobuf text format) read
// and turned into what asyncinfer needs to serve it: which model to load, on which device, with
// which engine options, and which versions.
//
// Design: parsing is libprotobuf's TextFormat over model_config.proto (Triton's field names and
// numbers), never a parser of our own. The parser runs with unknown fields allowed and reports
// each one it skips; plan_model() then sorts every field that was given into one of three kinds:
//   - used: name, platform/backend, max_batch_size, input/output (name, data_type, dims),
//     instance_group (kind, count, gpus), dynamic_batching (preferred_batch_size,
//     max_queue_delay_microseconds, preserve_ordering, priority_levels, default_priority_level,
//     default_queue_policy: default_timeout_microseconds, allow_timeout_override,
//     max_queue_size), version_policy, default_model_filename, parameters, model_warmup,
//     output.label_filename;
//   - would change behaviour but is not supported (ensemble_scheduling without "ensemble",
//     input.reshape, decoupled transactions, an unknown field, ...): an error naming the field;
//   - ignorable (optimization, metric_tags, response_cache, ...):
//     a warning naming the field.
// docs/serving.md lists every field and what becomes of it.
//
// Thread safety: free functions over values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "asyncinfer/status.hpp"
#include "model/repository_form.hpp"

namespace asyncinfer::server {

/// Which versions to serve (Triton's version_policy; the default is latest { num_versions: 1 }).
struct VersionPolicy {
  enum class Kind : std::uint8_t { latest, all, specific };
  Kind kind = Kind::latest;
  std::uint32_t num_versions = 1;      ///< latest
  std::vector<std::int64_t> versions;  ///< specific
  /// The versions among `available` (any order) that the policy serves, ascending.
  std::vector<std::int64_t> select(std::vector<std::int64_t> available) const;
};

/// One step of an ensemble (Triton's ModelEnsembling.Step): a model, the version it runs
/// (-1 = the highest ready one), and which ensemble tensors feed its inputs and receive its
/// outputs. The maps are sorted by the step model's tensor name.
struct EnsembleStep {
  std::string model_name;
  std::int64_t model_version = -1;
  /// (step model's input, ensemble tensor)
  std::vector<std::pair<std::string, std::string>> input_map;
  /// (step model's output, ensemble tensor)
  std::vector<std::pair<std::string, std::string>> output_map;
  /// "step 2 (model 'preprocess')" for messages.
  std::string label(std::size_t index) const;
};

/// One model_warmup entry (Triton's ModelWarmup): `count` runs of one request of `batch_size` rows
/// (no batch dim when the model has none) whose inputs hold zeros, random values, or the bytes of
/// <model>/warmup/<input_data_file>.
struct WarmupSample {
  struct Input {
    enum class Data : std::uint8_t { zero, random, file };
    std::string name;
    DType dtype = DType::f32;
    Shape dims;  ///< without the batch dim
    Data data = Data::zero;
    std::string file;  ///< Data::file: the file's name in the model's warmup folder
  };
  std::string name;
  std::int64_t batch_size = 1;
  std::uint32_t count = 1;
  std::vector<Input> inputs;
};

/// One instance's instance_group rate_limiter (Triton's ModelRateLimiter): the resources it must
/// hold while a batch runs, and its priority (a weight: 2 gets half the turns of 1).
struct InstanceRateLimit {
  struct Resource {
    std::string name;
    std::uint32_t count = 0;
    bool global = false;  ///< one count for the server, not one per device
  };
  std::vector<Resource> resources;
  std::uint32_t priority = 0;
};

/// Everything needed to load and serve one model's versions.
struct ModelPlan {
  /// Where the model comes from: a file that a backend reads (`form` names the backend and how
  /// the server hands it the model), a model built into the library (`builtin_uri`), or an
  /// ensemble of other models (`ensemble_steps`).
  enum class Kind : std::uint8_t { file, builtin, ensemble };
  std::string name;
  Kind kind = Kind::builtin;
  /// file: the repository form its config's backend or platform named (model/repository_form.hpp:
  /// the model kind, the default file, what the backend takes). builtin and ensemble: the default
  /// form, every flag false, so a check of a flag needs no check of the kind.
  detail::RepositoryForm form;
  /// What model metadata reports as "platform": the form's ("pytorch_libtorch", "openvino" also
  /// for a config written for "onnxruntime_onnx", "python"), "asyncinfer_builtin" or "ensemble".
  std::string platform;
  /// builtin: the model URI ("builtin:identity?..."), from parameters { key: "uri" }.
  std::string builtin_uri;
  /// builtin: the model takes the listed inputs and outputs as its own (Triton's `backend:
  /// "identity"`), not the URI's.
  bool builtin_takes_config_tensors = false;
  /// file: the file inside each version folder (default_model_filename, else the form's
  /// default_model_filename).
  std::string model_filename;
  /// The config's parameters that are not asyncinfer's own, for a form that takes them
  /// (RepositoryForm::takes_backend_parameters; ModelOptions::backend_parameters): openvino passes
  /// them to OpenVINO by name (NUM_STREAMS, PERFORMANCE_HINT, ...), python to the backend
  /// (python_interpreter) and, with the whole config, to model.py. Others: warned about, dropped.
  BackendParameters backend_parameters;
  /// Device spec for open_device ("cpu", "cuda:1", "sim", "sim:..."); empty with device_auto.
  std::string device;
  /// KIND_AUTO (Triton's default): cuda:0 where it opens and the model runs there, else cpu.
  bool device_auto = false;
  /// The config's max_batch_size, Triton's field with Triton's meaning: 0 = the model has no
  /// batch dim; N > 0 = dim 0 is the batch dim, at most N rows per request and per batch. In the
  /// library's terms: ModelSignature::batched and batch_limit (batch_limit() below), and, with
  /// dynamic_batching, BatchingOptions::max_batch_size (docs/design.md, "Batch sizes").
  std::int64_t max_batch_size = 0;
  /// max_batch_size as a ModelSignature::batch_limit: nullopt when 0 (no batch dim).
  std::optional<std::int64_t> batch_limit() const {
    return max_batch_size > 0 ? std::optional<std::int64_t>(max_batch_size) : std::nullopt;
  }
  /// From input / output, full shapes (the batch dim, -1, put first when max_batch_size > 0).
  /// Empty for a built-in model whose config lists none (its signature comes from its URI).
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  /// sequence_batching: the model inputs its control_input and state entries fill, and the
  /// outputs its states keep, after `inputs` and `outputs` in the loaded model's signature;
  /// clients never send nor receive them (Engine::request_signature).
  std::vector<TensorSpec> sequence_inputs;
  std::vector<TensorSpec> sequence_outputs;
  /// sequence_batching state initial_state data_file names, by state input: read from the
  /// version's initial_state/ folder at load (Triton's layout).
  std::map<std::string, std::string> state_files;
  /// output name → its label_filename (a file in the model's folder, one label per line): the
  /// labels of the classification extension (classification.hpp).
  std::map<std::string, std::string> label_files;
  /// Triton's `reshape` of an input or output: by index of `inputs` / `outputs` (whose shapes
  /// are the config's `dims`, what clients send and get), the full shape the model itself takes
  /// or gives (reshape { shape }, the batch dim first when batched); nullopt where the config
  /// gives none. Empty when no tensor has one.
  std::vector<std::optional<Shape>> input_reshapes;
  std::vector<std::optional<Shape>> output_reshapes;
  /// `inputs` / `outputs` as the model sees them: each reshape's shape in place of its dims.
  std::vector<TensorSpec> model_inputs() const;
  std::vector<TensorSpec> model_outputs() const;
  EngineOptions engine;
  /// instance_group rate_limiter: one entry per engine worker, in the groups' order (a group of
  /// count N gives N), each with its group's resources and priority; empty when no group has a
  /// rate_limiter. Served only with --rate-limit=execution_count (RepositoryOptions::rate_limiter,
  /// src/engine/resource_pool.hpp).
  std::vector<InstanceRateLimit> rate_limits;
  VersionPolicy versions;
  /// model_warmup: run on each version before it turns ready (model_repository.cpp).
  std::vector<WarmupSample> warmup;
  /// response_cache { enable: true }: its responses go in the server's cache (--cache-config).
  bool response_cache = false;
  /// model_transaction_policy { decoupled: true }: zero, one or many responses per request
  /// (ModelSignature::decoupled must agree), served by gRPC ModelStreamInfer and HTTP
  /// generate / generate_stream only.
  bool decoupled = false;
  /// platform: "ensemble": its steps (ensemble_scheduling), in config order; the graph they form
  /// is checked by check_ensemble_graph.
  std::vector<EnsembleStep> ensemble_steps;
  /// The config.pbtxt as parsed (a serialized inference.ModelConfig), for applied_model_config.
  std::string config_binary;
  /// "device cpu, 2 workers, dynamic batching max 8 delay 100 us" for the load log line.
  std::string summary() const;
};

/// Checks an ensemble's graph of tensors and steps without looking at the step models: every
/// tensor a step reads has exactly one producer (an ensemble input or one step's output), every
/// ensemble output has one, and the steps form no cycle. invalid_argument naming the step and
/// the tensor otherwise. Returns the steps in an order where each comes after its producers.
Result<std::vector<std::size_t>> check_ensemble_graph(const ModelPlan& plan);

/// Parses the text of a config.pbtxt (`source`, the file's path, starts the messages) and checks
/// it against asyncinfer's subset. `dir_name` is the model's folder (Triton requires `name`, when
/// given, to equal it). invalid_argument with "source:line:column" for syntax errors and unknown
/// fields, or naming the field and what was expected; warnings for ignorable fields are appended
/// to `warnings`. The protobuf types stay inside model_config.cpp and model_config_sections.cpp
/// (see the CMake file: under ThreadSanitizer, protobuf's map fields change layout, so those files
/// are built like libprotobuf).
///
/// `version_files`: the names in the model's first version folder (by name, as Triton lists
/// them), for a config that names neither platform nor backend: as Triton's core completes the
/// backend fields (AutoCompleteBackendFields, whether or not auto-complete is on), its backend is
/// the first registered form whose default model file is there, or whose default file the
/// config's default_model_filename names. Empty: no completion (the config must name one).
Result<ModelPlan> plan_model_config(std::string_view text, std::string_view source,
                                    std::string_view dir_name, std::vector<std::string>* warnings,
                                    const std::vector<std::string>& version_files = {});
/// plan_model_config for a ModelConfig in protobuf's JSON form (Triton's `config` parameter of a
/// model load, which replaces the config.pbtxt): unknown fields are refused; invalid_argument
/// starting with `source` otherwise, as plan_model_config's.
Result<ModelPlan> plan_model_config_json(std::string_view json, std::string_view source,
                                         std::string_view dir_name,
                                         std::vector<std::string>* warnings,
                                         const std::vector<std::string>& version_files = {});

/// The configuration a loaded version runs with, as Triton's model-configuration extension shows
/// it: `json` is the protobuf JSON mapping of model_config.proto's ModelConfig with the proto
/// field names, every scalar printed and the 64-bit integers as numbers (GET .../config);
/// `binary` the same message serialized (gRPC ModelConfig).
struct AppliedConfig {
  std::string json;
  std::string binary;
};

/// The parsed config with the defaults Triton's core fills in (name, backend, version_policy,
/// instance_group named "<model>_<i>" with the kind of `device` — "cpu", "cuda:N", or another
/// spec, shown as KIND_MODEL —, inputs and outputs from `signature` when the config lists none,
/// model_transaction_policy, response_cache). internal_error only if libprotobuf fails.
Result<AppliedConfig> applied_model_config(const ModelPlan& plan, const ModelSignature& signature,
                                           std::string_view device);

/// The config as given (config.pbtxt or a load's override, parsed), in protobuf's JSON form with
/// the proto field names and 64-bit integers as numbers, `name` filled in: what a python model's
/// auto_complete_config is handed (complete_model_config). internal_error only if libprotobuf
/// fails.
Result<std::string> given_model_config_json(const ModelPlan& plan);

/// Triton's reshape at run time: the shape `to` takes for a tensor of shape `actual`, which fits
/// `from` (its -1 dims any size). Each -1 of `to` takes the size that the -1 of `from` at the same
/// rank among -1s has in `actual` (the config's check makes the parts between them the same
/// size: Triton's rule). `from` and `to` are full shapes, the batch dim (-1) first when batched.
Shape resolve_reshape(const Shape& from, const Shape& to, const Shape& actual);

/// Triton's reshape of a request's tensors: tensor i of `tensors` (undefined ones skipped) viewed
/// (no copy) in shape reshapes[i] where it has one, resolve_reshape'd from shapes[i]'s, or the
/// other way round when `to_model` is false (`shapes` are the clients' then, the model's outputs
/// go back to them). A view that cannot be made (another element count) keeps the tensor.
/// `shapes`: the client-side full shapes, by index as `reshapes`.
void apply_reshapes(const std::vector<std::optional<Shape>>& reshapes,
                    const std::vector<TensorSpec>& shapes, bool to_model,
                    std::vector<Tensor>& tensors);

/// Checks a loaded model's signature against the plan's inputs/outputs (as the model sees them:
/// model_inputs(), model_outputs()) and max_batch_size (names, dtypes, dims). invalid_argument
/// names the first difference.
Status check_signature(const ModelPlan& plan, const ModelSignature& signature);

/// OIP datatype names ("FP32", "INT64", "BOOL", "BYTES", ...) for a DType, and back. Unknown
/// names are invalid_argument with a message naming the supported datatypes.
std::string_view oip_datatype(DType dtype) noexcept;
Result<DType> dtype_from_oip(std::string_view name);

}  // namespace asyncinfer::server
