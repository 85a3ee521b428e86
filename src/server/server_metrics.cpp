#include "server_metrics.hpp"

#include <map>

#include "metrics/prometheus_text.hpp"
#include "model_repository.hpp"

namespace asyncinfer::server {

ProtocolMetrics::ProtocolMetrics(std::string protocol, Labels labels, bool connections)
    : protocol_(std::move(protocol)),
      labels_(std::move(labels)),
      connections_families_(connections),
      requests_(labels_.values.size()) {}

void ProtocolMetrics::count_request(std::size_t index) noexcept {
  if (index < requests_.size()) requests_[index].fetch_add(1, std::memory_order_relaxed);
}
void ProtocolMetrics::connection_opened() noexcept {
  active_.fetch_add(1, std::memory_order_relaxed);
  connections_.fetch_add(1, std::memory_order_relaxed);
}
void ProtocolMetrics::connection_closed() noexcept {
  active_.fetch_sub(1, std::memory_order_relaxed);
}
void ProtocolMetrics::connection_rejected() noexcept {
  rejected_.fetch_add(1, std::memory_order_relaxed);
}
void ProtocolMetrics::stream_stalled() noexcept {
  stalled_streams_.fetch_add(1, std::memory_order_relaxed);
}
std::uint64_t ProtocolMetrics::requests(std::size_t index) const noexcept {
  return index < requests_.size() ? requests_[index].load(std::memory_order_relaxed) : 0;
}

void ProtocolMetrics::collect(metrics::Families& out) const {
  const std::string p = "asyncinfer_" + protocol_ + "_";
  const std::string help = "Requests answered, by " + labels_.name;
  out.declare(p + "requests_total", help, prometheus::MetricType::Counter);
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    out.counter(p + "requests_total", help, {{labels_.name, labels_.values[i]}},
                static_cast<double>(requests(i)));
  }
  out.counter(p + "stalled_streams_total",
              "Response streams (gRPC ModelStreamInfer, HTTP generate_stream) cancelled because "
              "the client read nothing for --idle-timeout; their requests were cancelled",
              {}, static_cast<double>(stalled_streams()));
  if (connections_families_) collect_connections(p, out);
  collect_latency(p, out);
}

void ProtocolMetrics::collect_connections(const std::string& p, metrics::Families& out) const {
  out.gauge(p + "active_connections", "Connections open now", {},
            static_cast<double>(active_.load(std::memory_order_relaxed)));
  out.counter(p + "connections_total", "Connections accepted", {},
              static_cast<double>(connections_.load(std::memory_order_relaxed)));
  out.counter(p + "connections_rejected_total", "Connections refused over the connection limit", {},
              static_cast<double>(rejected_.load(std::memory_order_relaxed)));
}

void ProtocolMetrics::collect_latency(const std::string& p, metrics::Families& out) const {
  out.histogram(p + "infer_duration_us",
                "Server-side time of inference requests, request read to response sent (us)", {},
                infer_us_.snapshot());
}

