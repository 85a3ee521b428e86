// Decoupled models (ModelSignature::decoupled, Triton's model_transaction_policy { decoupled:
// true }): many responses per request through BatchIO::responses and RequestOptions::on_response,
// then a final result that may carry no outputs. builtin:stream is the model under test.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;

/// What one request's on_response saw, safe to read while responses arrive.
struct Received {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Outputs> responses;

  std::function<Status(Outputs, std::stop_token)> handler() {
    return [this](Outputs o, std::stop_token) {
      std::lock_guard lock(mu);
      responses.push_back(std::move(o));
      cv.notify_all();
      return Status();
    };
  }
  std::size_t count() {
    std::lock_guard lock(mu);
    return responses.size();
  }
  bool wait_for_count(std::size_t n, std::chrono::milliseconds limit = 10s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return responses.size() >= n; });
  }
};

std::shared_ptr<Engine> make_engine(const std::string& uri, EngineOptions o = {},
                                    const std::string& device = "cpu") {
  auto model = load_model(uri);
  EXPECT_TRUE(model.ok()) << model.status();
  auto dev = open_device(device);
  EXPECT_TRUE(dev.ok()) << dev.status();
  if (o.workers == 0) o.workers = 1;
  auto engine = Engine::create(*model, *dev, o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::shared_ptr<Engine>(std::move(*engine)) : nullptr;
}

Tensor row_values(std::vector<float> v) {
  return *Tensor::from_values<float>({1, static_cast<std::int64_t>(v.size())}, v);
}

std::vector<float> floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return {p, p + t.numel()};
}

TEST(Decoupled, StreamSignatureSaysDecoupled) {
  auto model = load_model("builtin:stream?n=3");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelSignature& sig = (*model)->signature();
  EXPECT_TRUE(sig.decoupled);
  ASSERT_EQ(sig.outputs.size(), 2u);
  EXPECT_EQ(sig.outputs[0].name, "output0");
  EXPECT_EQ(sig.outputs[1].name, "index");
  EXPECT_EQ(sig.outputs[1].dtype, DType::i32);
  EXPECT_NE(sig.to_string().find("decoupled"), std::string::npos);
  EXPECT_FALSE(load_model("builtin:identity").value()->signature().decoupled);
  auto bad = load_model("builtin:stream?n=-1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("n"), std::string_view::npos) << bad.status();
  auto unknown = load_model("builtin:stream?count=3");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("count"), std::string_view::npos) << unknown.status();
}

class DecoupledOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  /// cpu (the worker runs each batch itself), cpu with a watchdog (the stream's thread runs it),
  /// sim (a simulated accelerator's stream).
  EngineOptions options() const {
    EngineOptions o;
    if (GetParam() == "cpu+watchdog") o.watchdog = 10s;
    return o;
  }
  std::string device() const { return GetParam() == "sim" ? "sim" : "cpu"; }
};

TEST_P(DecoupledOnDevice, EachRequestGetsItsResponsesInOrderThenAnEmptyFinal) {
  auto engine = make_engine("builtin:stream?n=4", options(), device());
  ASSERT_TRUE(engine);
  Received got;
  RequestOptions ro;
  ro.on_response = got.handler();
  auto r = get_within(engine->submit({row_values({1.5F, -2.0F, 3.0F})}, ro));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty()) << "the final result is the flag alone";
  ASSERT_EQ(got.count(), 4u);  // all sent before the final result
  for (std::size_t k = 0; k < 4; ++k) {
    ASSERT_EQ(got.responses[k].size(), 2u);
    EXPECT_EQ(floats(got.responses[k][0]), (std::vector<float>{1.5F, -2.0F, 3.0F}));
    EXPECT_EQ(got.responses[k][1].shape(), (Shape{1, 1}));
    EXPECT_EQ(got.responses[k][1].data_as<std::int32_t>()[0], static_cast<std::int32_t>(k));
  }
}

