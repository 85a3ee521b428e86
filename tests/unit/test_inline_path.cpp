// The inline path (issue 14's fast path): the cpu stream with no thread of its own (caller-run
// mode, src/device/host_stream.hpp) and the engine's worker running each cpu batch itself when no
// hang watchdog is set (src/engine/worker.hpp).
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "device/backend.hpp"
#include "device/host_stream.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;

std::string this_thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

std::unique_ptr<detail::HostStream> caller_run_stream(const std::shared_ptr<Device>& cpu) {
  StreamOptions so;
  so.name = "caller-run";
  return detail::create_caller_run_stream(*cpu, so);
}

std::shared_ptr<Device> cpu_device() {
  auto d = open_device("cpu");
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

/// A kernel that appends `n` to `order` and the running thread's id to `threads`.
Kernel recording(int n, std::vector<int>& order, std::vector<std::thread::id>& threads) {
  Kernel k;
  k.name = "k" + std::to_string(n);
  k.host_fn = [n, &order, &threads](std::stop_token) {
    order.push_back(n);
    threads.push_back(std::this_thread::get_id());
    return Status();
  };
  return k;
}

TEST(CallerRunStream, OnlyTheBuiltInCpuDeviceMakesOne) {
  auto cpu = cpu_device();
  ASSERT_TRUE(cpu);
  EXPECT_NE(caller_run_stream(cpu), nullptr);
  auto sim = open_device("sim");
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(caller_run_stream(*sim), nullptr);
}

TEST(CallerRunStream, WorkWaitsForRunPendingThenRunsInOrderOnTheCallingThread) {
  auto cpu = cpu_device();
  ASSERT_TRUE(cpu);
  auto s = caller_run_stream(cpu);
  ASSERT_NE(s, nullptr);
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  Promise<StatusCode> done;
  auto done_f = done.get_future();
  // A kernel that would take a second: enqueueing it must not run it (nor block on it).
  Kernel slow = recording(1, order, threads);
  slow.duration = 1ms;
  const auto before = Clock::now();
  ASSERT_TRUE(s->enqueue(std::move(slow)).ok());
  ASSERT_TRUE(s->enqueue(recording(2, order, threads)).ok());
  ASSERT_TRUE(s->launch_host_func([&done](Status st) { done.set_value(st.code()); }).ok());
  ASSERT_TRUE(s->enqueue(recording(3, order, threads)).ok());
  EXPECT_LT(Clock::now() - before, 1ms);
  EXPECT_FALSE(s->query());
  EXPECT_TRUE(order.empty());
  EXPECT_FALSE(done_f.is_ready());

  s->run_pending();
  EXPECT_TRUE(s->query());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  for (const auto& t : threads) EXPECT_EQ(t, std::this_thread::get_id());
  // The host function went to the device's host-function executor, in stream order.
  auto st = get_within(done_f, 5s);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, StatusCode::ok);
}

