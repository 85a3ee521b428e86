#include "model_config.hpp"

#include "model_config.pb.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <charconv>
#include <set>

namespace asyncinfer::server {

// The protobuf types stay in this file (model_config.hpp says why).
Result<DType> dtype_from_config(inference::DataType type);
Result<inference::ModelConfig> parse_model_config(std::string_view text, std::string_view source,
                                                  std::vector<std::string>* warnings);
Result<ModelPlan> plan_model(const inference::ModelConfig& config, std::string_view dir_name,
                             std::vector<std::string>* warnings);

namespace {

// Messages whose content asyncinfer skips: an unknown field inside them is not reported again
// (the field holding the message already got its warning or error).
constexpr std::string_view kSkippedMessages[] = {
    "inference.ModelOptimizationPolicy",
    "inference.ModelSequenceBatching",
    "inference.ModelEnsembling",
    "inference.BatchInput",
    "inference.BatchOutput",
    "inference.ModelWarmup",
    "inference.ModelOperations",
    "inference.ModelRepositoryAgents",
    "inference.ModelResponseCache",
    "inference.ModelMetrics",
    "inference.ModelRateLimiter",
};

bool inside_skipped_message(std::string_view message) {
  for (std::string_view m : kSkippedMessages) {
    // The parser says: Message type "inference.X" has no field named "f".
    std::string quoted = "\"" + std::string(m);
    if (message.find(quoted + "\"") != std::string_view::npos ||
        message.find(quoted + ".") != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

class Collector : public google::protobuf::io::ErrorCollector {
 public:
  explicit Collector(std::string_view source) : source_(source) {}
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty()) error_ = where(line, column) + message;
  }
  void AddWarning(int line, int column, const std::string& message) override {
    // With unknown fields allowed, each skipped field arrives here.
    if (message.find("has no field named") != std::string::npos) {
      if (!inside_skipped_message(message) && unknown_.empty()) {
        unknown_ = where(line, column) + message +
                   " asyncinfer does not know this field, so it cannot tell whether ignoring it "
                   "is safe; remove it (docs/serving.md lists the supported fields)";
      }
      return;
    }
    warnings_.push_back(where(line, column) + message);
  }
  const std::string& error() const { return error_; }
  const std::string& unknown() const { return unknown_; }
  std::vector<std::string>& warnings() { return warnings_; }

 private:
  std::string where(int line, int column) const {
    // The parser counts lines and columns from 0.
    return std::string(source_) + ":" + std::to_string(line + 1) + ":" +
           std::to_string(column + 1) + ": ";
  }
  std::string_view source_;
  std::string error_;
  std::string unknown_;
  std::vector<std::string> warnings_;
};

Status bad(std::string_view model, const std::string& what) {
  return invalid_argument_error("model '" + std::string(model) + "': config.pbtxt: " + what);
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

Status apply_parameters(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                        std::vector<std::string>* warnings) {
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
      // Triton backends read their own keys (e.g. INFERENCE_MODE for PyTorch); asyncinfer has
      // no use for them, but a misspelt key of ours would land here too, so say so.
      warnings->push_back(
          "model '" + std::string(model) + "': parameters \"" + key +
          "\" is not an asyncinfer option and is ignored (known: " + known_parameters() + ")");
    }
  }
  return Status();
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

Status plan_tensors(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                    std::vector<std::string>* warnings) {
  const bool batched = c.max_batch_size() > 0;
  std::set<std::string> names;
  for (const inference::ModelInput& in : c.input()) {
    const std::string field = "input '" + in.name() + "'";
    if (in.has_reshape()) {
      return bad(model, field +
                            ": reshape is not supported (asyncinfer passes tensors to the "
                            "model as the request gives them)");
    }
    if (in.is_shape_tensor()) return bad(model, field + ": is_shape_tensor is not supported");
    if (in.allow_ragged_batch()) return bad(model, field + ": allow_ragged_batch is not supported");
    if (in.optional()) {
      return bad(model, field + ": optional inputs are not supported (every input is required)");
    }
    if (in.format() != inference::ModelInput::FORMAT_NONE) {
      warnings->push_back("model '" + std::string(model) + "': " + field +
                          ": format is ignored (asyncinfer does not interpret image layouts)");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(TensorSpec spec, tensor_spec(model, "input", in.name(),
                                                             in.data_type(), in.dims(), batched));
    if (!names.insert(spec.name).second) return bad(model, "input '" + spec.name + "' twice");
    plan.inputs.push_back(std::move(spec));
  }
  names.clear();
  for (const inference::ModelOutput& out : c.output()) {
    const std::string field = "output '" + out.name() + "'";
    if (out.has_reshape()) return bad(model, field + ": reshape is not supported");
    if (out.is_shape_tensor()) return bad(model, field + ": is_shape_tensor is not supported");
    if (!out.label_filename().empty()) {
      warnings->push_back("model '" + std::string(model) + "': " + field +
                          ": label_filename is ignored (no classification extension)");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(TensorSpec spec, tensor_spec(model, "output", out.name(),
                                                             out.data_type(), out.dims(), batched));
    if (!names.insert(spec.name).second) return bad(model, "output '" + spec.name + "' twice");
    plan.outputs.push_back(std::move(spec));
  }
  return Status();
}

Status plan_instances(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                      std::vector<std::string>* warnings) {
  int workers = 0;
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
    if (g.has_rate_limiter()) {
      warnings->push_back("model '" + std::string(model) +
                          "': instance_group rate_limiter is ignored (each model has its own "
                          "engine and workers)");
    }
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
      default:
        return bad(model, "instance_group kind " +
                              inference::ModelInstanceGroup::Kind_Name(g.kind()) +
                              " is not supported (KIND_CPU, KIND_GPU or KIND_AUTO)");
    }
    if (!first && (d != device || automatic != device_auto)) {
      return bad(model,
                 "instance_group: groups on different devices are not supported (one "
                 "engine per model version on one device)");
    }
    first = false;
    device = d;
    device_auto = automatic;
    workers += g.count() == 0 ? 1 : g.count();
  }
  plan.engine.workers = std::max(workers, 1);
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

}  // namespace

Result<inference::ModelConfig> parse_model_config(std::string_view text, std::string_view source,
                                                  std::vector<std::string>* warnings) {
  inference::ModelConfig config;
  Collector collector(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&collector);
  parser.AllowUnknownField(true);
  const bool ok = parser.ParseFromString(std::string(text), &config);
  if (!ok) {
    return invalid_argument_error(collector.error().empty()
                                      ? std::string(source) + ": not a valid config"
                                      : collector.error());
  }
  if (!collector.unknown().empty()) return invalid_argument_error(collector.unknown());
  for (std::string& w : collector.warnings()) warnings->push_back(std::move(w));
  return config;
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
  if (engine.batching.max_batch_size > 1) {
    s += ", dynamic batching max " + std::to_string(engine.batching.max_batch_size) + " delay " +
         std::to_string(engine.batching.max_queue_delay.count()) + " us";
  } else {
    s += ", no dynamic batching";
  }
  return s;
}

Result<ModelPlan> plan_model(const inference::ModelConfig& c, std::string_view dir_name,
                             std::vector<std::string>* warnings) {
  const std::string model(dir_name);
  ModelPlan plan;
  plan.name = model;
  if (!c.name().empty() && c.name() != dir_name) {
    return bad(model, "name \"" + c.name() + "\" differs from the model's folder '" + model +
                          "' (they must be equal)");
  }
  // Behaviour-changing fields asyncinfer does not support.
  if (c.has_sequence_batching()) return bad(model, "sequence_batching is not supported");
  if (c.has_ensemble_scheduling()) return bad(model, "ensemble_scheduling is not supported");
  if (!c.batch_input().empty()) return bad(model, "batch_input is not supported");
  if (!c.batch_output().empty()) return bad(model, "batch_output is not supported");
  if (c.has_model_transaction_policy() && c.model_transaction_policy().decoupled()) {
    return bad(model,
               "model_transaction_policy decoupled is not supported (one response per "
               "request)");
  }
  if (c.has_model_repository_agents()) {
    return bad(model,
               "model_repository_agents is not supported (the model files are read as "
               "they are)");
  }
  // Ignorable ones.
  auto ignore = [&](bool present, std::string_view field, std::string_view why) {
    if (present) {
      warnings->push_back("model '" + model + "': " + std::string(field) + " is ignored (" +
                          std::string(why) + ")");
    }
  };
  ignore(c.has_optimization(), "optimization", "framework-specific tuning");
  ignore(!c.model_warmup().empty(), "model_warmup",
         "the torch backend warms each instance up by itself");
  ignore(!c.metric_tags().empty(), "metric_tags", "metrics carry the labels model and version");
  ignore(c.has_response_cache(), "response_cache", "no response cache");
  ignore(c.has_model_metrics(), "model_metrics", "fixed histogram buckets");
  ignore(c.has_model_operations(), "model_operations", "no custom operation libraries");
  ignore(!c.cc_model_filenames().empty(), "cc_model_filenames", "default_model_filename is used");
  ignore(!c.runtime().empty(), "runtime", "the backend is chosen by platform / backend");

  ASYNCINFER_RETURN_IF_ERROR(apply_parameters(c, model, plan, warnings));

  const std::string& platform = c.platform();
  const std::string& backend = c.backend();
  if (platform == "pytorch_libtorch" || backend == "pytorch") {
    if (!platform.empty() && platform != "pytorch_libtorch") {
      return bad(model, "platform \"" + platform + "\" and backend \"pytorch\" disagree");
    }
    if (!backend.empty() && backend != "pytorch") {
      return bad(model, "platform \"pytorch_libtorch\" and backend \"" + backend + "\" disagree");
    }
    plan.backend = ModelPlan::Backend::torch;
    plan.platform = "pytorch_libtorch";
    if (!c.default_model_filename().empty()) plan.model_filename = c.default_model_filename();
    if (!plan.builtin_uri.empty()) {
      return bad(model,
                 "parameters \"uri\" is for backend \"builtin\"; a pytorch_libtorch model "
                 "is loaded from <version>/" +
                     plan.model_filename);
    }
  } else if (backend == "builtin" || platform == "asyncinfer_builtin") {
    plan.backend = ModelPlan::Backend::builtin;
    plan.platform = "asyncinfer_builtin";
    if (plan.builtin_uri.rfind("builtin:", 0) != 0) {
      return bad(model,
                 "backend \"builtin\" needs parameters { key: \"uri\" value { "
                 "string_value: \"builtin:...\" } } (got '" +
                     plan.builtin_uri + "')");
    }
    if (!c.default_model_filename().empty()) {
      ignore(true, "default_model_filename", "a built-in model has no file");
    }
  } else if (platform.empty() && backend.empty()) {
    return bad(model,
               "neither platform nor backend is set (platform: \"pytorch_libtorch\" or "
               "backend: \"builtin\")");
  } else {
    return bad(model, "platform \"" + platform + "\" / backend \"" + backend +
                          "\" is not supported (platform: \"pytorch_libtorch\" or backend: "
                          "\"pytorch\" for TorchScript; backend: \"builtin\")");
  }

  ASYNCINFER_RETURN_IF_ERROR(plan_batching(c, model, plan, warnings));
  ASYNCINFER_RETURN_IF_ERROR(plan_tensors(c, model, plan, warnings));
  if (plan.backend == ModelPlan::Backend::torch && (plan.inputs.empty() || plan.outputs.empty())) {
    return bad(model,
               "a pytorch_libtorch model needs input and output lists (name, data_type, "
               "dims)");
  }
  ASYNCINFER_RETURN_IF_ERROR(plan_instances(c, model, plan, warnings));

  if (c.has_version_policy()) {
    const inference::ModelVersionPolicy& v = c.version_policy();
    if (v.has_all()) {
      plan.versions.kind = VersionPolicy::Kind::all;
    } else if (v.has_specific()) {
      plan.versions.kind = VersionPolicy::Kind::specific;
      for (std::int64_t n : v.specific().versions()) {
        if (n < 1)
          return bad(model, "version_policy specific: version " + std::to_string(n) + " < 1");
        plan.versions.versions.push_back(n);
      }
      if (plan.versions.versions.empty()) {
        return bad(model, "version_policy specific lists no versions");
      }
    } else if (v.has_latest()) {
      plan.versions.kind = VersionPolicy::Kind::latest;
      plan.versions.num_versions = std::max(v.latest().num_versions(), 1u);
    }
  }
  return plan;
}

Result<ModelPlan> plan_model_config(std::string_view text, std::string_view source,
                                    std::string_view dir_name, std::vector<std::string>* warnings) {
  ASYNCINFER_ASSIGN_OR_RETURN(inference::ModelConfig config,
                              parse_model_config(text, source, warnings));
  return plan_model(config, dir_name, warnings);
}

Status check_signature(const ModelPlan& plan, const ModelSignature& sig) {
  const bool batched = plan.max_batch_size > 0;
  const std::string model = plan.name;
  if (sig.batched != batched) {
    return bad(model,
               "max_batch_size " + std::to_string(plan.max_batch_size) + " says the model " +
                   (batched ? "has" : "has no") + " batch dim, but the loaded model " +
                   (sig.batched ? "has one" : "has none") +
                   (plan.backend == ModelPlan::Backend::builtin
                        ? " (a built-in model's URI sets it with max_batch=; 0 = no batch dim)"
                        : ""));
  }
  if (batched && sig.max_batch_size > 0 && plan.max_batch_size > sig.max_batch_size) {
    return bad(model, "max_batch_size " + std::to_string(plan.max_batch_size) +
                          " is above the model's own limit " + std::to_string(sig.max_batch_size));
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
  ASYNCINFER_RETURN_IF_ERROR(compare("input", plan.inputs, sig.inputs));
  return compare("output", plan.outputs, sig.outputs);
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
  }
  return "?";
}

Result<DType> dtype_from_oip(std::string_view name) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"FP32", DType::f32},     {"FP16", DType::f16},   {"BF16", DType::bf16},
      {"FP64", DType::f64},     {"INT8", DType::i8},    {"UINT8", DType::u8},
      {"INT16", DType::i16},    {"UINT16", DType::u16}, {"INT32", DType::i32},
      {"UINT32", DType::u32},   {"INT64", DType::i64},  {"UINT64", DType::u64},
      {"BOOL", DType::boolean},
  };
  for (const auto& [n, d] : kNames) {
    if (n == name) return d;
  }
  if (name == "BYTES") {
    return invalid_argument_error(
        "datatype BYTES (strings) is not supported by asyncinfer; its "
        "models take numeric tensors");
  }
  return invalid_argument_error("unknown datatype '" + std::string(name) +
                                "' (expected BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
                                "INT32, INT64, FP16, BF16, FP32 or FP64)");
}

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
      return invalid_argument_error(
          "data_type TYPE_STRING is not supported (numeric tensors only)");
    default:
      return invalid_argument_error(
          "data_type is missing or TYPE_INVALID (TYPE_FP32, TYPE_INT64, "
          "...)");
  }
}

}  // namespace asyncinfer::server
