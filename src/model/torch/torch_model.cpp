// The TorchScript model backend: "torch:<path>" or a path ending in ".pt", run through libtorch.
//
// One file of about 1,000 lines, on purpose: it is the backend's only translation unit that
// includes libtorch's headers (each one costs tens of seconds to compile on the 2-core machines
// this project builds on). Its sections, in order: dtypes, signature (sidecar and specs),
// running (forward, output checks), the instances per device kind, the model and its loader.
//
// Loading (load_torch_model): the file's bytes are read once and kept; libtorch parses them into
// a module to validate the file. The signature comes from a sidecar JSON file
// (the backend parameter signature_path, else "<path>.json" when present) or from the command-line
// specs
// (ModelOptions::inputs/outputs/batch_limit); specs win over an implicit "<path>.json", and
// naming both a signature file and specs is an error. One warm-up forward on zeros (batch 1,
// every dynamic dim 1) checks that the module runs and that its outputs agree with the signature
// (count, dtypes, ranks, fixed dims, batch dim).
//
// Sidecar format ("asyncinfer-signature/1"; keys other than these are ignored):
//   {"inputs":  [{"name": "input",  "dtype": "f32", "shape": [-1, 1, 32, 32]}],
//    "outputs": [{"name": "logits", "dtype": "f32", "shape": [-1, 10]}],
//    "batched": true,            // default true: dim 0 of every input and output is -1
//    "max_batch_size": 64}       // Triton's meaning, as in a config.pbtxt and a builtin URI:
//                                // N > 0 = batched, ModelSignature::batch_limit N; 0 = not
//                                // batched. Absent: no limit. A set ModelOptions::batch_limit wins
// dtype accepts every name parse_dtype() does ("f32", "float32", "int64", ...).
// With command-line specs the model is batched when every input and output has dim 0 = -1
// (what parse_tensor_spec(..., batched = true) produces), and an unset batch_limit means no limit.
//
// Backend parameters (ModelOptions::backend_parameters; any other key is refused, naming it):
//   signature_path  the sidecar signature file; default "<path>.json" when present
//   warmup_runs     forward passes (batch 1 of zeros) run at each instance's creation, excluded
//                   from measurements; an integer >= 0, default 2
//
// Instances: each ModelInstance parses its own module from the kept bytes, so no module (nor its
// TorchScript CompilationUnit and graph executors) is shared between workers. Warm-up runs
// (warmup_runs, batch 1 of zeros) happen at creation, on the instance's stream, and
// create_instance blocks until they have finished.
//
// Devices:
//   cpu, sim — forward runs inside a Kernel's host_fn, i.e. on the stream's thread in stream
//     order, under c10::InferenceMode. Inputs are wrapped without a copy (torch::from_blob on the
//     batch's host-accessible memory; the at::Tensor keeps our Storage alive). cpu (unified
//     memory): outputs are the libtorch result tensors themselves, wrapped without a copy (the
//     Storage deleter owns a reference to the at::Tensor), set into BatchIO::outputs by the
//     host_fn; an output that aliases an input's memory is cloned first. sim (not unified):
//     outputs are allocated on the device at enqueue time, since the engine enqueues the copies
//     back right after, and the host_fn copies the result into them; this needs every output dim
//     after the batch dim to be fixed (create_instance says unavailable otherwise).
//   cuda — only where the libtorch found was built with CUDA (ASYNCINFER_TORCH_CUDA, derived in
//     CMake) and torch::cuda::is_available(): forward is launched at enqueue time with the
//     worker's cudaStream_t as libtorch's current stream (getStreamFromExternal +
//     CUDAStreamGuard); outputs are the result device tensors, wrapped without a copy. Elsewhere
//     create_instance on cuda returns unavailable saying why.
//
// Intra-op threads (InstanceOptions::intra_op_threads; the engine's default is 1, with one worker
// per core instead, see EngineOptions::intra_op_threads): Debian's libtorch 1.13 uses the OpenMP
// parallel backend (AT_PARALLEL_OPENMP). There the intra-op thread count is OpenMP's nthreads
// ICV, which is per calling thread, and libgomp keeps one thread team per calling ("master")
// thread, so every instance gets its own pool of intra_op_threads threads: before each forward
// the stream thread runs libtorch's per-thread lazy initialisation and then
// omp_set_num_threads(intra_op_threads) for itself only (oneDNN, also on libgomp, follows the
// same ICV). at::set_num_threads is NOT called: it is process-global (it also resizes the global
// pthreadpool used by XNNPACK/QNNPACK and clears oneDNN's primitive cache). With the native or
// TBB parallel backends one pool is shared by the process and cannot be split per instance, so
// the setting is ignored there (libtorch's process-wide setting applies). On cuda, the setting
// does not apply.
//
// Errors: libtorch exceptions never escape. A file that libtorch cannot parse -> invalid_argument
// naming the file and libtorch's reason; a failing forward -> internal (resource_exhausted for
// out of memory) with libtorch's reason; outputs contradicting the signature -> invalid_argument
// at load, internal at run time.
#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>
#include <nlohmann/json.hpp>
#if defined(ASYNCINFER_TORCH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#endif

#include "model/backend.hpp"

