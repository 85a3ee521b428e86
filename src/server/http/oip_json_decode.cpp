// Decoding an inference request of the HTTP/REST protocol (decode_infer_request, oip_json.hpp):
// the JSON header's fields, each input checked against the model before its tensor is allocated,
// its data from JSON or — Triton's binary tensor extension — from the bytes after the JSON, a raw
// binary body for a single-input model, and the outputs asked for and in which form.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "model_config.hpp"
#include "oip_json.hpp"
#include "oip_json_internal.hpp"

namespace asyncinfer::server {
namespace {

Result<ParameterValue> parameter_value(const json& j, std::string_view name) {
  switch (j.type()) {
    case json::value_t::boolean:
      return ParameterValue(j.get<bool>());
    case json::value_t::number_integer:
      return ParameterValue(j.get<std::int64_t>());
    case json::value_t::number_unsigned:
      return ParameterValue(j.get<std::uint64_t>());
    case json::value_t::number_float:
      return ParameterValue(j.get<double>());
    case json::value_t::string:
      return ParameterValue(j.get<std::string>());
    default:
      return invalid_argument_error("parameter '" + std::string(name) +
                                    "' must be a string, a number or a boolean");
  }
}

Result<Parameters> parameters_of(const json& parent, std::string_view where) {
  Parameters out;
  auto it = parent.find("parameters");
  if (it == parent.end()) return out;
  if (!it->is_object()) {
    return invalid_argument_error(std::string(where) + ": \"parameters\" must be an object");
  }
  for (auto p = it->begin(); p != it->end(); ++p) {
    auto v = parameter_value(p.value(), p.key());
    if (!v.ok()) return v.status().with_context(where);
    out.emplace(p.key(), std::move(*v));
  }
  return out;
}

Result<std::string> string_field(const json& obj, const char* key, std::string_view where,
                                 bool required) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (!required) return std::string();
    return invalid_argument_error(std::string(where) + ": \"" + key + "\" is missing");
  }
  if (!it->is_string()) {
    return invalid_argument_error(std::string(where) + ": \"" + key + "\" must be a string");
  }
  return it->get<std::string>();
}

/// Scalars under `j` (nested arrays flatten, row-major).
std::size_t count_elements(const json& j) {
  if (!j.is_array()) return 1;
  std::size_t n = 0;
  for (const json& e : j) n += count_elements(e);
  return n;
}

std::string json_kind(const json& j) {
  switch (j.type()) {
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_float:
      return "the number " + j.dump();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "the integer " + j.dump();
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    default:
      return "a value of another kind";
  }
}

template <class T>
Status convert(const json& j, T* out, std::string_view datatype) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) return invalid_argument_error("BOOL needs true or false");
    *out = j.get<bool>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) return invalid_argument_error(std::string(datatype) + " needs a number");
    const double v = j.get<double>();
    if (std::is_same_v<T, float> && std::isfinite(v) &&
        std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
      return invalid_argument_error("out of range for FP32");
    }
    *out = static_cast<T>(v);
  } else {
    if (j.is_number_unsigned()) {
      const std::uint64_t v = j.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
        return invalid_argument_error("out of range for " + std::string(datatype));
      }
      *out = static_cast<T>(v);
    } else if (j.is_number_integer()) {
      const std::int64_t v = j.get<std::int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (v < 0) return invalid_argument_error("out of range for " + std::string(datatype));
        if (static_cast<std::uint64_t>(v) > std::numeric_limits<T>::max()) {
          return invalid_argument_error("out of range for " + std::string(datatype));
        }
      } else {
        if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
          return invalid_argument_error("out of range for " + std::string(datatype));
        }
      }
      *out = static_cast<T>(v);
    } else {
      return invalid_argument_error(std::string(datatype) + " needs an integer");
    }
  }
  return Status();
}

template <class T>
Status fill(const json& j, T* out, std::size_t& i, std::string_view datatype,
            const std::string& what) {
  if (j.is_array()) {
    for (const json& e : j) ASYNCINFER_RETURN_IF_ERROR(fill(e, out, i, datatype, what));
    return Status();
  }
  Status s = convert<T>(j, out + i, datatype);
  if (!s.ok()) {
    return invalid_argument_error(what + ": data element " + std::to_string(i) + " is " +
                                  json_kind(j) + "; " + std::string(s.message()));
  }
  ++i;
  return Status();
}

