// The OpenVINO model backend: "openvino:<path>", or a path ending in ".onnx" or ".xml" (ONNX files
// through OpenVINO's ONNX front end, OpenVINO IR as model.xml + model.bin), run by OpenVINO's CPU
// plugin. Implements load_openvino_model (model/backend.hpp).
//
// One file of about 870 lines, on purpose: it is the only translation unit that includes
// OpenVINO's headers (<openvino/openvino.hpp> alone is about 126,000 lines once preprocessed), and
// each of its parts works on OpenVINO's types (ov::Model and ov::PartialShape in loading,
// ov::CompiledModel and ov::InferRequest in the model and its instances, ov::element::Type in
// dtypes), so split files would each include them again. Its sections, in order: OpenVINO's errors
// (trim_reason, status_from_current_exception), dtypes (and shape helpers), the model (the shared
// ov::Core, OpenVinoDefinition, RequestSlot, OpenVinoInstance, OpenVinoModel), loading (ports,
// aliased outputs, reshaping, matching a config's specs, the check run, load_openvino_model).
//
// Loading (load_openvino_model): ov::Core::read_model reads the file (an unreadable file, a missing
// .bin, or an operator OpenVINO does not support fail here, with OpenVINO's reason); the signature
// comes from the model's ports: names (the tensor names: ONNX's), dtypes, and partial shapes with
// -1 for dynamic dims. The model is batched when dim 0 of every input and output is dynamic.
// ModelOptions can then narrow it, as Triton's config.pbtxt does:
//   - batched = true on a model whose dim 0 is static: dim 0 of every input is reshaped to dynamic
//     (ov::Model::reshape), and the outputs must follow;
//   - batched = false: no batch dim, whatever the model's dim 0;
//   - inputs / outputs (a config's lists, in its order, matched to the ports by name; outputs may
//     be a subset): dtypes must be equal; a dim the model leaves dynamic may be fixed (inputs: the
//     model is reshaped to it; outputs: checked after each run); a dim the model fixes must be
//     given as that number. invalid_argument names the tensor, the dim, both values and the file.
// A name used twice by the model is refused.
// The model is compiled once for OpenVINO's "CPU" device with PERFORMANCE_HINT THROUGHPUT unless
// ModelOptions::backend_parameters say otherwise (NUM_STREAMS, INFERENCE_NUM_THREADS,
// PERFORMANCE_HINT and every other CPU property, passed as strings: OpenVINO parses and checks
// them). One inference on zeros (batch 1, dynamic dims 1) checks that it runs.
//
// Instances: each is one ov::InferRequest of the shared ov::CompiledModel, so an engine of N
// workers keeps N requests in flight, one per OpenVINO stream when N is the compiled model's
// optimal number of infer requests (Model::preferred_instances, which EngineOptions::workers = 0
// follows). A batch's inputs are wrapped as ov::Tensor over the engine's buffers, not copied;
// outputs whose dims after the batch dim the model fixes are allocated by the engine's device and
// handed to OpenVINO with set_tensor, so OpenVINO writes into them (zero copy), and the shape it
// reports after the run must be that buffer's (a model may return fewer rows than it declares);
// an output with a dynamic dim after the batch dim, or one that is a model input passed through
// or shares an earlier output's tensor (binding a buffer to it would rebind that tensor), is
// copied out of OpenVINO's own buffer (cpu only) after its shape is checked. The batch runs as a
// kernel on the worker's stream: start_async(), then the stream waits on a condition variable
// that the request's set_callback signals, so OpenVINO's own stream threads do the work and the
// stream moves on in order when it ends; a fired stop token (cancel, deadline, recycling) calls
// InferRequest::cancel().
//
// Devices: cpu and sim (host memory underneath; on sim every output dim after the batch dim must
// be fixed, since outputs exist before the work runs). cuda and npu: unavailable.
//
// Precision: OpenVINO's own defaults (bf16 on CPUs with AMX or AVX512-BF16, i64 computed in 32
// bits by the CPU plugin); INFERENCE_PRECISION_HINT=f32 among the parameters asks for f32.
//
// Errors: OpenVINO's exceptions never escape; messages are cut at 4000 characters.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>

#include <nlohmann/json.hpp>
#include <openvino/openvino.hpp>
#include <openvino/runtime/exception.hpp>

#include "model/backend.hpp"
#include "model/config_types.hpp"