TEST_P(DecoupledOnDevice, ABatchSendsEachRequestItsOwnRows) {
  EngineOptions o = options();
  o.batching.max_queue_delay = 200ms;
  o.batching.preferred_batch_sizes = {5};
  auto engine = make_engine("builtin:stream?n=2&shape=1", o, device());
  ASSERT_TRUE(engine);
  constexpr int kRequests = 3;  // rows 1, 2 and 2: one batch of 5
  std::vector<Received> got(kRequests);
  std::vector<Future<Outputs>> futures;
  for (int i = 0; i < kRequests; ++i) {
    const std::int64_t rows = i == 0 ? 1 : 2;
    std::vector<float> v;
    for (std::int64_t j = 0; j < rows; ++j) v.push_back(static_cast<float>(10 * i + j));
    RequestOptions ro;
    ro.on_response = got[static_cast<std::size_t>(i)].handler();
    futures.push_back(engine->submit({*Tensor::from_values<float>({rows, 1}, v)}, ro));
  }
  for (int i = 0; i < kRequests; ++i) {
    auto r = get_within(futures[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(r.ok()) << r.status();
    Received& g = got[static_cast<std::size_t>(i)];
    ASSERT_EQ(g.count(), 2u);
    const std::int64_t rows = i == 0 ? 1 : 2;
    for (std::size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(g.responses[k][0].shape(), (Shape{rows, 1}));
      EXPECT_EQ(g.responses[k][0].data_as<float>()[0], static_cast<float>(10 * i));
      EXPECT_EQ(g.responses[k][1].shape(), (Shape{rows, 1}));
    }
  }
  EXPECT_EQ(engine->metrics().batches, 1u) << "the three requests should have shared a batch";
}

TEST_P(DecoupledOnDevice, CancellingStopsTheResponses) {
  auto engine = make_engine("builtin:stream?n=100000&interval_us=2000", options(), device());
  ASSERT_TRUE(engine);
  Received got;
  RequestOptions ro;
  ro.on_response = got.handler();
  Future<Outputs> f = engine->submit({row_values({1.0F})}, ro);
  ASSERT_TRUE(got.wait_for_count(3));
  f.cancel();
  auto r = get_within(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::cancelled);
  // The model sees it (the batch's stop token and is_cancelled): the engine stays usable and
  // the responses stop.
  const std::size_t after = got.count();
  std::this_thread::sleep_for(30ms);
  EXPECT_LE(got.count(), after + 1);
  Received next;
  RequestOptions ro2;
  ro2.on_response = next.handler();
  EngineOptions o = options();
  auto again = make_engine("builtin:stream?n=2", o, device());
  auto r2 = get_within(again->submit({row_values({2.0F})}, ro2));
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(next.count(), 2u);
  engine->shutdown();
  EXPECT_LE(got.count(), after + 1);
}

TEST_P(DecoupledOnDevice, AReceiverThatIsGoneStopsItsRequestOnly) {
  EngineOptions o = options();
  o.batching.max_queue_delay = 200ms;
  o.batching.preferred_batch_sizes = {2};
  auto engine = make_engine("builtin:stream?n=5&shape=1", o, device());
  ASSERT_TRUE(engine);
  std::atomic<int> refused{0};
  RequestOptions gone;
  gone.on_response = [&](Outputs, std::stop_token) {
    refused.fetch_add(1);
    return cancelled_error("the client went away");
  };
  Received got;
  RequestOptions ok;
  ok.on_response = got.handler();
  auto f1 = engine->submit({*Tensor::from_values<float>({1, 1}, std::vector<float>{1})}, gone);
  auto f2 = engine->submit({*Tensor::from_values<float>({1, 1}, std::vector<float>{2})}, ok);
  ASSERT_TRUE(get_within(f1).ok());
  ASSERT_TRUE(get_within(f2).ok());
  EXPECT_EQ(refused.load(), 1) << "the model stops sending to a receiver that refused one";
  EXPECT_EQ(got.count(), 5u);
}

TEST_P(DecoupledOnDevice, ZeroResponsesIsTheFinalFlagAlone) {
  auto engine = make_engine("builtin:stream?n=0", options(), device());
  ASSERT_TRUE(engine);
  Received got;
  RequestOptions ro;
  ro.on_response = got.handler();
  auto r = get_within(engine->submit({row_values({1.0F})}, ro));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(got.count(), 0u);
}

TEST_P(DecoupledOnDevice, ABlockingReceiverSlowsTheModelDown) {
  // Back-pressure: the handler blocks until the test lets it go; the model's next send waits.
  auto engine = make_engine("builtin:stream?n=3", options(), device());
  ASSERT_TRUE(engine);
  std::mutex mu;
  std::condition_variable cv;
  int allowed = 1;
  int seen = 0;
  RequestOptions ro;
  ro.on_response = [&](Outputs, std::stop_token) {
    std::unique_lock lock(mu);
    ++seen;
    cv.notify_all();
    cv.wait(lock, [&] { return seen <= allowed; });
    return Status();
  };
  Future<Outputs> f = engine->submit({row_values({1.0F})}, ro);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return seen == 2; }));
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(f.is_ready()) << "the model must wait for the receiver";
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(seen, 2);
    allowed = 100;
  }
  cv.notify_all();
  ASSERT_TRUE(get_within(f).ok());
  EXPECT_EQ(seen, 3);
}

