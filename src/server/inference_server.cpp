// InferenceServer (inference_server.hpp): the protocol-neutral core that the HTTP and gRPC
// frontends share: health, lookups, the checks of a request, its submission, and metrics.
//
// submit() checks a request and goes to run(), or to submit_cached() when the response cache
// applies (cache_follower.cpp: the cache's leaders and followers); run() goes to run_ensemble()
// for an ensemble (ensemble_run.cpp: EnsembleRun, which calls find() and run() for each step), and
// retries on successor() when the version it was given was retired meanwhile. Every path answers
// through make_response() (inference_response.hpp), so that each request is answered exactly once
// whichever path it takes.
//
// Its sections, in order: helpers, the server's life (health, readiness, shutdown), lookups,
// checking a request (inputs, outputs, parameters, shared memory), submission (submit,
// successor, write_to_shared_memory, run), metrics.
#include "inference_server.hpp"

#include "metrics/prometheus_text.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "asyncinfer/detail/chrono.hpp"
#include "classification.hpp"
#include "inference_response.hpp"
#include "model_config.hpp"
#include "model_host.hpp"
#include "server_log.hpp"
#include "trace.hpp"

namespace asyncinfer::server {
// ---- helpers ------------------------------------------------------------------------------------

namespace {

// A python model's view of a client's request (InferenceRequest.request_id() and parameters()):
// the parameters the server does not consume itself, as a JSON object.
std::shared_ptr<RequestContext> python_request_context(const std::string& id,
                                                       const Parameters& parameters) {
  auto c = std::make_shared<RequestContext>();
  c->id = id;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, value] : parameters) {
    if (key == "timeout" || key == "priority" || key == "sequence_id" || key == "sequence_start" ||
        key == "sequence_end" || key == "binary_data_output" ||
        key == "triton_enable_empty_final_response") {
      continue;  // Triton's reserved parameters: the server applies them
    }
    std::visit([&, k = &key](const auto& v) { j[*k] = v; }, value);
  }
  c->parameters_json = j.empty() ? std::string() : j.dump();
  return c;
}

std::string names_of(const std::vector<TensorSpec>& specs) {
  std::string out;
  for (const TensorSpec& s : specs) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

std::string versions_of(const ServedModel& m) {
  std::string out;
  for (const auto& v : m.versions) {
    if (!out.empty()) out += ", ";
    out += v->version_text;
  }
  return out.empty() ? "none" : out;
}

std::string dims_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

/// Replaces each output of `response` asked for with a class count (`classes`, by requested
/// index) by its top classes (classification.hpp), labelled from `model`'s label_filename.
Status classify_outputs(const ModelVersion& model, const std::vector<std::uint32_t>& classes,
                        InferResponse& response) {
  for (InferOutput& o : response.outputs) {
    if (o.requested < 0 || classes[static_cast<std::size_t>(o.requested)] == 0) continue;
    auto labels = model.class_labels.find(o.spec->name);
    Result<Tensor> t =
        classify(o.tensor, model.signature.batched, classes[static_cast<std::size_t>(o.requested)],
                 labels == model.class_labels.end() ? nullptr : labels->second.get());
    if (!t.ok()) return t.status().with_context("output '" + o.spec->name + "'");
    o.tensor = std::move(*t);
  }
  return Status();
}

/// Triton's words for a model the repository does not have (its model repository manager's;
/// Triton's example clients and qa tests match on "Request for unknown model").
std::string unknown_model_message(std::string_view model) {
  return "Request for unknown model: '" + std::string(model) + "' is not found";
}

}  // namespace

// ---- the server's life --------------------------------------------------------------------------

InferenceServer::InferenceServer(std::unique_ptr<ModelRepository> repository, ServerOptions options)
    : repository_(std::move(repository)),
      options_(std::move(options)),
      memory_(options_.max_inflight_bytes),
      shared_memory_(&memory_, options_.max_shm_regions),
      connections_(options_.connection_fds) {
  if (options_.log == nullptr) {
    own_log_ = std::make_unique<ServerLog>("asyncinfer serve");
    options_.log = own_log_.get();
  }
  if (options_.trace == nullptr) {
    own_trace_ = std::make_unique<TraceManager>(TraceConfig{});
    options_.trace = own_trace_.get();
  }
  if (options_.response_cache_bytes > 0) {
    cache_ = std::make_unique<ResponseCache>(options_.response_cache_bytes);
  }
  repository_observer_ = repository_->on_change([this] { readiness_observers_.notify(); });
  host_ = std::make_unique<ServerModelHost>(*this);
  repository_->host_link().bind(host_.get());
}

InferenceServer::~InferenceServer() {
  if (live()) shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
  // Its models (and their processes) may outlive it in the repository's engines being torn
  // down: from here their calls get unavailable.
  repository_->host_link().unbind();
  // The repository (a member) outlives this body; its engines may still tell it of changes.
  repository_->remove_observer(repository_observer_);
}

void InferenceServer::begin_drain() noexcept {
  if (!draining_.exchange(true, std::memory_order_acq_rel)) readiness_observers_.notify();
}

bool InferenceServer::ready() const { return ready(true); }

bool InferenceServer::ready_unannounced() const { return ready(false); }

