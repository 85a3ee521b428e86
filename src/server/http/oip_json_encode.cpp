// Encoding an inference response of the HTTP/REST protocol (encode_infer_response,
// oip_json.hpp): the JSON written directly (shortest round-trip numbers, FP32 at float precision,
// NaN and infinity as null), and the outputs asked for in binary appended after it, in output
// order (Triton's binary tensor extension).
#include <charconv>
#include <cmath>
#include <string>

#include "model_config.hpp"
#include "oip_json.hpp"
#include "oip_json_internal.hpp"

namespace asyncinfer::server {
namespace {

template <class T>
void append_number(std::string& out, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    out += v ? "true" : "false";
  } else {
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(v)) {
        out += "null";  // JSON has no NaN or infinity
        return;
      }
    }
    // Shortest text that reads back to the same value (for FP32: float precision, not
    // double's).
    char buf[64];
    auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, p);
  }
}

template <class T>
void append_data(std::string& out, const Tensor& t) {
  const T* p = static_cast<const T*>(t.data());
  const std::size_t n = t.numel();
  out += '[';
  for (std::size_t i = 0; i < n; ++i) {
    if (i) out += ',';
    append_number(out, p[i]);
  }
  out += ']';
}

void append_tensor_json(std::string& out, const Tensor& t) {
  switch (t.dtype()) {
    case DType::f32:
      return append_data<float>(out, t);
    case DType::f64:
      return append_data<double>(out, t);
    case DType::i8:
      return append_data<std::int8_t>(out, t);
    case DType::u8:
      return append_data<std::uint8_t>(out, t);
    case DType::i16:
      return append_data<std::int16_t>(out, t);
    case DType::u16:
      return append_data<std::uint16_t>(out, t);
    case DType::i32:
      return append_data<std::int32_t>(out, t);
    case DType::u32:
      return append_data<std::uint32_t>(out, t);
    case DType::i64:
      return append_data<std::int64_t>(out, t);
    case DType::u64:
      return append_data<std::uint64_t>(out, t);
    case DType::boolean:
      return append_data<bool>(out, t);
    case DType::bytes: {
      // The engine checked the elements (check_outputs). JSON carries text: bytes that are not
      // UTF-8 come out as U+FFFD; binary_data keeps them exact.
      auto elements = t.string_elements();
      out += '[';
      if (elements.ok()) {
        for (std::size_t i = 0; i < elements->size(); ++i) {
          if (i) out += ',';
          out += quote((*elements)[i]);
        }
      }
      out += ']';
      return;
    }
    case DType::f16:
    case DType::bf16:
      out += "[]";
      return;  // never reached: refused before submit
  }
}

void append_shape(std::string& out, const Shape& shape) {
  out += '[';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(shape[i]);
  }
  out += ']';
}

}  // namespace

EncodedResponse encode_infer_response(const InferResponse& response, const DecodedInfer& request) {
  // Written directly rather than through a JSON DOM: a DOM node per element would double the
  // cost of large outputs, and would print FP32 values with double's digits.
  EncodedResponse enc;
  std::string& s = enc.body;
  std::size_t binary_bytes = 0;
  std::size_t json_estimate = 128;
  for (const InferOutput& o : response.outputs) {
    const bool bin =
        !o.shared_memory &&
        (o.requested >= 0 ? request.output_binary[static_cast<std::size_t>(o.requested)]
                          : request.binary_default);
    if (bin) {
      binary_bytes += o.tensor.byte_size();
    } else {
      json_estimate += o.tensor.numel() * 12 + o.tensor.byte_size();
    }
  }
  s.reserve(json_estimate + binary_bytes);
  s += "{\"model_name\":";
  s += quote(response.model->model_name);
  s += ",\"model_version\":";
  s += quote(response.model->version_text);
  if (!response.id.empty()) {
    s += ",\"id\":";
    s += quote(response.id);
  }
  s += ",\"outputs\":[";
  bool first = true;
  for (const InferOutput& o : response.outputs) {
    const bool bin =
        !o.shared_memory &&
        (o.requested >= 0 ? request.output_binary[static_cast<std::size_t>(o.requested)]
                          : request.binary_default);
    if (!first) s += ',';
    first = false;
    s += "{\"name\":";
    s += quote(o.spec->name);
    s += ",\"datatype\":\"";
    s += oip_datatype(o.tensor.dtype());
    s += "\",\"shape\":";
    append_shape(s, o.tensor.shape());
    if (o.shared_memory) {
      // Written into the client's region: as Triton's, the entry has no data and no
      // parameters (tritonclient and perf_analyzer read a "parameters" object on an output as
      // binary data and fail without its "binary_data_size").
      s += '}';
    } else if (bin) {
      s += ",\"parameters\":{\"binary_data_size\":";
      s += std::to_string(o.tensor.byte_size());
      s += "}}";
      enc.binary = true;
    } else {
      s += ",\"data\":";
      append_tensor_json(s, o.tensor);
      s += '}';
    }
  }
  s += "]}";
  enc.json_size = s.size();
  for (const InferOutput& o : response.outputs) {
    const bool bin =
        !o.shared_memory &&
        (o.requested >= 0 ? request.output_binary[static_cast<std::size_t>(o.requested)]
                          : request.binary_default);
    if (bin && o.tensor.byte_size() > 0) {
      s.append(static_cast<const char*>(o.tensor.data()), o.tensor.byte_size());
    }
  }
  return enc;
}

}  // namespace asyncinfer::server
