// oip_json_reader.hpp — the SAX handler that reads an inference request's JSON header
// (internal to src/server/http; decode_infer_request in oip_json_decode.cpp drives it).
//
// nlohmann's SAX interface reports each key, value, object and array as the parser reaches it,
// so no document tree is built: each input is checked against the model as soon as its name,
// datatype and shape are known, its tensor is allocated then, and every element of its "data" is
// written straight into the tensor; the first element past the declared count ends the parse
// (issue 23: a body costs its own bytes plus the tensors it declares, never a multiple of its
// element count). JSON objects are unordered: an input whose "data" comes before the fields that
// say what it is cannot be written as it is read, so the first pass skips its data and allocates
// its tensor at the end of the input, and a second pass over the same text fills only such
// inputs. BYTES elements (JSON strings) have no size known in advance: they are appended to a
// serialized buffer, over which the tensor is made when "data" ends.
//
// Thread safety: one reader per request, used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "oip_json.hpp"
#include "oip_json_internal.hpp"

namespace asyncinfer::server {

/// One JSON scalar as the SAX parser reports it.
struct Scalar {
  enum class Type : std::uint8_t { null, boolean, integer, unsigned_integer, floating, string };
  Type type = Type::null;
  bool b = false;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  double d = 0;
  const std::string* text = nullptr;  ///< the string, or a float's token as written
};

/// An input as its fields arrive.
struct PendingInput {
  std::string name;
  std::string datatype;
  Shape shape;
  Parameters parameters;
  bool has_name = false;
  bool has_datatype = false;
  bool has_shape = false;
  bool has_parameters = false;
  bool has_data = false;
  /// "data" came before the fields that say what it is: filled by the second pass.
  bool deferred = false;
  bool checked = false;  ///< check_input passed; slot is set
  InputSlot slot;
  Tensor tensor;
  /// BYTES: the elements of "data" so far, serialized (length-prefixed); the tensor is made
  /// over it when "data" ends.
  std::string serialized;
  std::size_t filled = 0;  ///< elements of "data" written so far
  std::size_t index = 0;   ///< in InferRequest::inputs
  /// Copied out of a shared memory region, its bytes counted by a lease of their own
  /// (InferInput::counted).
  bool from_shared_memory = false;
};

struct PendingOutput {
  std::string name;
  Parameters parameters;
  const TensorSpec* spec = nullptr;
  /// Its own binary_data parameter; without it the request's binary_data_output decides, which
  /// may come later in the JSON.
  std::optional<bool> binary;
  bool has_name = false;
  bool has_parameters = false;
};

/// The SAX handler (nlohmann's json_sax interface) of an inference request's JSON header. Each
/// event is checked where it arrives; the first error stops the parser (a handler that returns
/// false), and status() says what was wrong.
class RequestReader {
 public:
  /// The first pass reads everything; the second (after a first that deferred some input's
  /// data) fills only the deferred inputs and skips the rest.
  RequestReader(const ModelVersion& model, int max_depth, std::string_view binary,
                DecodedInfer& out, std::vector<PendingInput>& inputs, bool second_pass,
                const SharedMemoryManager* shared_memory)
      : model_(model),
        max_depth_(max_depth),
        binary_(binary),
        out_(out),
        inputs_(inputs),
        second_pass_(second_pass),
        shared_memory_(shared_memory) {}

  const Status& status() const noexcept { return status_; }
  std::vector<PendingOutput>& outputs() noexcept { return outputs_; }
  bool any_deferred() const noexcept { return any_deferred_; }
  /// The top-level value was not an object.
  bool not_object() const noexcept { return not_object_; }
  bool saw_inputs() const noexcept { return saw_inputs_; }
  std::size_t binary_used() const noexcept { return binary_offset_; }

