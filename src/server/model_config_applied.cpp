// The configuration a loaded version really runs with (model_config.hpp, applied_model_config):
// the config.pbtxt as parsed, with the defaults Triton's core fills in (name, backend,
// version_policy, instance_group, the inputs and outputs of a model whose config lists none,
// model_transaction_policy, response_cache) and the device the server chose, printed as Triton's
// model-configuration extension prints it: libprotobuf's JSON printer with the proto field names
// and every scalar, the 64-bit integers turned back into JSON numbers.
// Sources: triton-inference-server/core src/model_config_utils.cc (NormalizeModelConfig, the
// instance group names "<model>_<index>"), server docs/protocol/extension_model_configuration.md.
#include "model_config.pb.h"

#include <google/protobuf/util/json_util.h>

#include <nlohmann/json.hpp>

#include <charconv>

#include "model_config_internal.hpp"

namespace asyncinfer::server {
namespace {

inference::DataType config_type(DType dtype) {
  switch (dtype) {
    case DType::boolean:
      return inference::TYPE_BOOL;
    case DType::u8:
      return inference::TYPE_UINT8;
    case DType::u16:
      return inference::TYPE_UINT16;
    case DType::u32:
      return inference::TYPE_UINT32;
    case DType::u64:
      return inference::TYPE_UINT64;
    case DType::i8:
      return inference::TYPE_INT8;
    case DType::i16:
      return inference::TYPE_INT16;
    case DType::i32:
      return inference::TYPE_INT32;
    case DType::i64:
      return inference::TYPE_INT64;
    case DType::f16:
      return inference::TYPE_FP16;
    case DType::f32:
      return inference::TYPE_FP32;
    case DType::f64:
      return inference::TYPE_FP64;
    case DType::bf16:
      return inference::TYPE_BF16;
    case DType::bytes:
      return inference::TYPE_STRING;
  }
  return inference::TYPE_INVALID;
}

/// proto3's JSON mapping prints 64-bit integers as strings; Triton prints them as numbers
/// (`dims`, the µs fields, `model_version`). Walks `j` along `d` and turns every 64-bit field
/// back into a number; map keys stay strings (JSON has no other kind).
void int64_as_numbers(nlohmann::json& j, const google::protobuf::Descriptor* d) {
  using FD = google::protobuf::FieldDescriptor;
  auto number = [](nlohmann::json& v, const FD* f) {
    if (!v.is_string()) return;
    const std::string s = v.get<std::string>();
    if (f->cpp_type() == FD::CPPTYPE_INT64) {
      v = std::stoll(s);
    } else {
      v = std::stoull(s);
    }
  };
  auto is64 = [](const FD* f) {
    return f->cpp_type() == FD::CPPTYPE_INT64 || f->cpp_type() == FD::CPPTYPE_UINT64;
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    auto it = j.find(f->name());
    if (it == j.end()) continue;
    if (f->is_map()) {
      const FD* value = f->message_type()->map_value();
      for (auto& [key, v] : it->items()) {
        (void)key;
        if (value->cpp_type() == FD::CPPTYPE_MESSAGE) {
          int64_as_numbers(v, value->message_type());
        } else if (is64(value)) {
          number(v, value);
        }
      }
    } else if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (auto& v : *it) int64_as_numbers(v, f->message_type());
      } else {
        int64_as_numbers(*it, f->message_type());
      }
    } else if (is64(f)) {
      if (f->is_repeated()) {
        for (auto& v : *it) number(v, f);
      } else {
        number(*it, f);
      }
    }
  }
}

// `c` in protobuf's JSON form with the proto field names and 64-bit integers as numbers;
// `defaults`: every scalar printed, also those at their default.
Result<std::string> config_json(const inference::ModelConfig& c, const std::string& model,
                                bool defaults) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = defaults;
  std::string text;
  const auto status = google::protobuf::util::MessageToJsonString(c, &text, options);
  if (!status.ok()) {
    return internal_error("model '" + model +
                          "': config to JSON: " + std::string(status.message()));
  }
  nlohmann::json j = nlohmann::json::parse(text);
  int64_as_numbers(j, inference::ModelConfig::descriptor());
  return j.dump();
}

void add_tensor(const TensorSpec& s, bool batched, std::string* name, inference::DataType* type,
                google::protobuf::RepeatedField<std::int64_t>* dims) {
  *name = s.name;
  *type = config_type(s.dtype);
  for (std::size_t i = batched ? 1 : 0; i < s.shape.size(); ++i) dims->Add(s.shape[i]);
}

}  // namespace

