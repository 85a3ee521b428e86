// Dynamic batching, priorities, ordered delivery and per-request failure isolation (issue 6).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "asyncinfer/engine.hpp"
#include "engine/test_hooks.hpp"
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

std::unique_ptr<Engine> scripted_engine(const std::shared_ptr<ScriptedModel>& model,
                                        EngineOptions o) {
  auto e = Engine::create(model, *open_device("cpu"), std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

/// A model whose call with first element `blocker` takes `block` and the rest `rest`.
std::shared_ptr<ScriptedModel> slow_first(float blocker, std::chrono::microseconds block,
                                          std::chrono::microseconds rest = 0us) {
  return std::make_shared<ScriptedModel>([=](const Call& c) {
    return Decision{Status(), c.firsts.at(0) == blocker ? block : rest};
  });
}

/// Occupies the engine's single in-flight slot until the blocker completes.
Future<Outputs> occupy(Engine& e, const std::shared_ptr<ScriptedModel>& m, float blocker) {
  auto f = e.submit(one(blocker));
  EXPECT_TRUE(testing::eventually([&] { return !m->calls().empty(); }));
  return f;
}

EngineOptions one_slot(std::optional<std::int64_t> max_batch) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = max_batch;
  return o;
}

TEST(Batching, QueuedRequestsFormBatchesUpToTheMaxSize) {
  auto m = slow_first(-1, 100ms);
  auto e = scripted_engine(m, one_slot(8));
  auto blocker = occupy(*e, m, -1);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 20; ++i) fs.push_back(e->submit(one(static_cast<float>(i))));
  for (int i = 0; i < 20; ++i) {
    auto r = get_within(fs[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(first_value(*r), static_cast<float>(i));  // outputs split back per request
  }
  auto calls = m->calls();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[1].firsts.size(), 8u);
  EXPECT_EQ(calls[2].firsts.size(), 8u);
  EXPECT_EQ(calls[3].firsts.size(), 4u);
  EXPECT_EQ(calls[1].firsts.front(), 0.0f);  // FIFO
  EXPECT_EQ(calls[3].firsts.back(), 19.0f);
  const auto metrics = e->metrics();
  EXPECT_EQ(metrics.batches, 4u);
  EXPECT_EQ(metrics.batch_size.count, 4u);
  EXPECT_DOUBLE_EQ(metrics.batch_size.sum, 21.0);
}

// The one max batch size rule (BatchingOptions::max_batch_size): unset = the model's batch
// limit, or kDefaultMaxBatchSize when the model has none; an explicit value is used as given, one
// above the model's limit is refused instead of lowered, and one below 1 is refused; options()
// reports the value in effect.
TEST(Batching, MaxBatchSizeFollowsOneRule) {
  auto device = *open_device("cpu");
  auto effective = [&](std::optional<std::int64_t> model_max,
                       std::optional<std::int64_t> asked) -> Result<std::int64_t> {
    auto m = std::make_shared<ScriptedModel>([](const Call&) { return Decision{}; }, model_max);
    EngineOptions o;
    o.batching.max_batch_size = asked;
    ASYNCINFER_ASSIGN_OR_RETURN(auto e, Engine::create(m, device, o));
    EXPECT_TRUE(e->options().batching.max_batch_size.has_value());
    return e->options().batching.max_batch_size.value_or(-1);
  };
  EXPECT_EQ(effective(32, std::nullopt).value(), 32);
  EXPECT_EQ(effective(32, 8).value(), 8);
  EXPECT_EQ(effective(32, 32).value(), 32);
  EXPECT_EQ(effective(std::nullopt, std::nullopt).value(), kDefaultMaxBatchSize);
  EXPECT_EQ(effective(std::nullopt, 500).value(), 500);  // no silent cap: the model has no limit
  for (std::int64_t bad : {0, -1}) {
    auto refused = effective(32, bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(refused.status().message().find("batching.max_batch_size " + std::to_string(bad) +
                                              " must be >= 1"),
              std::string_view::npos)
        << refused.status();
  }
  auto above = effective(32, 33);
  ASSERT_FALSE(above.ok());
  EXPECT_EQ(above.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(above.status().message().find("max_batch_size 33 exceeds the model's batch limit 32"),
            std::string_view::npos)
      << above.status();
  auto unbatched = make_engine("builtin:identity?max_batch_size=0");
  ASSERT_NE(unbatched, nullptr);
  EXPECT_EQ(unbatched->options().batching.max_batch_size, 1);
  // The query key's old spelling still works; giving both is an error naming them.
  EXPECT_EQ((*load_model("builtin:identity?max_batch=8"))->signature().batch_limit, 8);
  EXPECT_EQ(load_model("builtin:identity?max_batch=8&max_batch_size=8").status().code(),
            StatusCode::invalid_argument);
  // A model's batch limit, when given to load_model, is at least 1 (unset = the model's own).
  ModelOptions zero_limit;
  zero_limit.batch_limit = 0;
  auto refused = load_model("builtin:identity", zero_limit);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(refused.status().message().find("batch_limit 0 must be >= 1"), std::string_view::npos)
      << refused.status();
}

TEST(Batching, BatchesGrowPastTheDefaultWhenTheModelHasNoLimit) {
  auto m = std::make_shared<ScriptedModel>(
      [](const Call& c) {
        return Decision{Status(), c.firsts.at(0) == -1 ? 300ms : 0us};
      },
      /*max_batch=*/std::nullopt);
  auto e = scripted_engine(m, one_slot(100));
  auto blocker = occupy(*e, m, -1);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 100; ++i) fs.push_back(e->submit(one(static_cast<float>(i))));
  for (auto& f : fs) ASSERT_TRUE(get_within(f).ok());
  auto calls = m->calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].firsts.size(), 100u);  // not capped at kDefaultMaxBatchSize (64)
}

