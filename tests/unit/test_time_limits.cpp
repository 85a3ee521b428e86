// max() means "no limit" everywhere (issue 13, part 2; docs/design.md guarantee 4): every function
// and option of include/asyncinfer/ that takes a duration or a time point, given
// std::chrono::*::max(), waits (or keeps, or holds off) without a limit instead of overflowing
// into a limit in the past; each has a control with a finite value. The asan preset builds with
// -fsanitize=undefined and halt_on_error, so an overflow left anywhere fails these tests there.
// The helpers themselves (detail/chrono.hpp) are tested at the edges first.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "asyncinfer/asyncinfer.hpp"
#include "asyncinfer/detail/chrono.hpp"
#include "engine_support.hpp"
#include "test_models.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using std::chrono::hours;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using std::chrono::system_clock;
using testing::eventually;
using testing::first_value;
using testing::get_within;
using testing::make_engine;
using testing::must_return_within;
using testing::one;

/// A promise that is set from another thread after `after`.
template <class T>
struct LateValue {
  Promise<T> promise;
  Future<T> future = promise.get_future();
  std::jthread setter;
  LateValue(T v, milliseconds after)
      : setter([this, v, after] {
          std::this_thread::sleep_for(after);
          promise.set_value(v);
        }) {}
};

// ---- the helpers ------------------------------------------------------------------------------

TEST(Saturating, CastClampsAtBothEnds) {
  using detail::saturating_cast;
  static_assert(saturating_cast<nanoseconds>(milliseconds::max()) == nanoseconds::max());
  static_assert(saturating_cast<nanoseconds>(hours::min()) == nanoseconds::min());
  static_assert(saturating_cast<nanoseconds>(milliseconds(5)) == nanoseconds(5'000'000));
  static_assert(saturating_cast<milliseconds>(nanoseconds(5'999'999)) == milliseconds(5));
  static_assert(saturating_cast<milliseconds>(nanoseconds(-5'999'999)) == milliseconds(-5));
  EXPECT_EQ(saturating_cast<microseconds>(std::chrono::duration<double>::max()),
            microseconds::max());
  EXPECT_EQ(saturating_cast<microseconds>(std::chrono::duration<double, std::micro>(1e300)),
            microseconds::max());
  EXPECT_EQ(saturating_cast<microseconds>(std::chrono::duration<double>(-1e300)),
            microseconds::min());
  EXPECT_EQ(saturating_cast<microseconds>(
                std::chrono::duration<double>(std::numeric_limits<double>::quiet_NaN())),
            microseconds::zero());
  EXPECT_EQ(saturating_cast<microseconds>(std::chrono::duration<double, std::micro>(2.5)),
            microseconds(2));
}

TEST(Saturating, AddSumSubAndConversionsBetweenClocks) {
  using detail::saturating_add;
  const auto now = steady_clock::now();
  EXPECT_EQ(saturating_add(now, nanoseconds::max()), steady_clock::time_point::max());
  EXPECT_EQ(saturating_add(now, hours::max()), steady_clock::time_point::max());
  EXPECT_LT(saturating_add(now, hours::min()), now);  // representable: no clamping needed
  EXPECT_EQ(saturating_add(steady_clock::time_point::min() + 1h, hours::min()),
            steady_clock::time_point::min());
  EXPECT_EQ(saturating_add(now, 5ms), now + 5ms);
  EXPECT_EQ(saturating_add(steady_clock::time_point::max(), 1ns), steady_clock::time_point::max());
  EXPECT_EQ(detail::saturating_sum(milliseconds::max(), 1ms), milliseconds::max());
  EXPECT_EQ(detail::saturating_sum(milliseconds::min(), -1ms), milliseconds::min());
  EXPECT_EQ(detail::saturating_sub(milliseconds::min(), 1ms), milliseconds::min());
  EXPECT_EQ(detail::saturating_sub(milliseconds::max(), -1ms), milliseconds::max());
  EXPECT_EQ(detail::saturating_sub(5ms, 2ms), 3ms);
  EXPECT_EQ(detail::deadline_after(seconds::max()), steady_clock::time_point::max());
  EXPECT_EQ(detail::to_steady(system_clock::time_point::max()), steady_clock::time_point::max());
  EXPECT_EQ(detail::to_steady(std::chrono::time_point<steady_clock, seconds>::max()),
            steady_clock::time_point::max());
  // A finite time point of another clock keeps its distance from now (within the two reads).
  const auto in_a_second = detail::to_steady(system_clock::now() + 1s);
  EXPECT_GT(in_a_second, steady_clock::now() + 900ms);
  EXPECT_LT(in_a_second, steady_clock::now() + 1100ms);
  EXPECT_LT(detail::to_steady(system_clock::time_point::min()), steady_clock::now());
}

