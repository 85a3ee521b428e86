#include "server_metrics.hpp"

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

void collect_engine_metrics(const ModelRepository& repository, metrics::Families& out) {
  const char* ready_help = "1 when the model version is loaded and serving";
  auto snap = repository.snapshot();
  for (const auto& model : snap->models) {
    if (!model->requested && model->versions.empty()) continue;  // not loaded
    if (model->versions.empty()) {
      out.gauge("asyncinfer_model_ready", ready_help, {{"model", model->name}, {"version", ""}}, 0);
    }
    for (const auto& v : model->versions) {
      const metrics::Labels l = {{"model", model->name}, {"version", v->version_text}};
      out.gauge("asyncinfer_model_ready", ready_help, l, v->serving() ? 1 : 0);
      if (!v->engine) continue;
      EngineMetrics m = v->engine->metrics();
      m.stats = v->statistics(std::move(m.stats));  // with the response cache's hits and misses
      metrics::add_engine_metrics(out, "asyncinfer", m, l);
    }
  }
}

}  // namespace asyncinfer::server
