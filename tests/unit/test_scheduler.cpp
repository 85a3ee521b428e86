// The engine's Scheduler (src/engine/scheduler.hpp) alone: requests built by hand, no engine, no
// device and — except where a case is about blocking — no thread. Each case names the rule of
// scheduler.hpp it checks.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "engine/scheduler.hpp"
#include "test_support.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;

/// A prepared request (stage `submitting`), as EngineCore::prepare leaves it: one row of 4 f32.
std::shared_ptr<Request> prepared(Clock::time_point deadline = Clock::time_point::max()) {
  auto r = std::make_shared<Request>();
  r->submitted = Clock::now();
  r->enqueued = r->submitted;
  r->deadline = deadline;
  r->inputs.push_back(*Tensor::zeros(DType::f32, {1, 4}));
  r->shape_key = compute_shape_key(r->inputs, /*batched=*/true);
  return r;
}

EngineOptions options() {
  EngineOptions o;
  o.queue_capacity = 4;
  o.batching.max_queue_delay = 0us;  // a batch goes at once: next_batch never waits for more
  return o;
}

/// accept() with a hook that counts its calls.
std::optional<Refusal> accept(Scheduler& s, const std::shared_ptr<Request>& r, int& hooks) {
  return s.accept(r, [&] { ++hooks; });
}

TEST(Scheduler, AcceptQueuesInOrderAndRunsTheHookOncePerAcceptedRequest) {
  Scheduler s(options(), /*batched=*/true);
  int hooks = 0;
  auto a = prepared();
  auto b = prepared();
  EXPECT_FALSE(accept(s, a, hooks));
  EXPECT_FALSE(accept(s, b, hooks));
  EXPECT_EQ(hooks, 2);
  EXPECT_EQ(a->stage.load(), Stage::queued);
  EXPECT_LT(a->seq, b->seq);
  EXPECT_EQ(s.depths().queued, 2);
  EXPECT_EQ(s.waiting().front(), a);
}

TEST(Scheduler, AFullQueueRefusesWithQueueFullAndRegistersNothing) {
  Scheduler s(options(), true);
  int hooks = 0;
  for (int i = 0; i < 4; ++i) ASSERT_FALSE(accept(s, prepared(), hooks));
  auto extra = prepared();
  auto refusal = accept(s, extra, hooks);
  ASSERT_TRUE(refusal);
  EXPECT_STREQ(refusal->reason, "queue_full");
  EXPECT_EQ(refusal->status.code(), StatusCode::resource_exhausted);
  EXPECT_NE(refusal->status.message().find("queue_capacity 4"), std::string::npos);
  EXPECT_EQ(hooks, 4);
  EXPECT_EQ(extra->stage.load(), Stage::submitting);
  EXPECT_EQ(s.depths().queued, 4);
}

TEST(Scheduler, ABlockedSubmitRefusedAtItsDeadlineSaysItWasNotAccepted) {
  EngineOptions o = options();
  o.queue_capacity = 1;
  o.queue_full_policy = QueueFullPolicy::block;
  o.submit_timeout = 10s;
  Scheduler s(o, true);
  int hooks = 0;
  ASSERT_FALSE(accept(s, prepared(), hooks));
  auto late = prepared(Clock::now() + 20ms);
  auto refusal = accept(s, late, hooks);  // waits for room until the request's own deadline
  ASSERT_TRUE(refusal);
  EXPECT_STREQ(refusal->reason, "deadline");
  EXPECT_NE(refusal->status.message().find("not accepted"), std::string::npos);
}

TEST(Scheduler, ABlockedSubmitGetsInWhenAWorkerTakesABatch) {
  EngineOptions o = options();
  o.queue_capacity = 1;
  o.queue_full_policy = QueueFullPolicy::block;
  o.submit_timeout = std::chrono::duration_cast<std::chrono::microseconds>(testing::kWatchdog);
  Scheduler s(o, true);
  int hooks = 0;
  ASSERT_FALSE(accept(s, prepared(), hooks));
  std::atomic<bool> accepted{false};
  std::jthread submitter([&] {
    int h = 0;
    accepted = !accept(s, prepared(), h).has_value();
  });
  std::this_thread::sleep_for(20ms);  // most likely blocked by now (if not, it gets in at once)
  ASSERT_NE(s.next_batch({0, 8, nullptr, nullptr}), nullptr);  // makes room, wakes it
  submitter.join();
  EXPECT_TRUE(accepted.load());
  EXPECT_EQ(s.depths().queued, 1);
}