// ---- futures ----------------------------------------------------------------------------------

TEST(NoLimit, FutureWaitForAnyUnitsMax) {
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_for(nanoseconds::max()));
  }
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_for(milliseconds::max()));
  }
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_for(hours::max()));
  }
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_for(std::chrono::duration<double>::max()));
  }
  // Control: a finite wait on a future that is not set in time returns false after it.
  LateValue<int> v(1, 300ms);
  const auto t0 = steady_clock::now();
  EXPECT_FALSE(v.future.wait_for(20ms));
  EXPECT_GE(steady_clock::now() - t0, 20ms);
}

TEST(NoLimit, FutureWaitUntilMaxOfAnyClock) {
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_until(steady_clock::time_point::max()));
  }
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_until(system_clock::time_point::max()));
  }
  {
    LateValue<int> v(1, 50ms);
    EXPECT_TRUE(v.future.wait_until(std::chrono::time_point<steady_clock, seconds>::max()));
  }
  LateValue<int> v(1, 300ms);
  EXPECT_FALSE(v.future.wait_until(system_clock::now() + 20ms));
  EXPECT_FALSE(v.future.wait_until(steady_clock::now() + 20ms));
}

// ---- the timer --------------------------------------------------------------------------------

TEST(NoLimit, TimerAtMaxNeverFiresAndCanBeCancelled) {
  DeadlineTimer timer;
  std::atomic<int> fired{0};
  const TimerId never = timer.add(Clock::time_point::max(), [&] { ++fired; });
  const TimerId never2 = timer.add(system_clock::time_point::max(), [&] { ++fired; });
  std::atomic<bool> soon{false};
  timer.add(Clock::now() + 10ms, [&] { soon = true; });  // control
  ASSERT_TRUE(eventually([&] { return soon.load(); }, 5000ms));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fired.load(), 0);
  EXPECT_EQ(timer.pending(), 2u);
  EXPECT_TRUE(timer.cancel(never));
  EXPECT_TRUE(timer.cancel(never2));
  timer.shutdown();
}

// ---- devices: events, streams, kernels ---------------------------------------------------------

Kernel timed_kernel(nanoseconds d, std::stop_token stop = {}) {
  Kernel k;
  k.name = "timed";
  k.duration = d;
  k.stop = std::move(stop);
  return k;
}

class NoLimitDevice : public ::testing::TestWithParam<const char*> {};

TEST_P(NoLimitDevice, SynchronizeForMaxWaitsForTheWork) {
  auto device = *open_device(GetParam());
  auto stream = *device->create_stream();
  auto event = *device->create_event();
  for (int unit = 0; unit < 3; ++unit) {
    ASSERT_TRUE(stream->enqueue(timed_kernel(50ms)).ok());
    ASSERT_TRUE(stream->record(*event).ok());
    Status s = unit == 0   ? event->synchronize_for(nanoseconds::max())
               : unit == 1 ? event->synchronize_for(milliseconds::max())
                           : event->synchronize_for(hours::max());
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(event->query());
    ASSERT_TRUE(stream->enqueue(timed_kernel(50ms)).ok());
    s = unit == 0   ? stream->synchronize_for(nanoseconds::max())
        : unit == 1 ? stream->synchronize_for(milliseconds::max())
                    : stream->synchronize_for(hours::max());
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(stream->query());
  }
  // Control: a finite timeout on unfinished work expires.
  ASSERT_TRUE(stream->enqueue(timed_kernel(300ms)).ok());
  ASSERT_TRUE(stream->record(*event).ok());
  EXPECT_EQ(event->synchronize_for(5ms).code(), StatusCode::deadline_exceeded);
  EXPECT_EQ(stream->synchronize_for(5ms).code(), StatusCode::deadline_exceeded);
  EXPECT_TRUE(stream->synchronize().ok());
}

