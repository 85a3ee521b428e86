#include "asyncinfer/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>

namespace asyncinfer {
namespace {
std::vector<double> default_bounds() {
  std::vector<double> b;
  for (double decade = 1; decade <= 1e8; decade *= 10) {
    b.push_back(decade);
    if (decade < 1e8) {
      b.push_back(2 * decade);
      b.push_back(5 * decade);
    }
  }
  return b;
}

std::string fmt(double v) {
  char buf[64];
  if (std::isinf(v)) return "+Inf";
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
std::string label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

double HistogramSnapshot::percentile(double q) const noexcept {
  if (count == 0) return 0;
  const double rank = std::ceil(q * static_cast<double>(count));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (static_cast<double>(seen) >= rank) {
      return i < bounds.size() ? std::min(bounds[i], max) : max;
    }
  }
  return max;
}

Histogram::Histogram() : Histogram(default_bounds()) {}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

std::vector<double> Histogram::batch_size_bounds() {
  return {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024};
}

void Histogram::observe(double value) noexcept {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  counts_[static_cast<std::size_t>(it - bounds_.begin())].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  double cur = max_.load(std::memory_order_relaxed);
  while (value > cur && !max_.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

HistogramSnapshot Histogram::snapshot() const {
  HistogramSnapshot s;
  s.bounds = bounds_;
  s.counts.reserve(counts_.size());
  for (const auto& c : counts_) s.counts.push_back(c.load(std::memory_order_relaxed));
  s.count = 0;
  for (auto c : s.counts) s.count += c;
  s.sum = sum_.load(std::memory_order_relaxed);
  s.max = max_.load(std::memory_order_relaxed);
  return s;
}

void append_prometheus_histogram(std::string& out, std::string_view name, std::string_view help,
                                 const HistogramSnapshot& h, std::string_view labels) {
  // Built with append() rather than chains of operator+: GCC 12 at -O3 reports a false
  // -Wrestrict on such chains (GCC bug 105329).
  auto line = [&out](std::initializer_list<std::string_view> parts) {
    for (std::string_view p : parts) out.append(p);
    out.push_back('\n');
  };
  line({"# HELP ", name, " ", help});
  line({"# TYPE ", name, " histogram"});
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    const double le = i < h.bounds.size() ? h.bounds[i] : INFINITY;
    const std::string le_text = fmt(le);
    const std::string count_text = std::to_string(cumulative);
    line({name, "_bucket{", labels, labels.empty() ? "" : ",", "le=\"", le_text, "\"} ",
          count_text});
  }
  const std::string sum_text = fmt(h.sum);
  const std::string total_text = std::to_string(h.count);
  const std::string_view open = labels.empty() ? "" : "{";
  const std::string_view close = labels.empty() ? "" : "}";
  line({name, "_sum", open, labels, close, " ", sum_text});
  line({name, "_count", open, labels, close, " ", total_text});
}

std::string EngineMetrics::to_prometheus(std::string_view prefix) const {
  const std::string p(prefix);
  const std::string model_label = "model=\"" + label_value(model) + "\"";
  std::string out;
  auto counter = [&](const std::string& name, const std::string& help, std::uint64_t v,
                     const std::string& extra = "") {
    out += "# HELP " + p + "_" + name + " " + help + "\n# TYPE " + p + "_" + name + " counter\n";
    out += p + "_" + name + "{" + model_label + extra + "} " + std::to_string(v) + "\n";
  };
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + p + "_" + name + " " + help + "\n# TYPE " + p + "_" + name + " gauge\n";
    out += p + "_" + name + "{" + model_label + "} " + fmt(v) + "\n";
  };
  counter("inference_request_success", "Requests completed successfully", completed);
  out += "# HELP " + p + "_inference_request_failure Requests that ended in an error, by reason\n";
  out += "# TYPE " + p + "_inference_request_failure counter\n";
  for (const auto& [reason, n] : failures_by_reason) {
    out += p + "_inference_request_failure{" + model_label + ",reason=\"" + reason + "\"} " +
           std::to_string(n) + "\n";
  }
  out += "# HELP " + p + "_inference_request_rejected Requests refused at submit, by reason\n";
  out += "# TYPE " + p + "_inference_request_rejected counter\n";
  for (const auto& [reason, n] : rejections_by_reason) {
    out += p + "_inference_request_rejected{" + model_label + ",reason=\"" + reason + "\"} " +
           std::to_string(n) + "\n";
  }
  counter("inference_request_timed_out", "Requests that passed their deadline", timed_out);
  counter("inference_request_cancelled", "Requests cancelled by the caller", cancelled);
  counter("inference_request_shut_down", "Requests resolved by shutdown", shut_down);
  counter("inference_exec_count", "Batches executed", batches);
  counter("inference_attempts", "Request executions, first attempts included", attempts);
  counter("inference_retries", "Retries scheduled", retries);
  counter("inference_retries_denied", "Retries refused by the retry budget",
          retries_denied_by_budget);
  counter("inference_late_completions", "Results that arrived after their request ended",
          late_completions);
  out += "# HELP " + p +
         "_inference_late_failures Failures that arrived after their request ended, by reason\n";
  out += "# TYPE " + p + "_inference_late_failures counter\n";
  for (const auto& [reason, n] : late_failures_by_reason) {
    out += p + "_inference_late_failures{" + model_label + ",reason=\"" + reason + "\"} " +
           std::to_string(n) + "\n";
  }
  counter("inference_callback_exceptions", "Exceptions thrown by user callbacks",
          callback_exceptions);
  counter("inference_model_exceptions", "Exceptions thrown by the model", model_exceptions);
  counter("inference_watchdog_fired", "Batches failed by the hang watchdog", watchdog_fired);
  gauge("inference_queue_depth", "Requests waiting in the queue", static_cast<double>(queue_depth));
  gauge("inference_pending_request_count", "Requests accepted and not yet ended",
        static_cast<double>(inflight_requests));
  gauge("inference_retry_waiting", "Requests waiting for their retry backoff",
        static_cast<double>(retry_waiting));
  gauge("result_store_size", "Entries of the id-based API's result store",
        static_cast<double>(result_store_size));
  gauge("ordered_backlog_total",
        "Ordered delivery: requests accepted and not yet delivered, all keys",
        static_cast<double>(ordered_backlog_total));
  out += "# HELP " + p +
         "_ordered_backlog Ordered delivery: requests accepted and not yet delivered, per "
         "sequence key (the 64 largest)\n";
  out += "# TYPE " + p + "_ordered_backlog gauge\n";
  for (const auto& [key, n] : ordered_backlog) {
    out += p + "_ordered_backlog{" + model_label + ",key=\"" + label_value(key) + "\"} " +
           std::to_string(n) + "\n";
  }
  gauge("live_workers", "Workers that have not given up (healthy, recovering or paused)",
        static_cast<double>(live_workers));
  // Per worker, one metric family at a time (the text format wants each family in one group).
  auto per_worker = [&](const std::string& name, const std::string& help, const char* type,
                        auto value) {
    out +=
        "# HELP " + p + "_" + name + " " + help + "\n# TYPE " + p + "_" + name + " " + type + "\n";
    for (const WorkerMetrics& w : workers) {
      out += p + "_" + name + "{" + model_label + ",worker=\"" + std::to_string(w.index) + "\"} " +
             value(w) + "\n";
    }
  };
  per_worker("worker_breaker_open", "1 while the worker's circuit breaker is open or half open",
             "gauge",
             [](const WorkerMetrics& w) { return std::string(w.breaker == "closed" ? "0" : "1"); });
  per_worker("worker_healthy", "1 while the worker is healthy (serving)", "gauge",
             [](const WorkerMetrics& w) { return std::string(w.health == "healthy" ? "1" : "0"); });
  out += "# HELP " + p + "_worker_health The worker's health, one series per state\n";
  out += "# TYPE " + p + "_worker_health gauge\n";
  for (const WorkerMetrics& w : workers) {
    for (const char* state : {"healthy", "recovering", "paused", "unhealthy"}) {
      out += p + "_worker_health{" + model_label + ",worker=\"" + std::to_string(w.index) +
             "\",state=\"" + state + "\"} " + (w.health == state ? "1" : "0") + "\n";
    }
  }
  per_worker("worker_batches", "Batches executed by the worker", "counter",
             [](const WorkerMetrics& w) { return std::to_string(w.batches); });
  per_worker("worker_recycles", "Stream and model instance replaced after a hang", "counter",
             [](const WorkerMetrics& w) { return std::to_string(w.recycles); });
  per_worker("worker_recycle_failures", "Failed attempts to create a replacement instance",
             "counter", [](const WorkerMetrics& w) { return std::to_string(w.recycle_failures); });
  per_worker("worker_inflight_batches", "Batches holding one of the worker's in-flight slots",
             "gauge", [](const WorkerMetrics& w) { return std::to_string(w.inflight_batches); });
  per_worker("worker_stream_batches",
             "Batches launched on the worker's streams and not yet complete, abandoned ones "
             "included",
             "gauge", [](const WorkerMetrics& w) { return std::to_string(w.stream_batches); });
  per_worker("worker_abandoned_instances",
             "Replaced model instances whose work still runs (not yet destroyed)", "gauge",
             [](const WorkerMetrics& w) { return std::to_string(w.abandoned_instances); });
  append_prometheus_histogram(out, p + "_inference_queue_duration_us",
                              "Time requests spent queued (us)", queue_us, model_label);
  append_prometheus_histogram(out, p + "_inference_compute_infer_duration_us",
                              "Time batches spent on the device (us)", compute_us, model_label);
  append_prometheus_histogram(out, p + "_inference_request_duration_us",
                              "Submit to terminal state (us)", request_us, model_label);
  append_prometheus_histogram(out, p + "_inference_batch_size", "Rows per executed batch",
                              batch_size, model_label);
  return out;
}

}  // namespace asyncinfer
