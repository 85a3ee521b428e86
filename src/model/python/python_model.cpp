// The python backend: a Triton model.py, each instance in its own Python process
// (python_process.hpp). URI "python:<path to model.py>" or a path ending in "model.py"; the
// signature comes from ModelOptions (the server passes config.pbtxt's input, output,
// max_batch_size (as batched and batch_limit) and model_transaction_policy, and the config itself
// as JSON for args["model_config"]).
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "asyncinfer/log.hpp"
#include "model/backend.hpp"
#include "model/model_host.hpp"
#include "model/python/python_process.hpp"

namespace asyncinfer::detail {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kDefaultInterpreter = "/usr/bin/python3";

// model_config.proto's TYPE_* name of a dtype (args["model_config"] built without the server).
std::string config_type(DType d) {
  switch (d) {
    case DType::f32:
      return "TYPE_FP32";
    case DType::f16:
      return "TYPE_FP16";
    case DType::bf16:
      return "TYPE_BF16";
    case DType::f64:
      return "TYPE_FP64";
    case DType::i8:
      return "TYPE_INT8";
    case DType::u8:
      return "TYPE_UINT8";
    case DType::i16:
      return "TYPE_INT16";
    case DType::u16:
      return "TYPE_UINT16";
    case DType::i32:
      return "TYPE_INT32";
    case DType::u32:
      return "TYPE_UINT32";
    case DType::i64:
      return "TYPE_INT64";
    case DType::u64:
      return "TYPE_UINT64";
    case DType::boolean:
      return "TYPE_BOOL";
    case DType::bytes:
      return "TYPE_STRING";
  }
  return "TYPE_INVALID";
}

// The config as Triton's model-configuration JSON, for a model loaded without a config.pbtxt.
std::string minimal_config(const std::string& name, const ModelSignature& sig) {
  auto list = [&](const std::vector<TensorSpec>& specs) {
    json out = json::array();
    for (const TensorSpec& s : specs) {
      json dims = json::array();
      for (std::size_t d = sig.batched ? 1 : 0; d < s.shape.size(); ++d) dims.push_back(s.shape[d]);
      out.push_back({{"name", s.name}, {"data_type", config_type(s.dtype)}, {"dims", dims}});
    }
    return out;
  };
  json c = {{"name", name},
            {"backend", "python"},
            // Triton's max_batch_size: 0 = no batch dim (and, here, a batched model without a
            // batch limit of its own).
            {"max_batch_size", sig.batched ? sig.batch_limit.value_or(0) : 0},
            {"input", list(sig.inputs)},
            {"output", list(sig.outputs)},
            {"model_transaction_policy", {{"decoupled", sig.decoupled}}}};
  return c.dump();
}

// The process of one instance, shared with the host functions of its batches (which may still
// run when the instance is destroyed).
struct Slot {
  std::shared_ptr<const PythonSetup> setup;
  std::string instance_name;
  std::unique_ptr<PythonProcess> process;

  Status run(BatchIO& io, const std::stop_token& stop) {
    if (!process || !process->alive() || process->exited()) {
      // It crashed, hung or was stopped during an earlier batch, or died (killed) since: a new
      // process, initialize again.
      if (process && process->alive()) {
        log(LogLevel::warning, "python model '" + setup->model_name + "' instance " +
                                   instance_name + ": its process ended between batches");
      }
      process.reset();
      Result<std::unique_ptr<PythonProcess>> p = PythonProcess::start(setup, instance_name, &stop);
      if (!p.ok()) {
        return Status(p.status().code(),
                      "restarting the instance failed: " + std::string(p.status().message()));
      }
      process = std::move(*p);
      log(LogLevel::warning, "python model '" + setup->model_name + "' instance " + instance_name +
                                 ": restarted (pid " + std::to_string(process->pid()) + ")");
    }
    return process->execute(io, stop);
  }
};

class PythonInstance final : public ModelInstance {
 public:
  explicit PythonInstance(std::shared_ptr<Slot> slot) : slot_(std::move(slot)) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    io->outputs.clear();  // filled by the host function (decoupled: left empty, the final flag)
    Kernel k;
    k.name = "model.py";  // errors name the model and instance themselves
    k.stop = io->stop;
    k.host_fn = [slot = slot_, io](std::stop_token stop) -> Status { return slot->run(*io, stop); };
    return stream.enqueue(std::move(k));
  }

 private:
  std::shared_ptr<Slot> slot_;
};

