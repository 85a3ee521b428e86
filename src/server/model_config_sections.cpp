// The sections of a config.pbtxt turned into ModelPlan's fields (steps of plan_model(),
// model_config_internal.hpp): parameters → asyncinfer's EngineOptions (retries, watchdog,
// recovery, breaker, ...), input / output → TensorSpecs (the batch dim first), instance_group →
// the device and the number of workers, dynamic_batching → the batching and queue options.
#include "model_config.pb.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "model_config_internal.hpp"

namespace asyncinfer::server {
namespace {

Result<DType> dtype_from_config(inference::DataType type) {
  switch (type) {
    case inference::TYPE_BOOL:
      return DType::boolean;
    case inference::TYPE_UINT8:
      return DType::u8;
    case inference::TYPE_UINT16:
      return DType::u16;
    case inference::TYPE_UINT32:
      return DType::u32;
    case inference::TYPE_UINT64:
      return DType::u64;
    case inference::TYPE_INT8:
      return DType::i8;
    case inference::TYPE_INT16:
      return DType::i16;
    case inference::TYPE_INT32:
      return DType::i32;
    case inference::TYPE_INT64:
      return DType::i64;
    case inference::TYPE_FP16:
      return DType::f16;
    case inference::TYPE_FP32:
      return DType::f32;
    case inference::TYPE_FP64:
      return DType::f64;
    case inference::TYPE_BF16:
      return DType::bf16;
    case inference::TYPE_STRING:
      return DType::bytes;
    default:
      return invalid_argument_error(
          "data_type is missing or TYPE_INVALID (TYPE_FP32, TYPE_INT64, "
          "TYPE_STRING, ...)");
  }
}

Result<TensorSpec> tensor_spec(std::string_view model, std::string_view what,
                               const std::string& name, inference::DataType type,
                               const google::protobuf::RepeatedField<std::int64_t>& dims,
                               bool batched) {
  if (name.empty()) return bad(model, std::string(what) + ": a tensor without a name");
  auto dtype = dtype_from_config(type);
  if (!dtype.ok()) {
    return bad(model,
               std::string(what) + " '" + name + "': " + std::string(dtype.status().message()));
  }
  TensorSpec spec;
  spec.name = name;
  spec.dtype = *dtype;
  if (batched) spec.shape.push_back(-1);
  for (std::int64_t d : dims) {
    if (d < -1) {
      return bad(model, std::string(what) + " '" + name + "': dims has " + std::to_string(d) +
                            "; each dim is >= 0, or -1 for a variable dim");
    }
    spec.shape.push_back(d);
  }
  return spec;
}

Result<std::int64_t> parse_int(std::string_view model, std::string_view key,
                               const std::string& value, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || p != end || v < lo || v > hi) {
    return bad(model, "parameters \"" + std::string(key) + "\": '" + value +
                          "' is not an integer in " + std::to_string(lo) + ".." +
                          std::to_string(hi));
  }
  return v;
}

Result<bool> parse_bool(std::string_view model, std::string_view key, const std::string& value) {
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  return bad(model,
             "parameters \"" + std::string(key) + "\": '" + value + "' is not true or false");
}

// asyncinfer's own options, given as parameters { key: ... value { string_value: ... } }.
constexpr std::string_view kKnownParameters[] = {
    "uri",
    "device",
    "retries",
    "retry_initial_backoff_us",
    "retry_max_backoff_us",
    "ordered_delivery",
    "watchdog_ms",
    "max_recycle_attempts",
    "recycle_backoff_ms",
    "max_inflight_per_worker",
    "completion_threads",
    "spin_wait_us",
    "intra_op_threads",
    "breaker_failure_threshold",
    "breaker_cooldown_ms",
    "admission_control",
};

std::string known_parameters() {
  std::string out;
  for (std::string_view k : kKnownParameters) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

}  // namespace

Status apply_parameters(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan) {
  EngineOptions& e = plan.engine;
  // Sorted, so messages come out in a stable order.
  std::set<std::string> keys;
  for (const auto& [k, v] : c.parameters()) keys.insert(k);
  for (const std::string& key : keys) {
    const std::string& value = c.parameters().at(key).string_value();
    if (key == "uri") {
      plan.builtin_uri = value;
    } else if (key == "device") {
      if (value.empty()) return bad(model, "parameters \"device\": empty");
      plan.device = value;
    } else if (key == "retries") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 100));
      e.retry.max_attempts = static_cast<int>(n) + 1;
    } else if (key == "retry_initial_backoff_us") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 60'000'000));
      e.retry.initial_backoff = std::chrono::microseconds(n);
    } else if (key == "retry_max_backoff_us") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 600'000'000));
      e.retry.max_backoff = std::chrono::microseconds(n);
    } else if (key == "ordered_delivery") {
      ASYNCINFER_ASSIGN_OR_RETURN(e.ordered_delivery, parse_bool(model, key, value));
    } else if (key == "watchdog_ms") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 86'400'000));
      e.watchdog = std::chrono::milliseconds(n);
    } else if (key == "max_recycle_attempts") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 1, 1'000'000));
      e.recovery.max_recycle_attempts = static_cast<int>(n);
    } else if (key == "recycle_backoff_ms") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 3'600'000));
      e.recovery.recycle_backoff = std::chrono::milliseconds(n);
      e.recovery.max_recycle_backoff =
          std::max(e.recovery.max_recycle_backoff, e.recovery.recycle_backoff);
    } else if (key == "max_inflight_per_worker") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 1, 1024));
      e.max_inflight_per_worker = static_cast<int>(n);
    } else if (key == "completion_threads") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 1, 256));
      e.completion_threads = static_cast<int>(n);
    } else if (key == "spin_wait_us") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 1000));
      e.spin_wait = std::chrono::microseconds(n);
    } else if (key == "intra_op_threads") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 1024));
      e.intra_op_threads = static_cast<int>(n);
    } else if (key == "breaker_failure_threshold") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 1'000'000));
      e.breaker.failure_threshold = static_cast<int>(n);
    } else if (key == "breaker_cooldown_ms") {
      ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t n, parse_int(model, key, value, 0, 86'400'000));
      e.breaker.cooldown = std::chrono::milliseconds(n);
    } else if (key == "admission_control") {
      ASYNCINFER_ASSIGN_OR_RETURN(e.admission_control, parse_bool(model, key, value));
    } else {
      // A backend's own key (Triton's OpenVINO backend: NUM_STREAMS, ...), or a misspelt key of
      // ours: plan_model() passes them to the openvino backend, or warn_backend_parameters()
      // says they are ignored.
      plan.backend_parameters.emplace_back(key, value);
    }
  }
  return Status();
}

