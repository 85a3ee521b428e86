// model_repository.hpp — the models of a Triton-layout repository, each version with its own
// engine.
//
// Layout (Triton's docs/user_guide/model_repository.md):
//   <root>/<model>/config.pbtxt
//   <root>/<model>/<version>/model.pt      (pytorch_libtorch; default_model_filename renames it)
//   <root>/<model>/<version>/              (backend "builtin": the folder only, no file)
// Versions are the folders whose names are positive integers; version_policy chooses which are
// served (Triton's default: the highest one only). The highest ready version is the default.
//
// Design: the served set is an immutable RepositorySnapshot behind a shared_ptr; a change (Triton's
// model control: a load, an unload, a poll that found changed files) builds the next snapshot on
// one of the repository's control threads and swaps it in (publishing one model replaces only its
// entry, under snapshot_mu_, so loads of different models run at once), so lookups take no lock
// but the swap's.
// A request holds its ModelVersion by ModelRef (shared_ptr) from lookup to response: a version
// replaced or unloaded meanwhile stays whole until its last request ends. A reload loads the new
// versions beside the serving ones, swaps only once they are ready, and then drains the old ones
// (Engine::shutdown(drain)); a version that fails to load leaves the one it was to replace
// serving, with the reason in the index (ServedModel::load_error) and the log. A version whose
// last reference goes is destroyed on a control thread, never on one of its engine's threads.
// A model whose config is bad, or a version whose file or engine fails, is kept with state
// UNAVAILABLE and the reason, and logged; the others serve. Devices are opened once per spec and
// shared by the engines on them.
//
// Thread safety: every member may be called from any thread. Loads run on the control threads
// (RepositoryOptions::load_threads): those of different models at once, those of one model one
// at a time in the order they were asked for; poll mode's scans run alone. An unload takes effect
// at once, on the caller's thread, and cuts a load of the same model short. Every load has a
// deadline (RepositoryOptions::load_timeout); a load past it, unloaded or shut down meanwhile is
// cancelled through one stop token (EngineOptions::create_stop: a Python instance's process is
// killed; a warm-up's engine is shut down).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"
#include "asyncinfer/status.hpp"
#include "ensemble.hpp"
#include "observers.hpp"
#include "response_cache.hpp"

namespace asyncinfer::detail {
class ModelHostLink;  // src/model/model_host.hpp
class ResourcePool;   // src/engine/resource_pool.hpp
}  // namespace asyncinfer::detail

