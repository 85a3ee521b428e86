// The engine's parts tested alone, without an engine or a thread: the request queue, the id
// result store, the retry budget and scheduler, ordered delivery, admission control, the
// engine-wide counters and the request life cycle's transition table (src/engine/*.hpp).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ordered_delivery.hpp"
#include "engine/admission.hpp"
#include "engine/engine_counters.hpp"
#include "engine/request.hpp"
#include "engine/request_queue.hpp"
#include "engine/result_store.hpp"
#include "engine/retry.hpp"
#include "engine/retry_scheduler.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;

const Clock::time_point t0 = Clock::time_point(std::chrono::hours(1000));

std::shared_ptr<Request> req(int level, Clock::time_point enqueued, std::string id = "") {
  auto r = std::make_shared<Request>();
  r->level = level;
  r->enqueued = enqueued;
  r->id = std::move(id);
  return r;
}

// ---- RequestQueue -------------------------------------------------------------------------------

TEST(RequestQueue, FifoPerLevelHighestLevelFirst) {
  RequestQueue q(3);
  auto a = req(1, t0), b = req(0, t0), c = req(1, t0), d = req(2, t0);
  for (auto* r : {&a, &b, &c, &d}) q.push_back(*r);
  EXPECT_EQ(q.size(), 4u);
  EXPECT_EQ(q.all(), (std::vector<Request*>{b.get(), a.get(), c.get(), d.get()}));
  EXPECT_EQ(q.next(t0, 0us), b.get());
  EXPECT_EQ(q.head(1), a.get());
  EXPECT_EQ(a->next, c.get());
}

TEST(RequestQueue, RemoveFromTheMiddleHeadAndTailInConstantTime) {
  RequestQueue q(1);
  auto a = req(0, t0), b = req(0, t0), c = req(0, t0);
  q.push_back(a);
  q.push_back(b);
  q.push_back(c);
  EXPECT_EQ(a.use_count(), 2);  // the queue holds a reference
  EXPECT_EQ(q.remove(b.get()), b);
  EXPECT_EQ(q.all(), (std::vector<Request*>{a.get(), c.get()}));
  EXPECT_EQ(q.remove(b.get()), nullptr);  // not queued any more: nothing
  EXPECT_EQ(q.remove(c.get()), c);
  EXPECT_EQ(q.remove(a.get()), a);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.head(0), nullptr);
  EXPECT_EQ(a.use_count(), 1);
  q.push_back(b);  // a removed request may come back
  EXPECT_EQ(q.next(t0, 0us), b.get());
}

TEST(RequestQueue, PushFrontPutsARequeuedRequestAheadOfItsLevel) {
  RequestQueue q(2);
  auto a = req(1, t0), b = req(1, t0), c = req(0, t0);
  q.push_back(a);
  q.push_front(b);
  q.push_back(c);
  EXPECT_EQ(q.all(), (std::vector<Request*>{c.get(), b.get(), a.get()}));
}

TEST(RequestQueue, AgingServesTheOldestOfTheAgedHeads) {
  RequestQueue q(3);
  auto top = req(0, t0 + 5ms), mid = req(1, t0 + 1ms), low = req(2, t0);
  q.push_back(top);
  q.push_back(mid);
  q.push_back(low);
  EXPECT_EQ(q.next(t0 + 5ms, 10ms), top.get());   // nobody aged
  EXPECT_EQ(q.next(t0 + 10ms, 10ms), low.get());  // low aged (10 ms), mid not (9 ms)
  EXPECT_EQ(q.next(t0 + 11ms, 10ms), low.get());  // both aged: the older wins
  q.remove(low.get());
  EXPECT_EQ(q.next(t0 + 11ms, 10ms), mid.get());
  EXPECT_EQ(q.next(t0 + 11ms, std::chrono::microseconds::max()), top.get());  // never aged
}

// ---- ResultStore --------------------------------------------------------------------------------

