// model_host.hpp — the server's side of what its python models ask of it
// (src/model/model_host.hpp): business logic scripting (a model.py's InferenceRequest.exec), the
// model loading API and custom metrics (pb_utils.MetricFamily), after Triton's Python backend.
//
// A model's request goes through InferenceServer::submit, as a client's does: the called
// model's batching, priorities, statistics, response cache and sequences all apply, and nothing
// here blocks. Before it is submitted, its chain of callers is checked (docs/design.md, "Business
// logic scripting"):
//   - at most kMaxCallDepth models in one chain: deeper is a runaway recursion;
//   - a model may appear in the chain at most as many times as it has instances: each appearance
//     holds one instance busy while it waits for this call, so one more could never run (a model
//     that calls itself with one instance would wait for itself forever).
// Either is refused at once (resource_exhausted) with the chain in the message.
//
// Custom metrics (CustomMetrics) belong to the repository, so that a model's initialize() may
// make them before the server exists; they go to /metrics after the server's own, as Triton
// shows them: the family's name and the labels the model gave, nothing added.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/model_host.hpp"

namespace asyncinfer::metrics {
class Families;
}

namespace asyncinfer::server {

class InferenceServer;

/// Models in one chain of business-logic-scripting calls, the client's request's model included.
inline constexpr std::size_t kMaxCallDepth = 16;

class ServerModelHost final : public detail::ModelHost {
 public:
  explicit ServerModelHost(InferenceServer& server) : server_(server) {}

  Result<std::shared_ptr<detail::HostCall>> infer(detail::HostRequest request,
                                                  OnResponse on_response) override;
  bool model_ready(const std::string& model, const std::string& version) override;
  void load_model(std::string model, std::optional<std::string> config_json, Done done) override;
  void unload_model(std::string model, Done done) override;

 private:
  InferenceServer& server_;
};

/// The custom metrics of a repository's python models (pb_utils.MetricFamily), shown on /metrics.
class CustomMetrics final : public detail::MetricsHost {
 public:
  Result<std::uint64_t> metric_family(const std::string& name, const std::string& description,
                                      detail::MetricKind kind) override;
  Result<std::uint64_t> metric(std::uint64_t family,
                               const std::map<std::string, std::string>& labels,
                               const std::vector<double>& buckets) override;
  Result<double> metric_update(std::uint64_t metric, const std::string& op, double value) override;
  void metric_delete(std::uint64_t metric) override;

  /// Every metric, each family once, into `out`.
  void collect(metrics::Families& out) const;

 private:
  struct Family {
    std::string name;
    std::string description;
    detail::MetricKind kind;
    std::size_t metrics = 0;  ///< live metrics of it
  };
  struct Metric {
    std::uint64_t family;
    std::map<std::string, std::string> labels;
    double value = 0;  ///< counter, gauge
    std::vector<double> bounds;
    std::vector<std::uint64_t> counts;  ///< per bucket, one more than bounds
    std::uint64_t count = 0;
    double sum = 0;
    std::size_t refs = 1;  ///< the models (instances) that asked for it: one per metric()
  };

  mutable std::mutex mu_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Family> families_;
  std::map<std::uint64_t, Metric> metrics_;
};

}  // namespace asyncinfer::server