namespace asyncinfer::server {

class CustomMetrics;  // model_host.hpp

struct ModelPlan;

/// Triton's repository index states.
enum class ModelState : std::uint8_t { ready, unavailable, loading, unloading };
/// "READY", "UNAVAILABLE", "LOADING" or "UNLOADING".
std::string_view to_string(ModelState state) noexcept;

/// Triton's --model-control-mode: `none` loads every model at start and never changes the set;
/// `poll` also rescans the repository every --repository-poll-secs and loads, reloads or unloads
/// what changed; `explicit` loads only the --load-model names at start and then what the load
/// and unload calls ask for. The load / unload calls are refused (unavailable) in none and poll.
enum class ModelControlMode : std::uint8_t { none, poll, explicit_mode };
std::string_view to_string(ModelControlMode mode) noexcept;
/// "none", "poll" or "explicit"; invalid_argument naming the three otherwise.
Result<ModelControlMode> parse_model_control_mode(std::string_view text);
/// A model name a load or unload may use: one folder name of the repository (at most 255 bytes,
/// no '/', '\\' or NUL, not "." or "..", not starting with '.'); invalid_argument saying so
/// otherwise.
Status check_model_name(std::string_view name);
/// A --model-config-name: one path component, no space (Triton's rule), not "." or "..".
/// invalid_argument naming it otherwise.
Status check_model_config_name(std::string_view name);

/// A model's identity in the repository: its name and, with --model-namespacing, its namespace
/// (the path of the repository that holds it, Triton's namespace; "" without namespacing).
/// Ordered by name first, so the namespaces of one name are neighbours.
struct ModelId {
  std::string name;
  std::string ns;
  auto operator<=>(const ModelId&) const = default;
  /// "name", or "ns::name" with a namespace (Triton's ModelIdentifier::str).
  std::string str() const { return ns.empty() ? name : ns + "::" + name; }
};

/// Triton's --rate-limit-resource=<name>:<count>[:<device>]: a resource's count on one device,
/// or on every device when none is given (a global resource takes it whatever the device).
struct RateLimitResource {
  std::string name;
  std::uint32_t count = 0;
  std::optional<int> device;
};
/// "<name>:<count>" or "<name>:<count>:<device>" (count and device integers >= 0, the name not
/// empty); invalid_argument quoting Triton's format otherwise.
Result<RateLimitResource> parse_rate_limit_resource(std::string_view text);
/// The server's rate limiter (--rate-limit=execution_count): a pool with these counts, shared by
/// every model of the repository (RepositoryOptions::rate_limiter).
std::shared_ptr<detail::ResourcePool> make_rate_limiter(std::vector<RateLimitResource> resources);

struct RepositoryOptions {
  ModelControlMode control_mode = ModelControlMode::none;
  /// Triton's --model-config-name: a model whose folder has configs/<name>.pbtxt loads with it
  /// instead of its config.pbtxt (custom configurations, e.g. one per machine type). Empty =
  /// config.pbtxt always. Checked by check_model_config_name.
  std::string model_config_name;
  /// Triton's --model-namespacing: each repository is a name space of its own (ModelId::ns), so
  /// that two may hold a model of the same name. A request names a model by its name alone
  /// (RepositorySnapshot::find: the one namespace that serves it, else Triton's ambiguity
  /// error); an ensemble's steps are the models of its own namespace first
  /// (RepositorySnapshot::find_from); a load or unload of a name covers every namespace that
  /// holds it, and explicit mode's load of an ensemble loads its steps' models first (Triton's
  /// cascade). Off: one name space over every repository, a name two hold is served by none.
  bool model_namespacing = false;
  /// explicit mode: the models loaded at start (Triton's --load-model; "*" = every model).
  std::vector<std::string> load_models;
  /// poll mode: the time between two scans (Triton's --repository-poll-secs, default 15 s).
  std::chrono::milliseconds poll_interval{15000};
  /// How long an unloaded version may take to finish the requests it had accepted
  /// (Engine::shutdown(drain)); those left then are cancelled. A replaced version has no limit
  /// but shutdown's.
  std::chrono::milliseconds drain_timeout{30000};
  /// Instances (workers, Python processes) one model version may have, all instance groups
  /// together (--max-model-instances); more is refused at load, naming the field and the
  /// limit. 0 = no limit but the config's own (kMaxInstanceCount).
  std::size_t max_instances = 0;
  /// Bytes the inputs of one warm-up sample may take (the serve command gives
  /// --max-inflight-bytes: a warm-up request is a request); more is refused at load. 0 = no limit.
  std::size_t max_warmup_bytes = 0;
  /// How long one model version's load may take (--model-load-timeout): the model file, every
  /// instance's creation (a Python model's initialize()) and the warm-up. Past it the load is
  /// cancelled (a Python instance's process is killed) and the version is UNAVAILABLE with a
  /// reason naming the timeout. max() = no limit.
  std::chrono::milliseconds load_timeout{600'000};
  /// Loads that run at once (--model-load-thread-count, Triton's flag and default): the models
  /// of the repository at start, and the load calls of explicit mode, each model's own in the
  /// order they came. At least 1.
  int load_threads = 4;
  /// Triton's auto-complete (off: --disable-auto-complete-config): a python model whose model.py
  /// defines auto_complete_config(config) has it called at load, in a process of its own, and
  /// loads with the config it returns (complete_model_config in model.hpp).
  bool auto_complete_config = true;
  /// Cancels the loads at start (ModelRepository::load; a signal during start-up): the loads
  /// running are cut short as shutdown() cuts them, the models not loaded yet are left
  /// UNAVAILABLE ("the server is shutting down"), and load() returns once those running have
  /// ended. Default: never fires.
  std::stop_token start_stop;
  /// Triton's rate limiter (--rate-limit=execution_count; src/engine/resource_pool.hpp): the
  /// server's resources, shared by every model. A version whose instance groups list resources
  /// is added to it at load (refused, the version UNAVAILABLE with Triton's message, when it asks
  /// for more than a given count or mixes global and per-device use of a name) and its engine's
  /// workers pass its gate before each batch. Null (--rate-limit=off, the default): rate_limiter
  /// settings are read and not served.
  std::shared_ptr<detail::ResourcePool> rate_limiter;
};

/// A ModelVersion's `retired`: an atomic flag that a version being made can be moved with (the
/// value is copied), as CacheCounters.
struct RetiredFlag {
  RetiredFlag() = default;
  RetiredFlag(const RetiredFlag& o) noexcept : value(o.load()) {}
  RetiredFlag& operator=(const RetiredFlag&) = delete;
  bool load(std::memory_order order = std::memory_order_seq_cst) const noexcept {
    return value.load(order);
  }
  void store(bool v) noexcept { value.store(v); }
  std::atomic<bool> value{false};
};

/// One served version of a model.
/// A model folder made for one load from the files its request carried (Triton's model file
/// override), in a temporary folder of its own; removed with the last version loaded from it.
class OverrideFolder {
 public:
  /// Writes `files` (path in the model's folder, e.g. "1/model.py" → contents) into a new
  /// temporary folder `<tmp>/asyncinfer-override-XXXXXX/<model>`. invalid_argument for a path
  /// that is empty, absolute, leaves the model's folder, or lies under a name given as a file;
  /// internal when the file system refuses one (a name longer than NAME_MAX), naming the path.
  static Result<std::shared_ptr<const OverrideFolder>> make(
      const std::string& model, const std::vector<std::pair<std::string, std::string>>& files);
  ~OverrideFolder();
  OverrideFolder(const OverrideFolder&) = delete;
  OverrideFolder& operator=(const OverrideFolder&) = delete;
  /// The model's folder (its name is the model's).
  const std::filesystem::path& model_dir() const noexcept { return model_dir_; }