Status fill_tensor(const json& data, Tensor& t, std::string_view datatype,
                   const std::string& what) {
  std::size_t i = 0;
  switch (t.dtype()) {
    case DType::f32:
      return fill(data, t.data_as<float>(), i, datatype, what);
    case DType::f64:
      return fill(data, t.data_as<double>(), i, datatype, what);
    case DType::i8:
      return fill(data, t.data_as<std::int8_t>(), i, datatype, what);
    case DType::u8:
      return fill(data, t.data_as<std::uint8_t>(), i, datatype, what);
    case DType::i16:
      return fill(data, t.data_as<std::int16_t>(), i, datatype, what);
    case DType::u16:
      return fill(data, t.data_as<std::uint16_t>(), i, datatype, what);
    case DType::i32:
      return fill(data, t.data_as<std::int32_t>(), i, datatype, what);
    case DType::u32:
      return fill(data, t.data_as<std::uint32_t>(), i, datatype, what);
    case DType::i64:
      return fill(data, t.data_as<std::int64_t>(), i, datatype, what);
    case DType::u64:
      return fill(data, t.data_as<std::uint64_t>(), i, datatype, what);
    case DType::boolean:
      return fill(data, t.data_as<bool>(), i, datatype, what);
    case DType::f16:
    case DType::bf16:
      break;
  }
  return invalid_argument_error(what + ": " + std::string(datatype) +
                                " has no JSON form; send it as binary data (parameters "
                                "binary_data_size, Triton's binary tensor extension)");
}