bool InferenceServer::ready(bool announce) const {
  if (draining() || !live()) return false;
  // A listener whose accept() failed for want of descriptors counts as accepting again once
  // enough are free (ListenerHealth::recheck_descriptors). Its next accept that succeeds says so
  // itself (set_accepting, which its observers hear); but descriptors also come back with
  // nothing to announce it (a file closed elsewhere in the process, the limit raised) and no
  // client may connect, so readiness re-examines the failure whenever it is asked for (a probe,
  // ServerReady, a gRPC health Check, any pushed change): a question, not a timer, and nothing
  // to poll for. What it finds is then pushed like any other change: the readiness observers
  // are told (the gRPC health service's Watch calls would otherwise stay NOT_SERVING after an
  // HTTP probe found the recovery), and a paused listener is woken (it accepts again).
  if (listeners_.recheck_descriptors()) {
    connections_.release(0);  // wake a paused listener
    if (announce) readiness_observers_.notify();
  }
  if (!listeners_.all_accepting()) return false;
  bool any = false;
  bool counted = false;
  auto snap = repository_->snapshot();
  for (const auto& m : snap->models) {
    if (!m->counts_for_readiness()) continue;  // not asked for, or loading for the first time
    counted = true;
    if (options_.strict_readiness && !m->all_ready()) return false;
    ModelRef v = m->default_version();
    any = any || (v != nullptr && v->serving());
  }
  return any || !counted;
}

std::string InferenceServer::unready_reason() const {
  if (draining() || !live()) return "server is shutting down";
  if (!listeners_.all_accepting()) {
    return "server is not ready: a listener cannot accept connections (" + listeners_.reasons() +
           ")";
  }
  return "server is not ready: a model version failed to load or cannot serve (POST "
         "/v2/repository/index gives each version's state and reason)";
}

void InferenceServer::shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout) {
  begin_drain();
  const Clock::time_point start = Clock::now();
  if (mode == ShutdownMode::drain) {
    // Ensemble requests in flight still need their later steps' engines: let them finish (within
    // the drain timeout) before the engines stop taking requests.
    std::unique_lock lock(ensembles_mu_);
    ensembles_cv_.wait_until(lock, detail::saturating_add(start, drain_timeout),
                             [this] { return live_ensembles_ == 0; });
  }
  const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  repository_->shutdown(
      mode, drain_timeout > spent ? drain_timeout - spent : std::chrono::milliseconds(0));
  stopped_.store(true, std::memory_order_release);
}

// ---- lookups ------------------------------------------------------------------------------------

Result<std::vector<ModelRef>> InferenceServer::stats_versions(std::string_view model,
                                                              std::string_view version) const {
  std::vector<ModelRef> out;
  auto loaded = [&](const ServedModel& m) {
    for (const auto& v : m.versions) {
      if (v->engine || v->ensemble) out.push_back(v);
    }
  };
  auto snap = repository_->snapshot();
  if (model.empty()) {
    if (!version.empty()) {
      return invalid_argument_error("a statistics request with a version needs a model name");
    }
    for (const auto& m : snap->models) loaded(*m);
    return out;
  }
  if (version.empty()) {
    const ServedModel* m = snap->find(model);
    if (m == nullptr) {
      if (Status ambiguous = snap->ambiguity(model); !ambiguous.ok()) return ambiguous;
      return invalid_argument_error(unknown_model_message(model));
    }
    loaded(*m);
    if (out.empty()) {
      return invalid_argument_error("model '" + m->name + "' has no loaded version" +
                                    (m->reason.empty() ? std::string() : ": " + m->reason));
    }
    return out;
  }
  auto v = find(model, version);
  if (!v.ok()) return invalid_argument_error(v.status().message());
  out.push_back(std::move(*v));
  return out;
}

Result<ModelRef> InferenceServer::find(std::string_view model, std::string_view version,
                                       std::string_view prefer_ns) const {
  // A version replaced between the snapshot and its health check (its engine drains) is not
  // the answer: its successor is in a newer snapshot.
  for (int attempt = 0;; ++attempt) {
    bool retired = false;
    Result<ModelRef> r = find_once(model, version, prefer_ns, &retired);
    if (r.ok() || !retired || attempt == 8) return r;
  }
}

std::shared_ptr<const ServedModel> InferenceServer::model_of(const ModelVersion& version) const {
  auto snap = repository_->snapshot();
  const ServedModel* m = snap->find(version.model_namespace, version.model_name);
  if (m == nullptr) return nullptr;
  return std::shared_ptr<const ServedModel>(std::move(snap), m);  // lives as long as the snapshot
}

Status InferenceServer::check_trace_model(std::string_view model) const {
  Result<ModelRef> r = find(model, "");
  if (r.ok()) return Status();
  if (Status ambiguous = repository_->snapshot()->ambiguity(model); !ambiguous.ok()) {
    return ambiguous;
  }
  return invalid_argument_error("Request for unknown model : " + std::string(model));
}

