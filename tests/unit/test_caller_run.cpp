// The caller-run fast path's parts alone (src/engine/caller_run.hpp): WorkerLending, the
// Scheduler's side (which sleeping worker is lent, within which bound), and CallerRun, the
// engine's side (which requests get a bound, running one, tripping off). No engine, no worker,
// no thread. test_inline_path.cpp tests the path through an engine.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/caller_run.hpp"
#include "engine/scheduler.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;

TEST(WorkerLending, NothingIsLentBeforeTheModelsComputeTimeIsKnownOrAboveTheBound) {
  WorkerLending l(2);
  Taker t0{0, 8};
  l.seat(0).asleep = &t0;
  const auto any = [](const Taker&) { return true; };
  EXPECT_EQ(l.lend(100us, any), nullptr);  // no batch observed yet
  l.observe(200);
  EXPECT_DOUBLE_EQ(l.compute_us(), 200);
  EXPECT_EQ(l.lend(100us, any), nullptr);  // the recent average is above the bound
  l.observe(0);                            // the average moves by 1/8 of the difference
  EXPECT_DOUBLE_EQ(l.compute_us(), 175);
  EXPECT_EQ(l.lend(175us, any), &t0);
  EXPECT_TRUE(l.seat(0).lent);
  EXPECT_TRUE(l.any_lent());
}

TEST(WorkerLending, LendsTheFirstSleepingWorkerNotLentThatCanTakeTheRequest) {
  WorkerLending l(3);
  Taker t0{0, 1}, t1{1, 8}, t2{2, 8};
  l.observe(10);
  l.seat(1).asleep = &t1;
  l.seat(2).asleep = &t2;
  const auto rows_fit = [](const Taker& t) { return t.max_rows >= 4; };
  EXPECT_EQ(l.lend(50us, rows_fit), &t1);  // worker 0 is awake
  EXPECT_EQ(l.lend(50us, rows_fit), &t2);  // worker 1 is lent
  EXPECT_EQ(l.lend(50us, rows_fit), nullptr);
  l.seat(0).asleep = &t0;
  EXPECT_EQ(l.lend(50us, rows_fit), nullptr);  // worker 0's batch holds one row

  // Given back while still asleep: its Taker, so that the Scheduler checks whether to wake it.
  EXPECT_EQ(l.give_back(1), &t1);
  EXPECT_FALSE(l.seat(1).lent);
  EXPECT_TRUE(l.any_lent());   // worker 2 still is
  l.seat(2).asleep = nullptr;  // woke meanwhile
  EXPECT_EQ(l.give_back(2), nullptr);
  EXPECT_FALSE(l.any_lent());
}

TEST(WorkerLending, ASeatIsMadeForAWorkerIndexSeenLater) {
  WorkerLending l(0);
  Taker t5{5, 8};
  l.seat(5).asleep = &t5;
  l.observe(1);
  EXPECT_EQ(l.lend(1us, [](const Taker&) { return true; }), &t5);
}

// GCC 12 at -O3 warns that RetryPolicy's default retryable_codes (an initializer list) "may be
// used uninitialized" where EngineOptions' constructor is inlined here: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// Engine options with `max_queue_delay` (the rest default).
EngineOptions options(std::chrono::microseconds max_queue_delay) {
  EngineOptions o;
  o.batching.max_queue_delay = max_queue_delay;
  return o;
}
#pragma GCC diagnostic pop

TEST(CallerRun, AppliesOnlyOnTheInlinePathToAPlainModelThatSupportsIt) {
  ModelSignature sig;
  const EngineOptions opt = options(0us);
  EXPECT_TRUE(CallerRun::applies(true, sig, opt, true));
  EXPECT_FALSE(CallerRun::applies(false, sig, opt, true));  // no inline path
  EXPECT_FALSE(CallerRun::applies(true, sig, opt, false));  // the model does not support it
  EXPECT_FALSE(CallerRun::applies(true, sig, options(100us), true));  // a batching delay
  ModelSignature decoupled;
  decoupled.decoupled = true;
  EXPECT_FALSE(CallerRun::applies(true, decoupled, opt, true));
}

TEST(CallerRun, ARequestGetsItsBoundOnlyWhereCallerRunsApply) {
  RequestOptions o;
  o.caller_run_max_compute = 50us;
  EXPECT_EQ(CallerRun(true, "m").bound(o), 50us);
  EXPECT_EQ(CallerRun(false, "m").bound(o), 0us);
}

TEST(CallerRun, RunRunsTheBatchThenGivesTheWorkerBackEvenWhenTheRunThrows) {
  CallerRun c(true, "m");
  int order = 0, ran = 0, given = 0;
  c.run(
      50us, [&] { ran = ++order; }, [&] { given = ++order; });
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(given, 2);
  EXPECT_FALSE(c.tripped());
  given = 0;
  EXPECT_THROW(c.run(
                   50us, [] { throw 1; }, [&] { given = 1; }),
               int);
  EXPECT_EQ(given, 1);
}

TEST(CallerRun, ARunFarLongerThanItsBoundTripsCallerRunsOffForGood) {
  CallerRun c(true, "m");
  RequestOptions o;
  o.caller_run_max_compute = 1us;
  c.run(
      1us, [] {}, [] {});
  EXPECT_FALSE(c.tripped());
  c.run(
      1us, [] { std::this_thread::sleep_for(std::chrono::milliseconds(CallerRun::kTripMs + 5)); },
      [] {});
  EXPECT_TRUE(c.tripped());
  EXPECT_EQ(c.bound(o), 0us);
}

}  // namespace
}  // namespace asyncinfer::detail