namespace asyncinfer::detail {
namespace {

namespace fs = std::filesystem;

// ---- OpenVINO's errors -------------------------------------------------------------------

constexpr std::size_t kMaxReason = 4000;

/// OpenVINO's message on one line, without the "Exception from <source file>" and "Check '...'
/// failed at <source file>" lines it stacks above the reason.
std::string trim_reason(const std::string& text) {
  std::string out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
    // "... Check 'a == b' failed at src/plugins/x.cpp:52: reason": keep the text around it.
    std::string kept;
    if (const std::size_t check = line.find("Check '");
        check != std::string_view::npos && check > 0) {
      const std::size_t at = line.find(" failed at ", check);
      const std::size_t colon = at == std::string_view::npos ? at : line.find(": ", at);
      if (colon != std::string_view::npos) {
        kept = std::string(line.substr(0, check)) + std::string(line.substr(colon + 2));
        line = kept;
      }
    }
    if (!line.empty() && !line.starts_with("Exception from ") && !line.starts_with("Check '")) {
      out += (out.empty() ? "" : " ") + std::string(line);
    }
    begin = end + 1;
  }
  if (out.empty()) out = text;
  if (out.size() > kMaxReason) out = out.substr(0, kMaxReason) + " [...]";
  return out;
}

/// The Status for the exception in flight, thrown by OpenVINO while doing `what`.
Status status_from_current_exception(const std::string& what, StatusCode code) {
  try {
    throw;
  } catch (const ov::Cancelled&) {
    return cancelled_error(what + ": cancelled");
  } catch (const std::bad_alloc&) {
    return resource_exhausted_error(what + ": out of host memory");
  } catch (const std::exception& e) {
    return Status(code, what + ": " + trim_reason(e.what()));
  } catch (...) {
    return Status(code, what + ": unknown exception");
  }
}

// ---- dtypes ------------------------------------------------------------------------------

bool from_element_type(const ov::element::Type& t, DType* out) {
  switch (t) {
    case ov::element::Type_t::f32:
      *out = DType::f32;
      return true;
    case ov::element::Type_t::f16:
      *out = DType::f16;
      return true;
    case ov::element::Type_t::bf16:
      *out = DType::bf16;
      return true;
    case ov::element::Type_t::f64:
      *out = DType::f64;
      return true;
    case ov::element::Type_t::i8:
      *out = DType::i8;
      return true;
    case ov::element::Type_t::u8:
      *out = DType::u8;
      return true;
    case ov::element::Type_t::i16:
      *out = DType::i16;
      return true;
    case ov::element::Type_t::u16:
      *out = DType::u16;
      return true;
    case ov::element::Type_t::i32:
      *out = DType::i32;
      return true;
    case ov::element::Type_t::u32:
      *out = DType::u32;
      return true;
    case ov::element::Type_t::i64:
      *out = DType::i64;
      return true;
    case ov::element::Type_t::u64:
      *out = DType::u64;
      return true;
    case ov::element::Type_t::boolean:
      *out = DType::boolean;
      return true;
    default:
      return false;
  }
}

ov::element::Type to_element_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ov::element::f32;
    case DType::f16:
      return ov::element::f16;
    case DType::bf16:
      return ov::element::bf16;
    case DType::f64:
      return ov::element::f64;
    case DType::i8:
      return ov::element::i8;
    case DType::u8:
      return ov::element::u8;
    case DType::i16:
      return ov::element::i16;
    case DType::u16:
      return ov::element::u16;
    case DType::i32:
      return ov::element::i32;
    case DType::u32:
      return ov::element::u32;
    case DType::i64:
      return ov::element::i64;
    case DType::u64:
      return ov::element::u64;
    case DType::boolean:
      return ov::element::boolean;
    case DType::bytes:
      break;
  }
  return ov::element::dynamic;
}

ov::Shape to_ov_shape(const Shape& shape) {
  ov::Shape out;
  out.reserve(shape.size());
  for (std::int64_t d : shape) out.push_back(static_cast<std::size_t>(d));
  return out;
}

std::string spec_string(const TensorSpec& s) {
  return "'" + s.name + "' " + std::string(to_string(s.dtype)) + shape_to_string(s.shape);
}

// ---- the model ---------------------------------------------------------------------------

/// The process's ov::Core, shared by the models alive (it holds the plugins; one per process is
/// OpenVINO's advice). Thread-safe.
Result<std::shared_ptr<ov::Core>> shared_core() {
  static std::mutex mu;
  static std::weak_ptr<ov::Core> weak;
  std::lock_guard<std::mutex> lock(mu);
  if (auto core = weak.lock()) return core;
  try {
    auto core = std::make_shared<ov::Core>();
    weak = core;
    return core;
  } catch (...) {
    return status_from_current_exception("OpenVINO: cannot create ov::Core",
                                         StatusCode::unavailable);
  }
}

/// What a loaded model shares with its instances. Immutable after load.
struct OpenVinoDefinition {
  std::string path;
  std::string what;  ///< "openvino model '<path>'"
  std::shared_ptr<ov::Core> core;
  /// create_infer_request() is thread-safe but not const in OpenVINO's API.
  mutable ov::CompiledModel compiled;
  ModelSignature signature;
  /// The compiled model's port of each signature input / output (the signature follows a
  /// config's order, which may differ from the model's).
  std::vector<ov::Output<const ov::Node>> input_ports;
  std::vector<ov::Output<const ov::Node>> output_ports;
  /// Per output: every dim after the batch dim is fixed, so the engine allocates it and OpenVINO
  /// writes into it.
  std::vector<bool> output_preallocated;
  int optimal_requests = 1;
};

