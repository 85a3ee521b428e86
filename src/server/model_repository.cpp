// ModelRepository (model_repository.hpp): the models of a Triton-layout repository: loading them,
// model control (load, unload, poll), and shutdown.
//
// One file of about 1300 lines, on purpose: its core is one set of rules about when the served
// set may change, kept by functions in every part of it. A load publishes only if no unload came
// after it was asked for (epochs_: unload() bumps the epoch; publish_if() and LoadingEngine check
// it). An engine still warming up is cancelled by unload() and by shutdown() (loading_, under
// draining_mu_). Replaced and unloaded versions drain on threads of their own, which shutdown()
// waits for (in drain mode, within its timeout) and then cancels (drains_, draining_). And
// shutdown() orders the engines, the control thread's jobs and the drains so that no answer
// reaches a frontend after its shutdown. None of these can be checked from one part alone. The
// warm-up (warmup_tensor, run_warmup) and the functions of the snapshot's types take no part in
// these rules; they are the parts to move to files of their own should this one grow.
//
// Its sections, in order: warm-up, the snapshot's types (ModelState, ModelControlMode,
// ServedModel, ModelVersion, RepositorySnapshot), folders (version folders, fingerprints, the
// loading order), the control thread (Control), snapshots, epochs and publishing, loading (load,
// build, load_version, load_ensemble), model control (reload, unload, load_model, unload_model,
// poll), draining and shutdown (drain_async, LoadingEngine, shutdown).
#include "model_repository.hpp"

#include "asyncinfer/detail/enum_names.hpp"
#include "engine/resource_pool.hpp"
#include "model/backend.hpp"
#include "model/model_host.hpp"
#include "model_host.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "classification.hpp"
#include "model_config.hpp"

namespace asyncinfer::server {
namespace fs = std::filesystem;

// ---- warm-up ------------------------------------------------------------------------------------

namespace {

/// sequence_batching state initial_state data_file: the raw bytes of
/// <model>/initial_state/<file> (row-major, exactly the state's size) as the state's first value.
Status read_initial_states(const ModelPlan& plan, const fs::path& dir, SequenceBatchingOptions& s) {
  for (SequenceState& st : s.states) {
    auto it = plan.state_files.find(st.input);
    if (it == plan.state_files.end()) continue;
    const fs::path file = dir / "initial_state" / it->second;
    std::ifstream f(file, std::ios::binary);
    if (!f) return not_found_error("initial_state data_file " + file.string() + " cannot be read");
    std::string bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(st.dtype, st.dims));
    if (bytes.size() != t.byte_size()) {
      return invalid_argument_error(
          "initial_state data_file " + file.string() + " has " + std::to_string(bytes.size()) +
          " bytes; state '" + st.input + "' " + std::string(oip_datatype(st.dtype)) +
          shape_to_string(st.dims) + " needs " + std::to_string(t.byte_size()));
    }
    if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
    st.initial = std::move(t);
  }
  return Status();
}

/// One warm-up input's tensor: zeros, random values (finite, |x| < 1 for the float types), or
/// the bytes of <model>/warmup/<file>, which must be exactly the tensor's size.
Result<Tensor> warmup_tensor(const WarmupSample::Input& in, Shape shape, const fs::path& dir,
                             std::mt19937_64& rng) {
  if (in.dtype == DType::bytes && in.data != WarmupSample::Input::Data::zero) {
    // BYTES: random_data gives 8 random lower-case letters per element; input_data_file holds
    // the serialized elements (a 4-byte little-endian length before each), as Triton reads it.
    std::string serialized;
    const std::size_t n = checked_element_count(shape).value();
    if (in.data == WarmupSample::Input::Data::random) {
      std::string element(8, 'a');
      for (std::size_t i = 0; i < n; ++i) {
        for (char& c : element) c = static_cast<char>('a' + rng() % 26);
        append_serialized_element(serialized, element);
      }
    } else {
      const fs::path file = dir / "warmup" / in.file;
      std::ifstream f(file, std::ios::binary);
      if (!f) return not_found_error("input_data_file " + file.string() + " cannot be read");
      serialized.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    auto t = Tensor::from_serialized(shape, std::move(serialized));
    if (!t.ok()) {
      return t.status().with_context("input '" + in.name + "'" +
                                     (in.data == WarmupSample::Input::Data::file
                                          ? " (input_data_file " + in.file + ")"
                                          : std::string()));
    }
    return t;
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(in.dtype, shape));
  auto* bytes = static_cast<unsigned char*>(t.data());
  switch (in.data) {
    case WarmupSample::Input::Data::zero:
      break;
    case WarmupSample::Input::Data::random: {
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      const std::size_t n = t.numel();
      if (in.dtype == DType::f32) {
        for (std::size_t i = 0; i < n; ++i) t.data_as<float>()[i] = static_cast<float>(unit(rng));
      } else if (in.dtype == DType::f64) {
        for (std::size_t i = 0; i < n; ++i) t.data_as<double>()[i] = unit(rng);
      } else if (in.dtype == DType::boolean) {
        for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(rng() & 1u);
      } else {
        for (std::size_t i = 0; i < t.byte_size(); ++i)
          bytes[i] = static_cast<unsigned char>(rng());
        if (in.dtype == DType::f16 || in.dtype == DType::bf16) {
          // Clear the exponent's top bit(s): finite values below 1 in magnitude.
          const std::uint16_t mask = in.dtype == DType::f16 ? 0xBBFF : 0xBF7F;
          auto* h = static_cast<std::uint16_t*>(t.data());
          for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<std::uint16_t>(h[i] & mask);
        }
      }
      break;
    }
    case WarmupSample::Input::Data::file: {
      const fs::path file = dir / "warmup" / in.file;
      std::ifstream f(file, std::ios::binary);
      if (!f) return not_found_error("input_data_file " + file.string() + " cannot be read");
      std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (data.size() != t.byte_size()) {
        return invalid_argument_error(
            "input_data_file " + file.string() + " has " + std::to_string(data.size()) +
            " bytes; input '" + in.name + "' " + std::string(to_string(in.dtype)) +
            shape_to_string(shape) + " needs " + std::to_string(t.byte_size()));
      }
      std::memcpy(bytes, data.data(), data.size());
      break;
    }
  }
  return t;
}

/// Runs the plan's model_warmup on `engine` before its version turns ready (Triton's rule): each
/// sample `count` times, submitted at once, and waits for them (at most 5 minutes a sample).
/// The error names the sample and what failed.
/// The bytes the inputs of a warm-up sample would take, counted before any is made: BYTES
/// elements at their largest (a 4-byte length and 8 random letters) or the file's size.
Result<std::size_t> warmup_bytes(const WarmupSample::Input& in, const Shape& shape,
                                 const fs::path& dir) {
  if (in.dtype != DType::bytes) return checked_byte_size(in.dtype, shape);
  if (in.data == WarmupSample::Input::Data::file) {
    std::error_code ec;
    const auto size = fs::file_size(dir / "warmup" / in.file, ec);
    return ec ? std::size_t{0} : static_cast<std::size_t>(size);  // unreadable: said later
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t n, checked_element_count(shape));
  if (n > std::numeric_limits<std::size_t>::max() / 12) {
    return invalid_argument_error("shape " + shape_to_string(shape) + " is too large");
  }
  return n * 12;
}

Status run_warmup(Engine& engine, const ModelPlan& plan, const ModelSignature& sig,
                  const fs::path& dir, const std::function<void(const std::string&)>& log,
                  const std::string& head, std::size_t max_bytes) {
  std::mt19937_64 rng(0x5eed);
  for (const WarmupSample& w : plan.warmup) {
    const std::string what = "model_warmup '" + w.name + "'";
    Status s = [&]() -> Status {
      for (const WarmupSample::Input& in : w.inputs) {
        const bool known = std::any_of(sig.inputs.begin(), sig.inputs.end(),
                                       [&](const TensorSpec& t) { return t.name == in.name; });
        if (!known) return invalid_argument_error("the model has no input '" + in.name + "'");
      }
      Inputs inputs;
      std::size_t bytes = 0;
      for (const TensorSpec& spec : sig.inputs) {
        auto it = std::find_if(w.inputs.begin(), w.inputs.end(),
                               [&](const WarmupSample::Input& in) { return in.name == spec.name; });
        if (it == w.inputs.end()) {
          return invalid_argument_error("no data for the model's input '" + spec.name + "'");
        }
        if (it->dtype != spec.dtype) {
          return invalid_argument_error("input '" + spec.name + "' is " +
                                        std::string(to_string(it->dtype)) + ", the model's is " +
                                        std::string(to_string(spec.dtype)));
        }
        Shape shape;
        if (sig.batched) shape.push_back(w.batch_size);
        shape.insert(shape.end(), it->dims.begin(), it->dims.end());
        // Checked before the tensor is made: dims [4294967296] must not allocate 16 GiB.
        ASYNCINFER_ASSIGN_OR_RETURN(std::size_t b, warmup_bytes(*it, shape, dir));
        bytes = b > std::numeric_limits<std::size_t>::max() - bytes
                    ? std::numeric_limits<std::size_t>::max()
                    : bytes + b;
        if (max_bytes != 0 && bytes > max_bytes) {
          return resource_exhausted_error(
              "its inputs take " + std::to_string(bytes) + " bytes or more, over the limit of " +
              std::to_string(max_bytes) + " bytes a request may hold (--max-inflight-bytes)");
        }
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, warmup_tensor(*it, std::move(shape), dir, rng));
        inputs.push_back(std::move(t));
      }
      // Given in the config's dims, as requests are: reshaped for the model as theirs are.
      apply_reshapes(plan.input_reshapes, sig.inputs, /*to_model=*/true, inputs);
      const auto start = std::chrono::steady_clock::now();
      RequestOptions ro;  // a decoupled model's responses are dropped, its final kept
      if (sig.decoupled) ro.on_response = [](const Outputs&, std::stop_token) { return Status(); };
      // The runs share the inputs and go in a window of a few per worker: a count of millions
      // holds no more memory than a few runs do.
      const std::size_t window =
          2 * std::max<std::size_t>(static_cast<std::size_t>(engine.options().workers), 1);
      std::deque<Future<Outputs>> runs;
      auto await_oldest = [&runs]() -> Status {
        Future<Outputs> f = std::move(runs.front());
        runs.pop_front();
        if (!f.wait_for(std::chrono::minutes(5))) {
          return deadline_exceeded_error("a run did not finish within 5 minutes");
        }
        Result<Outputs> r = f.get();
        return r.ok() ? Status() : r.status();
      };
      for (std::uint32_t i = 0; i < w.count; ++i) {
        if (runs.size() >= window) ASYNCINFER_RETURN_IF_ERROR(await_oldest());
        runs.push_back(engine.submit(inputs, ro));
      }
      while (!runs.empty()) ASYNCINFER_RETURN_IF_ERROR(await_oldest());
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      log(head + what + ": " + std::to_string(w.count) + (w.count == 1 ? " run" : " runs") +
          " in " + std::to_string(ms) + " ms");
      return Status();
    }();
    if (!s.ok()) {
      return Status(s.code(), what + " failed: " + std::string(s.message()));
    }
  }
  return Status();
}

}  // namespace

