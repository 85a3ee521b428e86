// model_host.hpp (internal) — what a model may ask of the server that hosts it: Triton's Python
// backend's business logic scripting (a model.py's InferenceRequest.exec / async_exec), its model
// loading API (is_model_ready, load_model, unload_model) and its custom metrics.
//
// The python backend (src/model/python) calls it; the model server implements it
// (src/server/model_host.cpp) on its own request path, so that a model's request to another model
// runs exactly as a client's would: that model's batching, priorities, statistics, response cache
// and sequences. A model loaded without a server has no host (ModelOptions::host is null) and its
// calls fail with unavailable.
//
// Thread safety: every member may be called from any thread, at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "asyncinfer/model.hpp"

namespace asyncinfer::detail {

/// A model's request to another model (business logic scripting).
struct HostRequest {
  std::string model;
  std::string version;                                 ///< "" = the model's default version
  std::vector<std::pair<std::string, Tensor>> inputs;  ///< host tensors, any order
  std::vector<std::string> outputs;                    ///< empty = every output
  std::string id;
  std::optional<SequenceFlags> sequence;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  int priority = 0;  ///< 0 = the model's default level
  /// Carried to the called model (RequestContext): the request's parameters as a JSON object's
  /// text, and the chain of models whose execution made it, outermost first, the caller last.
  std::shared_ptr<const RequestContext> context;
  /// The calling request's trace (its RequestContext::trace), when the call was made with
  /// trace=request.trace() of a traced request: the server traces the call as its child
  /// (Triton's "Tracing for BLS models"). Null: the call is not traced.
  std::shared_ptr<TraceHandle> trace;
  /// The caller reads a stream of responses (Triton's exec(decoupled=True)); false refuses a
  /// decoupled model, whose responses could not come back as one.
  bool decoupled = false;
};

/// One response to a HostRequest.
struct HostResponse {
  std::vector<std::pair<std::string, Tensor>> outputs;  ///< those asked for, in the order asked
  bool final = true;  ///< the last response of the request (a decoupled model's may be empty)
};

/// A HostRequest in flight.
class HostCall {
 public:
  virtual ~HostCall() = default;
  /// Ends the request where it has not ended (its last response is then a cancelled error).
  /// Idempotent; never blocks for long.
  virtual void cancel() = 0;
};

/// The kinds of Triton's custom metrics (pb_utils.MetricFamily.COUNTER, GAUGE, HISTOGRAM).
enum class MetricKind { counter, gauge, histogram };

class ModelHost {
 public:
  /// Gets each response in order, the last with `final` set or an error; on any thread (the
  /// called model's, the server's completion threads). Must not block.
  using OnResponse = std::function<void(Result<HostResponse>)>;
  using Done = std::function<void(const Status&)>;

  virtual ~ModelHost() = default;

  /// Submits `request`. Accepted: on_response runs until the final response or an error. An
  /// error returned here means nothing was submitted (on_response is not called): not_found /
  /// unavailable for a model that is not served or not ready, invalid_argument for bad inputs,
  /// resource_exhausted for a cycle or depth that could never run (docs/design.md).
  virtual Result<std::shared_ptr<HostCall>> infer(HostRequest request, OnResponse on_response) = 0;
  /// Whether the model (version "" = any) is loaded and ready. Never blocks.
  virtual bool model_ready(const std::string& model, const std::string& version) = 0;
  /// Triton's model control (explicit mode): `done` once the load or unload has been decided.
  virtual void load_model(std::string model, std::optional<std::string> config_json, Done done) = 0;
  virtual void unload_model(std::string model, Done done) = 0;
};

// ---- custom metrics ----
/// Custom metrics (a server keeps them in its repository, so that a model's initialize() may
/// make them before the server exists): a family (its name and kind fixed at creation), then one
/// metric per label set. Errors: invalid_argument naming what is wrong (a name that is not
/// Prometheus's [a-zA-Z_:][a-zA-Z0-9_:]*, a family redefined with another kind or description,
/// bad labels or buckets). metric_update's op: "increment", "set" or "observe" (by kind), or
/// "value" (what it holds; a histogram's sum). metric_delete removes a metric (a family goes
/// with its last metric).
class MetricsHost {
 public:
  virtual ~MetricsHost() = default;
  virtual Result<std::uint64_t> metric_family(const std::string& name,
                                              const std::string& description, MetricKind kind) = 0;
  virtual Result<std::uint64_t> metric(std::uint64_t family,
                                       const std::map<std::string, std::string>& labels,
                                       const std::vector<double>& buckets) = 0;
  virtual Result<double> metric_update(std::uint64_t metric, const std::string& op,
                                       double value) = 0;
  virtual void metric_delete(std::uint64_t metric) = 0;
};

/// The ModelHost that a server's models are given before the server exists: model calls go to
/// the server once bound (InferenceServer's constructor) and get unavailable before and after;
/// metric calls go to the metrics host bound at once (the repository's).
class ModelHostLink final : public ModelHost, public MetricsHost {
 public:
  /// `target` must stay valid until unbind() has returned. unbind() waits for the calls in
  /// progress.
  void bind(ModelHost* target) {
    std::unique_lock lock(mu_);
    target_ = target;
  }
  void unbind() { bind(nullptr); }
  void bind_metrics(std::shared_ptr<MetricsHost> metrics) {
    std::unique_lock lock(mu_);
    metrics_ = std::move(metrics);
  }

  Result<std::shared_ptr<HostCall>> infer(HostRequest request, OnResponse on_response) override {
    std::shared_lock lock(mu_);
    if (target_ == nullptr) return unbound();
    return target_->infer(std::move(request), std::move(on_response));
  }
  bool model_ready(const std::string& model, const std::string& version) override {
    std::shared_lock lock(mu_);
    return target_ != nullptr && target_->model_ready(model, version);
  }
  void load_model(std::string model, std::optional<std::string> config_json, Done done) override {
    std::shared_lock lock(mu_);
    if (target_ == nullptr) return done(unbound());
    target_->load_model(std::move(model), std::move(config_json), std::move(done));
  }
  void unload_model(std::string model, Done done) override {
    std::shared_lock lock(mu_);
    if (target_ == nullptr) return done(unbound());
    target_->unload_model(std::move(model), std::move(done));
  }
  Result<std::uint64_t> metric_family(const std::string& name, const std::string& description,
                                      MetricKind kind) override {
    std::shared_lock lock(mu_);
    if (!metrics_) return no_metrics();
    return metrics_->metric_family(name, description, kind);
  }
  Result<std::uint64_t> metric(std::uint64_t family,
                               const std::map<std::string, std::string>& labels,
                               const std::vector<double>& buckets) override {
    std::shared_lock lock(mu_);
    if (!metrics_) return no_metrics();
    return metrics_->metric(family, labels, buckets);
  }
  Result<double> metric_update(std::uint64_t metric, const std::string& op, double value) override {
    std::shared_lock lock(mu_);
    if (!metrics_) return no_metrics();
    return metrics_->metric_update(metric, op, value);
  }
  void metric_delete(std::uint64_t metric) override {
    std::shared_lock lock(mu_);
    if (metrics_) metrics_->metric_delete(metric);
  }

 private:
  static Status unbound() {
    return unavailable_error(
        "the model server is not serving (it is starting, or has stopped): a model can call "
        "other models only from execute() while the server serves");
  }
  static Status no_metrics() { return unavailable_error("there is no /metrics for this model"); }
  std::shared_mutex mu_;
  ModelHost* target_ = nullptr;
  std::shared_ptr<MetricsHost> metrics_;
};

}  // namespace asyncinfer::detail
