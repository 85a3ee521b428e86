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
// Design: load() reads everything at start and the set never changes afterwards (no model
// control API), so lookups need no lock and a ModelVersion pointer stays valid for the
// repository's life. A model whose config is bad, or a version whose file or engine fails, is
// kept with state UNAVAILABLE and the reason, and logged; the others serve. Devices are opened
// once per spec and shared by the engines on them.
//
// Thread safety: after load() every const member is safe from any thread; shutdown() may be
// called from any one thread (Engine::shutdown's rules), concurrently with lookups.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/status.hpp"
#include "response_cache.hpp"

namespace asyncinfer::server {

/// Triton's repository index states.
enum class ModelState : std::uint8_t { ready, unavailable };
/// "READY" or "UNAVAILABLE".
std::string_view to_string(ModelState state) noexcept;

/// One served version of a model.
struct ModelVersion {
  std::string model_name;
  std::int64_t version = 0;
  std::string version_text;  ///< "1"
  ModelState state = ModelState::unavailable;
  std::string reason;    ///< why it is unavailable
  std::string platform;  ///< "pytorch_libtorch" or "asyncinfer_builtin"
  std::string device;    ///< as opened: "cpu", "sim", "cuda:0"
  /// The loaded model's signature (full shapes; -1 = variable dim, the batch dim first when
  /// batched). Meaningful only when ready.
  ModelSignature signature;
  /// The config's max_batch_size (0 = no batch dim): the largest dim 0 a request may have.
  std::int64_t max_batch_size = 0;
  std::unique_ptr<Engine> engine;  ///< null unless ready
  /// The configuration it runs with (applied_model_config): Triton's JSON form and the
  /// serialized inference.ModelConfig. Set when ready.
  std::string config_json;
  std::string config_binary;
  /// response_cache { enable: true } in its config: answered from the server's cache, if any.
  bool response_cache = false;
  /// Its response-cache hits and misses (InferenceServer::version_stats).
  mutable CacheCounters cache_counters;

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
  InferenceStats statistics() const { return statistics(engine->metrics().stats); }
};

/// A model folder of the repository.
struct ServedModel {
  std::string name;
  std::string platform;
  /// Set when the config itself could not be used (then there are no versions).
  std::string reason;
  std::vector<std::unique_ptr<ModelVersion>> versions;  ///< ascending

  /// The highest ready version; null when none is ready.
  const ModelVersion* default_version() const noexcept;
  const ModelVersion* find_version(std::int64_t version) const noexcept;
  /// True when the config was usable and every selected version is serving.
  bool all_ready() const;
};

class ModelRepository {
 public:
  using Log = std::function<void(const std::string& line)>;

  /// Loads every model under `root` (one log line per model version: name, version, device,
  /// workers, batching; or why it failed; plus one line per config warning). not_found when
  /// `root` is not a folder; a bad model does not fail the whole load.
  static Result<std::unique_ptr<ModelRepository>> load(const std::filesystem::path& root,
                                                       const Log& log);
  ~ModelRepository();
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  const std::filesystem::path& root() const noexcept { return root_; }
  /// Sorted by name.
  const std::vector<std::unique_ptr<ServedModel>>& models() const noexcept { return models_; }
  const ServedModel* find(std::string_view name) const noexcept;

  /// Shuts every engine down in parallel (Engine::shutdown's `mode` and `drain_timeout`) and
  /// returns when all have stopped. May be called again, e.g. with cancel to cut a drain short
  /// from another thread.
  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout);

 private:
  ModelRepository() = default;
  std::filesystem::path root_;
  std::vector<std::unique_ptr<ServedModel>> models_;
  std::map<std::string, std::shared_ptr<Device>> devices_;
};

}  // namespace asyncinfer::server