TEST_P(NoLimitDevice, KernelOfDurationMaxRunsUntilStopped) {
  auto device = *open_device(GetParam());
  auto stream = *device->create_stream();
  std::stop_source stop;
  ASSERT_TRUE(stream->enqueue(timed_kernel(nanoseconds::max(), stop.get_token())).ok());
  std::atomic<bool> done{false};
  Status seen;
  ASSERT_TRUE(stream
                  ->launch_host_func([&](Status s) {
                    seen = s;
                    done = true;
                  })
                  .ok());
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(done.load()) << "a kernel of duration max() ended by itself: " << seen;
  stop.request_stop();
  ASSERT_TRUE(eventually([&] { return done.load(); }, 5000ms));
  EXPECT_EQ(seen.code(), StatusCode::cancelled) << seen;
  // Control: a finite kernel ends by itself.
  done = false;
  ASSERT_TRUE(stream->enqueue(timed_kernel(10ms)).ok());
  ASSERT_TRUE(stream
                  ->launch_host_func([&](Status s) {
                    seen = s;
                    done = true;
                  })
                  .ok());
  ASSERT_TRUE(eventually([&] { return done.load(); }, 5000ms));
  EXPECT_TRUE(seen.ok()) << seen;
}

INSTANTIATE_TEST_SUITE_P(HostBackends, NoLimitDevice, ::testing::Values("cpu", "sim"));

// ---- the engine: request options ----------------------------------------------------------------

TEST(NoLimit, RequestTimeoutAndDeadlineMax) {
  auto engine = make_engine("builtin:fixed_cost?base_us=30000", "sim");
  ASSERT_TRUE(engine);
  RequestOptions ro;
  ro.timeout = microseconds::max();
  EXPECT_TRUE(get_within(engine->submit(one(1), ro)).ok());
  RequestOptions rd;
  rd.deadline = Clock::time_point::max();
  EXPECT_TRUE(get_within(engine->submit(one(1), rd)).ok());
  RequestOptions control;
  control.timeout = 2ms;
  EXPECT_EQ(get_within(engine->submit(one(1), control)).status().code(),
            StatusCode::deadline_exceeded);
}

TEST(NoLimit, DefaultTimeoutMax) {
  EngineOptions o;
  o.default_timeout = microseconds::max();
  auto engine = make_engine("builtin:fixed_cost?base_us=30000", "sim", o);
  ASSERT_TRUE(engine);
  EXPECT_TRUE(get_within(engine->submit(one(1))).ok());
  EngineOptions c;
  c.default_timeout = 2ms;
  auto control = make_engine("builtin:fixed_cost?base_us=30000", "sim", c);
  EXPECT_EQ(get_within(control->submit(one(1))).status().code(), StatusCode::deadline_exceeded);
}

TEST(NoLimit, ResultByIdWithATimeoutOfAnyUnitsMax) {
  auto engine = make_engine("builtin:fixed_cost?base_us=50000", "sim");
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->submit("a", one(1)).ok());
  EXPECT_TRUE(engine->result("a", milliseconds::max()).ok());
  ASSERT_TRUE(engine->submit("b", one(2)).ok());
  EXPECT_TRUE(engine->result("b", hours::max()).ok());
  ASSERT_TRUE(engine->submit("c", one(3)).ok());
  EXPECT_TRUE(engine->result("c", nanoseconds::max()).ok());
  ASSERT_TRUE(engine->submit("d", one(4)).ok());
  EXPECT_EQ(engine->result("d", 1ms).status().code(), StatusCode::deadline_exceeded);  // control
}

// ---- the engine: options ------------------------------------------------------------------------

/// One worker busy with a `busy_us` job, a queue of one that is full, and a blocking submit.
EngineOptions full_queue(microseconds submit_timeout) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = 1;
  o.queue_capacity = 1;
  o.queue_full_policy = QueueFullPolicy::block;
  o.submit_timeout = submit_timeout;
  return o;
}

TEST(NoLimit, SubmitTimeoutMaxWaitsForRoom) {
  auto engine =
      make_engine("builtin:fixed_cost?base_us=60000", "sim", full_queue(microseconds::max()));
  ASSERT_TRUE(engine);
  auto a = engine->submit(one(1));
  ASSERT_TRUE(eventually([&] { return engine->metrics().queue_depth == 0; }));
  auto b = engine->submit(one(2));
  auto c = engine->submit(one(3));  // waits for room: it does not fail at once
  EXPECT_TRUE(get_within(c).ok()) << get_within(c).status();
  auto control_engine =
      make_engine("builtin:fixed_cost?base_us=60000", "sim", full_queue(microseconds(5000)));
  auto x = control_engine->submit(one(1));
  ASSERT_TRUE(eventually([&] { return control_engine->metrics().queue_depth == 0; }));
  auto y = control_engine->submit(one(2));
  auto z = control_engine->submit(one(3));
  EXPECT_EQ(get_within(z).status().code(), StatusCode::resource_exhausted);
}

