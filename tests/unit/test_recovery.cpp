// Worker recovery and bounded shutdown (issue 13, part 3; docs/design.md guarantee 5): a hang
// watchdog recycle that is pending, or that keeps failing because the model cannot create an
// instance (a lost device), must never keep shutdown(drain), shutdown(cancel) or ~Engine from
// returning within the drain timeout plus the work that cannot be stopped; the worker gives up
// after bounded attempts, says so (metrics, health()), and its queued requests fail `unavailable`
// naming the cause. Abandoned work (replaced instances whose work still runs) is bounded.
//
// The model is ControlledModel (test_models.hpp): its work ignores every stop token, as a
// libtorch forward does. Every wait is bounded; a call that would hang ends the test process
// with a failure (must_return_within).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/log.hpp"
#include "engine_support.hpp"
#include "test_models.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::ControlledModel;
using testing::eventually;
using testing::expect_all_ended_once;
using testing::get_within;
using testing::must_return_within;
using testing::one;

/// Silences (and counts) the library's log for the test's duration.
class QuietLog {
 public:
  QuietLog() {
    set_log_hook([this](LogLevel, std::string_view m) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(m);
    });
  }
  ~QuietLog() { set_log_hook(nullptr); }
  std::vector<std::string> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  bool saw(std::string_view needle) const {
    for (const std::string& l : lines()) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

EngineOptions one_worker(std::chrono::milliseconds watchdog) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 2;
  o.batching.max_batch_size = 1;
  o.watchdog = watchdog;
  return o;
}

