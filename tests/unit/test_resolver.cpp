// The engine's Resolver (src/engine/resolver.hpp) alone: requests built by hand and accepted by a
// Scheduler, no engine, no device and no worker. The only threads are the completion executor's
// and the deadline timer's, which the Resolver hands work to. Each case names the rule of
// resolver.hpp it checks.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/resolver.hpp"
#include "test_support.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;
using testing::eventually;
using testing::get_within;

/// A prepared request (stage `submitting`), as EngineCore::prepare leaves it: one row of 4 f32.
std::shared_ptr<Request> prepared(std::string key = {},
                                  Clock::time_point deadline = Clock::time_point::max()) {
  auto r = std::make_shared<Request>();
  r->submitted = Clock::now();
  r->enqueued = r->submitted;
  r->deadline = deadline;
  r->sequence_key = std::move(key);
  r->inputs.push_back(*Tensor::zeros(DType::f32, {1, 4}));
  r->shape_key = compute_shape_key(r->inputs, /*batched=*/true);
  return r;
}

/// What an engine owns around its Resolver: the scheduler, the timer and the completion executor.
struct Fixture {
  explicit Fixture(EngineOptions o)
      : opt(std::move(o)),
        scheduler(opt, /*batched=*/true),
        resolver(opt, scheduler, timer, completion) {}
  ~Fixture() {
    completion.shutdown();
    timer.shutdown();
  }

  /// Accepts `r` the way the engine does: the Resolver's admit() as the Scheduler's accept hook.
  void accept(const std::shared_ptr<Request>& r) {
    ASSERT_FALSE(scheduler.accept(r, [&] { resolver.admit(r); }));
  }

  /// A request with a future, accepted.
  Future<Outputs> submit_future(const std::shared_ptr<Request>& r) {
    r->promise.emplace();
    Future<Outputs> f = r->promise->get_future();
    resolver.bind_promise(*r->promise, r, /*inline_continuations=*/false, alive);
    accept(r);
    return f;
  }

  /// A request with a callback that appends `index` to `delivered`, accepted.
  void submit_callback(const std::shared_ptr<Request>& r, int index) {
    r->has_callback = true;
    r->callback = [this, index](const Result<Outputs>&) {
      std::lock_guard lock(mu);
      delivered.push_back(index);
      threads.push_back(std::this_thread::get_id());
    };
    accept(r);
  }

  std::vector<int> delivered_now() {
    std::lock_guard lock(mu);
    return delivered;
  }

  EngineOptions opt;
  ThreadPool completion{2, "test-cb"};
  DeadlineTimer timer{"test-timer"};
  Scheduler scheduler;
  Resolver resolver;
  std::shared_ptr<int> alive = std::make_shared<int>(0);  // the owner token of bind_promise
  std::mutex mu;
  std::vector<int> delivered;  // under mu
  std::vector<std::thread::id> threads;
};

EngineOptions ordered() {
  EngineOptions o;
  o.ordered_delivery = true;
  return o;
}

TEST(Resolver, TryResolveEndsARequestOnceWithdrawsItAndCountsTheOutcome) {
  Fixture fx{EngineOptions{}};
  auto r = prepared();
  Future<Outputs> f = fx.submit_future(r);
  EXPECT_EQ(fx.resolver.in_flight(), 1);
  EXPECT_EQ(fx.scheduler.depths().queued, 1);

  EXPECT_TRUE(fx.resolver.try_resolve(r, Stage::completed, Outputs{}));
  EXPECT_FALSE(fx.resolver.try_resolve(r, Stage::cancelled, cancelled_error("late")));
  EXPECT_EQ(r->stage.load(), Stage::completed);
  EXPECT_EQ(fx.scheduler.depths().queued, 0);  // withdrawn from the queue
  EXPECT_TRUE(get_within(f).ok());

  EngineMetrics m;
  fx.resolver.add_metrics(m);
  EXPECT_EQ(m.completed, 1u);
  EXPECT_EQ(m.cancelled, 0u);
  EXPECT_EQ(m.inflight_requests, 0);
  EXPECT_EQ(m.stats.success.count, 1u);
  EXPECT_EQ(m.stats.fail.count, 0u);
  EXPECT_EQ(m.request_us.count, 1u);
}

TEST(Resolver, AFailureIsCountedByItsReason) {
  Fixture fx{EngineOptions{}};
  auto r = prepared();
  Future<Outputs> f = fx.submit_future(r);
  ASSERT_TRUE(fx.resolver.try_resolve(r, Stage::failed, internal_error("model said no")));
  Result<Outputs> got = get_within(f);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(), "model said no");
  EngineMetrics m;
  fx.resolver.add_metrics(m);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.failures_by_reason.at("internal"), 1u);
  EXPECT_EQ(m.stats.fail.count, 1u);
}

TEST(Resolver, ARequestEndedBeforeItsSubmitReturnsIsLeftToTheSubmitToRefuse) {
  // resolver.hpp: "A request whose submit has not returned yet is left to its submit".
  Fixture fx{EngineOptions{}};
  auto r = prepared();  // still `submitting`: never accepted
  r->has_callback = true;
  bool called = false;
  r->callback = [&](const Result<Outputs>&) { called = true; };
  EXPECT_TRUE(fx.resolver.try_resolve(r, Stage::cancelled, cancelled_error("by id")));
  EXPECT_EQ(fx.resolver.in_flight(), 0);
  EngineMetrics m;
  fx.resolver.add_metrics(m);
  EXPECT_EQ(m.cancelled, 0u);  // not finished: its submit refuses it and reports the error
  auto refusal = fx.scheduler.accept(r, [&] { fx.resolver.admit(r); });
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->status.code(), StatusCode::cancelled);
  fx.completion.shutdown();
  EXPECT_FALSE(called);
}

