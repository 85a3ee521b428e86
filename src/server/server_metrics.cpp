#include "server_metrics.hpp"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <map>
#include <sstream>

#include "model_repository.hpp"

namespace asyncinfer::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

ClientMetric sample(std::vector<ClientMetric::Label> labels, double value, MetricType type) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) m.counter.value = value;
  if (type == MetricType::Gauge) m.gauge.value = value;
  return m;
}

ClientMetric histogram(std::vector<ClientMetric::Label> labels, const HistogramSnapshot& h) {
  ClientMetric m;
  m.label = std::move(labels);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    m.histogram.bucket.push_back({cumulative, h.bounds[i]});
  }
  // The serializer adds the +Inf bucket from sample_count.
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum;
  return m;
}

}  // namespace

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
std::uint64_t ProtocolMetrics::requests(std::size_t index) const noexcept {
  return index < requests_.size() ? requests_[index].load(std::memory_order_relaxed) : 0;
}

void ProtocolMetrics::collect(std::vector<MetricFamily>& out) const {
  const std::string p = "asyncinfer_" + protocol_ + "_";
  MetricFamily req =
      family(p + "requests_total", "Requests answered, by " + labels_.name, MetricType::Counter);
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    req.metric.push_back(sample({{labels_.name, labels_.values[i]}},
                                static_cast<double>(requests(i)), MetricType::Counter));
  }
  out.push_back(std::move(req));
  if (connections_families_) collect_connections(p, out);
  collect_latency(p, out);
}

void ProtocolMetrics::collect_connections(const std::string& p,
                                          std::vector<MetricFamily>& out) const {
  MetricFamily active = family(p + "active_connections", "Connections open now", MetricType::Gauge);
  active.metric.push_back(
      sample({}, static_cast<double>(active_.load(std::memory_order_relaxed)), MetricType::Gauge));
  out.push_back(std::move(active));
  MetricFamily total = family(p + "connections_total", "Connections accepted", MetricType::Counter);
  total.metric.push_back(sample(
      {}, static_cast<double>(connections_.load(std::memory_order_relaxed)), MetricType::Counter));
  out.push_back(std::move(total));
  MetricFamily rejected =
      family(p + "connections_rejected_total", "Connections refused over the connection limit",
             MetricType::Counter);
  rejected.metric.push_back(sample(
      {}, static_cast<double>(rejected_.load(std::memory_order_relaxed)), MetricType::Counter));
  out.push_back(std::move(rejected));
}

void ProtocolMetrics::collect_latency(const std::string& p, std::vector<MetricFamily>& out) const {
  MetricFamily lat = family(p + "infer_duration_us",
                            "Server-side time of inference requests, request read to response "
                            "sent (us)",
                            MetricType::Histogram);
  lat.metric.push_back(histogram({}, infer_us_.snapshot()));
  out.push_back(std::move(lat));
}

