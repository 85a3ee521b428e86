#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/future.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;

TEST(Future, SetThenGet) {
  Promise<int> p;
  Future<int> f = p.get_future();
  EXPECT_TRUE(f.valid());
  EXPECT_FALSE(f.is_ready());
  EXPECT_TRUE(p.set_value(7));
  EXPECT_TRUE(f.is_ready());
  EXPECT_EQ(*f.get(), 7);
  EXPECT_EQ(*f.get(), 7);        // get() may be called again
  EXPECT_FALSE(p.set_value(8));  // exactly once
  EXPECT_EQ(*f.get(), 7);
}

TEST(Future, ErrorTravelsInTheFuture) {
  Promise<int> p;
  Future<int> f = p.get_future();
  p.set_error(unavailable_error("device busy"));
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unavailable);
}

TEST(Future, WaitForTimesOutThenSucceeds) {
  Promise<int> p;
  Future<int> f = p.get_future();
  EXPECT_FALSE(f.wait_for(5ms));
  EXPECT_FALSE(f.wait_until(std::chrono::steady_clock::now() + 1ms));
  std::jthread setter([&] {
    std::this_thread::sleep_for(5ms);
    p.set_value(1);
  });
  EXPECT_TRUE(f.wait_for(testing::kWatchdog));
  f.wait();
  EXPECT_EQ(*f.get(), 1);
}