/// One in-flight slot: an infer request and the completion its callback signals. Shared with the
/// kernels of the batches run on it, so it outlives any batch in flight.
class RequestSlot {
 public:
  explicit RequestSlot(std::shared_ptr<const OpenVinoDefinition> def, ov::InferRequest request)
      : def_(std::move(def)), request_(std::move(request)) {
    // Notified under the lock: once the waiter sees done_ the callback touches nothing of ours,
    // so the slot may be destroyed as soon as run() returns.
    request_.set_callback([this](std::exception_ptr error) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::move(error);
      done_ = true;
      cv_.notify_all();
    });
  }
  RequestSlot(const RequestSlot&) = delete;
  RequestSlot& operator=(const RequestSlot&) = delete;

  /// Runs one batch: binds `io`'s buffers, starts the request and waits for its callback. Called
  /// on the stream's thread, one batch at a time (the stream is in order).
  Status run(BatchIO& io, std::int64_t batch, const std::stop_token& stop, bool unified,
             Device& device) {
    const ModelSignature& sig = def_->signature;
    try {
      for (std::size_t i = 0; i < io.inputs.size(); ++i) {
        const Tensor& in = io.inputs[i];
        request_.set_tensor(def_->input_ports[i], ov::Tensor(to_element_type(in.dtype()),
                                                             to_ov_shape(in.shape()), in.data()));
      }
      for (std::size_t i = 0; i < sig.outputs.size(); ++i) {
        if (!def_->output_preallocated[i]) continue;
        const Tensor& out = io.outputs[i];
        request_.set_tensor(
            def_->output_ports[i],
            ov::Tensor(to_element_type(out.dtype()), to_ov_shape(out.shape()), out.data()));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = false;
        error_ = nullptr;
      }
      request_.start_async();
    } catch (...) {
      return status_from_current_exception(def_->what + ": starting the inference",
                                           StatusCode::internal);
    }
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      std::stop_token token = stop;
      if (!cv_.wait(lock, token, [this] { return done_; })) {
        // Cancelled, timed out or recycled: OpenVINO stops at its next stage and still calls
        // back (with ov::Cancelled), after which the request may be reused.
        lock.unlock();
        try {
          request_.cancel();
        } catch (...) {
        }
        lock.lock();
        cv_.wait(lock, [this] { return done_; });
      }
      error = error_;
    }
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (...) {
        return status_from_current_exception(def_->what + ": inference", StatusCode::internal);
      }
    }
    if (stop.stop_requested()) {
      return cancelled_error(def_->what + ": batch cancelled while it ran");
    }
    for (std::size_t i = 0; i < sig.outputs.size(); ++i) {
      try {
        const ov::Tensor t = request_.get_tensor(def_->output_ports[i]);
        const ov::Shape got = t.get_shape();
        Shape shape(got.begin(), got.end());
        // Built only for an error: this runs for every output of every batch.
        auto output = [&] { return def_->what + ": output '" + sig.outputs[i].name + "'"; };
        if (def_->output_preallocated[i]) {
          // OpenVINO wrote into the engine's buffer, unless the model made the output smaller
          // (it then shrinks its view and leaves the rest unwritten) or rebound it.
          const Tensor& out = io.outputs[i];
          if (shape != out.shape() || t.data() != out.data()) {
            return internal_error(output() + " came out as " + shape_to_string(shape) + ", " +
                                  shape_to_string(out.shape()) + " was expected (" +
                                  spec_string(sig.outputs[i]) + " at a batch of " +
                                  std::to_string(batch) + ")");
          }
          continue;
        }
        // Outputs OpenVINO allocated (a dim the model leaves dynamic after the batch dim, or an
        // output that is also an input): copied out, after checking the dims the signature fixes.
        bool fits = shape.size() == sig.outputs[i].shape.size() &&
                    (!sig.batched || (!shape.empty() && shape[0] == batch));
        for (std::size_t d = sig.batched ? 1 : 0; fits && d < shape.size(); ++d) {
          fits = sig.outputs[i].shape[d] < 0 || sig.outputs[i].shape[d] == shape[d];
        }
        if (!fits) {
          return internal_error(output() + " came out as " + shape_to_string(shape) +
                                ", which does not fit " + spec_string(sig.outputs[i]) +
                                (sig.batched ? " at a batch of " + std::to_string(batch) : ""));
        }
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor out,
                                    device.empty(sig.outputs[i].dtype, std::move(shape),
                                                 unified ? MemoryKind::device : MemoryKind::host));
        if (out.byte_size() != t.get_byte_size()) {
          return internal_error(output() + " holds " + std::to_string(t.get_byte_size()) +
                                " bytes, expected " + std::to_string(out.byte_size()));
        }
        if (out.byte_size() > 0) std::memcpy(out.data(), t.data(), out.byte_size());
        io.outputs[i] = std::move(out);
      } catch (...) {
        return status_from_current_exception(
            def_->what + ": reading output '" + sig.outputs[i].name + "'", StatusCode::internal);
      }
    }
    return Status();
  }

 private:
  std::shared_ptr<const OpenVinoDefinition> def_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  bool done_ = true;
  std::exception_ptr error_;
  /// Last, so destroyed first: its destructor waits for a request still in OpenVINO's pipeline
  /// (and so for the callback above) while the members the callback uses still exist.
  ov::InferRequest request_;
};