TEST(ResultStore, InsertFindReleaseAndDuplicateLiveIds) {
  ResultStore s(4, 60s);
  auto a = req(0, t0, "a");
  ASSERT_TRUE(s.insert(a).ok());
  EXPECT_EQ(*s.find("a"), a);
  auto again = req(0, t0, "a");
  EXPECT_EQ(s.insert(again).code(), StatusCode::already_exists);  // while live
  EXPECT_EQ(s.release("a").code(), StatusCode::failed_precondition);
  s.mark_finished(*a);
  EXPECT_TRUE(s.insert(again).ok());  // a finished id may be reused
  EXPECT_EQ(*s.find("a"), again);
  s.mark_finished(*again);
  EXPECT_TRUE(s.release("a").ok());
  EXPECT_EQ(s.size(), 0u);
  const auto missing = s.find("a");
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
  EXPECT_NE(missing.status().message().find("unknown"), std::string::npos);
}

TEST(ResultStore, FullOfLiveEntriesRefusesAndEvictsTheOldestFinished) {
  ResultStore s(2, 60s);
  auto a = req(0, t0, "a"), b = req(0, t0, "b"), c = req(0, t0, "c");
  ASSERT_TRUE(s.insert(a).ok());
  ASSERT_TRUE(s.insert(b).ok());
  EXPECT_EQ(s.insert(c).code(), StatusCode::resource_exhausted);
  s.mark_finished(*b);
  s.mark_finished(*a);  // b finished first: the oldest finished
  ASSERT_TRUE(s.insert(c).ok());
  EXPECT_EQ(s.size(), 2u);
  const auto gone = s.find("b");
  EXPECT_EQ(gone.status().code(), StatusCode::not_found);
  EXPECT_NE(gone.status().message().find("evicted"), std::string::npos) << gone.status();
  EXPECT_TRUE(s.find("a").ok());
}

TEST(ResultStore, FinishedEntriesExpireAfterTheTtl) {
  ResultStore s(4, 0ms);  // expire at once
  auto a = req(0, t0, "a");
  ASSERT_TRUE(s.insert(a).ok());
  EXPECT_TRUE(s.find("a").ok());  // live entries never expire
  s.mark_finished(*a);
  const auto gone = s.find("a");
  EXPECT_EQ(gone.status().code(), StatusCode::not_found);
  EXPECT_NE(gone.status().message().find("expired"), std::string::npos) << gone.status();
  EXPECT_EQ(s.size(), 0u);
}

TEST(ResultStore, EraseRefusedRemovesOnlyThatLiveRequest) {
  ResultStore s(4, 60s);
  auto a = req(0, t0, "a");
  auto other = req(0, t0, "a");
  ASSERT_TRUE(s.insert(a).ok());
  s.erase_refused("a", other.get());  // not the registered request: kept
  EXPECT_EQ(s.size(), 1u);
  s.erase_refused("a", a.get());
  EXPECT_EQ(s.size(), 0u);
}

// ---- RetryBudget and RetryScheduler -----------------------------------------------------------

TEST(RetryBudget, RatioOfRequestsPlusAMinimumPerSecond) {
  RetryPolicy p;
  p.budget_ratio = 0.5;
  p.budget_min_retries_per_s = 1.0;
  p.budget_window = 2000ms;  // 2 s: a floor of 2 retries
  RetryBudget b(p);
  EXPECT_TRUE(b.try_retry(t0));
  EXPECT_TRUE(b.try_retry(t0));
  EXPECT_FALSE(b.try_retry(t0));  // floor spent, no requests yet
  for (int i = 0; i < 4; ++i) b.on_request(t0);
  EXPECT_TRUE(b.try_retry(t0));  // 0.5 × 4 + 2 = 4 allowed
  EXPECT_TRUE(b.try_retry(t0));
  EXPECT_FALSE(b.try_retry(t0));
}

TEST(RetryBudget, OldBucketsLeaveTheWindow) {
  RetryPolicy p;
  p.budget_ratio = 0;
  p.budget_min_retries_per_s = 1.0;
  p.budget_window = 1000ms;
  RetryBudget b(p);
  EXPECT_TRUE(b.try_retry(t0));
  EXPECT_FALSE(b.try_retry(t0 + 100ms));
  EXPECT_TRUE(b.try_retry(t0 + 1s));  // the first second's retry has left the window
}