/// Order in which a low-priority request queued first and a high-priority one queued 30 ms
/// later run, behind a 60 ms job, with `aging`.
std::vector<float> aging_order(microseconds aging) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = 1;
  o.priority_aging = aging;
  auto engine = make_engine("builtin:fixed_cost?base_us=60000", "sim", o);
  std::mutex mu;
  std::vector<float> order;
  auto record = [&](const Result<Outputs>& r) {
    std::lock_guard lock(mu);
    order.push_back(r.ok() ? first_value(*r) : -1);
  };
  EXPECT_TRUE(engine->submit(one(0), record).ok());
  EXPECT_TRUE(eventually([&] { return engine->metrics().queue_depth == 0; }));
  RequestOptions low;
  low.priority = 3;
  EXPECT_TRUE(engine->submit(one(3), record, low).ok());
  std::this_thread::sleep_for(30ms);
  RequestOptions high;
  high.priority = 1;
  EXPECT_TRUE(engine->submit(one(1), record, high).ok());
  engine->shutdown(ShutdownMode::drain);
  return order;
}

TEST(NoLimit, PriorityAgingMaxNeverAges) {
  EXPECT_EQ(aging_order(microseconds::max()), (std::vector<float>{0, 1, 3}));
  EXPECT_EQ(aging_order(microseconds(1000)), (std::vector<float>{0, 3, 1}));  // control
}

TEST(NoLimit, MaxQueueDelayMaxWaitsForAFullBatch) {
  EngineOptions o;
  o.workers = 1;
  o.batching.max_batch_size = 4;
  o.batching.max_queue_delay = microseconds::max();
  auto engine = make_engine("builtin:identity", "cpu", o);
  ASSERT_TRUE(engine);
  auto a = engine->submit(one(1));
  EXPECT_FALSE(a.wait_for(50ms)) << "a lone request was dispatched before the batch filled";
  std::vector<Future<Outputs>> rest;
  for (int i = 0; i < 3; ++i) rest.push_back(engine->submit(one(2)));
  EXPECT_TRUE(get_within(a).ok());
  for (auto& f : rest) EXPECT_TRUE(get_within(f).ok());
  EXPECT_EQ(engine->metrics().batches, 1u);
  // Control: a finite delay dispatches the lone request once it has waited that long.
  EngineOptions c = o;
  c.batching.max_queue_delay = microseconds(2000);
  auto control = make_engine("builtin:identity", "cpu", c);
  EXPECT_TRUE(get_within(control->submit(one(1)), 5000ms).ok());
}