void warn_backend_parameters(std::string_view model, ModelPlan& plan,
                             std::vector<std::string>* warnings) {
  // Triton backends read their own keys (e.g. INFERENCE_MODE for PyTorch); asyncinfer has no use
  // for them, but a misspelt key of ours would land here too, so say so.
  for (const auto& [key, value] : plan.backend_parameters) {
    warnings->push_back(
        "model '" + std::string(model) + "': parameters \"" + key +
        "\" is not an asyncinfer option and is ignored (known: " + known_parameters() + ")");
  }
  plan.backend_parameters.clear();
}

namespace {

// Triton's reshape of an input or output (its core's checks and words): the full shape the model
// takes or gives, or nullopt without one. Zeros are refused; dims and reshape hold as many
// elements, or, with variable (-1) dims, as many -1s with parts of the same size between them;
// an empty reshape (a scalar a row) needs dims of one element and a batched model.
template <class Tensor>
Result<std::optional<Shape>> plan_reshape(std::string_view model, const std::string& field,
                                          const Tensor& t, std::int64_t max_batch_size) {
  if (!t.has_reshape()) return std::optional<Shape>();
  const auto& shape = t.reshape().shape();
  if (shape.empty() && max_batch_size == 0) {
    return bad(model, field +
                          ": cannot have empty reshape for non-batching model as scalar tensors "
                          "are not supported");
  }
  for (const std::int64_t d : shape) {
    if (d < 1 && d != -1) {
      return bad(model, field +
                            ": reshape dimensions must be integer >= 1, or -1 to indicate a "
                            "variable-size dimension");
    }
  }
  // The element counts of the parts between -1 dims (one part when none is -1).
  auto parts = [](const auto& dims) {
    std::vector<std::int64_t> out{1};
    for (const std::int64_t d : dims) {
      if (d == -1) {
        out.push_back(1);
      } else {
        out.back() *= d;
      }
    }
    return out;
  };
  const std::vector<std::int64_t> from = parts(t.dims());
  const std::vector<std::int64_t> to = parts(shape);
  const bool scalar = shape.empty() && from.size() == 1 && from[0] == 1;
  if (!scalar && from.size() != to.size()) {
    return bad(model, field +
                          ": has different number of variable-size dimensions for dims and "
                          "reshape");
  }
  if (!scalar && from != to) return bad(model, field + ": has different size for dims and reshape");
  Shape full;
  if (max_batch_size > 0) full.push_back(-1);
  full.insert(full.end(), shape.begin(), shape.end());
  return std::optional<Shape>(std::move(full));
}

}  // namespace

