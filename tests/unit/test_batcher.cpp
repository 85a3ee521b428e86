// The batcher (src/engine/batcher.hpp) as a pure function: a queue built by hand, a made-up clock,
// no engine and no thread. Each case names the rule of batcher.hpp it checks.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/batcher.hpp"
#include "engine/request_queue.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;

const Clock::time_point t0 = Clock::time_point(std::chrono::hours(1000));

/// A queued request of `rows` rows of `features` f32 values (or i32 with `other_dtype`).
std::shared_ptr<Request> req(int level, Clock::time_point enqueued, std::int64_t rows = 1,
                             std::int64_t features = 4, bool other_dtype = false) {
  auto r = std::make_shared<Request>();
  r->level = level;
  r->rows = rows;
  r->enqueued = enqueued;
  r->submitted = enqueued;
  r->inputs.push_back(*Tensor::zeros(other_dtype ? DType::i32 : DType::f32, {rows, features}));
  r->shape_key = compute_shape_key(r->inputs, /*batched=*/true);
  r->stage.store(Stage::queued);
  return r;
}

struct Fixture {
  RequestQueue queue{3};
  std::vector<std::shared_ptr<Request>> all;
  std::vector<std::int64_t> preferred;
  BatcherConfig config;

  Fixture() {
    config.batched = true;
    config.max_rows = 8;
    config.max_queue_delay = 1ms;
  }
  Request* add(std::shared_ptr<Request> r) {
    all.push_back(r);
    queue.push_back(r);
    return r.get();
  }
  BatchPlan plan(Clock::time_point now) {
    config.preferred_batch_sizes = preferred;
    return plan_batch(queue, config, now);
  }
};

TEST(Batcher, EmptyQueueTakesNothingAndWaitsForAChange) {
  Fixture f;
  const BatchPlan p = f.plan(t0);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, Clock::time_point::max());
  EXPECT_EQ(p.wait(t0), std::chrono::nanoseconds::max());
}

TEST(Batcher, FullBatchGoesAtOnceInFifoOrder) {
  Fixture f;
  f.config.max_rows = 3;
  Request* a = f.add(req(0, t0));
  Request* b = f.add(req(0, t0 + 1us));
  Request* c = f.add(req(0, t0 + 2us));
  f.add(req(0, t0 + 3us));  // does not fit
  const BatchPlan p = f.plan(t0 + 3us);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{a, b, c}));
  EXPECT_EQ(p.rows, 3);
}

TEST(Batcher, MaxQueueDelayHoldsAPartialBatchUntilTheOldestHasWaited) {
  Fixture f;
  f.config.max_queue_delay = 500us;
  Request* a = f.add(req(0, t0));
  Request* b = f.add(req(0, t0 + 100us));
  BatchPlan p = f.plan(t0 + 200us);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, t0 + 500us);  // from the oldest, not the newest
  EXPECT_EQ(p.wait(t0 + 200us), 300us);
  p = f.plan(t0 + 500us);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{a, b}));
}

TEST(Batcher, ZeroDelayOrUnbatchedModelOrCapOneTakesOneAtOnce) {
  Fixture f;
  f.config.max_queue_delay = 0us;
  Request* a = f.add(req(0, t0));
  Request* b = f.add(req(0, t0));
  BatchPlan p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{a, b}));  // what is there goes, no wait
  f.config.max_queue_delay = 10ms;
  f.config.batched = false;
  p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{a}));
  EXPECT_EQ(p.rows, 1);
  f.config.batched = true;
  f.config.max_rows = 1;  // a half-open breaker's probe
  p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{a}));
}