class OpenVinoInstance final : public ModelInstance {
 public:
  OpenVinoInstance(std::shared_ptr<const OpenVinoDefinition> def, std::shared_ptr<RequestSlot> slot,
                   Device& device, Stream& stream)
      : def_(std::move(def)),
        slot_(std::move(slot)),
        device_(device),
        stream_(&stream),
        unified_(device.info().unified_memory) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    if (&stream != stream_) {
      return failed_precondition_error(def_->what +
                                       ": enqueue on a stream other than the instance's own");
    }
    if (!io) return invalid_argument_error(def_->what + ": null BatchIO");
    const ModelSignature& sig = def_->signature;
    Status st = validate_inputs(sig, io->inputs);
    if (!st.ok()) return st.with_context(def_->what);
    for (std::size_t i = 0; i < io->inputs.size(); ++i) {
      if (!io->inputs[i].is_host_accessible()) {
        return invalid_argument_error(def_->what + ": input '" + sig.inputs[i].name +
                                      "' is not in host-accessible memory");
      }
    }
    const std::int64_t batch = sig.batched ? io->inputs[0].dim(0) : 1;
    io->outputs.assign(sig.outputs.size(), Tensor());
    for (std::size_t i = 0; i < sig.outputs.size(); ++i) {
      if (!def_->output_preallocated[i]) continue;
      Shape shape = sig.outputs[i].shape;
      if (sig.batched) shape[0] = batch;
      ASYNCINFER_ASSIGN_OR_RETURN(io->outputs[i],
                                  device_.empty(sig.outputs[i].dtype, shape, MemoryKind::device));
    }
    Kernel k;
    k.name = def_->what;
    k.stop = io->stop;
    k.host_fn = [slot = slot_, io, batch, unified = unified_, &device = device_,
                 what = def_->what](std::stop_token stop) -> Status {
      if (stop.stop_requested()) {
        return cancelled_error(what + ": batch skipped: cancelled before it started");
      }
      return slot->run(*io, batch, stop, unified, device);
    };
    return stream.enqueue(std::move(k));
  }

 private:
  std::shared_ptr<const OpenVinoDefinition> def_;
  std::shared_ptr<RequestSlot> slot_;
  Device& device_;
  Stream* stream_;
  bool unified_;
};

class OpenVinoModel final : public Model {
 public:
  explicit OpenVinoModel(std::shared_ptr<const OpenVinoDefinition> def) : def_(std::move(def)) {}

  const ModelSignature& signature() const noexcept override { return def_->signature; }
  const std::string& name() const noexcept override { return def_->path; }
  /// A running request stops at its next stage when its batch is cancelled.
  bool cancellable() const noexcept override { return true; }
  /// OpenVINO's CPU plugin computes on the stream's host thread, on the batch's tensors in place:
  /// on a device whose memory host code can address (cpu, sim).
  bool uses_host_cores(const Device& device) const noexcept override {
    return device.capabilities().host_addressable_memory;
  }
  int preferred_instances(const Device& device) const noexcept override {
    return uses_host_cores(device) ? def_->optimal_requests : 0;
  }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& stream,
                                                         const InstanceOptions&) override {
    if (!device.capabilities().host_addressable_memory) {
      return unavailable_error(def_->what +
                               ": the openvino backend (OpenVINO's CPU plugin) runs on devices "
                               "whose memory the host can address (cpu, sim); not on " +
                               device.name());
    }
    if (!device.info().unified_memory) {
      for (std::size_t i = 0; i < def_->signature.outputs.size(); ++i) {
        if (!def_->output_preallocated[i]) {
          return unavailable_error(def_->what + ": output " +
                                   spec_string(def_->signature.outputs[i]) +
                                   " is not written in place (a dim the model leaves dynamic "
                                   "after the batch dim, or an output that is also an input); on " +
                                   device.name() +
                                   " (no unified memory) outputs are allocated before the "
                                   "inference runs; use cpu");
        }
      }
    }
    try {
      auto slot = std::make_shared<RequestSlot>(def_, def_->compiled.create_infer_request());
      return std::unique_ptr<ModelInstance>(
          std::make_unique<OpenVinoInstance>(def_, std::move(slot), device, stream));
    } catch (...) {
      return status_from_current_exception(def_->what + ": creating an infer request",
                                           StatusCode::resource_exhausted);
    }
  }

 private:
  std::shared_ptr<const OpenVinoDefinition> def_;
};

// ---- loading -----------------------------------------------------------------------------

/// A port's name: its first tensor name (ONNX's input/output name), else the node's.
std::string port_name(const ov::Output<ov::Node>& port) {
  const auto& names = port.get_names();
  if (!names.empty()) return port.get_any_name();
  return port.get_node()->get_friendly_name();
}