namespace asyncinfer::detail {
namespace {

namespace fs = std::filesystem;

/// At most this much of libtorch's message goes into a Status (TorchScript tracebacks are long).
constexpr std::size_t kMaxReason = 4000;

std::string trim_reason(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.size() > kMaxReason) text = text.substr(0, kMaxReason) + " [...]";
  return text;
}

/// libtorch's reason, without the C++ backtrace.
std::string reason_of(const c10::Error& e) { return trim_reason(e.what_without_backtrace()); }

/// The Status for an exception thrown by libtorch while running `what`.
Status status_from_current_exception(const std::string& what) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return resource_exhausted_error(what + ": out of memory: " + reason_of(e));
  } catch (const c10::Error& e) {
    return internal_error(what + ": " + reason_of(e));
  } catch (const std::bad_alloc&) {
    return resource_exhausted_error(what + ": out of host memory");
  } catch (const std::exception& e) {
    return internal_error(what + ": " + trim_reason(e.what()));
  } catch (...) {
    return internal_error(what + ": unknown exception");
  }
}

// ---- dtypes ------------------------------------------------------------------------------

/// libtorch's scalar type for `dtype`; false for u16, u32 and u64, which libtorch 1.13 lacks, and
/// for bytes, which no torch tensor holds (check_signature rejects them, so a loaded model never
/// meets them).
bool to_scalar_type(DType dtype, at::ScalarType* out) {
  switch (dtype) {
    case DType::f32:
      *out = at::kFloat;
      return true;
    case DType::f16:
      *out = at::kHalf;
      return true;
    case DType::bf16:
      *out = at::kBFloat16;
      return true;
    case DType::f64:
      *out = at::kDouble;
      return true;
    case DType::i8:
      *out = at::kChar;
      return true;
    case DType::u8:
      *out = at::kByte;
      return true;
    case DType::i16:
      *out = at::kShort;
      return true;
    case DType::i32:
      *out = at::kInt;
      return true;
    case DType::i64:
      *out = at::kLong;
      return true;
    case DType::boolean:
      *out = at::kBool;
      return true;
    case DType::u16:
    case DType::u32:
    case DType::u64:
    case DType::bytes:
      return false;
  }
  return false;
}

at::ScalarType to_scalar_type(DType dtype) {
  at::ScalarType t = at::kFloat;
  to_scalar_type(dtype, &t);
  return t;
}

/// Our dtype for a libtorch scalar type; false for types we do not have (complex, quantized...).
bool from_scalar_type(at::ScalarType type, DType* out) {
  switch (type) {
    case at::kFloat:
      *out = DType::f32;
      return true;
    case at::kHalf:
      *out = DType::f16;
      return true;
    case at::kBFloat16:
      *out = DType::bf16;
      return true;
    case at::kDouble:
      *out = DType::f64;
      return true;
    case at::kChar:
      *out = DType::i8;
      return true;
    case at::kByte:
      *out = DType::u8;
      return true;
    case at::kShort:
      *out = DType::i16;
      return true;
    case at::kInt:
      *out = DType::i32;
      return true;
    case at::kLong:
      *out = DType::i64;
      return true;
    case at::kBool:
      *out = DType::boolean;
      return true;
    default:
      return false;
  }
}

std::string describe(const at::Tensor& t) {
  DType d;
  std::string type = from_scalar_type(t.scalar_type(), &d)
                         ? std::string(to_string(d))
                         : std::string(c10::toString(t.scalar_type()));
  return type + shape_to_string(std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()));
}

// ---- signature ---------------------------------------------------------------------------

std::string spec_string(const TensorSpec& s) {
  return "'" + s.name + "' " + std::string(to_string(s.dtype)) + shape_to_string(s.shape);
}

/// Names unique and non-empty, dims >= -1, and (batched) dim 0 = -1 everywhere.
Status check_signature(const ModelSignature& sig, const std::string& source) {
  if (sig.inputs.empty()) return invalid_argument_error(source + ": no inputs listed");
  if (sig.outputs.empty()) return invalid_argument_error(source + ": no outputs listed");
  for (const auto* list : {&sig.inputs, &sig.outputs}) {
    const char* kind = list == &sig.inputs ? "input" : "output";
    for (std::size_t i = 0; i < list->size(); ++i) {
      const TensorSpec& s = (*list)[i];
      if (s.name.empty()) {
        return invalid_argument_error(source + ": " + kind + " " + std::to_string(i) +
                                      " has no name");
      }
      for (std::size_t j = 0; j < i; ++j) {
        if ((*list)[j].name == s.name) {
          return invalid_argument_error(source + ": " + kind + " name '" + s.name +
                                        "' is used twice");
        }
      }
      at::ScalarType scalar{};
      if (!to_scalar_type(s.dtype, &scalar)) {
        return invalid_argument_error(source + ": " + kind + " " + spec_string(s) +
                                      ": libtorch has no " + std::string(to_string(s.dtype)) +
                                      " tensors (TorchScript models take i16, i32, i64, u8, i8, "
                                      "bool and the float types)");
      }
      for (std::int64_t d : s.shape) {
        if (d < -1) {
          return invalid_argument_error(source + ": " + kind + " " + spec_string(s) +
                                        ": dims must be >= -1 (-1 = dynamic)");
        }
      }
      if (sig.batched && (s.shape.empty() || s.shape[0] != -1)) {
        return invalid_argument_error(
            source + ": " + kind + " " + spec_string(s) +
            ": in a batched signature dim 0 is the batch dim and must be -1");
      }
    }
  }
  return Status();
}

