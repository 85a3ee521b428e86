// Reading a config.pbtxt (model_config.hpp): libprotobuf's TextFormat parser with unknown fields
// reported by name, and plan_model(), which refuses the fields that would change behaviour,
// warns about the ignorable ones, picks the backend from platform / backend, and reads
// version_policy; the other sections are planned in model_config_sections.cpp.
#include "model_config.hpp"

#include "model_config.pb.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "model/backend.hpp"
#include "model_config_internal.hpp"

namespace asyncinfer::server {

// The protobuf types stay in the files built like libprotobuf (model_config.hpp says why).
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

// The file backends' names for messages: `backend: "pytorch" or platform: "pytorch_libtorch"
// (<version>/model.pt); ...`, then the server's own two.
std::string supported_forms(const std::vector<detail::RepositoryForm>& forms) {
  std::string usage;
  for (const detail::RepositoryForm& f : forms) {
    usage += "backend: \"" + f.name + "\"";
    for (const std::string& p : f.platforms) usage += " or platform: \"" + p + "\"";
    usage += " (<version>/" + f.default_model_filename + "); ";
  }
  return usage + "backend: \"builtin\" or \"identity\"; platform: \"ensemble\"";
}

// The form (model/repository_form.hpp) that a config's backend or platform names, as Triton's
// core maps a platform to its backend: the two must name the same one when both are given.
Result<detail::RepositoryForm> repository_form(const std::string& model,
                                               const std::string& platform,
                                               const std::string& backend) {
  const std::vector<detail::RepositoryForm> forms =
      detail::ModelBackendRegistry::instance().forms();
  const detail::RepositoryForm* by_backend = nullptr;
  const detail::RepositoryForm* by_platform = nullptr;
  for (const detail::RepositoryForm& f : forms) {
    if (!backend.empty() && f.name == backend) by_backend = &f;
    if (!platform.empty() &&
        std::find(f.platforms.begin(), f.platforms.end(), platform) != f.platforms.end()) {
      by_platform = &f;
    }
  }
  if (!platform.empty() && !backend.empty() && by_backend != by_platform &&
      (by_backend != nullptr || by_platform != nullptr)) {
    return bad(model, "platform \"" + platform + "\" and backend \"" + backend + "\" disagree");
  }
  if (by_backend != nullptr) return *by_backend;
  if (by_platform != nullptr) return *by_platform;
  if (platform.empty() && backend.empty()) {
    return bad(model, "neither platform nor backend is set (" + supported_forms(forms) + ")");
  }
  return bad(model, "platform \"" + platform + "\" / backend \"" + backend +
                        "\" is not supported by this build (" + supported_forms(forms) + ")");
}

// Triton's AutoCompleteBackendFields for a config that names neither platform nor backend: the
// backend of the form whose default model file the config's default_model_filename names, or else
// the first whose default file the first version folder holds (model.py: python).
void complete_backend_fields(inference::ModelConfig& config,
                             const std::vector<std::string>& version_files) {
  if (!config.platform().empty() || !config.backend().empty()) return;
  const std::vector<detail::RepositoryForm> forms =
      detail::ModelBackendRegistry::instance().forms();
  for (const detail::RepositoryForm& f : forms) {
    const bool named = config.default_model_filename() == f.default_model_filename;
    const bool there = config.default_model_filename().empty() &&
                       std::find(version_files.begin(), version_files.end(),
                                 f.default_model_filename) != version_files.end();
    if (named || there) {
      config.set_backend(f.name);
      return;
    }
  }
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
  if (c.has_ensemble_scheduling() && c.platform() != "ensemble") {
    return bad(model, "ensemble_scheduling needs platform: \"ensemble\"");
  }
  if (!c.batch_input().empty()) return bad(model, "batch_input is not supported");
  if (!c.batch_output().empty()) return bad(model, "batch_output is not supported");
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
  ignore(!c.metric_tags().empty(), "metric_tags", "metrics carry the labels model and version");
  plan.response_cache = c.response_cache().enable();
  plan.decoupled = c.model_transaction_policy().decoupled();
  if (plan.decoupled && plan.response_cache) {
    return bad(model,
               "response_cache cannot be enabled on a decoupled model (model_transaction_policy "
               "decoupled: true): only one-response models are cached, as in Triton");
  }
  ignore(c.has_model_metrics(), "model_metrics", "fixed histogram buckets");
  ignore(c.has_model_operations(), "model_operations", "no custom operation libraries");
  ignore(!c.cc_model_filenames().empty(), "cc_model_filenames", "default_model_filename is used");
  ignore(!c.runtime().empty(), "runtime", "the backend is chosen by platform / backend");

  ASYNCINFER_RETURN_IF_ERROR(apply_parameters(c, model, plan));

  const std::string& platform = c.platform();
  const std::string& backend = c.backend();
  if (platform == "ensemble") {
    // Triton's ensembles: a graph of steps over other models, no model file of its own.
    if (!backend.empty()) {
      return bad(model, "platform \"ensemble\" takes no backend (got \"" + backend + "\")");
    }
    if (!c.has_ensemble_scheduling()) {
      return bad(model, "platform \"ensemble\" needs ensemble_scheduling { step [ ... ] }");
    }
    if (plan.response_cache) {
      return bad(model, "response_cache on an ensemble is not supported");
    }
    if (plan.decoupled) return bad(model, "a decoupled ensemble is not supported");
    if (!plan.builtin_uri.empty()) {
      return bad(model, "parameters \"uri\" is for backend \"builtin\", not an ensemble");
    }
    plan.kind = ModelPlan::Kind::ensemble;
    plan.platform = "ensemble";
    for (const inference::ModelEnsembling::Step& st : c.ensemble_scheduling().step()) {
      EnsembleStep step;
      step.model_name = st.model_name();
      step.model_version = st.model_version() == 0 ? -1 : st.model_version();
      if (step.model_version < -1) {
        return bad(model, "ensemble step model '" + st.model_name() + "': model_version " +
                              std::to_string(st.model_version()) + " (-1 or a version >= 1)");
      }
      for (const auto& [k, v] : st.input_map()) step.input_map.emplace_back(k, v);
      for (const auto& [k, v] : st.output_map()) step.output_map.emplace_back(k, v);
      std::sort(step.input_map.begin(), step.input_map.end());
      std::sort(step.output_map.begin(), step.output_map.end());
      plan.ensemble_steps.push_back(std::move(step));
    }
  } else if (((backend == "builtin" || backend == "identity") &&
              (platform.empty() || platform == "asyncinfer_builtin")) ||
             (platform == "asyncinfer_builtin" && backend.empty())) {
    plan.kind = ModelPlan::Kind::builtin;
    plan.platform = "asyncinfer_builtin";
    // Triton's identity backend (its qa models' and tutorials'): input i comes back as output i.
    if (backend == "identity") {
      if (!plan.builtin_uri.empty()) {
        return bad(model,
                   "backend \"identity\" takes no parameters \"uri\" (it is builtin:identity)");
      }
      plan.builtin_uri = "builtin:identity";
      plan.builtin_takes_config_tensors = true;
      plan.form.takes_ragged_inputs = true;  // it answers each request on its own, as Triton's
    }
    if (plan.builtin_uri.rfind("builtin:", 0) != 0) {
      return bad(model,
                 "backend \"builtin\" needs parameters { key: \"uri\" value { "
                 "string_value: \"builtin:...\" } } (got '" +
                     plan.builtin_uri + "')");
    }
    if (!c.default_model_filename().empty()) {
      ignore(true, "default_model_filename", "a built-in model has no file");
    }
  } else {
    // A model file that a backend reads: the form its backend registered under the config's
    // backend or platform name (model/repository_form.hpp), as Triton's core maps them.
    ASYNCINFER_ASSIGN_OR_RETURN(plan.form, repository_form(model, platform, backend));
    const detail::RepositoryForm& form = plan.form;
    plan.kind = ModelPlan::Kind::file;
    plan.platform = form.metadata_platform;
    plan.model_filename = form.default_model_filename;
    if (!c.default_model_filename().empty()) plan.model_filename = c.default_model_filename();
    if (!form.note.empty()) {
      warnings->push_back(
          "model '" + model + "': platform \"" +
          (platform.empty() ? form.platforms.empty() ? form.name : form.platforms[0] : platform) +
          "\" " + form.note);
    }
    if (!plan.builtin_uri.empty()) {
      const std::string& p = form.metadata_platform;
      const bool vowel = !p.empty() && std::string_view("aeiou").find(p[0]) != std::string::npos;
      return bad(model, std::string("parameters \"uri\" is for backend \"builtin\"; ") +
                            (vowel ? "an " : "a ") + p + " model is loaded from <version>/" +
                            plan.model_filename);
    }
  }
  if (!c.default_model_filename().empty()) {
    ASYNCINFER_RETURN_IF_ERROR(check_file_name(
        model, "default_model_filename", c.default_model_filename(), "the model's version folder"));
  }
  // openvino takes the other parameters as OpenVINO properties; python hands them to model.py
  // (args["model_config"]["parameters"]).
  if (!plan.form.takes_backend_parameters) {
    warn_backend_parameters(model, plan, warnings);
  }
  if (plan.kind == ModelPlan::Kind::ensemble && c.instance_group_size() > 0) {
    warnings->push_back("model '" + model +
                        "': instance_group is ignored on an ensemble (its steps' models have "
                        "their instances)");
  }

  ASYNCINFER_RETURN_IF_ERROR(plan_batching(c, model, plan, warnings));
  ASYNCINFER_RETURN_IF_ERROR(plan_tensors(c, model, plan, warnings));
  // A python model's may come from its model.py's auto_complete_config (the repository checks
  // them after it: model_repository.cpp).
  const bool needs_tensors =
      plan.kind == ModelPlan::Kind::ensemble || plan.form.needs_config_tensors;
  if (needs_tensors && (plan.inputs.empty() || plan.outputs.empty())) {
    return bad(model, "a " + plan.platform +
                          " model needs input and output lists (name, data_type, dims)");
  }
  if (plan.kind == ModelPlan::Kind::ensemble) {
    if (!plan.input_reshapes.empty() || !plan.output_reshapes.empty()) {
      return bad(model,
                 "reshape on an ensemble's inputs or outputs is not supported (give it "
                 "to the step model whose tensor it is)");
    }
    ASYNCINFER_RETURN_IF_ERROR(check_ensemble_graph(plan).status());
  }
  ASYNCINFER_RETURN_IF_ERROR(plan_instances(c, model, plan, warnings));
  ASYNCINFER_RETURN_IF_ERROR(plan_sequences(c, model, plan));
  if (plan.form.host_process_instances) {
    // Its instances are host processes, whatever instance_group's kind (as in Triton, where a
    // KIND_GPU python model's model.py picks its GPU itself).
    plan.device = "cpu";
    plan.device_auto = false;
  }
  ASYNCINFER_RETURN_IF_ERROR(plan_warmup(c, model, plan));

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

Result<ModelPlan> plan_model_config_json(std::string_view json, std::string_view source,
                                         std::string_view dir_name,
                                         std::vector<std::string>* warnings,
                                         const std::vector<std::string>& version_files) {
  inference::ModelConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // Triton rejects unknown fields in the override too
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &config, options);
  if (!status.ok()) {
    return invalid_argument_error(std::string(source) +
                                  ": not a ModelConfig in JSON: " + std::string(status.message()));
  }
  complete_backend_fields(config, version_files);
  ASYNCINFER_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(config, dir_name, warnings));
  plan.config_binary = config.SerializeAsString();
  return plan;
}

Result<ModelPlan> plan_model_config(std::string_view text, std::string_view source,
                                    std::string_view dir_name, std::vector<std::string>* warnings,
                                    const std::vector<std::string>& version_files) {
  ASYNCINFER_ASSIGN_OR_RETURN(inference::ModelConfig config,
                              parse_model_config(text, source, warnings));
  complete_backend_fields(config, version_files);
  ASYNCINFER_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(config, dir_name, warnings));
  plan.config_binary = config.SerializeAsString();
  return plan;
}

}  // namespace asyncinfer::server