TEST(RetryScheduler, RetriesARetryableErrorWithinAttemptsAndDeadline) {
  RetryPolicy p;
  p.max_attempts = 3;
  p.initial_backoff = 1ms;
  p.max_backoff = 1ms;
  RetryScheduler s(p);
  s.on_request(t0);
  RetryDecision d = s.decide(1, StatusCode::unavailable, Clock::time_point::max(), t0, false);
  EXPECT_TRUE(d.retry);
  EXPECT_GE(d.at, t0);
  EXPECT_LE(d.at, t0 + 1ms);
  EXPECT_FALSE(s.decide(3, StatusCode::unavailable, Clock::time_point::max(), t0, false).retry);
  EXPECT_FALSE(
      s.decide(1, StatusCode::invalid_argument, Clock::time_point::max(), t0, false).retry);
  EXPECT_FALSE(s.decide(1, StatusCode::unavailable, Clock::time_point::max(), t0, true).retry);
  d = s.decide(1, StatusCode::unavailable, t0, t0, false);  // the deadline is now
  EXPECT_FALSE(d.retry);
  EXPECT_NE(d.why_not.find("no time left"), std::string::npos);
}

TEST(RetryScheduler, BudgetDenialAndTheFinalMessage) {
  RetryPolicy p;
  p.max_attempts = 5;
  p.budget_ratio = 0;
  p.budget_min_retries_per_s = 0.1;  // × 10 s window = 1 retry
  RetryScheduler s(p);
  EXPECT_TRUE(s.decide(1, StatusCode::unavailable, Clock::time_point::max(), t0, false).retry);
  const RetryDecision d = s.decide(2, StatusCode::unavailable, Clock::time_point::max(), t0, false);
  EXPECT_FALSE(d.retry);
  EXPECT_TRUE(d.denied_by_budget);
  const Status last = unavailable_error("device lost");
  const Status f = RetryScheduler::final_status(last, 2, d.why_not, "req-7");
  EXPECT_EQ(f.code(), StatusCode::unavailable);
  EXPECT_NE(f.message().find("failed after 2 attempts (retry budget exhausted)"), std::string::npos)
      << f;
  EXPECT_NE(f.message().find("[req-7]"), std::string::npos) << f;
  EXPECT_EQ(RetryScheduler::final_status(last, 1, "", "x").message(), last.message());
}

TEST(RetryScheduler, WaitingSetHoldsAReferenceUntilUnparked) {
  RetryScheduler s(RetryPolicy{});
  auto r = req(0, t0);
  s.park(r);
  EXPECT_TRUE(s.waiting(r.get()));
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(r.use_count(), 2);
  EXPECT_EQ(s.unpark(r.get()), r);
  EXPECT_EQ(s.unpark(r.get()), nullptr);
  EXPECT_TRUE(s.empty());
}

// ---- OrderedDelivery ----------------------------------------------------------------------------

TEST(OrderedDelivery, DeliversInSubmitOrderPerKeyOneDrainAtATime) {
  OrderedDelivery<Pending, std::string> d;
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < 3; ++i) {
    auto r = req(0, t0);
    r->sequence_key = "k";
    r->order_seq = d.assign("k");
    EXPECT_EQ(r->order_seq, static_cast<std::uint64_t>(i));
    rs.push_back(r);
  }
  auto other = req(0, t0);
  other->sequence_key = "other";
  other->order_seq = d.assign("other");
  EXPECT_EQ(other->order_seq, 0u);  // each key has its own sequence

  const auto add = [&](const std::shared_ptr<Request>& r) {
    return d.add(r->sequence_key, r->order_seq, Pending{r, Outputs{}});
  };
  EXPECT_TRUE(add(rs[2]));                 // the caller starts a drain...
  EXPECT_TRUE(d.take_ready("k").empty());  // ...which finds nothing in order yet and ends
  EXPECT_TRUE(add(rs[1]));
  EXPECT_FALSE(add(rs[0]));  // a drain is running: it will deliver this one
  const std::vector<Pending> run = d.take_ready("k");
  ASSERT_EQ(run.size(), 3u);
  EXPECT_EQ(run[0].request, rs[0]);
  EXPECT_EQ(run[1].request, rs[1]);
  EXPECT_EQ(run[2].request, rs[2]);
  std::int64_t total = 0;
  std::map<std::string, std::int64_t> top;
  d.backlog(total, top, 64);
  EXPECT_EQ(total, 1);  // "other" is accepted and not delivered
  EXPECT_EQ(top, (std::map<std::string, std::int64_t>{{"other", 1}}));
  EXPECT_TRUE(d.take_ready("k").empty());  // the drain ends; key k is forgotten
}

// ---- AdmissionControl ---------------------------------------------------------------------------