std::unique_ptr<Engine> engine_of(const std::shared_ptr<Model>& model, EngineOptions o) {
  auto d = open_device("cpu");
  EXPECT_TRUE(d.ok()) << d.status();
  auto e = Engine::create(model, *d, std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// ---- trigger A: a recycle pending when shutdown begins ---------------------------------------

// Before the fix the worker loop skipped the recycle (the engine was stopping), found no batch,
// and went round again forever at 100 % of a core: shutdown(cancel) never returned.
TEST(Recovery, ShutdownCancelReturnsWhileARecycleIsPendingAndTheWorkerIsInsideEnqueue) {
  QuietLog log;
  // Call 1 hangs (uncancellable, 600 ms); the worker is then inside call 2's enqueue (300 ms)
  // when the 50 ms watchdog fires for call 1.
  auto model = std::make_shared<ControlledModel>(
      1 << 20, [](int call) { return call == 1 ? 600ms : 0ms; },
      [](int call) { return call == 2 ? 300ms : 0ms; });
  auto engine = engine_of(model, one_worker(50ms));
  ASSERT_TRUE(engine);
  auto a = engine->submit(one(1));
  auto b = engine->submit(one(2));
  ASSERT_TRUE(eventually([&] { return engine->metrics().watchdog_fired == 1; }, 5000ms));
  ASSERT_EQ(model->calls(), 2) << "the worker should be inside the second enqueue";
  const double ms = must_return_within(10'000ms, "shutdown(cancel) with a recycle pending",
                                       [&] { engine->shutdown(ShutdownMode::cancel); });
  EXPECT_LT(ms, 5000.0);
  EXPECT_EQ(get_within(a, 1000ms).status().code(), StatusCode::deadline_exceeded);
  EXPECT_EQ(get_within(b, 1000ms).status().code(), StatusCode::aborted);
  expect_all_ended_once(engine->metrics(), "cancel with a recycle pending");
}

// The same moment with shutdown(drain): the recycle happens, the request queued behind the hung
// one comes back when the old stream is destroyed and runs on the new instance.
TEST(Recovery, ShutdownDrainWithARecyclePendingFinishesTheQueuedWork) {
  QuietLog log;
  auto model = std::make_shared<ControlledModel>(
      1 << 20, [](int call) { return call == 1 ? 400ms : 0ms; },
      [](int call) { return call == 2 ? 200ms : 0ms; });
  auto engine = engine_of(model, one_worker(50ms));
  ASSERT_TRUE(engine);
  auto a = engine->submit(one(1));
  auto b = engine->submit(one(2));
  ASSERT_TRUE(eventually([&] { return engine->metrics().watchdog_fired == 1; }, 5000ms));
  must_return_within(10'000ms, "shutdown(drain) with a recycle pending",
                     [&] { engine->shutdown(ShutdownMode::drain, 5000ms); });
  EXPECT_EQ(get_within(a, 1000ms).status().code(), StatusCode::deadline_exceeded);
  auto rb = get_within(b, 1000ms);
  EXPECT_TRUE(rb.ok()) << rb.status();
  const auto m = engine->metrics();
  EXPECT_EQ(m.workers.at(0).recycles, 1u);
  EXPECT_EQ(m.workers.at(0).health, "healthy");
  expect_all_ended_once(m, "drain with a recycle pending");
}

// ---- trigger B: create_instance() keeps failing ----------------------------------------------

EngineOptions lost_device_options() {
  EngineOptions o = one_worker(50ms);
  o.recovery.max_recycle_attempts = 3;
  o.recovery.recycle_backoff = 10ms;
  return o;
}

/// One worker whose first batch hangs (uncancellable, `hang`) and whose model cannot create a
/// second instance: the worker recycles, fails three times, gives up.
struct LostDevice {
  std::shared_ptr<ControlledModel> model;
  std::unique_ptr<Engine> engine;

  explicit LostDevice(std::chrono::milliseconds hang, EngineOptions o = lost_device_options())
      : model(std::make_shared<ControlledModel>(
            1, [hang](int call) { return call == 1 ? hang : 0ms; })),
        engine(engine_of(model, std::move(o))) {}

  bool gave_up() const {
    const auto h = engine->health();
    return !h.workers.empty() && h.workers[0].health == WorkerHealth::unhealthy;
  }
};

TEST(Recovery, WorkerThatCannotGetAnInstanceGivesUpAndSaysWhy) {
  QuietLog log;
  LostDevice lost(300ms);
  ASSERT_TRUE(lost.engine);
  Engine& engine = *lost.engine;
  auto hung = engine.submit(one(1));
  auto queued = engine.submit(one(2));  // waits behind the hung batch, then for a worker
  ASSERT_TRUE(eventually([&] { return lost.gave_up(); }, 10'000ms));
  EXPECT_EQ(get_within(hung, 2000ms).status().code(), StatusCode::deadline_exceeded);
  // Its queued request fails unavailable, naming the cause.
  auto rq = get_within(queued, 5000ms);
  EXPECT_EQ(rq.status().code(), StatusCode::unavailable) << rq.status();
  EXPECT_NE(rq.status().message().find("device lost"), std::string_view::npos) << rq.status();
  EXPECT_NE(rq.status().message().find("worker 0"), std::string_view::npos) << rq.status();
  // Health and metrics say so.
  const EngineHealth h = engine.health();
  EXPECT_TRUE(h.live);
  EXPECT_FALSE(h.ready);
  EXPECT_NE(h.reason.find("device lost"), std::string::npos) << h.reason;
  EXPECT_NE(h.workers.at(0).reason.find("3 attempts"), std::string::npos) << h.workers[0].reason;
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.workers.at(0).health, "unhealthy");
  EXPECT_EQ(m.workers.at(0).recycle_failures, 3u);
  EXPECT_EQ(m.live_workers, 0);
  EXPECT_EQ(lost.model->create_calls(), 1 + 3) << "bounded attempts";
  EXPECT_NE(
      m.to_prometheus().find("asyncinfer_worker_healthy{model=\"controlled\",worker=\"0\"} 0"),
      std::string::npos);
  // Later submits are refused with the cause; nothing hangs.
  auto late = engine.submit(one(3));
  auto rl = get_within(late, 1000ms);
  EXPECT_EQ(rl.status().code(), StatusCode::unavailable) << rl.status();
  EXPECT_NE(rl.status().message().find("device lost"), std::string_view::npos);
  EXPECT_TRUE(log.saw("is unhealthy")) << "giving up is logged";
  // The destructor (drain, 30 s default timeout) returns at once: nothing is left to drain.
  const double ms = must_return_within(10'000ms, "~Engine with an unhealthy worker",
                                       [&] { lost.engine.reset(); });
  EXPECT_LT(ms, 5000.0);
}

TEST(Recovery, ShutdownDrainReturnsWithinTheDrainTimeoutWhileRecyclesKeepFailing) {
  QuietLog log;
  EngineOptions o = lost_device_options();
  o.recovery.max_recycle_attempts = 1000;  // would take minutes to give up
  o.recovery.recycle_backoff = 50ms;
  o.recovery.max_recycle_backoff = 50ms;
  LostDevice lost(100ms, o);
  ASSERT_TRUE(lost.engine);
  auto hung = lost.engine->submit(one(1));
  auto queued = lost.engine->submit(one(2));
  ASSERT_TRUE(eventually([&] { return lost.engine->metrics().workers.at(0).recycle_failures >= 2; },
                         10'000ms));
  EXPECT_EQ(lost.engine->health().workers.at(0).health, WorkerHealth::recovering);
  const double ms = must_return_within(10'000ms, "shutdown(drain) while recycles keep failing",
                                       [&] { lost.engine->shutdown(ShutdownMode::drain, 300ms); });
  EXPECT_GE(ms, 250.0) << "it waited for the drain timeout";
  EXPECT_LT(ms, 5000.0);
  EXPECT_EQ(get_within(queued, 1000ms).status().code(), StatusCode::aborted);
  expect_all_ended_once(lost.engine->metrics(), "drain while recycles fail");
}

TEST(Recovery, ShutdownCancelAndTheDestructorReturnDuringALongRecycleBackoff) {
  QuietLog log;
  for (const bool use_destructor : {false, true}) {
    SCOPED_TRACE(use_destructor ? "~Engine" : "shutdown(cancel)");
    EngineOptions o = lost_device_options();
    o.recovery.max_recycle_attempts = 5;
    o.recovery.recycle_backoff = 60'000ms;  // the worker sleeps a minute between attempts
    o.drain_timeout = 200ms;
    LostDevice lost(300ms, o);
    ASSERT_TRUE(lost.engine);
    auto hung = lost.engine->submit(one(1));
    auto queued = lost.engine->submit(one(2));
    ASSERT_TRUE(eventually(
        [&] { return lost.engine->metrics().workers.at(0).recycle_failures == 1; }, 10'000ms));
    const double ms = must_return_within(10'000ms, "shutdown during a recycle backoff", [&] {
      if (use_destructor) {
        lost.engine.reset();
      } else {
        lost.engine->shutdown(ShutdownMode::cancel);
      }
    });
    EXPECT_LT(ms, 5000.0);
    EXPECT_EQ(get_within(queued, 1000ms).status().code(), StatusCode::aborted);
  }
}

// A driver that throws instead of returning an error: a failed attempt like any other (before,
// the exception left the worker thread and ended the process).
TEST(Recovery, CreateInstanceThatThrowsIsAFailedAttempt) {
  QuietLog log;
  EngineOptions o = lost_device_options();
  auto model = std::make_shared<ControlledModel>(
      1, [](int call) { return call == 1 ? 200ms : 0ms; }, ControlledModel::PerCall{},
      /*throws=*/true);
  auto engine = engine_of(model, o);
  ASSERT_TRUE(engine);
  auto hung = engine->submit(one(1));
  auto queued = engine->submit(one(2));
  ASSERT_TRUE(eventually(
      [&] { return engine->health().workers.at(0).health == WorkerHealth::unhealthy; }, 10'000ms));
  auto r = get_within(queued, 5000ms);
  EXPECT_EQ(r.status().code(), StatusCode::unavailable) << r.status();
  EXPECT_NE(r.status().message().find("device lost (thrown)"), std::string_view::npos)
      << r.status();
  EXPECT_EQ(engine->metrics().model_exceptions, 3u);
  must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::drain); });
}

TEST(Recovery, TheOtherWorkersGoOnServingWhenOneGivesUp) {
  QuietLog log;
  EngineOptions o = lost_device_options();
  o.workers = 2;
  o.max_inflight_per_worker = 1;
  // Two instances exist; the replacement of whichever worker hangs cannot be created.
  auto model =
      std::make_shared<ControlledModel>(2, [](int call) { return call == 1 ? 200ms : 0ms; });
  auto engine = engine_of(model, o);
  ASSERT_TRUE(engine);
  auto hung = engine->submit(one(1));
  ASSERT_TRUE(eventually(
      [&] {
        for (const auto& w : engine->health().workers) {
          if (w.health == WorkerHealth::unhealthy) return true;
        }
        return false;
      },
      10'000ms));
  EXPECT_TRUE(engine->health().ready) << engine->health().reason;
  EXPECT_EQ(engine->metrics().live_workers, 1);
  for (int i = 0; i < 20; ++i) {
    auto r = get_within(engine->submit(one(static_cast<float>(i))), 5000ms);
    EXPECT_TRUE(r.ok()) << r.status();
  }
  must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::drain); });
  expect_all_ended_once(engine->metrics(), "one of two workers lost");
}

// ---- abandoned work is bounded --------------------------------------------------------------

// Every call hangs past the watchdog. Without a bound every recycle started new work beside old
// work that could not be stopped (BentoML #5642: 6 jobs on the device with 2 workers).
void abandoned_bound(int workers, int max_abandoned) {
  SCOPED_TRACE("workers " + std::to_string(workers) + ", max_abandoned_instances " +
               std::to_string(max_abandoned));
  QuietLog log;
  EngineOptions o = one_worker(20ms);
  o.workers = workers;
  o.recovery.max_abandoned_instances = max_abandoned;
  auto model = std::make_shared<ControlledModel>(1 << 20, [](int) { return 150ms; });
  auto engine = engine_of(model, o);
  ASSERT_TRUE(engine);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 4 * workers + 2; ++i)
    fs.push_back(engine->submit(one(static_cast<float>(i))));
  bool paused_seen = false;
  std::int64_t most_abandoned = 0;
  for (auto& f : fs) {
    while (!f.wait_for(2ms)) {
      for (const auto& w : engine->metrics().workers) {
        paused_seen = paused_seen || w.health == "paused";
        most_abandoned = std::max(most_abandoned, w.abandoned_instances);
      }
    }
    EXPECT_EQ(f.get().status().code(), StatusCode::deadline_exceeded) << f.get().status();
  }
  must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::drain); });
  const int bound = workers * (std::max(1, max_abandoned) + 1);
  EXPECT_LE(model->max_running(), workers * (max_abandoned + 1))
      << "jobs on the device at once (at most " << bound << " live + abandoned)";
  EXPECT_LE(most_abandoned, std::max(1, max_abandoned));
  EXPECT_TRUE(paused_seen) << "a worker at the limit reports itself paused";
  expect_all_ended_once(engine->metrics(), "abandoned bound");
}