 private:
  OverrideFolder() = default;
  std::filesystem::path root_;  ///< the temporary folder, removed with everything under it
  std::filesystem::path model_dir_;
};

/// What a load request gives beside the model's name, as Triton's load parameters: `config`, a
/// ModelConfig in JSON that replaces the config.pbtxt, and `files` (its `file:<path>` parameters:
/// path in the model's folder → contents), which then make the model's whole folder for this load
/// (they need `config`).
struct LoadParameters {
  std::optional<std::string> config;
  std::vector<std::pair<std::string, std::string>> files;
};

struct ModelVersion {
  std::string model_name;
  std::string model_namespace;  ///< ModelId::ns of its model ("" without namespacing)
  std::int64_t version = 0;
  std::string version_text;  ///< "1"
  ModelState state = ModelState::unavailable;
  std::string reason;    ///< why it is unavailable
  std::string platform;  ///< "pytorch_libtorch", "python", "asyncinfer_builtin", "ensemble", ...
  /// Its backend gets each request's id and parameters with the request (Engine request context):
  /// a backend that takes the model's config (RepositoryForm::takes_model_config, python's).
  bool takes_request_context = false;
  std::string device;  ///< as opened: "cpu", "sim", "cuda:0"
  /// Its config's reshapes (ModelPlan::input_reshapes, output_reshapes): `signature` has the
  /// shapes clients send and get, these the model's; the server views each request's tensors in
  /// the model's shapes and the model's outputs in the clients' (apply_reshapes). Empty: none.
  std::vector<std::optional<Shape>> input_reshapes;
  std::vector<std::optional<Shape>> output_reshapes;
  /// The folder it was loaded from when its load carried files: kept while it lives.
  std::shared_ptr<const OverrideFolder> override_folder;
  /// The loaded model's signature (full shapes; -1 = variable dim, the batch dim first when
  /// batched). Meaningful only when ready.
  ModelSignature signature;
  /// The config's max_batch_size, Triton's field (0 = no batch dim): the largest dim 0 a request
  /// may have. ModelPlan::max_batch_size says more.
  std::int64_t max_batch_size = 0;
  std::unique_ptr<Engine> engine;  ///< null unless ready; null for an ensemble
  /// platform "ensemble": its steps, resolved when it loaded (it has no engine of its own), and
  /// the statistics of its requests.
  std::shared_ptr<const EnsembleGraph> ensemble;
  std::shared_ptr<EnsembleCounters> ensemble_counters;
  /// The configuration it runs with (applied_model_config): Triton's JSON form and the
  /// serialized inference.ModelConfig. Set when ready.
  std::string config_json;
  std::string config_binary;
  /// response_cache { enable: true } in its config: answered from the server's cache, if any.
  bool response_cache = false;
  /// Output name → the lines of its label_filename (classification.hpp), read when it loaded.
  std::map<std::string, std::shared_ptr<const std::vector<std::string>>, std::less<>> class_labels;
  /// Its response-cache hits and misses (InferenceServer::version_stats).
  mutable CacheCounters cache_counters;
  /// Unique to this load of the version (in its response-cache keys).
  std::uint64_t generation = 0;
  /// Its folder's files (names, sizes, modification times): poll mode reloads it when they change.
  std::string fingerprint;
  /// Set once it has been replaced or unloaded: it takes no new request (InferenceServer sends
  /// one that arrives late to the version that replaced it) and drains.
  mutable RetiredFlag retired;