TEST(NoLimit, MaxQueueDelayMaxStillDispatchesAtShutdown) {
  EngineOptions o;
  o.workers = 1;
  o.batching.max_batch_size = 4;
  o.batching.max_queue_delay = microseconds::max();
  auto engine = make_engine("builtin:identity", "cpu", o);
  auto a = engine->submit(one(1));
  must_return_within(10'000ms, "shutdown(drain)", [&] { engine->shutdown(ShutdownMode::drain); });
  EXPECT_TRUE(get_within(a, 1000ms).ok());
}

TEST(NoLimit, WatchdogMaxNeverFires) {
  EngineOptions o;
  o.watchdog = milliseconds::max();
  auto engine = make_engine("builtin:fixed_cost?base_us=50000&cancellable=false", "sim", o);
  EXPECT_TRUE(get_within(engine->submit(one(1))).ok());
  EXPECT_EQ(engine->metrics().watchdog_fired, 0u);
  set_log_hook([](LogLevel, std::string_view) {});
  EngineOptions c;
  c.watchdog = 10ms;  // control
  auto control = make_engine("builtin:fixed_cost?base_us=200000&cancellable=false", "sim", c);
  EXPECT_EQ(get_within(control->submit(one(1))).status().code(), StatusCode::deadline_exceeded);
  EXPECT_EQ(control->metrics().watchdog_fired, 1u);
  control.reset();
  set_log_hook(nullptr);
}

TEST(NoLimit, ResultTtlMaxKeepsResults) {
  EngineOptions o;
  o.result_ttl = milliseconds::max();
  auto engine = make_engine("builtin:identity", "cpu", o);
  ASSERT_TRUE(engine->submit("kept", one(1)).ok());
  ASSERT_TRUE(engine->result("kept").ok());
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(engine->status("kept"), RequestState::completed);
  EXPECT_TRUE(engine->result("kept", 0ms).ok());
  EngineOptions c;
  c.result_ttl = 1ms;  // control
  auto control = make_engine("builtin:identity", "cpu", c);
  ASSERT_TRUE(control->submit("gone", one(1)).ok());
  ASSERT_TRUE(control->result("gone").ok());
  std::this_thread::sleep_for(30ms);
  auto r = control->result("gone", 0ms);
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
  EXPECT_NE(r.status().message().find("expired"), std::string_view::npos) << r.status();
}

TEST(NoLimit, BreakerCooldownMaxKeepsTheBreakerOpen) {
  for (const bool forever : {true, false}) {
    SCOPED_TRACE(forever ? "cooldown max" : "cooldown 10 ms");
    EngineOptions o;
    o.workers = 1;
    o.breaker.failure_threshold = 1;
    o.breaker.cooldown = forever ? milliseconds::max() : milliseconds(10);
    auto engine = make_engine("builtin:faulty?first=1&code=internal", "cpu", o);
    EXPECT_EQ(engine->infer(one(1)).status().code(), StatusCode::internal);
    ASSERT_TRUE(eventually([&] { return engine->metrics().workers.at(0).breaker == "open"; }));
    if (forever) {
      std::this_thread::sleep_for(50ms);
      EXPECT_EQ(engine->metrics().workers.at(0).breaker, "open");
      EXPECT_FALSE(engine->submit(one(2)).wait_for(50ms)) << "an open breaker served a request";
    } else {
      EXPECT_TRUE(get_within(engine->submit(one(2)), 5000ms).ok());
      EXPECT_EQ(engine->metrics().workers.at(0).breaker, "closed");
    }
    must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::cancel); });
  }
}

TEST(NoLimit, DrainTimeoutMaxInOptionsAndInShutdownOfAnyUnits) {
  for (int how = 0; how < 4; ++how) {
    SCOPED_TRACE(how);
    EngineOptions o;
    if (how == 0) o.drain_timeout = milliseconds::max();
    auto engine = make_engine("builtin:fixed_cost?base_us=60000", "sim", o);
    auto f = engine->submit(one(1));
    if (how == 0) engine->shutdown(ShutdownMode::drain);
    if (how == 1) engine->shutdown(ShutdownMode::drain, milliseconds::max());
    if (how == 2) engine->shutdown(ShutdownMode::drain, hours::max());
    if (how == 3) engine->shutdown(ShutdownMode::drain, std::chrono::duration<double>::max());
    EXPECT_TRUE(get_within(f, 1000ms).ok()) << get_within(f, 1000ms).status();
  }
  auto control = make_engine("builtin:fixed_cost?base_us=300000", "sim");
  auto f = control->submit(one(1));
  control->shutdown(ShutdownMode::drain, 5ms);
  EXPECT_EQ(get_within(f, 1000ms).status().code(), StatusCode::aborted);
}

// ---- policies
// -------------------------------------------------------------------------------------

TEST(NoLimit, RetryBackoffWithoutCapOrWithAnEndlessFirstWait) {
  RetryPolicy p;
  p.max_attempts = 100;
  p.initial_backoff = microseconds::max();
  p.max_backoff = microseconds::max();
  p.multiplier = 1e300;
  p.budget_window = milliseconds::max();
  EXPECT_TRUE(p.validate().ok());
  std::mt19937_64 rng(1);
  for (int n = 2; n < 100; ++n) EXPECT_GE(p.backoff(n, rng).count(), 0);
  // In the engine: the first retry would wait "forever", so the request fails at once with its
  // last error instead of waiting past its deadline (or overflowing to a wait in the past).
  EngineOptions o;
  o.retry = p;
  o.retry.budget_min_retries_per_s = 1000;
  auto engine = make_engine("builtin:faulty?first=1&code=unavailable", "cpu", o);
  RequestOptions ro;
  ro.timeout = 2000ms;
  auto r = get_within(engine->submit(one(1), ro), 5000ms);
  EXPECT_EQ(r.status().code(), StatusCode::unavailable) << r.status();
  EXPECT_EQ(engine->metrics().retries, 0u);
  // Control: a short backoff retries and succeeds.
  EngineOptions c;
  c.retry.max_attempts = 2;
  c.retry.initial_backoff = microseconds(100);
  auto control = make_engine("builtin:faulty?first=1&code=unavailable", "cpu", c);
  EXPECT_TRUE(get_within(control->submit(one(1)), 5000ms).ok());
  EXPECT_EQ(control->metrics().retries, 1u);
}