Result<std::vector<TensorSpec>> parse_specs(const nlohmann::json& j, const char* key,
                                            const std::string& source) {
  if (!j.contains(key) || !j[key].is_array()) {
    return invalid_argument_error(source + ": \"" + key +
                                  "\" must be an array of {\"name\", \"dtype\", \"shape\"}");
  }
  std::vector<TensorSpec> specs;
  for (const nlohmann::json& e : j[key]) {
    const std::string where = source + ": " + key + "[" + std::to_string(specs.size()) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("dtype") ||
        !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array()) {
      return invalid_argument_error(where +
                                    " must be {\"name\": string, \"dtype\": string, \"shape\": "
                                    "[ints, -1 = dynamic]}");
    }
    TensorSpec s;
    s.name = e["name"].get<std::string>();
    auto dtype = parse_dtype(e["dtype"].get<std::string>());
    if (!dtype.ok()) return dtype.status().with_context(where);
    s.dtype = *dtype;
    for (const nlohmann::json& d : e["shape"]) {
      if (!d.is_number_integer()) {
        return invalid_argument_error(where + ": shape holds " + d.dump() +
                                      ", expected integers (-1 = dynamic)");
      }
      s.shape.push_back(d.get<std::int64_t>());
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

/// Reads a sidecar signature file (format in the header comment).
Result<ModelSignature> read_sidecar(const std::string& file) {
  const std::string source = "signature file '" + file + "'";
  std::error_code ec;
  if (!fs::exists(file, ec)) return not_found_error(source + " does not exist");
  std::ifstream in(file);
  if (!in) return invalid_argument_error(source + " cannot be opened");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument_error(source + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return invalid_argument_error(source + ": expected a JSON object");
  ModelSignature sig;
  ASYNCINFER_ASSIGN_OR_RETURN(sig.inputs, parse_specs(j, "inputs", source));
  ASYNCINFER_ASSIGN_OR_RETURN(sig.outputs, parse_specs(j, "outputs", source));
  if (j.contains("batched")) {
    if (!j["batched"].is_boolean())
      return invalid_argument_error(source + ": \"batched\" must be true or false");
    sig.batched = j["batched"].get<bool>();
  }
  if (j.contains("max_batch_size")) {
    // Triton's meaning everywhere (docs/design.md, "Batch sizes"): 0 = no batch dim.
    const nlohmann::json& v = j["max_batch_size"];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0) {
      return invalid_argument_error(source +
                                    ": \"max_batch_size\" must be an integer >= 0 (Triton's "
                                    "meaning: N = batched, at most N rows; 0 = not batched)");
    }
    const std::int64_t n = v.get<std::int64_t>();
    if (n == 0 && j.contains("batched") && sig.batched) {
      return invalid_argument_error(source +
                                    ": \"max_batch_size\" 0 says the model has no batch dim "
                                    "(Triton's meaning), but \"batched\" is true");
    }
    if (n > 0 && !sig.batched) {
      return invalid_argument_error(source + ": \"max_batch_size\" " + std::to_string(n) +
                                    " says dim 0 is the batch dim, but \"batched\" is false");
    }
    if (n == 0) sig.batched = false;
    if (n > 0) sig.batch_limit = n;
  }
  ASYNCINFER_RETURN_IF_ERROR(check_signature(sig, source));
  return sig;
}

/// The signature and a phrase naming where it came from ("signature file '...'").
struct SignatureSource {
  ModelSignature signature;
  std::string source;
};

/// The torch backend's own settings (ModelOptions::backend_parameters; the header lists them).
struct TorchParameters {
  std::string signature_path;  ///< empty = "<path>.json" when present
  int warmup_runs = 2;
};

/// Reads the backend parameters: invalid_argument naming a key the backend does not know or a
/// value it cannot take.
Result<TorchParameters> torch_parameters(const std::string& path, const ModelOptions& options) {
  TorchParameters p;
  for (const auto& [key, value] : options.backend_parameters) {
    if (key == "signature_path") {
      p.signature_path = value;
    } else if (key == "warmup_runs") {
      int n = -1;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || end != value.data() + value.size() || n < 0) {
        return invalid_argument_error("torch model '" + path +
                                      "': backend parameter warmup_runs '" + value +
                                      "' is not an integer >= 0");
      }
      p.warmup_runs = n;
    } else {
      return invalid_argument_error("torch model '" + path + "': unknown backend parameter '" +
                                    key +
                                    "' (the torch backend takes signature_path and warmup_runs)");
    }
  }
  return p;
}

Result<SignatureSource> resolve_signature(const std::string& path, const ModelOptions& options,
                                          const TorchParameters& params) {
  const bool have_specs = !options.inputs.empty() || !options.outputs.empty();
  if (have_specs && !params.signature_path.empty()) {
    return invalid_argument_error("torch model '" + path + "': both a signature file ('" +
                                  params.signature_path +
                                  "') and command-line input/output specs were given; give one");
  }
  SignatureSource out;
  if (have_specs) {
    out.source = "the command-line signature";
    if (options.inputs.empty() || options.outputs.empty()) {
      return invalid_argument_error("torch model '" + path + "': " + out.source + " needs both " +
                                    "inputs and outputs (e.g. x:f32:1x32x32 and y:f32:10)");
    }
    ModelSignature& sig = out.signature;
    sig.inputs = options.inputs;
    sig.outputs = options.outputs;
    sig.batched = true;
    for (const auto* list : {&sig.inputs, &sig.outputs}) {
      for (const TensorSpec& s : *list) {
        if (s.shape.empty() || s.shape[0] != -1) sig.batched = false;
      }
    }
    sig.batch_limit = options.batch_limit;
    ASYNCINFER_RETURN_IF_ERROR(check_signature(sig, "torch model '" + path + "': " + out.source));
    return out;
  }
  std::string file = params.signature_path;
  std::error_code ec;
  if (file.empty() && fs::exists(path + ".json", ec)) file = path + ".json";
  if (file.empty()) {
    return invalid_argument_error(
        "torch model '" + path + "': no signature: put a sidecar JSON file next to the model ('" +
        path +
        ".json', or name one with the backend parameter signature_path) listing "
        "inputs and outputs with names, dtypes and shapes, or give the inputs and outputs as "
        "command-line specs (name:dtype:dims, e.g. input:f32:1x32x32 and logits:f32:10)");
  }
  auto sig = read_sidecar(file);
  if (!sig.ok()) return sig.status().with_context("torch model '" + path + "'");
  out.signature = std::move(*sig);
  out.source = "signature file '" + file + "'";
  if (options.batch_limit) out.signature.batch_limit = options.batch_limit;
  return out;
}

// ---- running -----------------------------------------------------------------------------

/// Zero inputs for a warm-up: batch `batch`, every other dynamic dim 1.
std::vector<torch::jit::IValue> zero_inputs(const ModelSignature& sig, std::int64_t batch,
                                            const c10::Device& device) {
  std::vector<torch::jit::IValue> values;
  for (const TensorSpec& s : sig.inputs) {
    std::vector<std::int64_t> sizes = s.shape;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 0) sizes[d] = (sig.batched && d == 0) ? batch : 1;
    }
    values.emplace_back(
        torch::zeros(sizes, at::TensorOptions().dtype(to_scalar_type(s.dtype)).device(device)));
  }
  return values;
}