  /// Loaded (the engine was made).
  bool ready() const noexcept { return state == ModelState::ready; }
  /// Loaded and able to serve now: its engine is ready (Engine::health(); a version whose workers
  /// all lost their model instances for good, as on a lost device, is not). What the model
  /// readiness endpoints, the server's readiness and the ready gauge report. Thread-safe.
  bool serving() const;
  /// Why it cannot serve: the load error, or the engine's health reason; "" when serving.
  std::string unready_reason() const;
  /// Triton's statistics of a loaded version: `engine` (its engine's, EngineMetrics::stats) with
  /// the response cache's hits and misses, the hits counted among the successes and the queue's
  /// count as Triton counts them (not as inferences or executions). What GET .../stats, gRPC
  /// ModelStatistics and /metrics report. Thread-safe.
  InferenceStats statistics(InferenceStats engine) const;
  InferenceStats statistics() const {
    return statistics(ensemble ? ensemble_counters->stats() : engine->metrics().stats);
  }
};

/// A request's hold on the version it runs on; keeps it whole until the request ends.
using ModelRef = std::shared_ptr<const ModelVersion>;

/// One line of the repository index (Triton's RepositoryIndex).
struct IndexEntry {
  std::string name;
  std::string version;  ///< "" for a model with no version to show
  ModelState state = ModelState::unavailable;
  std::string reason;
};

/// A model folder of the repository, as one snapshot has it.
struct ServedModel {
  std::string name;
  std::string ns;  ///< ModelId::ns: its repository with --model-namespacing, else ""
  std::string platform;
  /// Why no version serves: the config could not be used, the model is not loaded or was
  /// unloaded. Empty while it loads for the first time.
  std::string reason;
  /// The versions requests go to (loaded or failed), ascending.
  std::vector<ModelRef> versions;
  /// Versions being loaded that have none serving in their place yet (LOADING).
  std::vector<std::int64_t> loading;
  /// Versions unloaded and still finishing their requests (UNLOADING); no new request reaches them.
  std::vector<ModelRef> unloading;
  /// Versions unloaded and gone (UNAVAILABLE, "unloaded").
  std::vector<std::string> unloaded;
  /// The last load's failure when the versions above go on serving (a bad new config, a new
  /// version that failed): the index gives it as their reason.
  std::string load_error;
  /// The config text it was loaded from and its folder's fingerprint: what poll mode compares.
  std::string config_text;
  std::string fingerprint;
  /// Asked to be served: false for a model explicit mode has not loaded, or that was unloaded
  /// (strict readiness counts only the models that are asked for).
  bool requested = true;

  /// The highest ready version; null when none is ready.
  ModelRef default_version() const noexcept;
  ModelRef find_version(std::int64_t version) const noexcept;
  /// True when the config was usable and every selected version is serving.
  bool all_ready() const;
  ModelId id() const { return {name, ns}; }
  /// Asked to be served, or still holding versions: what a request by name may find when two
  /// namespaces hold the name.
  bool live() const noexcept { return requested || !versions.empty(); }
  /// Whether strict readiness waits for it: asked for, and loaded or failed (not loading for the
  /// first time).
  bool counts_for_readiness() const noexcept {
    return requested && (!versions.empty() || !reason.empty());
  }
};

/// The served set at one moment: immutable once published.
struct RepositorySnapshot {
  std::vector<std::shared_ptr<const ServedModel>> models;  ///< sorted by id() (name, then ns)
  /// The model a request names by `name` alone: the only one of that name, or, where several
  /// namespaces hold it (--model-namespacing), the only one of them that is live(). Null for an
  /// unknown name and for an ambiguous one (ambiguity() says so).
  const ServedModel* find(std::string_view name) const noexcept;
  /// The model of `name` in namespace `ns` exactly; null when there is none.
  const ServedModel* find(std::string_view ns, std::string_view name) const noexcept;
  /// The model `name` as an ensemble of namespace `ns` names it in a step (Triton resolves the
  /// steps in the ensemble's namespace first): that namespace's when it is live(), else
  /// find(name).
  const ServedModel* find_from(std::string_view ns, std::string_view name) const noexcept;
  /// Why find(name) found nothing although models of that name exist: invalid_argument in
  /// Triton's words ("There are N identifiers of model 'X' in global map, model namespace must
  /// be provided to resolve ambiguity."); ok when `name` is not ambiguous.
  Status ambiguity(std::string_view name) const;
  /// The repository index: one entry per version (READY with its reason where a newer load
  /// failed, UNAVAILABLE with why, LOADING, UNLOADING), or per model with none.
  std::vector<IndexEntry> index(bool ready_only) const;
};

class ModelRepository {
 public:
  using Log = std::function<void(const std::string& line)>;
  /// A control call's outcome, called once: a load's on a control thread; an unload's, and a
  /// call refused at once, on the caller's.
  using Done = std::function<void(const Status&)>;

