// Built-in models: identity, fixed_cost and faulty. One implementation with three presets:
// every builtin copies its inputs to its outputs on the stream (a real device-side copy), may
// occupy the device for a stated cost first, and may fail chosen calls. And builtin:stream, a
// decoupled model (Triton's repeat example): n responses per request, interval_us apart.
//
// They run on every device through the device-neutral primitives only (Kernel with a duration,
// Stream::copy), so the same model measures the engine on cpu, sim and cuda.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <set>

#include "core/params.hpp"
#include "model/backend.hpp"

namespace asyncinfer::detail {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

enum class FaultMode { none, error, raise, hang };

struct BuiltinConfig {
  std::string kind;
  DType dtype = DType::f32;
  Shape item_shape = {-1};  // dims after the batch dim
  int inputs = 1;
  // The URI key max_batch_size (Triton's meaning, as in a model config): 0 = not batched, N =
  // batched with ModelSignature::batch_limit N.
  std::int64_t max_batch_size = 64;
  double base_us = 0;
  double per_item_us = 0;
  bool cost_from_input = false;
  bool spin = false;
  bool cancellable = true;  // false: the cost cannot be cut short (like a libtorch call)
  // Faults.
  FaultMode mode = FaultMode::none;
  bool fail_at_enqueue = false;
  StatusCode code = StatusCode::unavailable;
  std::int64_t every = 0;
  std::int64_t first = 0;
  bool has_poison = false;
  double poison = 0;
  std::int64_t instances = 0;  // > 0: later create_instance calls fail with `code` (device lost)
};

constexpr std::string_view kForms =
    "builtin:identity, builtin:fixed_cost?base_us=<us>&per_item_us=<us>, "
    "builtin:faulty?mode=error|throw|hang&code=<status>&every=<k>&first=<n>&poison=<value>&"
    "instances=<n>, builtin:stream?n=<responses>&interval_us=<us>&fail_after=<k>";

/// Value of element 0 of row `row` of a host tensor, as double.
double first_element(const Tensor& t, std::int64_t row) {
  const std::size_t row_elems = t.dim(0) == 0 ? 0 : t.numel() / static_cast<std::size_t>(t.dim(0));
  if (row_elems == 0) return 0;
  const std::size_t i = static_cast<std::size_t>(row) * row_elems;
  switch (t.dtype()) {
    case DType::f32:
      return t.data_as<float>()[i];
    case DType::f64:
      return t.data_as<double>()[i];
    case DType::i32:
      return t.data_as<std::int32_t>()[i];
    case DType::i64:
      return static_cast<double>(t.data_as<std::int64_t>()[i]);
    case DType::i8:
      return t.data_as<std::int8_t>()[i];
    case DType::u8:
      return t.data_as<std::uint8_t>()[i];
    case DType::boolean:
      return t.data_as<bool>()[i] ? 1 : 0;
    case DType::i16:
      return t.data_as<std::int16_t>()[i];
    case DType::u16:
      return t.data_as<std::uint16_t>()[i];
    case DType::u32:
      return t.data_as<std::uint32_t>()[i];
    case DType::u64:
      return static_cast<double>(t.data_as<std::uint64_t>()[i]);
    case DType::f16:
    case DType::bf16:
    case DType::bytes:
      return 0;  // no arithmetic on half types or strings; cost_from_input/poison need numbers
  }
  return 0;
}

/// The keys every builtin reads the same way: dtype (default f32) and shape (the dims after the
/// batch dim, default -1); invalid_argument starting with `context` for a bad value.
Status parse_tensor_keys(const Params& p, const std::string& context, DType* dtype,
                         Shape* item_shape) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::string name, p.get_string("dtype", "f32"));
  auto parsed = parse_dtype(name);
  if (!parsed.ok()) return parsed.status().with_context(context);
  *dtype = *parsed;
  ASYNCINFER_ASSIGN_OR_RETURN(*item_shape, p.get_int_list("shape", {-1}, 'x'));
  for (std::int64_t d : *item_shape) {
    if (d < -1) {
      return invalid_argument_error(context + ": shape dims must be >= -1 (-1 = dynamic)");
    }
  }
  return Status();
}