Result<ModelRef> InferenceServer::find_once(std::string_view model, std::string_view version,
                                            std::string_view prefer_ns, bool* retired) const {
  auto snap = repository_->snapshot();
  const ServedModel* m = prefer_ns.empty() ? snap->find(model) : snap->find_from(prefer_ns, model);
  if (m == nullptr) {
    if (Status ambiguous = snap->ambiguity(model); !ambiguous.ok()) return ambiguous;
    return not_found_error(unknown_model_message(model));
  }
  if (!m->requested && m->versions.empty()) {
    return not_found_error("Request for unknown model: '" + m->name +
                           "' has no available versions (it is not loaded: " + m->reason + ")");
  }
  if (version.empty()) {
    if (ModelRef v = m->default_version()) {
      if (!v->serving()) {
        *retired = v->retired.load();
        return unavailable_error("model '" + m->name + "' version " + v->version_text +
                                 " is not ready: " + v->unready_reason());
      }
      return v;
    }
    std::string why = m->reason;
    if (why.empty() && !m->versions.empty()) {
      const ModelVersion& last = *m->versions.back();
      why = "version " + last.version_text + ": " + last.reason;
    }
    return unavailable_error("model '" + m->name +
                             "' is not ready: " + (why.empty() ? "no version loaded" : why));
  }
  std::int64_t n = 0;
  const char* end = version.data() + version.size();
  auto [p, ec] = std::from_chars(version.data(), end, n);
  if (ec != std::errc() || p != end || n < 1) {
    // Triton's words (its example grpc_explicit_int8_content_client.py matches on them).
    return invalid_argument_error("failed to get model version from specified version string '" +
                                  std::string(version) + "' (model '" + m->name +
                                  "': a version is a positive integer)");
  }
  ModelRef v = m->find_version(n);
  if (v == nullptr) {
    return not_found_error("Request for unknown model: '" + m->name + "' version " +
                           std::string(version) +
                           " is not found (versions served: " + versions_of(*m) + ")");
  }
  if (!v->serving()) {
    *retired = v->retired.load();
    return unavailable_error("model '" + m->name + "' version " + v->version_text +
                             " is not ready: " + v->unready_reason());
  }
  return v;
}

// ---- checking a request -------------------------------------------------------------------------

Result<Tensor> InferenceServer::bytes_input(const ModelVersion& model, std::string_view name,
                                            Shape shape, std::string serialized) {
  std::size_t expected = 1;
  for (const std::int64_t d : shape)
    expected *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
  const std::string where =
      "for inference input '" + std::string(name) + "' for model '" + model.model_name + "'";
  std::size_t at = 0;
  std::size_t count = 0;
  while (at < serialized.size()) {
    if (count == expected) {
      return invalid_argument_error("unexpected number of string elements " +
                                    std::to_string(count + 1) + " " + where + ", expecting " +
                                    std::to_string(expected));
    }
    if (serialized.size() - at < 4) {
      return invalid_argument_error("incomplete string length indicator " + where +
                                    ", expecting 4 bytes but only " +
                                    std::to_string(serialized.size() - at) + " bytes available");
    }
    std::uint32_t n = 0;
    for (int b = 0; b < 4; ++b) {
      n |= static_cast<std::uint32_t>(static_cast<unsigned char>(serialized[at + b])) << (8 * b);
    }
    at += 4;
    if (n > serialized.size() - at) {
      return invalid_argument_error("string element " + std::to_string(count) + " " + where +
                                    " has length " + std::to_string(n) + " but only " +
                                    std::to_string(serialized.size() - at) +
                                    " bytes follow its length");
    }
    at += n;
    ++count;
  }
  if (count != expected) {
    return invalid_argument_error("expected " + std::to_string(expected) + " string elements " +
                                  where + ", got " + std::to_string(count));
  }
  auto t = Tensor::from_serialized(std::move(shape), std::move(serialized));
  if (!t.ok()) return t.status().with_context("input '" + std::string(name) + "'");
  return t;
}

Status InferenceServer::byte_size_mismatch(const ModelVersion& model, std::string_view name,
                                           std::size_t expected, std::size_t got) {
  return invalid_argument_error("input byte size mismatch for input '" + std::string(name) +
                                "' for model '" + model.model_name + "'. Expected " +
                                std::to_string(expected) + ", got " + std::to_string(got));
}