TEST(AdmissionControl, RefusesWhenThePredictedWaitExceedsTheTimeLeft) {
  AdmissionControl a(true, 2);
  EXPECT_FALSE(a.check(1000, t0, t0 + 1us));  // no service time yet: admits
  a.observe(4000.0, 4);                       // 1 ms per request
  EXPECT_DOUBLE_EQ(a.service_us(), 1000.0);
  EXPECT_FALSE(a.check(10, t0, t0 + 5ms));     // 10 × 1 ms / 2 workers = 5 ms: just fits
  const auto why = a.check(12, t0, t0 + 5ms);  // 6 ms > 5 ms
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("predicted queue wait 6.0 ms"), std::string::npos) << *why;
  EXPECT_FALSE(a.check(1'000'000, t0, Clock::time_point::max()));  // no deadline
  a.observe(2000.0, 1);  // EWMA weight 1/8: 1000 + (2000 − 1000) / 8
  EXPECT_DOUBLE_EQ(a.service_us(), 1125.0);
  AdmissionControl off(false, 1);
  off.observe(1e9, 1);
  EXPECT_FALSE(off.check(100, t0, t0 + 1us));
}

// ---- EngineCounters -----------------------------------------------------------------------------

TEST(EngineCounters, AddToFillsTheCountersGaugesHistogramsAndStatistics) {
  EngineCounters c;
  c.submitted.fetch_add(5);
  c.count_rejection("queue_full");
  c.count_rejection("queue_full");
  c.count_rejection("bad_request");
  c.live_workers.store(2);
  c.attempts.fetch_add(6);
  c.batches.fetch_add(4);
  c.retries.fetch_add(3);
  c.retries_denied.fetch_add(1);
  c.split_batches.fetch_add(1);
  c.late_completions.fetch_add(2);
  c.count_late_failures(2, StatusCode::internal);
  c.count_late_failures(1, StatusCode::unavailable);
  c.count_late_failures(1, StatusCode::internal);
  c.model_exceptions.fetch_add(1);
  c.watchdog_fired.fetch_add(1);
  c.queue_us.observe(10);
  c.compute_us.observe(20);
  c.compute_us.observe(30);
  c.batch_size.observe(3);
  c.stat_queue.add(3, 3000);
  c.stat_input.add(1, 100);
  c.stat_infer.add(1, 200);
  c.stat_output.add(1, 300);
  c.inference_count.fetch_add(3);
  c.execution_count.fetch_add(1);
  c.last_inference_ms.store(1234);
  c.batch_stats.add(3, 100, 200, 300);

  EngineMetrics m;
  m.model = "kept";  // what is not the counters' is left as it was
  m.completed = 7;
  c.add_to(m);
  EXPECT_EQ(m.model, "kept");
  EXPECT_EQ(m.completed, 7u);
  EXPECT_EQ(m.submitted, 5u);
  EXPECT_EQ(m.rejected, 3u);
  EXPECT_EQ(m.rejections_by_reason,
            (std::map<std::string, std::uint64_t>{{"bad_request", 1}, {"queue_full", 2}}));
  EXPECT_EQ(m.live_workers, 2);
  EXPECT_EQ(m.attempts, 6u);
  EXPECT_EQ(m.batches, 4u);
  EXPECT_EQ(m.retries, 3u);
  EXPECT_EQ(m.retries_denied_by_budget, 1u);
  EXPECT_EQ(m.split_batches, 1u);
  EXPECT_EQ(m.late_completions, 2u);
  EXPECT_EQ(m.late_failures, 4u);
  EXPECT_EQ(m.late_failures_by_reason,
            (std::map<std::string, std::uint64_t>{{"internal", 3}, {"unavailable", 1}}));
  EXPECT_EQ(m.model_exceptions, 1u);
  EXPECT_EQ(m.watchdog_fired, 1u);
  EXPECT_EQ(m.queue_us.count, 1u);
  EXPECT_EQ(m.compute_us.count, 2u);
  EXPECT_DOUBLE_EQ(m.compute_us.sum, 50.0);
  EXPECT_EQ(m.batch_size.count, 1u);
  EXPECT_EQ(m.stats.inference_count, 3u);
  EXPECT_EQ(m.stats.execution_count, 1u);
  EXPECT_EQ(m.stats.last_inference_ms, 1234);
  EXPECT_EQ(m.stats.queue.count, 3u);
  EXPECT_EQ(m.stats.queue.ns, 3000u);
  EXPECT_EQ(m.stats.compute_input.ns, 100u);
  EXPECT_EQ(m.stats.compute_infer.ns, 200u);
  EXPECT_EQ(m.stats.compute_output.ns, 300u);
  ASSERT_EQ(m.stats.batch_stats.size(), 1u);
  EXPECT_EQ(m.stats.batch_stats[0].batch_size, 3);
  EXPECT_EQ(m.stats.batch_stats[0].compute_infer.ns, 200u);
}

