// Decoding an inference request of the HTTP/REST protocol (decode_infer_request, oip_json.hpp):
// the JSON header read by RequestReader (oip_json_reader.hpp: SAX, each input written into its
// tensor as it is parsed), Triton's binary tensor data after the JSON, a raw binary body for a
// single-input model, and the outputs asked for and in which form.
#include <cstring>
#include <string>
#include <vector>

#include "model_config.hpp"
#include "oip_json.hpp"
#include "oip_json_reader.hpp"

namespace asyncinfer::server {
namespace {

Result<DecodedInfer> decode_raw(const ModelVersion& model, std::string_view body) {
  // Inference-Header-Content-Length: 0 — the body is the only input's raw bytes.
  const ModelSignature& sig = model.signature;
  if (sig.inputs.size() != 1) {
    return invalid_argument_error(
        "Inference-Header-Content-Length 0 (raw binary request) needs a "
        "model with one input; '" +
        model.model_name + "' has " + std::to_string(sig.inputs.size()));
  }
  const TensorSpec& spec = sig.inputs[0];
  if (spec.dtype == DType::bytes) {
    return invalid_argument_error("raw binary request: input '" + spec.name +
                                  "' is BYTES, whose element count the body does not give; send "
                                  "a JSON header with its shape");
  }
  Shape shape = spec.shape;
  std::size_t row = dtype_size(spec.dtype);
  for (std::size_t i = sig.batched ? 1 : 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return invalid_argument_error("raw binary request: input '" + spec.name +
                                    "' has a variable "
                                    "dim " +
                                    std::to_string(i) + "; send a JSON header with its shape");
    }
    row *= static_cast<std::size_t>(shape[i]);
  }
  if (sig.batched) {
    if (row == 0 || body.size() % row != 0 || body.empty()) {
      return invalid_argument_error("raw binary request: " + std::to_string(body.size()) +
                                    " bytes is not a whole number of rows of " +
                                    std::to_string(row) + " bytes for input '" + spec.name + "'");
    }
    shape[0] = static_cast<std::int64_t>(body.size() / row);
  } else if (body.size() != row) {
    return invalid_argument_error("raw binary request: " + std::to_string(body.size()) +
                                  " bytes, input '" + spec.name + "' needs " + std::to_string(row));
  }
  ASYNCINFER_ASSIGN_OR_RETURN(
      InputSlot slot,
      InferenceServer::check_input(model, spec.name, oip_datatype(spec.dtype), shape));
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(slot.dtype, shape));
  if (!body.empty()) std::memcpy(t.data(), body.data(), body.size());
  DecodedInfer out;
  out.request.inputs.push_back({spec.name, std::move(t)});
  out.binary_default = true;  // a raw request gets raw outputs
  return out;
}

}  // namespace

Result<DecodedInfer> decode_infer_request(const ModelVersion& model, std::string_view body,
                                          std::optional<std::size_t> header_length, int max_depth,
                                          const SharedMemoryManager* shared_memory) {
  std::string_view json_text = body;
  std::string_view binary;
  if (header_length) {
    if (*header_length > body.size()) {
      return invalid_argument_error("Inference-Header-Content-Length " +
                                    std::to_string(*header_length) + " is larger than the body (" +
                                    std::to_string(body.size()) + " bytes)");
    }
    if (*header_length == 0) return decode_raw(model, body);
    json_text = body.substr(0, *header_length);
    binary = body.substr(*header_length);
  }
  if (json_text.empty()) return invalid_argument_error("empty request body: expected JSON");

  DecodedInfer out;
  std::vector<PendingInput> inputs;
  RequestReader first(model, max_depth, binary, out, inputs, false, shared_memory);
  if (!json::sax_parse(json_text.begin(), json_text.end(), &first)) {
    Status s = first.status();
    return s.ok() ? invalid_argument_error("malformed JSON") : s;
  }
  if (first.not_object()) return invalid_argument_error("the request body must be a JSON object");
  if (!first.saw_inputs()) return invalid_argument_error("\"inputs\" is missing");
  if (first.binary_used() != binary.size()) {
    return invalid_argument_error(std::to_string(binary.size()) +
                                  " bytes of binary data follow the JSON, but the inputs' "
                                  "binary_data_size add up to " +
                                  std::to_string(first.binary_used()));
  }
  if (first.any_deferred()) {
    // Some input's "data" came before its name, datatype or shape: its tensor was allocated at
    // the end of the input; this pass writes it (and checks its elements).
    DecodedInfer ignored;
    RequestReader second(model, max_depth, binary, ignored, inputs, true, shared_memory);
    if (!json::sax_parse(json_text.begin(), json_text.end(), &second)) return second.status();
    for (const PendingInput& in : inputs) {  // BYTES tensors were made over the second pass's data
      if (in.deferred && in.slot.dtype == DType::bytes) out.request.inputs[in.index].tensor = in.tensor;
    }
  }
  if (auto it = out.request.parameters.find("binary_data_output");
      it != out.request.parameters.end()) {
    ASYNCINFER_ASSIGN_OR_RETURN(out.binary_default,
                                parameter_bool(it->second, "binary_data_output"));
  }
  for (PendingOutput& o : first.outputs()) {
    const bool binary_out = o.binary.value_or(out.binary_default);
    auto shm = shared_memory_parameters(o.parameters, "output '" + o.name + "'");
    if (!shm.ok()) return shm.status();
    if (*shm) {
      if (o.binary.value_or(false)) {
        return invalid_argument_error("output '" + o.name +
                                      "' asks for binary_data and for shared memory; it can be "
                                      "sent one way only");
      }
      if (shared_memory == nullptr) {
        return invalid_argument_error("output '" + o.name +
                                      "': shared memory is not available on this endpoint");
      }
      auto region = shared_memory->window(**shm, "output '" + o.name + "'");
      if (!region.ok()) return region.status();
      RequestedOutput r{std::move(o.name), std::move(o.parameters), std::move(*shm),
                        std::move(*region)};
      out.request.outputs.push_back(std::move(r));
      out.output_binary.push_back(false);
      continue;
    }
    if (!binary_out && is_half(o.spec->dtype)) {
      return invalid_argument_error("output '" + o.name + "' is " +
                                    std::string(oip_datatype(o.spec->dtype)) +
                                    ", which has no JSON form; ask for it in binary (parameters "
                                    "{\"binary_data\": true})");
    }
    out.request.outputs.push_back({std::move(o.name), std::move(o.parameters), {}, {}});
    out.output_binary.push_back(binary_out);
  }
  if (out.request.outputs.empty() && !out.binary_default) {
    for (const TensorSpec& s : model.signature.outputs) {
      if (is_half(s.dtype)) {
        return invalid_argument_error("output '" + s.name + "' is " +
                                      std::string(oip_datatype(s.dtype)) +
                                      ", which has no JSON form; ask for outputs in binary "
                                      "(parameters {\"binary_data_output\": true})");
      }
    }
  }
  return out;
}

}  // namespace asyncinfer::server