// ---- the snapshot's types -----------------------------------------------------------------------

namespace {
constexpr detail::EnumNames<ModelState, 4> kModelStateNames{
    {"READY", "UNAVAILABLE", "LOADING", "UNLOADING"}, "UNKNOWN"};
constexpr detail::EnumNames<ModelControlMode, 3> kControlModeNames{{"none", "poll", "explicit"},
                                                                   "none"};
}  // namespace

std::string_view to_string(ModelState state) noexcept { return kModelStateNames.name(state); }

std::string_view to_string(ModelControlMode mode) noexcept { return kControlModeNames.name(mode); }

Result<RateLimitResource> parse_rate_limit_resource(std::string_view text) {
  auto refuse = [&] {
    return invalid_argument_error(
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        "'<resource_name>:<count>' (count and device integers >= 0). Got " +
        std::string(text));
  };
  auto number = [](std::string_view t, auto* out) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
    return !t.empty() && ec == std::errc() && end == t.data() + t.size() && *out >= 0;
  };
  const std::size_t first = text.find(':');
  if (first == std::string_view::npos || first == 0) return refuse();
  RateLimitResource r;
  r.name = std::string(text.substr(0, first));
  std::string_view rest = text.substr(first + 1);
  const std::size_t second = rest.find(':');
  std::int64_t count = 0;
  if (!number(rest.substr(0, second), &count) || count > 0xffffffffLL) return refuse();
  r.count = static_cast<std::uint32_t>(count);
  if (second != std::string_view::npos) {
    int device = 0;
    if (!number(rest.substr(second + 1), &device)) return refuse();
    r.device = device;
  }
  return r;
}

std::shared_ptr<detail::ResourcePool> make_rate_limiter(std::vector<RateLimitResource> resources) {
  std::vector<detail::ResourceLimit> limits;
  limits.reserve(resources.size());
  for (RateLimitResource& r : resources) {
    limits.push_back(detail::ResourceLimit{std::move(r.name), r.count, r.device});
  }
  return std::make_shared<detail::ResourcePool>(std::move(limits));
}

Result<ModelControlMode> parse_model_control_mode(std::string_view text) {
  if (auto mode = kControlModeNames.parse(text)) return *mode;
  return invalid_argument_error("--model-control-mode '" + std::string(text) +
                                "': expected none, poll or explicit");
}

ModelRef ServedModel::default_version() const noexcept {
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if ((*it)->ready()) return *it;
  }
  return nullptr;
}

ModelRef ServedModel::find_version(std::int64_t version) const noexcept {
  for (const auto& v : versions) {
    if (v->version == version) return v;
  }
  return nullptr;
}

bool ModelVersion::serving() const {
  return ready() && ((engine && engine->health().ready) || ensemble);
}

std::string ModelVersion::unready_reason() const {
  if (!ready()) return reason;
  if (ensemble) return std::string();
  if (!engine) return "no engine";
  EngineHealth h = engine->health();
  return h.ready ? std::string() : std::move(h.reason);
}

InferenceStats ModelVersion::statistics(InferenceStats s) const {
  const CacheCounters& c = cache_counters;
  s.cache_hit = {c.hits.load(std::memory_order_relaxed), c.hit_ns.load(std::memory_order_relaxed)};
  s.cache_miss = {c.misses.load(std::memory_order_relaxed),
                  c.miss_ns.load(std::memory_order_relaxed)};
  // Triton (InferenceStatsAggregator::UpdateSuccessCacheHit) counts a hit as a success and in
  // the queue statistic too; a hit here never waits in a queue, so it adds to queue's count only.
  s.success.count += s.cache_hit.count;
  s.success.ns += s.cache_hit.ns;
  s.queue.count += s.cache_hit.count;
  return s;
}

bool ServedModel::all_ready() const {
  if (!reason.empty() || versions.empty()) return false;
  return std::all_of(versions.begin(), versions.end(), [](const auto& v) { return v->serving(); });
}

namespace {

/// The models of `name` in `snap` (neighbours: sorted by name first), and how many of them are
/// live(); `one` gets the model a request by name finds, null when none or ambiguous.
std::pair<std::size_t, std::size_t> named(const RepositorySnapshot& snap, std::string_view name,
                                          const ServedModel** one) {
  auto lo = std::lower_bound(snap.models.begin(), snap.models.end(), name,
                             [](const auto& m, std::string_view n) { return m->name < n; });
  std::size_t count = 0;
  std::size_t live = 0;
  const ServedModel* first = nullptr;
  const ServedModel* first_live = nullptr;
  for (auto it = lo; it != snap.models.end() && (*it)->name == name; ++it, ++count) {
    if (first == nullptr) first = it->get();
    if ((*it)->live() && live++ == 0) first_live = it->get();
  }
  *one = count == 1 ? first : (live == 1 ? first_live : nullptr);
  return {count, live};
}

}  // namespace

const ServedModel* RepositorySnapshot::find(std::string_view name) const noexcept {
  const ServedModel* one = nullptr;
  named(*this, name, &one);
  return one;
}

const ServedModel* RepositorySnapshot::find(std::string_view ns,
                                            std::string_view name) const noexcept {
  auto it =
      std::lower_bound(models.begin(), models.end(), std::pair(name, ns),
                       [](const auto& m, const std::pair<std::string_view, std::string_view>& k) {
                         return std::pair<std::string_view, std::string_view>(m->name, m->ns) < k;
                       });
  return it != models.end() && (*it)->name == name && (*it)->ns == ns ? it->get() : nullptr;
}

const ServedModel* RepositorySnapshot::find_from(std::string_view ns,
                                                 std::string_view name) const noexcept {
  const ServedModel* own = find(ns, name);
  return own != nullptr && own->live() ? own : find(name);
}

Status RepositorySnapshot::ambiguity(std::string_view name) const {
  const ServedModel* one = nullptr;
  const auto [count, live] = named(*this, name, &one);
  if (one != nullptr || count < 2) return Status();
  // Triton's words (model_repository_manager.cc, FindModelIdentifier); its qa
  // L0_model_namespacing matches on "ambiguity".
  return invalid_argument_error("There are " + std::to_string(live > 1 ? live : count) +
                                " identifiers of model '" + std::string(name) +
                                "' in global map, model namespace must be provided to resolve "
                                "ambiguity.");
}

std::vector<IndexEntry> RepositorySnapshot::index(bool ready_only) const {
  std::vector<IndexEntry> out;
  for (const auto& m : models) {
    const std::size_t before = out.size();
    for (const ModelRef& v : m->versions) {
      const bool serving = v->serving();
      if (ready_only && !serving) continue;
      IndexEntry e{m->name, v->version_text, serving ? ModelState::ready : ModelState::unavailable,
                   serving ? std::string() : v->unready_reason()};
      if (serving && !m->load_error.empty()) {
        e.reason = "serving the version loaded before; the last load failed: " + m->load_error;
      }
      out.push_back(std::move(e));
    }
    if (ready_only) continue;
    for (std::int64_t v : m->loading) {
      out.push_back({m->name, std::to_string(v), ModelState::loading, ""});
    }
    for (const ModelRef& v : m->unloading) {
      out.push_back({m->name, v->version_text, ModelState::unloading,
                     "unloaded; finishing the requests in flight"});
    }
    for (const std::string& v : m->unloaded) {
      out.push_back({m->name, v, ModelState::unavailable, "unloaded"});
    }
    if (out.size() == before) out.push_back({m->name, "", ModelState::unavailable, m->reason});
  }
  return out;
}

// ---- folders ------------------------------------------------------------------------------------

