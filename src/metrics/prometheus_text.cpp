#include "metrics/prometheus_text.hpp"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <sstream>

namespace asyncinfer::metrics {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

namespace {

ClientMetric with_labels(const Labels& labels) {
  ClientMetric m;
  m.label.reserve(labels.size());
  for (const auto& [name, value] : labels) m.label.push_back({name, value});
  return m;
}

Labels plus(const Labels& labels, std::string name, std::string value) {
  Labels l = labels;
  l.emplace_back(std::move(name), std::move(value));
  return l;
}

}  // namespace

MetricFamily& Families::family(const std::string& name, const std::string& help, MetricType type) {
  auto it = std::find_if(families_.begin(), families_.end(),
                         [&](const MetricFamily& f) { return f.name == name; });
  if (it != families_.end()) return *it;
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  families_.push_back(std::move(f));
  return families_.back();
}

void Families::declare(const std::string& name, const std::string& help, MetricType type) {
  family(name, help, type);
}

void Families::counter(const std::string& name, const std::string& help, const Labels& labels,
                       double value) {
  ClientMetric m = with_labels(labels);
  m.counter.value = value;
  family(name, help, MetricType::Counter).metric.push_back(std::move(m));
}

void Families::gauge(const std::string& name, const std::string& help, const Labels& labels,
                     double value) {
  ClientMetric m = with_labels(labels);
  m.gauge.value = value;
  family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
}

void Families::histogram(const std::string& name, const std::string& help, const Labels& labels,
                         const HistogramSnapshot& h) {
  ClientMetric m = with_labels(labels);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.bounds.size() && i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    m.histogram.bucket.push_back({cumulative, h.bounds[i]});
  }
  // The serializer adds the +Inf bucket from sample_count.
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum;
  family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
}

std::string Families::text() const { return serialize(families_); }

std::string serialize(const std::vector<MetricFamily>& families) {
  std::ostringstream s;
  prometheus::TextSerializer().Serialize(s, families);
  return s.str();
}

