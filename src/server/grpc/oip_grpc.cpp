#include "oip_grpc.hpp"

#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "model_config.hpp"

namespace asyncinfer::server {
namespace {

using inference::InferTensorContents;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

/// Outputs up to this size are copied into the message; larger ones travel as their own slice.
constexpr std::size_t kInlineOutputBytes = 8 * 1024;

Result<ParameterValue> parameter_from_proto(const inference::InferParameter& p,
                                            std::string_view name);

Result<Parameters> parameters_from_proto(
    const google::protobuf::Map<std::string, inference::InferParameter>& map) {
  Parameters out;
  for (const auto& [key, value] : map) {
    ASYNCINFER_ASSIGN_OR_RETURN(ParameterValue v, parameter_from_proto(value, key));
    out.emplace(key, std::move(v));
  }
  return out;
}

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

/// The name of the InferTensorContents field that holds `dtype`'s values.
const char* contents_field(DType dtype) {
  switch (dtype) {
    case DType::boolean:
      return "bool_contents";
    case DType::i8:
    case DType::i16:
    case DType::i32:
      return "int_contents";
    case DType::i64:
      return "int64_contents";
    case DType::u8:
    case DType::u16:
    case DType::u32:
      return "uint_contents";
    case DType::u64:
      return "uint64_contents";
    case DType::f32:
      return "fp32_contents";
    case DType::f64:
      return "fp64_contents";
    case DType::bytes:
      return "bytes_contents";
    case DType::f16:
    case DType::bf16:
      break;
  }
  return "";
}

/// Copies `src` into `out`, checking that each value fits in Dst (int_contents → INT8, ...).
template <class Dst, class Src>
Status copy_values(const google::protobuf::RepeatedField<Src>& src, Tensor& t,
                   const std::string& what, const char* field, std::string_view datatype) {
  Dst* out = t.data_as<Dst>();
  for (int i = 0; i < src.size(); ++i) {
    const Src v = src.Get(i);
    if constexpr (std::is_integral_v<Dst> && !std::is_same_v<Dst, bool> &&
                  (sizeof(Dst) < sizeof(Src))) {
      if (v < static_cast<Src>(std::numeric_limits<Dst>::min()) ||
          v > static_cast<Src>(std::numeric_limits<Dst>::max())) {
        return invalid_argument_error(what + ": contents." + field + "[" + std::to_string(i) +
                                      "] = " + std::to_string(v) + " is out of range for " +
                                      std::string(datatype));
      }
    }
    out[i] = static_cast<Dst>(v);
  }
  return Status();
}

Status fill_typed(const InferTensorContents& c, Tensor& t, const std::string& what,
                  std::string_view datatype) {
  const char* f = contents_field(t.dtype());
  switch (t.dtype()) {
    case DType::boolean:
      return copy_values<bool>(c.bool_contents(), t, what, f, datatype);
    case DType::i8:
      return copy_values<std::int8_t>(c.int_contents(), t, what, f, datatype);
    case DType::i16:
      return copy_values<std::int16_t>(c.int_contents(), t, what, f, datatype);
    case DType::i32:
      return copy_values<std::int32_t>(c.int_contents(), t, what, f, datatype);
    case DType::i64:
      return copy_values<std::int64_t>(c.int64_contents(), t, what, f, datatype);
    case DType::u8:
      return copy_values<std::uint8_t>(c.uint_contents(), t, what, f, datatype);
    case DType::u16:
      return copy_values<std::uint16_t>(c.uint_contents(), t, what, f, datatype);
    case DType::u32:
      return copy_values<std::uint32_t>(c.uint_contents(), t, what, f, datatype);
    case DType::u64:
      return copy_values<std::uint64_t>(c.uint64_contents(), t, what, f, datatype);
    case DType::f32:
      return copy_values<float>(c.fp32_contents(), t, what, f, datatype);
    case DType::f64:
      return copy_values<double>(c.fp64_contents(), t, what, f, datatype);
    case DType::bytes:  // made by bytes_tensor, not filled
    case DType::f16:
    case DType::bf16:
      break;
  }
  return internal_error(what + ": no typed contents for " + std::string(datatype));
}

/// Checks that the values are in the datatype's field only, and as many as the shape needs.
Status check_typed(const InferTensorContents& c, const InputSlot& slot,
                   std::span<const std::int64_t> shape, const std::string& what,
                   std::string_view datatype) {
  const std::string expected = contents_field(slot.dtype);
  const std::pair<const char*, int> fields[] = {
      {"bool_contents", c.bool_contents_size()},     {"int_contents", c.int_contents_size()},
      {"int64_contents", c.int64_contents_size()},   {"uint_contents", c.uint_contents_size()},
      {"uint64_contents", c.uint64_contents_size()}, {"fp32_contents", c.fp32_contents_size()},
      {"fp64_contents", c.fp64_contents_size()},     {"bytes_contents", c.bytes_contents_size()},
  };
  std::size_t count = 0;
  for (const auto& [name, n] : fields) {
    if (name == expected) {
      count = static_cast<std::size_t>(n);
    } else if (n > 0) {
      return invalid_argument_error(what + ": " + std::string(datatype) +
                                    " values go in contents." + expected + ", but contents." +
                                    name + " has " + std::to_string(n));
    }
  }
  if (count != slot.element_count) {
    return invalid_argument_error(
        what + ": contents." + expected + " has " + std::to_string(count) + " values, shape " +
        shape_to_string(shape) + " needs " + std::to_string(slot.element_count));
  }
  return Status();
}

/// A BYTES tensor of `bytes_contents`: one entry per element, without length prefixes.
Result<Tensor> bytes_tensor(const InferTensorContents& c, Shape shape, const std::string& what) {
  std::size_t total = 0;
  for (const std::string& e : c.bytes_contents()) total += 4 + e.size();
  std::string serialized;
  serialized.reserve(total);
  for (const std::string& e : c.bytes_contents()) append_serialized_element(serialized, e);
  auto t = Tensor::from_serialized(std::move(shape), std::move(serialized));
  if (!t.ok()) return t.status().with_context(what);
  return t;
}

/// A tensor over the bytes of `bytes`, which it takes (no copy).
Result<Tensor> tensor_over(std::string&& bytes, DType dtype, Shape shape) {
  auto* owned = new std::string(std::move(bytes));
  void* data = owned->data();
  const std::size_t n = owned->size();
  auto storage = std::make_shared<Storage>(data, n, Placement{}, [owned](void*) { delete owned; });
  return Tensor::from_storage(std::move(storage), dtype, std::move(shape));
}

void append_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

/// The gRPC library frees a slice from any of its threads; the tensor keeps the bytes alive.
void release_tensor(void* p) { delete static_cast<Tensor*>(p); }

Result<ParameterValue> parameter_from_proto(const inference::InferParameter& p,
                                            std::string_view name) {
  using P = inference::InferParameter;
  switch (p.parameter_choice_case()) {
    case P::kBoolParam:
      return ParameterValue(p.bool_param());
    case P::kInt64Param:
      return ParameterValue(static_cast<std::int64_t>(p.int64_param()));
    case P::kStringParam:
      return ParameterValue(p.string_param());
    case P::kDoubleParam:
      return ParameterValue(p.double_param());
    case P::kUint64Param:
      return ParameterValue(static_cast<std::uint64_t>(p.uint64_param()));
    case P::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return invalid_argument_error("parameter '" + std::string(name) +
                                "' has no value (set bool_param, int64_param, string_param, "
                                "double_param or uint64_param)");
}

Result<InferRequest> decode_infer_request(const ModelVersion& model, ModelInferRequest& message,
                                          const SharedMemoryManager& shared_memory) {
  InferRequest req;
  req.id = message.id();
  ASYNCINFER_ASSIGN_OR_RETURN(req.parameters, parameters_from_proto(message.parameters()));

  const int n_inputs = message.inputs_size();
  const int n_raw = message.raw_input_contents_size();
  const bool raw = n_raw > 0;
  // Inputs in shared memory have no raw entry (tritonclient sends none for them).
  int n_in_memory = 0;
  for (const auto& in : message.inputs()) {
    if (in.parameters().count("shared_memory_region") > 0) {
      ++n_in_memory;
    } else if (raw && in.has_contents()) {
      // Triton's words, checked before the count (its example grpc_explicit_int_content_client.py
      // matches on them).
      return invalid_argument_error(
          "contents field must not be specified when using raw_input_contents for '" + in.name() +
          "' for model '" + model.model_name + "'");
    }
  }
  if (raw && n_raw != n_inputs - n_in_memory) {
    return invalid_argument_error(
        "raw_input_contents has " + std::to_string(n_raw) + " entries but the request has " +
        std::to_string(n_inputs - n_in_memory) +
        " inputs outside shared memory; give one entry per such input, in the order of inputs");
  }
  int raw_index = 0;
  req.inputs.reserve(static_cast<std::size_t>(n_inputs));
  for (int k = 0; k < n_inputs; ++k) {
    ModelInferRequest::InferInputTensor& in = *message.mutable_inputs(k);
    if (in.name().empty()) {
      return invalid_argument_error("inputs[" + std::to_string(k) + "] has no name");
    }
    const std::string what = "input '" + in.name() + "'";
    if (in.datatype().empty()) return invalid_argument_error(what + ": datatype is missing");
    const std::span<const std::int64_t> shape(in.shape().data(),
                                              static_cast<std::size_t>(in.shape_size()));
    ASYNCINFER_ASSIGN_OR_RETURN(
        InputSlot slot, InferenceServer::check_input(model, in.name(), in.datatype(), shape));
    // Input parameters are accepted and not used (as Triton passes them to backends), but their
    // values must be well formed; shared_memory_* place the input in a client's region.
    ASYNCINFER_ASSIGN_OR_RETURN(Parameters params, parameters_from_proto(in.parameters()));
    ASYNCINFER_ASSIGN_OR_RETURN(std::optional<SharedMemoryTensor> shm,
                                shared_memory_parameters(params, what));
    Shape dims(shape.begin(), shape.end());
    if (shm) {
      if (in.has_contents()) {
        return invalid_argument_error(what + " has contents and shared_memory_region; give one");
      }
      ASYNCINFER_ASSIGN_OR_RETURN(SharedMemoryRef region, shared_memory.window(*shm, what));
      ASYNCINFER_ASSIGN_OR_RETURN(
          Tensor t, shared_memory.read_tensor(region, *shm, slot.dtype, std::move(dims), what));
      req.inputs.push_back({in.name(), std::move(t), /*counted=*/true});
      continue;
    }
    if (raw) {
      const int k_raw = raw_index++;  // no contents beside: checked above
      std::string& bytes = *message.mutable_raw_input_contents(k_raw);
      if (slot.dtype == DType::bytes) {
        // Length-prefixed elements, as in HTTP's binary form (tritonclient sends BYTES this way).
        ASYNCINFER_ASSIGN_OR_RETURN(
            Tensor t, InferenceServer::bytes_input(model, in.name(), dims, std::move(bytes)));
        req.inputs.push_back({in.name(), std::move(t)});
        continue;
      }
      if (bytes.size() != slot.byte_size) {
        return InferenceServer::byte_size_mismatch(model, in.name(), slot.byte_size, bytes.size());
      }
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, tensor_over(std::move(bytes), slot.dtype, dims));
      req.inputs.push_back({in.name(), std::move(t)});
      continue;
    }
    if (!in.has_contents() && slot.element_count == 0) {
      // A zero-element input has no values to send: protobuf drops an empty `contents` from the
      // wire, so its absence is the typed form of an empty tensor (raw contents and HTTP accept
      // it too).
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(slot.dtype, dims));
      req.inputs.push_back({in.name(), std::move(t)});
      continue;
    }
    if (!in.has_contents()) {
      return invalid_argument_error(what + ": no data; set contents." +
                                    (is_half(slot.dtype)
                                         ? std::string("(none: ") + in.datatype() + " is raw only)"
                                         : std::string(contents_field(slot.dtype))) +
                                    " or send every input in raw_input_contents");
    }
    if (is_half(slot.dtype)) {
      return invalid_argument_error(what + ": " + in.datatype() +
                                    " has no typed contents; send it in raw_input_contents");
    }
    ASYNCINFER_RETURN_IF_ERROR(check_typed(in.contents(), slot, shape, what, in.datatype()));
    if (slot.dtype == DType::bytes) {
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, bytes_tensor(in.contents(), std::move(dims), what));
      req.inputs.push_back({in.name(), std::move(t)});
      continue;
    }
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(slot.dtype, dims));
    ASYNCINFER_RETURN_IF_ERROR(fill_typed(in.contents(), t, what, in.datatype()));
    req.inputs.push_back({in.name(), std::move(t)});
  }

  req.outputs.reserve(static_cast<std::size_t>(message.outputs_size()));
  for (int k = 0; k < message.outputs_size(); ++k) {
    const ModelInferRequest::InferRequestedOutputTensor& o = message.outputs(k);
    if (o.name().empty()) {
      return invalid_argument_error("outputs[" + std::to_string(k) + "] has no name");
    }
    const std::string what = "output '" + o.name() + "'";
    ASYNCINFER_ASSIGN_OR_RETURN(Parameters params, parameters_from_proto(o.parameters()));
    ASYNCINFER_RETURN_IF_ERROR(InferenceServer::check_output(model, o.name()).status());
    ASYNCINFER_ASSIGN_OR_RETURN(std::optional<SharedMemoryTensor> shm,
                                shared_memory_parameters(params, what));
    SharedMemoryRef region;
    if (shm) {
      ASYNCINFER_ASSIGN_OR_RETURN(region, shared_memory.window(*shm, what));
    }
    req.outputs.push_back({o.name(), std::move(params), std::move(shm), std::move(region)});
  }
  return req;
}

}  // namespace