Result<InputSlot> InferenceServer::check_input(const ModelVersion& model, std::string_view name,
                                               std::string_view datatype,
                                               std::span<const std::int64_t> shape) {
  const ModelSignature& sig = model.signature;
  const std::string what = "input '" + std::string(name) + "'";
  auto it = std::find_if(sig.inputs.begin(), sig.inputs.end(),
                         [&](const TensorSpec& s) { return s.name == name; });
  if (it == sig.inputs.end()) {
    return invalid_argument_error("unexpected inference input '" + std::string(name) +
                                  "' for model '" + model.model_name +
                                  "' (inputs: " + names_of(sig.inputs) + ")");
  }
  auto dtype = dtype_from_oip(datatype);
  if (!dtype.ok()) return dtype.status().with_context(what);
  if (*dtype != it->dtype) {
    return invalid_argument_error(what + ": datatype " + std::string(datatype) +
                                  " does not match the model's " +
                                  std::string(oip_datatype(it->dtype)));
  }
  for (std::int64_t d : shape) {
    if (d < 0) {
      return invalid_argument_error(what + ": shape " + dims_text(shape) +
                                    " has a negative dim; dims are >= 0");
    }
  }
  if (shape.size() != it->shape.size()) {
    return invalid_argument_error(what + ": shape " + dims_text(shape) + " has " +
                                  std::to_string(shape.size()) + " dims, the model expects " +
                                  std::to_string(it->shape.size()) + " (" +
                                  shape_to_string(it->shape) + ", -1 = any)");
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (it->shape[i] >= 0 && it->shape[i] != shape[i]) {
      return invalid_argument_error(what + ": shape " + dims_text(shape) +
                                    " does not match the "
                                    "model's " +
                                    shape_to_string(it->shape) + " (-1 = any) at dim " +
                                    std::to_string(i));
    }
  }
  auto bytes = checked_byte_size(*dtype, shape);
  if (!bytes.ok()) {
    return invalid_argument_error(what + ": shape " + dims_text(shape) + " of " +
                                  std::string(datatype) +
                                  " is too large (its byte size overflows "
                                  "64 bits)");
  }
  if (sig.batched) {
    if (shape[0] < 1) {
      return invalid_argument_error(what + ": batch dim (dim 0) is 0; it must be at least 1");
    }
    if (model.max_batch_size > 0 && shape[0] > model.max_batch_size) {
      return invalid_argument_error(what + ": batch size " + std::to_string(shape[0]) +
                                    " exceeds the model's max_batch_size " +
                                    std::to_string(model.max_batch_size));
    }
  }
  InputSlot slot;
  slot.index = static_cast<std::size_t>(it - sig.inputs.begin());
  slot.spec = &*it;
  slot.dtype = *dtype;
  slot.byte_size = *bytes;
  slot.element_count = *checked_element_count(shape);
  return slot;
}

Result<const TensorSpec*> InferenceServer::check_output(const ModelVersion& model,
                                                        std::string_view name) {
  const auto& outs = model.signature.outputs;
  auto it =
      std::find_if(outs.begin(), outs.end(), [&](const TensorSpec& s) { return s.name == name; });
  if (it == outs.end()) {
    return invalid_argument_error("model '" + model.model_name + "' has no output '" +
                                  std::string(name) + "' (outputs: " + names_of(outs) + ")");
  }
  return &*it;
}

Result<std::int64_t> parameter_int(const ParameterValue& value, std::string_view name,
                                   std::int64_t lo, std::int64_t hi) {
  const std::string what = "parameter '" + std::string(name) + "'";
  std::int64_t v = 0;
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    v = *i;
  } else if (const auto* u = std::get_if<std::uint64_t>(&value)) {
    if (*u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return invalid_argument_error(what + " is out of range " + std::to_string(lo) + ".." +
                                    std::to_string(hi));
    }
    v = static_cast<std::int64_t>(*u);
  } else {
    return invalid_argument_error(what + " must be an integer");
  }
  if (v < lo || v > hi) {
    return invalid_argument_error(what + " is " + std::to_string(v) + ", outside " +
                                  std::to_string(lo) + ".." + std::to_string(hi));
  }
  return v;
}

std::size_t input_bytes(const InferRequest& request) {
  std::size_t n = 0;
  for (const InferInput& in : request.inputs) {
    if (!in.counted) n += in.tensor.byte_size();
  }
  return n;
}

std::size_t output_bytes(const InferResponse& response) {
  std::size_t n = 0;
  for (const InferOutput& o : response.outputs) n += o.tensor.byte_size();
  return n;
}

Result<std::optional<SharedMemoryTensor>> shared_memory_parameters(const Parameters& parameters,
                                                                   const std::string& what) {
  auto region = parameters.find("shared_memory_region");
  auto size = parameters.find("shared_memory_byte_size");
  auto offset = parameters.find("shared_memory_offset");
  if (region == parameters.end()) {
    if (size != parameters.end() || offset != parameters.end()) {
      return invalid_argument_error(what +
                                    ": shared_memory_byte_size or shared_memory_offset "
                                    "given without shared_memory_region");
    }
    return std::optional<SharedMemoryTensor>();
  }
  const auto* name = std::get_if<std::string>(&region->second);
  if (name == nullptr) {
    return invalid_argument_error(what + ": parameter 'shared_memory_region' must be a string");
  }
  if (size == parameters.end()) {
    return invalid_argument_error(what + ": shared_memory_region '" + *name +
                                  "' needs shared_memory_byte_size");
  }
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  SharedMemoryTensor t;
  t.region = *name;
  auto n = parameter_int(size->second, "shared_memory_byte_size", 0, kMax);
  if (!n.ok()) return n.status().with_context(what);
  t.byte_size = static_cast<std::size_t>(*n);
  if (offset != parameters.end()) {
    auto o = parameter_int(offset->second, "shared_memory_offset", 0, kMax);
    if (!o.ok()) return o.status().with_context(what);
    t.offset = static_cast<std::size_t>(*o);
  }
  return std::optional<SharedMemoryTensor>(std::move(t));
}

Result<bool> parameter_bool(const ParameterValue& value, std::string_view name) {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  return invalid_argument_error("parameter '" + std::string(name) + "' must be true or false");
}

