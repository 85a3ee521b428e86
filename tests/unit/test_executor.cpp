#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "asyncinfer/executor.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;

TEST(ThreadPool, RunsTasksAndReturnsValues) {
  ThreadPool pool(2, "test");
  EXPECT_EQ(pool.size(), 2u);
  auto f = pool.submit([] { return 21 * 2; });
  EXPECT_EQ(*get_within(f), 42);
  auto in_pool = pool.submit([&pool] { return pool.in_pool(); });
  EXPECT_TRUE(*get_within(in_pool));
  EXPECT_FALSE(pool.in_pool());
}

TEST(ThreadPool, ExceptionsAreCaughtCountedAndWorkersSurvive) {
  ThreadPool pool(1, "test");
  const auto global_before = unhandled_callback_exceptions();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pool.post([] { throw std::runtime_error("task failed"); }));
  }
  auto after = pool.submit([] { return 1; });
  EXPECT_EQ(*get_within(after), 1);  // the single worker survived three throws
  EXPECT_EQ(pool.exceptions(), 3u);
  EXPECT_EQ(unhandled_callback_exceptions(), global_before + 3);
  auto thrown = pool.submit([]() -> int { throw std::runtime_error("in submit"); });
  EXPECT_EQ(get_within(thrown).status().code(), StatusCode::internal);
}

TEST(ThreadPool, ShutdownRunsQueuedTasksAndJoins) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1, "test");
    std::atomic<bool> release{false};
    pool.post([&] {
      while (!release.load()) std::this_thread::sleep_for(1ms);
    });
    for (int i = 0; i < 100; ++i) pool.post([&] { ran++; });
    std::jthread releaser([&] {
      std::this_thread::sleep_for(10ms);
      release = true;
    });
    pool.shutdown();  // blocks until the 100 queued tasks ran
    EXPECT_EQ(ran.load(), 100);
    EXPECT_FALSE(pool.post([&] { ran++; }));
    auto rejected = pool.submit([] { return 1; });
    EXPECT_EQ(rejected.get().status().code(), StatusCode::aborted);
    pool.shutdown();  // idempotent
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPool, SpinningWorkersRunEveryTaskAndShutDown) {
  // Tasks posted while the workers spin, and after they gave up spinning and slept: each runs
  // once, and shutdown joins workers that may be mid-spin.
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2, "spin");
    std::atomic<int> asked{0};
    pool.spin_before_sleep(1ms, [&] { return ++asked % 2 == 0; });  // every other idle period
    for (int i = 0; i < 2000; ++i) {
      ASSERT_TRUE(pool.post([&] { ran++; }));
      if (i % 100 == 0) std::this_thread::sleep_for(2ms);  // longer than the spin: they sleep
    }
    auto last = pool.submit([] { return 1; });
    EXPECT_EQ(*get_within(last), 1);
    EXPECT_GT(asked.load(), 0);  // the workers asked whether to spin
  }
  EXPECT_EQ(ran.load(), 2000);
}

TEST(ThreadPool, ShutdownWakesIdleWorkers) {
  // Counted by name: ASan's background thread may start at any moment, so the process's total
  // is not a measure (it once made this test fail under ASan). Each worker names itself once it
  // runs, and a joined thread's /proc entry goes a moment after the join, so both counts are
  // awaited (a CI run once saw 2 of 4 names).
  {
    ThreadPool pool(4, "idlewake");
    EXPECT_TRUE(testing::eventually([] { return testing::threads_named("idlewake-") == 4; }))
        << testing::threads_named("idlewake-") << " of 4 workers named";
  }  // destructor: idle workers are woken and joined, not left blocked
  EXPECT_TRUE(testing::eventually([] { return testing::threads_named("idlewake-") == 0; }))
      << testing::threads_named("idlewake-") << " workers left after the pool's destructor";
}

TEST(ThreadPool, WaiterOnAFutureIsWokenByShutdownDrain) {
  auto pool = std::make_unique<ThreadPool>(1, "test");
  auto f = pool->submit([] {
    std::this_thread::sleep_for(5ms);
    return 3;
  });
  std::jthread waiter([&] { EXPECT_EQ(*get_within(f), 3); });
  pool->shutdown();
  waiter.join();
}