namespace {

/// The device number the rate limiter keys per-device resources by (Triton's device id): N for
/// "cuda:N", 0 for every other device (cpu, sim: one device each).
int rate_limiter_device(const std::string& spec) {
  constexpr std::string_view kCuda = "cuda:";
  if (spec.compare(0, kCuda.size(), kCuda) != 0) return 0;
  int n = 0;
  const char* first = spec.data() + kCuda.size();
  const auto [end, ec] = std::from_chars(first, spec.data() + spec.size(), n);
  return ec == std::errc() && end == spec.data() + spec.size() ? n : 0;
}

/// Positive integer folder names only (Triton ignores the rest).
bool parse_version(const std::string& name, std::int64_t* out) {
  if (name.empty() || name[0] == '0') return false;
  const char* end = name.data() + name.size();
  auto [p, ec] = std::from_chars(name.data(), end, *out);
  return ec == std::errc() && p == end && *out > 0;
}

Result<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The version folders of a model folder, ascending.
std::vector<std::int64_t> version_folders(const fs::path& dir) {
  std::vector<std::int64_t> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::int64_t v = 0;
    if (e.is_directory(ec) && parse_version(e.path().filename().string(), &v)) out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The names in the first subfolder of `dir` by name, where Triton's core looks for a model file
/// to complete a config's backend fields (plan_model_config's `version_files`); empty without one.
std::vector<std::string> first_version_files(const fs::path& dir) {
  std::error_code ec;
  std::optional<fs::path> first;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory(ec) && (!first || e.path().filename() < first->filename())) first = e.path();
  }
  std::vector<std::string> names;
  if (!first) return names;
  for (const fs::directory_entry& e : fs::directory_iterator(*first, ec)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

/// Every file under `dir`: relative path, size and modification time, sorted. What poll mode
/// compares to see that a version changed (Triton's poll compares modification times too).
std::string folder_fingerprint(const fs::path& dir) {
  std::vector<std::string> lines;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code fe;
    const fs::path rel = fs::relative(it->path(), dir, fe);
    std::string line = rel.string();
    if (it->is_regular_file(fe)) {
      line += ' ' + std::to_string(it->file_size(fe)) + ' ' +
              std::to_string(it->last_write_time(fe).time_since_epoch().count());
    } else {
      line += '/';
    }
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) out += l + '\n';
  return out;
}

/// A model folder's fingerprint: its config.pbtxt's text and every version folder's files.
/// The configuration file a model folder loads with: configs/<config_name>.pbtxt where
/// --model-config-name names one that exists, config.pbtxt otherwise (Triton's rule).
fs::path model_config_file(const fs::path& dir, const std::string& config_name) {
  if (!config_name.empty()) {
    fs::path custom = dir / "configs" / (config_name + ".pbtxt");
    std::error_code ec;
    if (fs::is_regular_file(custom, ec)) return custom;
  }
  return dir / "config.pbtxt";
}

std::string model_fingerprint(const fs::path& dir, const std::string& config_name) {
  std::string out = "config:";
  auto text = read_file(model_config_file(dir, config_name));
  out += text.ok() ? *text : std::string("(none)");
  for (std::int64_t v : version_folders(dir)) {
    out += "\nversion " + std::to_string(v) + ":\n" + folder_fingerprint(dir / std::to_string(v));
  }
  std::error_code ec;
  if (fs::is_directory(dir / "warmup", ec))
    out += "\nwarmup:\n" + folder_fingerprint(dir / "warmup");
  return out;
}

/// The backend parameters that name a host program or folder: python_interpreter (the program a
/// python model's processes run) and OpenVINO's CACHE_DIR (where it writes compiled blobs).
constexpr std::string_view kHostPathParameters[] = {"python_interpreter", "CACHE_DIR"};

/// A load request's config override is a client's text: it may not give a host-path parameter
/// another value than the repository's own config.pbtxt gives (absent there: absent here), or a
/// client who can reach the port could run any program as the server's user. invalid_argument
/// naming the parameter.
Status check_override_host_paths(const ModelPlan& override_plan, const fs::path& dir,
                                 const std::string& name, const std::string& config_name) {
  BackendParameters on_disk;
  const fs::path own_config = model_config_file(dir, config_name);
  if (auto text = read_file(own_config); text.ok()) {
    std::vector<std::string> ignored;
    if (auto plan = plan_model_config(*text, "config.pbtxt", name, &ignored); plan.ok()) {
      on_disk = plan->backend_parameters;
    }
  }
  auto value_in = [](const BackendParameters& ps, std::string_view key) -> const std::string* {
    for (const auto& [k, v] : ps) {
      if (k == key) return &v;
    }
    return nullptr;
  };
  for (std::string_view key : kHostPathParameters) {
    const std::string* asked = value_in(override_plan.backend_parameters, key);
    const std::string* own = value_in(on_disk, key);
    if (asked != nullptr && (own == nullptr || *own != *asked)) {
      return invalid_argument_error(
          "model '" + name + "': the load's config parameter may not set parameters { key: \"" +
          std::string(key) +
          "\" } (a host path) to a value the repository's config.pbtxt does "
          "not give; set it in " +
          own_config.string());
    }
  }
  return Status();
}

bool contains(const std::vector<ModelRef>& list, const ModelRef& v) {
  return std::find(list.begin(), list.end(), v) != list.end();
}

/// The model names the steps of the ensemble in `folder` run; nullopt when its config (as
/// --model-config-name picks it) is not an ensemble's or cannot be read.
std::optional<std::vector<std::string>> ensemble_steps_of(const fs::path& folder,
                                                          const std::string& name,
                                                          const std::string& config_name) {
  auto text = read_file(model_config_file(folder, config_name));
  std::vector<std::string> ignored;
  auto plan = text.ok() ? plan_model_config(*text, "config.pbtxt", name, &ignored)
                        : Result<ModelPlan>(text.status());
  if (!plan.ok() || plan->kind != ModelPlan::Kind::ensemble) return std::nullopt;
  std::vector<std::string> steps;
  for (const EnsembleStep& st : plan->ensemble_steps) steps.push_back(st.model_name);
  return steps;
}

/// Returns how many of `ids`, now in order, are plain models (those first; they do not depend
/// on each other).
std::size_t order_for_loading(const std::map<ModelId, fs::path>& folders, std::vector<ModelId>& ids,
                              const std::string& config_name) {
  // Ensembles after the models they run, and after the ensembles they run (Triton loads an
  // ensemble's steps first): plain models in their order, then ensembles depth first. A step
  // names a model by name: every ensemble of that name (in any namespace) goes first.
  std::map<ModelId, std::vector<std::string>> ensembles;  // id -> its steps' models
  std::vector<ModelId> plain;
  for (const ModelId& id : ids) {
    auto folder = folders.find(id);
    // Not one folder (two repositories hold it, no namespacing): no config.
    auto steps = folder == folders.end() ? std::nullopt
                                         : ensemble_steps_of(folder->second, id.name, config_name);
    if (steps) {
      ensembles[id] = std::move(*steps);
    } else {
      plain.push_back(id);
    }
  }
  std::vector<ModelId> ordered = plain;
  std::set<ModelId> placed;
  std::set<ModelId> visiting;  // a cycle is left for the load to refuse
  std::function<void(const ModelId&)> place = [&](const ModelId& id) {
    if (placed.contains(id) || visiting.contains(id)) return;
    visiting.insert(id);
    for (const std::string& step : ensembles[id]) {
      for (auto it = ensembles.lower_bound(ModelId{step, ""});
           it != ensembles.end() && it->first.name == step; ++it) {
        place(it->first);
      }
    }
    visiting.erase(id);
    placed.insert(id);
    ordered.push_back(id);
  };
  std::vector<ModelId> ensemble_ids;
  for (const auto& [id, steps] : ensembles) ensemble_ids.push_back(id);
  for (const ModelId& id : ensemble_ids) place(id);
  ids = std::move(ordered);
  return plain.size();
}

}  // namespace

// ---- a load's model files -----------------------------------------------------------------------

Result<std::shared_ptr<const OverrideFolder>> OverrideFolder::make(
    const std::string& model, const std::vector<std::pair<std::string, std::string>>& files) {
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  if (ec) return internal_error("no folder for temporary files: " + ec.message());
  std::string pattern = (tmp / "asyncinfer-override-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    return internal_error("cannot make a folder in " + tmp.string() + ": " + std::strerror(errno));
  }
  std::shared_ptr<OverrideFolder> folder(new OverrideFolder());
  folder->root_ = pattern;  // removed by the destructor from here on, whatever fails below
  folder->model_dir_ = folder->root_ / model;
  if (!fs::create_directory(folder->model_dir_, ec)) {
    return internal_error("cannot make " + folder->model_dir_.string() + ": " + ec.message());
  }
  for (const auto& [path, contents] : files) {
    const std::string what = "file parameter 'file:" + path + "'";
    const fs::path rel = fs::path(path).lexically_normal();
    // As Triton's: the file stays inside the model's folder, whatever its path says.
    if (path.empty() || rel.is_absolute() || rel.empty() || *rel.begin() == ".." || rel == "." ||
        !rel.has_filename()) {
      return invalid_argument_error(what +
                                    ": the path must name a file inside the model's "
                                    "folder (e.g. \"file:1/model.py\")");
    }
    const fs::path target = folder->model_dir_ / rel;
    fs::create_directories(target.parent_path(), ec);
    if (ec || !fs::is_directory(target.parent_path())) {
      return internal_error(what + ": cannot make its folder" +
                            (ec ? ": " + ec.message() : " (a file of the load has its name)"));
    }
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    if (!out) return internal_error(what + ": cannot write it: " + std::strerror(errno));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.close();
    if (!out) return internal_error(what + ": cannot write it: " + std::strerror(errno));
  }
  return std::shared_ptr<const OverrideFolder>(std::move(folder));
}

OverrideFolder::~OverrideFolder() {
  std::error_code ec;
  if (!root_.empty()) fs::remove_all(root_, ec);
}

// ---- the control thread -------------------------------------------------------------------------

/// The control threads (RepositoryOptions::load_threads): they run the control calls, poll
/// mode's scans, and the destruction of versions whose last reference went
/// (ModelRepository::make_version). Calls of different models run at once; those of one model
/// (its key) one at a time, in the order they were posted; a scan runs alone.
class ModelRepository::Control {
 public:
  /// `run` is false when the repository stops before the job ran (answer unavailable).
  using Job = std::function<void(bool run)>;

  /// Starts `threads` threads (at least 1); poll mode scans every `poll` (0: never).
  void start(ModelRepository* repo, std::chrono::milliseconds poll, int threads) {
    std::lock_guard lock(mu_);
    next_poll_ = Clock::now() + poll;
    for (int i = 0; i < std::max(1, threads); ++i) {
      threads_.emplace_back([this, repo, poll] { loop(repo, poll); });
    }
  }

  /// Runs `job` on a control thread once every job of `key` posted before it has ended; once
  /// the jobs have stopped (stop_jobs), at once with run = false.
  void post(std::string key, Job job) {
    {
      std::lock_guard lock(mu_);
      if (accepting_) {
        jobs_.push_back({std::move(key), std::move(job)});
        cv_.notify_all();
        return;
      }
    }
    job(false);
  }

  /// Destroys `v` on a control thread (never on one of its engine's threads, where ~Engine
  /// would wait for itself); inline once the threads have stopped.
  void reap(ModelVersion* v) {
    {
      std::lock_guard lock(mu_);
      if (!threads_.empty() && !stopped_) {
        dead_.push_back(v);
        cv_.notify_all();
        return;
      }
    }
    delete v;
  }

  /// No job runs from now on: those queued get run = false (here), scans stop, and this
  /// returns once the jobs running (if any) have ended. The threads go on destroying versions.
  void stop_jobs() {
    std::deque<Queued> jobs;
    {
      std::unique_lock lock(mu_);
      accepting_ = false;
      jobs.swap(jobs_);
    }
    for (Queued& j : jobs) j.job(false);
    std::unique_lock lock(mu_);
    cv_.notify_all();
    cv_.wait(lock, [this] { return busy_ == 0; });
  }

  /// stop_jobs(), then joins the threads; versions queued for destruction are destroyed.
  void stop() {
    stop_jobs();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
      cv_.notify_all();
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    std::deque<ModelVersion*> dead;
    {
      std::lock_guard lock(mu_);
      dead.swap(dead_);
    }
    for (ModelVersion* v : dead) delete v;
  }

 private:
  struct Queued {
    std::string key;
    Job job;
  };