namespace {

/// Triton's families for one version (docs/user_guide/metrics.md of Triton's server: the
/// inference request counts and latency counters, the pending requests, and the response-cache
/// families of a model with the cache on), labelled `model` and `version` as Triton's, so that
/// Triton's dashboards, alerts and qa tests read asyncinfer unchanged. Durations in µs.
/// `engine`: the version's engine metrics (null for an ensemble).
void add_triton_families(metrics::Families& out, const ModelVersion& v, const InferenceStats& s,
                         const EngineMetrics* engine, const metrics::Labels& l) {
  auto counter = [&](const char* name, const char* help, double value) {
    out.counter(name, help, l, value);
  };
  auto us = [](const DurationStat& d) { return static_cast<double>(d.ns / 1000); };
  counter("nv_inference_request_success",
          "Number of successful inference requests, all batch sizes",
          static_cast<double>(s.success.count));
  // Triton's reasons: REJECTED (refused by the queue), CANCELED, BACKEND (the model failed),
  // OTHER.
  std::map<std::string, double> failures{
      {"REJECTED", 0}, {"CANCELED", 0}, {"BACKEND", 0}, {"OTHER", 0}};
  if (engine != nullptr) {
    for (const auto& [code, n] : engine->failures_by_reason) {
      failures[code == "cancelled"  ? "CANCELED"
               : code == "internal" ? "BACKEND"
                                    : "OTHER"] += static_cast<double>(n);
    }
    for (const auto& [code, n] : engine->rejections_by_reason) {
      failures[code == "resource_exhausted" || code == "unavailable" ? "REJECTED" : "OTHER"] +=
          static_cast<double>(n);
    }
  } else {
    failures["OTHER"] = static_cast<double>(s.fail.count);
  }
  const char* failure_help = "Number of failed inference requests, all batch sizes";
  for (const auto& [reason, n] : failures) {
    metrics::Labels with_reason = l;
    with_reason.emplace_back("reason", reason);
    out.counter("nv_inference_request_failure", failure_help, with_reason, n);
  }
  counter("nv_inference_count", "Number of inferences performed (does not include cached requests)",
          static_cast<double>(s.inference_count));
  counter("nv_inference_exec_count",
          "Number of model executions performed (does not include cached requests)",
          static_cast<double>(s.execution_count));
  counter("nv_inference_request_duration_us",
          "Cumulative inference request duration in microseconds (includes cached requests)",
          us(s.success));
  counter("nv_inference_queue_duration_us",
          "Cumulative inference queuing duration in microseconds (includes cached requests)",
          us(s.queue));
  counter("nv_inference_compute_input_duration_us",
          "Cumulative compute input duration in microseconds (does not include cached requests)",
          us(s.compute_input));
  counter("nv_inference_compute_infer_duration_us",
          "Cumulative compute inference duration in microseconds (does not include cached "
          "requests)",
          us(s.compute_infer));
  counter("nv_inference_compute_output_duration_us",
          "Cumulative inference compute output duration in microseconds (does not include cached "
          "requests)",
          us(s.compute_output));
  out.gauge("nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.", l,
            engine != nullptr ? static_cast<double>(engine->queue_depth) : 0);
  if (v.response_cache) {
    counter("nv_cache_num_hits_per_model", "Number of cache hits per model",
            static_cast<double>(s.cache_hit.count));
    counter("nv_cache_num_misses_per_model", "Number of cache misses per model",
            static_cast<double>(s.cache_miss.count));
    counter("nv_cache_hit_duration_per_model",
            "Total cache hit duration per model, in microseconds", us(s.cache_hit));
    counter("nv_cache_miss_duration_per_model",
            "Total cache miss (insert+lookup) duration per model, in microseconds",
            us(s.cache_miss));
  }
}

/// A version's labels: `model` and `version`, and with --model-namespacing `namespace` (its
/// repository) between them, as Triton's (metric_model_reporter.cc: a "namespace" label when
/// namespacing is on; its labels are sorted by name), so that two namespaces' models of one name
/// are two series.
metrics::Labels model_labels(const ServedModel& model, const std::string& version) {
  if (model.ns.empty()) return {{"model", model.name}, {"version", version}};
  return {{"model", model.name}, {"namespace", model.ns}, {"version", version}};
}

}  // namespace

void collect_engine_metrics(const ModelRepository& repository, metrics::Families& out) {
  const char* ready_help = "1 when the model version is loaded and serving";
  auto snap = repository.snapshot();
  for (const auto& model : snap->models) {
    if (!model->requested && model->versions.empty()) continue;  // not loaded
    if (model->versions.empty()) {
      out.gauge("asyncinfer_model_ready", ready_help, model_labels(*model, ""), 0);
    }
    for (const auto& v : model->versions) {
      const metrics::Labels l = model_labels(*model, v->version_text);
      out.gauge("asyncinfer_model_ready", ready_help, l, v->serving() ? 1 : 0);
      if (v->ensemble && v->ensemble_counters) {
        add_triton_families(out, *v, v->statistics(), nullptr, l);
      }
      if (!v->engine) continue;
      EngineMetrics m = v->engine->metrics();
      m.stats = v->statistics(std::move(m.stats));  // with the response cache's hits and misses
      metrics::add_engine_metrics(out, "asyncinfer", m, l);
      add_triton_families(out, *v, m.stats, &m, l);
    }
  }
}

}  // namespace asyncinfer::server
