// Decoding an inference request of the HTTP/REST protocol (decode_infer_request, oip_json.hpp):
// the JSON header read by RequestReader (oip_json_reader.hpp: SAX, each input written into its
// tensor as it is parsed), Triton's binary tensor data after the JSON, a raw binary body for a
// single-input model, and the outputs asked for and in which form.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "model_config.hpp"
#include "oip_json.hpp"
#include "oip_json_reader.hpp"

namespace asyncinfer::server {
namespace {

/// Inference-Header-Content-Length: 0 — the body is the only input's raw bytes, with Triton's
/// rules and messages (Triton core's InferenceRequest::Normalize, checked by Triton's
/// qa/L0_http/http_test.py): the model has one input; its shape is the configuration's dims,
/// after a batch dim of 1 for a batched model, with at most one variable dim, deduced from the
/// body's size; a BYTES input must have the shape [1], and the body is its one element.
Result<DecodedInfer> decode_raw(const ModelVersion& model, std::string_view body) {
  const ModelSignature& sig = model.signature;
  if (sig.inputs.size() != 1) {
    return invalid_argument_error(
        "Raw request must only have 1 input (found 1) to be deduced but got " +
        std::to_string(sig.inputs.size()) + " inputs in '" + model.model_name +
        "' model configuration");
  }
  const TensorSpec& spec = sig.inputs[0];
  Shape shape = spec.shape;  // the batch dim first for a batched model
  std::optional<std::size_t> variable;
  std::size_t elements = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (sig.batched && i == 0) {
      shape[0] = 1;
    } else if (shape[i] < 0) {
      if (variable) {
        return invalid_argument_error("The shape of the raw input '" + spec.name +
                                      "' can not be deduced because there are more than one "
                                      "variable-sized dimension");
      }
      variable = i;
    } else {
      elements *= static_cast<std::size_t>(shape[i]);
    }
  }
  Tensor t;
  if (spec.dtype == DType::bytes) {
    if (variable || elements != 1) {
      return invalid_argument_error("For BYTE datatype raw input '" + spec.name +
                                    "', the model must have input shape [1]");
    }
    if (body.size() > std::numeric_limits<std::uint32_t>::max()) {
      return invalid_argument_error("raw input '" + spec.name +
                                    "': " + std::to_string(body.size()) +
                                    " bytes is more than one BYTES element can hold (4 GiB)");
    }
    // One element: Triton's serialization, a 4-byte little-endian length, then the bytes.
    std::string serialized(4 + body.size(), '\0');
    const auto n = static_cast<std::uint32_t>(body.size());
    for (int b = 0; b < 4; ++b)
      serialized[static_cast<std::size_t>(b)] = static_cast<char>(n >> (8 * b));
    if (!body.empty()) std::memcpy(serialized.data() + 4, body.data(), body.size());
    ASYNCINFER_ASSIGN_OR_RETURN(
        [[maybe_unused]] InputSlot slot,
        InferenceServer::check_input(model, spec.name, oip_datatype(spec.dtype), shape));
    ASYNCINFER_ASSIGN_OR_RETURN(t, Tensor::from_serialized(shape, std::move(serialized)));
  } else {
    const std::size_t row = elements * dtype_size(spec.dtype);
    if (variable) shape[*variable] = row == 0 ? 0 : static_cast<std::int64_t>(body.size() / row);
    ASYNCINFER_ASSIGN_OR_RETURN(
        InputSlot slot,
        InferenceServer::check_input(model, spec.name, oip_datatype(spec.dtype), shape));
    if (body.size() != slot.byte_size) {
      return InferenceServer::byte_size_mismatch(model, spec.name, slot.byte_size, body.size());
    }
    ASYNCINFER_ASSIGN_OR_RETURN(t, Tensor::empty(slot.dtype, shape));
    if (!body.empty()) std::memcpy(t.data(), body.data(), body.size());
  }
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
      if (in.deferred && in.slot.dtype == DType::bytes)
        out.request.inputs[in.index].tensor = in.tensor;
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