TEST(NoLimit, RecycleBackoffMaxWaitsUntilShutdown) {
  set_log_hook([](LogLevel, std::string_view) {});
  for (const bool forever : {true, false}) {
    SCOPED_TRACE(forever ? "recycle_backoff max" : "recycle_backoff 5 ms");
    EngineOptions o;
    o.workers = 1;
    o.batching.max_batch_size = 1;
    o.watchdog = 20ms;
    o.recovery.max_recycle_attempts = 3;
    o.recovery.recycle_backoff = forever ? milliseconds::max() : milliseconds(5);
    o.recovery.max_recycle_backoff = forever ? milliseconds::max() : milliseconds(5);
    auto model = std::make_shared<testing::ControlledModel>(
        1, [](int call) { return call == 1 ? 60ms : 0ms; });
    auto engine = *Engine::create(model, *open_device("cpu"), o);
    auto hung = engine->submit(one(1));
    ASSERT_TRUE(eventually([&] { return engine->metrics().workers.at(0).recycle_failures >= 1; }));
    if (forever) {
      std::this_thread::sleep_for(50ms);
      EXPECT_EQ(engine->metrics().workers.at(0).recycle_failures, 1u);
      EXPECT_EQ(engine->health().workers.at(0).health, WorkerHealth::recovering);
    } else {
      ASSERT_TRUE(eventually(
          [&] { return engine->health().workers.at(0).health == WorkerHealth::unhealthy; }));
      EXPECT_EQ(engine->metrics().workers.at(0).recycle_failures, 3u);
    }
    must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::drain, 50ms); });
  }
  set_log_hook(nullptr);
}

// ---- the pipeline
// ---------------------------------------------------------------------------------

StageSpec slow_stage(milliseconds d) {
  return StageSpec::host("slow", [d](PipelineItem&) {
    std::this_thread::sleep_for(d);
    return Status();
  });
}

PipelineItem item() {
  PipelineItem it;
  it.tensors.push_back(*Tensor::from_values<float>({1, 4}, {1, 2, 3, 4}));
  return it;
}

TEST(NoLimit, PipelineItemTimeoutAndDeadlineMax) {
  auto p = *Pipeline::create({slow_stage(30ms)});
  ItemOptions t;
  t.timeout = microseconds::max();
  EXPECT_TRUE(get_within(p->submit(item(), t)).ok());
  ItemOptions d;
  d.deadline = Clock::time_point::max();
  EXPECT_TRUE(get_within(p->submit(item(), d)).ok());
  ItemOptions control;
  control.timeout = 2ms;
  EXPECT_EQ(get_within(p->submit(item(), control)).status().code(), StatusCode::deadline_exceeded);
}

TEST(NoLimit, PipelineDrainTimeoutMax) {
  PipelineOptions o;
  o.drain_timeout = milliseconds::max();
  auto p = *Pipeline::create({slow_stage(30ms)}, o);
  auto f = p->submit(item());
  p->shutdown(ShutdownMode::drain);
  EXPECT_TRUE(get_within(f, 1000ms).ok());
  PipelineOptions c;
  c.drain_timeout = 1ms;  // control
  auto q = *Pipeline::create({slow_stage(200ms)}, c);
  auto g = q->submit(item());
  std::this_thread::sleep_for(20ms);
  q->shutdown(ShutdownMode::drain);
  EXPECT_EQ(get_within(g, 1000ms).status().code(), StatusCode::aborted);
}

// ---- the log limiter
// --------------------------------------------------------------------------------

TEST(NoLimit, LogLimiterPeriodMax) {
  LogLimiter forever(2, milliseconds::max());
  std::uint64_t held = 0;
  EXPECT_TRUE(forever.allow(&held));
  EXPECT_TRUE(forever.allow(&held));
  EXPECT_FALSE(forever.allow(&held));
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(forever.allow(&held)) << "a window of max() ended";
  LogLimiter control(2, milliseconds(5));
  EXPECT_TRUE(control.allow(&held));
  EXPECT_TRUE(control.allow(&held));
  EXPECT_FALSE(control.allow(&held));
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(control.allow(&held));
  EXPECT_EQ(held, 1u);
}

}  // namespace
}  // namespace asyncinfer
