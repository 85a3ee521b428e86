#include <gtest/gtest.h>

#include "asyncinfer/status.hpp"

namespace asyncinfer {
namespace {

TEST(Status, DefaultIsOkWithoutMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::ok);
  EXPECT_TRUE(s.message().empty());
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, ErrorCarriesCodeAndMessage) {
  Status s = invalid_argument_error("input 'x' has shape [2] but [3] was expected");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.to_string(), "invalid_argument: input 'x' has shape [2] but [3] was expected");
}

TEST(Status, EmptyMessageIsReplaced) {
  Status s(StatusCode::internal, "");
  EXPECT_EQ(s.message(), "internal (no detail given)");
}

TEST(Status, OkIgnoresMessage) {
  Status s(StatusCode::ok, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE(s.message().empty());
}

TEST(Status, WithContextPrefixes) {
  Status s = unavailable_error("device busy").with_context("worker 1");
  EXPECT_EQ(s.code(), StatusCode::unavailable);
  EXPECT_EQ(s.message(), "worker 1: device busy");
  EXPECT_TRUE(Status().with_context("x").ok());
}

TEST(Status, EveryCodeHasANameThatParsesBack) {
  const StatusCode codes[] = {StatusCode::ok,
                              StatusCode::cancelled,
                              StatusCode::invalid_argument,
                              StatusCode::deadline_exceeded,
                              StatusCode::not_found,
                              StatusCode::already_exists,
                              StatusCode::resource_exhausted,
                              StatusCode::failed_precondition,
                              StatusCode::aborted,
                              StatusCode::unavailable,
                              StatusCode::internal};
  for (StatusCode c : codes) {
    StatusCode parsed{};
    ASSERT_TRUE(parse_status_code(to_string(c), &parsed)) << to_string(c);
    EXPECT_EQ(parsed, c);
  }
  StatusCode unused{};
  EXPECT_FALSE(parse_status_code("nope", &unused));
  EXPECT_EQ(to_string(StatusCode::resource_exhausted), "resource_exhausted");
}

TEST(Status, CopiesShareEqualMessage) {
  Status a = not_found_error("id 'r1' expired after its TTL");
  Status b = a;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, not_found_error("other"));
}

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument_error("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> quarter(int x) {
  ASYNCINFER_ASSIGN_OR_RETURN(int h, half(x));
  return half(h);
}

Status check_even(int x) {
  ASYNCINFER_RETURN_IF_ERROR(half(x).status());
  return Status();
}

TEST(Result, HoldsValueOrError) {
  Result<int> ok = half(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 4);
  EXPECT_TRUE(ok.status().ok());
  Result<int> bad = half(3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(bad.value_or(-1), -1);
}

TEST(Result, MacrosPropagate) {
  EXPECT_EQ(*quarter(8), 2);
  EXPECT_EQ(quarter(6).status().message(), "odd: 3");
  EXPECT_TRUE(check_even(2).ok());
  EXPECT_FALSE(check_even(1).ok());
}

TEST(ResultDeathTest, ValueOnErrorAborts) {
  Result<int> bad = half(1);
  EXPECT_DEATH((void)bad.value(), "Result::value\\(\\) on an error");
}

TEST(ResultDeathTest, ConstructFromOkStatusAborts) {
  EXPECT_DEATH({ Result<int> r{Status()}; }, "ok Status");
}

}  // namespace
}  // namespace asyncinfer