TEST(Future, AWaitCheckMakesAWaitThatCouldNeverEndReturnAtOnce) {
  Promise<int> p;
  auto f = p.get_future();
  std::atomic<bool> here_it_never_ends{true};
  std::atomic<int> checks{0};
  p.set_wait_check([&]() -> Status {
    ++checks;
    return here_it_never_ends ? failed_precondition_error("this thread produces it") : Status();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(f.get().status().code(), StatusCode::failed_precondition);
  EXPECT_FALSE(f.wait_for(10s));
  f.wait();
  EXPECT_FALSE(f.is_ready());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Where the check allows it, the wait blocks and ends with the result.
  here_it_never_ends = false;
  std::thread producer([&] {
    std::this_thread::sleep_for(20ms);
    p.set_value(3);
  });
  EXPECT_EQ(*f.get(), 3);
  producer.join();
  // Once set, the result is returned without asking the check.
  const int before = checks.load();
  here_it_never_ends = true;
  EXPECT_EQ(*f.get(), 3);
  EXPECT_TRUE(f.wait_for(0s));
  EXPECT_EQ(checks.load(), before);
}

TEST(Future, InvalidFutureReportsFailedPrecondition) {
  Future<int> f;
  EXPECT_FALSE(f.valid());
  EXPECT_TRUE(f.wait_for(1ms));
  EXPECT_EQ(f.get().status().code(), StatusCode::failed_precondition);
  bool ran = false;
  f.on_complete([&](const Result<int>& r) {
    ran = true;
    EXPECT_FALSE(r.ok());
  });
  EXPECT_TRUE(ran);
}

TEST(Future, CallbackBeforeCompletionRunsOnSettingThread) {
  Promise<int> p;
  Future<int> f = p.get_future();
  std::thread::id ran_on;
  int seen = 0;
  f.on_complete([&](const Result<int>& r) {
    ran_on = std::this_thread::get_id();
    seen = *r;
  });
  std::thread::id setter_id;
  std::thread t([&] {
    setter_id = std::this_thread::get_id();
    p.set_value(5);
  });
  t.join();
  EXPECT_EQ(seen, 5);
  EXPECT_EQ(ran_on, setter_id);
}

TEST(Future, CallbackAfterCompletionRunsAtOnceOnCaller) {
  Promise<int> p;
  Future<int> f = p.get_future();
  p.set_value(3);
  std::thread::id ran_on;
  f.on_complete([&](const Result<int>&) { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(Future, ManyCallbacksRunOnceInOrder) {
  Promise<int> p;
  Future<int> f = p.get_future();
  std::vector<int> order;
  for (int i = 0; i < 5; ++i)
    f.on_complete([&order, i](const Result<int>&) { order.push_back(i); });
  p.set_value(0);
  p.set_value(1);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(Future, CallbackRegisteredFromInsideACallback) {
  Promise<int> p;
  Future<int> f = p.get_future();
  Future<int>* fp = &f;
  int inner = 0;
  f.on_complete([&](const Result<int>&) {
    // The state's lock is not held here, so registering again does not deadlock; it runs at once.
    fp->on_complete([&](const Result<int>& r) { inner = *r; });
  });
  p.set_value(11);
  EXPECT_EQ(inner, 11);
}

TEST(Future, ThrowingCallbackIsCountedAndOthersStillRun) {
  const auto before = unhandled_callback_exceptions();
  Promise<int> p;
  Future<int> f = p.get_future();
  bool second = false;
  f.on_complete([](const Result<int>&) { throw std::runtime_error("user bug"); });
  f.on_complete([&](const Result<int>&) { second = true; });
  p.set_value(1);
  EXPECT_TRUE(second);
  EXPECT_EQ(unhandled_callback_exceptions(), before + 1);
}

TEST(Future, ThenChains) {
  Promise<int> p;
  Future<std::string> f = p.get_future()
                              .then([](const int& v) { return v * 2; })
                              .then([](const Result<int>& r) -> Result<int> {
                                if (!r.ok()) return r.status();
                                return *r + 1;
                              })
                              .then([](const int& v) { return std::to_string(v); });
  p.set_value(20);
  EXPECT_EQ(*get_within(f), "41");
}

TEST(Future, ThenPassesErrorsThroughValueContinuations) {
  Promise<int> p;
  bool value_fn_ran = false;
  Future<int> f = p.get_future().then([&](const int& v) {
    value_fn_ran = true;
    return v;
  });
  p.set_error(deadline_exceeded_error("late"));
  auto r = get_within(f);
  EXPECT_FALSE(value_fn_ran);
  EXPECT_EQ(r.status().code(), StatusCode::deadline_exceeded);
}

TEST(Future, ThenTurnsExceptionsIntoInternal) {
  Promise<int> p;
  Future<int> f = p.get_future().then([](const int&) -> int { throw std::runtime_error("boom"); });
  p.set_value(1);
  auto r = get_within(f);
  EXPECT_EQ(r.status().code(), StatusCode::internal);
  EXPECT_NE(r.status().message().find("boom"), std::string_view::npos);
}

TEST(Future, BrokenPromiseResolvesWithError) {
  Future<int> f;
  {
    Promise<int> p;
    f = p.get_future();
  }
  auto r = get_within(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::internal);
  EXPECT_NE(r.status().message().find("broken promise"), std::string_view::npos);
}

TEST(Future, MoveAssignOverUnsetPromiseBreaksIt) {
  Promise<int> a;
  Future<int> fa = a.get_future();
  Promise<int> b;
  a = std::move(b);
  EXPECT_EQ(get_within(fa).status().code(), StatusCode::internal);
}

TEST(Future, CancelReachesTheProducer) {
  Promise<int> p;
  Future<int> f = p.get_future();
  std::atomic<int> handled{0};
  p.on_cancel([&] {
    handled++;
    p.set_error(cancelled_error("cancelled by the consumer"));
  });
  EXPECT_FALSE(f.cancel_requested());
  EXPECT_TRUE(f.cancel());
  EXPECT_FALSE(f.cancel());  // once
  EXPECT_TRUE(p.is_cancel_requested());
  EXPECT_EQ(handled.load(), 1);
  EXPECT_EQ(get_within(f).status().code(), StatusCode::cancelled);
}

TEST(Future, CancelHandlerAddedAfterCancelRunsAtOnce) {
  Promise<int> p;
  Future<int> f = p.get_future();
  f.cancel();
  bool ran = false;
  p.on_cancel([&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST(Future, CancelAfterCompletionDoesNothing) {
  Promise<int> p;
  Future<int> f = p.get_future();
  bool ran = false;
  p.on_cancel([&] { ran = true; });
  p.set_value(1);
  EXPECT_FALSE(f.cancel());
  EXPECT_FALSE(ran);
  EXPECT_EQ(*f.get(), 1);
}

TEST(Future, CancellingAContinuationCancelsUpstream) {
  Promise<int> p;
  bool upstream_cancelled = false;
  p.on_cancel([&] { upstream_cancelled = true; });
  Future<int> f = p.get_future().then([](const int& v) { return v; });
  f.cancel();
  EXPECT_TRUE(upstream_cancelled);
}

TEST(WhenAll, CollectsEveryResultInOrderWithOneFailure) {
  std::vector<Promise<int>> ps(3);
  std::vector<Future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  Future<std::vector<Result<int>>> all = when_all(std::move(fs));
  ps[2].set_value(2);
  ps[1].set_error(internal_error("model threw"));
  EXPECT_FALSE(all.is_ready());
  ps[0].set_value(0);
  auto r = get_within(all);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(*(*r)[0], 0);
  EXPECT_EQ((*r)[1].status().code(), StatusCode::internal);
  EXPECT_EQ(*(*r)[2], 2);
}

TEST(WhenAll, EmptyIsReadyAndCancelFansOut) {
  auto empty = when_all(std::vector<Future<int>>{});
  EXPECT_TRUE(empty.is_ready());
  EXPECT_TRUE(empty.get()->empty());
  Promise<int> a, b;
  int cancels = 0;
  a.on_cancel([&] { ++cancels; });
  b.on_cancel([&] { ++cancels; });
  std::vector<Future<int>> fs;
  fs.push_back(a.get_future());
  fs.push_back(b.get_future());
  auto all = when_all(std::move(fs));
  all.cancel();
  EXPECT_EQ(cancels, 2);
}

TEST(WhenAny, FirstCompletionWins) {
  std::vector<Promise<int>> ps(3);
  std::vector<Future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto any = when_any(std::move(fs));
  ps[1].set_value(10);
  ps[0].set_value(20);
  auto r = get_within(any);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->index, 1u);
  EXPECT_EQ(*r->result, 10);
  EXPECT_EQ(when_any(std::vector<Future<int>>{}).get().status().code(),
            StatusCode::invalid_argument);
}

TEST(Future, MakeReadyFuture) {
  auto f = make_ready_future<int>(4);
  EXPECT_TRUE(f.is_ready());
  EXPECT_EQ(*f.get(), 4);
}

TEST(Future, WaitersOnManyThreadsAllWake) {
  Promise<int> p;
  Future<int> f = p.get_future();
  std::atomic<int> woke{0};
  std::vector<std::jthread> ts;
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&] {
      if (f.wait_for(testing::kWatchdog)) woke++;
    });
  }
  std::this_thread::sleep_for(5ms);
  p.set_value(1);
  ts.clear();
  EXPECT_EQ(woke.load(), 4);
}

TEST(UniqueFunction, HoldsMoveOnlyAndLargeCallables) {
  auto ptr = std::make_unique<int>(5);
  detail::UniqueFunction<int()> small([p = std::move(ptr)] { return *p; });
  EXPECT_EQ(small(), 5);
  std::array<char, 200> big{};
  big[0] = 9;
  detail::UniqueFunction<int()> large([big] { return static_cast<int>(big[0]); });
  detail::UniqueFunction<int()> moved = std::move(large);
  EXPECT_FALSE(
      static_cast<bool>(large));  // NOLINT(bugprone-use-after-move): checks the moved-from state
  EXPECT_EQ(moved(), 9);
}

}  // namespace
}  // namespace asyncinfer