  /// Loads the models under `root` that `options` asks for at start (none and poll: every one;
  /// explicit: --load-model's), one log line per model version: name, version, device, workers,
  /// batching; or why it failed; plus one line per config warning. not_found when `root` is not
  /// a folder, or explicit mode names a model that has no folder; a bad model does not fail the
  /// whole load. Poll mode starts its scans.
  static Result<std::unique_ptr<ModelRepository>> load(const std::filesystem::path& root,
                                                       const Log& log,
                                                       RepositoryOptions options = {});
  /// load() over several repositories (Triton's repeated --model-repository), one name space: a
  /// model is the folder of that name in whichever repository holds it; a name that two or more
  /// hold is not loaded and shows UNAVAILABLE, "model appears in two or more repositories"
  /// (Triton's reason), the rest serve. not_found when one of `roots` is not a folder.
  static Result<std::unique_ptr<ModelRepository>> load(
      const std::vector<std::filesystem::path>& roots, const Log& log,
      RepositoryOptions options = {});
  /// Stops the control threads (a call still queued gets unavailable) and every engine.
  ~ModelRepository();
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  /// The repositories, as given.
  const std::vector<std::filesystem::path>& roots() const noexcept { return roots_; }
  const RepositoryOptions& options() const noexcept { return options_; }
  /// The served set now. Keep the pointer while using what it holds.
  std::shared_ptr<const RepositorySnapshot> snapshot() const;

  /// Triton's RepositoryModelLoad: loads model `name`, or reloads it (a changed config or new
  /// versions load beside the serving ones; traffic moves once they are ready). `params.config`
  /// (Triton's `config` parameter: a ModelConfig in JSON) replaces its config.pbtxt;
  /// `params.files` replace its folder (OverrideFolder; a later load without files loads from
  /// the repository again). Returns at once; `done` gets ok once the model serves, or the
  /// error: unavailable outside explicit mode, when shutting down or when an unload came after
  /// it, invalid_argument for a name that is not a folder name (check_model_name), internal for a
  /// model with no folder and for files that cannot make one ("failed to poll from model
  /// repository", Triton's code and words, then why), invalid_argument for a bad config, the
  /// load's error otherwise (the versions serving before, if any, go on serving).
  void load_model(std::string name, LoadParameters params, Done done);
  /// load_model with `config_json` alone (no files).
  void load_model(std::string name, std::optional<std::string> config_json, Done done) {
    load_model(std::move(name), LoadParameters{std::move(config_json), {}}, std::move(done));
  }
  /// Triton's RepositoryModelUnload: new requests for `name` fail with not_found at once (also
  /// while a load of it runs: that load is then dropped); the ones in flight finish (within
  /// drain_timeout). `done` gets ok as soon as no new request can
  /// reach it (before the drain ends; also for a model that is not loaded), unavailable outside
  /// explicit mode, not_found for a name the repository has never seen.
  void unload_model(std::string name, Done done);

  /// Shuts every engine down in parallel (Engine::shutdown's `mode` and `drain_timeout`) and
  /// returns when all have stopped; loads and scans stop. May be called again, e.g. with cancel
  /// to cut a drain short from another thread.
  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout);

