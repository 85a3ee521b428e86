// RequestReader (oip_json_reader.hpp): the SAX events of an inference request's JSON header,
// each checked where it arrives, and the conversion of each "data" element into its tensor's
// dtype (the JSON type must fit the datatype, and the value its range).
#include "oip_json_reader.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "model_config.hpp"

namespace asyncinfer::server {
namespace {

std::string no_json_form(std::string_view datatype) {
  return std::string(datatype) +
         " has no JSON form; send it as binary data (parameters binary_data_size, Triton's binary "
         "tensor extension)";
}

/// What a value is, for error messages ("a string", "the number 1.5").
std::string kind_of(const Scalar& s) {
  switch (s.type) {
    case Scalar::Type::string:
      return "a string";
    case Scalar::Type::boolean:
      return "a boolean";
    case Scalar::Type::floating:
      return "the number " + *s.text;
    case Scalar::Type::integer:
      return "the integer " + std::to_string(s.i);
    case Scalar::Type::unsigned_integer:
      return "the integer " + std::to_string(s.u);
    case Scalar::Type::null:
      break;
  }
  return "null";
}

Result<ParameterValue> parameter_value(const Scalar& s, std::string_view name) {
  switch (s.type) {
    case Scalar::Type::boolean:
      return ParameterValue(s.b);
    case Scalar::Type::integer:
      return ParameterValue(s.i);
    case Scalar::Type::unsigned_integer:
      return ParameterValue(s.u);
    case Scalar::Type::floating:
      return ParameterValue(s.d);
    case Scalar::Type::string:
      return ParameterValue(*s.text);
    case Scalar::Type::null:
      break;
  }
  return invalid_argument_error("parameter '" + std::string(name) +
                                "' must be a string, a number or a boolean");
}

/// One element of "data" into a tensor of T: the JSON type must fit the datatype, and the value
/// its range.
template <class T>
Status convert(const Scalar& s, T* out, std::string_view datatype) {
  using Type = Scalar::Type;
  if constexpr (std::is_same_v<T, bool>) {
    if (s.type != Type::boolean) return invalid_argument_error("BOOL needs true or false");
    *out = s.b;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (s.type == Type::integer) {
      *out = static_cast<T>(s.i);
    } else if (s.type == Type::unsigned_integer) {
      *out = static_cast<T>(s.u);
    } else if (s.type == Type::floating) {
      if constexpr (std::is_same_v<T, float>) {
        // Out of range only past what rounds to ±FLT_MAX (FLT_MAX plus half its ulp, 2^103):
        // the shortest text of FLT_MAX, 3.4028235e+38, reads back as a double just above it.
        constexpr double kFltMax = static_cast<double>(std::numeric_limits<float>::max());
        constexpr double kRoundsToMax = kFltMax + 0x1p103;
        if (std::fabs(s.d) >= kRoundsToMax) return invalid_argument_error("out of range for FP32");
        constexpr float kMax = std::numeric_limits<float>::max();
        *out = s.d > kFltMax ? kMax : s.d < -kFltMax ? -kMax : static_cast<float>(s.d);
      } else {
        *out = static_cast<T>(s.d);
      }
    } else {
      return invalid_argument_error(std::string(datatype) + " needs a number");
    }
  } else {
    auto out_of_range = [&] {
      return invalid_argument_error("out of range for " + std::string(datatype));
    };
    if (s.type == Type::unsigned_integer) {
      if (s.u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) return out_of_range();
      *out = static_cast<T>(s.u);
    } else if (s.type == Type::integer) {
      if constexpr (std::is_unsigned_v<T>) {
        if (s.i < 0 || static_cast<std::uint64_t>(s.i) > std::numeric_limits<T>::max()) {
          return out_of_range();
        }
      } else {
        if (s.i < std::numeric_limits<T>::min() || s.i > std::numeric_limits<T>::max()) {
          return out_of_range();
        }
      }
      *out = static_cast<T>(s.i);
    } else {
      return invalid_argument_error(std::string(datatype) + " needs an integer");
    }
  }
  return Status();
}

Status convert_element(const Scalar& s, Tensor& t, std::size_t i, std::string_view datatype) {
  switch (t.dtype()) {
    case DType::f32:
      return convert(s, t.data_as<float>() + i, datatype);
    case DType::f64:
      return convert(s, t.data_as<double>() + i, datatype);
    case DType::i8:
      return convert(s, t.data_as<std::int8_t>() + i, datatype);
    case DType::u8:
      return convert(s, t.data_as<std::uint8_t>() + i, datatype);
    case DType::i16:
      return convert(s, t.data_as<std::int16_t>() + i, datatype);
    case DType::u16:
      return convert(s, t.data_as<std::uint16_t>() + i, datatype);
    case DType::i32:
      return convert(s, t.data_as<std::int32_t>() + i, datatype);
    case DType::u32:
      return convert(s, t.data_as<std::uint32_t>() + i, datatype);
    case DType::i64:
      return convert(s, t.data_as<std::int64_t>() + i, datatype);
    case DType::u64:
      return convert(s, t.data_as<std::uint64_t>() + i, datatype);
    case DType::boolean:
      return convert(s, t.data_as<bool>() + i, datatype);
    case DType::bytes:
      return invalid_argument_error("BYTES needs a string");
    case DType::f16:
    case DType::bf16:
      break;
  }
  return invalid_argument_error(no_json_form(datatype));
}

}  // namespace

bool RequestReader::key(json::string_t& k) {
  auto once = [&](bool& seen, Field f, const std::string& where) {
    if (seen) return fail_here(where + ": \"" + k + "\" is given twice");
    seen = true;
    field_ = f;
    return true;
  };
  switch (top()) {
    case Ctx::request:
      if (k == "id") return once(saw_id_, Field::id, "request");
      if (k == "parameters") return once(saw_params_, Field::request_params, "request");
      if (k == "inputs") return once(saw_inputs_, Field::inputs, "request");
      if (k == "outputs") return once(saw_outputs_, Field::outputs, "request");
      field_ = Field::skip;
      return true;
    case Ctx::input: {
      PendingInput& in = inputs_[current_input_];
      if (second_pass_) {
        field_ = k == "data" && in.deferred ? Field::data : Field::skip;
        return true;
      }
      if (k == "name") return once(in.has_name, Field::name, input_where());
      if (k == "datatype") return once(in.has_datatype, Field::datatype, input_where());
      if (k == "shape") return once(in.has_shape, Field::shape, input_where());
      if (k == "parameters") return once(in.has_parameters, Field::input_params, input_where());
      if (k == "data") return once(in.has_data, Field::data, input_where());
      field_ = Field::skip;
      return true;
    }
    case Ctx::output:
      if (k == "name") return once(output_.has_name, Field::name, output_where());
      if (k == "parameters") {
        return once(output_.has_parameters, Field::output_params, output_where());
      }
      field_ = Field::skip;
      return true;
    case Ctx::params:
      parameter_name_ = k;
      field_ = Field::parameter;
      return true;
    default:
      field_ = Field::skip;  // inside a skipped object
      return true;
  }
}

bool RequestReader::scalar(const Scalar& s) {
  const Field f = field_;
  field_ = Field::none;
  switch (top()) {
    case Ctx::skip:
      return true;
    case Ctx::shape:
      return shape_dim(s);
    case Ctx::data:
      return data_element(s);
    case Ctx::inputs:
      return fail_here("inputs[" + std::to_string(input_count_) + "] must be an object");
    case Ctx::outputs:
      return fail_here("outputs[" + std::to_string(output_count_) + "] must be an object");
    case Ctx::root:
      not_object_ = true;
      return true;
    default:
      break;
  }
  if (second_pass_) return true;
  const bool is_string = s.type == Scalar::Type::string;
  switch (f) {
    case Field::id:
      if (!is_string) return fail_here("\"id\" must be a string");
      out_.request.id = *s.text;
      return true;
    case Field::request_params:
      return fail_here("request: \"parameters\" must be an object");
    case Field::input_params:
      return fail_here(input_where() + ": \"parameters\" must be an object");
    case Field::output_params:
      return fail_here(output_where() + ": \"parameters\" must be an object");
    case Field::inputs:
      return fail_here("\"inputs\" must be an array");
    case Field::outputs:
      return fail_here("\"outputs\" must be an array");
    case Field::name:
      if (top() == Ctx::output) {
        if (!is_string) return fail_here(output_where() + ": \"name\" must be a string");
        output_.name = *s.text;
        return true;
      }
      if (!is_string) return fail_here(input_where() + ": \"name\" must be a string");
      inputs_[current_input_].name = *s.text;
      return true;
    case Field::datatype:
      if (!is_string) return fail_here(input_where() + ": \"datatype\" must be a string");
      inputs_[current_input_].datatype = *s.text;
      return true;
    case Field::shape:
      return fail_here(input_where() + ": \"shape\" must be an array");
    case Field::data:
      return fail_here(input_where() + ": \"data\" must be an array");
    case Field::parameter: {
      auto v = parameter_value(s, parameter_name_);
      if (!v.ok()) return fail(v.status().with_context(params_where()));
      current_parameters().insert_or_assign(parameter_name_, std::move(*v));
      return true;
    }
    case Field::skip:
    case Field::none:
      return true;
  }
  return true;
}

bool RequestReader::open(bool array) {
  const std::size_t depth = stack_.size();
  if (static_cast<int>(depth) >= max_depth_) {
    return fail_here("JSON nested deeper than " + std::to_string(max_depth_) + " levels");
  }
  const Field f = field_;
  field_ = Field::none;
  const Ctx at = top();
  if (at == Ctx::skip) {
    ++skip_depth_;
    stack_.push_back(Ctx::skip);
    return true;
  }
  if (at == Ctx::data) {
    if (!array) {
      if (!filling_) {  // a deferred input's data is only checked by the second pass
        stack_.push_back(Ctx::skip);
        ++skip_depth_;
        return true;
      }
      // What the datatype needs, as for any other value of the wrong type.
      PendingInput& in = inputs_[current_input_];
      const Status needs = in.slot.dtype == DType::bytes
                               ? invalid_argument_error("BYTES needs a string")
                               : convert_element(Scalar{}, in.tensor, 0, in.datatype);
      return fail_here(input_where() + ": data element " + std::to_string(in.filled) +
                       " is an object; " + std::string(needs.message()));
    }
    ++data_depth_;
    stack_.push_back(Ctx::data);
    return true;
  }
  auto skip = [&] {
    ++skip_depth_;
    stack_.push_back(Ctx::skip);
    return true;
  };
  switch (at) {
    case Ctx::root:
      if (array) {
        // Read on, so that malformed or too deep JSON is reported as such first.
        not_object_ = true;
        return skip();
      }
      stack_.push_back(Ctx::request);
      return true;
    case Ctx::inputs:
      if (array) return fail_here("inputs[" + std::to_string(input_count_) + "] must be an object");
      current_input_ = input_count_++;
      if (!second_pass_) inputs_.emplace_back();
      stack_.push_back(Ctx::input);
      return true;
    case Ctx::outputs:
      if (second_pass_) return skip();
      if (array) {
        return fail_here("outputs[" + std::to_string(output_count_) + "] must be an object");
      }
      output_ = PendingOutput();
      stack_.push_back(Ctx::output);
      return true;
    case Ctx::shape:
      return fail_here(input_where() + ": shape dims must be integers, got " +
                       (array ? "an array" : "an object"));
    case Ctx::params:
      return fail_here(params_where() + ": parameter '" + parameter_name_ +
                       "' must be a string, a number or a boolean");
    default:
      break;
  }
  switch (f) {
    case Field::inputs:
      if (!array) return fail_here("\"inputs\" must be an array");
      stack_.push_back(Ctx::inputs);
      return true;
    case Field::outputs:
      if (second_pass_) return skip();
      if (!array) return fail_here("\"outputs\" must be an array");
      stack_.push_back(Ctx::outputs);
      return true;
    case Field::request_params:
    case Field::input_params:
    case Field::output_params:
      if (second_pass_) return skip();
      if (array) {
        const std::string where = f == Field::request_params ? std::string("request")
                                  : f == Field::input_params ? input_where()
                                                             : output_where();
        return fail_here(where + ": \"parameters\" must be an object");
      }
      params_owner_ = f;
      stack_.push_back(Ctx::params);
      return true;
    case Field::shape:
      if (!array) return fail_here(input_where() + ": \"shape\" must be an array");
      stack_.push_back(Ctx::shape);
      return true;
    case Field::data:
      if (!array) return fail_here(input_where() + ": \"data\" must be an array");
      data_depth_ = 1;
      stack_.push_back(Ctx::data);
      return begin_data();
    case Field::id:
      return fail_here("\"id\" must be a string");
    case Field::name:
      return fail_here((top() == Ctx::output ? output_where() : input_where()) +
                       ": \"name\" must be a string");
    case Field::datatype:
      return fail_here(input_where() + ": \"datatype\" must be a string");
    default:
      return skip();
  }
}

bool RequestReader::close() {
  const Ctx at = top();
  stack_.pop_back();
  switch (at) {
    case Ctx::skip:
      --skip_depth_;
      return true;
    case Ctx::data:
      if (--data_depth_ > 0) return true;
      if (filling_) {
        filling_ = false;
        PendingInput& in = inputs_[current_input_];
        if (in.filled != in.slot.element_count) {
          return fail_here(input_where() + ": \"data\" has " + std::to_string(in.filled) +
                           " elements, shape " + shape_to_string(in.shape) + " needs " +
                           std::to_string(in.slot.element_count));
        }
        if (in.slot.dtype == DType::bytes) {
          auto t = Tensor::from_serialized(in.shape, std::move(in.serialized));
          if (!t.ok()) return fail(t.status().with_context(input_where()));
          in.tensor = std::move(*t);
        }
      }
      return true;
    case Ctx::input:
      return second_pass_ || end_input();
    case Ctx::output:
      return end_output();
    default:
      return true;
  }
}

bool RequestReader::shape_dim(const Scalar& s) {
  Shape& shape = inputs_[current_input_].shape;
  switch (s.type) {
    case Scalar::Type::unsigned_integer:
      if (s.u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return fail_here(input_where() + ": shape dim " + std::to_string(s.u) + " is too large");
      }
      shape.push_back(static_cast<std::int64_t>(s.u));
      return true;
    case Scalar::Type::integer:
      shape.push_back(s.i);
      return true;
    case Scalar::Type::floating:
      // An integer beyond 64 bits reaches the parser as a float.
      if (std::floor(s.d) == s.d && std::fabs(s.d) >= 9.2e18) {
        return fail_here(input_where() + ": shape dim " + *s.text + " is too large");
      }
      break;
    default:
      break;
  }
  return fail_here(input_where() + ": shape dims must be integers, got " + kind_of(s));
}

bool RequestReader::check_current_input() {
  PendingInput& in = inputs_[current_input_];
  if (in.checked) return true;
  auto slot = InferenceServer::check_input(model_, in.name, in.datatype, in.shape);
  if (!slot.ok()) return fail(slot.status());
  in.slot = *slot;
  in.checked = true;
  return true;
}

bool RequestReader::begin_data() {
  PendingInput& in = inputs_[current_input_];
  if (second_pass_) {  // the first pass checked it and allocated its tensor
    filling_ = true;
    return true;
  }
  if (!in.has_name || !in.has_datatype || !in.has_shape) {
    in.deferred = true;
    any_deferred_ = true;
    filling_ = false;
    return true;
  }
  if (in.parameters.count("binary_data_size") > 0) {
    return fail_here(input_where() + ": has both \"data\" and binary_data_size");
  }
  if (!check_current_input()) return false;
  if (is_half(in.slot.dtype)) return fail_here(input_where() + ": " + no_json_form(in.datatype));
  if (in.slot.dtype == DType::bytes) {  // the tensor is made over the elements when data ends
    in.serialized.clear();
    filling_ = true;
    return true;
  }
  auto t = Tensor::empty(in.slot.dtype, in.shape);
  if (!t.ok()) return fail(t.status());
  in.tensor = std::move(*t);
  filling_ = true;
  return true;
}

bool RequestReader::data_element(const Scalar& s) {
  if (!filling_) return true;  // deferred: the second pass writes it
  PendingInput& in = inputs_[current_input_];
  if (in.filled == in.slot.element_count) {
    // The first element past the declared count ends the parse: the rest is never read.
    return fail_here(input_where() + ": \"data\" has more than " +
                     std::to_string(in.slot.element_count) + " elements, shape " +
                     shape_to_string(in.shape) + " needs " + std::to_string(in.slot.element_count));
  }
  if (in.slot.dtype == DType::bytes) {
    if (s.type != Scalar::Type::string) {
      return fail_here(input_where() + ": data element " + std::to_string(in.filled) + " is " +
                       kind_of(s) + "; BYTES needs a string");
    }
    // A JSON string of 4 GiB or more would need a body over the request size limit.
    append_serialized_element(in.serialized, *s.text);
    ++in.filled;
    return true;
  }
  Status st = convert_element(s, in.tensor, in.filled, in.datatype);
  if (!st.ok()) {
    return fail_here(input_where() + ": data element " + std::to_string(in.filled) + " is " +
                     kind_of(s) + "; " + std::string(st.message()));
  }
  ++in.filled;
  return true;
}

bool RequestReader::end_input() {
  PendingInput& in = inputs_[current_input_];
  if (!in.has_name) return fail_here(input_where() + ": \"name\" is missing");
  if (!in.has_datatype) return fail_here(input_where() + ": \"datatype\" is missing");
  if (!in.has_shape) return fail_here(input_where() + ": \"shape\" is missing");
  if (!check_current_input()) return false;
  const std::string what = input_where();
  auto size_param = in.parameters.find("binary_data_size");
  auto shm = shared_memory_parameters(in.parameters, what);
  if (!shm.ok()) return fail(shm.status());
  if (*shm) {
    // Copied out of the client's region now (Triton's system shared memory; why a copy:
    // shared_memory.hpp).
    if (in.has_data || size_param != in.parameters.end()) {
      return fail_here(what +
                       ": give one of \"data\", binary_data_size or "
                       "shared_memory_region");
    }
    if (shared_memory_ == nullptr) {
      return fail_here(what + ": shared memory is not available on this endpoint");
    }
    auto region = shared_memory_->window(**shm, what);
    if (!region.ok()) return fail(region.status());
    auto t = shared_memory_->read_tensor(*region, **shm, in.slot.dtype, in.shape, what);
    if (!t.ok()) return fail(t.status());
    in.tensor = std::move(*t);
    in.from_shared_memory = true;
  } else if (size_param != in.parameters.end()) {
    auto size = parameter_int(size_param->second, "binary_data_size", 0,
                              std::numeric_limits<std::int64_t>::max());
    if (!size.ok()) return fail(size.status().with_context(what));
    if (in.has_data) return fail_here(what + ": has both \"data\" and binary_data_size");
    const auto bytes = static_cast<std::size_t>(*size);
    const bool variable = in.slot.dtype == DType::bytes;
    if (variable ? bytes < in.slot.byte_size : bytes != in.slot.byte_size) {
      if (variable) {
        return fail_here(what + ": binary_data_size " + std::to_string(bytes) +
                         " is too small for " + std::to_string(in.slot.element_count) +
                         " BYTES elements (each needs a 4-byte length prefix)");
      }
      return fail_here(what + ": binary_data_size " + std::to_string(bytes) +
                       " does not match shape " + shape_to_string(in.shape) + " of " + in.datatype +
                       " (" + std::to_string(in.slot.byte_size) + " bytes)");
    }
    if (bytes > binary_.size() - binary_offset_) {
      return fail_here(what + ": binary_data_size " + std::to_string(bytes) +
                       " is larger than the " + std::to_string(binary_.size() - binary_offset_) +
                       " bytes of binary data left after the JSON");
    }
    if (variable) {
      auto t =
          Tensor::from_serialized(in.shape, std::string(binary_.substr(binary_offset_, bytes)));
      if (!t.ok()) return fail(t.status().with_context(what + ": binary data"));
      in.tensor = std::move(*t);
    } else {
      auto t = Tensor::empty(in.slot.dtype, in.shape);
      if (!t.ok()) return fail(t.status());
      in.tensor = std::move(*t);
      if (bytes > 0) std::memcpy(in.tensor.data(), binary_.data() + binary_offset_, bytes);
    }
    binary_offset_ += bytes;
  } else if (!in.has_data) {
    return fail_here(what +
                     ": \"data\" is missing (or give binary_data_size and send the bytes after "
                     "the JSON)");
  } else if (in.deferred && in.slot.dtype != DType::bytes) {  // BYTES: made by the second pass
    if (is_half(in.slot.dtype)) return fail_here(what + ": " + no_json_form(in.datatype));
    auto t = Tensor::empty(in.slot.dtype, in.shape);
    if (!t.ok()) return fail(t.status());
    in.tensor = std::move(*t);
  }
  in.index = out_.request.inputs.size();
  out_.request.inputs.push_back({in.name, in.tensor, in.from_shared_memory});
  return true;
}

bool RequestReader::end_output() {
  const std::string what = output_where();
  ++output_count_;
  if (!output_.has_name) return fail_here(what + ": \"name\" is missing");
  if (auto b = output_.parameters.find("binary_data"); b != output_.parameters.end()) {
    auto v = parameter_bool(b->second, "binary_data");
    if (!v.ok()) return fail(v.status());
    output_.binary = *v;
  }
  auto spec = InferenceServer::check_output(model_, output_.name);
  if (!spec.ok()) return fail(spec.status());
  output_.spec = *spec;
  outputs_.push_back(std::move(output_));
  return true;
}

}  // namespace asyncinfer::server