TEST(CallerRunStream, SynchronizeRunsTheWorkAndErrorsReachTheNextHostFunction) {
  auto cpu = cpu_device();
  ASSERT_TRUE(cpu);
  InlineExecutor here;
  StreamOptions so;
  so.host_func_executor = &here;
  auto s = detail::create_caller_run_stream(*cpu, so);
  ASSERT_NE(s, nullptr);
  Kernel bad;
  bad.name = "bad";
  bad.host_fn = [](std::stop_token) { return internal_error("broken on purpose"); };
  ASSERT_TRUE(s->enqueue(std::move(bad)).ok());
  Status seen;
  std::thread::id ran_on;
  ASSERT_TRUE(s->launch_host_func([&](Status st) {
                 seen = std::move(st);
                 ran_on = std::this_thread::get_id();
               }).ok());
  // The error went to that host function; the stream's own synchronize then sees none pending.
  EXPECT_TRUE(s->synchronize().ok());
  EXPECT_EQ(seen.code(), StatusCode::internal) << seen;
  EXPECT_NE(seen.message().find("broken on purpose"), std::string::npos) << seen;
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(CallerRunStream, DestroyingItRunsEveryQueuedHostFunctionOnceWithAborted) {
  auto cpu = cpu_device();
  ASSERT_TRUE(cpu);
  InlineExecutor here;
  StreamOptions so;
  so.host_func_executor = &here;
  auto s = detail::create_caller_run_stream(*cpu, so);
  ASSERT_NE(s, nullptr);
  std::atomic<int> kernels{0};
  Kernel k;
  k.host_fn = [&kernels](std::stop_token) {
    ++kernels;
    return Status();
  };
  ASSERT_TRUE(s->enqueue(std::move(k)).ok());
  std::vector<StatusCode> calls;
  ASSERT_TRUE(s->launch_host_func([&calls](Status st) { calls.push_back(st.code()); }).ok());
  s.reset();
  EXPECT_EQ(kernels.load(), 0);  // never run: nobody called run_pending()
  EXPECT_EQ(calls, (std::vector<StatusCode>{StatusCode::aborted}));
}

/// A batched f32 identity whose kernel records the name of the thread it runs on.
class ThreadProbeModel final : public Model, public std::enable_shared_from_this<ThreadProbeModel> {
 public:
  ThreadProbeModel() {
    sig_.batched = true;
    sig_.max_batch_size = 8;
    sig_.inputs.push_back({"x", DType::f32, {-1, 1}});
    sig_.outputs.push_back({"y", DType::f32, {-1, 1}});
  }
  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions&) override {
    return std::unique_ptr<ModelInstance>(std::make_unique<Instance>(shared_from_this()));
  }
  std::vector<std::string> threads() const {
    std::lock_guard lock(mu_);
    return threads_;
  }

 private:
  class Instance final : public ModelInstance {
   public:
    explicit Instance(std::shared_ptr<ThreadProbeModel> m) : model_(std::move(m)) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      auto out = Tensor::empty(DType::f32, io->host_inputs.at(0).shape());
      if (!out.ok()) return out.status();
      io->outputs = {*out};
      Kernel k;
      k.name = "probe";
      k.host_fn = [io, m = model_](std::stop_token) {
        std::memcpy(io->outputs[0].data(), io->inputs[0].data(), io->inputs[0].byte_size());
        std::lock_guard lock(m->mu_);
        m->threads_.push_back(this_thread_name());
        return Status();
      };
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<ThreadProbeModel> model_;
  };

  ModelSignature sig_;
  std::string name_ = "thread_probe";
  mutable std::mutex mu_;
  std::vector<std::string> threads_;
};

/// Runs 20 requests through `spec` with `options` (2 workers) and returns where the kernels ran.
std::vector<std::string> kernel_threads(const std::string& spec, EngineOptions options) {
  auto model = std::make_shared<ThreadProbeModel>();
  auto device = open_device(spec);
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return {};
  options.workers = 2;
  auto engine = Engine::create(model, *device, std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<Future<Outputs>> futures;
  for (int i = 0; i < 20; ++i) {
    auto t = Tensor::empty(DType::f32, {1, 1});
    EXPECT_TRUE(t.ok());
    t->data_as<float>()[0] = static_cast<float>(i);
    futures.push_back((*engine)->submit({*t}));
  }
  for (int i = 0; i < 20; ++i) {
    auto out = get_within(futures[static_cast<std::size_t>(i)], 10s);
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok()) {
      EXPECT_EQ((*out)[0].data_as<float>()[0], static_cast<float>(i));
    }
  }
  (*engine)->shutdown();
  return model->threads();
}

TEST(InlinePath, OnCpuWithoutAWatchdogTheWorkerRunsTheBatch) {
  const auto threads = kernel_threads("cpu", {});
  ASSERT_FALSE(threads.empty());
  for (const auto& t : threads) EXPECT_EQ(t.rfind("ai-worker-", 0), 0u) << t;
}

TEST(InlinePath, AWatchdogOrAnotherDeviceKeepsTheStreamThread) {
  EngineOptions with_watchdog;
  with_watchdog.watchdog = 10s;  // a hung batch must leave its worker free to replace the stream
  for (const auto& [spec, options] : {std::pair{std::string("cpu"), with_watchdog},
                                      std::pair{std::string("sim"), EngineOptions{}}}) {
    const auto threads = kernel_threads(spec, options);
    ASSERT_FALSE(threads.empty()) << spec;
    for (const auto& t : threads) {
      EXPECT_TRUE(t.rfind("ai-w", 0) == 0 && t.find("-stream") != std::string::npos)
          << spec << ": " << t;
    }
  }
}

}  // namespace
}  // namespace asyncinfer