  /// Runs `f` whenever what the server's readiness reads from the repository may have changed:
  /// a snapshot was published (a load, a failed load, an unload, a poll; a version LOADING,
  /// READY, UNAVAILABLE, UNLOADING, a model added or removed) or an engine's health changed
  /// (EngineOptions::on_health_change of every engine it makes). `f` runs on the thread that made
  /// the change (the control thread, the caller of unload_model, a drain's thread, an engine's
  /// thread: ObserverList's rules), after the snapshot is visible and with no lock of the
  /// repository held, so it may call snapshot(). Returns an id for remove_observer().
  std::size_t on_change(std::function<void()> f) { return observers_->add(std::move(f)); }

  /// What every python model of this repository is given as its host (ModelOptions::host):
  /// unbound until the server that serves the repository binds itself (InferenceServer).
  detail::ModelHostLink& host_link() noexcept { return *host_link_; }
  /// Its python models' custom metrics (pb_utils.MetricFamily), for /metrics.
  const CustomMetrics& custom_metrics() const noexcept { return *custom_metrics_; }
  /// After it returns `f` runs no more (a call in progress has ended).
  void remove_observer(std::size_t id) { observers_->remove(id); }

 private:
  class Control;
  ModelRepository() = default;

  /// Builds the next ServedModel of `id` from its folder (or `params`), loading what
  /// changed beside what serves in `old` (may be null). The versions it replaces go to
  /// `replaced`. Null (with the error in `status`) for a model that has no folder and was not
  /// served before. On the control thread.
  std::shared_ptr<const ServedModel> build(const ModelId& id,
                                           const std::shared_ptr<const ServedModel>& old,
                                           const LoadParameters& params, std::uint64_t epoch,
                                           std::vector<ModelRef>* replaced, Status* status);
  /// Loads version `v` of the model in `dir` into `version` (its engine, warm-up and applied
  /// config: ready, or unavailable with the reason) and logs the outcome.
  /// `epoch`: as reload()'s; an unload since then cancels the warm-up.
  StatusCode load_version(ModelVersion& version, const ModelPlan& plan,
                          const std::filesystem::path& dir, std::int64_t v, std::uint64_t epoch);
  /// Loads (or reloads) `id` and publishes it; drains the versions it replaced.
  /// `epoch`: the model's unload count when the load was asked for; an unload since then wins.
  void reload(const ModelId& id, const LoadParameters& params, std::uint64_t epoch,
              const Done& done);
  /// Takes `id` out of service at once (any thread), publishes it UNLOADING, answers, then
  /// drains it off the control thread and publishes it unloaded.
  void unload(const ModelId& id, const Done& done);
  /// --model-namespacing, explicit mode: load_model's job (on a control thread, one such job at
  /// a time). Loads `name` in every namespace that holds it, each ensemble after the models its
  /// steps name (in every namespace, as Triton's cascade polls them by name; `visiting` stops a
  /// cycle). `epochs`: the unload counts of the ids of `name` when the load was asked for.
  /// `done` gets the first failure of `name`'s own loads, or ok.
  void load_everywhere(const std::string& name, const LoadParameters& params,
                       const std::map<ModelId, std::uint64_t>& epochs,
                       std::set<std::string>& visiting, const Done& done);
  /// Poll mode: loads new folders, reloads changed ones, unloads removed ones.
  void poll();
  std::shared_ptr<const ServedModel> current(const ModelId& id) const;
  /// An ensemble version: its steps resolved against the models served now, those of its own
  /// namespace first (RepositorySnapshot::find_from; no engine).
  Status load_ensemble(ModelVersion& version, const ModelPlan& plan);
  /// Replaces (or adds) `model` in the snapshot, then tells the observers (on_change).
  void publish(std::shared_ptr<const ServedModel> model);
  /// The same under snapshot_mu_, without telling them: the caller does once it has let go.
  void publish_locked(std::shared_ptr<const ServedModel> model);
  /// publish() unless the model was unloaded since `epoch` (false then).
  bool publish_if(std::shared_ptr<const ServedModel> model, std::uint64_t epoch);
  /// publish() only while the snapshot still holds `expected` for its name.
  bool replace_if(const std::shared_ptr<const ServedModel>& expected,
                  std::shared_ptr<const ServedModel> model);
  /// How many unloads `id` has had (epochs_).
  std::uint64_t epoch_of(const ModelId& id) const;
  std::uint64_t epoch_locked(const ModelId& id) const;
  /// Drains `versions` (they were marked retired) on a thread of its own:
  /// Engine::shutdown(drain, timeout), then `then`. shutdown() joins it.
  void drain_async(std::vector<ModelRef> versions, std::chrono::milliseconds timeout,
                   std::function<void()> then);
  Result<std::shared_ptr<Device>> open_device_once(const std::string& spec);
  /// A new version, destroyed on the control thread when its last reference goes.
  std::shared_ptr<ModelVersion> make_version();