Status plan_tensors(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                    std::vector<std::string>* warnings) {
  const bool batched = c.max_batch_size() > 0;
  std::set<std::string> names;
  for (const inference::ModelInput& in : c.input()) {
    const std::string field = "input '" + in.name() + "'";
    if (in.is_shape_tensor()) return bad(model, field + ": is_shape_tensor is not supported");
    if (in.allow_ragged_batch() && !plan.form.takes_ragged_inputs) {
      // Triton's other backends join ragged inputs into one 1-D tensor described by batch
      // inputs, which asyncinfer does not make.
      return bad(model, field +
                            ": allow_ragged_batch is served for python models and the identity "
                            "backend only (which answer each request of a batch on its own)");
    }
    if (in.optional() && !plan.form.takes_optional_inputs) {
      // Only a backend that hands a model the inputs that came (python's, as Triton's does).
      return bad(model, field +
                            ": optional inputs are served for python models only (this "
                            "backend needs every input)");
    }
    if (in.format() != inference::ModelInput::FORMAT_NONE) {
      warnings->push_back("model '" + std::string(model) + "': " + field +
                          ": format is ignored (asyncinfer does not interpret image layouts)");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(TensorSpec spec, tensor_spec(model, "input", in.name(),
                                                             in.data_type(), in.dims(), batched));
    if (!names.insert(spec.name).second) return bad(model, "input '" + spec.name + "' twice");
    spec.optional = in.optional();
    spec.ragged = batched && in.allow_ragged_batch();  // no batches to join without a batch dim
    ASYNCINFER_ASSIGN_OR_RETURN(std::optional<Shape> reshape,
                                plan_reshape(model, field, in, c.max_batch_size()));
    plan.input_reshapes.push_back(std::move(reshape));
    plan.inputs.push_back(std::move(spec));
  }
  names.clear();
  for (const inference::ModelOutput& out : c.output()) {
    const std::string field = "output '" + out.name() + "'";
    if (out.is_shape_tensor()) return bad(model, field + ": is_shape_tensor is not supported");
    ASYNCINFER_ASSIGN_OR_RETURN(TensorSpec spec, tensor_spec(model, "output", out.name(),
                                                             out.data_type(), out.dims(), batched));
    if (!names.insert(spec.name).second) return bad(model, "output '" + spec.name + "' twice");
    if (!out.label_filename().empty()) {
      // A file of the model's folder, named as default_model_filename is.
      ASYNCINFER_RETURN_IF_ERROR(check_file_name(model, field + ": label_filename",
                                                 out.label_filename(), "the model's folder"));
      plan.label_files[spec.name] = out.label_filename();
    }
    ASYNCINFER_ASSIGN_OR_RETURN(std::optional<Shape> reshape,
                                plan_reshape(model, field, out, c.max_batch_size()));
    plan.output_reshapes.push_back(std::move(reshape));
    plan.outputs.push_back(std::move(spec));
  }
  const auto none = [](const std::optional<Shape>& r) { return !r; };
  if (std::all_of(plan.input_reshapes.begin(), plan.input_reshapes.end(), none)) {
    plan.input_reshapes.clear();
  }
  if (std::all_of(plan.output_reshapes.begin(), plan.output_reshapes.end(), none)) {
    plan.output_reshapes.clear();
  }
  return Status();
}

namespace {

/// An instance group's rate_limiter (Triton's ModelRateLimiter): its resources and priority,
/// checked (a name, no name twice).
Result<InstanceRateLimit> plan_rate_limiter(const inference::ModelInstanceGroup& g,
                                            std::string_view model) {
  InstanceRateLimit needs;
  if (!g.has_rate_limiter()) return needs;
  const inference::ModelRateLimiter& r = g.rate_limiter();
  needs.priority = r.priority();
  std::set<std::string> names;
  for (const inference::ModelRateLimiter::Resource& res : r.resources()) {
    if (res.name().empty()) {
      return bad(model, "instance_group rate_limiter: a resource without a name");
    }
    if (!names.insert(res.name()).second) {
      return bad(model, "instance_group rate_limiter: resource \"" + res.name() + "\" twice");
    }
    needs.resources.push_back(InstanceRateLimit::Resource{res.name(), res.count(), res.global()});
  }
  return needs;
}

}  // namespace

Status plan_instances(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                      std::vector<std::string>* warnings) {
  int workers = 0;
  bool limited = false;                        // a group has a rate_limiter
  std::vector<InstanceRateLimit> group_needs;  // one per worker
  std::string device;
  bool device_auto = c.instance_group().empty();
  bool first = true;
  for (const inference::ModelInstanceGroup& g : c.instance_group()) {
    if (g.count() < 0)
      return bad(model, "instance_group count " + std::to_string(g.count()) + " < 0");
    if (g.passive()) return bad(model, "instance_group passive is not supported");
    if (!g.profile().empty()) {
      warnings->push_back("model '" + std::string(model) +
                          "': instance_group profile is ignored (TensorRT only)");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(InstanceRateLimit needs, plan_rate_limiter(g, model));
    if (!g.host_policy().empty()) {
      warnings->push_back("model '" + std::string(model) +
                          "': instance_group host_policy is ignored");
    }
    std::string d;
    bool automatic = false;
    switch (g.kind()) {
      case inference::ModelInstanceGroup::KIND_CPU:
        if (!g.gpus().empty()) return bad(model, "instance_group: KIND_CPU with gpus");
        d = "cpu";
        break;
      case inference::ModelInstanceGroup::KIND_GPU:
      case inference::ModelInstanceGroup::KIND_AUTO:
        if (g.gpus().size() > 1) {
          return bad(model, "instance_group gpus lists " + std::to_string(g.gpus().size()) +
                                " GPUs; asyncinfer runs one engine per model version on one "
                                "device (list one GPU)");
        }
        if (g.kind() == inference::ModelInstanceGroup::KIND_AUTO && g.gpus().empty()) {
          automatic = true;
        } else {
          d = "cuda:" + std::to_string(g.gpus().empty() ? 0 : g.gpus(0));
        }
        break;
      case inference::ModelInstanceGroup::KIND_MODEL:
        // Triton's kind for a device the model picks itself: here, its parameters "device" (what
        // GET .../config shows for a model on the simulated device, so that a config read back
        // loads again). A python model's process picks its own device: its engine runs on cpu.
        if (plan.device.empty() && plan.form.host_process_instances) {
          d = "cpu";
          break;
        }
        if (plan.device.empty()) {
          return bad(model,
                     "instance_group kind KIND_MODEL needs parameters { key: \"device\" } (the "
                     "device the model picks: cpu, sim, cuda:N)");
        }
        d = plan.device;
        break;
      default:
        return bad(model, "instance_group kind " +
                              inference::ModelInstanceGroup::Kind_Name(g.kind()) +
                              " is not supported (KIND_CPU, KIND_GPU, KIND_AUTO, or KIND_MODEL "
                              "with parameters \"device\")");
    }
    if (!first && (d != device || automatic != device_auto)) {
      return bad(model,
                 "instance_group: groups on different devices are not supported (one "
                 "engine per model version on one device)");
    }
    first = false;
    device = d;
    device_auto = automatic;
    if (g.count() > kMaxInstanceCount - workers) {  // never an int overflow
      return bad(model, "instance_group count " + std::to_string(g.count()) +
                            ": a model has at most " + std::to_string(kMaxInstanceCount) +
                            " instances in all");
    }
    const int instances = g.count() == 0 ? 1 : g.count();
    workers += instances;
    if (g.has_rate_limiter()) limited = true;
    group_needs.insert(group_needs.end(), static_cast<std::size_t>(instances), needs);
  }
  // Every worker's entry, in order, once any group has a rate_limiter (the others need nothing).
  if (limited) plan.rate_limits = std::move(group_needs);
  // No instance_group on a model whose backend picks its own count (openvino: as many workers as
  // OpenVINO's throughput hint has streams; 0 = the model's preference, preferred_instances).
  const bool model_decides = c.instance_group().empty() && plan.form.own_instance_count;
  plan.engine.workers = model_decides ? 0 : std::max(workers, 1);
  if (plan.device.empty()) {  // parameters "device" wins over instance_group's kind
    plan.device = device;
    plan.device_auto = device_auto;
  }
  return Status();
}

Status plan_batching(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                     std::vector<std::string>* warnings) {
  EngineOptions& e = plan.engine;
  if (c.max_batch_size() < 0) {
    return bad(model, "max_batch_size " + std::to_string(c.max_batch_size()) +
                          " < 0 (0 = no batch dim, > 0 = the largest batch)");
  }
  plan.max_batch_size = c.max_batch_size();
  // Without dynamic_batching Triton runs each request on its own; so does asyncinfer.
  e.batching.max_batch_size = 1;
  if (!c.has_dynamic_batching()) return Status();
  const inference::ModelDynamicBatching& b = c.dynamic_batching();
  if (c.max_batch_size() == 0) {
    warnings->push_back("model '" + std::string(model) +
                        "': dynamic_batching is ignored: max_batch_size is 0 (no batch dim)");
  } else {
    e.batching.max_batch_size = c.max_batch_size();
    for (std::int32_t p : b.preferred_batch_size()) {
      if (p < 1 || p > c.max_batch_size()) {
        return bad(model, "dynamic_batching preferred_batch_size " + std::to_string(p) +
                              " is outside 1..max_batch_size (" +
                              std::to_string(c.max_batch_size()) + ")");
      }
      e.batching.preferred_batch_sizes.push_back(p);
    }
    if (b.max_queue_delay_microseconds() > 60'000'000) {
      return bad(model, "dynamic_batching max_queue_delay_microseconds " +
                            std::to_string(b.max_queue_delay_microseconds()) + " is over 60 s");
    }
    e.batching.max_queue_delay =
        std::chrono::microseconds(static_cast<std::int64_t>(b.max_queue_delay_microseconds()));
  }
  e.ordered_delivery = e.ordered_delivery || b.preserve_ordering();
  if (b.priority_levels() > 0) {
    if (b.priority_levels() > 1000) {
      return bad(model, "dynamic_batching priority_levels " + std::to_string(b.priority_levels()) +
                            " is over 1000");
    }
    e.priority_levels = static_cast<int>(b.priority_levels());
    if (b.default_priority_level() < 1 || b.default_priority_level() > b.priority_levels()) {
      return bad(model, "dynamic_batching default_priority_level " +
                            std::to_string(b.default_priority_level()) +
                            " is outside 1..priority_levels (" +
                            std::to_string(b.priority_levels()) + ")");
    }
    e.default_priority = static_cast<int>(b.default_priority_level());
  } else if (b.default_priority_level() != 0) {
    return bad(model, "dynamic_batching default_priority_level needs priority_levels");
  }
  if (!b.priority_queue_policy().empty()) {
    return bad(model,
               "dynamic_batching priority_queue_policy is not supported (one queue policy "
               "per model: default_queue_policy)");
  }
  if (b.has_default_queue_policy()) {
    const inference::ModelQueuePolicy& q = b.default_queue_policy();
    if (q.timeout_action() != inference::ModelQueuePolicy::REJECT) {
      return bad(model,
                 "default_queue_policy timeout_action DELAY is not supported (a request "
                 "past its timeout ends with deadline exceeded: REJECT)");
    }
    if (q.default_timeout_microseconds() > 0) {
      e.default_timeout = std::chrono::microseconds(static_cast<std::int64_t>(
          std::min<std::uint64_t>(q.default_timeout_microseconds(), 86'400'000'000ULL)));
    }
    e.allow_timeout_override = q.allow_timeout_override();
    if (q.max_queue_size() > 0) e.queue_capacity = q.max_queue_size();
  }
  return Status();
}

Status plan_warmup(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan) {
  for (const inference::ModelWarmup& w : c.model_warmup()) {
    const std::string what = "model_warmup '" + w.name() + "'";
    if (w.name().empty()) return bad(model, "a model_warmup entry needs a name");
    WarmupSample sample;
    sample.name = w.name();
    sample.count = std::max(w.count(), 1u);  // Triton: 0 = once
    if (sample.count > kMaxWarmupCount) {
      return bad(model, what + ": count " + std::to_string(w.count()) + " is over the limit of " +
                            std::to_string(kMaxWarmupCount) + " runs of one sample");
    }
    if (c.max_batch_size() > 0) {
      if (w.batch_size() < 1 || w.batch_size() > static_cast<std::uint32_t>(c.max_batch_size())) {
        return bad(model, what + ": batch_size " + std::to_string(w.batch_size()) +
                              " is outside 1..max_batch_size (" +
                              std::to_string(c.max_batch_size()) + ")");
      }
      sample.batch_size = w.batch_size();
    } else if (w.batch_size() > 1) {
      return bad(model, what + ": batch_size " + std::to_string(w.batch_size()) +
                            " for a model without a batch dim (max_batch_size 0)");
    }
    if (w.inputs().empty()) return bad(model, what + " lists no inputs");
    for (const auto& [name, in] : w.inputs()) {
      WarmupSample::Input input;
      input.name = name;
      auto dtype = dtype_from_config(in.data_type());
      if (!dtype.ok())
        return bad(model, what + " input '" + name + "': " + std::string(dtype.status().message()));
      input.dtype = *dtype;
      for (std::int64_t d : in.dims()) {
        if (d < 0) {
          return bad(model, what + " input '" + name + "': dims " + std::to_string(d) +
                                " (warm-up dims are fixed sizes, >= 0)");
        }
        input.dims.push_back(d);
      }
      switch (in.input_data_type_case()) {
        case inference::ModelWarmup::Input::kZeroData:
          input.data = WarmupSample::Input::Data::zero;
          break;
        case inference::ModelWarmup::Input::kRandomData:
          input.data = WarmupSample::Input::Data::random;
          break;
        case inference::ModelWarmup::Input::kInputDataFile:
          input.data = WarmupSample::Input::Data::file;
          input.file = in.input_data_file();
          ASYNCINFER_RETURN_IF_ERROR(
              check_file_name(model, what + " input '" + name + "': input_data_file", input.file,
                              "the model's warmup folder"));
          break;
        default:
          return bad(model, what + " input '" + name +
                                "' needs zero_data, random_data or input_data_file");
      }
      sample.inputs.push_back(std::move(input));
    }
    plan.warmup.push_back(std::move(sample));
  }
  return Status();
}

}  // namespace asyncinfer::server

namespace asyncinfer::server {

Status plan_sequences(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan) {
  if (!c.has_sequence_batching()) return Status();
  using SB = inference::ModelSequenceBatching;
  const SB& q = c.sequence_batching();
  const bool batched = c.max_batch_size() > 0;
  if (plan.kind == ModelPlan::Kind::ensemble) {
    return bad(model, "sequence_batching on an ensemble: put it on the stateful step's model");
  }
  if (plan.decoupled)
    return bad(model, "sequence_batching with a decoupled model is not supported");
  if (q.iterative_sequence())
    return bad(model, "sequence_batching iterative_sequence is not supported");
  SequenceBatchingOptions s;
  s.model_name = std::string(model);
  if (q.max_sequence_idle_microseconds() > 0) {
    s.max_sequence_idle = std::chrono::microseconds(static_cast<std::int64_t>(
        std::min<std::uint64_t>(q.max_sequence_idle_microseconds(), 86'400'000'000ULL)));
  }
  if (q.has_oldest()) {
    s.strategy = SequenceBatchingOptions::Strategy::oldest;
    const SB::StrategyOldest& o = q.oldest();
    if (o.max_candidate_sequences() < 0) {
      return bad(model, "sequence_batching oldest max_candidate_sequences must be >= 0");
    }
    // Triton's candidates are across the model; here they are split over the instances.
    const int workers = std::max(plan.engine.workers, 1);
    s.slots_per_worker = o.max_candidate_sequences() > 0
                             ? std::max(1, (o.max_candidate_sequences() + workers - 1) / workers)
                             : 0;
  }
  // A control's row: [1] after the batch dim (Triton's shape for control inputs).
  const auto spec = [&](const std::string& name, DType dtype, Shape dims) {
    TensorSpec t;
    t.name = name;
    t.dtype = dtype;
    if (batched) t.shape.push_back(-1);
    t.shape.insert(t.shape.end(), dims.begin(), dims.end());
    return t;
  };
  for (const SB::ControlInput& in : q.control_input()) {
    const std::string what = "sequence_batching control_input '" + in.name() + "'";
    if (in.name().empty()) return bad(model, "sequence_batching control_input without a name");
    if (in.control_size() != 1) {
      return bad(model, what + " has " + std::to_string(in.control_size()) +
                            " controls; expected exactly one");
    }
    const SB::Control& k = in.control(0);
    SequenceControl sc;
    sc.input = in.name();
    switch (k.kind()) {
      case SB::Control::CONTROL_SEQUENCE_START:
        sc.kind = SequenceControl::Kind::start;
        break;
      case SB::Control::CONTROL_SEQUENCE_END:
        sc.kind = SequenceControl::Kind::end;
        break;
      case SB::Control::CONTROL_SEQUENCE_READY:
        sc.kind = SequenceControl::Kind::ready;
        break;
      case SB::Control::CONTROL_SEQUENCE_CORRID:
        sc.kind = SequenceControl::Kind::corrid;
        break;
      default:
        return bad(model, what + ": unknown control kind");
    }
    if (sc.kind == SequenceControl::Kind::corrid) {
      auto dt = dtype_from_config(k.data_type());
      if (!dt.ok()) return bad(model, what + ": " + std::string(dt.status().message()));
      sc.dtype = *dt;
    } else {
      const int given = (k.int32_false_true_size() > 0 ? 1 : 0) +
                        (k.fp32_false_true_size() > 0 ? 1 : 0) +
                        (k.bool_false_true_size() > 0 ? 1 : 0);
      if (given != 1) {
        return bad(model, what +
                              " needs exactly one of int32_false_true, fp32_false_true, "
                              "bool_false_true");
      }
      // The one list given: its dtype, and its false and true values.
      const auto take = [&](const auto& values, DType dtype, const char* field) -> Status {
        if (values.size() != 2) return bad(model, what + ": " + field + " needs 2 values");
        sc.dtype = dtype;
        sc.false_value = static_cast<double>(values.Get(0));
        sc.true_value = static_cast<double>(values.Get(1));
        return Status();
      };
      const Status taken = k.int32_false_true_size() > 0
                               ? take(k.int32_false_true(), DType::i32, "int32_false_true")
                           : k.fp32_false_true_size() > 0
                               ? take(k.fp32_false_true(), DType::f32, "fp32_false_true")
                               : take(k.bool_false_true(), DType::boolean, "bool_false_true");
      ASYNCINFER_RETURN_IF_ERROR(taken);
    }
    plan.sequence_inputs.push_back(spec(sc.input, sc.dtype, {1}));
    s.controls.push_back(std::move(sc));
  }
  for (const SB::State& st : q.state()) {
    const std::string what = "sequence_batching state '" + st.input_name() + "'";
    if (st.input_name().empty() || st.output_name().empty()) {
      return bad(model, "sequence_batching state needs input_name and output_name");
    }
    auto dt = dtype_from_config(st.data_type());
    if (!dt.ok()) return bad(model, what + ": " + std::string(dt.status().message()));
    SequenceState ss;
    ss.input = st.input_name();
    ss.output = st.output_name();
    ss.dtype = *dt;
    for (std::int64_t d : st.dims()) {
      if (d < 0) return bad(model, what + ": dims must be fixed (>= 0), got " + std::to_string(d));
      ss.dims.push_back(d);
    }
    if (st.initial_state_size() > 1) return bad(model, what + ": at most one initial_state");
    if (st.initial_state_size() == 1) {
      const SB::InitialState& init = st.initial_state(0);
      if (init.has_data_file()) {
        ASYNCINFER_RETURN_IF_ERROR(
            check_file_name(model, "initial_state data_file", init.data_file(), "initial_state"));
        plan.state_files[ss.input] = init.data_file();
      }
    }
    plan.sequence_inputs.push_back(spec(ss.input, ss.dtype, ss.dims));
    plan.sequence_outputs.push_back(spec(ss.output, ss.dtype, ss.dims));
    s.states.push_back(std::move(ss));
  }
  // The sequence batcher replaces the dynamic one (a oneof in the config): batches form from
  // the slots' sequences, up to max_batch_size rows.
  plan.engine.batching.max_batch_size = batched ? c.max_batch_size() : 1;
  plan.engine.sequence_batching = std::move(s);
  return Status();
}

}  // namespace asyncinfer::server