class BuiltinModel final : public Model, public std::enable_shared_from_this<BuiltinModel> {
 public:
  BuiltinModel(std::string name, BuiltinConfig cfg) : name_(std::move(name)), cfg_(std::move(cfg)) {
    sig_.batched = cfg_.max_batch_size > 0;
    if (sig_.batched) sig_.batch_limit = cfg_.max_batch_size;
    for (int i = 0; i < cfg_.inputs; ++i) {
      TensorSpec in;
      in.name = "input" + std::to_string(i);
      in.dtype = cfg_.dtype;
      if (sig_.batched) in.shape.push_back(-1);
      in.shape.insert(in.shape.end(), cfg_.item_shape.begin(), cfg_.item_shape.end());
      TensorSpec out = in;
      out.name = "output" + std::to_string(i);
      sig_.inputs.push_back(std::move(in));
      sig_.outputs.push_back(std::move(out));
    }
  }

  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  /// Takes the inputs, outputs and batching of `o` (ModelOptions::inputs etc.) instead of the
  /// URI's: as many outputs as inputs, output i of input i's dtype and shape, since output i is
  /// a copy of input i. invalid_argument naming the first pair that differs.
  Status use_signature(const ModelOptions& o, const std::string& context) {
    if (o.inputs.size() != o.outputs.size() || o.inputs.empty() ||
        static_cast<int>(o.inputs.size()) > 64) {
      return invalid_argument_error(context + ": " + std::to_string(o.inputs.size()) +
                                    " inputs and " + std::to_string(o.outputs.size()) +
                                    " outputs; an identity model needs as many outputs as inputs "
                                    "(1 to 64), output i a copy of input i");
    }
    for (std::size_t i = 0; i < o.inputs.size(); ++i) {
      const TensorSpec& in = o.inputs[i];
      const TensorSpec& out = o.outputs[i];
      if (in.dtype != out.dtype || in.shape != out.shape) {
        return invalid_argument_error(
            context + ": output '" + out.name + "' " + std::string(to_string(out.dtype)) +
            shape_to_string(out.shape) + " is not a copy of input '" + in.name + "' " +
            std::string(to_string(in.dtype)) + shape_to_string(in.shape) +
            " (output i must be input i's dtype and dims)");
      }
    }
    sig_.inputs = o.inputs;
    sig_.outputs = o.outputs;
    sig_.batched = o.batched.value_or(sig_.batched);
    sig_.batch_limit = sig_.batched ? o.batch_limit : std::nullopt;
    cfg_.inputs = static_cast<int>(o.inputs.size());
    return Status();
  }
  bool cancellable() const noexcept override { return cfg_.cancellable; }
  /// Triton's identity backend answers each request of a batch on its own, so a ragged input
  /// (TensorSpec::ragged, allow_ragged_batch) batches: with one, the identity takes a batch's
  /// requests apart (each output a copy of its own request's input). Without, it copies the
  /// joined batch at once.
  bool takes_requests_apart() const noexcept override {
    return cfg_.kind == "identity" && std::any_of(sig_.inputs.begin(), sig_.inputs.end(),
                                                  [](const TensorSpec& s) { return s.ragged; });
  }
  /// No per-thread state; not with a cost read from the input, nor with an injected hang.
  bool supports_caller_runs() const noexcept override {
    return !cfg_.cost_from_input && cfg_.mode != FaultMode::hang;
  }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& stream,
                                                         const InstanceOptions& options) override;

  const BuiltinConfig& config() const noexcept { return cfg_; }
  std::int64_t next_call() { return calls_.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::int64_t next_instance() { return made_.fetch_add(1, std::memory_order_relaxed) + 1; }

 private:
  std::string name_;
  BuiltinConfig cfg_;
  ModelSignature sig_;
  std::atomic<std::int64_t> calls_{0};  // shared by all instances: "the k-th call" is global
  std::atomic<std::int64_t> made_{0};   // create_instance calls so far
};