TEST(Scheduler, NextBatchMovesQueuedRequestsToRunning) {
  Scheduler s(options(), true);
  int hooks = 0;
  auto a = prepared();
  auto b = prepared();
  ASSERT_FALSE(accept(s, a, hooks));
  ASSERT_FALSE(accept(s, b, hooks));
  auto batch = s.next_batch({1, 8, nullptr, nullptr});
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(batch->worker, 1);
  ASSERT_EQ(batch->requests.size(), 2u);
  EXPECT_EQ(batch->rows, 2);
  EXPECT_EQ(batch->requests[0], a);
  EXPECT_EQ(a->stage.load(), Stage::running);
  EXPECT_EQ(a->batch.lock(), batch);
  EXPECT_EQ(s.depths().queued, 0);
}

TEST(Scheduler, NextBatchHonoursTheTakersRowsAndItsStopFlags) {
  Scheduler s(options(), true);
  int hooks = 0;
  for (int i = 0; i < 3; ++i) ASSERT_FALSE(accept(s, prepared(), hooks));
  std::atomic<bool> recycle{true};
  std::atomic<bool> open{false};
  EXPECT_EQ(s.next_batch({0, 8, &recycle, &open}), nullptr);  // a recycle is wanted
  recycle = false;
  open = true;
  EXPECT_EQ(s.next_batch({0, 8, &recycle, &open}), nullptr);  // its breaker opened
  open = false;
  auto probe = s.next_batch({0, 1, &recycle, &open});  // a half-open breaker's probe: one row
  ASSERT_NE(probe, nullptr);
  EXPECT_EQ(probe->requests.size(), 1u);
  EXPECT_EQ(s.depths().queued, 2);
}

TEST(Scheduler, RequeuePutsRunningRequestsBackInFrontWithoutCountingTheAttempt) {
  Scheduler s(options(), true);
  int hooks = 0;
  auto a = prepared();
  auto b = prepared();
  auto c = prepared();
  ASSERT_FALSE(accept(s, a, hooks));
  ASSERT_FALSE(accept(s, b, hooks));
  auto batch = s.next_batch({0, 2, nullptr, nullptr});
  ASSERT_EQ(batch->requests.size(), 2u);
  ASSERT_FALSE(accept(s, c, hooks));
  a->attempts = 1;
  b->attempts = 1;
  Requeued out = s.requeue(batch->requests, /*solo=*/true);
  EXPECT_TRUE(out.refused.empty());
  EXPECT_TRUE(out.partial.empty());
  EXPECT_EQ(a->stage.load(), Stage::queued);
  EXPECT_EQ(a->attempts.load(), 0);
  EXPECT_TRUE(a->solo);
  s.batch_finished(*batch);
  const auto order = s.waiting();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], a);  // in their order, ahead of c
  EXPECT_EQ(order[1], b);
  EXPECT_EQ(order[2], c);
  auto solo = s.next_batch({0, 8, nullptr, nullptr});
  ASSERT_EQ(solo->requests.size(), 1u);  // solo: a batch of its own
  EXPECT_EQ(solo->requests[0], a);
}

TEST(Scheduler, RequeueRefusesWhenCancellingAndLeavesDecoupledRequestsToFail) {
  Scheduler s(options(), true);
  int hooks = 0;
  auto plain = prepared();
  auto decoupled = prepared();
  decoupled->on_response = [](Outputs, std::stop_token) { return Status(); };
  ASSERT_FALSE(accept(s, plain, hooks));
  ASSERT_FALSE(accept(s, decoupled, hooks));
  auto batch = s.next_batch({0, 8, nullptr, nullptr});
  ASSERT_EQ(batch->requests.size(), 2u);
  Requeued out = s.requeue(batch->requests, false);
  ASSERT_EQ(out.partial.size(), 1u);
  EXPECT_EQ(out.partial[0], decoupled);  // runs once: the caller fails it
  EXPECT_EQ(plain->stage.load(), Stage::queued);

  auto again = s.next_batch({0, 8, nullptr, nullptr});
  ASSERT_EQ(again->requests.size(), 1u);
  EXPECT_EQ(s.begin_shutdown(EngineState::cancelling), EngineState::running);
  out = s.requeue(again->requests, false);
  ASSERT_EQ(out.refused.size(), 1u);  // cancelling: the caller ends it shut_down
  EXPECT_EQ(plain->stage.load(), Stage::running);
}

