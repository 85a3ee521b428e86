// The engine's failure paths (src/engine/batch_failure.hpp) alone: a BatchFailure over a
// Scheduler, a Resolver and EngineCounters, with requests built by hand and batches taken from the
// Scheduler as a worker would take them; no engine, no device and no worker. The only threads are
// the completion executor's and the deadline timer's (retry backoff). Each case names the rule of
// batch_failure.hpp it checks.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/batch_failure.hpp"
#include "test_support.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;
using testing::eventually;
using testing::get_within;

/// A prepared request (stage `submitting`), as EngineCore::prepare leaves it: one row of 4 f32.
std::shared_ptr<Request> prepared() {
  auto r = std::make_shared<Request>();
  r->submitted = Clock::now();
  r->enqueued = r->submitted;
  r->waiting_since = r->enqueued;
  r->deadline = Clock::time_point::max();
  r->rows = 1;
  r->inputs.push_back(*Tensor::zeros(DType::f32, {1, 4}));
  r->shape_key = compute_shape_key(r->inputs, /*batched=*/true);
  return r;
}

/// What an engine owns around its failure paths: the scheduler, the resolver, the timer, the
/// completion executor and the counters.
struct Fixture {
  explicit Fixture(EngineOptions o)
      : opt(std::move(o)),
        scheduler(opt, /*batched=*/true),
        resolver(opt, scheduler, timer, completion),
        failures(opt, /*sequence_plan=*/nullptr, scheduler, resolver, timer, counters) {}
  ~Fixture() {
    completion.shutdown();
    timer.shutdown();
  }

  /// A request with a future, accepted the way the engine does.
  Future<Outputs> submit(const std::shared_ptr<Request>& r) {
    r->promise.emplace();
    Future<Outputs> f = r->promise->get_future();
    resolver.bind_promise(*r->promise, r, /*inline_continuations=*/false, alive);
    EXPECT_FALSE(scheduler.accept(r, [&] { resolver.admit(r); }));
    return f;
  }

  /// The next batch, as worker 0 takes it; each request counts an attempt, as at launch.
  std::shared_ptr<Batch> take(std::int64_t rows = 8) {
    std::shared_ptr<Batch> b = scheduler.next_batch({0, rows, nullptr, nullptr});
    if (b) {
      for (const auto& r : b->requests) r->attempts.fetch_add(1);
    }
    return b;
  }

  EngineOptions opt;
  ThreadPool completion{1, "test-cb"};
  DeadlineTimer timer{"test-timer"};
  Scheduler scheduler;
  Resolver resolver;
  EngineCounters counters;
  BatchFailure failures;
  std::shared_ptr<int> alive = std::make_shared<int>(0);  // the owner token of bind_promise
};

// A batch that failed with a non-retryable error is split: each request runs again alone, and
// one that fails alone ends with the batch's error.
TEST(BatchFailure, ANonRetryableFailureSplitsTheBatchSoThatEachFailsAlone) {
  Fixture fx{EngineOptions{}};
  auto a = prepared();
  auto b = prepared();
  Future<Outputs> fa = fx.submit(a);
  Future<Outputs> fb = fx.submit(b);
  auto batch = fx.take();
  ASSERT_EQ(batch->requests.size(), 2u);
  fx.failures.batch_failed(batch, internal_error("bad input"));
  fx.scheduler.batch_finished(*batch);
  EXPECT_EQ(fx.counters.split_batches.load(), 1u);
  EXPECT_EQ(a->stage.load(), Stage::queued);
  EXPECT_TRUE(a->solo);
  EXPECT_EQ(fx.scheduler.depths().queued, 2);

  auto alone = fx.take();
  ASSERT_EQ(alone->requests.size(), 1u);  // solo: a batch of its own
  EXPECT_EQ(alone->requests[0], a);
  fx.failures.batch_failed(alone, internal_error("bad input"));
  fx.scheduler.batch_finished(*alone);
  Result<Outputs> got = get_within(fa);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::internal);
  EXPECT_EQ(got.status().message(), "bad input");
  EXPECT_EQ(fx.counters.split_batches.load(), 1u);  // a batch of one is not split
  EXPECT_EQ(b->stage.load(), Stage::queued);        // b waits for its own run
}