Result<RequestOptions> InferenceServer::request_options(const Parameters& parameters) {
  RequestOptions o;
  // Triton keeps the "triton_" prefix for itself; of those keys a client may send only
  // triton_enable_empty_final_response (its common.h; the words are its HTTP frontend's).
  for (auto it = parameters.lower_bound("triton_");
       it != parameters.end() && it->first.starts_with("triton_"); ++it) {
    if (it->first != "triton_enable_empty_final_response") {
      return invalid_argument_error(
          "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
          "be specified. (parameter '" +
          it->first + "')");
    }
  }
  if (auto it = parameters.find("timeout"); it != parameters.end()) {
    // Triton's request parameter, in microseconds; 0 = no timeout of the request's own.
    ASYNCINFER_ASSIGN_OR_RETURN(
        std::int64_t us,
        parameter_int(it->second, "timeout", 0, std::numeric_limits<std::int64_t>::max()));
    if (us > 0) o.timeout = std::chrono::microseconds(us);
  }
  if (auto it = parameters.find("priority"); it != parameters.end()) {
    ASYNCINFER_ASSIGN_OR_RETURN(std::int64_t level, parameter_int(it->second, "priority", 0, 1000));
    o.priority = static_cast<int>(level);
  }
  // Triton's sequence extension: sequence_id (an unsigned integer or a string), sequence_start,
  // sequence_end. 0 and "" mean no sequence (the engine of a stateful model refuses that).
  auto id = parameters.find("sequence_id");
  auto start = parameters.find("sequence_start");
  auto end = parameters.find("sequence_end");
  if (id != parameters.end() || start != parameters.end() || end != parameters.end()) {
    SequenceFlags f;
    if (id != parameters.end()) {
      if (const auto* text = std::get_if<std::string>(&id->second)) {
        f.id = *text;
      } else if (const auto* u = std::get_if<std::uint64_t>(&id->second)) {
        f.id = *u;
      } else if (const auto* i = std::get_if<std::int64_t>(&id->second); i != nullptr && *i >= 0) {
        f.id = static_cast<std::uint64_t>(*i);
      } else {
        return invalid_argument_error(
            "parameter 'sequence_id' must be an unsigned integer or a string");
      }
    }
    if (start != parameters.end()) {
      ASYNCINFER_ASSIGN_OR_RETURN(f.start, parameter_bool(start->second, "sequence_start"));
    }
    if (end != parameters.end()) {
      ASYNCINFER_ASSIGN_OR_RETURN(f.end, parameter_bool(end->second, "sequence_end"));
    }
    const bool none = std::visit(
        [](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
            return v.empty();
          } else {
            return v == 0;
          }
        },
        f.id);
    // A request outside any sequence may carry sequence_id 0 and false flags (Triton's clients
    // send them by default).
    if (!none || f.start || f.end) o.sequence = std::move(f);
  }
  return o;
}

std::string decoupled_message(const std::string& model_name) {
  return "model '" + model_name +
         "' is decoupled (model_transaction_policy decoupled: true: many responses per "
         "request): use gRPC ModelStreamInfer or HTTP POST .../generate_stream";
}

namespace {

// Triton's count check: too many or too few inputs, or a required one missing, in its words
// ("expected 3 inputs but got 1 inputs for model 'M'. Got input(s) ['A'], but missing required
// input(s) ['B','C']. Please provide all required input(s)."; "expected number of inputs between
// 3 and 4 ..." where some are optional; qa/L0_input_validation), then an unknown name ("unexpected
// inference input 'X' for model 'M'", with the inputs it has).
Status check_input_count(const std::string& model, const ModelSignature& sig,
                         const std::vector<InferInput>& given, const Inputs& placed,
                         const std::string* unknown) {
  std::size_t required = 0;
  std::string missing;
  for (std::size_t i = 0; i < sig.inputs.size(); ++i) {
    if (sig.inputs[i].optional) continue;
    ++required;
    if (!placed[i].defined()) missing += (missing.empty() ? "'" : ",'") + sig.inputs[i].name + "'";
  }
  const bool count_ok = given.size() >= required && given.size() <= sig.inputs.size();
  if (count_ok && unknown != nullptr) {
    return invalid_argument_error("unexpected inference input '" + *unknown + "' for model '" +
                                  model + "' (inputs: " + names_of(sig.inputs) + ")");
  }
  if (count_ok && missing.empty()) return Status();
  std::string got;
  for (const InferInput& in : given) got += (got.empty() ? "'" : ",'") + in.name + "'";
  const std::string expected = required == sig.inputs.size()
                                   ? "expected " + std::to_string(required) + " inputs"
                                   : "expected number of inputs between " +
                                         std::to_string(required) + " and " +
                                         std::to_string(sig.inputs.size());
  return invalid_argument_error(expected + " but got " + std::to_string(given.size()) +
                                " inputs for model '" + model + "'. Got input(s) [" + got +
                                "], but missing required input(s) [" + missing +
                                "]. Please provide all required input(s).");
}

}  // namespace

// ---- submission ---------------------------------------------------------------------------------