  /// The first queued job whose key has no job running or queued before it (under mu_); none
  /// while a scan runs.
  std::deque<Queued>::iterator next_job_locked() {
    if (polling_) return jobs_.end();
    std::vector<const std::string*> ahead;
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      const bool blocked = running_.count(it->key) > 0 ||
                           std::any_of(ahead.begin(), ahead.end(),
                                       [&](const std::string* k) { return *k == it->key; });
      if (!blocked) return it;
      ahead.push_back(&it->key);
    }
    return jobs_.end();
  }

  void loop(ModelRepository* repo, std::chrono::milliseconds poll) {
    std::unique_lock lock(mu_);
    for (;;) {
      if (!dead_.empty()) {
        std::deque<ModelVersion*> dead;
        dead.swap(dead_);
        lock.unlock();
        for (ModelVersion* v : dead) delete v;
        lock.lock();
        continue;
      }
      if (stopped_) return;
      if (auto it = next_job_locked(); it != jobs_.end()) {
        Queued job = std::move(*it);
        jobs_.erase(it);
        ++busy_;
        running_.insert(job.key);
        lock.unlock();
        job.job(true);
        lock.lock();
        running_.erase(running_.find(job.key));
        --busy_;
        cv_.notify_all();
        continue;
      }
      if (poll.count() <= 0 || !accepting_ || polling_) {
        cv_.wait(lock);
        continue;
      }
      // A scan runs alone: when it is due and no job runs or waits.
      if (cv_.wait_until(lock, next_poll_) == std::cv_status::timeout && jobs_.empty() &&
          dead_.empty() && !stopped_ && accepting_ && busy_ == 0 && !polling_ &&
          Clock::now() >= next_poll_) {
        polling_ = true;
        ++busy_;
        lock.unlock();
        repo->poll();
        lock.lock();
        polling_ = false;
        --busy_;
        cv_.notify_all();
        next_poll_ = Clock::now() + poll;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> jobs_;
  std::multiset<std::string> running_;  ///< the keys of the jobs running
  std::deque<ModelVersion*> dead_;
  Clock::time_point next_poll_;
  bool accepting_ = true;  ///< jobs are taken (false after stop_jobs)
  int busy_ = 0;           ///< jobs and scans running
  bool polling_ = false;   ///< a scan runs (no job starts meanwhile)
  bool stopped_ = false;   ///< the threads are to end
  std::vector<std::thread> threads_;
};

// ---- snapshots, epochs and publishing -----------------------------------------------------------

ModelRepository::~ModelRepository() {
  shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
  if (control_) control_->stop();
  std::lock_guard lock(snapshot_mu_);
  snapshot_.reset();
}

std::shared_ptr<const RepositorySnapshot> ModelRepository::snapshot() const {
  std::lock_guard lock(snapshot_mu_);
  return snapshot_;
}

std::shared_ptr<const ServedModel> ModelRepository::current(const ModelId& id) const {
  auto snap = snapshot();
  for (const auto& m : snap->models) {
    if (m->name == id.name && m->ns == id.ns) return m;
  }
  return nullptr;
}

// The observers run after snapshot_mu_ is let go: they read the readiness, which takes it.
void ModelRepository::publish(std::shared_ptr<const ServedModel> model) {
  {
    std::lock_guard lock(snapshot_mu_);
    publish_locked(std::move(model));
  }
  observers_->notify();
}

bool ModelRepository::publish_if(std::shared_ptr<const ServedModel> model, std::uint64_t epoch) {
  {
    std::lock_guard lock(snapshot_mu_);
    if (epoch_locked(model->id()) != epoch) return false;
    publish_locked(std::move(model));
  }
  observers_->notify();
  return true;
}

bool ModelRepository::replace_if(const std::shared_ptr<const ServedModel>& expected,
                                 std::shared_ptr<const ServedModel> model) {
  {
    std::lock_guard lock(snapshot_mu_);
    const ServedModel* now = snapshot_->find(model->ns, model->name);
    if (now != expected.get()) return false;
    publish_locked(std::move(model));
  }
  observers_->notify();
  return true;
}

std::uint64_t ModelRepository::epoch_of(const ModelId& id) const {
  std::lock_guard lock(snapshot_mu_);
  return epoch_locked(id);
}

std::uint64_t ModelRepository::epoch_locked(const ModelId& id) const {
  auto it = epochs_.find(id);
  return it == epochs_.end() ? 0 : it->second;
}

void ModelRepository::publish_locked(std::shared_ptr<const ServedModel> model) {
  auto next = std::make_shared<RepositorySnapshot>(*snapshot_);
  const ModelId id = model->id();
  auto it = std::lower_bound(next->models.begin(), next->models.end(), id,
                             [](const auto& m, const ModelId& k) { return m->id() < k; });
  if (it != next->models.end() && (*it)->id() == id) {
    *it = std::move(model);
  } else {
    next->models.insert(it, std::move(model));
  }
  snapshot_ = std::move(next);
}

std::shared_ptr<ModelVersion> ModelRepository::make_version() {
  auto v = std::shared_ptr<ModelVersion>(new ModelVersion(),
                                         [c = control_](ModelVersion* p) { c->reap(p); });
  v->generation = next_generation_.fetch_add(1, std::memory_order_relaxed);
  return v;
}

Result<std::shared_ptr<Device>> ModelRepository::open_device_once(const std::string& spec) {
  std::lock_guard lock(devices_mu_);
  auto it = devices_.find(spec);
  if (it != devices_.end()) return it->second;
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Device> d, open_device(spec));
  devices_.emplace(spec, d);
  return d;
}

// ---- loading ------------------------------------------------------------------------------------

Result<std::unique_ptr<ModelRepository>> ModelRepository::load(const fs::path& root, const Log& log,
                                                               RepositoryOptions options) {
  return load(std::vector<fs::path>{root}, log, std::move(options));
}

std::map<std::string, std::vector<fs::path>> ModelRepository::list_models() const {
  std::map<std::string, std::vector<fs::path>> found;
  for (const fs::path& root : roots_) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      if (e.is_directory() && e.path().filename().string()[0] != '.') {
        found[e.path().filename().string()].push_back(e.path());
      }
    }
    if (ec) log_("cannot list model repository '" + root.string() + "': " + ec.message());
  }
  return found;
}

std::vector<ModelId> ModelRepository::list_ids(std::map<ModelId, fs::path>* folders) const {
  std::vector<ModelId> ids;
  for (auto& [name, found] : list_models()) {
    if (!options_.model_namespacing) {
      ids.push_back({name, ""});
      if (found.size() == 1) folders->emplace(ids.back(), found[0]);
      continue;
    }
    for (const fs::path& folder : found) {
      ids.push_back({name, folder.parent_path().string()});
      folders->emplace(ids.back(), folder);
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());  // a repository given twice
  return ids;
}

Result<fs::path> ModelRepository::folder_of(const ModelId& id) const {
  const std::string& name = id.name;
  std::vector<fs::path> found;
  std::error_code ec;
  if (!id.ns.empty()) {
    const fs::path folder = fs::path(id.ns) / name;
    if (fs::is_directory(folder, ec)) return folder;
    return not_found_error("the repository has no folder " + folder.string());
  }
  for (const fs::path& root : roots_) {
    if (fs::is_directory(root / name, ec)) found.push_back(root / name);
  }
  if (found.size() == 1) return found[0];
  if (found.empty()) {
    std::string where;
    for (const fs::path& root : roots_) {
      where += (where.empty() ? "" : ", ") + (root / name).string();
    }
    return not_found_error("the repository has no folder " + where);
  }
  std::string where;
  for (const fs::path& f : found) where += (where.empty() ? "" : ", ") + f.string();
  // Triton's reason (MODEL_READY_REASON_DUPLICATE), then where.
  return unavailable_error("model appears in two or more repositories (" + where + ")");
}

Result<std::unique_ptr<ModelRepository>> ModelRepository::load(const std::vector<fs::path>& roots,
                                                               const Log& log,
                                                               RepositoryOptions options) {
  std::error_code ec;
  if (roots.empty()) return invalid_argument_error("no model repository given");
  for (const fs::path& root : roots) {
    if (!fs::is_directory(root, ec)) {
      return not_found_error("model repository '" + root.string() + "' is not a folder");
    }
  }
  std::unique_ptr<ModelRepository> repo(new ModelRepository());
  repo->host_link_ = std::make_shared<detail::ModelHostLink>();
  repo->custom_metrics_ = std::make_shared<CustomMetrics>();
  repo->host_link_->bind_metrics(repo->custom_metrics_);
  repo->roots_ = roots;
  repo->options_ = std::move(options);
  repo->log_ = log;
  repo->snapshot_ = std::make_shared<RepositorySnapshot>();
  repo->control_ = std::make_shared<Control>();
  for (const fs::path& root : roots) {
    fs::directory_iterator listing(root, ec);
    if (ec) {
      return not_found_error("cannot list model repository '" + root.string() +
                             "': " + ec.message());
    }
  }
  std::map<ModelId, fs::path> folders;  // the models one folder holds
  std::vector<ModelId> ids = repo->list_ids(&folders);
  std::set<std::string> names;
  for (const ModelId& id : ids) names.insert(id.name);
  if (names.empty()) {
    for (const fs::path& root : roots) {
      log("model repository '" + root.string() + "' holds no model folders");
    }
  }

  const RepositoryOptions& o = repo->options_;
  const bool all =
      o.control_mode != ModelControlMode::explicit_mode ||
      std::find(o.load_models.begin(), o.load_models.end(), "*") != o.load_models.end();
  for (const std::string& n : o.load_models) {
    if (n != "*" && !names.contains(n)) {
      return not_found_error("--load-model '" + n + "': " +
                             std::string(repo->folder_of(ModelId{n, ""}).status().message()));
    }
  }
  const std::size_t plain = order_for_loading(folders, ids, o.model_config_name);
  // A signal during start-up (RepositoryOptions::start_stop) cuts the loads short.
  std::stop_callback on_start_stop(repo->options_.start_stop,
                                   [r = repo.get()] { r->cancel_loads(); });
  auto load_one = [&](const ModelId& id) {
    const std::string& name = id.name;
    const bool wanted =
        all || std::find(o.load_models.begin(), o.load_models.end(), name) != o.load_models.end();
    if (!wanted) {
      auto m = std::make_shared<ServedModel>();
      m->name = name;
      m->ns = id.ns;
      m->requested = false;
      m->reason = "not loaded (--model-control-mode explicit: POST /v2/repository/models/" + name +
                  "/load loads it)";
      repo->publish(std::move(m));
      return;
    }
    std::vector<ModelRef> replaced;
    Status status;
    if (auto m = repo->build(id, nullptr, LoadParameters{}, 0, &replaced, &status)) {
      repo->publish(std::move(m));
    }
  };
  // The plain models load_threads at a time (they do not depend on each other), then the
  // ensembles in order, each after the models it runs.
  {
    std::atomic<std::size_t> next{0};
    auto loader = [&] {
      for (std::size_t i = next++; i < plain; i = next++) load_one(ids[i]);
    };
    const std::size_t extra =
        std::min<std::size_t>(static_cast<std::size_t>(std::max(1, o.load_threads)), plain);
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < extra; ++i) threads.emplace_back(loader);
    loader();
    for (std::thread& t : threads) t.join();
  }
  for (std::size_t i = plain; i < ids.size(); ++i) load_one(ids[i]);
  repo->control_->start(
      repo.get(),
      o.control_mode == ModelControlMode::poll ? o.poll_interval : std::chrono::milliseconds(0),
      o.control_mode == ModelControlMode::poll ? 1 : o.load_threads);
  if (o.control_mode != ModelControlMode::none) {
    log("model control: " + std::string(to_string(o.control_mode)) +
        (o.control_mode == ModelControlMode::poll
             ? " (the repository is scanned every " + std::to_string(o.poll_interval.count()) +
                   " ms)"
             : std::string(" (POST /v2/repository/models/NAME/load and /unload)")));
  }
  return repo;
}