/// The spec of one port; invalid_argument for a dtype or rank asyncinfer cannot hold.
Result<TensorSpec> port_spec(const ov::Output<ov::Node>& port, const char* kind,
                             const std::string& what) {
  TensorSpec spec;
  spec.name = port_name(port);
  const ov::element::Type type = port.get_element_type();
  if (!from_element_type(type, &spec.dtype)) {
    return invalid_argument_error(what + ": " + kind + " '" + spec.name + "' has element type " +
                                  type.get_type_name() +
                                  ", which asyncinfer has no dtype for (it takes f32, f16, bf16, "
                                  "f64, i8, i16, i32, i64, u8, u16, u32, u64 and boolean)");
  }
  const ov::PartialShape& ps = port.get_partial_shape();
  if (ps.rank().is_dynamic()) {
    return invalid_argument_error(what + ": " + kind + " '" + spec.name +
                                  "' has a dynamic rank; asyncinfer needs the rank fixed");
  }
  for (const ov::Dimension& d : ps) {
    spec.shape.push_back(d.is_static() ? d.get_length() : -1);
  }
  return spec;
}

struct Ports {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

Result<Ports> read_ports(const std::shared_ptr<ov::Model>& model, const std::string& what) {
  Ports p;
  try {
    for (const auto& port : model->inputs()) {
      ASYNCINFER_ASSIGN_OR_RETURN(TensorSpec s, port_spec(port, "input", what));
      p.inputs.push_back(std::move(s));
    }
    for (const auto& port : model->outputs()) {
      ASYNCINFER_ASSIGN_OR_RETURN(TensorSpec s, port_spec(port, "output", what));
      p.outputs.push_back(std::move(s));
    }
  } catch (...) {
    return status_from_current_exception(what + ": reading its inputs and outputs",
                                         StatusCode::invalid_argument);
  }
  if (p.inputs.empty()) return invalid_argument_error(what + ": the model has no inputs");
  if (p.outputs.empty()) return invalid_argument_error(what + ": the model has no outputs");
  for (const auto* list : {&p.inputs, &p.outputs}) {
    for (std::size_t i = 0; i < list->size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if ((*list)[i].name == (*list)[j].name) {
          return invalid_argument_error(
              what + ": the model lists " + (list == &p.inputs ? "input" : "output") + " '" +
              (*list)[i].name + "' twice (" + std::to_string(j) + " and " + std::to_string(i) +
              "); asyncinfer needs every name once");
        }
      }
    }
  }
  return p;
}

/// Per output of `model`: whether its tensor is not its own: a model input passed through (its
/// Result reads a Parameter, or it bears an input's name), or the tensor of an earlier output.
Result<std::vector<bool>> aliased_outputs(const std::shared_ptr<ov::Model>& model,
                                          const std::string& what) {
  try {
    std::set<std::string> input_names;
    for (const auto& port : model->inputs()) {
      for (const std::string& n : port.get_names()) input_names.insert(n);
    }
    std::vector<bool> out;
    std::vector<ov::Output<ov::Node>> sources;
    for (const auto& port : model->outputs()) {
      const ov::Output<ov::Node> source = port.get_node()->input_value(0);
      bool aliased =
          ov::as_type_ptr<ov::op::v0::Parameter>(source.get_node_shared_ptr()) != nullptr ||
          std::find(sources.begin(), sources.end(), source) != sources.end();
      for (const std::string& n : port.get_names()) aliased = aliased || input_names.count(n) > 0;
      sources.push_back(source);
      out.push_back(aliased);
    }
    return out;
  } catch (...) {
    return status_from_current_exception(what + ": reading its outputs",
                                         StatusCode::invalid_argument);
  }
}

/// Reshapes the model's inputs to `shapes` (by input index); OpenVINO propagates to the outputs.
Status reshape(const std::shared_ptr<ov::Model>& model,
               const std::map<std::size_t, ov::PartialShape>& shapes, const std::string& what,
               const std::string& why) {
  if (shapes.empty()) return Status();
  try {
    std::map<ov::Output<ov::Node>, ov::PartialShape> by_port;
    for (const auto& [index, shape] : shapes) by_port.emplace(model->input(index), shape);
    model->reshape(by_port);
  } catch (...) {
    return status_from_current_exception(what + ": OpenVINO cannot reshape it (" + why + ")",
                                         StatusCode::invalid_argument);
  }
  return Status();
}

ov::PartialShape partial_shape(const Shape& shape) {
  std::vector<ov::Dimension> dims;
  for (std::int64_t d : shape)
    dims.emplace_back(d < 0 ? ov::Dimension::dynamic() : ov::Dimension(d));
  return ov::PartialShape(dims);
}