class BuiltinInstance final : public ModelInstance {
 public:
  BuiltinInstance(std::shared_ptr<BuiltinModel> model, Device& device)
      : model_(std::move(model)), device_(device) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    const BuiltinConfig& cfg = model_->config();
    const std::int64_t call = model_->next_call();
    Status fault = decide_fault(cfg, call, *io);
    if (!fault.ok() && cfg.fail_at_enqueue) {
      if (cfg.mode == FaultMode::raise) throw std::runtime_error(std::string(fault.message()));
      return fault;
    }
    if (!io->request_inputs.empty()) {  // takes_requests_apart: each request's own copy
      io->request_outputs.clear();
      for (const std::vector<Tensor>& ins : io->request_inputs) {
        std::vector<Tensor>& outs = io->request_outputs.emplace_back();
        for (const Tensor& in : ins) {
          ASYNCINFER_ASSIGN_OR_RETURN(Tensor out, in.clone());
          outs.push_back(std::move(out));
        }
      }
      return Status();
    }
    // Outputs: one device-side copy of each input, allocated now so the engine can enqueue the
    // copies back to the host right after.
    io->outputs.clear();
    for (const Tensor& in : io->inputs) {
      const MemoryKind kind =
          in.placement().kind == MemoryKind::device ? MemoryKind::device : MemoryKind::host;
      Result<Tensor> out =
          kind == MemoryKind::host ? Tensor::empty_like(in) : device_.empty_like(in, kind);
      if (!out.ok()) return out.status();
      io->outputs.push_back(std::move(*out));
    }
    const nanoseconds cost = cost_of(cfg, *io);
    if (cost.count() > 0 || !fault.ok()) {
      Kernel k;
      k.name = model_->name();
      k.duration = cost;
      k.spin = cfg.spin;
      if (cfg.cancellable) k.stop = io->stop;
      if (!fault.ok()) {
        const FaultMode mode = cfg.mode;
        k.host_fn = [fault, mode](std::stop_token stop) -> Status {
          if (mode == FaultMode::hang) {
            // Hangs until cancelled: the engine's deadline or watchdog stops it.
            std::mutex mu;
            std::condition_variable_any cv;
            std::unique_lock lock(mu);
            cv.wait(lock, stop, [] { return false; });
            return cancelled_error("hanging call stopped");
          }
          if (mode == FaultMode::raise) throw std::runtime_error(std::string(fault.message()));
          return fault;
        };
      }
      ASYNCINFER_RETURN_IF_ERROR(stream.enqueue(std::move(k)));
    }
    for (std::size_t i = 0; i < io->inputs.size(); ++i) {
      ASYNCINFER_RETURN_IF_ERROR(stream.copy(io->outputs[i], io->inputs[i]));
    }
    return Status();
  }

 private:
  static nanoseconds cost_of(const BuiltinConfig& cfg, const BatchIO& io) {
    double us = cfg.base_us + cfg.per_item_us * static_cast<double>(io.batch_size);
    if (cfg.cost_from_input && !io.host_inputs.empty()) {
      const Tensor& t = io.host_inputs[0];
      const std::int64_t rows = t.rank() > 0 ? t.dim(0) : 0;
      double extra = 0;
      for (std::int64_t r = 0; r < rows; ++r) extra = std::max(extra, first_element(t, r));
      us += extra;  // items of a batch run in parallel: the slowest one sets the cost
    }
    // Saturating: a cost too large to represent occupies the device until stopped.
    return saturating_cast<nanoseconds>(
        std::chrono::duration<double, std::micro>(std::max(0.0, us)));
  }

  static Status decide_fault(const BuiltinConfig& cfg, std::int64_t call, const BatchIO& io) {
    if (cfg.mode == FaultMode::none) return Status();
    bool fail = false;
    std::string why;
    if (cfg.has_poison && !io.host_inputs.empty()) {
      const Tensor& t = io.host_inputs[0];
      const std::int64_t rows = t.rank() > 0 ? t.dim(0) : 0;
      for (std::int64_t r = 0; r < rows && !fail; ++r) {
        if (first_element(t, r) == cfg.poison) {
          fail = true;
          why = "item " + std::to_string(r) + " of the batch holds the poison value";
        }
      }
    }
    if (!fail && cfg.first > 0 && call <= cfg.first) {
      fail = true;
      why = "call " + std::to_string(call) + " is among the first " + std::to_string(cfg.first);
    }
    if (!fail && cfg.every > 0 && call % cfg.every == 0) {
      fail = true;
      why = "call " + std::to_string(call) + " is a multiple of " + std::to_string(cfg.every);
    }
    if (!fail && !cfg.has_poison && cfg.first == 0 && cfg.every == 0) {
      fail = true;
      why = "every call fails";
    }
    if (!fail) return Status();
    return Status(cfg.code, "injected fault (builtin:faulty): " + why);
  }

  std::shared_ptr<BuiltinModel> model_;
  Device& device_;
};