TEST(Resolver, OrderedDeliveryDeliversInSubmitOrderWhateverOrderTheyEndIn) {
  Fixture fx{ordered()};
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < 4; ++i) {
    rs.push_back(prepared("k"));
    fx.submit_callback(rs.back(), i);
  }
  for (int i : {3, 1, 2}) ASSERT_TRUE(fx.resolver.try_resolve(rs[i], Stage::completed, Outputs{}));
  // Nothing of key "k" can go before request 0.
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(fx.delivered_now().empty());
  ASSERT_TRUE(fx.resolver.try_resolve(rs[0], Stage::completed, Outputs{}));
  ASSERT_TRUE(eventually([&] { return fx.delivered_now().size() == 4; }));
  EXPECT_EQ(fx.delivered_now(), (std::vector<int>{0, 1, 2, 3}));
  EngineMetrics m;
  fx.resolver.add_metrics(m);
  EXPECT_EQ(m.ordered_backlog_total, 0);
}

TEST(Resolver, ACallbackBatchPostsItsCallbacksOnceItGoesInTheirOrder) {
  Fixture fx{EngineOptions{}};
  auto a = prepared();
  auto b = prepared();
  fx.submit_callback(a, 0);
  fx.submit_callback(b, 1);
  {
    Resolver::CallbackBatch batch(fx.resolver);
    ASSERT_TRUE(fx.resolver.try_resolve(a, Stage::completed, Outputs{}));
    ASSERT_TRUE(fx.resolver.try_resolve(b, Stage::completed, Outputs{}));
    // Collected, not posted: no completion thread has them yet.
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(fx.delivered_now().empty());
  }
  ASSERT_TRUE(eventually([&] { return fx.delivered_now().size() == 2; }));
  EXPECT_EQ(fx.delivered_now(), (std::vector<int>{0, 1}));
  std::lock_guard lock(fx.mu);
  EXPECT_EQ(fx.threads[0], fx.threads[1]);  // one task
  EXPECT_NE(fx.threads[0], std::this_thread::get_id());
}

TEST(Resolver, AWaitInsideAnOrderedCallbackForALaterRequestOfItsKeyFailsAtOnce) {
  Fixture fx{ordered()};
  auto first = prepared("k");
  auto later = prepared("k");
  auto other_key = prepared("other");
  Status seen;
  bool other_ok = false;
  first->has_callback = true;
  Future<Outputs> later_f;
  Future<Outputs> other_f;
  first->callback = [&](const Result<Outputs>&) {
    seen = later_f.get().status();     // would wait for itself: returns the check's error
    other_ok = other_f.wait_for(30s);  // another key's result is not held back by this one
  };
  fx.accept(first);
  later_f = fx.submit_future(later);
  other_f = fx.submit_future(other_key);
  ASSERT_TRUE(fx.resolver.try_resolve(other_key, Stage::completed, Outputs{}));
  ASSERT_TRUE(fx.resolver.try_resolve(first, Stage::completed, Outputs{}));
  ASSERT_TRUE(fx.resolver.try_resolve(later, Stage::completed, Outputs{}));
  ASSERT_TRUE(get_within(later_f).ok());  // delivered after the callback returned
  EXPECT_EQ(seen.code(), StatusCode::failed_precondition);
  EXPECT_NE(seen.message().find("could never end"), std::string::npos) << seen.message();
  EXPECT_TRUE(other_ok);
}

TEST(Resolver, TheDeadlineEndsAQueuedRequestTimedOutAndSaysWhereItWas) {
  Fixture fx{EngineOptions{}};
  auto r = prepared("", Clock::now() + 5ms);
  Future<Outputs> f = fx.submit_future(r);
  Result<Outputs> got = get_within(f);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::deadline_exceeded);
  EXPECT_NE(got.status().message().find("while queued"), std::string::npos)
      << got.status().message();
  EXPECT_EQ(r->stage.load(), Stage::timed_out);
  EXPECT_EQ(fx.scheduler.depths().queued, 0);
}

TEST(Resolver, RequestsByIdCanBeAskedCancelledAndReleased) {
  Fixture fx{EngineOptions{}};
  auto r = prepared();
  r->id = "req-1";
  r->promise.emplace();
  r->future_state = r->promise->get_future().state();
  fx.resolver.bind_promise(*r->promise, r, false, fx.alive);
  ASSERT_TRUE(fx.resolver.register_id(r).ok());
  EXPECT_EQ(fx.resolver.register_id(r).code(), StatusCode::already_exists);
  fx.accept(r);
  EXPECT_EQ(fx.resolver.status("req-1"), RequestState::pending);
  EXPECT_EQ(fx.resolver.status("nope"), RequestState::unknown);

  Result<Outputs> early = fx.resolver.result("req-1", 0ns);
  EXPECT_EQ(early.status().code(), StatusCode::deadline_exceeded);

  EXPECT_TRUE(fx.resolver.cancel("req-1", "cancelled by the caller").ok());
  Status again = fx.resolver.cancel("req-1", "cancelled by the caller");
  EXPECT_EQ(again.code(), StatusCode::failed_precondition);
  EXPECT_NE(again.message().find("has already ended (cancelled)"), std::string::npos)
      << again.message();
  EXPECT_EQ(fx.resolver.result("req-1", 1s).status().code(), StatusCode::cancelled);
  EXPECT_TRUE(fx.resolver.release("req-1").ok());
  EXPECT_EQ(fx.resolver.status("req-1"), RequestState::unknown);
}

}  // namespace
}  // namespace asyncinfer::detail