Result<InflightRequest> InferenceServer::submit(const ModelRef& ref, InferRequest request,
                                                Completion done) {
  // Found before a reload replaced it: its successor takes it (checked there to take the same
  // inputs and give the same outputs, once the inputs are in order).
  const bool replaced = ref->retired.load(std::memory_order_acquire);
  const ModelVersion& model = *ref;
  if (!model.engine && !model.ensemble) {
    return unavailable_error("model '" + model.model_name + "' version " + model.version_text +
                             " is not ready");
  }
  const ModelSignature& sig = model.signature;
  // Inputs in signature order; each once; every required one given (optional ones may be left
  // out), checked in Triton's order and words (its core's request validation).
  Inputs inputs(sig.inputs.size());
  const std::string* unknown = nullptr;
  for (InferInput& in : request.inputs) {
    auto it = std::find_if(sig.inputs.begin(), sig.inputs.end(),
                           [&](const TensorSpec& s) { return s.name == in.name; });
    if (it == sig.inputs.end()) {
      if (unknown == nullptr) unknown = &in.name;
      continue;
    }
    Tensor& slot = inputs[static_cast<std::size_t>(it - sig.inputs.begin())];
    if (slot.defined()) return invalid_argument_error("input '" + in.name + "' is given twice");
    slot = std::move(in.tensor);
  }
  if (Status s = check_input_count(model.model_name, sig, request.inputs, inputs, unknown);
      !s.ok()) {
    return s;
  }
  // Outputs asked for: known, each once.
  std::vector<std::size_t> selected;
  for (std::size_t r = 0; r < request.outputs.size(); ++r) {
    ASYNCINFER_ASSIGN_OR_RETURN(const TensorSpec* spec,
                                check_output(model, request.outputs[r].name));
    const std::size_t index = static_cast<std::size_t>(spec - sig.outputs.data());
    if (std::find(selected.begin(), selected.end(), index) != selected.end()) {
      return invalid_argument_error("output '" + spec->name + "' is requested twice");
    }
    selected.push_back(index);
  }
  // Outputs asked for as their top classes (Triton's classification extension): by requested
  // index, left empty (no allocation) when no output asks.
  std::vector<std::uint32_t> classes;
  for (std::size_t r = 0; r < request.outputs.size(); ++r) {
    const RequestedOutput& want = request.outputs[r];
    ASYNCINFER_ASSIGN_OR_RETURN(std::uint32_t n, class_count(want.parameters, want.name));
    if (n == 0) continue;
    if (Status s = check_classifiable(sig.outputs[selected[r]].dtype); !s.ok()) {
      return Status(s.code(), std::string(s.message()) + " (output '" + want.name + "')");
    }
    if (classes.empty()) classes.resize(request.outputs.size(), 0);
    classes[r] = n;
  }
  const bool classifying = !classes.empty();
  if (sig.decoupled && !request.on_response) {
    return failed_precondition_error(decoupled_message(model.model_name));
  }
  ASYNCINFER_ASSIGN_OR_RETURN(RequestOptions options, request_options(request.parameters));
  options.tag = request.id;
  options.context = std::move(request.context);
  if (!options.context && (model.takes_request_context || model.ensemble) &&
      (!request.id.empty() || !request.parameters.empty())) {
    options.context = python_request_context(request.id, request.parameters);
  }
  if (request.deadline) options.deadline = *request.deadline;
  options.inline_callback = request.completion_hands_off;
  if (std::any_of(request.outputs.begin(), request.outputs.end(),
                  [](const RequestedOutput& o) { return o.region != nullptr; })) {
    if (sig.decoupled) {
      return invalid_argument_error("model '" + model.model_name +
                                    "' is decoupled: its outputs cannot go to shared memory "
                                    "(each response would overwrite the last)");
    }
    options.inline_callback = false;  // the copies into the regions run in the continuation
    done = write_to_shared_memory(std::move(request.outputs), std::move(done));
  }

  ModelRef next;
  if (replaced) {
    ASYNCINFER_ASSIGN_OR_RETURN(next, successor(model, inputs));
  }
  const ModelRef& target = next ? next : ref;
  if (classifying) {
    // Before the copies into shared memory (the wrapper made above runs after this one).
    options.inline_callback = false;  // it formats strings: not on the engine's thread
    done = [target, classes, done = std::move(done)](Result<InferResponse> r) mutable {
      if (r.ok()) {
        if (Status s = classify_outputs(*target, classes, *r); !s.ok()) return done(std::move(s));
      }
      done(std::move(r));
    };
  }
  if (sig.decoupled) {
    // Each response before the final one, with the outputs asked for, on the model's thread.
    options.on_response = [target, id = request.id, selected, classes, classifying,
                           send = std::move(request.on_response)](Outputs outs,
                                                                  std::stop_token stop) {
      InferResponse response = make_response(target, id, selected, outs);
      if (classifying) {
        if (Status s = classify_outputs(*target, classes, response); !s.ok()) return s;
      }
      return send(std::move(response), std::move(stop));
    };
  }
  if (request.trace) [[unlikely]] {  // a sampled request (trace.hpp): the last wrapper, run first
    done = trace_request(std::move(request.trace), *target, request.id, inputs, options,
                         std::move(done));
  }
  if (cache_ && target->response_cache && !options.sequence) {  // a sequence's step has state
    options.inline_callback = false;  // filling the cache copies the outputs
    return submit_cached(target, std::move(inputs), options, std::move(request.id),
                         std::move(selected), std::move(done));
  }
  // The caller runs it only where its completion only hands the answer on (the callback then
  // runs on the caller too, and posts to itself).
  if (options.inline_callback) options.caller_run_max_compute = request.caller_run_max_compute;
  return run(target, std::move(inputs), options, std::move(request.id), std::move(selected),
             std::move(done));
}

