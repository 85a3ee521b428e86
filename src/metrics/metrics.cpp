#include "asyncinfer/metrics.hpp"

#include "metrics/prometheus_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

std::string EngineMetrics::to_prometheus(std::string_view prefix) const {
  metrics::Families out;
  metrics::add_engine_metrics(out, std::string(prefix), *this, {{"model", model}});
  return out.text();
}

}  // namespace asyncinfer
