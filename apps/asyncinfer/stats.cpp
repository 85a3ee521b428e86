// stats.cpp — report helpers over sorted samples (see stats.hpp).
#include "stats.hpp"

namespace asyncinfer::cli {

std::vector<CdfPoint> cdf_points(std::span<const double> sorted, std::size_t max_points) {
  std::vector<CdfPoint> out;
  const std::size_t n = sorted.size();
  if (n == 0) return out;
  if (max_points < 2) max_points = 2;
  const auto nd = static_cast<double>(n);
  if (n <= max_points) {
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      // Only the last of equal values carries the step's height.
      if (i + 1 < n && sorted[i + 1] == sorted[i]) continue;
      out.push_back({sorted[i], static_cast<double>(i + 1) / nd});
    }
    return out;
  }
  // Evenly spaced ranks, plus a denser tail (p90..max) where latency plots are read.
  out.reserve(max_points + 1);
  const std::size_t body = max_points / 2;
  const std::size_t tail = max_points - body;
  auto push_rank = [&](std::size_t rank) {  // 1-based
    rank = std::clamp<std::size_t>(rank, 1, n);
    const CdfPoint p{sorted[rank - 1], static_cast<double>(rank) / nd};
    if (!out.empty() && out.back().value == p.value) {
      out.back().fraction = std::max(out.back().fraction, p.fraction);
      return;
    }
    if (!out.empty() && out.back().fraction >= p.fraction) return;
    out.push_back(p);
  };
  for (std::size_t i = 0; i <= body; ++i) {
    const double q = 0.9 * static_cast<double>(i) / static_cast<double>(body);
    push_rank(nearest_rank(q, n));
  }
  for (std::size_t i = 1; i <= tail; ++i) {
    // q from 0.9 to 1 with spacing shrinking towards 1: 1 - 0.1 × 10^(-3i/tail).
    const double q =
        1.0 - 0.1 * std::pow(10.0, -3.0 * static_cast<double>(i) / static_cast<double>(tail));
    push_rank(nearest_rank(q, n));
  }
  push_rank(n);
  return out;
}

HistogramBins histogram_bins(std::span<const double> sorted, std::size_t bins) {
  HistogramBins h;
  if (sorted.empty() || bins == 0) return h;
  const double lo = sorted.front();
  const double hi = sorted.back();
  h.counts.assign(bins, 0);
  h.edges.resize(bins + 1);
  const bool log_scale = lo > 0 && hi > lo;
  const double a = log_scale ? std::log(lo) : lo;
  const double b = log_scale ? std::log(hi) : (hi > lo ? hi : lo + 1);
  for (std::size_t i = 0; i <= bins; ++i) {
    const double t = a + (b - a) * static_cast<double>(i) / static_cast<double>(bins);
    h.edges[i] = log_scale ? std::exp(t) : t;
  }
  h.edges.front() = lo;
  if (hi > lo) h.edges.back() = hi;
  std::size_t bin = 0;
  for (double x : sorted) {  // ascending: the bin index only moves forward
    while (bin + 1 < bins && x >= h.edges[bin + 1]) ++bin;
    ++h.counts[bin];
  }
  return h;
}

}  // namespace asyncinfer::cli