InferenceServer::Completion InferenceServer::trace_request(
    std::shared_ptr<Trace> trace, const ModelVersion& model, const std::string& id,
    const Inputs& inputs, RequestOptions& options, Completion done) {
  trace->set_model(model.model_name, model.version, id);
  trace->record_now("REQUEST_START");
  if (trace->traces_tensors()) {  // Triton's TENSORS level: the inputs queued and run
    const std::vector<TensorSpec>& specs = model.signature.inputs;
    for (std::size_t i = 0; i < inputs.size() && i < specs.size(); ++i) {
      trace->record_tensor({"TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_INPUT"}, specs[i].name,
                           inputs[i]);
    }
  }
  options.timeline = trace->timeline();
  if (model.takes_request_context || model.ensemble) {
    // The trace goes with the request to its model: a python model's calls made with
    // trace=request.trace(), and an ensemble's steps, become its children.
    auto context = options.context ? std::make_shared<RequestContext>(*options.context)
                                   : std::make_shared<RequestContext>();
    context->trace = trace;
    options.context = std::move(context);
  }
  return [trace = std::move(trace), done = std::move(done)](Result<InferResponse> r) mutable {
    trace->record_timeline();
    trace->record_now("REQUEST_END");
    if (r.ok()) {
      if (trace->traces_tensors()) {
        for (const InferOutput& o : r->outputs) {
          trace->record_tensor({"TENSOR_BACKEND_OUTPUT"}, o.spec->name, o.tensor);
        }
      }
      r->trace = trace;
    }
    done(std::move(r));
  };
}

Result<ModelRef> InferenceServer::successor(const ModelVersion& retired,
                                            const Inputs& inputs) const {
  auto snap = repository_->snapshot();
  const ServedModel* m = snap->find(retired.model_namespace, retired.model_name);
  if (m == nullptr || (!m->requested && m->versions.empty())) {
    return not_found_error("model '" + retired.model_name + "' was unloaded");
  }
  ModelRef v = m->find_version(retired.version);
  if (!v || !v->serving()) v = m->default_version();
  if (!v || !v->serving()) {
    return unavailable_error("model '" + retired.model_name + "' version " + retired.version_text +
                             " was replaced and no version serves now");
  }
  const auto& specs = v->signature.inputs;
  bool fits = specs.size() == inputs.size();
  for (std::size_t i = 0; fits && i < specs.size(); ++i) {
    const Shape& want = specs[i].shape;
    const Shape& got = inputs[i].shape();
    fits = specs[i].name == retired.signature.inputs[i].name &&
           specs[i].dtype == inputs[i].dtype() && want.size() == got.size();
    for (std::size_t d = 0; fits && d < want.size(); ++d) {
      fits = want[d] < 0 || want[d] == got[d];
    }
    if (fits && v->signature.batched && v->max_batch_size > 0) {
      fits = !got.empty() && got[0] <= v->max_batch_size;
    }
  }
  // The outputs asked for are indices into the signature: the same names in the same order.
  const auto& outs = v->signature.outputs;
  fits = fits && outs.size() == retired.signature.outputs.size() &&
         std::equal(outs.begin(), outs.end(), retired.signature.outputs.begin(),
                    [](const TensorSpec& a, const TensorSpec& b) { return a.name == b.name; });
  if (!fits) {
    return invalid_argument_error("model '" + retired.model_name + "' was reloaded with inputs (" +
                                  names_of(specs) + ") or outputs (" + names_of(outs) +
                                  ") that this request does not fit; send it again");
  }
  return v;
}

InferenceServer::Completion InferenceServer::write_to_shared_memory(
    std::vector<RequestedOutput> requested, Completion done) {
  // Runs where the response is made (the engine's completion executor, or the caller's thread on
  // a cache hit), before the frontend encodes it. The regions stay open until then: the
  // requested outputs hold them. A client that shrank its object gets this request's error
  // (SharedMemoryRegion::write), never a fault in the server.
  return
      [requested = std::move(requested), done = std::move(done)](Result<InferResponse> r) mutable {
        if (r.ok()) {
          for (InferOutput& o : r->outputs) {
            if (o.requested < 0) continue;
            const RequestedOutput& want = requested[static_cast<std::size_t>(o.requested)];
            if (!want.region) continue;
            const std::size_t n = o.tensor.byte_size();
            if (n > want.shared_memory->byte_size) {
              return done(invalid_argument_error(
                  "output '" + want.name + "' is " + std::to_string(n) + " bytes (" +
                  std::string(oip_datatype(o.tensor.dtype())) + shape_to_string(o.tensor.shape()) +
                  "), more than its shared_memory_byte_size " +
                  std::to_string(want.shared_memory->byte_size) + " in region '" +
                  want.shared_memory->region + "'"));
            }
            if (!o.tensor.is_host_accessible()) {
              return done(internal_error("output '" + want.name + "' is not in host memory"));
            }
            if (n > 0) {
              Status w = want.region->write(want.shared_memory->offset, o.tensor.data(), n,
                                            "output '" + want.name + "'");
              if (!w.ok()) return done(std::move(w));
            }
            o.shared_memory =
                SharedMemoryTensor{want.shared_memory->region, n, want.shared_memory->offset};
          }
        }
        done(std::move(r));
      };
}