TEST(Recovery, AbandonedWorkIsBoundedPerWorker) {
  abandoned_bound(1, 1);
  abandoned_bound(2, 1);
  abandoned_bound(1, 0);
}

// ---- EngineOptions::on_health_change ---------------------------------------------------------

/// Records what each on_health_change call finds: the engine's health, read from inside the
/// callback (no engine lock is held there, so health() must not deadlock).
class HealthChanges {
 public:
  struct Seen {
    bool live = false;
    bool ready = false;
    WorkerHealth worker = WorkerHealth::healthy;
  };

  /// The hook for EngineOptions::on_health_change; calls before watch() are counted only.
  std::function<void()> hook() {
    return [this] {
      Seen s;
      if (Engine* e = engine_.load()) {
        const EngineHealth h = e->health();
        s = {h.live, h.ready, h.workers.empty() ? WorkerHealth::healthy : h.workers[0].health};
      }
      {
        std::lock_guard lock(mu_);
        seen_.push_back(s);
      }
      cv_.notify_all();
    };
  }
  void watch(Engine* engine) { engine_.store(engine); }
  /// Waits (bounded) for a call, the `from`-th or later, whose reading satisfies `pred`; true
  /// when one came. Never polls the engine: only the callbacks wake it.
  bool wait_for(std::size_t from, const std::function<bool(const Seen&)>& pred,
                std::chrono::milliseconds timeout = 10'000ms) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (std::size_t i = from; i < seen_.size(); ++i) {
        if (pred(seen_[i])) return true;
      }
      return false;
    });
  }
  std::size_t calls() {
    std::lock_guard lock(mu_);
    return seen_.size();
  }

 private:
  std::atomic<Engine*> engine_{nullptr};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Seen> seen_;
};

