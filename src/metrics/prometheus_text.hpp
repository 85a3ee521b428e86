// prometheus_text.hpp (internal) — the one Prometheus exporter of the project: metric families
// built with prometheus-cpp's data model (prometheus::MetricFamily) and written by its
// TextSerializer (text exposition format 0.0.4). EngineMetrics::to_prometheus and
// PipelineMetrics::to_prometheus (the library and the Python module) and the server's /metrics
// (src/server/server_metrics.cpp) all build their families here, so a metric has one name, one
// help text and one set of labels wherever it is exported.
//
// prometheus-cpp's core (Debian's libprometheus-cpp-dev) is used for its data model and
// serializer only: no registry and no exposer (the server has its own HTTP port and the library
// none), so values are read from the snapshots the caller already holds.
//
// Thread safety: a Families is used by one thread; the functions are reentrant.
#pragma once

#include <prometheus/metric_family.h>

#include <string>
#include <utility>
#include <vector>

#include "asyncinfer/metrics.hpp"

namespace asyncinfer::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

/// Metric families by name, in the order first added: samples added under a name already seen
/// join its family, so the text has each family in one group whatever the order of adds.
class Families {
 public:
  void counter(const std::string& name, const std::string& help, const Labels& labels,
               double value);
  void gauge(const std::string& name, const std::string& help, const Labels& labels, double value);
  /// `h`'s buckets are per bucket (HistogramSnapshot); the family gets them cumulative, with
  /// the +Inf bucket from h.count.
  void histogram(const std::string& name, const std::string& help, const Labels& labels,
                 const HistogramSnapshot& h);
  /// Declares a family with no sample yet (a labelled family whose series come later, or never:
  /// its HELP and TYPE still tell a scraper that it exists).
  void declare(const std::string& name, const std::string& help, prometheus::MetricType type);

  const std::vector<prometheus::MetricFamily>& families() const noexcept { return families_; }
  std::vector<prometheus::MetricFamily> take() { return std::move(families_); }
  /// The text exposition format of every family.
  std::string text() const;

 private:
  prometheus::MetricFamily& family(const std::string& name, const std::string& help,
                                   prometheus::MetricType type);
  std::vector<prometheus::MetricFamily> families_;
};

/// The text exposition format of `families`.
std::string serialize(const std::vector<prometheus::MetricFamily>& families);

/// Every metric of an engine, as `<prefix>_<name>` with `labels` (e.g. model, version) on each
/// sample. Counters by reason get a series with reason="none" while there is none, so that an
/// alert sees 0 from the start.
void add_engine_metrics(Families& out, const std::string& prefix, const EngineMetrics& m,
                        const Labels& labels);

}  // namespace asyncinfer::metrics