// The header's last rule: where batching is off, a model that runs each request alone gets what
// is queued in one launch, up to `coalesce` requests, in priority order, whatever their shapes and
// at once; a solo request is passed over and goes alone.
TEST(Batcher, WhereBatchingIsOffQueuedRequestsAreCoalescedAtOnce) {
  Fixture f;
  f.config.max_rows = 1;
  f.config.max_queue_delay = 10ms;  // not a batch: nothing waits
  f.config.coalesce = 3;
  Request* a = f.add(req(1, t0));
  Request* other_shape = f.add(req(1, t0, 2, 7, /*other_dtype=*/true));
  auto s = req(1, t0);
  s->solo = true;
  Request* solo = f.add(s);
  Request* urgent = f.add(req(0, t0));
  Request* e = f.add(req(1, t0));
  BatchPlan p = f.plan(t0);
  // The higher level's (urgent) first, then the other level in order; the solo one is passed
  // over.
  EXPECT_EQ(p.take, (std::vector<Request*>{urgent, a, other_shape}));
  EXPECT_EQ(p.rows, 4);
  EXPECT_EQ(p.wake, Clock::time_point::max());
  for (Request* r : p.take) f.queue.remove(r);
  p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{solo}));  // a solo head goes alone
  f.queue.remove(solo);
  f.config.coalesce = 0;  // a half-open breaker's probe, or a model that does not coalesce
  Request* g = f.add(req(1, t0));
  p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{e}));
  f.config.coalesce = 3;
  p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{e, g}));
  // Batching on: the coalesce setting is not looked at (the batcher's own rules).
  f.config.max_rows = 8;
  f.config.max_queue_delay = 0us;
  p = f.plan(t0);
  EXPECT_EQ(p.take, (std::vector<Request*>{e, g}));
}

TEST(Batcher, FlushTakesAPartialBatchWithoutWaiting) {
  Fixture f;
  f.config.max_queue_delay = std::chrono::microseconds::max();
  Request* a = f.add(req(0, t0));
  EXPECT_FALSE(f.plan(t0).ready());
  EXPECT_EQ(f.plan(t0).wake, Clock::time_point::max());  // max(): waits for a full batch
  f.config.flush = true;
  EXPECT_EQ(f.plan(t0).take, (std::vector<Request*>{a}));
}

TEST(Batcher, PreferredSizeTakesTheLargestReachableOne) {
  Fixture f;
  f.config.max_queue_delay = 10ms;
  f.preferred = {2, 4};
  Request* a = f.add(req(0, t0));
  EXPECT_FALSE(f.plan(t0).ready());  // 1 row: no preferred size reached
  Request* b = f.add(req(0, t0));
  Request* c = f.add(req(0, t0));
  BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());  // 3 rows: 2 is reachable, 4 is not
  EXPECT_EQ(p.take, (std::vector<Request*>{a, b}));
  EXPECT_EQ(p.rows, 2);
  f.add(req(0, t0));
  f.add(req(0, t0));
  p = f.plan(t0);
  EXPECT_EQ(p.rows, 4);
  EXPECT_EQ(p.take.size(), 4u);
  EXPECT_EQ(p.take[2], c);
}

TEST(Batcher, PreferredSizeCountsRowsNotRequests) {
  Fixture f;
  f.config.max_queue_delay = 10ms;
  f.preferred = {4};
  Request* a = f.add(req(0, t0, /*rows=*/1));
  Request* b = f.add(req(0, t0, /*rows=*/3));  // 4 rows in order: the preferred size
  f.add(req(0, t0, /*rows=*/1));
  const BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{a, b}));
  EXPECT_EQ(p.rows, 4);
}

TEST(Batcher, ABatchTheNextRequestWouldCarryPastTheLargestPreferredSizeGoesAtOnce) {
  // Triton's dynamic batcher: a preferred size is a run of the requests in order, so 3 + 3
  // rows cannot make 4; the 3 rows go without waiting for the delay.
  Fixture f;
  f.config.max_queue_delay = 10ms;
  f.preferred = {4};
  Request* a = f.add(req(0, t0, /*rows=*/3));
  EXPECT_FALSE(f.plan(t0).ready());  // 3 rows alone: 4 may still come
  f.add(req(0, t0, /*rows=*/3));
  f.add(req(0, t0, /*rows=*/1));
  const BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{a}));
  EXPECT_EQ(p.rows, 3);
}