// The watchdog takes the only worker out (not ready), its recycle brings it back (ready), and
// shutdown ends it (not live): each is pushed, with no one asking for health() meanwhile.
TEST(Recovery, HealthChangesArePushedWhenAWorkerIsRecycledAndAtShutdown) {
  QuietLog log;
  HealthChanges changes;
  EngineOptions o = one_worker(50ms);
  o.on_health_change = changes.hook();
  auto model =
      std::make_shared<ControlledModel>(1 << 20, [](int call) { return call == 1 ? 300ms : 0ms; });
  auto engine = engine_of(model, o);
  ASSERT_TRUE(engine);
  EXPECT_EQ(changes.calls(), 0u) << "a new engine's health has not changed";
  changes.watch(engine.get());
  auto hung = engine->submit(one(1));
  ASSERT_TRUE(changes.wait_for(0, [](const auto& s) { return s.live && !s.ready; }))
      << "the watchdog took the worker out: not ready";
  ASSERT_TRUE(changes.wait_for(0, [](const auto& s) { return s.live && s.ready; }))
      << "the recycled worker serves again: ready";
  EXPECT_EQ(get_within(hung, 2000ms).status().code(), StatusCode::deadline_exceeded);
  const std::size_t before = changes.calls();
  must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::drain); });
  EXPECT_TRUE(changes.wait_for(
      before, [](const auto& s) { return !s.live && !s.ready; }, 0ms))
      << "shutdown began: pushed before it returned";
}