TEST(Batching, MaxQueueDelayIsHonoured) {
  auto m = slow_first(-1, 0us);
  EngineOptions o = one_slot(8);
  o.batching.max_queue_delay = 60ms;
  auto e = scripted_engine(m, o);
  const auto t0 = Clock::now();
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 5; ++i) fs.push_back(e->submit(one(static_cast<float>(i))));
  for (auto& f : fs) ASSERT_TRUE(get_within(f).ok());
  auto calls = m->calls();
  ASSERT_EQ(calls.size(), 1u);  // the worker waited for more instead of running 5 batches of 1
  EXPECT_EQ(calls[0].firsts.size(), 5u);
  const double waited = std::chrono::duration<double, std::milli>(calls[0].at - t0).count();
  EXPECT_GE(waited, 55.0);
  EXPECT_LT(waited, 500.0);
}

TEST(Batching, AFullBatchDoesNotWaitForTheDelay) {
  auto m = slow_first(-1, 0us);
  EngineOptions o = one_slot(4);
  o.batching.max_queue_delay = 10s;
  auto e = scripted_engine(m, o);
  const auto t0 = Clock::now();
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 4; ++i) fs.push_back(e->submit(one(static_cast<float>(i))));
  for (auto& f : fs) ASSERT_TRUE(get_within(f).ok());
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(m->calls().at(0).firsts.size(), 4u);
}