/// Matches the caller's specs (a config's list, in its order) to the model's ports by name.
/// Returns each spec's port index; fills `reshapes` where a spec fixes a dim the model leaves
/// dynamic (inputs only: outputs follow from them).
Result<std::vector<std::size_t>> match_specs(const std::vector<TensorSpec>& want,
                                             const std::vector<TensorSpec>& have, const char* kind,
                                             const std::string& what,
                                             std::map<std::size_t, ov::PartialShape>* reshapes,
                                             bool subset_allowed) {
  std::vector<std::size_t> index;
  if (subset_allowed ? want.size() > have.size() : want.size() != have.size()) {
    std::string names;
    for (const TensorSpec& h : have) names += (names.empty() ? "" : ", ") + spec_string(h);
    return invalid_argument_error(what + ": " + std::to_string(want.size()) + " " + kind +
                                  "(s) given, the model has " + std::to_string(have.size()) + ": " +
                                  names);
  }
  for (std::size_t k = 0; k < want.size(); ++k) {
    const TensorSpec& w = want[k];
    for (std::size_t j = 0; j < k; ++j) {
      if (want[j].name == w.name) {
        return invalid_argument_error(what + ": " + kind + " '" + w.name + "' is given twice");
      }
    }
    const auto it = std::find_if(have.begin(), have.end(),
                                 [&](const TensorSpec& h) { return h.name == w.name; });
    if (it == have.end()) {
      std::string names;
      for (const TensorSpec& h : have) names += (names.empty() ? "" : ", ") + spec_string(h);
      return invalid_argument_error(what + ": the model has no " + kind + " '" + w.name +
                                    "' (it has " + names + ")");
    }
    const TensorSpec& h = *it;
    const std::string tensor = what + ": " + kind + " '" + w.name + "'";
    if (w.dtype != h.dtype) {
      return invalid_argument_error(tensor + " is given as " + std::string(to_string(w.dtype)) +
                                    ", the model's is " + std::string(to_string(h.dtype)));
    }
    if (w.shape.size() != h.shape.size()) {
      return invalid_argument_error(tensor + " is given as " + shape_to_string(w.shape) +
                                    " (rank " + std::to_string(w.shape.size()) +
                                    "), the model's is " + shape_to_string(h.shape) + " (rank " +
                                    std::to_string(h.shape.size()) + ")");
    }
    bool fixes = false;
    for (std::size_t d = 0; d < w.shape.size(); ++d) {
      if (h.shape[d] >= 0 && w.shape[d] != h.shape[d]) {
        return invalid_argument_error(
            tensor + " is given as " + shape_to_string(w.shape) + ", the model's is " +
            shape_to_string(h.shape) + ": dim " + std::to_string(d) + " is " +
            std::to_string(h.shape[d]) + " in the model, " +
            (w.shape[d] < 0 ? std::string("-1 (dynamic)") : std::to_string(w.shape[d])) + " given");
      }
      if (h.shape[d] < 0 && w.shape[d] >= 0) fixes = true;
    }
    const auto port = static_cast<std::size_t>(it - have.begin());
    if (fixes && reshapes != nullptr) (*reshapes)[port] = partial_shape(w.shape);
    index.push_back(port);
  }
  return index;
}

/// One inference on zeros (batch 1, every dynamic dim 1): the compiled model runs.
Status check_run(OpenVinoDefinition& def) {
  try {
    ov::InferRequest request = def.compiled.create_infer_request();
    std::vector<ov::Tensor> keep;
    for (std::size_t i = 0; i < def.signature.inputs.size(); ++i) {
      const TensorSpec& s = def.signature.inputs[i];
      ov::Shape shape;
      for (std::int64_t d : s.shape) shape.push_back(d < 0 ? 1 : static_cast<std::size_t>(d));
      ov::Tensor t(to_element_type(s.dtype), shape);
      std::memset(t.data(), 0, t.get_byte_size());
      request.set_tensor(def.input_ports[i], t);
      keep.push_back(std::move(t));
    }
    request.infer();
    for (std::size_t i = 0; i < def.signature.outputs.size(); ++i) {
      const TensorSpec& s = def.signature.outputs[i];
      const ov::Shape got = request.get_tensor(def.output_ports[i]).get_shape();
      // Dims the model leaves dynamic depend on the inputs' (1 here): checked after each run.
      const ov::PartialShape& declared = def.output_ports[i].get_partial_shape();
      bool fits = got.size() == s.shape.size();
      for (std::size_t d = 0; fits && d < got.size(); ++d) {
        const bool batch_dim = def.signature.batched && d == 0;
        if (batch_dim)
          fits = got[d] == 1;
        else if (s.shape[d] >= 0 && declared[d].is_static())
          fits = static_cast<std::int64_t>(got[d]) == s.shape[d];
      }
      if (!fits) {
        Shape g(got.begin(), got.end());
        return invalid_argument_error(def.what + ": output " + spec_string(s) +
                                      " came out of a batch-1 run on zeros as " +
                                      shape_to_string(g));
      }
    }
  } catch (...) {
    return status_from_current_exception(
        def.what + ": the check inference on zeros (batch 1, dynamic dims 1) failed",
        StatusCode::invalid_argument);
  }
  return Status();
}

}  // namespace