Result<Shape> shape_of(const json& in, const std::string& what) {
  auto it = in.find("shape");
  if (it == in.end()) return invalid_argument_error(what + ": \"shape\" is missing");
  if (!it->is_array()) return invalid_argument_error(what + ": \"shape\" must be an array");
  Shape shape;
  shape.reserve(it->size());
  for (const json& d : *it) {
    if (d.is_number_unsigned()) {
      if (d.get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return invalid_argument_error(what + ": shape dim " + d.dump() + " is too large");
      }
      shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
    } else if (d.is_number_integer()) {
      shape.push_back(d.get<std::int64_t>());
    } else if (d.is_number_float() && std::floor(d.get<double>()) == d.get<double>() &&
               std::fabs(d.get<double>()) >= 9.2e18) {
      // An integer beyond 64 bits reaches the parser as a float.
      return invalid_argument_error(what + ": shape dim " + d.dump() + " is too large");
    } else {
      return invalid_argument_error(what + ": shape dims must be integers, got " + json_kind(d));
    }
  }
  return shape;
}

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

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
                                          std::optional<std::size_t> header_length, int max_depth) {
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
  ASYNCINFER_ASSIGN_OR_RETURN(json j, parse_json(json_text, max_depth));
  if (!j.is_object()) return invalid_argument_error("the request body must be a JSON object");

  DecodedInfer out;
  InferRequest& req = out.request;
  if (auto it = j.find("id"); it != j.end()) {
    if (!it->is_string()) return invalid_argument_error("\"id\" must be a string");
    req.id = it->get<std::string>();
  }
  ASYNCINFER_ASSIGN_OR_RETURN(req.parameters, parameters_of(j, "request"));
  if (auto it = req.parameters.find("binary_data_output"); it != req.parameters.end()) {
    ASYNCINFER_ASSIGN_OR_RETURN(out.binary_default,
                                parameter_bool(it->second, "binary_data_output"));
  }

  auto inputs = j.find("inputs");
  if (inputs == j.end()) return invalid_argument_error("\"inputs\" is missing");
  if (!inputs->is_array()) return invalid_argument_error("\"inputs\" must be an array");
  std::size_t binary_offset = 0;
  for (std::size_t k = 0; k < inputs->size(); ++k) {
    const json& in = (*inputs)[k];
    if (!in.is_object()) {
      return invalid_argument_error("inputs[" + std::to_string(k) + "] must be an object");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(
        std::string name, string_field(in, "name", "inputs[" + std::to_string(k) + "]", true));
    const std::string what = "input '" + name + "'";
    ASYNCINFER_ASSIGN_OR_RETURN(std::string datatype, string_field(in, "datatype", what, true));
    ASYNCINFER_ASSIGN_OR_RETURN(Shape shape, shape_of(in, what));
    ASYNCINFER_ASSIGN_OR_RETURN(InputSlot slot,
                                InferenceServer::check_input(model, name, datatype, shape));
    ASYNCINFER_ASSIGN_OR_RETURN(Parameters params, parameters_of(in, what));
    auto data = in.find("data");
    auto size_param = params.find("binary_data_size");
    if (size_param != params.end()) {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t size,
                                  parameter_int(size_param->second, "binary_data_size", 0,
                                                std::numeric_limits<std::int64_t>::max()));
      if (data != in.end()) {
        return invalid_argument_error(what + ": has both \"data\" and binary_data_size");
      }
      const auto bytes = static_cast<std::size_t>(size);
      if (bytes != slot.byte_size) {
        return invalid_argument_error(what + ": binary_data_size " + std::to_string(bytes) +
                                      " does not match shape " + shape_to_string(shape) + " of " +
                                      datatype + " (" + std::to_string(slot.byte_size) + " bytes)");
      }
      if (bytes > binary.size() - binary_offset) {
        return invalid_argument_error(what + ": binary_data_size " + std::to_string(bytes) +
                                      " is larger than the " +
                                      std::to_string(binary.size() - binary_offset) +
                                      " bytes of binary data left after the JSON");
      }
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(slot.dtype, std::move(shape)));
      if (bytes > 0) std::memcpy(t.data(), binary.data() + binary_offset, bytes);
      binary_offset += bytes;
      req.inputs.push_back({std::move(name), std::move(t)});
      continue;
    }
    if (data == in.end()) {
      return invalid_argument_error(what +
                                    ": \"data\" is missing (or give binary_data_size and "
                                    "send the bytes after the JSON)");
    }
    if (is_half(slot.dtype)) {
      return invalid_argument_error(what + ": " + datatype +
                                    " has no JSON form; send it as binary data (parameters "
                                    "binary_data_size, Triton's binary tensor extension)");
    }
    if (!data->is_array()) return invalid_argument_error(what + ": \"data\" must be an array");
    const std::size_t n = count_elements(*data);
    if (n != slot.element_count) {
      return invalid_argument_error(what + ": \"data\" has " + std::to_string(n) +
                                    " elements, shape " + shape_to_string(shape) + " needs " +
                                    std::to_string(slot.element_count));
    }
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(slot.dtype, std::move(shape)));
    ASYNCINFER_RETURN_IF_ERROR(fill_tensor(*data, t, datatype, what));
    req.inputs.push_back({std::move(name), std::move(t)});
  }
  if (binary_offset != binary.size()) {
    return invalid_argument_error(std::to_string(binary.size()) +
                                  " bytes of binary data follow the JSON, but the inputs' "
                                  "binary_data_size add up to " +
                                  std::to_string(binary_offset));
  }

  if (auto outs = j.find("outputs"); outs != j.end()) {
    if (!outs->is_array()) return invalid_argument_error("\"outputs\" must be an array");
    for (std::size_t k = 0; k < outs->size(); ++k) {
      const json& o = (*outs)[k];
      if (!o.is_object()) {
        return invalid_argument_error("outputs[" + std::to_string(k) + "] must be an object");
      }
      ASYNCINFER_ASSIGN_OR_RETURN(
          std::string name, string_field(o, "name", "outputs[" + std::to_string(k) + "]", true));
      const std::string what = "output '" + name + "'";
      ASYNCINFER_ASSIGN_OR_RETURN(Parameters params, parameters_of(o, what));
      bool binary_out = out.binary_default;
      if (auto b = params.find("binary_data"); b != params.end()) {
        ASYNCINFER_ASSIGN_OR_RETURN(binary_out, parameter_bool(b->second, "binary_data"));
      }
      if (params.count("classification")) {
        return invalid_argument_error(what + ": the classification extension is not supported");
      }
      ASYNCINFER_ASSIGN_OR_RETURN(const TensorSpec* spec,
                                  InferenceServer::check_output(model, name));
      if (!binary_out && is_half(spec->dtype)) {
        return invalid_argument_error(what + " is " + std::string(oip_datatype(spec->dtype)) +
                                      ", which has no JSON form; ask for it in binary "
                                      "(parameters {\"binary_data\": true})");
      }
      req.outputs.push_back({std::move(name), std::move(params)});
      out.output_binary.push_back(binary_out);
    }
  }
  if (req.outputs.empty() && !out.binary_default) {
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