/// The forward result as one tensor per signature output: a Tensor, a tuple or list of Tensors
/// (in signature order), or a Dict[str, Tensor] (matched by output name).
Result<std::vector<at::Tensor>> result_tensors(const torch::jit::IValue& result,
                                               const ModelSignature& sig) {
  std::vector<at::Tensor> out;
  auto take = [&](const c10::IValue& v, std::size_t index) -> Status {
    if (!v.isTensor()) {
      return invalid_argument_error("output " + std::to_string(index) + " is a " + v.tagKind() +
                                    ", not a Tensor");
    }
    out.push_back(v.toTensor());
    return Status();
  };
  if (result.isTensor()) {
    out.push_back(result.toTensor());
  } else if (result.isTuple()) {
    const auto& elements = result.toTupleRef().elements();
    for (std::size_t i = 0; i < elements.size(); ++i)
      ASYNCINFER_RETURN_IF_ERROR(take(elements[i], i));
  } else if (result.isList()) {
    const c10::List<c10::IValue> list = result.toList();
    for (std::size_t i = 0; i < list.size(); ++i) ASYNCINFER_RETURN_IF_ERROR(take(list.get(i), i));
  } else if (result.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> dict = result.toGenericDict();
    for (const TensorSpec& s : sig.outputs) {
      auto it = dict.find(c10::IValue(s.name));
      if (it == dict.end()) {
        return invalid_argument_error("the model returns a dict without the key '" + s.name +
                                      "' (a signature output)");
      }
      ASYNCINFER_RETURN_IF_ERROR(take(it->value(), out.size()));
    }
    if (dict.size() != sig.outputs.size()) {
      return invalid_argument_error("the model returns a dict of " + std::to_string(dict.size()) +
                                    " entries but the signature lists " +
                                    std::to_string(sig.outputs.size()) + " output(s)");
    }
  } else {
    return invalid_argument_error("the model returns a " + result.tagKind() +
                                  "; expected a Tensor, a tuple or list of Tensors, or a "
                                  "Dict[str, Tensor]");
  }
  if (out.size() != sig.outputs.size()) {
    std::string names;
    for (const TensorSpec& s : sig.outputs) names += (names.empty() ? "" : ", ") + s.name;
    return invalid_argument_error("the model returns " + std::to_string(out.size()) +
                                  " output(s) but the signature lists " +
                                  std::to_string(sig.outputs.size()) + " (" + names + ")");
  }
  return out;
}

/// Checks the outputs of a forward on a batch of `batch` against the signature.
Status check_outputs(const ModelSignature& sig, const std::vector<at::Tensor>& outputs,
                     std::int64_t batch) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const TensorSpec& s = sig.outputs[i];
    const at::Tensor& t = outputs[i];
    DType dtype;
    if (!from_scalar_type(t.scalar_type(), &dtype) || dtype != s.dtype) {
      return invalid_argument_error("output '" + s.name + "' is " + describe(t) +
                                    " but the signature says dtype " +
                                    std::string(to_string(s.dtype)));
    }
    bool ok = static_cast<std::size_t>(t.dim()) == s.shape.size();
    for (std::size_t d = 0; ok && d < s.shape.size(); ++d) {
      const std::int64_t want = (sig.batched && d == 0) ? batch : s.shape[d];
      if (want >= 0 && t.size(static_cast<std::int64_t>(d)) != want) ok = false;
    }
    if (!ok) {
      return invalid_argument_error(
          "output '" + s.name + "' is " + describe(t) + " but the signature says " +
          std::string(to_string(s.dtype)) + shape_to_string(s.shape) +
          (sig.batched ? " (batch dim " + std::to_string(batch) + ")" : std::string()));
    }
  }
  return Status();
}