namespace {

// The forms whose backends complete a config (RepositoryForm::completes_config: python's).
std::vector<detail::RepositoryForm> completing_forms() {
  std::vector<detail::RepositoryForm> forms = detail::ModelBackendRegistry::instance().forms();
  std::erase_if(forms, [](const detail::RepositoryForm& f) { return !f.completes_config; });
  return forms;
}

// The completing form whose default file a version folder of `dir` holds (a model without a
// config: model.py is a python model, Triton's rule); null when none.
std::optional<detail::RepositoryForm> form_of_files(const fs::path& dir) {
  std::error_code ec;
  for (const detail::RepositoryForm& f : completing_forms()) {
    for (const std::int64_t v : version_folders(dir)) {
      if (fs::exists(dir / std::to_string(v) / f.default_model_filename, ec)) return f;
    }
  }
  return std::nullopt;
}

// Triton's auto-complete (RepositoryOptions::auto_complete_config) for a model whose backend
// completes configs: the model file of its newest version folder completes the config
// (complete_model_config; python: model.py's auto_complete_config), which is planned again; the
// plan as it was when the file adds nothing.
Result<ModelPlan> auto_complete(ModelPlan plan, const fs::path& dir, const std::string& name) {
  std::error_code ec;
  fs::path file;
  const std::vector<std::int64_t> versions = version_folders(dir);  // ascending
  for (auto v = versions.rbegin(); v != versions.rend() && file.empty(); ++v) {
    const fs::path candidate = dir / std::to_string(*v) / plan.model_filename;
    if (fs::exists(candidate, ec)) file = candidate;
  }
  if (file.empty()) return plan;  // the load says which file is missing
  ASYNCINFER_ASSIGN_OR_RETURN(std::string given, given_model_config_json(plan));
  ModelOptions mo;
  mo.backend_parameters = plan.backend_parameters;
  ASYNCINFER_ASSIGN_OR_RETURN(
      std::string completed,
      complete_model_config(plan.form.kind + ":" + file.string(), given, mo));
  if (completed == given) return plan;
  std::vector<std::string> ignored;  // the given config's warnings were logged already
  return plan_model_config_json(completed, "the config auto_complete_config returned", name,
                                &ignored);
}

}  // namespace

std::shared_ptr<const ServedModel> ModelRepository::build(
    const ModelId& id, const std::shared_ptr<const ServedModel>& old, const LoadParameters& params,
    std::uint64_t epoch, std::vector<ModelRef>* replaced, Status* status) {
  const std::string& name = id.name;
  const Log& log = log_;
  const std::optional<std::string>& config_json = params.config;
  // Files in the load make the model's folder (Triton's model file override).
  std::shared_ptr<const OverrideFolder> override_folder;
  if (!params.files.empty()) {
    auto made = config_json ? OverrideFolder::make(name, params.files)
                            : invalid_argument_error(
                                  "a load with files needs the 'config' "
                                  "parameter too (Triton's model file "
                                  "override)");
    if (!made.ok()) {
      // Triton's code and words (its simple_grpc_model_control.py matches on them), then why.
      *status = internal_error("failed to poll from model repository: " +
                               std::string(made.status().message()));
      log("model '" + name + "': " + std::string(status->message()));
      return nullptr;
    }
    override_folder = std::move(*made);
  }
  // The model's folder: the files of this load, else its folder in the repositories.
  fs::path dir;
  if (override_folder) {
    dir = override_folder->model_dir();
  } else if (auto folder = folder_of(id); folder.ok()) {
    dir = *folder;
  } else if (folder.status().code() == StatusCode::unavailable) {
    // Two repositories hold it: Triton loads neither (its log says "not unique across all model
    // repositories"), and the index shows why.
    log("model '" + name + "': not loaded: not unique across all model repositories: " +
        std::string(folder.status().message()));
    auto dup = std::make_shared<ServedModel>();
    dup->name = name;
    dup->ns = id.ns;
    dup->requested = false;
    dup->reason = "model appears in two or more repositories";
    if (old) replaced->insert(replaced->end(), old->versions.begin(), old->versions.end());
    *status = folder.status();
    return dup;
  } else {
    dir = (id.ns.empty() ? roots_.front() : fs::path(id.ns)) / name;  // not_found below names it
  }
  auto served = std::make_shared<ServedModel>();
  served->name = name;
  served->ns = id.ns;
  std::error_code ec;
  served->fingerprint = model_fingerprint(dir, options_.model_config_name);
  const bool serving_before =
      old != nullptr && std::any_of(old->versions.begin(), old->versions.end(),
                                    [](const ModelRef& v) { return v->serving(); });
  // A failure of the whole model: the versions serving before (if any) go on serving.
  auto fail = [&](const Status& s) -> std::shared_ptr<const ServedModel> {
    *status = s;
    const std::string why(s.message());
    if (serving_before) {
      auto keep = std::make_shared<ServedModel>(*old);
      keep->load_error = why;
      keep->fingerprint = served->fingerprint;  // poll mode retries it only once it changes
      keep->requested = true;
      log("model '" + name + "': load failed, the versions loaded before go on serving: " + why);
      return keep;
    }
    if (old) replaced->insert(replaced->end(), old->versions.begin(), old->versions.end());
    served->reason = why;
    log("model '" + name + "': UNAVAILABLE: " + why);
    return served;
  };

  if (!fs::is_directory(dir, ec)) {
    const Status s = internal_error("the repository has no folder " + dir.string());
    if (!old) {  // nothing to show in the index
      *status = s;
      log("model '" + name + "': " + std::string(s.message()));
      return nullptr;
    }
    return fail(s);
  }
  const fs::path config_path = model_config_file(dir, options_.model_config_name);
  std::vector<std::string> warnings;
  Result<ModelPlan> plan = invalid_argument_error("unset");
  std::string text;
  if (config_json) {
    text = "json:" + *config_json;
    plan = plan_model_config_json(*config_json, "the load's config parameter", name, &warnings,
                                  first_version_files(dir));
    if (plan.ok()) {
      if (Status s = check_override_host_paths(*plan, dir, name, options_.model_config_name);
          !s.ok()) {
        plan = s;
      }
    }
  } else if (auto t = read_file(config_path); !t.ok()) {
    if (auto form = options_.auto_complete_config ? form_of_files(dir) : std::nullopt) {
      // Triton's rule: a folder without a config whose version holds model.py is a python
      // model, completed by its auto_complete_config (below).
      plan = plan_model_config("backend: \"" + form->name + "\"",
                               "(no config.pbtxt: a " + form->metadata_platform + " model)", name,
                               &warnings);
    } else {
      std::string files;
      for (const detail::RepositoryForm& f : completing_forms()) {
        files += (files.empty() ? "<version>/" : " or <version>/") + f.default_model_filename;
      }
      plan = not_found_error("no config.pbtxt in " + dir.string() +
                             (!options_.auto_complete_config
                                  ? " (auto-complete is off: --disable-auto-complete-config)"
                              : files.empty() ? ""
                                              : " (and no " + files + " to complete one from)"));
    }
  } else {
    text = std::move(*t);
    plan = plan_model_config(text, config_path.string(), name, &warnings, first_version_files(dir));
    if (config_path.filename() != "config.pbtxt") {
      log("model '" + name + "': configuration " + config_path.string() + " (--model-config-name)");
    }
  }
  if (plan.ok() && plan->form.completes_config) {
    if (options_.auto_complete_config) plan = auto_complete(std::move(*plan), dir, name);
    if (plan.ok() && (plan->inputs.empty() || plan->outputs.empty())) {
      plan = invalid_argument_error("model '" + name + "': a " + plan->platform +
                                    " model needs input and output lists (name, data_type, "
                                    "dims), in its config or completed from its " +
                                    plan->model_filename +
                                    (options_.auto_complete_config
                                         ? " (model.py: by its auto_complete_config)"
                                         : " (auto-complete is off: "
                                           "--disable-auto-complete-config)"));
    }
  }
  for (const std::string& w : warnings) log("model '" + name + "': warning: " + w);
  if (!plan.ok()) return fail(plan.status());
  served->platform = plan->platform;
  served->config_text = text;

  const std::vector<std::int64_t> selected = plan->versions.select(version_folders(dir));
  if (plan->versions.kind == VersionPolicy::Kind::specific) {
    for (std::int64_t v : plan->versions.versions) {
      if (std::find(selected.begin(), selected.end(), v) == selected.end()) {
        log("model '" + name + "': warning: version_policy names version " + std::to_string(v) +
            ", which has no folder");
      }
    }
  }
  if (selected.empty()) {
    return fail(not_found_error("no version folder (a positive integer, e.g. " +
                                (dir / "1").string() + ") that version_policy selects"));
  }
  // The versions that load with none serving in their place show LOADING meanwhile.
  {
    auto loading = old ? std::make_shared<ServedModel>(*old) : std::make_shared<ServedModel>();
    loading->name = name;
    loading->ns = id.ns;
    loading->loading.clear();
    for (std::int64_t v : selected) {
      ModelRef prev = old ? old->find_version(v) : nullptr;
      if (!prev || !prev->serving()) loading->loading.push_back(v);
    }
    if (!loading->loading.empty()) publish_if(std::move(loading), epoch);
  }

  std::string errors;
  StatusCode first_failure = StatusCode::ok;
  for (std::int64_t v : selected) {
    const std::string vtext = std::to_string(v);
    const std::string fp = folder_fingerprint(dir / vtext);
    ModelRef prev = old ? old->find_version(v) : nullptr;
    const bool prev_serving = prev && prev->serving();
    if (prev_serving && !config_json && !override_folder && old->config_text == text &&
        prev->fingerprint == fp) {
      served->versions.push_back(prev);  // unchanged: it goes on serving as it is
      continue;
    }
    if (stopping_.load()) {
      *status = unavailable_error("the server is shutting down");
      return served;
    }
    std::shared_ptr<ModelVersion> mv = make_version();
    mv->fingerprint = fp;
    mv->override_folder = override_folder;
    mv->model_namespace = id.ns;
    const StatusCode code = load_version(*mv, *plan, dir, v, epoch);
    if (!mv->ready() && first_failure == StatusCode::ok) first_failure = code;
    if (!mv->ready() && prev_serving) {
      errors += (errors.empty() ? "" : "; ") + ("version " + vtext + ": " + mv->reason);
      log("model '" + name + "' version " + vtext +
          ": the new load failed; the version loaded before goes on serving");
      served->versions.push_back(prev);
      continue;
    }
    if (!mv->ready())
      errors += (errors.empty() ? "" : "; ") + ("version " + vtext + ": " + mv->reason);
    served->versions.push_back(std::move(mv));
    if (prev) replaced->push_back(prev);
  }
  if (old) {
    for (const ModelRef& ov : old->versions) {
      if (!contains(served->versions, ov) && !contains(*replaced, ov)) replaced->push_back(ov);
    }
  }
  served->load_error = errors;
  *status = errors.empty() ? Status() : Status(first_failure, "model '" + name + "': " + errors);
  return served;
}

