// stats.hpp — exact statistics over the latency samples that `asyncinfer bench` keeps.
//
// Percentiles are by NEAREST RANK (no interpolation): for n sorted samples x[1..n] and
// 0 < q <= 1, the q-quantile is x[rank] with rank = ceil(q × n) (1-based), clamped to 1..n.
// So p99 of [10, 20, 30] is 30, p50 of 1..100 is 50, p99 of 1..100 is 99, and one sample is
// every percentile of itself. q × n is taken with a tolerance of 1e-9 so that a product that is
// an integer in exact arithmetic (0.99 × 100) is not pushed to the next rank by rounding.
// Zero samples have no percentile: the functions return std::nullopt (the table prints
// "no samples", the JSON null).
//
// Header-only for the percentile itself, so tests include it directly; stats.cpp holds the
// helpers for the report (CDF points, histograms of the samples).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace asyncinfer::cli {

/// The 1-based nearest rank of the q-quantile of n samples: ceil(q × n) clamped to 1..n.
/// 0 when n == 0. q is clamped to [0, 1] (q = 0 gives rank 1, the minimum).
inline std::size_t nearest_rank(double q, std::size_t n) noexcept {
  if (n == 0) return 0;
  if (!(q > 0)) return 1;  // also NaN
  if (q >= 1) return n;
  const double exact = q * static_cast<double>(n);
  const double r = std::ceil(exact - 1e-9);
  if (r < 1) return 1;
  if (r >= static_cast<double>(n)) return n;
  return static_cast<std::size_t>(r);
}

/// The q-quantile of ascending `sorted` by nearest rank; nullopt when empty.
inline std::optional<double> percentile_sorted(std::span<const double> sorted, double q) noexcept {
  const std::size_t rank = nearest_rank(q, sorted.size());
  if (rank == 0) return std::nullopt;
  return sorted[rank - 1];
}

/// The q-quantile of unsorted `samples` by nearest rank (copies and partially sorts; use
/// percentile_sorted for many quantiles of one set). nullopt when empty.
inline std::optional<double> percentile(std::span<const double> samples, double q) {
  const std::size_t rank = nearest_rank(q, samples.size());
  if (rank == 0) return std::nullopt;
  std::vector<double> v(samples.begin(), samples.end());
  auto nth = v.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(v.begin(), nth, v.end());
  return *nth;
}

/// Summary of one run's latencies (µs). Every field is nullopt when there are no samples.
struct LatencySummary {
  std::size_t count = 0;
  std::optional<double> min, mean, p50, p90, p95, p99, p999, max;
};

/// Sorts `samples` in place (ascending) and summarises them.
inline LatencySummary summarize(std::vector<double>& samples) {
  std::sort(samples.begin(), samples.end());
  LatencySummary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  const std::span<const double> v(samples);
  double sum = 0;
  for (double x : v) sum += x;
  s.min = v.front();
  s.max = v.back();
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = percentile_sorted(v, 0.50);
  s.p90 = percentile_sorted(v, 0.90);
  s.p95 = percentile_sorted(v, 0.95);
  s.p99 = percentile_sorted(v, 0.99);
  s.p999 = percentile_sorted(v, 0.999);
  return s;
}

/// One point of an empirical CDF: fraction of samples <= value.
struct CdfPoint {
  double value = 0;
  double fraction = 0;
};

/// At most `max_points` points of the empirical CDF of ascending `sorted` (always including the
/// minimum and the maximum); empty when there are no samples. For the HTML report.
std::vector<CdfPoint> cdf_points(std::span<const double> sorted, std::size_t max_points = 256);

/// A histogram of ascending `sorted` in `bins` log-spaced bins between the minimum and the
/// maximum (linear when they are equal or the minimum is <= 0). For the HTML report.
struct HistogramBins {
  std::vector<double> edges;          ///< bins + 1 ascending edges
  std::vector<std::uint64_t> counts;  ///< bins
};
HistogramBins histogram_bins(std::span<const double> sorted, std::size_t bins = 40);

}  // namespace asyncinfer::cli