INSTANTIATE_TEST_SUITE_P(Devices, DecoupledOnDevice,
                         ::testing::Values("cpu", "cpu+watchdog", "sim"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) {
                             if (c == '+') c = '_';
                           }
                           return n;
                         });

TEST(Decoupled, ARequestWithoutAReceiverIsRefused) {
  auto engine = make_engine("builtin:stream?n=2");
  ASSERT_TRUE(engine);
  auto r = get_within(engine->submit({row_values({1.0F})}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("on_response"), std::string_view::npos) << r.status();
}

TEST(Decoupled, ARequestThatSentResponsesIsNotRunAgain) {
  // The batch fails (unavailable, retryable) after 3 responses; retries are allowed, yet the
  // request fails instead of sending its first responses twice.
  EngineOptions o;
  o.retry.max_attempts = 3;
  auto engine = make_engine("builtin:stream?n=10&fail_after=3", o);
  ASSERT_TRUE(engine);
  Received got;
  RequestOptions ro;
  ro.on_response = got.handler();
  auto r = get_within(engine->submit({row_values({1.0F})}, ro));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unavailable);
  EXPECT_NE(r.status().message().find("not run again"), std::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("fail_after"), std::string_view::npos) << r.status();
  ASSERT_EQ(got.count(), 3u) << "a response was sent twice";
  EXPECT_EQ(engine->metrics().retries, 0u);
  // A decoupled request runs once, even when it failed before its first response.
  auto retried = make_engine("builtin:stream?n=10&fail_after=0", o);
  Received none;
  RequestOptions ro2;
  ro2.on_response = none.handler();
  auto r2 = get_within(retried->submit({row_values({1.0F})}, ro2));
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(retried->metrics().retries, 0u);
  EXPECT_NE(r2.status().message().find("0 of its responses"), std::string_view::npos)
      << r2.status();
}

TEST_P(DecoupledOnDevice, AReceiverWaitingForRoomIsReleasedWhenTheRequestEnds) {
  // A receiver that waits (back-pressure) on `stop` as the contract says: cancelling, a deadline
  // and shutdown each release it, and the final result comes after it has returned.
  for (const char* how : {"cancel", "deadline", "shutdown"}) {
    SCOPED_TRACE(how);
    auto engine = make_engine("builtin:stream?n=10", options(), device());
    ASSERT_TRUE(engine);
    std::atomic<bool> inside{false};
    std::atomic<bool> returned{false};
    RequestOptions ro;
    if (std::string(how) == "deadline") ro.timeout = std::chrono::milliseconds(100);
    ro.on_response = [&](Outputs, std::stop_token stop) {
      inside = true;
      std::mutex mu;
      std::condition_variable_any cv;
      std::unique_lock lock(mu);
      cv.wait(lock, stop, [] { return false; });  // no room, ever
      std::this_thread::sleep_for(20ms);          // still inside while the request ends
      returned = true;
      return cancelled_error("released");
    };
    Future<Outputs> f = engine->submit({row_values({1.0F})}, ro);
    for (int i = 0; i < 1000 && !inside; ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(inside.load());
    if (std::string(how) == "cancel") f.cancel();
    if (std::string(how) == "shutdown") engine->shutdown(ShutdownMode::cancel);
    auto r = get_within(f, 10s);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(returned.load()) << "the final result came before on_response returned";
    engine->shutdown();
  }
}

}  // namespace
}  // namespace asyncinfer
