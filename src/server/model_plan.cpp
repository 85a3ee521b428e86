// ModelPlan and VersionPolicy (model_config.hpp): which versions a policy serves, the load log's
// summary, a loaded model's signature checked against the plan, and the OIP's datatype names.
// No protobuf here.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "model_config.hpp"
#include "model_config_internal.hpp"

namespace asyncinfer::server {

Status bad(std::string_view model, const std::string& what) {
  return invalid_argument_error("model '" + std::string(model) + "': config.pbtxt: " + what);
}

Status check_file_name(std::string_view model, std::string_view field, const std::string& name,
                       std::string_view folder) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return bad(model, std::string(field) + " '" + name + "' must name a file in " +
                          std::string(folder) + " (one path component: no '/', not '.' or '..')");
  }
  return Status();
}

std::vector<std::int64_t> VersionPolicy::select(std::vector<std::int64_t> available) const {
  std::sort(available.begin(), available.end());
  available.erase(std::unique(available.begin(), available.end()), available.end());
  std::vector<std::int64_t> out;
  switch (kind) {
    case Kind::all:
      out = available;
      break;
    case Kind::latest: {
      const std::size_t n = std::min<std::size_t>(available.size(), std::max(num_versions, 1u));
      out.assign(available.end() - static_cast<std::ptrdiff_t>(n), available.end());
      break;
    }
    case Kind::specific:
      for (std::int64_t v : available) {
        if (std::find(versions.begin(), versions.end(), v) != versions.end()) out.push_back(v);
      }
      break;
  }
  return out;
}

std::string ModelPlan::summary() const {
  std::string s = "device " + (device_auto ? std::string("auto") : device) + ", " +
                  std::to_string(engine.workers) + (engine.workers == 1 ? " worker" : " workers");
  const std::int64_t max_batch = engine.batching.max_batch_size.value_or(1);
  if (max_batch > 1) {
    s += ", dynamic batching max " + std::to_string(max_batch) + " delay " +
         std::to_string(engine.batching.max_queue_delay.count()) + " us";
  } else {
    s += ", no dynamic batching";
  }
  return s;
}
Status check_signature(const ModelPlan& plan, const ModelSignature& sig) {
  const bool batched = plan.max_batch_size > 0;
  const std::string model = plan.name;
  if (sig.batched != batched) {
    return bad(model,
               "max_batch_size " + std::to_string(plan.max_batch_size) + " says the model " +
                   (batched ? "has" : "has no") + " batch dim, but the loaded model " +
                   (sig.batched ? "has one" : "has none") +
                   (plan.kind == ModelPlan::Kind::builtin
                        ? " (a built-in model's URI sets it with max_batch=; 0 = no batch dim)"
                        : ""));
  }
  if (plan.decoupled != sig.decoupled) {
    return bad(model, plan.decoupled
                          ? "model_transaction_policy says decoupled, but the loaded model sends "
                            "one response per request (remove decoupled: true)"
                          : "the loaded model is decoupled (it sends many responses per request): "
                            "its config needs model_transaction_policy { decoupled: true }");
  }
  if (batched && sig.batch_limit && plan.max_batch_size > *sig.batch_limit) {
    return bad(model, "max_batch_size " + std::to_string(plan.max_batch_size) +
                          " is above the model's own limit " + std::to_string(*sig.batch_limit));
  }
  auto compare = [&](std::string_view what, const std::vector<TensorSpec>& want,
                     const std::vector<TensorSpec>& have) -> Status {
    if (want.empty()) return Status();  // built-in model without a list: its own signature
    if (want.size() != have.size()) {
      return bad(model, std::to_string(want.size()) + " " + std::string(what) +
                            "s listed, the model has " + std::to_string(have.size()));
    }
    for (std::size_t i = 0; i < want.size(); ++i) {
      const TensorSpec& w = want[i];
      const TensorSpec& h = have[i];
      if (w.name != h.name || w.dtype != h.dtype || w.shape != h.shape) {
        return bad(model, std::string(what) + " " + std::to_string(i) + " is listed as '" + w.name +
                              "' " + std::string(oip_datatype(w.dtype)) + shape_to_string(w.shape) +
                              ", the model has '" + h.name + "' " +
                              std::string(oip_datatype(h.dtype)) + shape_to_string(h.shape));
      }
    }
    return Status();
  };
  // With sequence batching the model also has the inputs its controls and states fill and the
  // outputs its states keep, after the listed ones.
  std::vector<TensorSpec> inputs = plan.model_inputs();
  inputs.insert(inputs.end(), plan.sequence_inputs.begin(), plan.sequence_inputs.end());
  std::vector<TensorSpec> outputs = plan.model_outputs();
  outputs.insert(outputs.end(), plan.sequence_outputs.begin(), plan.sequence_outputs.end());
  ASYNCINFER_RETURN_IF_ERROR(compare("input", inputs, sig.inputs));
  return compare("output", outputs, sig.outputs);
}