Result<std::unique_ptr<ModelInstance>> BuiltinModel::create_instance(
    Device& device, Stream& /*stream*/, const InstanceOptions& /*options*/) {
  const std::int64_t n = next_instance();
  if (cfg_.instances > 0 && n > cfg_.instances) {
    return Status(cfg_.code, "injected fault (builtin:faulty): model instance " +
                                 std::to_string(n) + " refused, the device is lost after " +
                                 std::to_string(cfg_.instances) + " (instances=)");
  }
  return std::unique_ptr<ModelInstance>(
      std::make_unique<BuiltinInstance>(shared_from_this(), device));
}

// ---- builtin:stream ------------------------------------------------------------------------

struct StreamConfig {
  DType dtype = DType::f32;
  Shape item_shape = {-1};
  std::int64_t max_batch_size = 64;  // the URI key; 0: not batched (Triton's meaning)
  std::int64_t responses = 1;
  double interval_us = 0;
  std::int64_t fail_after = -1;  // >= 0: the batch fails (unavailable) after that many responses
};

/// Decoupled: for each request, `responses` responses (output0: its input; index: i32, the
/// response's number from 0, one per row), interval_us apart, then the final flag alone;
/// fail_after=k fails the batch (unavailable) after k responses. The
/// responses of a batch's requests go out together, on the stream's thread, which the wait
/// between them occupies as a model's own work would; it ends early when every request of the
/// batch has ended.
class StreamModel final : public Model, public std::enable_shared_from_this<StreamModel> {
 public:
  StreamModel(std::string name, StreamConfig cfg) : name_(std::move(name)), cfg_(std::move(cfg)) {
    sig_.batched = cfg_.max_batch_size > 0;
    if (sig_.batched) sig_.batch_limit = cfg_.max_batch_size;
    sig_.decoupled = true;
    TensorSpec in{"input0", cfg_.dtype, {}};
    TensorSpec index{"index", DType::i32, {}};
    if (sig_.batched) {
      in.shape.push_back(-1);
      index.shape.push_back(-1);
    }
    in.shape.insert(in.shape.end(), cfg_.item_shape.begin(), cfg_.item_shape.end());
    index.shape.push_back(1);
    TensorSpec out = in;
    out.name = "output0";
    sig_.inputs.push_back(std::move(in));
    sig_.outputs = {std::move(out), std::move(index)};
  }

  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  bool cancellable() const noexcept override { return true; }
  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& stream,
                                                         const InstanceOptions& options) override;
  const StreamConfig& config() const noexcept { return cfg_; }

 private:
  std::string name_;
  StreamConfig cfg_;
  ModelSignature sig_;
};