TEST(Batching, PreferredSizeIsTakenAsSoonAsItIsReachable) {
  auto m = slow_first(-1, 150ms);
  EngineOptions o = one_slot(8);
  o.batching.max_queue_delay = 3s;
  o.batching.preferred_batch_sizes = {4};
  auto e = scripted_engine(m, o);
  // Four blockers: the fourth makes the preferred size reachable, so they go at once as one
  // batch, without waiting 3 s for a full batch of 8; the batch holds the only slot for 150 ms.
  const auto t0 = Clock::now();
  std::vector<Future<Outputs>> blockers;
  for (int i = 0; i < 4; ++i) blockers.push_back(e->submit(one(-1)));
  ASSERT_TRUE(testing::eventually([&] { return !m->calls().empty(); }, 2500ms));
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 5; ++i) fs.push_back(e->submit(one(static_cast<float>(i))));
  // When the slot frees, 5 are queued: 4 of them (the preferred size) go at once.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(get_within(fs[static_cast<std::size_t>(i)], 2500ms).ok());
  EXPECT_LT(Clock::now() - t0, 2500ms);
  auto calls = m->calls();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[0].firsts, (std::vector<float>{-1, -1, -1, -1}));
  EXPECT_EQ(calls[1].firsts, (std::vector<float>{0, 1, 2, 3}));
  EXPECT_FALSE(fs[4].is_ready());  // the fifth waits for company or the delay
  ASSERT_TRUE(get_within(fs[4], 10'000ms).ok());
}

TEST(Batching, OnlyShapeCompatibleRequestsShareABatch) {
  auto m = slow_first(-1, 100ms);
  auto e = scripted_engine(m, one_slot(16));
  auto blocker = occupy(*e, m, -1);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 6; ++i) {
    fs.push_back(e->submit(one(static_cast<float>(i), i % 2 == 0 ? 4 : 8)));
  }
  for (int i = 0; i < 6; ++i) {
    auto r = get_within(fs[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)[0].shape(), (Shape{1, i % 2 == 0 ? 4 : 8}));
    EXPECT_EQ(first_value(*r), static_cast<float>(i));
  }
  auto calls = m->calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1].cols, 4);
  EXPECT_EQ(calls[1].firsts, (std::vector<float>{0, 2, 4}));
  EXPECT_EQ(calls[2].cols, 8);
  EXPECT_EQ(calls[2].firsts, (std::vector<float>{1, 3, 5}));
}

TEST(Batching, ARequestBetweenOrPastThePreferredSizesStillRuns) {
  // Preferred sizes 2 and 6 (Triton's qa L0_batcher): a request of 3 rows runs when the delay
  // ends, one of 7 at once. Both once waited forever: nothing fitted the largest preferred size
  // reached, and the batcher took nothing until the queue changed.
  EngineOptions o = one_slot(8);
  o.batching.preferred_batch_sizes = {2, 6};
  o.batching.max_queue_delay = 1s;
  auto e = make_engine("builtin:identity?shape=2", "cpu", o);
  const auto t0 = Clock::now();
  auto seven = get_within(e->submit({testing::rows_tensor(7, 2, 1.f)}));
  ASSERT_TRUE(seven.ok()) << seven.status();
  EXPECT_EQ((*seven)[0].shape(), (Shape{7, 2}));
  EXPECT_LT(Clock::now() - t0, 900ms);  // at once, not after the delay
  auto three = get_within(e->submit({testing::rows_tensor(3, 2, 1.f)}));
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ((*three)[0].shape(), (Shape{3, 2}));
}

TEST(Batching, MultiRowRequestsAreConcatenatedAndSplitBack) {
  auto e = make_engine("builtin:identity?shape=3", "sim", one_slot(16));
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 5; ++i) {
    fs.push_back(e->submit({testing::rows_tensor(i + 1, 3, static_cast<float>(10 * i))}));
  }
  for (int i = 0; i < 5; ++i) {
    auto r = get_within(fs[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ((*r)[0].shape(), (Shape{i + 1, 3}));
    for (int row = 0; row <= i; ++row) {
      EXPECT_EQ((*r)[0].data_as<float>()[row * 3], static_cast<float>(10 * i + row));
    }
  }
}

TEST(Priority, HighPriorityRequestEntersTheNextBatchAheadOfQueuedLowOnes) {
  auto m = slow_first(-1, 100ms);
  EngineOptions o = one_slot(4);
  o.priority_levels = 3;
  auto e = scripted_engine(m, o);
  auto blocker = occupy(*e, m, -1);
  std::vector<Future<Outputs>> low;
  RequestOptions lo;
  lo.priority = 3;
  for (int i = 0; i < 20; ++i) low.push_back(e->submit(one(static_cast<float>(i)), lo));
  RequestOptions hi;
  hi.priority = 1;
  auto high = e->submit(one(1000), hi);
  ASSERT_TRUE(get_within(high).ok());
  for (auto& f : low) ASSERT_TRUE(get_within(f).ok());
  auto calls = m->calls();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[1].firsts.front(), 1000.0f);  // first in the very next batch
  EXPECT_EQ(calls[1].firsts.size(), 4u);
  EXPECT_EQ(calls[1].firsts[1], 0.0f);  // then the oldest low ones, FIFO
}

