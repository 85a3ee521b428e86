// A worker's circuit breaker (src/engine/circuit_breaker.hpp) alone: no engine, no thread, the
// time given by the test. Each case names the rule of circuit_breaker.hpp it checks.
#include <gtest/gtest.h>

#include "engine/circuit_breaker.hpp"

namespace asyncinfer::detail {
namespace {
using namespace std::chrono_literals;

CircuitBreakerOptions options(int threshold, std::chrono::milliseconds cooldown = 100ms) {
  CircuitBreakerOptions o;
  o.failure_threshold = threshold;
  o.cooldown = cooldown;
  return o;
}

const Clock::time_point t0 = Clock::now();

TEST(CircuitBreaker, OpensAfterThresholdFailuresInARowAndTakesNoWorkUntilTheCoolDownEnds) {
  CircuitBreaker b(options(3));
  EXPECT_FALSE(b.record_failure(StatusCode::internal, t0));
  EXPECT_FALSE(b.record_failure(StatusCode::unavailable, t0));
  EXPECT_EQ(b.admit(8, t0), 8);
  EXPECT_FALSE(b.open_flag()->load());
  EXPECT_TRUE(b.record_failure(StatusCode::internal, t0));
  EXPECT_EQ(b.state(), Breaker::open);
  EXPECT_TRUE(b.open_flag()->load());
  EXPECT_EQ(b.open_until(), t0 + 100ms);
  EXPECT_EQ(b.admit(8, t0 + 99ms), std::nullopt);
  EXPECT_EQ(b.state(), Breaker::open);
}

TEST(CircuitBreaker, ASuccessRestartsTheCount) {
  CircuitBreaker b(options(2));
  EXPECT_FALSE(b.record_failure(StatusCode::internal, t0));
  b.record_success();
  EXPECT_FALSE(b.record_failure(StatusCode::internal, t0));
  EXPECT_EQ(b.state(), Breaker::closed);
  EXPECT_TRUE(b.record_failure(StatusCode::internal, t0));
}

TEST(CircuitBreaker, AfterTheCoolDownOneProbeClosesItOnSuccess) {
  CircuitBreaker b(options(1));
  ASSERT_TRUE(b.record_failure(StatusCode::internal, t0));
  EXPECT_EQ(b.admit(8, t0 + 100ms), 1);  // half open: one request in flight, the probe
  EXPECT_EQ(b.state(), Breaker::half_open);
  EXPECT_FALSE(b.open_flag()->load());
  b.record_success();
  EXPECT_EQ(b.state(), Breaker::closed);
  EXPECT_EQ(b.admit(8, t0 + 100ms), 8);
}

TEST(CircuitBreaker, AFailedProbeOpensItAgainForAnotherCoolDown) {
  CircuitBreaker b(options(5));
  for (int i = 0; i < 5; ++i) b.record_failure(StatusCode::internal, t0);
  ASSERT_EQ(b.admit(8, t0 + 100ms), 1);
  EXPECT_TRUE(b.record_failure(StatusCode::internal, t0 + 150ms));  // one failure is enough
  EXPECT_EQ(b.state(), Breaker::open);
  EXPECT_EQ(b.open_until(), t0 + 250ms);
}

TEST(CircuitBreaker, FailuresThatAreTheRequestsOrTheCallersDoNotCount) {
  CircuitBreaker b(options(1));
  EXPECT_FALSE(b.record_failure(StatusCode::invalid_argument, t0));
  EXPECT_FALSE(b.record_failure(StatusCode::cancelled, t0));
  EXPECT_FALSE(b.record_failure(StatusCode::aborted, t0));
  EXPECT_EQ(b.state(), Breaker::closed);
  EXPECT_TRUE(b.record_failure(StatusCode::deadline_exceeded, t0));  // the hang watchdog's
}

TEST(CircuitBreaker, LateFailuresWhileOpenDoNotExtendTheCoolDown) {
  CircuitBreaker b(options(1));
  ASSERT_TRUE(b.record_failure(StatusCode::internal, t0));
  EXPECT_FALSE(b.record_failure(StatusCode::internal, t0 + 50ms));  // launched before it opened
  EXPECT_EQ(b.open_until(), t0 + 100ms);
}

TEST(CircuitBreaker, ThresholdZeroIsNoBreakerAndAMaxCoolDownIsOpenForGood) {
  CircuitBreaker off(options(0));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(off.record_failure(StatusCode::internal, t0));
  EXPECT_EQ(off.admit(4, t0), 4);

  CircuitBreaker forever(options(1, std::chrono::milliseconds::max()));
  ASSERT_TRUE(forever.record_failure(StatusCode::internal, t0));
  EXPECT_EQ(forever.open_until(), Clock::time_point::max());
  EXPECT_EQ(forever.admit(4, t0 + std::chrono::hours(24 * 365)), std::nullopt);
}

}  // namespace
}  // namespace asyncinfer::detail