class StreamInstance final : public ModelInstance {
 public:
  explicit StreamInstance(std::shared_ptr<StreamModel> model) : model_(std::move(model)) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    io->outputs.clear();  // the final response is the flag alone
    Kernel k;
    k.name = model_->name();
    k.stop = io->stop;
    k.host_fn = [cfg = model_->config(), io](std::stop_token stop) -> Status {
      return run(cfg, *io, stop);
    };
    return stream.enqueue(std::move(k));
  }

 private:
  static Status run(const StreamConfig& cfg, const BatchIO& io, const std::stop_token& stop) {
    ResponseSender& sender = *io.responses;
    const std::size_t n = sender.requests();
    std::vector<bool> gone(n, false);
    const Tensor& input = io.host_inputs.at(0);
    const bool batched = cfg.max_batch_size > 0;
    std::mutex mu;
    std::condition_variable_any cv;
    for (std::int64_t k = 0; k < cfg.responses; ++k) {
      if (k == cfg.fail_after) {
        return unavailable_error("injected fault (builtin:stream): failed after " +
                                 std::to_string(k) + " responses (fail_after)");
      }
      if (k > 0 && cfg.interval_us > 0) {
        std::unique_lock lock(mu);
        const auto wait = std::chrono::duration<double, std::micro>(cfg.interval_us);
        if (cv.wait_for(lock, stop, std::chrono::duration_cast<nanoseconds>(wait),
                        [] { return false; });
            stop.stop_requested()) {
          return cancelled_error("builtin:stream stopped: every request of the batch has ended");
        }
      }
      std::int64_t offset = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const std::int64_t rows = sender.rows(i);
        const std::int64_t begin = offset;
        offset += rows;
        if (gone[i] || sender.is_cancelled(i)) {
          gone[i] = true;
          continue;
        }
        // The request's rows of the batch's input (a view: no copy).
        Result<Tensor> out = batched ? input.slice(begin, begin + rows) : Result<Tensor>(input);
        if (!out.ok()) return out.status();
        const Shape index_shape = batched ? Shape{rows, 1} : Shape{1};
        const std::vector<std::int32_t> values(static_cast<std::size_t>(batched ? rows : 1),
                                               static_cast<std::int32_t>(k));
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor index, Tensor::from_values(index_shape, values));
        if (!sender.send(i, {std::move(*out), std::move(index)}).ok()) gone[i] = true;
      }
      if (n > 0 && std::all_of(gone.begin(), gone.end(), [](bool g) { return g; })) break;
    }
    return Status();
  }

  std::shared_ptr<StreamModel> model_;
};

Result<std::unique_ptr<ModelInstance>> StreamModel::create_instance(Device& /*device*/,
                                                                    Stream& /*stream*/,
                                                                    const InstanceOptions&) {
  return std::unique_ptr<ModelInstance>(std::make_unique<StreamInstance>(shared_from_this()));
}

Result<std::shared_ptr<Model>> load_stream_model(std::string_view uri, std::string_view query) {
  const std::string context = "builtin:stream";
  ASYNCINFER_ASSIGN_OR_RETURN(Params p, Params::parse(query, '&', context));
  ASYNCINFER_RETURN_IF_ERROR(p.accept_alias("max_batch", "max_batch_size"));
  ASYNCINFER_RETURN_IF_ERROR(
      p.check_known({"dtype", "shape", "max_batch_size", "n", "interval_us", "fail_after"}));
  StreamConfig cfg;
  ASYNCINFER_RETURN_IF_ERROR(parse_tensor_keys(p, context, &cfg.dtype, &cfg.item_shape));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.max_batch_size, p.get_int("max_batch_size", 64, 0, 1 << 20));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.responses, p.get_int("n", 1, 0, 1 << 24));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.interval_us, p.get_double("interval_us", 0, 0, 3.6e9));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.fail_after, p.get_int("fail_after", -1, -1, 1 << 24));
  return std::shared_ptr<Model>(std::make_shared<StreamModel>(std::string(uri), std::move(cfg)));
}

}  // namespace

