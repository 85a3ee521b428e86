// Unit tests of the CLI's pieces: nearest-rank percentiles (stats.hpp), report helpers, and the
// option checks of `asyncinfer bench` (bench_options.hpp).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_options.hpp"
#include "contention.hpp"
#include "stats.hpp"

namespace asyncinfer::cli {
namespace {

TEST(NearestRank, SmallCases) {
  const std::vector<double> three = {10, 20, 30};
  EXPECT_EQ(percentile_sorted(three, 0.99), 30);
  EXPECT_EQ(percentile_sorted(three, 0.50), 20);
  EXPECT_EQ(percentile_sorted(three, 0.34), 20);  // ceil(1.02) = 2
  EXPECT_EQ(percentile_sorted(three, 0.33), 10);  // ceil(0.99) = 1
  EXPECT_EQ(percentile_sorted(three, 1.0), 30);
  EXPECT_EQ(percentile_sorted(three, 0.0), 10);  // q = 0: the minimum

  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(percentile_sorted(hundred, 0.99), 99);
  EXPECT_EQ(percentile_sorted(hundred, 0.50), 50);
  EXPECT_EQ(percentile_sorted(hundred, 0.90), 90);
  EXPECT_EQ(percentile_sorted(hundred, 0.95), 95);
  EXPECT_EQ(percentile_sorted(hundred, 0.999), 100);  // ceil(99.9)
  EXPECT_EQ(percentile_sorted(hundred, 0.01), 1);
  EXPECT_EQ(percentile_sorted(hundred, 0.011), 2);

  std::vector<double> thousand;
  for (int i = 1; i <= 1000; ++i) thousand.push_back(i);
  EXPECT_EQ(percentile_sorted(thousand, 0.999), 999);  // 0.999 × 1000 is exactly 999
  EXPECT_EQ(percentile_sorted(thousand, 0.99), 990);
  EXPECT_EQ(percentile_sorted(thousand, 0.7), 700);
}

TEST(NearestRank, OneSampleIsEveryPercentile) {
  const std::vector<double> one = {42.5};
  for (double q : {0.0, 0.001, 0.5, 0.9, 0.99, 0.999, 1.0}) {
    EXPECT_EQ(percentile_sorted(one, q), 42.5) << q;
    EXPECT_EQ(percentile(one, q), 42.5) << q;
  }
}

TEST(NearestRank, ZeroSamplesHaveNoPercentile) {
  const std::vector<double> none;
  EXPECT_FALSE(percentile_sorted(none, 0.5).has_value());
  EXPECT_FALSE(percentile(none, 0.99).has_value());
  EXPECT_EQ(nearest_rank(0.5, 0), 0U);
  std::vector<double> empty;
  const LatencySummary s = summarize(empty);
  EXPECT_EQ(s.count, 0U);
  EXPECT_FALSE(s.p50 || s.p90 || s.p95 || s.p99 || s.p999 || s.max || s.min || s.mean);
}

TEST(NearestRank, RankIsClampedAndMonotonic) {
  for (std::size_t n : {1U, 2U, 3U, 7U, 10U, 99U, 100U, 101U, 1000U, 12345U}) {
    std::size_t prev = 1;
    for (int k = 0; k <= 1000; ++k) {
      const double q = k / 1000.0;
      const std::size_t r = nearest_rank(q, n);
      EXPECT_GE(r, 1U);
      EXPECT_LE(r, n);
      EXPECT_GE(r, prev) << "n=" << n << " q=" << q;
      prev = r;
    }
    EXPECT_EQ(nearest_rank(1.0, n), n);
    EXPECT_EQ(nearest_rank(2.0, n), n);
    EXPECT_EQ(nearest_rank(-1.0, n), 1U);
  }
}

// Against an independent reference: the q-quantile (q = k/1000) is the smallest sample x such that
// at least q × n samples are <= x, computed with integers only: rank = ceil(k × n / 1000).
TEST(NearestRank, MatchesSortedReferenceOn100kRandomValues) {
  std::mt19937_64 rng(12345);
  std::lognormal_distribution<double> dist(4.0, 1.0);  // latency-like, with a long tail
  std::vector<double> values(100'000);
  for (double& v : values) v = dist(rng);
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const std::uint64_t n = sorted.size();
  for (std::uint64_t k = 1; k <= 1000; ++k) {
    const std::uint64_t rank = (k * n + 999) / 1000;  // ceil(k n / 1000), exact
    const double want = sorted[rank - 1];
    const double q = static_cast<double>(k) / 1000.0;
    ASSERT_EQ(percentile_sorted(sorted, q), want) << "q=" << q;
    if (k % 50 == 0) {
      ASSERT_EQ(percentile(values, q), want) << "q=" << q;  // unsorted input
    }
  }
  std::vector<double> copy = values;
  const LatencySummary s = summarize(copy);
  EXPECT_TRUE(std::is_sorted(copy.begin(), copy.end()));
  EXPECT_EQ(s.count, n);
  EXPECT_EQ(s.p50, sorted[50'000 - 1]);
  EXPECT_EQ(s.p90, sorted[90'000 - 1]);
  EXPECT_EQ(s.p95, sorted[95'000 - 1]);
  EXPECT_EQ(s.p99, sorted[99'000 - 1]);
  EXPECT_EQ(s.p999, sorted[99'900 - 1]);
  EXPECT_EQ(s.max, sorted.back());
  EXPECT_EQ(s.min, sorted.front());
}

TEST(ReportHelpers, CdfIsMonotonicAndEndsAtOne) {
  std::vector<double> v;
  for (int i = 0; i < 5000; ++i) v.push_back((i * 7919) % 1000 + 1);
  std::sort(v.begin(), v.end());
  const auto cdf = cdf_points(v, 128);
  ASSERT_FALSE(cdf.empty());
  EXPECT_LE(cdf.size(), 130U);
  EXPECT_EQ(cdf.back().value, v.back());
  EXPECT_DOUBLE_EQ(cdf.back().fraction, 1.0);
  for (std::size_t i = 1; i < cdf.size(); ++i) {
    EXPECT_GT(cdf[i].value, cdf[i - 1].value);
    EXPECT_GT(cdf[i].fraction, cdf[i - 1].fraction);
  }
  EXPECT_TRUE(cdf_points(std::vector<double>{}).empty());
  const auto small = cdf_points(std::vector<double>{1, 1, 2}, 128);
  ASSERT_EQ(small.size(), 2U);
  EXPECT_NEAR(small[0].fraction, 2.0 / 3.0, 1e-12);
}

TEST(ReportHelpers, HistogramCountsEverySample) {
  std::vector<double> v;
  for (int i = 1; i <= 10000; ++i) v.push_back(i * 0.5);
  const HistogramBins h = histogram_bins(v, 25);
  ASSERT_EQ(h.counts.size(), 25U);
  ASSERT_EQ(h.edges.size(), 26U);
  std::uint64_t total = 0;
  for (auto c : h.counts) total += c;
  EXPECT_EQ(total, v.size());
  const HistogramBins flat = histogram_bins(std::vector<double>{3, 3, 3}, 10);
  std::uint64_t t2 = 0;
  for (auto c : flat.counts) t2 += c;
  EXPECT_EQ(t2, 3U);
}

// ---- --contention's busy load ------------------------------------------------------------------

/// The scheduler state of a process ('R' running, 'S' sleeping, ...), or 0 when it is gone.
char state_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '\0' : stat[close + 2];
}

TEST(BusyLoad, ChildrenSpinAndAreGoneOnceItIsDestroyed) {
  std::vector<pid_t> pids;
  {
    auto load = BusyLoad::start(2, std::chrono::milliseconds(60'000));
    ASSERT_TRUE(load.ok()) << load.status();
    pids = load->children();
    ASSERT_EQ(pids.size(), 2u);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (pid_t p : pids) EXPECT_EQ(state_of(p), 'R') << "a busy child is not running";
  }
  for (pid_t p : pids) {
    EXPECT_EQ(kill(p, 0), -1) << "child " << p << " outlived the load";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(BusyLoad, EachChildStopsByItselfAfterItsLimit) {
  auto load = BusyLoad::start(1, std::chrono::milliseconds(30));
  ASSERT_TRUE(load.ok()) << load.status();
  const pid_t p = load->children().at(0);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (state_of(p) != 'Z' && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(state_of(p), 'Z') << "the busy child did not end after its 30 ms limit";
}

TEST(BenchOptionsParse, Dims) {
  auto d = parse_dims("1x32x32", "--input-shape");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, (std::vector<std::int64_t>{1, 32, 32}));
  for (const char* bad : {"", "x", "1x", "1xx2", "0", "-1", "1x-1", "a", "1.5", "2x3 "}) {
    auto r = parse_dims(bad, "--input-shape");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--input-shape"), std::string_view::npos);
    }
  }
  auto named = parse_input_shape("x:3x4");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->name, "x");
  EXPECT_EQ(named->dims, (std::vector<std::int64_t>{3, 4}));
  EXPECT_FALSE(parse_input_shape(":3").ok());
}

TEST(BenchOptionsParse, PriorityArrivalsDataAndModes) {
  EXPECT_EQ(parse_priority("").value().level, 0);
  EXPECT_FALSE(parse_priority("").value().mixed);
  EXPECT_TRUE(parse_priority("mixed").value().mixed);
  EXPECT_EQ(parse_priority("3").value().level, 3);
  EXPECT_EQ(parse_priority("3").value().to_string(), "3");
  EXPECT_FALSE(parse_priority("0").ok());
  EXPECT_FALSE(parse_priority("high").ok());
  EXPECT_EQ(parse_arrivals("constant").value(), Arrivals::constant);
  EXPECT_FALSE(parse_arrivals("bursty").ok());
  EXPECT_EQ(parse_data("zeros").value().kind, DataArg::Kind::zeros);
  EXPECT_EQ(parse_data("file:/x.raw").value().path, "/x.raw");
  EXPECT_EQ(parse_data("file:/x.raw").value().to_string(), "file:/x.raw");
  EXPECT_FALSE(parse_data("file:").ok());
  EXPECT_FALSE(parse_data("ones").ok());
  EXPECT_EQ(parse_mode("rate", "--mode", kAllModes).value(), Mode::rate);
  EXPECT_EQ(to_string(Mode::pipeline), "pipeline");
  auto sweep = parse_mode("sweep", "--compare", kRunModes);
  ASSERT_FALSE(sweep.ok());
  EXPECT_NE(sweep.status().message().find("--compare: unknown mode 'sweep'; expected one of sync, "
                                          "async, rate, pipeline"),
            std::string_view::npos)
      << sweep.status();
  EXPECT_EQ(parse_input_shape("x:3x4").value().to_string(), "x:3x4");
}

Status check(BenchOptions o) { return validate(o); }

BenchOptions base() {
  BenchOptions o;
  o.model = "builtin:identity";
  return o;
}

void expect_names(const Status& s, std::string_view option) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(option), std::string_view::npos) << s.message();
}

TEST(BenchOptionsValidate, DefaultsAndErrorsNameTheOption) {
  BenchOptions o = base();
  ASSERT_TRUE(validate(o).ok());
  EXPECT_EQ(o.duration_s, BenchOptions::kDefaultDurationS);

  BenchOptions m = base();
  m.mode = Mode::pipeline;  // needs --stages
  expect_names(check(m), "--stages");
  BenchOptions c = base();
  c.concurrency = {0};
  expect_names(check(c), "--concurrency");
  BenchOptions r = base();
  r.mode = Mode::rate;
  r.request_rate = {0};
  expect_names(check(r), "--request-rate");
  BenchOptions r2 = base();
  r2.mode = Mode::rate;
  expect_names(check(r2), "--request-rate");
  BenchOptions s = base();
  s.mode = Mode::sweep;
  expect_names(check(s), "--mode sweep");
  BenchOptions s2 = base();
  s2.mode = Mode::sweep;
  s2.concurrency = {1, 4, 16};
  s2.concurrency_given = true;
  EXPECT_TRUE(check(s2).ok());
  BenchOptions cmp = base();
  cmp.mode = Mode::sweep;
  cmp.compare = {Mode::sync, Mode::async};
  expect_names(check(cmp), "--compare");
  BenchOptions both = base();
  both.duration_s = 1;
  both.requests = 5;
  expect_names(check(both), "--duration-s");
  BenchOptions w = base();
  w.warmup = 3;
  w.warmup_s = 1;
  expect_names(check(w), "--warmup");
  BenchOptions p = base();
  p.priority.level = 4;  // above --priority-levels 3
  expect_names(check(p), "--priority");
  BenchOptions sh = base();
  sh.input_shapes = {InputShapeArg{"", {1}}, InputShapeArg{"", {2}}};
  expect_names(check(sh), "--input-shape");
  BenchOptions wk = base();
  wk.workers = -1;  // 0 is "auto"
  expect_names(check(wk), "--workers");
}

}  // namespace
TEST(BenchOptionsValidate, ThreadsAndContentionOptions) {
  BenchOptions t = base();
  t.intra_op_threads = -1;
  expect_names(check(t), "--intra-op-threads");
  BenchOptions c = base();
  c.contention = -1;
  expect_names(check(c), "--contention");
  BenchOptions r = base();
  r.contention = 1;
  r.contention_rounds = 0;
  expect_names(check(r), "--contention-rounds");
  BenchOptions cmp = base();
  cmp.contention = 1;
  cmp.compare = {Mode::sync, Mode::async};
  expect_names(check(cmp), "--contention");
  BenchOptions ok = base();
  ok.contention = 2;
  ok.workers = 0;  // auto
  EXPECT_TRUE(check(ok).ok());
}

}  // namespace asyncinfer::cli
