#include "model_repository.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "model_config.hpp"

namespace asyncinfer::server {
namespace fs = std::filesystem;

namespace {

/// One warm-up input's tensor: zeros, random values (finite, |x| < 1 for the float types), or
/// the bytes of <model>/warmup/<file>, which must be exactly the tensor's size.
Result<Tensor> warmup_tensor(const WarmupSample::Input& in, Shape shape, const fs::path& dir,
                             std::mt19937_64& rng) {
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
Status run_warmup(Engine& engine, const ModelPlan& plan, const ModelSignature& sig,
                  const fs::path& dir, const std::function<void(const std::string&)>& log,
                  const std::string& head) {
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
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, warmup_tensor(*it, std::move(shape), dir, rng));
        inputs.push_back(std::move(t));
      }
      const auto start = std::chrono::steady_clock::now();
      std::vector<Future<Outputs>> runs;
      for (std::uint32_t i = 0; i < w.count; ++i) runs.push_back(engine.submit(inputs));
      for (Future<Outputs>& f : runs) {
        if (!f.wait_for(std::chrono::minutes(5))) {
          return deadline_exceeded_error("a run did not finish within 5 minutes");
        }
        Result<Outputs> r = f.get();
        if (!r.ok()) return r.status();
      }
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

std::string_view to_string(ModelState state) noexcept {
  return state == ModelState::ready ? "READY" : "UNAVAILABLE";
}

const ModelVersion* ServedModel::default_version() const noexcept {
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if ((*it)->ready()) return it->get();
  }
  return nullptr;
}

const ModelVersion* ServedModel::find_version(std::int64_t version) const noexcept {
  for (const auto& v : versions) {
    if (v->version == version) return v.get();
  }
  return nullptr;
}

bool ModelVersion::serving() const { return ready() && engine && engine->health().ready; }

std::string ModelVersion::unready_reason() const {
  if (!ready()) return reason;
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

}  // namespace

ModelRepository::~ModelRepository() {
  shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
}

const ServedModel* ModelRepository::find(std::string_view name) const noexcept {
  auto it = std::lower_bound(models_.begin(), models_.end(), name,
                             [](const auto& m, std::string_view n) { return m->name < n; });
  return it != models_.end() && (*it)->name == name ? it->get() : nullptr;
}

Result<std::unique_ptr<ModelRepository>> ModelRepository::load(const fs::path& root,
                                                               const Log& log) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return not_found_error("model repository '" + root.string() + "' is not a folder");
  }
  std::unique_ptr<ModelRepository> repo(new ModelRepository());
  repo->root_ = root;
  std::vector<fs::path> dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory() && e.path().filename().string()[0] != '.') dirs.push_back(e.path());
  }
  if (ec)
    return not_found_error("cannot list model repository '" + root.string() + "': " + ec.message());
  std::sort(dirs.begin(), dirs.end());
  if (dirs.empty()) log("model repository '" + root.string() + "' holds no model folders");

  auto open = [&](const std::string& spec) -> Result<std::shared_ptr<Device>> {
    auto it = repo->devices_.find(spec);
    if (it != repo->devices_.end()) return it->second;
    ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Device> d, open_device(spec));
    repo->devices_.emplace(spec, d);
    return d;
  };

  for (const fs::path& dir : dirs) {
    auto served = std::make_unique<ServedModel>();
    served->name = dir.filename().string();
    const std::string& name = served->name;
    auto fail_model = [&](const Status& s) {
      served->reason = std::string(s.message());
      log("model '" + name + "': UNAVAILABLE: " + served->reason);
    };

    const fs::path config_path = dir / "config.pbtxt";
    std::vector<std::string> warnings;
    Result<ModelPlan> plan = invalid_argument_error("unset");
    auto text = read_file(config_path);
    if (!text.ok()) {
      plan = not_found_error("no config.pbtxt in " + dir.string() +
                             " (asyncinfer needs one: it does not guess a model's config)");
    } else {
      plan = plan_model_config(*text, config_path.string(), name, &warnings);
    }
    for (const std::string& w : warnings) log("model '" + name + "': warning: " + w);
    if (!plan.ok()) {
      fail_model(plan.status());
      repo->models_.push_back(std::move(served));
      continue;
    }
    served->platform = plan->platform;

    std::vector<std::int64_t> available;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      std::int64_t v = 0;
      if (e.is_directory() && parse_version(e.path().filename().string(), &v))
        available.push_back(v);
    }
    const std::vector<std::int64_t> selected = plan->versions.select(available);
    if (plan->versions.kind == VersionPolicy::Kind::specific) {
      for (std::int64_t v : plan->versions.versions) {
        if (std::find(selected.begin(), selected.end(), v) == selected.end()) {
          log("model '" + name + "': warning: version_policy names version " + std::to_string(v) +
              ", which has no folder");
        }
      }
    }
    if (selected.empty()) {
      fail_model(not_found_error("no version folder (a positive integer, e.g. " +
                                 (dir / "1").string() + ") that version_policy selects"));
      repo->models_.push_back(std::move(served));
      continue;
    }

    for (std::int64_t v : selected) {
      auto mv = std::make_unique<ModelVersion>();
      mv->model_name = name;
      mv->version = v;
      mv->version_text = std::to_string(v);
      mv->platform = plan->platform;
      mv->max_batch_size = plan->max_batch_size;
      const fs::path vdir = dir / mv->version_text;
      const std::string head = "model '" + name + "' version " + mv->version_text + ": ";

      Status s = [&]() -> Status {
        Result<std::shared_ptr<Model>> model = internal_error("unset");
        if (plan->backend == ModelPlan::Backend::builtin) {
          model = load_model(plan->builtin_uri);
        } else {
          const fs::path file = vdir / plan->model_filename;
          if (!fs::exists(file, ec)) return not_found_error("no model file " + file.string());
          ModelOptions mo;
          mo.inputs = plan->inputs;
          mo.outputs = plan->outputs;
          mo.max_batch_size = plan->max_batch_size > 0 ? plan->max_batch_size : -1;
          model = load_model(file.string(), mo);
        }
        if (!model.ok()) return model.status();
        ASYNCINFER_RETURN_IF_ERROR(check_signature(*plan, (*model)->signature()));
        mv->signature = (*model)->signature();

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
          auto engine = Engine::create(*model, *device, plan->engine);
          if (!engine.ok()) {
            last = engine.status();
            continue;
          }
          // Triton: a version turns ready only after its warm-up ran; a failed one leaves it
          // UNAVAILABLE with the reason (and its engine is shut down here).
          ASYNCINFER_RETURN_IF_ERROR(run_warmup(**engine, *plan, mv->signature, dir, log, head));
          ASYNCINFER_ASSIGN_OR_RETURN(
              AppliedConfig applied, applied_model_config(*plan, mv->signature, (*device)->name()));
          mv->config_json = std::move(applied.json);
          mv->config_binary = std::move(applied.binary);
          mv->response_cache = plan->response_cache;
          mv->engine = std::move(*engine);
          mv->device = (*device)->name();
          return Status();
        }
        return last;
      }();
      if (s.ok()) {
        mv->state = ModelState::ready;
        ModelPlan shown = *plan;
        shown.device = mv->device;
        shown.device_auto = false;
        log(head + "READY (" + shown.summary() + ")");
      } else {
        mv->reason = std::string(s.message());
        log(head + "UNAVAILABLE: " + mv->reason);
      }
      served->versions.push_back(std::move(mv));
    }
    repo->models_.push_back(std::move(served));
  }
  return repo;
}

void ModelRepository::shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout) {
  std::vector<std::thread> threads;
  for (const auto& m : models_) {
    for (const auto& v : m->versions) {
      if (Engine* e = v->engine.get()) {
        threads.emplace_back([e, mode, drain_timeout] { e->shutdown(mode, drain_timeout); });
      }
    }
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace asyncinfer::server