  // ---- nlohmann::json_sax -----------------------------------------------------------------------
  bool null() { return scalar(Scalar{}); }
  bool boolean(bool v) {
    Scalar s;
    s.type = Scalar::Type::boolean;
    s.b = v;
    return scalar(s);
  }
  bool number_integer(json::number_integer_t v) {
    Scalar s;
    s.type = Scalar::Type::integer;
    s.i = v;
    return scalar(s);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    Scalar s;
    s.type = Scalar::Type::unsigned_integer;
    s.u = v;
    return scalar(s);
  }
  bool number_float(json::number_float_t v, const json::string_t& text) {
    Scalar s;
    s.type = Scalar::Type::floating;
    s.d = v;
    s.text = &text;
    return scalar(s);
  }
  bool string(json::string_t& v) {
    Scalar s;
    s.type = Scalar::Type::string;
    s.text = &v;
    return scalar(s);
  }
  bool binary(json::binary_t&) { return fail(invalid_argument_error("unexpected binary value")); }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k);
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann's message names the byte and what it expected.
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return fail(invalid_argument_error("malformed JSON: " + what));
  }

 private:
  /// Where the parser is: the innermost open object or array, or the value a key announced.
  enum class Ctx : std::uint8_t {
    root,     // before the top-level value
    request,  // the top-level object
    params,   // a "parameters" object (of the request, an input or an output)
    inputs,   // the "inputs" array
    input,    // one input object
    shape,    // an input's "shape" array
    data,     // an input's "data", at any nesting of arrays
    outputs,  // the "outputs" array
    output,   // one output object
    skip,     // a value that is not read (an unknown key's, or the second pass)
  };
  /// What the value after a key is.
  enum class Field : std::uint8_t {
    none,
    id,
    request_params,
    inputs,
    outputs,
    name,
    datatype,
    shape,
    data,
    input_params,
    output_params,
    parameter,  // one entry of a parameters object
    skip,
  };

  bool fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    return false;
  }
  bool fail_here(const std::string& message) { return fail(invalid_argument_error(message)); }

  Ctx top() const { return stack_.empty() ? Ctx::root : stack_.back(); }
  Parameters& current_parameters() {
    if (params_owner_ == Field::input_params) return inputs_[current_input_].parameters;
    if (params_owner_ == Field::output_params) return output_.parameters;
    return out_.request.parameters;
  }
  std::string params_where() const {
    if (params_owner_ == Field::input_params) return input_where();
    if (params_owner_ == Field::output_params) return output_where();
    return "request";
  }
  std::string input_where() const {
    const PendingInput& in = inputs_[current_input_];
    return in.has_name ? "input '" + in.name + "'"
                       : "inputs[" + std::to_string(current_input_) + "]";
  }
  std::string output_where() const {
    return output_.has_name ? "output '" + output_.name + "'"
                            : "outputs[" + std::to_string(output_count_) + "]";
  }

  bool scalar(const Scalar& s);
  bool open(bool array);
  bool close();
  bool data_element(const Scalar& s);
  bool shape_dim(const Scalar& s);
  /// Checks the current input against the model (once) and allocates its tensor.
  bool check_current_input();
  bool begin_data();
  bool end_input();
  bool end_output();

  const ModelVersion& model_;
  const int max_depth_;
  const std::string_view binary_;
  DecodedInfer& out_;
  std::vector<PendingInput>& inputs_;
  const bool second_pass_;
  const SharedMemoryManager* const shared_memory_;

  Status status_;
  std::vector<Ctx> stack_;
  Field field_ = Field::none;  ///< what the next value is (after a key)
  std::string parameter_name_;
  Field params_owner_ = Field::none;
  std::size_t skip_depth_ = 0;  ///< open objects/arrays inside a skipped value
  std::size_t data_depth_ = 0;  ///< open arrays inside "data"
  bool filling_ = false;        ///< this "data" is being written into its tensor
  std::size_t current_input_ = 0;
  std::size_t input_count_ = 0;
  PendingOutput output_;
  std::vector<PendingOutput> outputs_;
  std::size_t output_count_ = 0;
  std::size_t binary_offset_ = 0;
  bool any_deferred_ = false;
  bool not_object_ = false;
  bool saw_id_ = false;
  bool saw_params_ = false;
  bool saw_inputs_ = false;
  bool saw_outputs_ = false;
};

}  // namespace asyncinfer::server