StatusCode ModelRepository::load_version(ModelVersion& version, const ModelPlan& plan_ref,
                                         const fs::path& dir, std::int64_t v, std::uint64_t epoch) {
  const Log& log = log_;
  const ModelPlan* plan = &plan_ref;
  ModelVersion* mv = &version;
  const std::string& name = mv->model_name = dir.filename().string();
  mv->version = v;
  mv->version_text = std::to_string(v);
  mv->platform = plan->platform;
  mv->takes_request_context = plan->form.takes_model_config;
  mv->max_batch_size = plan->max_batch_size;
  const fs::path vdir = dir / mv->version_text;
  const ModelId id{name, mv->model_namespace};
  const std::string head = "model '" + id.str() + "' version " + mv->version_text + ": ";
  std::error_code ec;
  auto open = [this](const std::string& spec) { return open_device_once(spec); };
  // Its deadline, and what an unload or shutdown cancels it through.
  TimerId deadline;
  const std::shared_ptr<LoadTicket> ticket = start_load(id, epoch, &deadline);
  const std::stop_token stop = ticket->stop.get_token();
  Status s = [&]() -> Status {
    for (const auto& [output, file] : plan->label_files) {
      ASYNCINFER_ASSIGN_OR_RETURN(mv->class_labels[output],
                                  read_class_labels((dir / file).string()));
    }
    if (plan->kind == ModelPlan::Kind::ensemble) return load_ensemble(*mv, *plan);
    if (options_.max_instances != 0 &&
        static_cast<std::size_t>(plan->engine.workers) > options_.max_instances) {
      return resource_exhausted_error(
          "config.pbtxt: instance_group asks for " + std::to_string(plan->engine.workers) +
          " instances, over the limit of " + std::to_string(options_.max_instances) +
          " a model may have on this machine (--max-model-instances)");
    }
    Result<std::shared_ptr<Model>> model = internal_error("unset");
    if (plan->kind == ModelPlan::Kind::builtin) {
      ModelOptions mo;
      if (plan->builtin_takes_config_tensors) {
        mo.inputs = plan->model_inputs();
        mo.outputs = plan->model_outputs();
        mo.batched = plan->max_batch_size > 0;
        mo.batch_limit = plan->batch_limit();
      }
      model = asyncinfer::load_model(plan->builtin_uri, mo);
    } else {
      const fs::path file = vdir / plan->model_filename;
      if (!fs::exists(file, ec)) return not_found_error("no model file " + file.string());
      ModelOptions mo;
      // The model's own tensors (as it sees them: reshaped), then those sequence batching fills
      // and keeps.
      mo.inputs = plan->model_inputs();
      mo.inputs.insert(mo.inputs.end(), plan->sequence_inputs.begin(), plan->sequence_inputs.end());
      mo.outputs = plan->model_outputs();
      mo.outputs.insert(mo.outputs.end(), plan->sequence_outputs.begin(),
                        plan->sequence_outputs.end());
      mo.batch_limit = plan->batch_limit();
      // What the model's backend takes from the server (its RepositoryForm).
      const detail::RepositoryForm& form = plan->form;
      // Triton's rule: max_batch_size > 0 says dim 0 is the batch dim, whatever the file.
      if (form.batched_from_config) mo.batched = plan->max_batch_size > 0;
      if (form.takes_backend_parameters) mo.backend_parameters = plan->backend_parameters;
      if (form.takes_model_config) {
        // The configuration as /config shows it (python: model.py's args["model_config"]).
        ModelSignature sig;
        sig.inputs = mo.inputs;
        sig.outputs = mo.outputs;
        sig.batched = plan->max_batch_size > 0;
        sig.batch_limit = plan->batch_limit();
        sig.decoupled = plan->decoupled;
        ASYNCINFER_ASSIGN_OR_RETURN(AppliedConfig shown, applied_model_config(*plan, sig, "cpu"));
        mo.batched = sig.batched;
        mo.model_config_json = std::move(shown.json);
        mo.host = host_link_;
      }
      model = asyncinfer::load_model(form.kind + ":" + file.string(), mo);
    }
    if (!model.ok()) return model.status();
    ASYNCINFER_RETURN_IF_ERROR(check_signature(*plan, (*model)->signature()));
    mv->signature = (*model)->signature();
    // Clients send and get a reshaped tensor in its config's dims (Triton's reshape).
    mv->input_reshapes = plan->input_reshapes;
    mv->output_reshapes = plan->output_reshapes;
    for (std::size_t i = 0; i < plan->input_reshapes.size(); ++i) {
      if (plan->input_reshapes[i]) mv->signature.inputs[i].shape = plan->inputs[i].shape;
    }
    for (std::size_t i = 0; i < plan->output_reshapes.size(); ++i) {
      if (plan->output_reshapes[i]) mv->signature.outputs[i].shape = plan->outputs[i].shape;
    }
    std::optional<SequenceBatchingOptions> sequences = plan->engine.sequence_batching;
    if (sequences) {
      // Clients send and receive the model's tensors without those sequence batching fills and
      // keeps (they come last: ModelPlan::sequence_inputs).
      mv->signature.inputs.resize(plan->inputs.size());
      mv->signature.outputs.resize(plan->outputs.size());
      ASYNCINFER_RETURN_IF_ERROR(read_initial_states(*plan, dir, *sequences));
    }

    std::vector<std::string> devices;
    if (plan->device_auto) {
      devices = {"cuda:0", "cpu"};  // Triton's KIND_AUTO: a GPU where there is one
    } else {
      devices = {plan->device};
    }
    Status last;
    for (const std::string& spec : devices) {
      auto device = open(spec);
      if (!device.ok()) {
        last = device.status();
        continue;
      }
      // The server's readiness follows the engine's (ModelVersion::serving): its health
      // changes are pushed to the observers (on_change), not polled.
      EngineOptions eo = plan->engine;
      eo.sequence_batching = sequences;
      eo.on_health_change = [observers = observers_] { observers->notify(); };
      eo.create_stop = stop;  // a Python instance's initialize() is cut short
      if (options_.rate_limiter != nullptr && !plan->rate_limits.empty()) {
        // Its instances join the server's rate limiter on this device (refused with Triton's
        // message when the resources cannot serve them); they leave it with the engine.
        std::vector<detail::InstanceNeeds> needs;
        needs.reserve(plan->rate_limits.size());
        for (const InstanceRateLimit& l : plan->rate_limits) {
          detail::InstanceNeeds& n = needs.emplace_back();
          n.priority = l.priority;
          for (const InstanceRateLimit::Resource& r : l.resources) {
            n.resources.push_back(detail::ResourceNeed{r.name, r.count, r.global});
          }
        }
        auto gate =
            options_.rate_limiter->add_model(name, rate_limiter_device(spec), std::move(needs));
        if (!gate.ok()) return gate.status();
        eo.execution_gate = std::move(*gate);
      }
      auto engine = Engine::create(*model, *device, std::move(eo));
      if (!engine.ok()) {
        last = engine.status();
        if (stop.stop_requested()) break;  // cancelled: no other device is tried
        continue;
      }
      // While it loads (its warm-up may be long), shutdown() and an unload can cancel it, and so
      // can its deadline.
      LoadingEngine loading(*this, id, engine->get(), epoch);
      Engine* e = engine->get();
      std::stop_callback on_deadline(
          stop, [e] { e->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0)); });
      // Triton: a version turns ready only after its warm-up ran; a failed one leaves it
      // UNAVAILABLE with the reason (and its engine is shut down here).
      ASYNCINFER_RETURN_IF_ERROR(
          run_warmup(**engine, *plan, mv->signature, dir, log, head, options_.max_warmup_bytes));
      // The workers the engine started (0 in the plan: the model's own preference, openvino).
      ModelPlan started = *plan;
      started.engine.workers = (*engine)->options().workers;
      ASYNCINFER_ASSIGN_OR_RETURN(AppliedConfig applied,
                                  applied_model_config(started, mv->signature, (*device)->name()));
      mv->config_json = std::move(applied.json);
      mv->config_binary = std::move(applied.binary);
      mv->response_cache = plan->response_cache;
      mv->engine = std::move(*engine);
      mv->device = (*device)->name();
      return Status();
    }
    return last;
  }();
  end_load(ticket, deadline);
  if (ticket->timed_out.load()) {
    const auto secs = std::chrono::duration<double>(options_.load_timeout).count();
    std::ostringstream text;
    text << "the load took longer than --model-load-timeout (" << secs << " s) and was cancelled";
    if (!s.ok()) text << ": " << s.message();
    s = deadline_exceeded_error(text.str());
    mv->engine.reset();
    mv->ensemble.reset();
  }
  if (s.ok() && mv->ensemble) {
    mv->state = ModelState::ready;
    log(head + "READY (ensemble of " + std::to_string(mv->ensemble->steps.size()) + " steps)");
  } else if (s.ok()) {
    mv->state = ModelState::ready;
    ModelPlan shown = *plan;
    shown.device = mv->device;
    shown.device_auto = false;
    shown.engine.workers = mv->engine->options().workers;
    log(head + "READY (" + shown.summary() + ")");
  } else {
    mv->reason = std::string(s.message());
    log(head + "UNAVAILABLE: " + mv->reason);
  }
  return s.code();
}