namespace {

std::vector<TensorSpec> reshaped(std::vector<TensorSpec> specs,
                                 const std::vector<std::optional<Shape>>& reshapes) {
  for (std::size_t i = 0; i < reshapes.size() && i < specs.size(); ++i) {
    if (reshapes[i]) specs[i].shape = *reshapes[i];
  }
  return specs;
}

}  // namespace

std::vector<TensorSpec> ModelPlan::model_inputs() const { return reshaped(inputs, input_reshapes); }

std::vector<TensorSpec> ModelPlan::model_outputs() const {
  return reshaped(outputs, output_reshapes);
}

Shape resolve_reshape(const Shape& from, const Shape& to, const Shape& actual) {
  std::vector<std::int64_t> variable;  // the sizes at from's -1 dims, in order
  for (std::size_t i = 0; i < from.size() && i < actual.size(); ++i) {
    if (from[i] < 0) variable.push_back(actual[i]);
  }
  Shape out = to;
  std::size_t k = 0;
  for (std::int64_t& d : out) {
    if (d < 0 && k < variable.size()) d = variable[k++];
  }
  return out;
}

void apply_reshapes(const std::vector<std::optional<Shape>>& reshapes,
                    const std::vector<TensorSpec>& shapes, bool to_model,
                    std::vector<Tensor>& tensors) {
  for (std::size_t i = 0; i < reshapes.size() && i < shapes.size() && i < tensors.size(); ++i) {
    if (!reshapes[i] || !tensors[i].defined()) continue;
    const Shape& from = to_model ? shapes[i].shape : *reshapes[i];
    const Shape& to = to_model ? *reshapes[i] : shapes[i].shape;
    if (auto view = tensors[i].reshape(resolve_reshape(from, to, tensors[i].shape())); view.ok()) {
      tensors[i] = std::move(*view);
    }
  }
}

std::string EnsembleStep::label(std::size_t index) const {
  return "step " + std::to_string(index) + " (model '" + model_name + "')";
}

