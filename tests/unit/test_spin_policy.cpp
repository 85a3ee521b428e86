// The spin before a blocking wait and the one policy that says when and how long
// (src/core/spin_wait.hpp), alone: SpinWait (one thread's spin and its back-off), SpinPolicy
// (the budget from the public option and the cores, the low-load rules of the engine's threads
// and of an HTTP I/O thread) and Arrivals (a consumer's spin on a queue without its lock). No
// engine, no pool. The sites that consult the policy are tested through their own tests
// (test_scheduler.cpp, test_executor.cpp, test_engine.cpp, test_server.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/spin_wait.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- SpinWait ----------------------------------------------------------------------------------

TEST(SpinWait, ReturnsTrueOnceTheConditionHoldsWithinItsBudget) {
  SpinWait w(std::chrono::seconds(10));  // long: the condition must end it, not the budget
  std::atomic<bool> flag{false};
  std::jthread setter([&] {
    std::this_thread::sleep_for(2ms);
    flag = true;
  });
  const auto start = Clock::now();
  EXPECT_TRUE(w.spin([&] { return flag.load(); }));
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(SpinWait, ZeroBudgetNeverSpins) {
  SpinWait w(0ns);
  int calls = 0;
  EXPECT_FALSE(w.spin([&] { return ++calls > 0; }));
  EXPECT_EQ(calls, 0);
}

TEST(SpinWait, RunsOutAfterItsBudgetAndBacksOffAfterMissesInARow) {
  SpinWait w(50us);
  int calls = 0;
  const auto never = [&] {
    ++calls;
    return false;
  };
  for (int i = 0; i < SpinWait::kMissesToBackOff; ++i) {
    calls = 0;
    const auto start = Clock::now();
    EXPECT_FALSE(w.spin(never));
    EXPECT_GE(Clock::now() - start, 50us) << "miss " << i;
    EXPECT_GT(calls, 0);
  }
  calls = 0;  // backing off: these waits sleep at once
  for (int i = 0; i < SpinWait::kBackOffWaits; ++i) EXPECT_FALSE(w.spin(never));
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(w.spin(never));  // then it tries again
  EXPECT_GT(calls, 0);
}

TEST(SpinWait, ASuccessStartsTheCountOfMissesAgain) {
  SpinWait w(20us);
  int calls = 0;
  const auto never = [&] {
    ++calls;
    return false;
  };
  for (int i = 0; i + 1 < SpinWait::kMissesToBackOff; ++i) EXPECT_FALSE(w.spin(never));
  EXPECT_TRUE(w.spin([] { return true; }));
  for (int i = 0; i + 1 < SpinWait::kMissesToBackOff; ++i) EXPECT_FALSE(w.spin(never));
  calls = 0;
  EXPECT_FALSE(w.spin(never));  // the 7th miss since the success: still spinning
  EXPECT_GT(calls, 0);
}

// ---- SpinPolicy --------------------------------------------------------------------------------

TEST(SpinPolicy, ADefaultOrZeroBudgetNeverSpins) {
  constexpr SpinPolicy none;
  static_assert(!none.spins() && none.budget() == 0us);
  EXPECT_FALSE(none.worth_spinning(0, 4));
  EXPECT_FALSE(none.worth_polling(1));
  EXPECT_FALSE(SpinPolicy(0us).spins());
  EXPECT_FALSE(SpinPolicy(-5us).spins());
  EXPECT_EQ(SpinPolicy(-5us).budget(), 0us);
  SpinWait w = SpinPolicy(0us).waiter();
  int calls = 0;
  EXPECT_FALSE(w.spin([&] { return ++calls > 0; }));
  EXPECT_EQ(calls, 0);
}

TEST(SpinPolicy, FromTheOptionKeepsTheBudgetOnTwoCoresOrMoreAndNeverSpinsOnOne) {
  EXPECT_EQ(SpinPolicy::from_option(10us, 2).budget(), 10us);
  EXPECT_EQ(SpinPolicy::from_option(1000us, 64).budget(), 1000us);
  EXPECT_EQ(SpinPolicy::from_option(10us, 1).budget(), 0us);
  EXPECT_EQ(SpinPolicy::from_option(10us, 0).budget(), 0us);
  EXPECT_EQ(SpinPolicy::from_option(0us, 8).budget(), 0us);
  // Without the count: this process's affinity (available_cores).
  EXPECT_EQ(SpinPolicy::from_option(10us).spins(), available_cores() >= 2);
}

TEST(SpinPolicy, EngineThreadsSpinOnlyWhileAtMostOneRequestPerWorkerIsUndelivered) {
  const SpinPolicy p(10us);
  EXPECT_TRUE(p.worth_spinning(0, 1));  // idle: the next request comes from a waiting caller
  EXPECT_TRUE(p.worth_spinning(1, 1));
  EXPECT_FALSE(p.worth_spinning(2, 1));  // more in flight: sleeping lets them batch
  EXPECT_TRUE(p.worth_spinning(4, 4));
  EXPECT_FALSE(p.worth_spinning(5, 4));
}

TEST(SpinPolicy, AnIoThreadPollsOnlyWhileExactlyOneAnswerIsAwaited) {
  const SpinPolicy p(10us);
  EXPECT_FALSE(p.worth_polling(0));  // the next thing is a client's bytes
  EXPECT_TRUE(p.worth_polling(1));
  EXPECT_FALSE(p.worth_polling(2));  // answers come often enough
}

TEST(SpinPolicy, EachWaiterKeepsItsOwnHistory) {
  const SpinPolicy p(20us);
  SpinWait a = p.waiter();
  SpinWait b = p.waiter();
  const auto never = [] { return false; };
  for (int i = 0; i < SpinWait::kMissesToBackOff; ++i) EXPECT_FALSE(a.spin(never));
  int calls = 0;
  EXPECT_FALSE(a.spin([&] { return ++calls < 0; }));  // a backs off: no call
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(b.spin([&] { return ++calls < 0; }));  // b still spins
  EXPECT_GT(calls, 0);
}

// ---- Arrivals ----------------------------------------------------------------------------------

TEST(Arrivals, ASpinEndsWhenWorkIsNotedAndHoldsTheLockAgain) {
  std::mutex mu;
  Arrivals arrivals;
  SpinWait w(10s);  // long: the arrival must end it, not the budget
  std::unique_lock lock(mu);
  std::jthread producer([&] {
    std::this_thread::sleep_for(2ms);
    std::lock_guard g(mu);  // the consumer let go of it while spinning
    arrivals.note();
  });
  const auto start = Clock::now();
  EXPECT_TRUE(arrivals.spin_unlocked(lock, w, [] { return false; }));
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(Arrivals, ASpinEndsWhenStopSaysSo) {
  std::mutex mu;
  Arrivals arrivals;
  SpinWait w(10s);
  std::atomic<bool> stop{false};
  std::unique_lock lock(mu);
  std::jthread stopper([&] {
    std::this_thread::sleep_for(2ms);
    stop = true;
  });
  EXPECT_TRUE(arrivals.spin_unlocked(lock, w, [&] { return stop.load(); }));
  EXPECT_TRUE(lock.owns_lock());
}

TEST(Arrivals, OnlyArrivalsAfterTheSpinBeganEndIt) {
  std::mutex mu;
  Arrivals arrivals;
  std::unique_lock lock(mu);
  arrivals.note();  // before: already seen by whoever looked at the queue
  SpinWait w(50us);
  const auto start = Clock::now();
  EXPECT_FALSE(arrivals.spin_unlocked(lock, w, [] { return false; }));  // ran out
  EXPECT_GE(Clock::now() - start, 50us);
  EXPECT_TRUE(lock.owns_lock());
}

}  // namespace
}  // namespace asyncinfer::detail