Status ModelRepository::load_ensemble(ModelVersion& mv, const ModelPlan& plan) {
  // The step models as they are served now; a request finds them again when it runs, so a
  // step model reloaded later serves the ensemble's requests in its new version.
  // The ensemble a step runs, in the version it names as served now; null for a step that
  // runs a plain model (or one not served).
  // A step's model: that of the ensemble's namespace first (find_from), held with its snapshot.
  auto step_model = [this, &mv](const std::string& name) -> std::shared_ptr<const ServedModel> {
    std::shared_ptr<const RepositorySnapshot> snap = snapshot();
    const ServedModel* m = snap->find_from(mv.model_namespace, name);
    return m != nullptr ? std::shared_ptr<const ServedModel>(snap, m) : nullptr;
  };
  auto step_ensemble = [&step_model](const EnsembleGraph::Step& st) -> ModelRef {
    std::shared_ptr<const ServedModel> m = step_model(st.model);
    if (!m) return nullptr;
    ModelRef v =
        st.version.empty() ? m->default_version() : m->find_version(std::stoll(st.version));
    return v && v->ensemble ? v : nullptr;
  };
  // Whether ensemble `v` runs `name`, through its steps and theirs (a cycle of ensembles would
  // recurse for ever at request time).
  auto leads_to = [&step_ensemble](const ModelVersion& v, const std::string& name) {
    std::vector<const EnsembleGraph*> pending{v.ensemble.get()};
    std::vector<ModelRef> held;  // what pending points into
    for (std::size_t seen = 0; !pending.empty() && seen < 1024; ++seen) {
      const EnsembleGraph* e = pending.back();
      pending.pop_back();
      for (const EnsembleGraph::Step& st : e->steps) {
        if (st.model == name) return true;
        if (ModelRef next = step_ensemble(st)) {
          pending.push_back(next->ensemble.get());
          held.push_back(std::move(next));
        }
      }
    }
    return false;
  };
  auto signature_of = [&, this](const EnsembleStep& s) -> Result<ModelSignature> {
    std::shared_ptr<const ServedModel> m = step_model(s.model_name);
    if (!m) {
      if (Status ambiguous = snapshot()->ambiguity(s.model_name); !ambiguous.ok()) {
        return ambiguous;
      }
      return not_found_error("the repository has no model '" + s.model_name + "'");
    }
    ModelRef v = s.model_version > 0 ? m->find_version(s.model_version) : m->default_version();
    if (v && v->ready() && v->ensemble && leads_to(*v, plan.name)) {
      return invalid_argument_error("ensemble '" + s.model_name + "' runs '" + plan.name +
                                    "' in turn: ensembles may not form a cycle");
    }
    if (!v || !v->ready()) {
      const std::string which = s.model_version > 0
                                    ? "version " + std::to_string(s.model_version) + " is not"
                                    : "no version is";
      std::string why = m->reason;
      for (const ModelRef& failed : m->versions) {
        if (!failed->ready() && !failed->reason.empty()) why = failed->reason;
      }
      return unavailable_error("model '" + s.model_name + "': " + which +
                               " loaded and ready (the ensemble loads after its steps" +
                               (why.empty() ? std::string() : "; " + why) + ")");
    }
    return v->signature;
  };
  ASYNCINFER_ASSIGN_OR_RETURN(mv.ensemble, resolve_ensemble(plan, signature_of));
  // How many ensembles a request of this one runs through in a chain, this one included; past
  // the limit every request would fail, so the load does (the recursion stops there too).
  std::function<int(const EnsembleGraph&, int)> nesting = [&](const EnsembleGraph& g, int level) {
    int deepest = level;
    for (const EnsembleGraph::Step& st : g.steps) {
      if (deepest > kMaxEnsembleNesting) break;
      if (ModelRef next = step_ensemble(st)) {
        deepest = std::max(deepest, nesting(*next->ensemble, level + 1));
      }
    }
    return deepest;
  };
  if (const int n = nesting(*mv.ensemble, 1); n > kMaxEnsembleNesting) {
    return invalid_argument_error(
        "ensemble '" + plan.name + "' nests " + (n > kMaxEnsembleNesting + 1 ? "more than " : "") +
        std::to_string(n - 1) + " ensembles below it; a chain of ensembles may be at most " +
        std::to_string(kMaxEnsembleNesting) + " deep");
  }
  mv.ensemble_counters = std::make_shared<EnsembleCounters>();
  mv.signature.inputs = plan.inputs;
  mv.signature.outputs = plan.outputs;
  mv.signature.batched = plan.max_batch_size > 0;
  mv.signature.batch_limit = plan.batch_limit();
  ASYNCINFER_ASSIGN_OR_RETURN(AppliedConfig applied,
                              applied_model_config(plan, mv.signature, "ensemble"));
  mv.config_json = std::move(applied.json);
  mv.config_binary = std::move(applied.binary);
  mv.device = "ensemble";
  return Status();
}

// ---- model control ------------------------------------------------------------------------------

void ModelRepository::reload(const ModelId& id, const LoadParameters& params, std::uint64_t epoch,
                             const Done& done) {
  const std::string name = id.str();
  if (stopping_.load()) {
    if (done) done(unavailable_error("the server is shutting down"));
    return;
  }
  std::shared_ptr<const ServedModel> old = current(id);
  std::vector<ModelRef> replaced;
  Status status;
  std::shared_ptr<const ServedModel> next = build(id, old, params, epoch, &replaced, &status);
  if (!next) {
    if (done) done(status);
    return;
  }
  if (stopping_.load()) {
    if (done) done(unavailable_error("the server is shutting down"));
    return;
  }
  // Published only if no unload came after this load was asked for (then what it built is
  // dropped: its engines stop when their last reference goes).
  if (!publish_if(std::move(next), epoch)) {
    log_("model '" + name + "': unloaded while it loaded; the load is dropped");
    if (done) done(unavailable_error("model '" + name + "' was unloaded while it loaded"));
    return;
  }
  // Published first: a request that found a replaced version before the swap and submits after
  // it sees it retired (or refused by its draining engine) and goes to its successor.
  for (const ModelRef& r : replaced) r->retired.store(true);
  if (done) done(status);
  // What a replaced version accepted finishes on it, however long that takes (the requests'
  // own deadlines bound it; shutdown() cancels it).
  if (!replaced.empty()) drain_async(replaced, std::chrono::milliseconds::max(), nullptr);
}

void ModelRepository::unload(const ModelId& id, const Done& done) {
  const std::string name = id.str();
  std::shared_ptr<const ServedModel> unloading;
  std::vector<ModelRef> versions;
  {
    // At once, beside a load of the same model that may be running (its epoch changes, so that
    // load does not publish).
    std::lock_guard lock(snapshot_mu_);
    ++epochs_[id];
    const ServedModel* old = snapshot_->find(id.ns, id.name);
    if (old == nullptr) {
      std::error_code ec;
      auto folder = folder_of(id);
      Status s = folder.ok() || folder.status().code() != StatusCode::not_found
                     ? Status()
                     : not_found_error("unknown model '" + name +
                                       "': " + std::string(folder.status().message()));
      if (done) done(s);
      return;
    }
    auto u = std::make_shared<ServedModel>();
    u->name = id.name;
    u->ns = id.ns;
    u->platform = old->platform;
    u->requested = false;
    u->reason = "unloaded";
    u->fingerprint = old->fingerprint;
    u->unloaded = old->unloaded;
    for (const ModelRef& v : old->versions) {
      if (v->engine) u->unloading.push_back(v);
    }
    u->unloading.insert(u->unloading.end(), old->unloading.begin(), old->unloading.end());
    versions = u->unloading;
    unloading = u;
    publish_locked(std::move(u));
  }
  observers_->notify();  // the model no longer counts for readiness
  for (const ModelRef& v : versions) v->retired.store(true);
  {
    // A load of it that is running is dropped (its epoch changed): its warm-up is cut short.
    std::lock_guard lock(draining_mu_);
    for (const auto& [model, e] : loading_) {
      if (model == id) e->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    }
    // Before its engine exists (a Python instance's initialize() runs): its stop token.
    for (const auto& t : loads_) {
      if (t->model == id) t->stop.request_stop();
    }
  }
  if (done) done(Status());
  if (versions.empty()) return;
  log_("model '" + name + "': UNLOADING (the requests in flight finish; at most " +
       std::to_string(options_.drain_timeout.count()) + " ms)");
  drain_async(versions, options_.drain_timeout, [this, unloading, versions, name] {
    auto gone = std::make_shared<ServedModel>(*unloading);
    gone->unloading.clear();
    for (const ModelRef& v : versions) {
      if (std::find(gone->unloaded.begin(), gone->unloaded.end(), v->version_text) ==
          gone->unloaded.end()) {
        gone->unloaded.push_back(v->version_text);
      }
    }
    // Unless a load has put it back meanwhile.
    if (replace_if(unloading, std::move(gone))) log_("model '" + name + "': unloaded");
  });
}

Status check_model_config_name(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 200 ||
      name.find_first_of(std::string_view("/\\ \t\n\0", 6)) != std::string_view::npos) {
    return invalid_argument_error("--model-config-name '" + std::string(name.substr(0, 200)) +
                                  "' must name a file configs/<name>.pbtxt of a model's folder "
                                  "(one path component, no space)");
  }
  return Status();
}

Status check_model_name(std::string_view name) {
  if (name.size() > 255) {  // NAME_MAX: no folder has a longer name
    return invalid_argument_error("model name of " + std::to_string(name.size()) +
                                  " bytes is not a model folder's name (at most 255 bytes)");
  }
  const bool bad = name.empty() || name == "." || name == ".." || name[0] == '.' ||
                   name.find_first_of(std::string_view("/\\\0", 3)) != std::string_view::npos;
  if (!bad) return Status();
  std::string shown;
  for (char c : name.substr(0, 200)) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  return invalid_argument_error("model name '" + shown +
                                "' is not a model folder's name (one path component: no '/', "
                                "'\\' or NUL, not starting with '.')");
}

namespace {

Status refused_outside_explicit(ModelControlMode mode) {
  return unavailable_error(
      "explicit model load / unload is not allowed: the server runs with --model-control-mode " +
      std::string(to_string(mode)) + " (start it with explicit)");
}

}  // namespace

void ModelRepository::load_model(std::string name, LoadParameters params, Done done) {
  if (options_.control_mode != ModelControlMode::explicit_mode) {
    return done(refused_outside_explicit(options_.control_mode));
  }
  if (Status s = check_model_name(name); !s.ok()) return done(s);
  // A failed load answers in Triton's words, "failed to load 'NAME'" first (Triton's example
  // clients simple_{http,grpc}_model_control.py match on them).
  Done answer = [name, done = std::move(done)](const Status& s) {
    if (s.ok()) return done(s);
    done(Status(s.code(), "failed to load '" + name + "': " + std::string(s.message())));
  };
  if (options_.model_namespacing) {
    // Every namespace's model of the name, and the models its ensembles' steps name: one such
    // load at a time (the key "" is no model's name), as they may share step models.
    std::map<ModelId, std::uint64_t> epochs;  // an unload after this call wins over it
    {
      std::lock_guard lock(snapshot_mu_);
      for (auto it = epochs_.lower_bound(ModelId{name, ""});
           it != epochs_.end() && it->first.name == name; ++it) {
        epochs.insert(*it);
      }
    }
    control_->post("", [this, name = std::move(name), params = std::move(params),
                        epochs = std::move(epochs), done = std::move(answer)](bool run) {
      if (!run) return done(unavailable_error("the server is shutting down"));
      std::set<std::string> visiting;
      load_everywhere(name, params, epochs, visiting, done);
    });
    return;
  }
  const ModelId id{name, ""};
  const std::uint64_t epoch = epoch_of(id);  // an unload after this call wins over it
  std::string key = name;
  control_->post(std::move(key), [this, name = std::move(name), params = std::move(params), epoch,
                                  done = std::move(answer)](bool run) {
    if (!run) return done(unavailable_error("the server is shutting down"));
    reload(ModelId{name, ""}, params, epoch, done);
  });
}