void collect_engine_metrics(const ModelRepository& repository, std::vector<MetricFamily>& out) {
  // One family per name; one sample per model version (and reason).
  struct Def {
    const char* name;
    const char* help;
    MetricType type;
  };
  std::map<std::string, MetricFamily> families;
  auto add = [&](const std::string& name, const char* help, MetricType type, ClientMetric m) {
    auto it = families.find(name);
    if (it == families.end()) it = families.emplace(name, family(name, help, type)).first;
    it->second.metric.push_back(std::move(m));
  };
  const std::string p = "asyncinfer_";
  auto snap = repository.snapshot();
  for (const auto& model : snap->models) {
    if (!model->requested && model->versions.empty()) continue;  // not loaded
    if (model->versions.empty()) {
      add(p + "model_ready", "1 when the model version is loaded and serving", MetricType::Gauge,
          sample({{"model", model->name}, {"version", ""}}, 0, MetricType::Gauge));
    }
    for (const auto& v : model->versions) {
      const std::vector<ClientMetric::Label> l = {{"model", model->name},
                                                  {"version", v->version_text}};
      add(p + "model_ready", "1 when the model version is loaded and serving", MetricType::Gauge,
          sample(l, v->serving() ? 1 : 0, MetricType::Gauge));
      if (!v->engine) continue;
      EngineMetrics m = v->engine->metrics();
      m.stats = v->statistics(std::move(m.stats));
      auto counter = [&](const char* name, const char* help, std::uint64_t value) {
        add(p + name, help, MetricType::Counter,
            sample(l, static_cast<double>(value), MetricType::Counter));
      };
      auto gauge = [&](const char* name, const char* help, double value) {
        add(p + name, help, MetricType::Gauge, sample(l, value, MetricType::Gauge));
      };
      counter("inference_request_success", "Requests completed successfully", m.completed);
      std::uint64_t failed = 0;
      for (const auto& [reason, n] : m.failures_by_reason) {
        std::vector<ClientMetric::Label> lr = l;
        lr.push_back({"reason", reason});
        add(p + "inference_request_failure", "Requests that ended in an error, by reason",
            MetricType::Counter, sample(lr, static_cast<double>(n), MetricType::Counter));
        failed += n;
      }
      if (failed == 0) {
        std::vector<ClientMetric::Label> lr = l;
        lr.push_back({"reason", "none"});
        add(p + "inference_request_failure", "Requests that ended in an error, by reason",
            MetricType::Counter, sample(lr, 0, MetricType::Counter));
      }
      for (const auto& [reason, n] : m.rejections_by_reason) {
        std::vector<ClientMetric::Label> lr = l;
        lr.push_back({"reason", reason});
        add(p + "inference_request_rejected", "Requests refused at submit, by reason",
            MetricType::Counter, sample(lr, static_cast<double>(n), MetricType::Counter));
      }
      if (m.rejections_by_reason.empty()) {  // a series from the start, so alerts see 0
        std::vector<ClientMetric::Label> lr = l;
        lr.push_back({"reason", "none"});
        add(p + "inference_request_rejected", "Requests refused at submit, by reason",
            MetricType::Counter, sample(lr, 0, MetricType::Counter));
      }
      counter("inference_request_accepted", "Requests accepted by the engine", m.submitted);
      counter("inference_request_timed_out", "Requests that passed their deadline", m.timed_out);
      counter("inference_request_cancelled", "Requests cancelled (client gone)", m.cancelled);
      counter("inference_request_shut_down", "Requests ended by shutdown", m.shut_down);
      counter("inference_exec_count", "Batches executed", m.batches);
      counter("inference_retries", "Retries scheduled", m.retries);
      counter("inference_late_completions", "Results that arrived after their request ended",
              m.late_completions);
      gauge("inference_queue_depth", "Requests waiting in the queue",
            static_cast<double>(m.queue_depth));
      gauge("inference_pending_request_count", "Requests accepted and not yet ended",
            static_cast<double>(m.inflight_requests));
      add(p + "inference_queue_duration_us", "Time requests spent queued (us)",
          MetricType::Histogram, histogram(l, m.queue_us));
      add(p + "inference_compute_infer_duration_us", "Time batches spent on the device (us)",
          MetricType::Histogram, histogram(l, m.compute_us));
      add(p + "inference_request_duration_us", "Submit to the end of the request (us)",
          MetricType::Histogram, histogram(l, m.request_us));
      add(p + "inference_batch_size", "Rows per executed batch", MetricType::Histogram,
          histogram(l, m.batch_size));
      // Triton's statistics (GET .../stats, ModelStatistics), from the same snapshot's counters.
      counter("inference_statistics_inferences",
              "Triton's inference_count: rows (batch elements) of successful requests",
              m.stats.inference_count);
      counter("inference_statistics_executions",
              "Triton's execution_count: batch executions that completed", m.stats.execution_count);
      for (auto [name, d] :
           {std::pair{"success", &m.stats.success}, std::pair{"fail", &m.stats.fail},
            std::pair{"queue", &m.stats.queue}, std::pair{"compute_input", &m.stats.compute_input},
            std::pair{"compute_infer", &m.stats.compute_infer},
            std::pair{"compute_output", &m.stats.compute_output},
            std::pair{"cache_hit", &m.stats.cache_hit},
            std::pair{"cache_miss", &m.stats.cache_miss}}) {
        std::vector<ClientMetric::Label> ls = l;
        ls.push_back({"statistic", name});
        add(p + "inference_statistics_requests",
            "Requests counted in each of Triton's statistics (GET /v2/models/{m}/stats)",
            MetricType::Counter, sample(ls, static_cast<double>(d->count), MetricType::Counter));
        add(p + "inference_statistics_duration_ns",
            "Total nanoseconds of each of Triton's statistics (GET /v2/models/{m}/stats)",
            MetricType::Counter, sample(ls, static_cast<double>(d->ns), MetricType::Counter));
      }
    }
  }
  for (auto& [name, f] : families) out.push_back(std::move(f));
}

std::string serialize_metrics(const std::vector<MetricFamily>& families) {
  std::ostringstream s;
  prometheus::TextSerializer().Serialize(s, families);
  return s.str();
}

}  // namespace asyncinfer::server