class PythonModel final : public Model {
 public:
  explicit PythonModel(std::shared_ptr<const PythonSetup> setup) : setup_(std::move(setup)) {}

  const ModelSignature& signature() const noexcept override { return setup_->signature; }
  const std::string& name() const noexcept override { return setup_->uri; }
  // model.py learns of the end of its requests through is_cancelled(); one that ignores it is
  // stopped after PythonSetup::stop_grace.
  bool cancellable() const noexcept override { return true; }
  bool uses_host_cores(const Device& /*device*/) const noexcept override { return true; }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& /*stream*/,
                                                         const InstanceOptions& options) override {
    // Its instances are host processes that decide their outputs' shapes while the batch runs:
    // the outputs are allocated then, which only a device whose memory is the host's allows.
    if (!device.info().unified_memory) {
      return unavailable_error("python model '" + setup_->model_name +
                               "': runs on a device whose memory is the host's (unified memory: "
                               "cpu), since its instances are host processes that allocate their "
                               "outputs while the batch runs; not on " +
                               device.name());
    }
    auto slot = std::make_shared<Slot>();
    slot->setup = setup_;
    // Triton's instance names: <model>_<group>_<index>.
    slot->instance_name = setup_->model_name + "_0_" + std::to_string(options.worker_index);
    // A caller that can abandon the creation (a model server's load, with its own deadline)
    // bounds initialize() itself.
    const bool bounded = options.stop.stop_possible();
    ASYNCINFER_ASSIGN_OR_RETURN(
        slot->process, PythonProcess::start(setup_, slot->instance_name, &options.stop, bounded));
    return std::unique_ptr<ModelInstance>(std::make_unique<PythonInstance>(std::move(slot)));
  }

 private:
  std::shared_ptr<const PythonSetup> setup_;
};

}  // namespace

Result<std::shared_ptr<Model>> load_python_model(std::string_view uri, std::string_view path,
                                                 const ModelOptions& options) {
  std::error_code ec;
  const fs::path file = fs::absolute(fs::path(path), ec);
  if (ec || !fs::is_regular_file(file, ec)) {
    return not_found_error("python model: no file " + std::string(path));
  }
  if (options.inputs.empty() || options.outputs.empty()) {
    return invalid_argument_error(
        "python model " + file.string() +
        ": its inputs and outputs must be given (config.pbtxt input and output, with name, "
        "data_type and dims; auto_complete_config is not supported)");
  }
  auto setup = std::make_shared<PythonSetup>();
  setup->uri = std::string(uri);
  setup->model_py = file.string();
  // <repository>/<model>/<version>/model.py, as Triton lays a repository out.
  const fs::path version_dir = file.parent_path();
  setup->model_version = version_dir.filename().string();
  setup->model_repository = version_dir.parent_path().string();
  setup->model_name = version_dir.parent_path().filename().string();
  setup->interpreter = std::string(kDefaultInterpreter);
  setup->host = options.host;
  for (const auto& [key, value] : options.backend_parameters) {
    // Other keys are model.py's own: it reads them from args["model_config"]["parameters"].
    if (key == "python_interpreter") setup->interpreter = value;
  }
  ModelSignature& sig = setup->signature;
  sig.inputs = options.inputs;
  sig.outputs = options.outputs;
  sig.batched = options.batched.value_or(options.batch_limit.has_value());
  sig.batch_limit = sig.batched ? options.batch_limit : std::nullopt;
  sig.decoupled = options.decoupled;
  for (const auto* list : {&sig.inputs, &sig.outputs}) {
    for (const TensorSpec& s : *list) {
      if (s.dtype == DType::bf16) {
        return invalid_argument_error("python model " + file.string() + ": tensor '" + s.name +
                                      "' is BF16, which numpy has no type for");
      }
      if (sig.batched && (s.shape.empty() || s.shape[0] != -1)) {
        return invalid_argument_error("python model " + file.string() + ": tensor '" + s.name +
                                      "' needs a dynamic batch dim 0 (the model is batched)");
      }
    }
  }
  setup->config_json = options.model_config_json.empty() ? minimal_config(setup->model_name, sig)
                                                         : options.model_config_json;
  return std::shared_ptr<Model>(std::make_shared<PythonModel>(std::move(setup)));
}

void register_python_model_backend(ModelBackendRegistry& registry) {
  (void)registry.add(
      {"python", "python:<model.py> or a path ending in model.py", &load_python_model});
}

}  // namespace asyncinfer::detail