void ModelRepository::load_everywhere(const std::string& name, const LoadParameters& params,
                                      const std::map<ModelId, std::uint64_t>& epochs,
                                      std::set<std::string>& visiting, const Done& done) {
  std::map<ModelId, fs::path> folders;
  std::vector<ModelId> ids;
  for (const ModelId& id : list_ids(&folders)) {
    if (id.name == name) ids.push_back(id);
  }
  // Files in the load make the folder: of the first namespace that holds the name, else of the
  // first repository. No folder: the first repository's (build says that there is none).
  if (ids.empty() || !params.files.empty()) {
    ids.resize(1);
    // (The namespace as list_ids makes it: the parent of the repository's folder of `name`.)
    ids[0] = {name, ids[0].ns.empty() ? (roots_.front() / name).parent_path().string() : ids[0].ns};
  }
  visiting.insert(name);
  // Triton's cascade: an ensemble's steps are polled by name (in every namespace) and loaded
  // before it; a step model already serving and unchanged stays as it is (build keeps it).
  for (const ModelId& id : ids) {
    auto folder = folders.find(id);
    if (folder == folders.end() || !params.files.empty()) continue;
    for (const std::string& step :
         ensemble_steps_of(folder->second, name, options_.model_config_name)
             .value_or(std::vector<std::string>{})) {
      if (visiting.contains(step)) continue;  // a cycle: the ensemble's load refuses it
      std::map<ModelId, std::uint64_t> now;
      {
        std::lock_guard lock(snapshot_mu_);
        for (auto it = epochs_.lower_bound(ModelId{step, ""});
             it != epochs_.end() && it->first.name == step; ++it) {
          now.insert(*it);
        }
      }
      load_everywhere(step, LoadParameters{}, now, visiting, [](const Status&) {});
    }
  }
  Status first;
  for (const ModelId& id : ids) {
    auto epoch = epochs.find(id);
    reload(id, params, epoch == epochs.end() ? 0 : epoch->second, [&first](const Status& s) {
      if (first.ok()) first = s;
    });
  }
  visiting.erase(name);
  done(first);
}

void ModelRepository::unload_model(std::string name, Done done) {
  if (options_.control_mode != ModelControlMode::explicit_mode) {
    return done(refused_outside_explicit(options_.control_mode));
  }
  if (Status s = check_model_name(name); !s.ok()) return done(s);
  if (stopping_.load()) return done(unavailable_error("the server is shutting down"));
  if (!options_.model_namespacing) return unload(ModelId{name, ""}, done);
  // Every namespace's model of the name (Triton unloads by name).
  std::vector<ModelId> ids;
  for (const auto& m : snapshot()->models) {
    if (m->name == name) ids.push_back(m->id());
  }
  if (ids.empty()) return unload(ModelId{name, ""}, done);  // not_found when no folder has it
  Status first;
  for (const ModelId& id : ids) {
    unload(id, [&first](const Status& s) {
      if (first.ok()) first = s;
    });
  }
  done(first);
}

void ModelRepository::poll() {
  if (stopping_.load()) return;
  std::map<ModelId, fs::path> folders;  // the models one folder holds
  const std::vector<ModelId> ids = list_ids(&folders);
  std::vector<ModelId> in_order = ids;
  order_for_loading(folders, in_order, options_.model_config_name);
  bool changed = false;
  for (const ModelId& id : in_order) {
    const std::string name = id.str();
    std::shared_ptr<const ServedModel> m = current(id);
    auto folder = folders.find(id);
    if (folder == folders.end()) {  // two repositories hold it: Triton unloads it
      if (!m || m->requested || m->reason != "model appears in two or more repositories") {
        log_("poll: model '" + name + "' is in two or more repositories: it is not served");
        reload(id, LoadParameters{}, epoch_of(id), nullptr);
        changed = true;
      }
      continue;
    }
    // (Not requested: unloaded when its folder went; back now.)
    if (!m || !m->requested ||
        m->fingerprint != model_fingerprint(folder->second, options_.model_config_name)) {
      log_("poll: model '" + name + "' " + (m ? "changed" : "is new") + ": loading it");
      reload(id, LoadParameters{}, epoch_of(id), nullptr);
      changed = true;
    } else if (changed && m->platform == "ensemble" && !m->all_ready()) {
      // An ensemble that failed to load, perhaps for want of a step model that this scan loaded.
      log_("poll: ensemble '" + name + "' is not ready and models changed: loading it again");
      reload(id, LoadParameters{}, epoch_of(id), nullptr);
    }
  }
  auto snap = snapshot();
  for (const auto& m : snap->models) {
    if (!std::binary_search(ids.begin(), ids.end(), m->id()) && m->requested) {
      log_("poll: model '" + m->id().str() + "' was removed: unloading it");
      unload(m->id(), nullptr);
    }
  }
}

// ---- draining and shutdown ----------------------------------------------------------------------

void ModelRepository::drain_async(std::vector<ModelRef> versions, std::chrono::milliseconds timeout,
                                  std::function<void()> then) {
  std::lock_guard lock(draining_mu_);
  // Join the drains that have ended (each marks itself done).
  for (auto it = drains_.begin(); it != drains_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = drains_.erase(it);
    } else {
      ++it;
    }
  }
  draining_.insert(draining_.end(), versions.begin(), versions.end());
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, versions = std::move(versions), timeout, then = std::move(then), done] {
    std::vector<std::thread> threads;
    for (const ModelRef& v : versions) {
      if (Engine* e = v->engine.get()) {
        threads.emplace_back([e, timeout] { e->shutdown(ShutdownMode::drain, timeout); });
      }
    }
    for (std::thread& th : threads) th.join();
    if (then) then();
    {
      std::lock_guard held(draining_mu_);
      for (const ModelRef& v : versions) {
        auto it = std::find(draining_.begin(), draining_.end(), v);
        if (it != draining_.end()) draining_.erase(it);
      }
      done->store(true);  // under the lock: shutdown() waits for it on drains_cv_
    }
    drains_cv_.notify_all();
  });
  drains_.push_back({std::move(t), std::move(done)});
}

ModelRepository::LoadingEngine::LoadingEngine(ModelRepository& repo, const ModelId& model,
                                              Engine* engine, std::uint64_t epoch)
    : repo_(repo), engine_(engine) {
  {
    std::lock_guard lock(repo_.draining_mu_);
    repo_.loading_.emplace_back(model, engine_);
  }
  // An unload (or shutdown) that came after the load began but before this registration found
  // nothing to cancel: cancel here. One that comes later finds the registration (it bumps the
  // epoch, or sets stopping_, before it looks).
  if (repo_.stopping_.load() || repo_.epoch_of(model) != epoch) {
    engine_->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
  }
}

ModelRepository::LoadingEngine::~LoadingEngine() {
  std::lock_guard lock(repo_.draining_mu_);
  auto it = std::find_if(repo_.loading_.begin(), repo_.loading_.end(),
                         [this](const auto& l) { return l.second == engine_; });
  repo_.loading_.erase(it);
}

std::shared_ptr<ModelRepository::LoadTicket> ModelRepository::start_load(const ModelId& model,
                                                                         std::uint64_t epoch,
                                                                         TimerId* deadline) {
  auto ticket = std::make_shared<LoadTicket>();
  ticket->model = model;
  {
    std::lock_guard lock(draining_mu_);
    loads_.push_back(ticket);
  }
  // As LoadingEngine: an unload or shutdown that came before the registration found nothing.
  if (stopping_.load() || epoch_of(model) != epoch) ticket->stop.request_stop();
  if (options_.load_timeout != std::chrono::milliseconds::max()) {
    *deadline = load_timer_.add(Clock::now() + options_.load_timeout, [ticket] {
      ticket->timed_out.store(true);
      ticket->stop.request_stop();
    });
  }
  return ticket;
}

void ModelRepository::end_load(const std::shared_ptr<LoadTicket>& ticket, TimerId deadline) {
  if (deadline) load_timer_.cancel(deadline);
  std::lock_guard lock(draining_mu_);
  auto it = std::find(loads_.begin(), loads_.end(), ticket);
  if (it != loads_.end()) loads_.erase(it);
}

void ModelRepository::cancel_loads() {
  stopping_.store(true);
  std::lock_guard lock(draining_mu_);
  for (const auto& t : loads_) t->stop.request_stop();
  for (const auto& [model, e] : loading_) {
    e->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
  }
}

void ModelRepository::shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout) {
  const auto deadline = Clock::now() + drain_timeout;
  // Loads serve no one: cancelled first, so that a hanging one (a model.py's initialize()) ends
  // while the serving engines drain.
  cancel_loads();
  // The versions that serve (and those unloading) get `mode` within `drain_timeout`.
  auto engines_down = [&] {
    std::vector<ModelRef> all;
    if (auto snap = snapshot()) {
      for (const auto& m : snap->models) {
        all.insert(all.end(), m->versions.begin(), m->versions.end());
        all.insert(all.end(), m->unloading.begin(), m->unloading.end());
      }
    }
    std::vector<std::thread> threads;
    for (const ModelRef& v : all) {
      if (Engine* e = v->engine.get()) {
        threads.emplace_back([e, mode, drain_timeout] { e->shutdown(mode, drain_timeout); });
      }
    }
    for (std::thread& t : threads) t.join();
  };
  // Replaced versions drain on threads of their own with no timeout: they get what is left of
  // `drain_timeout` (none with cancel), then are cancelled. Engines still loading serve no one:
  // cancelled at once, under the lock that their LoadingEngine guard takes before they can be
  // destroyed.
  auto retired_down = [&] {
    std::vector<ModelRef> left;
    {
      std::unique_lock lock(draining_mu_);
      for (const auto& [model, e] : loading_) {
        e->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
      }
      for (const auto& t : loads_) t->stop.request_stop();
      if (mode == ShutdownMode::drain) {
        drains_cv_.wait_until(lock, deadline, [this] {
          return std::all_of(drains_.begin(), drains_.end(),
                             [](const Drain& d) { return d.done->load(); });
        });
      }
      left = draining_;
    }
    for (const ModelRef& v : left) {
      if (Engine* e = v->engine.get())
        e->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    }
  };
  // The engines first (that cuts short a drain the control thread waits for), then the control
  // calls: queued ones are answered unavailable, the running one is waited for, so that no
  // answer reaches a frontend after its shutdown; then what that call may have published.
  engines_down();
  retired_down();
  if (control_) control_->stop_jobs();
  engines_down();
  retired_down();
  // The drains end now that their engines are shut down.
  std::vector<Drain> drains;
  {
    std::lock_guard lock(draining_mu_);
    drains.swap(drains_);
  }
  for (Drain& d : drains) d.thread.join();
}

}  // namespace asyncinfer::server