ParsedInfer parse_infer_request(grpc::ByteBuffer& raw, const InferenceServer& server,
                                const std::string& what) {
  ParsedInfer out;
  ModelInferRequest message;
  {
    grpc::ProtoBufferReader reader(&raw);
    if (!reader.status().ok()) {
      out.status =
          invalid_argument_error(what + " could not be read: " + reader.status().error_message());
      return out;
    }
    if (!message.ParseFromZeroCopyStream(&reader)) {
      out.status =
          invalid_argument_error(what + " is not a valid inference.ModelInferRequest (" +
                                 std::to_string(raw.Length()) + " bytes that do not parse as one)");
      return out;
    }
  }
  raw.Clear();
  out.well_formed = true;
  out.model_name = message.model_name();
  out.model_version = message.model_version();
  out.id = message.id();
  auto model = server.find(message.model_name(), message.model_version());
  if (!model.ok()) {
    out.status = model.status();
    return out;
  }
  out.model = *model;
  out.model_version = (*model)->version_text;
  auto request = decode_infer_request(**model, message, server.shared_memory());
  if (!request.ok()) {
    out.status = request.status();
    return out;
  }
  out.request = std::move(*request);
  return out;
}

grpc::ByteBuffer encode_infer_response(const InferResponse& response, bool stream,
                                       std::optional<bool> final_response) {
  ModelInferResponse header;
  header.set_model_name(response.model->model_name);
  header.set_model_version(response.model->version_text);
  header.set_id(response.id);
  if (final_response) {
    (*header.mutable_parameters())["triton_final_response"].set_bool_param(*final_response);
  }
  for (const InferOutput& o : response.outputs) {
    auto* out = header.add_outputs();
    out->set_name(o.spec->name);
    out->set_datatype(std::string(oip_datatype(o.tensor.dtype())));
    for (std::int64_t d : o.tensor.shape()) out->add_shape(d);
    if (o.shared_memory) {  // written into the client's region; its raw entry is empty
      auto& p = *out->mutable_parameters();
      p["shared_memory_region"].set_string_param(o.shared_memory->region);
      p["shared_memory_byte_size"].set_int64_param(
          static_cast<std::int64_t>(o.shared_memory->byte_size));
      if (o.shared_memory->offset != 0) {
        p["shared_memory_offset"].set_int64_param(
            static_cast<std::int64_t>(o.shared_memory->offset));
      }
    }
  }
  std::string head = header.SerializeAsString();
  // raw_output_contents (field 6, length-delimited): tag 0x32, length, bytes; after the other
  // fields, which protobuf allows.
  std::size_t inner = head.size();
  for (const InferOutput& o : response.outputs) {
    const std::size_t n = o.shared_memory ? 0 : o.tensor.byte_size();
    inner += 1 + varint_size(n) + n;
  }
  std::string prefix;
  if (stream) {
    // ModelStreamInferResponse.infer_response (field 2): tag 0x12, length, the message.
    prefix.push_back(static_cast<char>(0x12));
    append_varint(prefix, inner);
  }
  std::vector<grpc::Slice> slices;
  std::string pending = std::move(prefix);
  pending += head;
  for (const InferOutput& o : response.outputs) {
    const std::size_t n = o.shared_memory ? 0 : o.tensor.byte_size();
    pending.push_back(static_cast<char>(0x32));
    append_varint(pending, n);
    if (n <= kInlineOutputBytes) {
      if (n > 0) pending.append(static_cast<const char*>(o.tensor.data()), n);
      continue;
    }
    slices.emplace_back(pending);
    pending.clear();
    auto* keep = new Tensor(o.tensor);
    slices.emplace_back(keep->data(), n, &release_tensor, keep);
  }
  if (!pending.empty() || slices.empty()) slices.emplace_back(pending);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer encode_stream_error(const Status& error, std::string_view model_name,
                                     std::string_view model_version, std::string_view id) {
  inference::ModelStreamInferResponse r;
  r.set_error_message(error.message().empty() ? error.to_string() : std::string(error.message()));
  auto* ir = r.mutable_infer_response();
  ir->set_model_name(std::string(model_name));
  ir->set_model_version(std::string(model_version));
  ir->set_id(std::string(id));
  const std::string bytes = r.SerializeAsString();
  grpc::Slice s(bytes);
  return grpc::ByteBuffer(&s, 1);
}

void server_metadata(const InferenceServer& server, inference::ServerMetadataResponse* out) {
  out->set_name(server.options().name);
  out->set_version(server.options().version);
  // The server's extensions, as GET /v2 lists them (Triton lists the same set on both endpoints).
  for (std::string_view e : kServerExtensions) out->add_extensions(std::string(e));
}

void model_metadata(const ServedModel& model, const ModelVersion& shown,
                    const ModelVersion* version, inference::ModelMetadataResponse* out) {
  out->set_name(model.name);
  if (version != nullptr) {
    out->add_versions(version->version_text);
  } else {
    for (const auto& v : model.versions) {
      if (v->ready()) out->add_versions(v->version_text);
    }
  }
  out->set_platform(model.platform);
  auto add = [](const TensorSpec& s, inference::ModelMetadataResponse::TensorMetadata* t) {
    t->set_name(s.name);
    t->set_datatype(std::string(oip_datatype(s.dtype)));
    for (std::int64_t d : s.shape) t->add_shape(d);
  };
  for (const TensorSpec& s : shown.signature.inputs) add(s, out->add_inputs());
  for (const TensorSpec& s : shown.signature.outputs) add(s, out->add_outputs());
}

Status model_config(const ModelVersion& version, inference::ModelConfigResponse* out) {
  if (!out->mutable_config()->ParseFromString(version.config_binary)) {
    return internal_error("model '" + version.model_name + "' version " + version.version_text +
                          ": its applied configuration does not parse");
  }
  return Status();
}

void model_statistics(const std::vector<ModelRef>& versions,
                      inference::ModelStatisticsResponse* out) {
  auto set = [](inference::StatisticDuration* d, const DurationStat& s) {
    d->set_count(s.count);
    d->set_ns(s.ns);
  };
  for (const ModelRef& v : versions) {
    const InferenceStats s = v->statistics();
    inference::ModelStatistics* m = out->add_model_stats();
    m->set_name(v->model_name);
    m->set_version(v->version_text);
    m->set_last_inference(static_cast<std::uint64_t>(s.last_inference_ms));
    m->set_inference_count(s.inference_count);
    m->set_execution_count(s.execution_count);
    inference::InferStatistics* i = m->mutable_inference_stats();
    set(i->mutable_success(), s.success);
    set(i->mutable_fail(), s.fail);
    set(i->mutable_queue(), s.queue);
    set(i->mutable_compute_input(), s.compute_input);
    set(i->mutable_compute_infer(), s.compute_infer);
    set(i->mutable_compute_output(), s.compute_output);
    set(i->mutable_cache_hit(), s.cache_hit);
    set(i->mutable_cache_miss(), s.cache_miss);
    for (const BatchSizeStats& b : s.batch_stats) {
      inference::InferBatchStatistics* e = m->add_batch_stats();
      e->set_batch_size(static_cast<std::uint64_t>(b.batch_size));
      set(e->mutable_compute_input(), b.compute_input);
      set(e->mutable_compute_infer(), b.compute_infer);
      set(e->mutable_compute_output(), b.compute_output);
    }
  }
}

void repository_index(const ModelRepository& repository, bool ready_only,
                      inference::RepositoryIndexResponse* out) {
  for (const IndexEntry& e : repository.snapshot()->index(ready_only)) {
    auto* m = out->add_models();
    m->set_name(e.name);
    m->set_version(e.version);
    m->set_state(std::string(to_string(e.state)));
    m->set_reason(e.reason);
  }
}

namespace {

grpc::Status check_repository_call(const std::string& repository, const std::string& model) {
  if (!repository.empty()) {
    return grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        "repository_name '" + repository + "': asyncinfer serves one repository; leave it empty");
  }
  if (model.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "model_name is empty");
  return grpc::Status::OK;
}

}  // namespace