Result<AppliedConfig> applied_model_config(const ModelPlan& plan, const ModelSignature& signature,
                                           std::string_view device) {
  inference::ModelConfig c;
  if (!c.ParseFromString(plan.config_binary)) {
    return internal_error("model '" + plan.name + "': the parsed config does not read back");
  }
  c.set_name(plan.name);
  switch (plan.kind) {
    case ModelPlan::Kind::file:
      // The form's names (a python model has a backend and no platform, as in Triton).
      if (plan.form.config_platform.empty()) {
        c.clear_platform();
      } else {
        c.set_platform(plan.form.config_platform);
      }
      c.set_backend(plan.form.config_backend);
      break;
    case ModelPlan::Kind::builtin:
      c.set_platform(plan.platform);
      c.set_backend("builtin");
      break;
    case ModelPlan::Kind::ensemble:
      c.set_platform(plan.platform);
      c.clear_backend();  // platform "ensemble", no backend, no instances
      for (auto& step : *c.mutable_ensemble_scheduling()->mutable_step()) {
        if (step.model_version() == 0) step.set_model_version(-1);  // Triton's default
      }
      break;
  }
  c.set_max_batch_size(static_cast<std::int32_t>(plan.max_batch_size));
  if (!c.has_version_policy()) c.mutable_version_policy()->mutable_latest()->set_num_versions(1);
  const bool batched = plan.max_batch_size > 0;
  if (c.input().empty()) {
    for (const TensorSpec& s : signature.inputs) {
      inference::ModelInput* in = c.add_input();
      inference::DataType type{};
      add_tensor(s, batched, in->mutable_name(), &type, in->mutable_dims());
      in->set_data_type(type);
    }
  }
  if (c.output().empty()) {
    for (const TensorSpec& s : signature.outputs) {
      inference::ModelOutput* out = c.add_output();
      inference::DataType type{};
      add_tensor(s, batched, out->mutable_name(), &type, out->mutable_dims());
      out->set_data_type(type);
    }
  }
  // The device chosen: KIND_GPU on cuda:N, KIND_CPU on the host; the simulated accelerator
  // (parameters "device") is KIND_MODEL, Triton's kind for a device the model picks itself.
  const bool ensemble = plan.kind == ModelPlan::Kind::ensemble;
  if (ensemble) c.clear_instance_group();
  if (c.instance_group().empty() && !ensemble) {
    c.add_instance_group()->set_count(plan.engine.workers);
  }
  int index = 0;
  for (inference::ModelInstanceGroup& g : *c.mutable_instance_group()) {
    if (g.name().empty()) g.set_name(plan.name + "_" + std::to_string(index));
    ++index;
    if (g.count() == 0) g.set_count(1);
    g.clear_gpus();
    if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
      g.set_kind(inference::ModelInstanceGroup::KIND_GPU);
      int ordinal = 0;
      if (device.size() > 5) {
        std::from_chars(device.data() + 5, device.data() + device.size(), ordinal);
      }
      g.add_gpus(ordinal);
    } else if (device == "cpu" || device.rfind("cpu:", 0) == 0) {
      g.set_kind(inference::ModelInstanceGroup::KIND_CPU);
    } else {
      g.set_kind(inference::ModelInstanceGroup::KIND_MODEL);
    }
  }
  if (plan.kind == ModelPlan::Kind::file) {
    c.set_default_model_filename(plan.model_filename);
  }
  c.mutable_model_transaction_policy()->set_decoupled(plan.decoupled);  // printed either way
  // perf_analyzer reads response_cache.enable without checking that it exists.
  c.mutable_response_cache()->set_enable(plan.response_cache);

  AppliedConfig out;
  out.binary = c.SerializeAsString();
  ASYNCINFER_ASSIGN_OR_RETURN(out.json, config_json(c, plan.name, true));
  return out;
}

Result<std::string> given_model_config_json(const ModelPlan& plan) {
  inference::ModelConfig c;
  if (!c.ParseFromString(plan.config_binary)) {
    return internal_error("model '" + plan.name + "': the parsed config does not read back");
  }
  if (c.name().empty()) c.set_name(plan.name);
  return config_json(c, plan.name, false);
}

}  // namespace asyncinfer::server
