// What the engine tells its operator (issue 13, observability): the result store's size and the
// ordered-delivery backlog per key (EngineMetrics and Prometheus); failures that arrive after
// their request ended, counted by reason and logged once, rate-limited, through the log hook
// (log.hpp), which every message of the library goes through; and what really runs on each
// worker's stream, abandoned work included, apart from the engine's in-flight slots.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/asyncinfer.hpp"
#include "engine_support.hpp"
#include "test_models.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::Call;
using testing::ControlledModel;
using testing::Decision;
using testing::eventually;
using testing::expect_all_ended_once;
using testing::get_within;
using testing::make_engine;
using testing::one;
using testing::ScriptedModel;

/// Captures the library's log while alive.
class CapturedLog {
 public:
  CapturedLog() {
    set_log_hook([this](LogLevel level, std::string_view m) {
      std::lock_guard lock(mu_);
      lines_.push_back(std::string(to_string(level)) + ": " + std::string(m));
    });
  }
  ~CapturedLog() { set_log_hook(nullptr); }
  std::vector<std::string> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  int count(std::string_view needle) const {
    int n = 0;
    for (const std::string& l : lines()) n += l.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

std::unique_ptr<Engine> engine_of(const std::shared_ptr<Model>& model, EngineOptions o,
                                  const std::string& device = "cpu") {
  auto d = open_device(device);
  auto e = Engine::create(model, *d, std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// ---- the log hook -------------------------------------------------------------------------------

TEST(LogHook, LibraryMessagesGoThroughTheHookAndNullRestoresTheDefault) {
  {
    CapturedLog log;
    Promise<int> p;
    Future<int> f = p.get_future();
    f.on_complete([](const Result<int>&) { throw std::runtime_error("boom in a callback"); });
    p.set_value(1);
    EXPECT_EQ(log.count("boom in a callback"), 1) << "a caught callback exception is reported";
  }
  // After the hook is removed the default (stderr) is back; a message must not reach the old one.
  std::atomic<int> old_calls{0};
  set_log_hook([&](LogLevel, std::string_view) { ++old_calls; });
  set_log_hook(nullptr);
  ::testing::internal::CaptureStderr();
  log(LogLevel::warning, "to stderr");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(old_calls.load(), 0);
  EXPECT_NE(err.find("asyncinfer: warning: to stderr"), std::string::npos) << err;
}

TEST(LogHook, ReplacingTheHookWaitsForCallsInProgress) {
  std::atomic<bool> inside{false};
  std::atomic<bool> finished{false};
  set_log_hook([&](LogLevel, std::string_view) {
    inside = true;
    std::this_thread::sleep_for(50ms);
    finished = true;
  });
  std::jthread caller([] { log(LogLevel::info, "slow"); });
  ASSERT_TRUE(eventually([&] { return inside.load(); }));
  set_log_hook(nullptr);
  EXPECT_TRUE(finished.load()) << "set_log_hook returned while the old hook was still running";
}

TEST(LogHook, LimiterLetsABurstThroughAndCountsTheRest) {
  CapturedLog log;
  LogLimiter limiter(3, std::chrono::milliseconds(60'000));
  for (int i = 0; i < 100; ++i) limiter.log(LogLevel::warning, "again");
  EXPECT_EQ(log.count("again"), 3);
  LogLimiter fast(1, std::chrono::milliseconds(5));
  fast.log(LogLevel::info, "first");
  fast.log(LogLevel::info, "dropped");
  fast.log(LogLevel::info, "dropped");
  std::this_thread::sleep_for(20ms);
  fast.log(LogLevel::info, "next");
  EXPECT_EQ(log.count("dropped"), 0);
  EXPECT_EQ(log.count("next (2 similar messages suppressed)"), 1);
}

// ---- late failures ------------------------------------------------------------------------------

// Work that the engine stops (its request timed out, the kernel honours the stop token) ends
// `cancelled`: the engine's own doing, not a failure to count or log.
TEST(LateFailures, TheEnginesOwnStopIsNotALateFailure) {
  CapturedLog log;
  auto model = std::make_shared<ScriptedModel>([](const Call&) {
    // Seconds of work, stopped at the request's deadline: the margin holds on a loaded machine
    // (with 80 ms against 40 ms, a late deadline timer under ASan let the failure win).
    return Decision{internal_error("kernel 'conv1' failed: illegal memory access"), 3s};
  });
  EngineOptions o;
  o.workers = 1;
  o.batching.max_batch_size = 1;
  auto engine = engine_of(model, o);
  RequestOptions ro;
  ro.timeout = 100ms;
  auto r = get_within(engine->submit(one(1), ro));
  EXPECT_EQ(r.status().code(), StatusCode::deadline_exceeded);
  engine->shutdown(ShutdownMode::drain);
  const auto m = engine->metrics();
  // The stopped kernel reports `cancelled` because the engine stopped it: not a failure.
  EXPECT_EQ(m.late_failures, 0u) << "the engine's own stop was counted as a late failure";
  EXPECT_EQ(log.count("failure arrived after"), 0);
}

// A request times out; the failure of work that cannot be stopped arrives afterwards. Before, it
// was counted only in WorkerMetrics::failed_batches and its message was lost.
TEST(LateFailures, CountedByReasonAndTheirMessageLoggedOnceRateLimited) {
  CapturedLog log;
  struct Failing final : Model, std::enable_shared_from_this<Failing> {
    ModelSignature sig;
    std::string name_ = "failing";
    Failing() {
      sig.inputs.push_back({"x", DType::f32, {-1, -1}});
      sig.outputs.push_back({"y", DType::f32, {-1, -1}});
    }
    const ModelSignature& signature() const noexcept override { return sig; }
    const std::string& name() const noexcept override { return name_; }
    std::atomic<int> calls{0};
    Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                           const InstanceOptions&) override {
      struct I final : ModelInstance {
        std::atomic<int>* calls;
        explicit I(std::atomic<int>* c) : calls(c) {}
        Status enqueue(Stream& s, const std::shared_ptr<BatchIO>& io) override {
          ++*calls;
          io->outputs = {*Tensor::empty(DType::f32, io->inputs[0].shape())};
          Kernel k;
          k.name = "failing";
          k.host_fn = [](std::stop_token) {
            std::this_thread::sleep_for(60ms);  // ignores the stop token
            return internal_error("kernel 'conv1' failed: illegal memory access");
          };
          return s.enqueue(std::move(k));
        }
      };
      return std::unique_ptr<ModelInstance>(std::make_unique<I>(&calls));
    }
  };
  auto model = std::make_shared<Failing>();
  EngineOptions o;
  o.workers = 1;
  o.batching.max_batch_size = 1;
  auto engine = engine_of(model, o);
  RequestOptions ro;
  ro.timeout = 10ms;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(get_within(engine->submit(one(1), ro)).status().code(),
              StatusCode::deadline_exceeded);
  }
  engine->shutdown(ShutdownMode::drain);
  const auto m = engine->metrics();
  // Each request that reached the model (some timed out while still queued) failed late.
  const auto ran = static_cast<std::uint64_t>(model->calls.load());
  ASSERT_GE(ran, 1u);
  EXPECT_EQ(m.late_failures, ran);
  EXPECT_EQ(m.late_failures_by_reason.at("internal"), ran);
  EXPECT_NE(m.to_prometheus().find("asyncinfer_inference_late_failures{model=\"failing\","
                                   "reason=\"internal\"} " +
                                   std::to_string(ran)),
            std::string::npos);
  // Logged with its message, at most a burst of them (rate-limited), once per failure.
  const int logged = log.count("illegal memory access");
  EXPECT_GE(logged, 1);
  EXPECT_LE(logged, 5);
  expect_all_ended_once(m, "late failures");
}

// ---- gauges: result store, ordered backlog, the streams -----------------------------------------

TEST(Gauges, ResultStoreSizeAndOrderedBacklogPerKey) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = 1;
  o.ordered_delivery = true;
  auto engine = make_engine("builtin:fixed_cost?base_us=60000", "sim", o);
  ASSERT_TRUE(engine);
  RequestOptions a;
  a.sequence_key = "client \"a\"";  // a key that needs escaping in Prometheus
  RequestOptions b;
  b.sequence_key = "b";
  ASSERT_TRUE(engine->submit("id1", one(1), a).ok());
  ASSERT_TRUE(engine->submit("id2", one(2), a).ok());
  ASSERT_TRUE(engine->submit("id3", one(3), a).ok());
  ASSERT_TRUE(engine->submit("id4", one(4), b).ok());
  auto m = engine->metrics();
  EXPECT_EQ(m.result_store_size, 4);
  EXPECT_EQ(m.ordered_backlog.at("client \"a\""), 3);
  EXPECT_EQ(m.ordered_backlog.at("b"), 1);
  EXPECT_EQ(m.ordered_backlog_total, 4);
  const std::string text = m.to_prometheus();
  EXPECT_NE(text.find("asyncinfer_result_store_size{model=\"builtin:fixed_cost?base_us=60000\"} 4"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("key=\"client \\\"a\\\"\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("asyncinfer_ordered_backlog_total"), std::string::npos);
  for (const char* id : {"id1", "id2", "id3", "id4"}) ASSERT_TRUE(engine->result(id).ok());
  m = engine->metrics();
  EXPECT_EQ(m.ordered_backlog_total, 0);
  EXPECT_TRUE(m.ordered_backlog.empty());
  EXPECT_EQ(m.result_store_size, 4) << "finished entries stay until TTL or release";
  ASSERT_TRUE(engine->release("id1").ok());
  EXPECT_EQ(engine->metrics().result_store_size, 3);
}

TEST(Gauges, StreamBatchesShowAbandonedWorkStillRunning) {
  CapturedLog log;
  auto model =
      std::make_shared<ControlledModel>(1 << 20, [](int call) { return call == 1 ? 300ms : 0ms; });
  EngineOptions o;
  o.workers = 1;
  o.batching.max_batch_size = 1;
  o.watchdog = 30ms;
  auto engine = engine_of(model, o);
  auto hung = engine->submit(one(1));
  EXPECT_EQ(get_within(hung).status().code(), StatusCode::deadline_exceeded);
  // The watchdog freed the slot, but the work still runs on the abandoned stream.
  ASSERT_TRUE(eventually([&] { return engine->metrics().workers.at(0).recycles == 1; }));
  auto w = engine->metrics().workers.at(0);
  EXPECT_EQ(w.inflight_batches, 0);
  EXPECT_EQ(w.stream_batches, 1);
  EXPECT_EQ(w.abandoned_instances, 1);
  EXPECT_EQ(model->running(), 1);
  const std::string text = engine->metrics().to_prometheus();
  EXPECT_NE(text.find("asyncinfer_worker_stream_batches{model=\"controlled\",worker=\"0\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("asyncinfer_worker_abandoned_instances{model=\"controlled\",worker=\"0\"} 1"),
            std::string::npos);
  // New work runs beside it on the new instance.
  EXPECT_TRUE(get_within(engine->submit(one(2))).ok());
  ASSERT_TRUE(eventually([&] {
    const auto x = engine->metrics().workers.at(0);
    return x.stream_batches == 0 && x.abandoned_instances == 0;
  }));
  // Its completion point is aborted by the stream's destruction: the engine's doing, not a
  // failure.
  EXPECT_EQ(engine->metrics().late_failures, 0u);
}

TEST(Gauges, HealthIsInMetricsPrometheusAndHealth) {
  auto engine = make_engine("builtin:identity", "cpu");
  ASSERT_TRUE(engine);
  const EngineHealth h = engine->health();
  EXPECT_TRUE(h.live);
  EXPECT_TRUE(h.ready);
  EXPECT_TRUE(h.reason.empty());
  ASSERT_EQ(h.workers.size(), 1u);
  EXPECT_EQ(h.workers[0].health, WorkerHealth::healthy);
  const auto m = engine->metrics();
  EXPECT_EQ(m.workers.at(0).health, "healthy");
  EXPECT_EQ(m.live_workers, 1);
  const std::string text = m.to_prometheus();
  EXPECT_NE(text.find("asyncinfer_worker_health{model=\"builtin:identity\",worker=\"0\","
                      "state=\"healthy\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("state=\"unhealthy\"} 0"), std::string::npos);
  engine->shutdown();
  EXPECT_FALSE(engine->health().live);
  EXPECT_FALSE(engine->health().ready);
  EXPECT_NE(engine->health().reason.find("shut down"), std::string::npos);
}

// Each metric family is one group in the text format (Prometheus rejects a family split up).
TEST(Gauges, PrometheusFamiliesAreContiguous) {
  EngineOptions o;
  o.workers = 2;
  auto engine = make_engine("builtin:identity", "cpu", o);
  const std::string text = engine->metrics().to_prometheus();
  std::vector<std::string> families;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        name.resize(name.size() - s.size());
      }
    }
    if (families.empty() || families.back() != name) families.push_back(name);
  }
  std::vector<std::string> sorted = families;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end())
      << "a metric family appears in two groups";
}

// ---- Triton's statistics (EngineMetrics::stats, issue 24) --------------------------------------

TEST(Statistics, CountsAndTimesAsTritonDefinesThem) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = 1;
  // 20 ms per batch on the simulated device.
  auto engine = make_engine("builtin:fixed_cost?base_us=20000", "sim", o);
  ASSERT_TRUE(engine);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(get_within(engine->submit(one(1)), 5s).ok());
  RequestOptions quick;
  quick.timeout = 5ms;
  EXPECT_EQ(get_within(engine->submit(one(1), quick), 5s).status().code(),
            StatusCode::deadline_exceeded);
  // Its batch is cut short (the model is cancellable): a failure, and no execution.
  ASSERT_TRUE(eventually([&] {
    const EngineMetrics m = engine->metrics();
    return m.inflight_requests == 0 && m.workers[0].stream_batches == 0;
  }));
  const InferenceStats s = engine->metrics().stats;
  EXPECT_EQ(s.execution_count, 3u);
  EXPECT_EQ(s.inference_count, 3u);
  EXPECT_EQ(s.success.count, 3u);
  EXPECT_EQ(s.fail.count, 1u);
  EXPECT_GE(s.fail.ns, 5'000'000u);
  for (const DurationStat* d : {&s.queue, &s.compute_input, &s.compute_infer, &s.compute_output}) {
    EXPECT_EQ(d->count, 3u) << "the successful requests only";
  }
  EXPECT_GE(s.compute_infer.ns, 3 * 20'000'000u) << "the model's 20 ms each";
  EXPECT_LT(s.compute_input.ns + s.compute_output.ns, 3 * 5'000'000u);
  EXPECT_LE(s.queue.ns + s.compute_input.ns + s.compute_infer.ns + s.compute_output.ns,
            s.success.ns)
      << "the parts of a request fit in its time";
  ASSERT_EQ(s.batch_stats.size(), 1u);
  EXPECT_EQ(s.batch_stats[0].batch_size, 1);
  EXPECT_EQ(s.batch_stats[0].compute_infer.count, 3u);
  EXPECT_GT(s.last_inference_ms, 0);
}

TEST(Statistics, BatchedRequestsAreChargedTheirBatchAndCountTheirRows) {
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 1;
  o.batching.max_batch_size = 8;
  auto engine = make_engine("builtin:fixed_cost?base_us=30000&max_batch=8", "sim", o);
  ASSERT_TRUE(engine);
  // The first runs alone; the next three, queued behind it, run as one batch of 3 rows.
  std::vector<Future<Outputs>> fs;
  fs.push_back(engine->submit(one(1)));
  ASSERT_TRUE(eventually([&] { return engine->metrics().queue_depth == 0; }));
  for (int i = 0; i < 3; ++i) fs.push_back(engine->submit(one(1)));
  for (auto& f : fs) ASSERT_TRUE(get_within(f, 5s).ok());
  const InferenceStats s = engine->metrics().stats;
  EXPECT_EQ(s.inference_count, 4u);
  EXPECT_EQ(s.execution_count, 2u);
  ASSERT_EQ(s.batch_stats.size(), 2u);
  EXPECT_EQ(s.batch_stats[0].batch_size, 1);
  EXPECT_EQ(s.batch_stats[1].batch_size, 3);
  EXPECT_EQ(s.compute_infer.count, 4u);
  // Each of the three is charged the whole batch's time.
  EXPECT_GE(s.compute_infer.ns, 4 * 30'000'000u);
  EXPECT_EQ(s.batch_stats[1].compute_infer.count, 1u);
}

TEST(Statistics, WaitingBehindTheBatchBeforeOnTheStreamIsQueueTime) {
  // Two batches in flight on one worker: the second is launched while the first runs (30 ms)
  // and waits for it on the stream. Its compute_infer is its own 30 ms; the wait is queue time
  // (found by a review: it was counted as compute).
  EngineOptions o;
  o.workers = 1;
  o.max_inflight_per_worker = 2;
  o.batching.max_batch_size = 1;
  auto engine = make_engine("builtin:fixed_cost?base_us=30000", "sim", o);
  ASSERT_TRUE(engine);
  auto a = engine->submit(one(1));
  auto b = engine->submit(one(2));
  ASSERT_TRUE(get_within(a, 5s).ok());
  ASSERT_TRUE(get_within(b, 5s).ok());
  const InferenceStats s = engine->metrics().stats;
  EXPECT_EQ(s.compute_infer.count, 2u);
  EXPECT_GE(s.compute_infer.ns, 2 * 30'000'000u);
  EXPECT_LT(s.compute_infer.ns, 2 * 45'000'000u) << "the wait is not compute";
  EXPECT_GE(s.queue.ns, 25'000'000u) << "the second waited ~30 ms for the first";
  EXPECT_LE(s.queue.ns + s.compute_input.ns + s.compute_infer.ns + s.compute_output.ns,
            s.success.ns);
}

}  // namespace
}  // namespace asyncinfer