/// libtorch's module from the kept file bytes.
Result<torch::jit::Module> parse_module(const std::string& path, const std::string& bytes,
                                        const std::optional<c10::Device>& device) {
  try {
    std::istringstream in(bytes);
    torch::jit::Module module = device ? torch::jit::load(in, *device) : torch::jit::load(in);
    module.eval();
    if (!module.find_method("forward")) {
      return invalid_argument_error("torch model '" + path +
                                    "': the TorchScript module has no forward() method");
    }
    return module;
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string reason = c10_error ? reason_of(*c10_error) : trim_reason(e.what());
    // libtorch's reason for a file that is not even a zip archive can be obscure ("istream
    // reader failed: getting the current position"): say so as well.
    if (bytes.rfind("PK\x03\x04", 0) != 0) {
      reason += " (the file is not a zip archive, which every torch.jit.save file is; it holds " +
                std::to_string(bytes.size()) + " bytes)";
    }
    return invalid_argument_error("torch model '" + path +
                                  "' is not a TorchScript file libtorch can load: " + reason);
  }
}

#if AT_PARALLEL_OPENMP
using OmpSetNumThreads = void (*)(int);
/// omp_set_num_threads of the OpenMP runtime libtorch is linked with (looked up, not linked, so
/// that libasyncinfer takes no link dependency of its own on libgomp).
OmpSetNumThreads omp_set_num_threads_fn() {
  static const OmpSetNumThreads fn =
      reinterpret_cast<OmpSetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return fn;
}
#endif

/// Gives the calling thread `threads` intra-op threads for its own parallel regions (see the
/// header comment); 0 leaves the thread's setting alone. Cheap when already set.
void set_thread_intra_op_threads(int threads) {
#if AT_PARALLEL_OPENMP
  if (threads < 1) return;
  // libtorch sets the calling thread's count to its process default on the thread's first
  // parallel region; run that now so it cannot undo ours later.
  at::internal::lazy_init_num_threads();
  if (at::get_num_threads() == threads) return;
  if (OmpSetNumThreads set = omp_set_num_threads_fn()) set(threads);
#else
  (void)threads;  // native/TBB backends: one process-wide pool; left as libtorch has it
#endif
}

/// The calling thread's intra-op thread count (OpenMP: its nthreads ICV), 0 where it is
/// process-wide (native/TBB backends), so that set_thread_intra_op_threads(it) restores it.
int thread_intra_op_threads() {
#if AT_PARALLEL_OPENMP
  at::internal::lazy_init_num_threads();
  return at::get_num_threads();
#else
  return 0;
#endif
}

/// What every instance shares: immutable after load.
struct TorchDefinition {
  std::string path;
  std::string bytes;  // the file, parsed again by each instance
  ModelSignature signature;
  int warmup_runs = 2;
};

/// One instance's module and settings. Shared (by shared_ptr) between the instance and the
/// stream work it enqueued, so work still queued may outlive the instance object. Used by one
/// thread at a time: the stream's thread (cpu, sim) or the enqueuing thread (cuda).
class TorchRunner {
 public:
  TorchRunner(std::shared_ptr<const TorchDefinition> def, torch::jit::Module module,
              int intra_op_threads, c10::Device device)
      : def_(std::move(def)),
        module_(std::move(module)),
        threads_(intra_op_threads),
        device_(device) {}

  /// Runs `runs` forwards on zeros (batch 1). Returns the first failure.
  Status warm_up(int runs) {
    for (int i = 0; i < runs; ++i) {
      try {
        set_thread_intra_op_threads(threads_);
        c10::InferenceMode guard;
        const auto result = module_.forward(zero_inputs(def_->signature, 1, device_));
        auto outputs = result_tensors(result, def_->signature);
        Status st = outputs.ok() ? check_outputs(def_->signature, *outputs, 1) : outputs.status();
        if (!st.ok()) return internal_error(st.message()).with_context(what());
      } catch (...) {
        return status_from_current_exception(what() + ": warm-up forward");
      }
    }
    return Status();
  }

  /// One forward on `inputs` (a batch of `batch`), outputs checked against the signature.
  /// Inputs are wrapped without a copy; each wrapper keeps its Storage alive.
  Result<std::vector<at::Tensor>> forward(const std::vector<Tensor>& inputs, std::int64_t batch) {
    try {
      set_thread_intra_op_threads(threads_);
      c10::InferenceMode guard;
      std::vector<torch::jit::IValue> values;
      values.reserve(inputs.size());
      for (const Tensor& in : inputs) {
        values.emplace_back(torch::from_blob(
            in.data(), in.shape(), [keep = in](void*) {},
            at::TensorOptions().dtype(to_scalar_type(in.dtype())).device(device_)));
      }
      const auto result = module_.forward(std::move(values));
      auto outputs = result_tensors(result, def_->signature);
      if (!outputs.ok()) return internal_error(outputs.status().message()).with_context(what());
      auto st = check_outputs(def_->signature, *outputs, batch);
      if (!st.ok()) return internal_error(st.message()).with_context(what());
      for (at::Tensor& t : *outputs) {
        if (!t.is_contiguous()) t = t.contiguous();
        if (aliases_input(t, inputs)) t = t.clone();
      }
      return outputs;
    } catch (...) {
      return status_from_current_exception(what() + ": forward on a batch of " +
                                           std::to_string(batch));
    }
  }