TEST(Scheduler, WithdrawTakesARequestOutOfTheQueueOrTheRetrySet) {
  Scheduler s(options(), true);
  int hooks = 0;
  auto queued = prepared();
  auto retrying = prepared();
  ASSERT_FALSE(accept(s, retrying, hooks));
  ASSERT_NE(s.next_batch({0, 8, nullptr, nullptr}), nullptr);
  ASSERT_TRUE(s.park_for_retry(retrying));
  EXPECT_EQ(retrying->stage.load(), Stage::retry_wait);
  ASSERT_FALSE(accept(s, queued, hooks));
  EXPECT_EQ(s.depths().retry_waiting, 1);

  std::shared_ptr<Request> ref;
  EXPECT_EQ(s.withdraw(queued, Stage::cancelled, cancelled_error("x"), ref),
            Withdrawal::from_queue);
  EXPECT_EQ(ref, queued);
  EXPECT_EQ(queued->stage.load(), Stage::cancelled);
  EXPECT_EQ(s.withdraw(retrying, Stage::timed_out, deadline_exceeded_error("x"), ref),
            Withdrawal::from_retry_wait);
  EXPECT_EQ(ref, retrying);
  EXPECT_EQ(s.depths().queued, 0);
  EXPECT_EQ(s.depths().retry_waiting, 0);
  // Ended: the scheduler no longer holds it.
  EXPECT_EQ(s.withdraw(queued, Stage::cancelled, cancelled_error("x"), ref),
            Withdrawal::not_waiting);
  // A running request is not the scheduler's to end.
  auto running = prepared();
  ASSERT_FALSE(accept(s, running, hooks));
  ASSERT_NE(s.next_batch({0, 8, nullptr, nullptr}), nullptr);
  EXPECT_EQ(s.withdraw(running, Stage::cancelled, cancelled_error("x"), ref),
            Withdrawal::not_waiting);
}

TEST(Scheduler, ARequestEndedWhileBeingSubmittedIsRefusedWithItsReason) {
  Scheduler s(options(), true);
  int hooks = 0;
  auto r = prepared();
  std::shared_ptr<Request> ref;
  EXPECT_EQ(s.withdraw(r, Stage::cancelled, cancelled_error("cancelled by the caller"), ref),
            Withdrawal::refused);
  EXPECT_EQ(s.withdraw(r, Stage::timed_out, deadline_exceeded_error("late"), ref),
            Withdrawal::already_refused);
  auto refusal = accept(s, r, hooks);
  ASSERT_TRUE(refusal);
  EXPECT_STREQ(refusal->reason, "cancelled");
  EXPECT_NE(refusal->status.message().find("before its submit accepted it"), std::string::npos);
  EXPECT_EQ(hooks, 0);
  EXPECT_EQ(r->stage.load(), Stage::submitting);
}

TEST(Scheduler, ABackoffThatEndsRequeuesAtTheBackUnlessNoWorkerCanServe) {
  Scheduler s(options(), true);
  int hooks = 0;
  auto r = prepared();
  ASSERT_FALSE(accept(s, r, hooks));
  ASSERT_NE(s.next_batch({0, 8, nullptr, nullptr}), nullptr);
  ASSERT_TRUE(s.park_for_retry(r));
  BackoffEnd end = s.requeue_after_backoff(r);
  EXPECT_TRUE(end.requeued);
  EXPECT_EQ(r->stage.load(), Stage::queued);
  EXPECT_FALSE(s.requeue_after_backoff(r).requeued);  // no longer waiting: nothing to do

  ASSERT_NE(s.next_batch({0, 8, nullptr, nullptr}), nullptr);
  ASSERT_TRUE(s.park_for_retry(r));
  const Status gone = unavailable_error("every worker gave up");
  const auto left = s.no_workers(gone);
  ASSERT_EQ(left.size(), 1u);  // the caller ends what waits
  end = s.requeue_after_backoff(r);
  EXPECT_TRUE(end.unservable);
  ASSERT_TRUE(end.unavailable);
  EXPECT_EQ(end.unavailable->message(), gone.message());
  auto refusal = accept(s, prepared(), hooks);  // later submits are refused with the cause
  ASSERT_TRUE(refusal);
  EXPECT_STREQ(refusal->reason, "unavailable");
}