  /// The folder of model `id`: with a namespace, the one of its name in that repository;
  /// without, the one of that name in whichever repository holds it. not_found (naming the
  /// folder, or every repository's) without one; unavailable, with Triton's reason, when two or
  /// more repositories hold one (no namespace).
  Result<std::filesystem::path> folder_of(const ModelId& id) const;
  /// The model folders of every repository: name → the folders of that name (two or more: the
  /// name is not unique). Logs and skips a repository that cannot be listed.
  std::map<std::string, std::vector<std::filesystem::path>> list_models() const;
  /// The models the repositories hold now: without namespacing one id per name (ns ""), with
  /// its folder in `folders` when only one repository holds it; with namespacing one id per
  /// folder (ns: its repository), each in `folders`.
  std::vector<ModelId> list_ids(std::map<ModelId, std::filesystem::path>* folders) const;

  std::vector<std::filesystem::path> roots_;
  RepositoryOptions options_;
  Log log_;
  mutable std::mutex snapshot_mu_;
  std::shared_ptr<const RepositorySnapshot> snapshot_;
  std::mutex devices_mu_;
  std::map<std::string, std::shared_ptr<Device>> devices_;
  /// An engine being made (its warm-up may be long): registered so that shutdown() can cancel it.
  class LoadingEngine {
   public:
    /// Cancels `engine` at once when `model` was unloaded since `epoch`, or the server stops.
    LoadingEngine(ModelRepository& repo, const ModelId& model, Engine* engine, std::uint64_t epoch);
    ~LoadingEngine();
    LoadingEngine(const LoadingEngine&) = delete;
    LoadingEngine& operator=(const LoadingEngine&) = delete;

   private:
    ModelRepository& repo_;
    Engine* engine_;
  };
  struct Drain {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  /// One version's load in progress: what an unload of its model, shutdown() and its deadline
  /// (load_timer_) cancel. Registered for the whole of load_version (under draining_mu_).
  struct LoadTicket {
    ModelId model;
    std::stop_source stop;
    std::atomic<bool> timed_out{false};  ///< its deadline cancelled it
  };
  /// Registers a load of `model` asked for at `epoch`: cancelled at once when the model was
  /// unloaded since or the server stops (as LoadingEngine), and when `load_timeout` passes.
  std::shared_ptr<LoadTicket> start_load(const ModelId& model, std::uint64_t epoch,
                                         TimerId* deadline);
  void end_load(const std::shared_ptr<LoadTicket>& ticket, TimerId deadline);
  /// No load starts from now on (stopping_) and those running are cancelled: their tickets, and
  /// the engines warming up. What shutdown() does first; load()'s start_stop does it too.
  void cancel_loads();
  std::vector<std::shared_ptr<LoadTicket>> loads_;  ///< under draining_mu_
  /// The loads' deadlines.
  DeadlineTimer load_timer_{"ai-load-timer"};

  /// Versions replaced or unloaded whose engines are draining, the threads draining them, and
  /// the engines being loaded (shutdown() cuts them all short).
  std::mutex draining_mu_;
  std::vector<ModelRef> draining_;
  std::vector<Drain> drains_;
  std::condition_variable drains_cv_;                 ///< a drain ended
  std::vector<std::pair<ModelId, Engine*>> loading_;  ///< (model, engine)
  /// Per model, how many unloads it has had (under snapshot_mu_): a load asked for before
  /// an unload does not publish after it.
  std::map<ModelId, std::uint64_t> epochs_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> next_generation_{1};
  /// on_change's observers. Shared with the engines' on_health_change, as an engine may outlive
  /// the repository (a request's ModelRef holds its version).
  std::shared_ptr<ObserverList> observers_ = std::make_shared<ObserverList>();
  std::shared_ptr<detail::ModelHostLink> host_link_;  ///< made by load()
  std::shared_ptr<CustomMetrics> custom_metrics_;     ///< made by load(), bound to host_link_
  std::shared_ptr<Control> control_;                  ///< the control thread and its queue
};

}  // namespace asyncinfer::server