  const TorchDefinition& definition() const noexcept { return *def_; }
  std::string what() const { return "torch model '" + def_->path + "'"; }

 private:
  static bool aliases_input(const at::Tensor& t, const std::vector<Tensor>& inputs) {
    const auto* begin = static_cast<const unsigned char*>(t.data_ptr());
    const auto* end = begin + t.nbytes();
    for (const Tensor& in : inputs) {
      const auto* b = static_cast<const unsigned char*>(in.data());
      if (begin < b + in.byte_size() && b < end) return true;
    }
    return false;
  }

  std::shared_ptr<const TorchDefinition> def_;
  torch::jit::Module module_;
  int threads_;
  c10::Device device_;
};

/// An asyncinfer Tensor viewing a libtorch tensor's memory; the Storage keeps it alive.
Result<Tensor> wrap(at::Tensor t, Placement placement, bool host_accessible) {
  DType dtype;
  if (!from_scalar_type(t.scalar_type(), &dtype)) {
    return internal_error("libtorch dtype " + std::string(c10::toString(t.scalar_type())) +
                          " has no asyncinfer equivalent");
  }
  void* data = t.data_ptr();
  const std::size_t bytes = t.nbytes();
  Shape shape(t.sizes().begin(), t.sizes().end());
  auto storage = std::make_shared<Storage>(
      data, bytes, placement, [keep = std::move(t)](void*) mutable { keep.reset(); },
      host_accessible);
  return Tensor::from_storage(std::move(storage), dtype, std::move(shape));
}

/// Checks one batch against the signature again (cheap; the engine validated already) and
/// that the inputs are where this device's forward can read them.
Status check_batch(const TorchRunner& runner, const BatchIO& io, bool need_host_access) {
  const ModelSignature& sig = runner.definition().signature;
  Status st = validate_inputs(sig, io.inputs);
  if (!st.ok()) return st.with_context(runner.what());
  if (sig.batched && io.inputs[0].dim(0) != io.batch_size) {
    return invalid_argument_error(runner.what() + ": BatchIO::batch_size is " +
                                  std::to_string(io.batch_size) + " but the inputs hold " +
                                  std::to_string(io.inputs[0].dim(0)) + " rows");
  }
  for (std::size_t i = 0; i < io.inputs.size(); ++i) {
    if (need_host_access && !io.inputs[i].is_host_accessible()) {
      return invalid_argument_error(runner.what() + ": input '" + sig.inputs[i].name +
                                    "' is not in host-accessible memory");
    }
  }
  return Status();
}

/// cpu and sim: forward on the stream's thread.
class HostTorchInstance final : public ModelInstance {
 public:
  HostTorchInstance(std::shared_ptr<TorchRunner> runner, Device& device, Stream& stream)
      : runner_(std::move(runner)),
        device_(device),
        stream_(&stream),
        unified_(device.info().unified_memory) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    if (&stream != stream_) {
      return failed_precondition_error(runner_->what() +
                                       ": enqueue on a stream other than the instance's own");
    }
    if (!io) return invalid_argument_error(runner_->what() + ": null BatchIO");
    ASYNCINFER_RETURN_IF_ERROR(check_batch(*runner_, *io, true));
    const ModelSignature& sig = runner_->definition().signature;
    const std::int64_t batch = sig.batched ? io->batch_size : 1;
    io->outputs.clear();
    if (!unified_) {
      // The engine enqueues the copies back right after this returns: outputs must exist now.
      for (const TensorSpec& s : sig.outputs) {
        Shape shape = s.shape;
        if (sig.batched) shape[0] = batch;
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, device_.empty(s.dtype, shape, MemoryKind::device));
        io->outputs.push_back(std::move(t));
      }
    }
    Kernel k;
    k.name = runner_->what();
    k.stop = io->stop;
    k.host_fn = [runner = runner_, io, batch, unified = unified_](std::stop_token stop) -> Status {
      if (stop.stop_requested()) {
        return cancelled_error(runner->what() +
                               ": batch skipped: cancelled before its forward started");
      }
      ASYNCINFER_ASSIGN_OR_RETURN(std::vector<at::Tensor> outputs,
                                  runner->forward(io->inputs, batch));
      if (unified) {
        std::vector<Tensor> wrapped;
        for (at::Tensor& t : outputs) {
          ASYNCINFER_ASSIGN_OR_RETURN(Tensor w, wrap(std::move(t), Placement{}, true));
          wrapped.push_back(std::move(w));
        }
        io->outputs = std::move(wrapped);
        return Status();
      }
      for (std::size_t i = 0; i < outputs.size(); ++i) {
        const Tensor& dst = io->outputs[i];
        if (dst.byte_size() != outputs[i].nbytes()) {
          return internal_error(runner->what() + ": output '" +
                                runner->definition().signature.outputs[i].name + "' is " +
                                describe(outputs[i]) + ", expected " + dst.describe());
        }
        if (dst.byte_size() > 0) std::memcpy(dst.data(), outputs[i].data_ptr(), dst.byte_size());
      }
      return Status();
    };
    return stream.enqueue(std::move(k));
  }

 private:
  std::shared_ptr<TorchRunner> runner_;
  Device& device_;
  Stream* stream_;
  bool unified_;
};