Result<std::vector<std::size_t>> check_ensemble_graph(const ModelPlan& plan) {
  const std::vector<EnsembleStep>& steps = plan.ensemble_steps;
  if (steps.empty()) return bad(plan.name, "ensemble_scheduling lists no step");
  // Who produces each tensor: -1 = the ensemble's input, else the step.
  std::map<std::string, long, std::less<>> producer;
  for (const TensorSpec& in : plan.inputs) producer[in.name] = -1;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const EnsembleStep& s = steps[i];
    if (s.model_name.empty()) return bad(plan.name, s.label(i) + " has no model_name");
    if (s.model_name == plan.name) {
      return bad(plan.name, s.label(i) + " names the ensemble itself");
    }
    if (s.output_map.empty()) return bad(plan.name, s.label(i) + " has an empty output_map");
    for (const auto& [output, tensor] : s.output_map) {
      auto [it, fresh] = producer.emplace(tensor, static_cast<long>(i));
      if (!fresh) {
        return bad(plan.name,
                   "tensor '" + tensor + "' has two producers: " +
                       (it->second < 0 ? std::string("the ensemble's input")
                                       : steps[static_cast<std::size_t>(it->second)].label(
                                             static_cast<std::size_t>(it->second)) +
                                             "'s output") +
                       " and " + s.label(i) + "'s output '" + output + "'");
      }
    }
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    for (const auto& [input, tensor] : steps[i].input_map) {
      if (!producer.contains(tensor)) {
        return bad(plan.name, steps[i].label(i) + " input '" + input + "' reads tensor '" + tensor +
                                  "', which nothing produces (no ensemble input and no step "
                                  "output has that name)");
      }
    }
  }
  for (const TensorSpec& out : plan.outputs) {
    auto it = producer.find(out.name);
    if (it == producer.end() || it->second < 0) {
      return bad(plan.name, "ensemble output '" + out.name +
                                "' is not produced by any step (no output_map maps to it)");
    }
  }
  // Kahn's algorithm; what is left over lies on a cycle.
  std::vector<std::size_t> waiting(steps.size(), 0);
  std::vector<std::vector<std::size_t>> consumers(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    for (const auto& [input, tensor] : steps[i].input_map) {
      const long p = producer.at(tensor);
      if (p >= 0) {
        ++waiting[i];
        consumers[static_cast<std::size_t>(p)].push_back(i);
      }
    }
  }
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (waiting[i] == 0) order.push_back(i);
  }
  for (std::size_t k = 0; k < order.size(); ++k) {
    for (std::size_t c : consumers[order[k]]) {
      if (--waiting[c] == 0) order.push_back(c);
    }
  }
  if (order.size() != steps.size()) {
    std::string cycle;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (waiting[i] == 0) continue;
      for (const auto& [input, tensor] : steps[i].input_map) {
        const long p = producer.at(tensor);
        if (p >= 0 && waiting[static_cast<std::size_t>(p)] > 0) {
          cycle += (cycle.empty() ? "" : "; ") + steps[i].label(i) + " reads '" + tensor +
                   "' from " +
                   steps[static_cast<std::size_t>(p)].label(static_cast<std::size_t>(p));
        }
      }
    }
    return bad(plan.name, "the steps form a cycle: " + cycle);
  }
  return order;
}

std::string_view oip_datatype(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "FP32";
    case DType::f16:
      return "FP16";
    case DType::bf16:
      return "BF16";
    case DType::f64:
      return "FP64";
    case DType::i8:
      return "INT8";
    case DType::u8:
      return "UINT8";
    case DType::i16:
      return "INT16";
    case DType::u16:
      return "UINT16";
    case DType::i32:
      return "INT32";
    case DType::u32:
      return "UINT32";
    case DType::i64:
      return "INT64";
    case DType::u64:
      return "UINT64";
    case DType::boolean:
      return "BOOL";
    case DType::bytes:
      return "BYTES";
  }
  return "?";
}

Result<DType> dtype_from_oip(std::string_view name) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"FP32", DType::f32},     {"FP16", DType::f16},    {"BF16", DType::bf16},
      {"FP64", DType::f64},     {"INT8", DType::i8},     {"UINT8", DType::u8},
      {"INT16", DType::i16},    {"UINT16", DType::u16},  {"INT32", DType::i32},
      {"UINT32", DType::u32},   {"INT64", DType::i64},   {"UINT64", DType::u64},
      {"BOOL", DType::boolean}, {"BYTES", DType::bytes},
  };
  for (const auto& [n, d] : kNames) {
    if (n == name) return d;
  }
  return invalid_argument_error("unknown datatype '" + std::string(name) +
                                "' (expected BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
                                "INT32, INT64, FP16, BF16, FP32, FP64 or BYTES)");
}

}  // namespace asyncinfer::server
