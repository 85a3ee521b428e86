// Deadlines, cancellation, retries, circuit breaker and the hang watchdog (issue 5).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <set>
#include <thread>

#include "asyncinfer/engine.hpp"
#include "engine_support.hpp"
#include "test_models.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::Call;
using testing::Decision;
using testing::first_value;
using testing::get_within;
using testing::make_engine;
using testing::one;
using testing::ScriptedModel;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::unique_ptr<Engine> scripted_engine(const std::shared_ptr<ScriptedModel>& model,
                                        EngineOptions o, const std::string& device = "cpu") {
  auto d = open_device(device);
  auto e = Engine::create(model, *d, std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

EngineOptions serial() {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = 1;
  return o;
}

// ---- deadlines ------------------------------------------------------------------------------

TEST(Deadlines, QueuedRequestTimesOutOnTimeBehindALongJob) {
  // Each item's first element is its cost in microseconds (cost_from_input).
  auto engine = make_engine("builtin:fixed_cost?cost_from_input=true", "sim", serial());
  auto long_job = engine->submit(one(900'000));
  ASSERT_TRUE(testing::eventually([&] { return engine->metrics().queue_depth == 0; }));
  const auto t0 = Clock::now();
  RequestOptions ro;
  ro.timeout = 100ms;
  auto short_job = engine->submit(one(10), ro);
  EXPECT_EQ(engine->metrics().queue_depth, 1);
  auto r = get_within(short_job, 5000ms);
  const double waited = ms_since(t0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::deadline_exceeded);
  EXPECT_NE(r.status().message().find("while queued"), std::string_view::npos) << r.status();
  EXPECT_GE(waited, 99.0);
  EXPECT_LT(waited, 400.0);  // about 100 ms, not 900 (the queue was never touched meanwhile)
  EXPECT_EQ(engine->metrics().queue_depth, 0);  // its slot is free
  EXPECT_FALSE(long_job.is_ready());            // the job ahead still runs...
  auto lr = get_within(long_job, 5000ms);
  EXPECT_TRUE(lr.ok()) << lr.status();  // ...and completes
  EXPECT_EQ(engine->metrics().timed_out, 1u);
}

TEST(Deadlines, RunningRequestResolvesAtOnceAndItsWorkIsCancelled) {
  auto engine = make_engine("builtin:faulty?mode=hang", "sim", serial());
  RequestOptions ro;
  ro.timeout = 80ms;
  const auto t0 = Clock::now();
  auto r = get_within(engine->submit(one(1), ro), 5000ms);
  EXPECT_EQ(r.status().code(), StatusCode::deadline_exceeded);
  EXPECT_NE(r.status().message().find("while running"), std::string_view::npos) << r.status();
  EXPECT_LT(ms_since(t0), 400.0);
  // The hanging work was stopped (sim and the faulty model's hang can be): the batch reached
  // its completion point and freed the worker's in-flight slot.
  EXPECT_TRUE(testing::eventually(
      [&] { return engine->metrics().workers.at(0).inflight_batches == 0; }, 5000ms));
  auto next = get_within(engine->submit(one(1), ro), 5000ms);  // dispatched, then times out too
  EXPECT_NE(next.status().message().find("while running"), std::string_view::npos) << next.status();
}

TEST(Deadlines, LateResultOfUncancellableWorkIsDiscardedAndCounted) {
  auto engine = make_engine("builtin:fixed_cost?base_us=200000&cancellable=false", "sim", serial());
  std::atomic<int> callbacks{0};
  Promise<StatusCode> got;
  auto got_f = got.get_future();
  RequestOptions ro;
  ro.timeout = 50ms;
  ASSERT_TRUE(engine->submit("late", one(7), ro).ok());
  ASSERT_TRUE(engine
                  ->submit(
                      one(7),
                      [&](const Result<Outputs>& r) {
                        callbacks++;
                        got.set_value(r.status().code());
                      },
                      ro)
                  .ok());
  EXPECT_EQ(*get_within(got_f, 5000ms), StatusCode::deadline_exceeded);
  // The first timed out while running (its result arrives late); the second while queued.
  ASSERT_TRUE(testing::eventually([&] { return engine->metrics().late_completions == 1; }));
  // The late result changed nothing the caller sees.
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_EQ(engine->status("late"), RequestState::timed_out);
  EXPECT_EQ(engine->result("late", 1s).status().code(), StatusCode::deadline_exceeded);
  EXPECT_EQ(engine->metrics().completed, 0u);
}

TEST(Deadlines, EngineDefaultTimeoutMayOnlyBeShortened) {
  EngineOptions o = serial();
  o.default_timeout = 60ms;
  auto engine = make_engine("builtin:fixed_cost?base_us=3000000", "sim", o);
  RequestOptions longer;
  longer.timeout = 10s;
  const auto t0 = Clock::now();
  EXPECT_EQ(get_within(engine->submit(one(1), longer), 5000ms).status().code(),
            StatusCode::deadline_exceeded);
  EXPECT_LT(ms_since(t0), 1500.0);  // the engine's 60 ms applied, not the 3 s of work
  RequestOptions shorter;
  shorter.timeout = 20ms;
  const auto t1 = Clock::now();
  EXPECT_EQ(get_within(engine->submit(one(1), shorter), 5000ms).status().code(),
            StatusCode::deadline_exceeded);
  EXPECT_LT(ms_since(t1), 1500.0);

  o.allow_timeout_override = true;
  auto overriding = make_engine("builtin:fixed_cost?base_us=100000", "sim", o);
  auto r = get_within(overriding->submit(one(1), longer), 5000ms);
  EXPECT_TRUE(r.ok()) << r.status();  // allowed to run past the default
}

TEST(Deadlines, AbsoluteDeadlineAndTimeoutTakeTheEarlier) {
  auto engine = make_engine("builtin:fixed_cost?base_us=3000000", "sim", serial());
  RequestOptions ro;
  ro.timeout = 10s;
  ro.deadline = Clock::now() + 40ms;
  const auto t0 = Clock::now();
  EXPECT_EQ(get_within(engine->submit(one(1), ro), 5000ms).status().code(),
            StatusCode::deadline_exceeded);
  EXPECT_LT(ms_since(t0), 1500.0);  // the 40 ms deadline applied, not the 3 s of work
}

TEST(Deadlines, AdmissionControlRejectsWhatCannotMakeItsDeadline) {
  EngineOptions o = serial();
  o.admission_control = true;
  auto engine = make_engine("builtin:fixed_cost?base_us=20000", "sim", o);
  ASSERT_TRUE(engine->infer(one(1)).ok());  // learn the service time (~20 ms)
  std::vector<Future<Outputs>> backlog;
  for (int i = 0; i < 10; ++i) backlog.push_back(engine->submit(one(1)));
  RequestOptions tight;
  tight.timeout = 50ms;
  auto refused = engine->submit(one(1), tight);
  ASSERT_TRUE(refused.is_ready());
  auto r = refused.get();
  EXPECT_EQ(r.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(r.status().message().find("predicted queue wait"), std::string_view::npos)
      << r.status();
  RequestOptions loose;
  loose.timeout = 5s;
  EXPECT_TRUE(get_within(engine->submit(one(1), loose), 10'000ms).ok());
  EXPECT_EQ(engine->metrics().rejections_by_reason.at("admission"), 1u);
}

// ---- cancellation ---------------------------------------------------------------------------

TEST(Cancellation, FutureCancelOfQueuedAndRunningRequests) {
  auto engine = make_engine("builtin:fixed_cost?base_us=3000000", "sim", serial());
  auto running = engine->submit(one(1));
  ASSERT_TRUE(testing::eventually([&] { return engine->metrics().queue_depth == 0; }));
  auto queued = engine->submit(one(2));
  EXPECT_EQ(engine->metrics().queue_depth, 1);
  EXPECT_TRUE(queued.cancel());
  EXPECT_EQ(engine->metrics().queue_depth, 0);  // left the queue at once
  EXPECT_EQ(queued.get().status().code(), StatusCode::cancelled);
  const auto t0 = Clock::now();
  EXPECT_TRUE(running.cancel());
  EXPECT_EQ(get_within(running, 5000ms).status().code(), StatusCode::cancelled);
  EXPECT_LT(ms_since(t0), 1500.0);  // resolved at once, not after the 3 s of work
  auto next = get_within(engine->submit(one(3)), 10'000ms);  // 3 s of work
  EXPECT_TRUE(next.ok());
  EXPECT_EQ(engine->metrics().cancelled, 2u);
}

TEST(Cancellation, RacingCompletionEndsInExactlyOneTerminalState) {
  EngineOptions o;
  o.workers = 2;
  auto engine = make_engine("builtin:identity", "cpu", o);
  constexpr int kIters = 10'000;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> offset_us(0, 60);
  std::vector<std::atomic<int>> calls(kIters);
  std::atomic<int> ok{0}, cancelled{0}, other{0};
  std::vector<Future<Outputs>> fs;
  fs.reserve(kIters);
  for (int i = 0; i < kIters; ++i) {
    auto f = engine->submit(one(static_cast<float>(i)));
    f.on_complete([&, i](const Result<Outputs>& r) {
      calls[static_cast<std::size_t>(i)]++;
      if (r.ok()) {
        ok++;
      } else if (r.status().code() == StatusCode::cancelled) {
        cancelled++;
      } else {
        other++;
      }
    });
    const auto until = Clock::now() + std::chrono::microseconds(offset_us(rng));
    while (Clock::now() < until) {
    }
    f.cancel();
    fs.push_back(std::move(f));
  }
  for (auto& f : fs) ASSERT_TRUE(f.wait_for(30s));
  ASSERT_TRUE(testing::eventually([&] { return ok + cancelled + other == kIters; }));
  for (auto& c : calls) ASSERT_EQ(c.load(), 1);
  EXPECT_EQ(other.load(), 0);
  const auto m = engine->metrics();
  EXPECT_EQ(m.completed + m.cancelled, static_cast<std::uint64_t>(kIters));
  EXPECT_EQ(static_cast<int>(m.completed), ok.load());
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(cancelled.load(), 0);
}

// ---- retries --------------------------------------------------------------------------------

TEST(Retry, AlwaysBusyDeviceGetsExactlyMaxAttempts) {
  EngineOptions o = serial();
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = 1ms;
  o.retry.max_backoff = 5ms;
  auto engine = make_engine("builtin:faulty?code=unavailable", "cpu", o);
  auto r = engine->infer(one(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unavailable);
  EXPECT_NE(r.status().message().find("failed after 3 attempts"), std::string_view::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("injected fault"), std::string_view::npos);  // last error
  const auto m = engine->metrics();
  EXPECT_EQ(m.attempts, 3u);
  EXPECT_EQ(m.retries, 2u);
  EXPECT_EQ(m.failed, 1u);
}

TEST(Retry, RecoversWhenTheDeviceDoes) {
  EngineOptions o = serial();
  o.retry.max_attempts = 5;
  o.retry.initial_backoff = 1ms;
  auto engine = make_engine("builtin:faulty?code=unavailable&first=2", "cpu", o);
  auto r = engine->infer(one(4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(first_value(*r), 4.0f);
  EXPECT_EQ(engine->metrics().attempts, 3u);
}

TEST(Retry, NonRetryableErrorIsNeverRetried) {
  EngineOptions o = serial();
  o.retry.max_attempts = 5;
  for (const char* code : {"internal", "invalid_argument"}) {
    auto engine = make_engine(std::string("builtin:faulty?code=") + code, "cpu", o);
    auto r = engine->infer(one(1));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(to_string(r.status().code()), code);
    EXPECT_EQ(engine->metrics().attempts, 1u) << code;
    EXPECT_EQ(engine->metrics().retries, 0u) << code;
  }
}

TEST(Retry, RetriesStopAtTheDeadline) {
  EngineOptions o = serial();
  o.retry.max_attempts = 1000;
  o.retry.initial_backoff = 4ms;
  o.retry.max_backoff = 8ms;
  o.retry.budget_min_retries_per_s = 1e6;
  auto engine = make_engine("builtin:faulty?code=unavailable", "cpu", o);
  RequestOptions ro;
  // 300 ms of a 4–8 ms backoff: 40–75 attempts, then the deadline; 1,000 attempts would take
  // 6 s. Margins a loaded machine keeps (with 50 ms, a late-scheduled worker saw no attempt).
  ro.timeout = 300ms;
  const auto t0 = Clock::now();
  auto r = get_within(engine->submit(one(1), ro), 10000ms);
  const double took = ms_since(t0);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(took, 2000.0);
  const auto m = engine->metrics();
  EXPECT_GE(m.attempts, 2u);
  EXPECT_LT(m.attempts, 200u);
  // Either the deadline fired while it waited, or no attempt was started that could not finish
  // in time; never an attempt past the deadline.
  EXPECT_TRUE(r.status().code() == StatusCode::deadline_exceeded ||
              r.status().message().find("no time left") != std::string_view::npos)
      << r.status();
}

TEST(Retry, ConcurrentFailuresRetryAtSpreadOutTimes) {
  // Every first attempt fails with unavailable; retries succeed. With full jitter, the 100
  // second attempts are spread over the backoff window instead of arriving together.
  auto seen = std::make_shared<std::set<float>>();  // the script runs on one worker thread
  auto model = std::make_shared<ScriptedModel>([seen](const Call& c) {
    const bool first_attempt = seen->insert(c.firsts.at(0)).second;
    return Decision{first_attempt ? unavailable_error("busy") : Status(), {}};
  });
  EngineOptions o;
  o.batching.max_batch_size = 1;
  o.max_inflight_per_worker = 4;
  o.retry.max_attempts = 2;
  // A 200 ms window: wide enough that a worker thread starved for tens of ms on a loaded machine
  // (which bunches the calls it then makes) cannot crowd half the retries into 2 ms.
  o.retry.initial_backoff = 200ms;
  o.retry.max_backoff = 200ms;
  o.retry.budget_min_retries_per_s = 1e6;
  auto engine = scripted_engine(model, o);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 100; ++i) fs.push_back(engine->submit(one(static_cast<float>(i))));
  for (auto& f : fs) ASSERT_TRUE(get_within(f, 10'000ms).ok());
  auto calls = model->calls();
  ASSERT_EQ(calls.size(), 200u);
  std::set<float> firsts_seen;
  std::vector<double> second;  // times of the retries, ms after the earliest retry
  for (const Call& c : calls) {
    if (!firsts_seen.insert(c.firsts.at(0)).second) {
      second.push_back(std::chrono::duration<double, std::milli>(c.at - calls[0].at).count());
    }
  }
  ASSERT_EQ(second.size(), 100u);
  std::sort(second.begin(), second.end());
  const double spread = second.back() - second.front();
  EXPECT_GT(spread, 75.0) << "retries arrived in lockstep";
  // Not all in one 2 ms slot: count the most crowded 2 ms window.
  std::size_t crowded = 0;
  for (std::size_t i = 0, j = 0; i < second.size(); ++i) {
    while (second[i] - second[j] > 2.0) ++j;
    crowded = std::max(crowded, i - j + 1);
  }
  EXPECT_LT(crowded, 50u);
}

TEST(Retry, BudgetStopsARetryStorm) {
  EngineOptions o = serial();
  o.retry.max_attempts = 10;
  o.retry.initial_backoff = 100us;
  o.retry.max_backoff = 200us;
  o.retry.budget_ratio = 0.0;
  o.retry.budget_min_retries_per_s = 0.5;  // 5 retries per 10 s window
  auto engine = make_engine("builtin:faulty?code=unavailable", "cpu", o);
  for (int i = 0; i < 10; ++i) (void)engine->infer(one(1));
  const auto m = engine->metrics();
  EXPECT_EQ(m.retries, 5u);
  EXPECT_GE(m.retries_denied_by_budget, 5u);
  auto r = engine->infer(one(1));
  EXPECT_NE(r.status().message().find("retry budget exhausted"), std::string_view::npos)
      << r.status();
}

// ---- circuit breaker and watchdog -----------------------------------------------------------

TEST(CircuitBreaker, FailingWorkerIsTakenOutAndProbedAfterCooldown) {
  auto model = std::make_shared<ScriptedModel>([](const Call& c) {
    return Decision{c.instance == 0 ? unavailable_error("worker 0 is sick") : Status(),
                    std::chrono::microseconds(500)};
  });
  EngineOptions o;
  o.workers = 2;
  o.batching.max_batch_size = 1;
  o.max_inflight_per_worker = 1;
  o.breaker.failure_threshold = 3;
  o.breaker.cooldown = 1s;  // long enough that the 60 requests finish inside it
  o.retry.max_attempts = 4;
  o.retry.initial_backoff = 100us;
  o.retry.budget_min_retries_per_s = 1e6;
  auto engine = scripted_engine(model, o);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 60; ++i) fs.push_back(engine->submit(one(static_cast<float>(i))));
  for (auto& f : fs) EXPECT_TRUE(get_within(f, 10'000ms).ok());
  const auto m = engine->metrics();
  EXPECT_EQ(m.workers.at(0).breaker, "open");
  EXPECT_EQ(m.workers.at(1).breaker, "closed");
  auto calls = model->calls();
  const auto sick =
      std::count_if(calls.begin(), calls.end(), [](const Call& c) { return c.instance == 0; });
  EXPECT_LE(sick, 4);  // taken out after 3 failures (one more may have been in flight)
  // After the cool-down it is probed with one request, fails, and opens again. Workers pull from
  // one queue, so requests one at a time may all go to the healthy worker (seen under load);
  // bursts of ten keep it busy, and the half-open worker takes one.
  ASSERT_TRUE(
      testing::eventually([&] { return engine->metrics().workers.at(0).breaker == "half_open"; }));
  auto sick_after = sick;
  for (int burst = 0; burst < 100 && sick_after == sick; ++burst) {
    std::vector<Future<Outputs>> more;
    for (int i = 0; i < 10; ++i) more.push_back(engine->submit(one(1)));
    for (auto& f : more) EXPECT_TRUE(get_within(f, 10'000ms).ok());
    calls = model->calls();
    sick_after =
        std::count_if(calls.begin(), calls.end(), [](const Call& c) { return c.instance == 0; });
  }
  EXPECT_EQ(sick_after, sick + 1);
  EXPECT_EQ(engine->metrics().workers.at(0).breaker, "open");
}

TEST(Watchdog, HangingBatchFailsAndTheWorkerIsRecycled) {
  EngineOptions o = serial();
  o.watchdog = 200ms;
  auto engine = make_engine("builtin:faulty?mode=hang&first=1", "sim", o);
  const auto t0 = Clock::now();
  auto hung = engine->submit(one(1));
  auto after = engine->submit(one(2));
  auto r = get_within(hung, 5000ms);
  EXPECT_EQ(r.status().code(), StatusCode::deadline_exceeded);
  EXPECT_NE(r.status().message().find("watchdog"), std::string_view::npos) << r.status();
  EXPECT_GE(ms_since(t0), 195.0);
  auto ok = get_within(after, 5000ms);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(first_value(*ok), 2.0f);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(engine->infer(one(3)).ok());
  const auto m = engine->metrics();
  EXPECT_EQ(m.watchdog_fired, 1u);
  EXPECT_EQ(m.workers.at(0).recycles, 1u);
}

TEST(Watchdog, HangOnUncancellableWorkDoesNotBlockTheEngine) {
  // The hung kernel ignores its stop token; the old stream is destroyed off the hot path and
  // the engine goes on with a new stream.
  EngineOptions o = serial();
  o.watchdog = 100ms;
  auto engine = make_engine("builtin:faulty?mode=hang&first=1&cancellable=false", "sim", o);
  auto hung = engine->submit(one(1));
  EXPECT_EQ(get_within(hung, 5000ms).status().code(), StatusCode::deadline_exceeded);
  auto ok = get_within(engine->submit(one(2)), 5000ms);
  EXPECT_TRUE(ok.ok()) << ok.status();
  engine->shutdown(ShutdownMode::cancel);
}

}  // namespace
}  // namespace asyncinfer