// A worker that cannot get a model instance gives up: the change to unhealthy is pushed.
TEST(Recovery, HealthChangeIsPushedWhenAWorkerGivesUp) {
  QuietLog log;
  HealthChanges changes;
  EngineOptions o = lost_device_options();
  o.on_health_change = changes.hook();
  LostDevice lost(300ms, o);
  ASSERT_TRUE(lost.engine);
  changes.watch(lost.engine.get());
  auto hung = lost.engine->submit(one(1));
  ASSERT_TRUE(changes.wait_for(0, [](const auto& s) { return s.live && !s.ready; }));
  ASSERT_TRUE(changes.wait_for(0, [](const auto& s) {
    return s.live && !s.ready && s.worker == WorkerHealth::unhealthy;
  })) << "giving up is pushed";
  EXPECT_FALSE(lost.engine->health().ready);
}

// An exception from the hook is reported and dropped: the engine goes on (recovers, stops).
TEST(Recovery, AHealthChangeHookThatThrowsIsReported) {
  QuietLog log;
  std::atomic<int> calls{0};
  EngineOptions o = one_worker(50ms);
  o.on_health_change = [&calls] {
    calls.fetch_add(1);
    throw std::runtime_error("hook failed");
  };
  auto model =
      std::make_shared<ControlledModel>(1 << 20, [](int call) { return call == 1 ? 300ms : 0ms; });
  auto engine = engine_of(model, o);
  ASSERT_TRUE(engine);
  auto hung = engine->submit(one(1));
  EXPECT_EQ(get_within(hung, 5000ms).status().code(), StatusCode::deadline_exceeded);
  ASSERT_TRUE(eventually([&] { return engine->health().ready; }, 10'000ms));
  must_return_within(10'000ms, "shutdown", [&] { engine->shutdown(ShutdownMode::drain); });
  EXPECT_GE(calls.load(), 3) << "taken out, back, shutdown";
  EXPECT_TRUE(log.saw("exception in on_health_change")) << "reported on the log hook";
}

// ---- waits that shutdown must cut short -----------------------------------------------------

// A drained engine must not wait for a worker that sits out a breaker cool-down.
TEST(Recovery, ShutdownDrainDoesNotWaitForABreakerCooldown) {
  EngineOptions o;
  o.workers = 1;
  o.breaker.failure_threshold = 1;
  o.breaker.cooldown = 60'000ms;
  auto engine = testing::make_engine("builtin:faulty?first=1&code=internal", "cpu", o);
  ASSERT_TRUE(engine);
  EXPECT_EQ(engine->infer(one(1)).status().code(), StatusCode::internal);
  ASSERT_TRUE(eventually([&] { return engine->metrics().workers.at(0).breaker == "open"; }));
  EXPECT_TRUE(engine->health().live);
  const double ms = must_return_within(10'000ms, "shutdown(drain) during a cool-down",
                                       [&] { engine->shutdown(ShutdownMode::drain); });
  EXPECT_LT(ms, 5000.0);
}

TEST(Recovery, OptionsAreValidated) {
  for (int field = 0; field < 3; ++field) {
    EngineOptions o;
    if (field == 0) o.recovery.max_recycle_attempts = 0;
    if (field == 1) o.recovery.recycle_backoff = -1ms;
    if (field == 2) o.recovery.max_abandoned_instances = -1;
    auto model = load_model("builtin:identity");
    auto device = open_device("cpu");
    auto e = Engine::create(*model, *device, o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(e.status().message().find("recovery"), std::string_view::npos) << e.status();
  }
}

}  // namespace
}  // namespace asyncinfer
