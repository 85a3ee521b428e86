// Engine stress: exactly-once under concurrent producers and random cancels; bounded result
// store; flat memory. Run under the asan and tsan presets by scripts/test.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <random>
#include <thread>

#include "asyncinfer/engine.hpp"
#include "engine_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::make_engine;
using testing::one;

TEST(EngineStress, EightProducersHundredThousandEachExactlyOnceWithRandomCancels) {
  EngineOptions o;
  o.workers = 2;
  o.queue_capacity = 1 << 16;
  o.queue_full_policy = QueueFullPolicy::block;
  o.completion_threads = 2;
  auto engine = make_engine("builtin:identity", "cpu", o);
  constexpr int kProducers = 8;
  constexpr int kEach = 100'000;
  std::vector<std::atomic<std::uint8_t>> calls(static_cast<std::size_t>(kProducers) * kEach);
  std::atomic<std::uint64_t> ok{0}, cancelled{0}, wrong{0};
  auto producer = [&](int p) {
    std::mt19937 rng(static_cast<unsigned>(p));
    std::deque<Future<Outputs>> window;
    for (int i = 0; i < kEach; ++i) {
      const std::size_t id = static_cast<std::size_t>(p) * kEach + i;
      auto f = engine->submit(one(static_cast<float>(i)));
      f.on_complete([&, id, i](const Result<Outputs>& r) {
        calls[id].fetch_add(1, std::memory_order_relaxed);
        if (r.ok()) {
          if (testing::first_value(*r) != static_cast<float>(i)) wrong++;
          ok++;
        } else if (r.status().code() == StatusCode::cancelled) {
          cancelled++;
        } else {
          wrong++;
        }
      });
      window.push_back(std::move(f));
      if (rng() % 10 == 0) {
        window[rng() % window.size()].cancel();  // may race completion: either outcome is fine
      }
      if (window.size() > 256) window.pop_front();
    }
    for (auto& f : window) f.wait();
  };
  {
    std::vector<std::jthread> ts;
    for (int p = 0; p < kProducers; ++p) ts.emplace_back(producer, p);
  }
  engine->shutdown(ShutdownMode::drain);
  std::size_t not_once = 0;
  for (auto& c : calls) not_once += c.load() != 1 ? 1 : 0;
  EXPECT_EQ(not_once, 0u);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(ok + cancelled, static_cast<std::uint64_t>(kProducers) * kEach);
  const auto m = engine->metrics();
  EXPECT_EQ(m.completed, ok.load());
  EXPECT_EQ(m.cancelled, cancelled.load());
  EXPECT_EQ(m.rejected, 0u);
  EXPECT_GT(cancelled.load(), 0u);
}

TEST(EngineStress, ResultStoreStaysBoundedOverAMillionUnfetchedRequests) {
  EngineOptions o;
  o.workers = 2;
  o.result_store_capacity = 1000;
  o.queue_capacity = 1 << 14;
  o.queue_full_policy = QueueFullPolicy::block;
  auto engine = make_engine("builtin:identity", "cpu", o);
  constexpr int kN = 1'000'000;
  long rss_at_100k = 0;
  int refused = 0;
  for (int i = 0; i < kN; ++i) {
    Status s = engine->submit("r" + std::to_string(i), one(1));
    if (!s.ok()) {
      // The store holds at most 1000 entries; when all are still running, it says so.
      ASSERT_EQ(s.code(), StatusCode::resource_exhausted) << s;
      ++refused;
      std::this_thread::sleep_for(50us);
      --i;
      continue;
    }
    if (i == 100'000) rss_at_100k = testing::process_rss_kib();
  }
  engine->shutdown(ShutdownMode::drain);
  const long rss_end = testing::process_rss_kib();
  EXPECT_EQ(engine->status("r0"), RequestState::unknown);  // evicted long ago, and forgotten
  // Recently evicted ids are still explained (tombstones are bounded too). Which ids those are
  // depends on timing: an entry is evicted when a newer one needs its place after it finished,
  // so one that a descheduled worker held while the last requests went through stays (it once
  // made a check of one fixed id fail under load). Among the last 3,000 ids, 2,000 or so were
  // evicted, and the tombstones remember the last result_store_capacity of them.
  int explained = 0;
  for (int i = kN - 3000; i < kN; ++i) {
    const Status s = engine->result("r" + std::to_string(i), 1ms).status();
    if (s.message().find("evicted") != std::string_view::npos) ++explained;
  }
  EXPECT_GE(explained, 900) << "of the last 3000 ids, evicted ones explained";
  EXPECT_EQ(engine->status("r" + std::to_string(kN - 1)), RequestState::completed);
  // Memory stays flat: 900,000 more requests added less than 32 MiB. (Not under the sanitizers:
  // ASan's quarantine and TSan's shadow memory grow with every allocation, bounded store or not;
  // the eviction checks above still run there.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(rss_end - rss_at_100k, 32 * 1024)
      << "RSS grew from " << rss_at_100k << " KiB to " << rss_end << " KiB";
#else
  RecordProperty("rss_growth_kib_under_sanitizer", static_cast<int>(rss_end - rss_at_100k));
#endif
  const auto m = engine->metrics();
  EXPECT_EQ(m.completed, static_cast<std::uint64_t>(kN));
  RecordProperty("refused_while_full", refused);
}

}  // namespace
}  // namespace asyncinfer