#if defined(ASYNCINFER_TORCH_CUDA)
/// cuda: forward launched at enqueue time on the worker's CUDA stream.
class CudaTorchInstance final : public ModelInstance {
 public:
  CudaTorchInstance(std::shared_ptr<TorchRunner> runner, Stream& stream, c10::DeviceIndex index)
      : runner_(std::move(runner)), stream_(&stream), index_(index) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    if (&stream != stream_) {
      return failed_precondition_error(runner_->what() +
                                       ": enqueue on a stream other than the instance's own");
    }
    if (!io) return invalid_argument_error(runner_->what() + ": null BatchIO");
    ASYNCINFER_RETURN_IF_ERROR(check_batch(*runner_, *io, false));
    for (const Tensor& in : io->inputs) {
      if (in.placement().kind != MemoryKind::device || in.placement().device_id != index_) {
        return invalid_argument_error(
            runner_->what() + ": inputs must be in the memory of cuda:" + std::to_string(index_) +
            ", got " + std::string(to_string(in.placement().kind)));
      }
    }
    const ModelSignature& sig = runner_->definition().signature;
    const std::int64_t batch = sig.batched ? io->batch_size : 1;
    std::vector<at::Tensor> outputs;
    {
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
          static_cast<cudaStream_t>(stream.native_handle()), index_));
      ASYNCINFER_ASSIGN_OR_RETURN(outputs, runner_->forward(io->inputs, batch));
    }
    std::vector<Tensor> wrapped;
    for (at::Tensor& t : outputs) {
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor w,
                                  wrap(std::move(t), Placement{MemoryKind::device, index_}, false));
      wrapped.push_back(std::move(w));
    }
    io->outputs = std::move(wrapped);
    return Status();
  }

 private:
  std::shared_ptr<TorchRunner> runner_;
  Stream* stream_;
  c10::DeviceIndex index_;
};
#endif

class TorchModel final : public Model {
 public:
  explicit TorchModel(std::shared_ptr<const TorchDefinition> def) : def_(std::move(def)) {}

  const ModelSignature& signature() const noexcept override { return def_->signature; }
  const std::string& name() const noexcept override { return def_->path; }
  bool cancellable() const noexcept override { return false; }
  /// A device whose memory host code can address (cpu, sim): forward runs on the stream's host
  /// thread, on the batch's tensors in place; cuda: on the GPU.
  bool uses_host_cores(const Device& device) const noexcept override {
    return device.capabilities().host_addressable_memory;
  }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& stream,
                                                         const InstanceOptions& options) override {
    const std::string what = "torch model '" + def_->path + "'";
    if (device.capabilities().host_addressable_memory) {
      return create_host_instance(device, stream, options, what);
    }
    // The one place the kind matters: libtorch computes off the host only on a device type it
    // knows (c10::DeviceType), and wraps the stream's native handle as that type's stream
    // (a cudaStream_t as a c10::cuda::CUDAStream). No capability says "this is libtorch's CUDA".
    if (device.kind() == DeviceKind::cuda) return create_cuda_instance(device, stream, what);
    return unavailable_error(what + ": the torch backend runs on devices whose memory the host " +
                             "can address (cpu, sim)" + cuda_note() + "; not on " + device.name());
  }

 private:
  static std::string cuda_note() {
#if defined(ASYNCINFER_TORCH_CUDA)
    return " and cuda";
#else
    return " (not cuda: the libtorch this library was built with has no CUDA)";
#endif
  }

  Result<std::unique_ptr<ModelInstance>> create_host_instance(Device& device, Stream& stream,
                                                              const InstanceOptions& options,
                                                              const std::string& what) {
    const ModelSignature& sig = def_->signature;
    if (!device.info().unified_memory) {
      for (const TensorSpec& s : sig.outputs) {
        for (std::size_t d = sig.batched ? 1 : 0; d < s.shape.size(); ++d) {
          if (s.shape[d] < 0) {
            return unavailable_error(
                what + ": output " + spec_string(s) +
                " has a dynamic dim after the batch dim; "
                "on " +
                device.name() +
                " (no unified memory) outputs are allocated before the "
                "forward runs, so their shapes must be known; use the cpu device");
          }
        }
      }
    }
    ASYNCINFER_ASSIGN_OR_RETURN(torch::jit::Module module,
                                parse_module(def_->path, def_->bytes, std::nullopt));
    auto runner = std::make_shared<TorchRunner>(
        def_, std::move(module), std::max(1, options.intra_op_threads), c10::Device(c10::kCPU));
    if (def_->warmup_runs > 0) {
      // On the stream's thread, where the forwards will run (its OpenMP team, its thread count).
      auto outcome = std::make_shared<Status>();
      Kernel k;
      k.name = what + " warm-up";
      k.host_fn = [runner, outcome, runs = def_->warmup_runs,
                   creator = std::this_thread::get_id()](std::stop_token) -> Status {
        // On the engine's inline path (cpu, no watchdog) the stream has no thread of its own and
        // this runs on the thread creating the instance (Engine::create's caller), not on the one
        // that will run the forwards: leave that thread's count as found.
        const bool on_creator = std::this_thread::get_id() == creator;
        const int before = on_creator ? thread_intra_op_threads() : 0;
        *outcome = runner->warm_up(runs);
        if (on_creator) set_thread_intra_op_threads(before);
        return Status();  // reported below, not left pending on the stream
      };
      ASYNCINFER_RETURN_IF_ERROR(stream.enqueue(std::move(k)));
      Status st = stream.synchronize();
      if (!st.ok()) return st.with_context(what + ": waiting for the warm-up runs");
      if (!outcome->ok()) return *outcome;
    }
    return std::unique_ptr<ModelInstance>(
        std::make_unique<HostTorchInstance>(std::move(runner), device, stream));
  }

  Result<std::unique_ptr<ModelInstance>> create_cuda_instance(Device& device, Stream& stream,
                                                              const std::string& what) {
#if defined(ASYNCINFER_TORCH_CUDA)
    if (!torch::cuda::is_available()) {
      return unavailable_error(what +
                               ": libtorch was built with CUDA but sees no usable GPU "
                               "(torch::cuda::is_available() is false)");
    }
    c10::DeviceIndex index = 0;
    const std::string& name = device.name();
    if (const auto colon = name.find(':'); colon != std::string::npos) {
      index = static_cast<c10::DeviceIndex>(std::stoi(name.substr(colon + 1)));
    }
    const c10::Device cuda(c10::kCUDA, index);
    ASYNCINFER_ASSIGN_OR_RETURN(torch::jit::Module module,
                                parse_module(def_->path, def_->bytes, cuda));
    // Intra-op threads 0: the enqueuing thread's OpenMP setting is left alone.
    auto runner = std::make_shared<TorchRunner>(def_, std::move(module), 0, cuda);
    if (def_->warmup_runs > 0) {
      {
        c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
            static_cast<cudaStream_t>(stream.native_handle()), index));
        ASYNCINFER_RETURN_IF_ERROR(runner->warm_up(def_->warmup_runs));
      }
      Status st = stream.synchronize();
      if (!st.ok()) return st.with_context(what + ": waiting for the warm-up runs");
    }
    return std::unique_ptr<ModelInstance>(
        std::make_unique<CudaTorchInstance>(std::move(runner), stream, index));