TEST(EngineCounters, AFreshSetFillsZeros) {
  EngineCounters c;
  EngineMetrics m;
  c.add_to(m);
  EXPECT_EQ(m.submitted, 0u);
  EXPECT_TRUE(m.rejections_by_reason.empty());
  EXPECT_TRUE(m.late_failures_by_reason.empty());
  EXPECT_EQ(m.queue_us.count, 0u);
  EXPECT_TRUE(m.stats.batch_stats.empty());
}

// ---- Request life cycle -----------------------------------------------------------------------

TEST(RequestLifeCycle, TheTableAllowsTheDiagramAndNothingElse) {
  auto legal = [](Stage a, Stage b) { return kStageMoves.allows(a, b); };
  EXPECT_TRUE(legal(Stage::submitting, Stage::queued));
  EXPECT_FALSE(legal(Stage::submitting, Stage::running));
  EXPECT_FALSE(legal(Stage::submitting, Stage::cancelled));  // refused, never ended
  EXPECT_TRUE(legal(Stage::queued, Stage::running));
  EXPECT_TRUE(legal(Stage::queued, Stage::timed_out));
  EXPECT_FALSE(legal(Stage::queued, Stage::retry_wait));
  EXPECT_TRUE(legal(Stage::running, Stage::retry_wait));
  EXPECT_TRUE(legal(Stage::running, Stage::queued));  // requeued (split batch, recycled stream)
  EXPECT_TRUE(legal(Stage::retry_wait, Stage::queued));
  EXPECT_FALSE(legal(Stage::retry_wait, Stage::running));
  for (int to = 0; to < kStages; ++to) {
    EXPECT_FALSE(legal(Stage::completed, static_cast<Stage>(to)));
    EXPECT_FALSE(legal(Stage::shut_down, static_cast<Stage>(to)));
  }
  EXPECT_FALSE(needs_queue_lock(Stage::running, Stage::completed));
  EXPECT_TRUE(needs_queue_lock(Stage::running, Stage::queued));
  EXPECT_TRUE(needs_queue_lock(Stage::queued, Stage::cancelled));
}

TEST(RequestLifeCycle, TransitionMovesOnceAndTheLoserSeesFalse) {
  std::mutex mu;
  Request r;
  {
    std::unique_lock lock(mu);
    EXPECT_TRUE(transition(r, Stage::submitting, Stage::queued, lock));
    EXPECT_FALSE(transition(r, Stage::submitting, Stage::queued, lock));  // already moved
    EXPECT_TRUE(transition(r, Stage::queued, Stage::running, lock));
  }
  EXPECT_TRUE(transition_running(r, Stage::completed));
  EXPECT_FALSE(transition_running(r, Stage::cancelled));  // someone ended it first
  EXPECT_EQ(r.stage.load(), Stage::completed);
  EXPECT_EQ(outcome_of(Stage::timed_out), Outcome::timed_out);
  EXPECT_EQ(stage_for_error(StatusCode::aborted), Stage::shut_down);
  EXPECT_EQ(stage_for_error(StatusCode::internal), Stage::failed);
}

TEST(RequestLifeCycleDeathTest, IllegalTransitionsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::mutex mu;
  EXPECT_DEATH(
      {
        Request r;
        std::unique_lock lock(mu);
        transition(r, Stage::submitting, Stage::running, lock);
      },
      "submitting -> running: not in the table");
  EXPECT_DEATH(
      {
        Request r;
        std::unique_lock<std::mutex> unlocked(mu, std::defer_lock);
        transition(r, Stage::submitting, Stage::queued, unlocked);
      },
      "the queue mutex is not held");
  EXPECT_DEATH(
      {
        Request r;
        transition_running(r, Stage::queued);
      },
      "without the queue mutex");
}

}  // namespace
}  // namespace asyncinfer::detail
