// oip_grpc.hpp — the gRPC encoding of the Open Inference Protocol: grpc_service.proto's messages
// onto the core's InferRequest / InferResponse and back (the gRPC twin of http/oip_json.hpp).
//
// Inputs (KServe's and Triton's rules): either every input's data is in raw_input_contents — one
// entry per input, in the order of `inputs`, each exactly element count × element size bytes,
// little-endian, row-major — or every input carries typed `contents` in the field of its datatype
// (fp32_contents for FP32, int_contents for INT8/INT16/INT32, uint_contents for UINT8/UINT16/
// UINT32, ...), never both in one request. FP16 and BF16 travel raw only. Each input's name,
// datatype and shape are checked against the model (InferenceServer::check_input) before any
// tensor is allocated; typed values are range-checked (an INT8 input's int_contents must fit in
// 8 bits). Every failure is invalid_argument naming the input and what was expected.
//
// Copies: a raw input's bytes are moved out of the parsed message into the tensor's storage (no
// copy after protobuf's parse). Outputs are always answered raw, as Triton does (its clients read
// raw_output_contents): encode_infer_response() writes the message without the output bytes and
// appends each output's bytes as its own slice referencing the output tensor, so a large output
// is not copied before gRPC writes it (protobuf allows a message's fields in any order).
//
// Build: the messages with map fields (ModelInferRequest, ModelInferResponse and their tensors)
// appear only in oip_grpc.cpp, which is compiled like Debian's libprotobuf, without sanitizer
// flags (under ThreadSanitizer protobuf's map fields change layout, as for model_config.cpp);
// this header names none of them.
//
// Thread safety: free functions over their arguments.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <optional>
#include <string>

#include "grpc_service.pb.h"
#include "inference_server.hpp"

namespace asyncinfer::server {

/// A ModelInferRequest parsed and decoded for its model. When `status` is not ok, the names
/// (as far as they were read) still say which request failed.
struct ParsedInfer {
  Status status;
  /// False when the bytes are not a ModelInferRequest at all (then status says so).
  bool well_formed = false;
  std::string model_name;
  std::string model_version;
  std::string id;
  ModelRef model;        ///< set when the model was found
  InferRequest request;  ///< valid when status is ok
};

/// Parses the raw message `raw` (consumed) as a ModelInferRequest, finds its model in `server`
/// and decodes it (raw input bytes are moved, not copied). invalid_argument when the bytes are
/// not a ModelInferRequest (`what` names the message in the error: "the request", "stream
/// message 3"), or for bad input; the lookup's errors (not_found, unavailable) otherwise.
ParsedInfer parse_infer_request(grpc::ByteBuffer& raw, const InferenceServer& server,
                                const std::string& what);

/// The serialized ModelInferResponse of `response`: model_name, model_version (the version that
/// ran), id, outputs (name, datatype, shape) and raw_output_contents. With `stream` it is wrapped
/// as ModelStreamInferResponse.infer_response (error_message empty).
/// `final_response`: a decoupled model's response carries the parameter triton_final_response
/// (Triton's stream responses: true on the last one of a request).
grpc::ByteBuffer encode_infer_response(const InferResponse& response, bool stream,
                                       std::optional<bool> final_response = std::nullopt);

/// A ModelStreamInferResponse carrying `error` and, in infer_response, the failed request's
/// model_name, model_version and id (so the client can match it).
grpc::ByteBuffer encode_stream_error(const Status& error, std::string_view model_name,
                                     std::string_view model_version, std::string_view id);

void server_metadata(const InferenceServer& server, inference::ServerMetadataResponse* out);
/// `version` null = the model with every ready version listed; else that version only.
void model_metadata(const ServedModel& model, const ModelVersion& shown,
                    const ModelVersion* version, inference::ModelMetadataResponse* out);
/// The version's applied configuration (ModelVersion::config_binary); internal_error if it does
/// not parse.
Status model_config(const ModelVersion& version, inference::ModelConfigResponse* out);
/// Triton's statistics of each version (from its engine's InferenceStats), as
/// model_statistics_json has them.
void model_statistics(const std::vector<ModelRef>& versions,
                      inference::ModelStatisticsResponse* out);
void repository_index(const ModelRepository& repository, bool ready_only,
                      inference::RepositoryIndexResponse* out);

/// Checks a RepositoryModelLoad and reads its parameters into `params`: `config` (a string) and
/// the model files of its `file:<path>` parameters (bytes). UNIMPLEMENTED for a repository_name
/// (one repository is served); INVALID_ARGUMENT for an empty model name, a `config` that is not
/// a string or a file that is not bytes. Here because the message has a map field (see
/// grpc/CMakeLists.txt on sanitizer builds).
grpc::Status load_request_parameters(const inference::RepositoryModelLoadRequest& request,
                                     LoadParameters* params);
/// A RepositoryModelUnload's checks, as load_request_parameters' (`unload_dependents`, a bool, is
/// accepted: no model here depends on another).
grpc::Status check_unload_request(const inference::RepositoryModelUnloadRequest& request);
/// The requests' model_name (read here for the same reason).
const std::string& model_name_of(const inference::RepositoryModelLoadRequest& request);
const std::string& model_name_of(const inference::RepositoryModelUnloadRequest& request);

}  // namespace asyncinfer::server