#else
    (void)stream;
    return unavailable_error(what + ": cannot run on " + device.name() +
                             ": the libtorch this library was built with has no CUDA support "
                             "(Debian's libtorch-dev is CPU-only); use cpu or sim");
#endif
  }

  std::shared_ptr<const TorchDefinition> def_;
};

}  // namespace

Result<std::shared_ptr<Model>> load_torch_model(std::string_view /*uri*/,
                                                std::string_view path_view,
                                                const ModelOptions& options) {
  const std::string path(path_view);
  if (path.empty())
    return invalid_argument_error("torch model: empty path (expected torch:<file.pt>)");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return not_found_error("torch model '" + path + "': no such file");
  if (!fs::is_regular_file(st)) {
    return invalid_argument_error("torch model '" + path + "' is not a regular file");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(const TorchParameters params, torch_parameters(path, options));
  auto def = std::make_shared<TorchDefinition>();
  def->path = path;
  def->warmup_runs = params.warmup_runs;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found_error("torch model '" + path + "': cannot open the file");
    std::ostringstream bytes;
    bytes << in.rdbuf();
    def->bytes = std::move(bytes).str();
  }
  ASYNCINFER_ASSIGN_OR_RETURN(torch::jit::Module module,
                              parse_module(path, def->bytes, std::nullopt));
  ASYNCINFER_ASSIGN_OR_RETURN(SignatureSource sig, resolve_signature(path, options, params));
  def->signature = std::move(sig.signature);
  const std::string what = "torch model '" + path + "'";

  // forward(self, ...) must take as many tensors as the signature lists.
  try {
    const auto& schema = module.get_method("forward").function().getSchema();
    std::size_t required = 0;
    const std::size_t declared = schema.arguments().empty() ? 0 : schema.arguments().size() - 1;
    for (std::size_t i = 1; i < schema.arguments().size(); ++i) {
      if (!schema.arguments()[i].default_value()) ++required;
    }
    const std::size_t given = def->signature.inputs.size();
    if (!schema.is_vararg() && (given < required || given > declared)) {
      return invalid_argument_error(what + ": forward" + " takes " + std::to_string(declared) +
                                    " argument(s) but " + sig.source + " lists " +
                                    std::to_string(given) + " input(s)");
    }
  } catch (const c10::Error& e) {
    return invalid_argument_error(what + ": cannot read forward()'s schema: " + reason_of(e));
  }

  // One forward on zeros: the module runs, and its outputs agree with the signature.
  try {
    c10::InferenceMode guard;
    const auto result = module.forward(zero_inputs(def->signature, 1, c10::Device(c10::kCPU)));
    auto outputs = result_tensors(result, def->signature);
    Status check = outputs.ok() ? check_outputs(def->signature, *outputs, 1) : outputs.status();
    if (!check.ok()) {
      return invalid_argument_error(what + " contradicts " + sig.source + ": " +
                                    std::string(check.message()));
    }
  } catch (const c10::Error& e) {
    return invalid_argument_error(what + ": the check forward on zeros shaped by " + sig.source +
                                  " (batch 1, dynamic dims 1) failed: " + reason_of(e));
  } catch (const std::exception& e) {
    return invalid_argument_error(what + ": the check forward on zeros shaped by " + sig.source +
                                  " failed: " + trim_reason(e.what()));
  }
  return std::shared_ptr<Model>(std::make_shared<TorchModel>(std::move(def)));
}

void register_torch_model_backend(ModelBackendRegistry& registry) {
  (void)registry.add({"torch", "torch:<file.pt> or a path ending in .pt", &load_torch_model,
                      nullptr, /*takes_backend_parameters=*/true});
}

}  // namespace asyncinfer::detail