/// Feeds high-priority requests for `feed` while one low-priority request waits; returns how
/// long the low one took.
Clock::duration low_priority_wait(std::chrono::microseconds aging, std::chrono::milliseconds feed) {
  auto m = slow_first(-1, 0us, 3ms);
  EngineOptions o = one_slot(1);
  o.priority_levels = 2;
  o.priority_aging = aging;
  o.queue_capacity = 100'000;
  auto e = scripted_engine(m, o);
  RequestOptions hi;
  hi.priority = 1;
  RequestOptions lo;
  lo.priority = 2;
  std::vector<Future<Outputs>> highs;
  for (int i = 0; i < 5; ++i) highs.push_back(e->submit(one(1), hi));  // keep the queue busy
  const auto t0 = Clock::now();
  auto low = e->submit(one(2), lo);
  while (Clock::now() - t0 < feed) {
    highs.push_back(e->submit(one(1), hi));
    std::this_thread::sleep_for(1ms);  // about as fast as the model serves them
    if (e->metrics().queue_depth < 3) highs.push_back(e->submit(one(1), hi));
  }
  EXPECT_TRUE(low.wait_for(30s));
  Clock::duration waited = Clock::duration::max();
  for (const Call& c : m->calls()) {
    if (c.firsts.at(0) == 2.0f) waited = c.at - t0;
  }
  e->shutdown(ShutdownMode::cancel);
  return waited;
}

TEST(Priority, AgingPreventsStarvation) {
  const auto feed = 600ms;
  const auto with_aging = low_priority_wait(50ms, feed);
  EXPECT_LT(with_aging, 400ms) << "aged request still starved";
  // Control: without aging the same low-priority request waits for the whole feed.
  const auto without = low_priority_wait(0us, feed);
  EXPECT_GE(without, feed - 50ms);
}