void add_engine_metrics(Families& out, const std::string& prefix, const EngineMetrics& m,
                        const Labels& l) {
  const std::string p = prefix + "_";
  auto counter = [&](const char* name, const char* help, std::uint64_t v) {
    out.counter(p + name, help, l, static_cast<double>(v));
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out.gauge(p + name, help, l, v);
  };
  auto by_reason = [&](const char* name, const char* help,
                       const std::map<std::string, std::uint64_t>& counts) {
    for (const auto& [reason, n] : counts) {
      out.counter(p + name, help, plus(l, "reason", reason), static_cast<double>(n));
    }
    if (counts.empty()) out.counter(p + name, help, plus(l, "reason", "none"), 0);
  };
  counter("inference_request_accepted", "Requests accepted by the engine", m.submitted);
  counter("inference_request_success", "Requests completed successfully", m.completed);
  by_reason("inference_request_failure", "Requests that ended in an error, by reason",
            m.failures_by_reason);
  by_reason("inference_request_rejected", "Requests refused at submit, by reason",
            m.rejections_by_reason);
  counter("inference_request_timed_out", "Requests that passed their deadline", m.timed_out);
  counter("inference_request_cancelled", "Requests cancelled (by the caller, or its client gone)",
          m.cancelled);
  counter("inference_request_shut_down", "Requests ended by shutdown", m.shut_down);
  counter("inference_exec_count", "Batches executed", m.batches);
  counter("inference_attempts", "Request executions, first attempts included", m.attempts);
  counter("inference_retries", "Retries scheduled", m.retries);
  counter("inference_retries_denied", "Retries refused by the retry budget",
          m.retries_denied_by_budget);
  counter("inference_late_completions", "Results that arrived after their request ended",
          m.late_completions);
  by_reason("inference_late_failures", "Failures that arrived after their request ended, by reason",
            m.late_failures_by_reason);
  counter("inference_callback_exceptions", "Exceptions thrown by user callbacks",
          m.callback_exceptions);
  counter("inference_model_exceptions", "Exceptions thrown by the model", m.model_exceptions);
  counter("inference_watchdog_fired", "Batches failed by the hang watchdog", m.watchdog_fired);
  gauge("inference_queue_depth", "Requests waiting in the queue",
        static_cast<double>(m.queue_depth));
  gauge("inference_pending_request_count", "Requests accepted and not yet ended",
        static_cast<double>(m.inflight_requests));
  gauge("inference_retry_waiting", "Requests waiting for their retry backoff",
        static_cast<double>(m.retry_waiting));
  gauge("sequences_live", "Sequence batching: live sequences (holding a slot or waiting for one)",
        static_cast<double>(m.sequences_live));
  gauge("sequence_backlog", "Sequence batching: sequences waiting for a free slot",
        static_cast<double>(m.sequence_backlog));
  counter("sequences_idle_released",
          "Sequence batching: slots freed because their sequence was idle past "
          "max_sequence_idle_microseconds",
          m.sequences_idle_released);
  counter("sequence_backlog_expired",
          "Sequence batching: backlogged sequences whose request timeout expired",
          m.sequence_backlog_expired);
  gauge("result_store_size", "Entries of the id-based API's result store",
        static_cast<double>(m.result_store_size));
  gauge("ordered_backlog_total",
        "Ordered delivery: requests accepted and not yet delivered, all keys",
        static_cast<double>(m.ordered_backlog_total));
  const std::string backlog = p + "ordered_backlog";
  const char* backlog_help =
      "Ordered delivery: requests accepted and not yet delivered, per sequence key (the 64 "
      "largest)";
  out.declare(backlog, backlog_help, MetricType::Gauge);
  for (const auto& [key, n] : m.ordered_backlog) {
    out.gauge(backlog, backlog_help, plus(l, "key", key), static_cast<double>(n));
  }
  gauge("live_workers", "Workers that have not given up (healthy, recovering or paused)",
        static_cast<double>(m.live_workers));
  auto per_worker = [&](const char* name, const char* help, MetricType type, auto value) {
    out.declare(p + name, help, type);
    for (const WorkerMetrics& w : m.workers) {
      const Labels lw = plus(l, "worker", std::to_string(w.index));
      const double v = value(w);
      if (type == MetricType::Counter) {
        out.counter(p + name, help, lw, v);
      } else {
        out.gauge(p + name, help, lw, v);
      }
    }
  };
  per_worker("worker_breaker_open", "1 while the worker's circuit breaker is open or half open",
             MetricType::Gauge,
             [](const WorkerMetrics& w) { return w.breaker == "closed" ? 0.0 : 1.0; });
  per_worker("worker_healthy", "1 while the worker is healthy (serving)", MetricType::Gauge,
             [](const WorkerMetrics& w) { return w.health == "healthy" ? 1.0 : 0.0; });
  const std::string health = p + "worker_health";
  const char* health_help = "The worker's health, one series per state";
  out.declare(health, health_help, MetricType::Gauge);
  for (const WorkerMetrics& w : m.workers) {
    for (const char* state : {"healthy", "recovering", "paused", "unhealthy"}) {
      out.gauge(health, health_help,
                plus(plus(l, "worker", std::to_string(w.index)), "state", state),
                w.health == state ? 1 : 0);
    }
  }
  auto as_double = [](auto v) { return static_cast<double>(v); };
  per_worker("worker_batches", "Batches executed by the worker", MetricType::Counter,
             [&](const WorkerMetrics& w) { return as_double(w.batches); });
  per_worker("worker_recycles", "Stream and model instance replaced after a hang",
             MetricType::Counter, [&](const WorkerMetrics& w) { return as_double(w.recycles); });
  per_worker("worker_recycle_failures", "Failed attempts to create a replacement instance",
             MetricType::Counter,
             [&](const WorkerMetrics& w) { return as_double(w.recycle_failures); });
  per_worker("worker_inflight_batches", "Batches holding one of the worker's in-flight slots",
             MetricType::Gauge,
             [&](const WorkerMetrics& w) { return as_double(w.inflight_batches); });
  per_worker("worker_stream_batches",
             "Batches launched on the worker's streams and not yet complete, abandoned ones "
             "included",
             MetricType::Gauge,
             [&](const WorkerMetrics& w) { return as_double(w.stream_batches); });
  per_worker("worker_abandoned_instances",
             "Replaced model instances whose work still runs (not yet destroyed)",
             MetricType::Gauge,
             [&](const WorkerMetrics& w) { return as_double(w.abandoned_instances); });
  out.histogram(p + "inference_queue_duration_us", "Time requests spent queued (us)", l,
                m.queue_us);
  out.histogram(p + "inference_compute_infer_duration_us", "Time batches spent on the device (us)",
                l, m.compute_us);
  out.histogram(p + "inference_request_duration_us", "Submit to the end of the request (us)", l,
                m.request_us);
  out.histogram(p + "inference_batch_size", "Rows per executed batch", l, m.batch_size);
  // Triton's statistics (the server's GET .../stats and ModelStatistics), from the same
  // snapshot's counters.
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
        std::pair{"cache_hit", &m.stats.cache_hit}, std::pair{"cache_miss", &m.stats.cache_miss}}) {
    const Labels ls = plus(l, "statistic", name);
    out.counter(p + "inference_statistics_requests",
                "Requests counted in each of Triton's statistics (GET /v2/models/{m}/stats)", ls,
                static_cast<double>(d->count));
    out.counter(p + "inference_statistics_duration_ns",
                "Total nanoseconds of each of Triton's statistics (GET /v2/models/{m}/stats)", ls,
                static_cast<double>(d->ns));
  }
}

}  // namespace asyncinfer::metrics