grpc::Status load_request_parameters(const inference::RepositoryModelLoadRequest& request,
                                     LoadParameters* params) {
  if (grpc::Status s = check_repository_call(request.repository_name(), request.model_name());
      !s.ok()) {
    return s;
  }
  for (const auto& [key, value] : request.parameters()) {
    if (key.rfind("file:", 0) == 0) {
      if (value.parameter_choice_case() != inference::ModelRepositoryParameter::kBytesParam) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "parameter '" + key + "' must be a bytes_param (the file's contents)");
      }
      params->files.emplace_back(key.substr(5), value.bytes_param());
      continue;
    }
    if (key == "config") {
      if (value.parameter_choice_case() != inference::ModelRepositoryParameter::kStringParam) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "parameter 'config' must be a string_param (a ModelConfig in JSON)");
      }
      params->config = value.string_param();
    }
  }
  return grpc::Status::OK;
}

grpc::Status check_unload_request(const inference::RepositoryModelUnloadRequest& request) {
  if (grpc::Status s = check_repository_call(request.repository_name(), request.model_name());
      !s.ok()) {
    return s;
  }
  for (const auto& [key, value] : request.parameters()) {
    if (key == "unload_dependents" &&
        value.parameter_choice_case() != inference::ModelRepositoryParameter::kBoolParam) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "parameter 'unload_dependents' must be a bool_param");
    }
  }
  return grpc::Status::OK;
}

const std::string& model_name_of(const inference::RepositoryModelLoadRequest& request) {
  return request.model_name();
}
const std::string& model_name_of(const inference::RepositoryModelUnloadRequest& request) {
  return request.model_name();
}

}  // namespace asyncinfer::server