TEST(DeadlineTimer, FiresInDeadlineOrder) {
  DeadlineTimer timer;
  std::mutex mu;
  std::vector<int> order;
  Promise<int> done;
  Future<int> done_f = done.get_future();
  const auto now = Clock::now();
  const int delays_ms[] = {30, 10, 20, 10, 5};
  for (int i = 0; i < 5; ++i) {
    timer.add(now + std::chrono::milliseconds(delays_ms[i]), [&, i] {
      std::lock_guard lock(mu);
      order.push_back(i);
      if (order.size() == 5) done.set_value(1);
    });
  }
  ASSERT_TRUE(get_within(done_f).ok());
  // 5 ms first; the two 10 ms timers in the order they were added; then 20 and 30 ms.
  EXPECT_EQ(order, (std::vector<int>{4, 1, 3, 2, 0}));
  EXPECT_EQ(timer.fired(), 5u);
}

TEST(DeadlineTimer, FiresNoEarlierThanItsDeadline) {
  DeadlineTimer timer;
  Promise<Clock::time_point> fired;
  auto f = fired.get_future();
  const auto when = Clock::now() + 20ms;
  timer.add(when, [&] { fired.set_value(Clock::now()); });
  auto at = get_within(f);
  ASSERT_TRUE(at.ok());
  EXPECT_GE(*at, when);
}

TEST(DeadlineTimer, EarlierTimerAddedLaterWakesTheThread) {
  DeadlineTimer timer;
  std::atomic<bool> late_fired{false};
  timer.add(Clock::now() + 10s, [&] { late_fired = true; });
  Promise<int> early;
  auto f = early.get_future();
  timer.add(Clock::now() + 1ms, [&] { early.set_value(1); });
  EXPECT_TRUE(get_within(f, 5000ms).ok());  // not held behind the 10 s timer
  EXPECT_FALSE(late_fired.load());
}

TEST(DeadlineTimer, CancelledTimerNeverFires) {
  DeadlineTimer timer;
  std::atomic<int> fired{0};
  std::vector<TimerId> ids;
  for (int i = 0; i < 100; ++i) {
    ids.push_back(timer.add(Clock::now() + 20ms, [&] { fired++; }));
  }
  for (std::size_t i = 0; i < ids.size(); i += 2) EXPECT_TRUE(timer.cancel(ids[i]));
  EXPECT_FALSE(timer.cancel(ids[0]));  // already cancelled
  EXPECT_FALSE(timer.cancel(TimerId{}));
  EXPECT_TRUE(testing::eventually([&] { return timer.fired() == 50; }));
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(fired.load(), 50);
  EXPECT_FALSE(timer.cancel(ids[1]));  // already fired
}

TEST(DeadlineTimer, PastDeadlineFiresAtOnce) {
  DeadlineTimer timer;
  Promise<int> p;
  auto f = p.get_future();
  timer.add(Clock::now() - 1s, [&] { p.set_value(1); });
  EXPECT_TRUE(get_within(f, 5000ms).ok());
}

TEST(DeadlineTimer, ShutdownWithPendingTimersDropsThemUnrun) {
  std::atomic<int> fired{0};
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> weak = token;
  auto timer = std::make_unique<DeadlineTimer>();
  for (int i = 0; i < 10; ++i) {
    timer->add(Clock::now() + 1h, [&fired, token] { fired++; });
  }
  token.reset();
  EXPECT_EQ(timer->pending(), 10u);
  timer->shutdown();
  EXPECT_EQ(fired.load(), 0);
  EXPECT_TRUE(weak.expired());                    // the functions were destroyed
  EXPECT_FALSE(timer->add(Clock::now(), [] {}));  // after shutdown: nothing armed
  timer.reset();
}

TEST(DeadlineTimer, ThrowingTimerFunctionIsCounted) {
  DeadlineTimer timer;
  timer.add(Clock::now(), [] { throw std::runtime_error("timer bug"); });
  Promise<int> p;
  auto f = p.get_future();
  timer.add(Clock::now() + 1ms, [&] { p.set_value(1); });
  EXPECT_TRUE(get_within(f).ok());
  EXPECT_EQ(timer.exceptions(), 1u);
}

}  // namespace
}  // namespace asyncinfer