Result<std::shared_ptr<Model>> load_openvino_model(std::string_view /*uri*/,
                                                   std::string_view path_view,
                                                   const ModelOptions& options) {
  const std::string path(path_view);
  if (path.empty()) {
    return invalid_argument_error(
        "openvino model: empty path (expected openvino:<file.onnx|file.xml>)");
  }
  const std::string what = "openvino model '" + path + "'";
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return not_found_error(what + ": no such file");
  if (!fs::is_regular_file(st)) return invalid_argument_error(what + " is not a regular file");
  if (fs::path(path).extension() == ".xml") {
    fs::path bin = path;
    bin.replace_extension(".bin");
    if (!fs::is_regular_file(bin, ec)) {
      return invalid_argument_error(
          what + ": OpenVINO IR needs its weights beside it, and '" + bin.string() +
          (fs::exists(bin, ec) ? "' is not a regular file" : "' does not exist") +
          " (an IR is model.xml + model.bin)");
    }
  }

  auto def = std::make_shared<OpenVinoDefinition>();
  def->path = path;
  def->what = what;
  ASYNCINFER_ASSIGN_OR_RETURN(def->core, shared_core());
  std::shared_ptr<ov::Model> model;
  try {
    model = def->core->read_model(path);
  } catch (...) {
    return status_from_current_exception(what + ": OpenVINO cannot read it",
                                         StatusCode::invalid_argument);
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Ports ports, read_ports(model, what));

  // The batch dim.
  auto dim0_dynamic = [](const std::vector<TensorSpec>& specs) {
    return std::all_of(specs.begin(), specs.end(),
                       [](const TensorSpec& s) { return !s.shape.empty() && s.shape[0] < 0; });
  };
  bool batched = dim0_dynamic(ports.inputs) && dim0_dynamic(ports.outputs);
  if (options.batched.has_value()) {
    if (*options.batched && !batched) {
      std::map<std::size_t, ov::PartialShape> shapes;
      for (std::size_t i = 0; i < ports.inputs.size(); ++i) {
        const TensorSpec& s = ports.inputs[i];
        if (s.shape.empty()) {
          return invalid_argument_error(what + ": input " + spec_string(s) +
                                        " is a scalar, so the model cannot take a batch dim");
        }
        if (s.shape[0] >= 0) {
          Shape dyn = s.shape;
          dyn[0] = -1;
          shapes[i] = partial_shape(dyn);
        }
      }
      ASYNCINFER_RETURN_IF_ERROR(
          reshape(model, shapes, what, "to make dim 0 of its inputs the batch dim"));
      ASYNCINFER_ASSIGN_OR_RETURN(ports, read_ports(model, what));
      if (!dim0_dynamic(ports.inputs) || !dim0_dynamic(ports.outputs)) {
        std::string fixed;
        for (const auto* list : {&ports.inputs, &ports.outputs}) {
          for (const TensorSpec& s : *list) {
            if (s.shape.empty() || s.shape[0] >= 0)
              fixed += (fixed.empty() ? "" : ", ") + spec_string(s);
          }
        }
        return invalid_argument_error(
            what +
            ": a batch dim was asked for (batched; a config's max_batch_size > 0), "
            "but with dim 0 of its inputs made dynamic these still "
            "have a fixed dim 0: " +
            fixed);
      }
    }
    batched = *options.batched;
  }

  // The caller's specs (a config's input / output lists).
  std::vector<std::size_t> input_index(ports.inputs.size());
  std::vector<std::size_t> output_index(ports.outputs.size());
  for (std::size_t i = 0; i < input_index.size(); ++i) input_index[i] = i;
  for (std::size_t i = 0; i < output_index.size(); ++i) output_index[i] = i;
  if (!options.inputs.empty()) {
    std::map<std::size_t, ov::PartialShape> shapes;
    ASYNCINFER_ASSIGN_OR_RETURN(
        input_index, match_specs(options.inputs, ports.inputs, "input", what, &shapes, false));
    ASYNCINFER_RETURN_IF_ERROR(reshape(model, shapes, what, "to the input dims given"));
    ASYNCINFER_ASSIGN_OR_RETURN(ports, read_ports(model, what));
  }
  if (!options.outputs.empty()) {
    ASYNCINFER_ASSIGN_OR_RETURN(
        output_index, match_specs(options.outputs, ports.outputs, "output", what, nullptr, true));
  }

  ModelSignature& sig = def->signature;
  sig.batched = batched;
  for (std::size_t i : input_index) sig.inputs.push_back(ports.inputs[i]);
  for (std::size_t k = 0; k < output_index.size(); ++k) {
    // A given output dim the model leaves dynamic is taken as given (checked at run time).
    TensorSpec s = ports.outputs[output_index[k]];
    if (!options.outputs.empty()) s.shape = options.outputs[k].shape;
    sig.outputs.push_back(std::move(s));
  }
  sig.batch_limit = batched ? options.batch_limit : std::nullopt;
  ASYNCINFER_ASSIGN_OR_RETURN(const std::vector<bool> aliased, aliased_outputs(model, what));
  for (std::size_t i : output_index) {
    // Written in place only when the model itself fixes every dim after the batch dim (a dim
    // fixed by the caller alone is checked after the run instead), and the output is a tensor of
    // its own: binding a buffer to an output that is an input, or that another output shares,
    // would rebind that tensor.
    const TensorSpec& s = ports.outputs[i];
    bool fixed = !aliased[i];
    for (std::size_t d = batched ? 1 : 0; d < s.shape.size(); ++d) fixed = fixed && s.shape[d] >= 0;
    def->output_preallocated.push_back(fixed);
  }

  // Compile for the CPU plugin.
  ov::AnyMap config;
  bool hint_given = false;
  for (const auto& [key, value] : options.backend_parameters) {
    config[key] = value;
    hint_given = hint_given || key == ov::hint::performance_mode.name();
  }
  if (!hint_given) config[ov::hint::performance_mode.name()] = "THROUGHPUT";
  try {
    def->compiled = def->core->compile_model(model, "CPU", config);
    const auto& compiled_inputs = def->compiled.inputs();
    const auto& compiled_outputs = def->compiled.outputs();
    for (std::size_t i : input_index) def->input_ports.push_back(compiled_inputs.at(i));
    for (std::size_t i : output_index) def->output_ports.push_back(compiled_outputs.at(i));
    def->optimal_requests = static_cast<int>(std::max<std::uint32_t>(
        1, def->compiled.get_property(ov::optimal_number_of_infer_requests)));
  } catch (...) {
    std::string settings;
    for (const auto& [key, value] : config) {
      settings += (settings.empty() ? "" : ", ") + key + "=" + value.as<std::string>();
    }
    return status_from_current_exception(
        what + ": OpenVINO cannot compile it for CPU with " + settings,
        StatusCode::invalid_argument);
  }
  ASYNCINFER_RETURN_IF_ERROR(check_run(*def));
  return std::shared_ptr<Model>(std::make_shared<OpenVinoModel>(std::move(def)));
}