// A retryable failure parks the request until its backoff ends; the deadline timer then puts it
// back in the queue, and the retry is counted.
TEST(BatchFailure, ARetryableFailureWaitsOutItsBackoffThenIsQueuedAgain) {
  EngineOptions o;
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = 1ms;
  Fixture fx{o};
  auto r = prepared();
  Future<Outputs> f = fx.submit(r);
  auto batch = fx.take();
  fx.failures.batch_failed(batch, unavailable_error("busy"));
  fx.scheduler.batch_finished(*batch);
  EXPECT_EQ(fx.counters.retries.load(), 1u);
  EXPECT_EQ(fx.counters.split_batches.load(), 0u);
  ASSERT_TRUE(eventually([&] { return fx.scheduler.depths().queued == 1; }));
  EXPECT_EQ(fx.scheduler.depths().retry_waiting, 0);
  EXPECT_EQ(r->stage.load(), Stage::queued);

  // Its last attempt fails: it ends, naming its attempts.
  r->attempts.store(2);
  auto last = fx.take();
  ASSERT_EQ(last->requests.size(), 1u);
  fx.failures.batch_failed(last, unavailable_error("busy"));
  fx.scheduler.batch_finished(*last);
  Result<Outputs> got = get_within(f);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::unavailable);
  EXPECT_NE(got.status().message().find("failed after 3 attempts"), std::string::npos)
      << got.status().to_string();
}

// A failure that reaches requests which had already ended is a late failure, counted by reason;
// the engine's own stop (aborted) is not. A late success is a late completion.
TEST(BatchFailure, AFailureOfEndedRequestsIsLateUnlessTheEngineStoppedThem) {
  Fixture fx{EngineOptions{}};
  auto gone = prepared();
  auto live = prepared();
  Future<Outputs> fg = fx.submit(gone);
  Future<Outputs> fl = fx.submit(live);
  auto batch = fx.take();
  ASSERT_EQ(batch->requests.size(), 2u);
  ASSERT_TRUE(fx.resolver.try_resolve(gone, Stage::cancelled, cancelled_error("by the caller")));
  fx.failures.batch_failed(batch, internal_error("model crashed"));
  EXPECT_EQ(fx.counters.late_failures.load(), 1u);
  EXPECT_EQ(fx.counters.split_batches.load(), 0u);  // one running request: nothing to split
  EXPECT_EQ(get_within(fl).status().code(), StatusCode::internal);

  fx.failures.late_outcome(*batch, aborted_error("stream destroyed"));
  EXPECT_EQ(fx.counters.late_failures.load(), 1u);
  Batch other;  // cancelled is the engine's own stop only where the batch's stop was requested
  EXPECT_TRUE(BatchFailure::own_stop(other, aborted_error("stream destroyed")));
  EXPECT_FALSE(BatchFailure::own_stop(other, cancelled_error("by the model")));
  other.stop.request_stop();
  EXPECT_TRUE(BatchFailure::own_stop(other, cancelled_error("its requests ended")));
  fx.failures.late_outcome(*batch, Status());
  EXPECT_EQ(fx.counters.late_completions.load(), 2u);
  fx.failures.late_outcome(*batch, internal_error("again"));
  EXPECT_EQ(fx.counters.late_failures.load(), 3u);

  EngineMetrics m;
  fx.counters.add_to(m);
  EXPECT_EQ(m.late_failures_by_reason.at("internal"), 3u);
  fx.scheduler.batch_finished(*batch);
  EXPECT_EQ(get_within(fg).status().code(), StatusCode::cancelled);
}

// When the last worker gave up, what waits fails unavailable and later submits are refused.
TEST(BatchFailure, NoWorkerLeftEndsWhatWaitsAndRefusesLaterSubmits) {
  Fixture fx{EngineOptions{}};
  auto r = prepared();
  Future<Outputs> f = fx.submit(r);
  fx.failures.no_worker_left("worker 0 is unhealthy");
  Result<Outputs> got = get_within(f);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::unavailable);
  EXPECT_NE(got.status().message().find("worker 0 is unhealthy"), std::string::npos);
  auto later = prepared();
  std::optional<Refusal> refused = fx.scheduler.accept(later, [] {});
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status.code(), StatusCode::unavailable);
}

}  // namespace
}  // namespace asyncinfer::detail