InferResponse make_response(const ModelRef& ref, std::string id,
                            const std::vector<std::size_t>& selected, const Outputs& outs) {
  const ModelVersion& model = *ref;
  InferResponse response;
  response.model = ref;
  response.id = std::move(id);
  if (outs.empty()) return response;  // a decoupled model's final flag alone: no outputs
  // The model's reshaped outputs in the config's dims (Triton's reshape).
  Outputs reshaped;
  if (!model.output_reshapes.empty()) {
    reshaped = outs;
    apply_reshapes(model.output_reshapes, model.signature.outputs, /*to_model=*/false, reshaped);
  }
  const Outputs& out = model.output_reshapes.empty() ? outs : reshaped;
  if (selected.empty()) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      response.outputs.push_back({&model.signature.outputs[i], out[i], -1});
    }
  } else {
    for (std::size_t k = 0; k < selected.size(); ++k) {
      response.outputs.push_back(
          {&model.signature.outputs[selected[k]], out[selected[k]], static_cast<int>(k)});
    }
  }
  return response;
}

std::uint64_t ns_between(Clock::time_point from, Clock::time_point to) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}

std::uint64_t ns_since(Clock::time_point start) { return ns_between(start, Clock::now()); }

Result<InflightRequest> InferenceServer::run(ModelRef model, Inputs inputs,
                                             const RequestOptions& options, std::string id,
                                             std::vector<std::size_t> selected, Completion done,
                                             Finished finished) {
  if (model->ensemble) {
    return run_ensemble(std::move(model), std::move(inputs), options, std::move(id),
                        std::move(selected), std::move(done));
  }
  if (options.sequence && !model->engine->options().sequence_batching) {
    // Triton passes the sequence parameters of a model without sequence batching to it, which
    // ignores them (an ensemble's stateless steps get its stateful request's too).
    RequestOptions plain = options;
    plain.sequence.reset();
    return run(std::move(model), std::move(inputs), plain, std::move(id), std::move(selected),
               std::move(done), std::move(finished));
  }
  // Where versions can be replaced, a shallow copy (Tensors share their storage) of the inputs
  // survives a refusal by a version retired between the check and the submit.
  Inputs again;
  if (repository_->options().control_mode != ModelControlMode::none) again = inputs;
  // The config's reshapes: the model gets its own shapes (views, no copy).
  apply_reshapes(model->input_reshapes, model->signature.inputs, /*to_model=*/true, inputs);
  // A refusal comes back here; an accepted request that has already ended (it may have run, and
  // a decoupled one may have sent responses) is answered through its future as any other.
  Result<Future<Outputs>> accepted = model->engine->try_submit(std::move(inputs), options);
  if (!accepted.ok()) {
    if (!again.empty() && model->retired.load(std::memory_order_acquire) &&
        accepted.status().code() == StatusCode::unavailable) {
      auto next = successor(*model, again);
      if (next.ok() && *next != model) {
        return run(std::move(*next), std::move(again), options, std::move(id), std::move(selected),
                   std::move(done), std::move(finished));
      }
    }
    if (finished) finished(accepted.status());
    return accepted.status();
  }
  Future<Outputs> future = std::move(*accepted);
  future.on_complete([model = std::move(model), id = std::move(id), selected = std::move(selected),
                      done = std::move(done),
                      finished = std::move(finished)](const Result<Outputs>& r) mutable {
    // The cache's bookkeeping first (the entry, the cache_miss statistic, the followers), so
    // that a client holding its answer finds them counted; then this request's answer.
    if (finished) finished(r);
    if (!r.ok()) {
      done(r.status());
    } else {
      done(make_response(model, std::move(id), selected, *r));
    }
  });
  return InflightRequest(std::move(future));
}

// ---- metrics ------------------------------------------------------------------------------------

ProtocolMetrics& InferenceServer::protocol_metrics(std::string_view protocol,
                                                   ProtocolMetrics::Labels labels,
                                                   bool connections) {
  std::lock_guard lock(metrics_mu_);
  auto it = protocols_.find(protocol);
  if (it == protocols_.end()) {
    it = protocols_
             .emplace(std::string(protocol),
                      std::make_unique<ProtocolMetrics>(std::string(protocol), std::move(labels),
                                                        connections))
             .first;
  }
  return *it->second;
}

std::string InferenceServer::metrics_text() const {
  metrics::Families families;
  families.gauge("asyncinfer_server_ready", "1 when the server reports ready (/v2/health/ready)",
                 {}, this->ready() ? 1 : 0);
  if (cache_) {
    families.gauge("asyncinfer_response_cache_bytes", "Bytes the response cache's entries take", {},
                   static_cast<double>(cache_->bytes()));
    families.gauge("asyncinfer_response_cache_capacity_bytes",
                   "The response cache's size (--cache-config)", {},
                   static_cast<double>(cache_->capacity()));
    families.gauge("asyncinfer_response_cache_entries", "Responses in the response cache", {},
                   static_cast<double>(cache_->entries()));
    families.counter("asyncinfer_response_cache_evictions_total",
                     "Entries removed to make room (least recently used first)", {},
                     static_cast<double>(cache_->evictions()));
  }
  collect_engine_metrics(*repository_, families);
  {
    std::lock_guard lock(metrics_mu_);
    for (const auto& [name, p] : protocols_) p->collect(families);
  }
  repository_->custom_metrics().collect(families);  // python models' pb_utils.MetricFamily
  return families.text();
}

}  // namespace asyncinfer::server