TEST(Batcher, ARequestPastEveryPreferredSizeGoesAtOnceAndOneBetweenThemWaits) {
  // qa/L0_batcher's static batches: preferred 2 and 6; 7 rows go at once, 3 rows wait for the
  // delay (a request larger than a preferred size is never left without a batch).
  Fixture f;
  f.config.max_queue_delay = 10ms;
  f.preferred = {2, 6};
  Request* seven = f.add(req(0, t0, /*rows=*/7));
  BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{seven}));
  Fixture g;
  g.config.max_queue_delay = 10ms;
  g.preferred = {2, 6};
  Request* three = g.add(req(0, t0, /*rows=*/3));
  p = g.plan(t0);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, t0 + 10ms);
  EXPECT_EQ(g.plan(t0 + 10ms).take, (std::vector<Request*>{three}));
}

TEST(Batcher, WakesBeforeTheNearestDeadlineMinusTheDelay) {
  Fixture f;
  f.config.max_queue_delay = 2ms;
  f.add(req(0, t0));
  auto urgent = req(0, t0 + 100us);
  urgent->deadline = t0 + 3ms;  // 3 ms − 2 ms = 1 ms, before the oldest's 2 ms
  f.add(urgent);
  BatchPlan p = f.plan(t0 + 100us);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, t0 + 1ms);
  p = f.plan(t0 + 1ms);
  EXPECT_TRUE(p.ready());
  EXPECT_EQ(p.take.size(), 2u);
}

TEST(Batcher, DeadlineAlreadyInsideTheDelayGoesNow) {
  Fixture f;
  f.config.max_queue_delay = 5ms;
  auto r = req(0, t0);
  r->deadline = t0 + 1ms;
  f.add(r);
  EXPECT_TRUE(f.plan(t0).ready());
}

TEST(Batcher, OnlyShapeCompatibleRequestsShareABatchAndOnePassedOverIsNotHeldBack) {
  Fixture f;
  f.config.max_rows = 4;
  f.config.max_queue_delay = 10ms;
  Request* a = f.add(req(0, t0, 1, /*features=*/4));
  EXPECT_FALSE(f.plan(t0).ready());      // alone: waits for the delay
  f.add(req(0, t0, 1, /*features=*/5));  // other non-batch dim
  f.add(req(0, t0, 1, 4, /*other_dtype=*/true));
  Request* d = f.add(req(0, t0, 1, 4));
  // The others would wait behind the delay: the batch goes at once (Triton sends a batch the
  // next request cannot join), and they come next.
  const BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{a, d}));
}

TEST(Batcher, ARaggedInputsOtherDimsDoNotKeepRequestsApart) {
  // TensorSpec::ragged (Triton's allow_ragged_batch): only the dtype and rank must match.
  static const std::vector<bool> ragged{true};
  Fixture f;
  f.config.max_rows = 4;
  const auto ragged_req = [&](std::int64_t features, bool other_dtype = false) {
    std::shared_ptr<Request> r = req(0, t0, 1, features, other_dtype);
    r->ragged = &ragged;
    r->shape_key = compute_shape_key(r->inputs, /*batched=*/true, r->ragged);
    return r;
  };
  Request* a = f.add(ragged_req(4));
  Request* b = f.add(ragged_req(5));
  Request* c = f.add(ragged_req(9));
  f.add(ragged_req(4, /*other_dtype=*/true));  // the dtype still matters: the batch ends
  const BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{a, b, c}));
}

TEST(Batcher, RowsNeverExceedMaxRows) {
  Fixture f;
  f.config.max_rows = 4;
  Request* a = f.add(req(0, t0, 3));
  f.add(req(0, t0, 2));  // 5 > 4: skipped
  Request* c = f.add(req(0, t0, 1));
  const BatchPlan p = f.plan(t0);
  ASSERT_TRUE(p.ready());  // full at 4 rows: no wait
  EXPECT_EQ(p.take, (std::vector<Request*>{a, c}));
  EXPECT_EQ(p.rows, 4);
}