TEST(Scheduler, ADrainWaitsForInFlightBatchesThenMovesOnToCancelling) {
  Scheduler s(options(), true);
  int hooks = 0;
  ASSERT_FALSE(accept(s, prepared(), hooks));
  auto batch = s.next_batch({0, 8, nullptr, nullptr});
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(s.begin_shutdown(EngineState::draining), EngineState::running);
  EXPECT_FALSE(s.accepting());
  auto refusal = accept(s, prepared(), hooks);
  ASSERT_TRUE(refusal);
  EXPECT_STREQ(refusal->reason, "shut_down");
  // One batch in flight: a bounded drain times out, and still moves on to cancelling.
  s.wait_drained(Clock::now() + 10ms);
  EXPECT_EQ(s.state(), EngineState::cancelling);
  EXPECT_EQ(s.next_batch({0, 8, nullptr, nullptr}), nullptr);  // the workers leave
  s.batch_finished(*batch);
  s.stopped();
  EXPECT_EQ(s.state(), EngineState::stopped);
}

TEST(Scheduler, ADrainEndsWhenTheLastBatchFinishes) {
  Scheduler s(options(), true);
  int hooks = 0;
  ASSERT_FALSE(accept(s, prepared(), hooks));
  auto batch = s.next_batch({0, 8, nullptr, nullptr});
  ASSERT_NE(batch, nullptr);
  s.begin_shutdown(EngineState::draining);
  std::jthread worker([&] {
    std::this_thread::sleep_for(5ms);
    s.batch_finished(*batch);
  });
  const auto start = Clock::now();
  s.wait_drained(Clock::time_point::max());  // no limit: the finished batch wakes it
  EXPECT_LT(Clock::now() - start, testing::kWatchdog);
  EXPECT_EQ(s.state(), EngineState::cancelling);
}

TEST(Scheduler, AWorkerSpinningForWorkTakesARequestAcceptedMeanwhile) {
  Scheduler s(options(), true);
  SpinWait spin(std::chrono::seconds(10));  // long: the request must end it, not the budget
  std::jthread submitter([&] {
    std::this_thread::sleep_for(2ms);
    int hooks = 0;
    EXPECT_FALSE(accept(s, prepared(), hooks));
  });
  const auto start = Clock::now();
  auto batch = s.next_batch({0, 8, nullptr, nullptr, &spin});
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(batch->requests.size(), 1u);
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(Scheduler, AShutdownOrATakersFlagEndsASpinningWorkersWait) {
  {
    Scheduler s(options(), true);
    SpinWait spin(std::chrono::seconds(10));
    std::jthread stopper([&] {
      std::this_thread::sleep_for(2ms);
      s.begin_shutdown(EngineState::cancelling);
    });
    const auto start = Clock::now();
    EXPECT_EQ(s.next_batch({0, 8, nullptr, nullptr, &spin}), nullptr);
    EXPECT_LT(Clock::now() - start, 5s);
  }
  Scheduler s(options(), true);
  SpinWait spin(std::chrono::seconds(10));
  std::atomic<bool> recycle{false};
  std::jthread flagger([&] {
    std::this_thread::sleep_for(2ms);
    recycle = true;
    s.wake_workers();
  });
  const auto start = Clock::now();
  EXPECT_EQ(s.next_batch({0, 8, &recycle, nullptr, &spin}), nullptr);
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(SchedulerDeathTest, AnIllegalLifeCycleChangeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Scheduler s(options(), true);
        s.stopped();  // running → stopped skips cancelling
      },
      "engine state running -> stopped: not in the table");
}

}  // namespace
}  // namespace asyncinfer::detail