// ---- auto-complete ------------------------------------------------------------------------------

/// Triton's auto-complete for an ONNX or OpenVINO IR model, as its ONNX Runtime backend does it
/// (onnxruntime_backend, ModelState::AutoCompleteConfig): a config that lists both inputs and
/// outputs is kept as it is; otherwise the model file says them. The model can batch when every
/// input and output has a dynamic dim 0: then a max_batch_size of 0 becomes 4 (Triton's
/// default-max-batch-size) and one above 1 gets dynamic_batching {} unless the config has a
/// batcher. The missing list gets every port: name, data_type, dims after the batch dim when
/// max_batch_size > 0 (none left: dims [1], with reshape { shape: [] } when batched). Blocks
/// while OpenVINO reads the file.
Result<std::string> complete_openvino_config(std::string_view uri, std::string_view path,
                                             std::string_view config_json,
                                             const ModelOptions& /*options*/) {
  nlohmann::json config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return invalid_argument_error("the config to complete is not a JSON object");
  }
  auto listed = [&](const char* key) {
    auto it = config.find(key);
    return it != config.end() && it->is_array() && !it->empty();
  };
  const bool has_inputs = listed("input");
  const bool has_outputs = listed("output");
  if (has_inputs && has_outputs) return std::string(config_json);
  const std::string what = "model '" + std::string(uri) + "'";
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<ov::Core> core, shared_core());
  std::shared_ptr<ov::Model> model;
  try {
    model = core->read_model(std::string(path));
  } catch (...) {
    return status_from_current_exception(what + ": OpenVINO cannot read it",
                                         StatusCode::invalid_argument);
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Ports ports, read_ports(model, what));
  bool can_batch = true;
  for (const auto* list : {&ports.inputs, &ports.outputs}) {
    for (const TensorSpec& s : *list) can_batch = can_batch && !s.shape.empty() && s.shape[0] < 0;
  }
  std::int64_t max_batch_size = config.value("max_batch_size", std::int64_t{0});
  if (can_batch) {
    if (max_batch_size == 0) {
      max_batch_size = 4;  // Triton's --backend-config default-max-batch-size
      config["max_batch_size"] = max_batch_size;
    }
    if (max_batch_size > 1 && !config.contains("dynamic_batching") &&
        !config.contains("sequence_batching")) {
      config["dynamic_batching"] = nlohmann::json::object();
    }
  }
  // A model that cannot batch as it is, with a max_batch_size: Triton's ONNX Runtime backend
  // refuses it; the openvino backend makes its dim 0 dynamic at load (OpenVINO's reshape), as it
  // does for a config that lists the tensors, so the dims start after dim 0 here too.
  auto entries = [&](const std::vector<TensorSpec>& specs) {
    nlohmann::json out = nlohmann::json::array();
    for (const TensorSpec& s : specs) {
      nlohmann::json dims = nlohmann::json::array();
      for (std::size_t d = max_batch_size > 0 ? 1 : 0; d < s.shape.size(); ++d) {
        dims.push_back(s.shape[d]);
      }
      nlohmann::json entry = {{"name", s.name}, {"data_type", config_type(s.dtype)}};
      if (dims.empty()) {
        dims.push_back(1);
        if (max_batch_size > 0) entry["reshape"] = {{"shape", nlohmann::json::array()}};
      }
      entry["dims"] = std::move(dims);
      out.push_back(std::move(entry));
    }
    return out;
  };
  if (!has_inputs) config["input"] = entries(ports.inputs);
  if (!has_outputs) config["output"] = entries(ports.outputs);
  return config.dump();
}

void register_openvino_model_backend(ModelBackendRegistry& registry) {
  (void)registry.add({"openvino", "openvino:<file> or a path ending in .onnx or .xml",
                      &load_openvino_model, &complete_openvino_config,
                      /*takes_backend_parameters=*/true});
}

}  // namespace asyncinfer::detail