TEST(Batcher, HigherPriorityFirstThenFifoWithinALevel) {
  Fixture f;
  f.config.max_rows = 3;
  Request* low = f.add(req(2, t0));
  Request* mid1 = f.add(req(1, t0 + 1us));
  Request* high = f.add(req(0, t0 + 2us));
  Request* mid2 = f.add(req(1, t0 + 3us));
  const BatchPlan p = f.plan(t0 + 3us);
  EXPECT_EQ(p.take, (std::vector<Request*>{high, mid1, mid2}));
  (void)low;
}

TEST(Batcher, AgingPromotesALongWaitingLowPriorityHead) {
  Fixture f;
  f.config.max_rows = 1;
  f.config.priority_aging = 1ms;
  Request* old_low = f.add(req(2, t0));
  Request* high = f.add(req(0, t0 + 900us));
  EXPECT_EQ(f.plan(t0 + 950us).take, (std::vector<Request*>{high}));   // not aged yet
  EXPECT_EQ(f.plan(t0 + 1ms).take, (std::vector<Request*>{old_low}));  // aged: it goes first
  f.config.priority_aging = 0us;                                       // no aging
  EXPECT_EQ(f.plan(t0 + 1h).take, (std::vector<Request*>{high}));
}

TEST(Batcher, SoloRequestRunsAlone) {
  Fixture f;
  auto s = req(0, t0);
  s->solo = true;
  Request* solo = f.add(s);
  Request* b = f.add(req(0, t0));
  EXPECT_EQ(f.plan(t0).take, (std::vector<Request*>{solo}));  // alone and at once
  f.queue.remove(solo);
  auto s2 = req(0, t0);
  s2->solo = true;
  f.add(s2);
  // A solo request never joins another's batch.
  const BatchPlan p = f.plan(t0 + 2ms);
  EXPECT_EQ(p.take, (std::vector<Request*>{b}));
}

TEST(Batcher, CancelledRequestLeavesAFormingBatch) {
  Fixture f;
  f.config.max_queue_delay = 1ms;
  Request* a = f.add(req(0, t0));
  Request* b = f.add(req(0, t0 + 400us));
  Request* c = f.add(req(0, t0 + 600us));
  BatchPlan p = f.plan(t0 + 700us);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, t0 + 1ms);
  // The oldest is cancelled (the engine unlinks it under the queue mutex): the wake time now
  // follows the oldest request that remains, and the batch forms without it.
  EXPECT_NE(f.queue.remove(a), nullptr);
  p = f.plan(t0 + 1ms);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, t0 + 1400us);
  p = f.plan(t0 + 1400us);
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(p.take, (std::vector<Request*>{b, c}));
  // A request whose deadline made the wake early leaves too: the early wake goes with it.
  auto urgent = req(0, t0 + 1500us);
  urgent->deadline = t0 + 1600us;
  Fixture g;
  g.config.max_queue_delay = 1ms;
  g.add(req(0, t0 + 1500us));
  Request* u = g.add(urgent);
  EXPECT_EQ(g.plan(t0 + 1500us).take.size(), 2u);  // deadline − delay already passed
  g.queue.remove(u);
  p = g.plan(t0 + 1500us);
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.wake, t0 + 2500us);
}

TEST(Batcher, IsPureTheQueueIsUnchanged) {
  Fixture f;
  f.add(req(0, t0));
  f.add(req(1, t0));
  const BatchPlan p = f.plan(t0 + 5ms);
  EXPECT_TRUE(p.ready());
  EXPECT_EQ(f.queue.size(), 2u);  // the caller takes the requests, not the batcher
  for (const auto& r : f.all) EXPECT_EQ(r->stage.load(), Stage::queued);
}

}  // namespace
}  // namespace asyncinfer::detail