TEST(OrderedDelivery, SlowFirstRequestIsStillDeliveredFirst) {
  EngineOptions o;
  o.workers = 3;
  o.batching.max_batch_size = 1;
  o.ordered_delivery = true;
  auto e = make_engine("builtin:fixed_cost?cost_from_input=true", "sim:compute_engines=3", o);
  std::mutex mu;
  std::vector<int> order;
  Promise<int> done;
  auto done_f = done.get_future();
  auto record = [&](int i) {
    return [&, i](const Result<Outputs>& r) {
      EXPECT_TRUE(r.ok());
      std::lock_guard lock(mu);
      order.push_back(i);
      if (order.size() == 2) done.set_value(1);
    };
  };
  ASSERT_TRUE(e->submit(one(200'000), record(0)).ok());  // 200 ms
  ASSERT_TRUE(e->submit(one(10'000), record(1)).ok());   // 10 ms, on another worker
  ASSERT_TRUE(get_within(done_f).ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
}

TEST(OrderedDelivery, RandomLatenciesOnThreeWorkersKeepSubmitOrder) {
  EngineOptions o;
  o.workers = 3;
  o.batching.max_batch_size = 4;
  o.ordered_delivery = true;
  o.completion_threads = 2;
  auto e = make_engine("builtin:fixed_cost?cost_from_input=true", "sim:compute_engines=3", o);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> cost(0, 20'000);
  constexpr int kN = 120;
  std::mutex mu;
  std::vector<int> order;
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < kN; ++i) {
    auto f = e->submit(one(static_cast<float>(cost(rng))));
    f.on_complete([&, i](const Result<Outputs>&) {
      std::lock_guard lock(mu);
      order.push_back(i);
    });
    fs.push_back(std::move(f));
  }
  for (auto& f : fs) ASSERT_TRUE(get_within(f).ok());
  ASSERT_TRUE(testing::eventually([&] {
    std::lock_guard lock(mu);
    return order.size() == kN;
  }));
  for (int i = 0; i < kN; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(OrderedDelivery, OrderIsPerSequenceKeySoOneSlowClientDoesNotBlockOthers) {
  EngineOptions o;
  o.workers = 2;
  o.max_inflight_per_worker = 1;  // nothing queues on the stream behind the slow request
  o.batching.max_batch_size = 1;
  o.ordered_delivery = true;
  auto e = make_engine("builtin:fixed_cost?cost_from_input=true", "sim:compute_engines=2", o);
  RequestOptions slow_client;
  slow_client.sequence_key = "slow";
  RequestOptions fast_client;
  fast_client.sequence_key = "fast";
  auto slow = e->submit(one(400'000), slow_client);
  std::vector<Future<Outputs>> fast;
  for (int i = 0; i < 5; ++i) fast.push_back(e->submit(one(2'000), fast_client));
  for (auto& f : fast) ASSERT_TRUE(get_within(f, 5000ms).ok());
  EXPECT_FALSE(slow.is_ready());  // the fast client's results did not wait for it
  EXPECT_TRUE(get_within(slow, 5000ms).ok());
}

TEST(FailureIsolation, OneBadRequestInABatchOfFourFailsAlone) {
  EngineOptions o = one_slot(4);
  o.batching.max_queue_delay = 200ms;
  auto e = make_engine("builtin:faulty?poison=13&code=invalid_argument", "cpu", o);
  std::vector<Future<Outputs>> fs;
  for (float v : {1.0f, 13.0f, 3.0f, 4.0f}) fs.push_back(e->submit(one(v)));
  int ok = 0;
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto r = get_within(fs[i]);
    if (i == 1) {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
      EXPECT_NE(r.status().message().find("poison"), std::string_view::npos) << r.status();
    } else {
      EXPECT_TRUE(r.ok()) << r.status();
      ok += r.ok() ? 1 : 0;
    }
  }
  EXPECT_EQ(ok, 3);
  const auto m = e->metrics();
  EXPECT_EQ(m.split_batches, 1u);
  EXPECT_EQ(m.batches, 5u);  // the batch of 4, then each request alone
}

TEST(FailureIsolation, SplittingCanBeTurnedOff) {
  EngineOptions o = one_slot(4);
  o.batching.max_queue_delay = 200ms;
  o.batching.split_failed_batches = false;
  auto e = make_engine("builtin:faulty?poison=13&code=invalid_argument", "cpu", o);
  std::vector<Future<Outputs>> fs;
  for (float v : {1.0f, 13.0f, 3.0f, 4.0f}) fs.push_back(e->submit(one(v)));
  for (auto& f : fs) EXPECT_FALSE(get_within(f).ok());
}

TEST(FailureIsolation, CancelledRequestsLeaveAFormingBatch) {
  auto m = slow_first(-1, 0us);
  EngineOptions o = one_slot(8);
  o.batching.max_queue_delay = 150ms;
  auto e = scripted_engine(m, o);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 4; ++i) fs.push_back(e->submit(one(static_cast<float>(i))));
  fs[1].cancel();
  fs[2].cancel();
  for (int i : {0, 3}) ASSERT_TRUE(get_within(fs[static_cast<std::size_t>(i)]).ok());
  auto calls = m->calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].firsts, (std::vector<float>{0, 3}));  // the batch ran with the rest
  EXPECT_EQ(fs[1].get().status().code(), StatusCode::cancelled);
}

TEST(FailureIsolation, TimedOutRequestsLeaveAFormingBatch) {
  auto m = slow_first(-1, 0us);
  EngineOptions o = one_slot(8);
  o.batching.max_queue_delay = 200ms;
  auto e = scripted_engine(m, o);
  RequestOptions quick;
  quick.timeout = 20ms;
  auto a = e->submit(one(1));
  auto b = e->submit(one(2), quick);  // dispatched early (deadline − delay) or times out
  auto c = e->submit(one(3));
  EXPECT_TRUE(get_within(a).ok());
  EXPECT_TRUE(get_within(c).ok());
  auto rb = get_within(b);
  if (!rb.ok()) {
    EXPECT_EQ(rb.status().code(), StatusCode::deadline_exceeded);
  }
}

void throw_on_66(const Inputs& inputs) {
  if (inputs.at(0).data_as<float>()[0] == 66.0f) throw std::runtime_error("cannot assemble 66");
}

TEST(FailureIsolation, ExceptionInBatchAssemblyFailsOnlyItsRequest) {
  detail::set_assembly_hook(&throw_on_66);
  auto m = slow_first(-1, 100ms);
  auto e = scripted_engine(m, one_slot(8));
  auto blocker = occupy(*e, m, -1);
  std::vector<Future<Outputs>> fs;
  for (float v : {5.0f, 66.0f, 7.0f}) fs.push_back(e->submit(one(v)));
  EXPECT_TRUE(get_within(fs[0]).ok());
  auto bad = get_within(fs[1]);
  EXPECT_EQ(bad.status().code(), StatusCode::internal);
  EXPECT_NE(bad.status().message().find("batch assembly failed"), std::string_view::npos);
  EXPECT_TRUE(get_within(fs[2]).ok());
  EXPECT_TRUE(e->infer(one(8)).ok());  // the batcher keeps running
  detail::set_assembly_hook(nullptr);
  auto calls = m->calls();
  EXPECT_EQ(calls[1].firsts, (std::vector<float>{5, 7}));
}

// A model that answers each request of a batch on its own, as Triton's python backend does: a
// request whose first element is negative gets an error response of its own
// (BatchIO::request_errors); an optional second input, where the batch has it, is added.
class PerRequestModel final : public Model, public std::enable_shared_from_this<PerRequestModel> {
 public:
  explicit PerRequestModel(bool ragged_x = false) {
    sig_.batched = true;
    sig_.batch_limit = 16;
    sig_.inputs.push_back({"x", DType::f32, {-1, 1}});
    sig_.inputs.back().ragged = ragged_x;
    sig_.inputs.push_back({"extra", DType::f32, {-1, 1}, /*optional=*/true});
    sig_.outputs.push_back({"y", DType::f32, {-1, 1}});
  }
  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions&) override {
    return std::unique_ptr<ModelInstance>(std::make_unique<Instance>(shared_from_this()));
  }
  std::vector<std::size_t> batch_sizes() const {
    std::lock_guard lock(mu_);
    return batches_;
  }
  /// A batch whose first value is kHold waits until release(): its worker takes nothing else
  /// meanwhile (one_slot), so the requests submitted then are all queued when it plans again.
  static constexpr float kHold = 1000.f;
  void release() {
    std::call_once(released_, [this] { hold_.set_value(); });
  }

 private:
  class Instance final : public ModelInstance {
   public:
    explicit Instance(std::shared_ptr<PerRequestModel> m) : m_(std::move(m)) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor y, Tensor::empty(DType::f32, {io->batch_size, 1}));
      io->outputs = {y};
      Kernel k;
      k.name = "per_request";
      k.host_fn = [io, m = m_](std::stop_token) {
        {
          std::lock_guard lock(m->mu_);
          m->batches_.push_back(io->request_rows.size());
        }
        const float* x = io->host_inputs[0].data_as<float>();
        if (x[0] == kHold) m->held_.wait();
        const float* extra =
            io->host_inputs[1].defined() ? io->host_inputs[1].data_as<float>() : nullptr;
        float* out = io->outputs[0].data_as<float>();
        for (std::int64_t i = 0; i < io->batch_size; ++i) out[i] = x[i] + (extra ? extra[i] : 0);
        std::int64_t row = 0;
        for (std::size_t r = 0; r < io->request_rows.size(); ++r) {
          if (x[row] < 0) {
            io->request_errors.resize(io->request_rows.size());
            io->request_errors[r] = invalid_argument_error("negative " + std::to_string(x[row]));
          }
          row += io->request_rows[r];
        }
        return Status();
      };
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<PerRequestModel> m_;
  };

  ModelSignature sig_;
  std::string name_ = "per_request";
  mutable std::mutex mu_;
  std::vector<std::size_t> batches_;
  std::promise<void> hold_;
  std::shared_future<void> held_ = hold_.get_future().share();
  std::once_flag released_;
};

Inputs row(float x, std::optional<float> extra = std::nullopt) {
  Inputs in{*Tensor::from_values<float>({1, 1}, {x}), Tensor()};
  if (extra) in[1] = *Tensor::from_values<float>({1, 1}, {*extra});
  return in;
}

std::unique_ptr<Engine> per_request_engine(const std::shared_ptr<PerRequestModel>& m) {
  EngineOptions o = one_slot(16);
  o.batching.max_queue_delay = 100ms;
  auto e = Engine::create(m, *open_device("cpu"), std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(Batching, AnErrorResponseFailsItsRequestAloneInTheModelsWords) {
  auto m = std::make_shared<PerRequestModel>();
  auto e = per_request_engine(m);
  std::vector<Future<Outputs>> fs;
  for (float x : {1.f, -2.f, 3.f, -4.f}) fs.push_back(e->submit(row(x)));
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto r = get_within(fs[i]);
    if (i % 2 == 0) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(first_value(*r), static_cast<float>(i + 1));
    } else {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
      EXPECT_EQ(r.status().message(), "negative " + std::to_string(-static_cast<float>(i + 1)));
    }
  }
  EXPECT_EQ(m->batch_sizes(), (std::vector<std::size_t>{4}));  // one batch, not run again
  const EngineMetrics metrics = e->metrics();
  EXPECT_EQ(metrics.completed, 2u);
  EXPECT_EQ(metrics.failed, 2u);
}

TEST(Batching, RequestsWithAndWithoutAnOptionalInputBatchApart) {
  auto m = std::make_shared<PerRequestModel>();
  auto e = per_request_engine(m);
  // The worker holds a batch while the six are submitted, so that it plans with all of them
  // queued (a request of the other kind, passed over, sends a forming batch at once).
  auto held = e->submit(row(PerRequestModel::kHold));
  struct Release {  // on every way out, so that the engine's shutdown never waits on the hold
    PerRequestModel& m;
    ~Release() { m.release(); }
  } release{*m};
  ASSERT_TRUE(testing::eventually([&] { return m->batch_sizes().size() == 1; }));
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 6; ++i) {
    fs.push_back(e->submit(i % 2 ? row(1, 10.f) : row(1)));
  }
  m->release();
  ASSERT_TRUE(get_within(held).ok());
  for (int i = 0; i < 6; ++i) {
    auto r = get_within(fs[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(first_value(*r), i % 2 ? 11.f : 1.f);
  }
  EXPECT_EQ(m->batch_sizes(), (std::vector<std::size_t>{1, 3, 3}));
  // A required input left out is still refused, naming it.
  auto refused = e->submit(Inputs{Tensor(), *Tensor::from_values<float>({1, 1}, {1.f})});
  auto r = get_within(refused);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input 'x' is undefined"), std::string::npos) << r.status();
}

TEST(Batching, ARaggedInputIsRefusedForAModelThatJoinsItsRequests) {
  // PerRequestModel reads the batch's joined inputs (BatchIO::host_inputs), so a ragged input,
  // whose requests' dims may differ, could not be joined: Engine::create says so up front.
  auto e = Engine::create(std::make_shared<PerRequestModel>(/*ragged_x=*/true), *open_device("cpu"),
                          one_slot(16));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(e.status().message().find("input 'x' of model 'per_request' is ragged"),
            std::string::npos)
      << e.status();
}

}  // namespace
}  // namespace asyncinfer