Result<std::shared_ptr<Model>> load_builtin_model(std::string_view uri, std::string_view query,
                                                  const ModelOptions& options) {
  BuiltinConfig cfg;
  cfg.kind = std::string(uri.substr(0, uri.find('?')).substr(std::string_view("builtin:").size()));
  const std::string context = "builtin:" + cfg.kind;
  if (cfg.kind == "stream") return load_stream_model(uri, query);
  if (cfg.kind != "identity" && cfg.kind != "fixed_cost" && cfg.kind != "faulty") {
    return invalid_argument_error("unknown builtin model '" + cfg.kind + "': expected " +
                                  std::string(kForms));
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Params p, Params::parse(query, '&', context));
  ASYNCINFER_RETURN_IF_ERROR(p.accept_alias("max_batch", "max_batch_size"));
  std::set<std::string> known = {"dtype", "shape", "inputs", "max_batch_size"};
  if (cfg.kind != "identity") {
    known.insert({"base_us", "per_item_us", "cost_from_input", "cpu", "cancellable"});
  }
  if (cfg.kind == "faulty")
    known.insert({"mode", "code", "every", "first", "poison", "fail_at", "instances"});
  ASYNCINFER_RETURN_IF_ERROR(p.check_known(known));

  ASYNCINFER_RETURN_IF_ERROR(parse_tensor_keys(p, context, &cfg.dtype, &cfg.item_shape));
  ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t inputs, p.get_int("inputs", 1, 1, 64));
  cfg.inputs = static_cast<int>(inputs);
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.max_batch_size, p.get_int("max_batch_size", 64, 0, 1 << 20));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.base_us, p.get_double("base_us", 0, 0, 3.6e9));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.per_item_us, p.get_double("per_item_us", 0, 0, 3.6e9));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.cost_from_input, p.get_bool("cost_from_input", false));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.cancellable, p.get_bool("cancellable", true));
  ASYNCINFER_ASSIGN_OR_RETURN(std::string cpu, p.get_string("cpu", "sleep"));
  if (cpu != "sleep" && cpu != "spin") {
    return invalid_argument_error(context + ": cpu=" + cpu + " is not one of sleep, spin");
  }
  cfg.spin = cpu == "spin";
  if (cfg.kind == "faulty") {
    ASYNCINFER_ASSIGN_OR_RETURN(std::string mode, p.get_string("mode", "error"));
    if (mode == "error") {
      cfg.mode = FaultMode::error;
    } else if (mode == "throw") {
      cfg.mode = FaultMode::raise;
    } else if (mode == "hang") {
      cfg.mode = FaultMode::hang;
    } else {
      return invalid_argument_error(context + ": mode=" + mode +
                                    " is not one of error, throw, hang");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(std::string code, p.get_string("code", "unavailable"));
    if (!parse_status_code(code, &cfg.code) || cfg.code == StatusCode::ok) {
      return invalid_argument_error(context + ": code=" + code +
                                    " is not a non-ok status code name (e.g. unavailable, "
                                    "internal, resource_exhausted, invalid_argument)");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(cfg.every, p.get_int("every", 0, 0, std::int64_t{1} << 40));
    ASYNCINFER_ASSIGN_OR_RETURN(cfg.first, p.get_int("first", 0, 0, std::int64_t{1} << 40));
    if (p.has("poison")) {
      cfg.has_poison = true;
      ASYNCINFER_ASSIGN_OR_RETURN(cfg.poison, p.get_double("poison", 0, -1e300, 1e300));
    }
    ASYNCINFER_ASSIGN_OR_RETURN(std::string at, p.get_string("fail_at", "device"));
    if (at != "device" && at != "enqueue") {
      return invalid_argument_error(context + ": fail_at=" + at + " is not one of device, enqueue");
    }
    cfg.fail_at_enqueue = at == "enqueue";
    ASYNCINFER_ASSIGN_OR_RETURN(cfg.instances, p.get_int("instances", 0, 0, 1 << 20));
  }
  auto model = std::make_shared<BuiltinModel>(std::string(uri), std::move(cfg));
  if (!options.inputs.empty() || !options.outputs.empty()) {
    // The tensors a model config lists (Triton's identity backend: input i is output i).
    ASYNCINFER_RETURN_IF_ERROR(model->use_signature(options, context));
  }
  return std::shared_ptr<Model>(std::move(model));
}

void register_builtin_model_backend(ModelBackendRegistry& registry) {
  (void)registry.add({"builtin:identity", "builtin:identity", &load_builtin_model});
  (void)registry.add(
      {"builtin:fixed_cost", "builtin:fixed_cost?base_us=&per_item_us=...", &load_builtin_model});
  (void)registry.add({"builtin:faulty", "builtin:faulty?mode=&code=&every=&first=&poison=...",
                      &load_builtin_model});
  (void)registry.add(
      {"builtin:stream", "builtin:stream?n=&interval_us=... (decoupled)", &load_builtin_model});
}

}  // namespace asyncinfer::detail
