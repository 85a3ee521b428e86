// oip_json.hpp — the HTTP/REST encoding of the Open Inference Protocol: JSON bodies, and
// Triton's binary tensor data extension (docs/protocol/extension_binary_data.md).
//
// Request body: a JSON header, then the raw bytes of each input that says
// parameters.binary_data_size, in the order the inputs appear in the JSON. The header
// Inference-Header-Content-Length gives the JSON's length; without it the whole body is JSON; with
// 0 the whole body is the raw bytes of a single-input model's only input (shape from the model).
// Outputs travel in binary when asked for (output parameter binary_data, or the request parameter
// binary_data_output for every output), after the JSON of the response, in output order.
//
// Safety (issue 16, "Bad input"): the JSON is parsed with a nesting limit enforced while parsing
// (a callback stops the parser as soon as it goes deeper), so a deeply nested body costs nothing;
// each input's name, datatype and shape are checked against the model, and its element count
// against the declared shape, before its tensor is allocated; binary sizes are checked against
// the shape and against what follows the JSON before anything is copied. Every failure is
// invalid_argument naming the input and what was expected.
//
// Thread safety: free functions over their arguments.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inference_server.hpp"
#include "trace.hpp"

namespace asyncinfer::server {

/// A decoded inference request and how each output is to be sent back.
struct DecodedInfer {
  InferRequest request;
  /// Per entry of request.outputs: send in binary.
  std::vector<bool> output_binary;
  /// For outputs the request did not name (all outputs when it named none): binary_data_output.
  bool binary_default = false;
};

/// Decodes an inference request body for `model`. `header_length` is the value of
/// Inference-Header-Content-Length when the header was sent. `max_depth` bounds JSON nesting.
/// Inputs and outputs that name a region of `shared_memory` (shared_memory_region, ...) are
/// checked against it, and such inputs become views of the region; without a manager they are
/// refused. Thread-safe (any thread may decode).
Result<DecodedInfer> decode_infer_request(const ModelVersion& model, std::string_view body,
                                          std::optional<std::size_t> header_length, int max_depth,
                                          const SharedMemoryManager* shared_memory = nullptr);

struct EncodedResponse {
  std::string body;
  std::size_t json_size = 0;  ///< for Inference-Header-Content-Length when binary
  bool binary = false;        ///< some output follows the JSON in binary
};

/// Encodes a response: "model_name", "model_version", "id" (when the request had one),
/// "outputs" with flat row-major "data", or parameters.binary_data_size for binary outputs.
EncodedResponse encode_infer_response(const InferResponse& response, const DecodedInfer& request);

/// {"error": "<message>"}
std::string error_json(std::string_view message);
/// GET /v2
std::string server_metadata_json(const InferenceServer& server);
/// GET /v2/models/{m}[/versions/{v}]: `version` null = the model (all served versions).
std::string model_metadata_json(const ServedModel& model, const ModelVersion& shown,
                                const ModelVersion* version);
/// POST /v2/repository/index (Triton's repository extension): every model and version with its
/// state; `ready_only` keeps the ready ones.
std::string repository_index_json(const ModelRepository& repository, bool ready_only);
/// Triton's statistics body: {"model_stats": [{name, version, last_inference, inference_count,
/// execution_count, inference_stats {success, fail, queue, compute_input, compute_infer,
/// compute_output, cache_hit, cache_miss: {count, ns}}, response_stats {}, batch_stats
/// [{batch_size, compute_input, compute_infer, compute_output}], memory_usage []}]}, one entry
/// per version, from each engine's InferenceStats.
std::string model_statistics_json(const std::vector<ModelRef>& versions);
/// Parses the optional body of /v2/repository/index ({"ready": bool}); invalid_argument else.
Result<bool> parse_index_request(std::string_view body, int max_depth);
/// The body of POST /v2/logging (Triton's logging extension): a JSON object of settings, each a
/// bool, a number or a string (ServerLog::update checks which); invalid_argument otherwise.
Result<Parameters> parse_log_settings_request(std::string_view body, int max_depth);
/// The body of POST /v2[/models/{m}]/trace/setting (Triton's trace extension): a JSON object,
/// or empty (nothing to change); trace_level an array of strings, the other settings strings,
/// any of them null to clear it (parse_trace_setting_update says what is checked).
/// invalid_argument otherwise.
Result<TraceSettingUpdate> parse_trace_settings_request(std::string_view body, int max_depth);

/// The body of POST /v2/repository/models/{m}/load or /unload (Triton's): empty, or
/// {"parameters": {...}}. A load's `config` (a string: a ModelConfig in JSON) replaces the
/// config.pbtxt, and its `file:<path>` parameters (strings: the file's contents in base64,
/// RFC 4648 with padding, as Triton's HTTP clients send them) are model files (LoadParameters);
/// an unload's `unload_dependents` (bool) is accepted (no model here depends on another); other
/// parameters are ignored. invalid_argument for bad JSON or a value of the wrong type or
/// encoding, naming the parameter.
struct RepositoryCall {
  std::optional<std::string> config;
  /// `file:` parameters of a load: path in the model's folder → the decoded contents.
  std::vector<std::pair<std::string, std::string>> files;
};
Result<RepositoryCall> parse_repository_call(std::string_view body, int max_depth, bool load);

/// The body of POST /v2/systemsharedmemory/region/{r}/register: {"key": string, "offset":
/// integer >= 0 (default 0), "byte_size": integer >= 1}. invalid_argument names the field.
struct SharedMemoryRegisterCall {
  std::string key;
  std::size_t offset = 0;
  std::size_t byte_size = 0;
};
Result<SharedMemoryRegisterCall> parse_shared_memory_register(std::string_view body, int max_depth);
/// GET /v2/systemsharedmemory[/region/{r}]/status: [{"name", "key", "offset", "byte_size"}].
std::string shared_memory_status_json(const std::vector<SharedMemoryRef>& regions);

}  // namespace asyncinfer::server
