// The inline path (issue 14's fast path): the cpu stream with no thread of its own (caller-run
// mode, src/device/host_stream.hpp) and the engine's worker running each cpu batch itself when no
// hang watchdog is set (src/engine/worker.hpp).
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/log.hpp"
#include "device/backend.hpp"
#include "device/host_stream.hpp"
#include "test_models.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;
using testing::this_thread_name;

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

/// The signature of the test models below: a batched f32 [rows, 1] input, the same output.
ModelSignature column_signature() {
  ModelSignature sig;
  sig.batched = true;
  sig.batch_limit = 8;
  sig.inputs.push_back({"x", DType::f32, {-1, 1}});
  sig.outputs.push_back({"y", DType::f32, {-1, 1}});
  return sig;
}

/// Makes `io`'s output like its input and returns a kernel that copies the input into it, then
/// runs `then` (on the thread that runs the stream's work).
Result<Kernel> copy_kernel(const std::shared_ptr<BatchIO>& io, std::string name,
                           std::function<void()> then = {}) {
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(DType::f32, io->host_inputs.at(0).shape()));
  io->outputs = {out};
  Kernel k;
  k.name = std::move(name);
  k.host_fn = [io, then = std::move(then)](std::stop_token) {
    std::memcpy(io->outputs[0].data(), io->inputs[0].data(), io->inputs[0].byte_size());
    if (then) then();
    return Status();
  };
  return k;
}

/// A batched f32 identity whose kernel records the name of the thread it runs on.
class ThreadProbeModel final : public Model, public std::enable_shared_from_this<ThreadProbeModel> {
 public:
  explicit ThreadProbeModel(bool caller_runs = true)
      : sig_(column_signature()), caller_runs_(caller_runs) {}
  const ModelSignature& signature() const noexcept override { return sig_; }
  bool supports_caller_runs() const noexcept override { return caller_runs_; }
  /// Each kernel from now on sleeps this long first.
  void set_sleep(std::chrono::milliseconds d) { sleep_ms_ = static_cast<int>(d.count()); }
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
      ASYNCINFER_ASSIGN_OR_RETURN(Kernel k, copy_kernel(io, "probe", [m = model_] {
                                    if (const int ms = m->sleep_ms_.load(); ms > 0) {
                                      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
                                    }
                                    std::lock_guard lock(m->mu_);
                                    m->threads_.push_back(this_thread_name());
                                  }));
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<ThreadProbeModel> model_;
  };

  ModelSignature sig_;
  std::string name_ = "thread_probe";
  const bool caller_runs_;
  std::atomic<int> sleep_ms_{0};
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

// ---- RequestOptions::inline_callback -----------------------------------------------------------

/// Where 10 callbacks (and 10 future continuations) of requests to builtin:identity on `spec`
/// ran, with inline_callback `inline_cb`.
std::vector<std::string> callback_threads(const std::string& spec, bool inline_cb,
                                          EngineOptions options = {}) {
  auto model = load_model("builtin:identity");
  auto device = open_device(spec);
  EXPECT_TRUE(model.ok() && device.ok());
  if (!model.ok() || !device.ok()) return {};
  options.workers = 2;
  auto engine = Engine::create(*model, *device, std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::mutex mu;
  std::vector<std::string> threads;
  std::vector<Future<Outputs>> futures;
  std::vector<Future<int>> continuations;
  std::vector<Promise<int>> called(10);
  RequestOptions ro;
  ro.inline_callback = inline_cb;
  for (int i = 0; i < 10; ++i) {
    auto t = Tensor::zeros(DType::f32, {1, 4});
    EXPECT_TRUE(t.ok());
    auto& p = called[static_cast<std::size_t>(i)];
    continuations.push_back(p.get_future());
    EXPECT_TRUE((*engine)
                    ->submit(
                        {*t},
                        [&, i](const Result<Outputs>& r) {
                          EXPECT_TRUE(r.ok()) << r.status();
                          {
                            std::lock_guard lock(mu);
                            threads.push_back(this_thread_name());
                          }
                          called[static_cast<std::size_t>(i)].set_value(i);
                        },
                        ro)
                    .ok());
    futures.push_back((*engine)->submit({*t}, ro));
    futures.back().on_complete([&](const Result<Outputs>&) {
      std::lock_guard lock(mu);
      threads.push_back(this_thread_name());
    });
  }
  for (auto& f : continuations) EXPECT_TRUE(get_within(f, 10s).ok());
  for (auto& f : futures) EXPECT_TRUE(get_within(f, 10s).ok());
  (*engine)->shutdown();  // drains: every continuation has run
  std::lock_guard lock(mu);
  return threads;
}

TEST(InlineCallback, RunsOnTheThreadThatEndsTheRequestNotTheCompletionExecutor) {
  for (const std::string spec : {"cpu", "sim"}) {
    const auto threads = callback_threads(spec, true);
    ASSERT_EQ(threads.size(), 20u) << spec;
    // cpu: the worker runs the batch and its completion point; sim: the stream's thread (or
    // the submitting thread, for a continuation attached after its request ended).
    for (const auto& t : threads) EXPECT_NE(t.rfind("ai-callback", 0), 0u) << spec << ": " << t;
  }
}

TEST(InlineCallback, WithoutItCallbacksRunOnTheCompletionExecutor) {
  const auto threads = callback_threads("cpu", false);
  ASSERT_EQ(threads.size(), 20u);
  std::size_t on_executor = 0;
  for (const auto& t : threads) on_executor += t.rfind("ai-callback", 0) == 0 ? 1 : 0;
  // A continuation attached after its request ended runs on the attaching thread (future.hpp);
  // every callback given to submit runs on the executor.
  EXPECT_GE(on_executor, 10u);
}

TEST(InlineCallback, IsIgnoredWithOrderedDelivery) {
  EngineOptions ordered;
  ordered.ordered_delivery = true;
  const auto threads = callback_threads("cpu", true, ordered);
  ASSERT_EQ(threads.size(), 20u);
  std::size_t on_executor = 0;
  for (const auto& t : threads) on_executor += t.rfind("ai-callback", 0) == 0 ? 1 : 0;
  EXPECT_GE(on_executor, 10u);
}

TEST(InlineCallback, ACancelRunsItOnTheCancellingThreadOnce) {
  // A request that never runs (the only worker is busy with a 10 s kernel): cancelling it ends it
  // on this thread, which runs its inline callback before cancel() returns.
  auto model = load_model("builtin:fixed_cost?base_us=10000000");
  auto device = open_device("cpu");
  ASSERT_TRUE(model.ok() && device.ok());
  EngineOptions eo;
  eo.workers = 1;
  eo.batching.max_batch_size = 1;
  auto engine = Engine::create(*model, *device, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto t = Tensor::zeros(DType::f32, {1, 1});
  ASSERT_TRUE(t.ok());
  Future<Outputs> busy = (*engine)->submit({*t});
  RequestOptions ro;
  ro.inline_callback = true;
  std::atomic<int> calls{0};
  std::string where;
  Future<Outputs> queued = (*engine)->submit({*t}, ro);
  queued.on_complete([&](const Result<Outputs>& r) {
    EXPECT_EQ(r.status().code(), StatusCode::cancelled);
    where = this_thread_name();
    calls.fetch_add(1);
  });
  const std::string me = this_thread_name();
  queued.cancel();
  EXPECT_EQ(calls.load(), 1);  // ran on this thread, before cancel() returned
  EXPECT_EQ(where, me);
  busy.cancel();
  (*engine)->shutdown();
  EXPECT_EQ(calls.load(), 1);
}

// ---- attacks on the inline path (hostile review) -----------------------------------------------

using testing::Decision;
using testing::ScriptedModel;

Tensor one_row(float v, std::int64_t cols = 1) {
  auto t = Tensor::empty(DType::f32, {1, cols});
  EXPECT_TRUE(t.ok());
  for (std::int64_t i = 0; i < cols; ++i) t->data_as<float>()[i] = v;
  return *t;
}

std::unique_ptr<Engine> make_engine(std::shared_ptr<Model> model, EngineOptions o,
                                    const std::string& spec = "cpu") {
  auto device = open_device(spec);
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return nullptr;
  auto e = Engine::create(std::move(model), *device, std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

/// A model that works the way a library with host-side control flow does: enqueue runs a kernel,
/// records an event after it and waits for that event on the host before returning (reading a
/// result to decide what comes next); create_instance does the same with a warm-up kernel.
class EventWaitingModel final : public Model,
                                public std::enable_shared_from_this<EventWaitingModel> {
 public:
  explicit EventWaitingModel(bool wait_in_create)
      : wait_in_create_(wait_in_create), sig_(column_signature()) {}
  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& stream,
                                                         const InstanceOptions&) override {
    ASYNCINFER_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device.create_event());
    if (wait_in_create_) {
      Kernel warm;
      warm.name = "warm-up";
      warm.host_fn = [](std::stop_token) { return Status(); };
      ASYNCINFER_RETURN_IF_ERROR(stream.enqueue(std::move(warm)));
      ASYNCINFER_RETURN_IF_ERROR(stream.record(*event));
      ASYNCINFER_RETURN_IF_ERROR(event->synchronize_for(std::chrono::seconds(2)));
    }
    return std::unique_ptr<ModelInstance>(std::make_unique<Instance>(std::move(event)));
  }

 private:
  class Instance final : public ModelInstance {
   public:
    explicit Instance(std::unique_ptr<Event> e) : event_(std::move(e)) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      ASYNCINFER_ASSIGN_OR_RETURN(Kernel k, copy_kernel(io, "copy"));
      ASYNCINFER_RETURN_IF_ERROR(stream.enqueue(std::move(k)));
      ASYNCINFER_RETURN_IF_ERROR(stream.record(*event_));
      // Host-side control flow: the result is needed before the next step is enqueued.
      ASYNCINFER_RETURN_IF_ERROR(event_->synchronize_for(std::chrono::seconds(2)));
      Kernel twice;
      twice.name = "twice";
      twice.host_fn = [io](std::stop_token) {
        auto* y = io->outputs[0].data_as<float>();
        for (std::int64_t i = 0; i < io->outputs[0].dim(0); ++i) y[i] *= 2;
        return Status();
      };
      return stream.enqueue(std::move(twice));
    }

   private:
    std::unique_ptr<Event> event_;
  };

  bool wait_in_create_;
  ModelSignature sig_;
  std::string name_ = "event_waiting";
};

void expect_event_waits_work(EngineOptions o) {
  for (const bool in_create : {false, true}) {
    SCOPED_TRACE(in_create ? "waits in create_instance" : "waits in enqueue");
    auto e = make_engine(std::make_shared<EventWaitingModel>(in_create), o);
    ASSERT_TRUE(e);
    auto f = e->submit({one_row(21)});
    auto out = get_within(f, 10s);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].data_as<float>()[0], 42.0f);
    e->shutdown();
  }
}

TEST(InlinePathAttack, HostWaitOnAnEventOfTheWorkerStreamWorksWithAStreamThread) {
  EngineOptions o;
  o.workers = 1;
  o.watchdog = 10s;  // the control: the stream has its own thread
  expect_event_waits_work(o);
}

TEST(InlinePathAttack, HostWaitOnAnEventOfTheWorkerStreamDoesNotHangTheInlinePath) {
  EngineOptions o;
  o.workers = 1;
  expect_event_waits_work(o);
}

/// A ScriptedModel whose first call runs until stopped (an hour), the rest at once.
std::shared_ptr<ScriptedModel> first_call_hangs() {
  return std::make_shared<ScriptedModel>([](const testing::Call& c) {
    Decision d;
    if (c.index == 1) d.delay = std::chrono::hours(1);  // ends only when stopped
    return d;
  });
}

TEST(InlinePathAttack, ShutdownCancelEndsAKernelThatRunsUntilStoppedWithRequestsQueued) {
  for (const bool ordered : {false, true}) {
    SCOPED_TRACE(ordered ? "ordered" : "unordered");
    auto model = first_call_hangs();
    EngineOptions o;
    o.workers = 1;
    o.ordered_delivery = ordered;
    o.retry.max_attempts = 3;
    o.breaker.failure_threshold = 1;
    auto e = make_engine(model, o);
    ASSERT_TRUE(e);
    std::vector<Future<Outputs>> fs;
    fs.push_back(e->submit({one_row(0)}));
    ASSERT_TRUE(testing::eventually([&] { return model->calls().size() == 1; }, 10s));
    for (int i = 1; i < 6; ++i) fs.push_back(e->submit({one_row(static_cast<float>(i))}));
    const auto t0 = Clock::now();
    e->shutdown(ShutdownMode::cancel);
    EXPECT_LT(Clock::now() - t0, 5s);
    for (auto& f : fs) {
      auto r = get_within(f, 5s);
      EXPECT_EQ(r.status().code(), StatusCode::aborted) << r.status();
    }
    const EngineMetrics m = e->metrics();
    EXPECT_EQ(m.shut_down, 6u);
    EXPECT_EQ(m.inflight_requests, 0);
    ASSERT_EQ(m.workers.size(), 1u);
    EXPECT_EQ(m.workers[0].stream_batches, 0);
  }
}

TEST(InlinePathAttack, ADrainTimeoutEndsAKernelThatRunsUntilStopped) {
  auto model = first_call_hangs();
  EngineOptions o;
  o.workers = 1;
  auto e = make_engine(model, o);
  ASSERT_TRUE(e);
  auto f = e->submit({one_row(0)});
  ASSERT_TRUE(testing::eventually([&] { return model->calls().size() == 1; }, 10s));
  auto queued = e->submit({one_row(1)});
  const auto t0 = Clock::now();
  e->shutdown(ShutdownMode::drain, 100ms);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(get_within(f, 5s).status().code(), StatusCode::aborted);
  EXPECT_EQ(get_within(queued, 5s).status().code(), StatusCode::aborted);
}

TEST(InlinePathAttack, ADeadlineOrACancelMidKernelFreesTheWorkerForTheNext) {
  for (const bool by_cancel : {false, true}) {
    SCOPED_TRACE(by_cancel ? "Future::cancel" : "deadline");
    auto model = first_call_hangs();
    EngineOptions o;
    o.workers = 1;
    auto e = make_engine(model, o);
    ASSERT_TRUE(e);
    RequestOptions ro;
    if (!by_cancel) ro.timeout = 100ms;
    auto f = e->submit({one_row(0)}, ro);
    ASSERT_TRUE(testing::eventually([&] { return model->calls().size() == 1; }, 10s));
    auto next = e->submit({one_row(7)});
    if (by_cancel) f.cancel();
    auto r = get_within(f, 5s);
    EXPECT_EQ(r.status().code(), by_cancel ? StatusCode::cancelled : StatusCode::deadline_exceeded)
        << r.status();
    auto n = get_within(next, 5s);  // the kernel was stopped: the worker is free again
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ((*n)[0].data_as<float>()[0], 7.0f);
    EXPECT_TRUE(
        testing::eventually([&] { return e->metrics().workers[0].stream_batches == 0; }, 5s));
    e->shutdown();
  }
}

TEST(InlinePathAttack, AFailedBatchIsSplitAndRetriedFromInsideTheCompletionPoint) {
  // A batch of several fails internal (not retryable): re-run one by one; the request whose
  // first value is 3 fails alone; value 5 fails unavailable once and is retried.
  std::atomic<int> fives{0};
  auto model = std::make_shared<ScriptedModel>([&fives](const testing::Call& c) {
    Decision d;
    if (c.firsts.size() > 1) {
      d.status = internal_error("a poisoned batch");
    } else if (c.firsts[0] == 3.0f) {
      d.status = internal_error("poison");
    } else if (c.firsts[0] == 5.0f && fives++ == 0) {
      d.status = unavailable_error("try again");
    }
    return d;
  });
  EngineOptions o;
  o.workers = 1;
  o.batching.max_queue_delay = 50ms;  // the six form one batch
  o.retry.max_attempts = 2;
  o.retry.initial_backoff = 1ms;
  auto e = make_engine(model, o);
  ASSERT_TRUE(e);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 6; ++i) fs.push_back(e->submit({one_row(static_cast<float>(i))}));
  for (int i = 0; i < 6; ++i) {
    auto r = get_within(fs[static_cast<std::size_t>(i)], 10s);
    if (i == 3) {
      EXPECT_EQ(r.status().code(), StatusCode::internal) << r.status();
    } else {
      ASSERT_TRUE(r.ok()) << i << ": " << r.status();
      EXPECT_EQ((*r)[0].data_as<float>()[0], static_cast<float>(i));
    }
  }
  const EngineMetrics m = e->metrics();
  EXPECT_GE(m.split_batches, 1u);
  EXPECT_EQ(m.completed, 5u);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.inflight_requests, 0);
  EXPECT_EQ(m.workers[0].stream_batches, 0);
  e->shutdown();
}

TEST(InlinePathAttack, ManySubmittersEveryRequestEndsOnceAndTheGaugesReturnToZero) {
  struct Shape {
    int workers, inflight, completion_threads;
  };
  for (const Shape sh : {Shape{1, 1, 1}, Shape{2, 4, 2}, Shape{4, 2, 4}}) {
    SCOPED_TRACE(std::to_string(sh.workers) + " workers, " + std::to_string(sh.inflight) +
                 " in flight, " + std::to_string(sh.completion_threads) + " completion threads");
    auto model = std::make_shared<ScriptedModel>([](const testing::Call&) { return Decision{}; });
    EngineOptions o;
    o.workers = sh.workers;
    o.max_inflight_per_worker = sh.inflight;
    o.completion_threads = sh.completion_threads;
    auto e = make_engine(model, o);
    ASSERT_TRUE(e);
    constexpr int kThreads = 8, kEach = 40;
    std::vector<std::atomic<int>> seen(kThreads * kEach);
    std::atomic<int> wrong{0}, ended{0};
    std::vector<std::thread> submitters;
    for (int t = 0; t < kThreads; ++t) {
      submitters.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          const int id = t * kEach + i;
          RequestOptions ro;
          ro.priority = 1 + id % 3;
          Status s = e->submit(
              {one_row(static_cast<float>(id))},
              [&, id](const Result<Outputs>& r) {
                if (!r.ok() || (*r)[0].data_as<float>()[0] != static_cast<float>(id)) ++wrong;
                ++seen[static_cast<std::size_t>(id)];
                ++ended;
              },
              ro);
          if (!s.ok()) ++wrong;
        }
      });
    }
    for (auto& th : submitters) th.join();
    ASSERT_TRUE(testing::eventually([&] { return ended.load() == kThreads * kEach; }, 20s));
    EXPECT_EQ(wrong.load(), 0);
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
    ASSERT_TRUE(testing::eventually([&] { return e->metrics().inflight_requests == 0; }, 5s));
    const EngineMetrics m = e->metrics();
    EXPECT_EQ(m.completed, static_cast<std::uint64_t>(kThreads * kEach));
    EXPECT_EQ(m.queue_depth, 0);
    for (const auto& w : m.workers) EXPECT_EQ(w.stream_batches, 0) << w.index;
    e->shutdown();
  }
}

// ---- RequestOptions::caller_run_max_compute: an idle worker lent to the submitter ---------------

/// Names the calling thread (pthread names are what this_thread_name() reads).
void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

/// Where the kernels of `n` requests ran, each submitted alone after the engine's only worker has
/// had time to fall asleep (no spin), from a thread named "submitter", with `ro`; `returned_first`
/// counts callbacks that ran after their submit returned. The first request runs before the
/// loop, so that the engine has measured a batch.
struct CallerRunTrace {
  std::vector<std::string> kernels;
  std::vector<std::string> callbacks;
  int returned_first = 0;
};
CallerRunTrace caller_run_trace(EngineOptions o, RequestOptions ro, int n,
                                const std::string& spec = "cpu", bool model_supports = true) {
  CallerRunTrace out;
  auto model = std::make_shared<ThreadProbeModel>(model_supports);
  o.workers = 1;
  o.spin_wait = 0us;
  auto e = make_engine(model, o, spec);
  if (!e) return out;
  std::thread submitter([&] {
    name_this_thread("submitter");
    EXPECT_TRUE(get_within(e->submit({one_row(-1)}), 10s).ok());
    std::mutex mu;
    for (int i = 0; i < n; ++i) {
      std::this_thread::sleep_for(20ms);  // the worker waits for work, asleep
      Promise<int> called;
      auto f = called.get_future();
      std::atomic<bool> returned{false};
      Status s = e->submit(
          {one_row(static_cast<float>(i))},
          [&, i](const Result<Outputs>& r) {
            EXPECT_TRUE(r.ok()) << r.status();
            if (r.ok()) {
              EXPECT_EQ((*r)[0].data_as<float>()[0], static_cast<float>(i));
            }
            {
              std::lock_guard lock(mu);
              out.callbacks.push_back(this_thread_name());
              if (returned.load()) ++out.returned_first;
            }
            called.set_value(i);
          },
          ro);
      returned.store(true);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(get_within(f, 10s).ok());
    }
  });
  submitter.join();
  e->shutdown();
  out.kernels = model->threads();
  if (!out.kernels.empty()) out.kernels.erase(out.kernels.begin());  // the warm-up's
  return out;
}

RequestOptions caller_runs(std::chrono::microseconds bound, bool inline_cb = true) {
  RequestOptions ro;
  ro.caller_run_max_compute = bound;
  ro.inline_callback = inline_cb;
  return ro;
}

TEST(CallerRuns, AnIdleWorkerIsLentAndTheSubmitterRunsTheBatchAndTheCallbackBeforeReturning) {
  const CallerRunTrace t = caller_run_trace({}, caller_runs(100ms), 10);
  ASSERT_EQ(t.kernels.size(), 10u);
  ASSERT_EQ(t.callbacks.size(), 10u);
  for (const auto& k : t.kernels) EXPECT_EQ(k, "submitter");
  for (const auto& c : t.callbacks) EXPECT_EQ(c, "submitter");
  EXPECT_EQ(t.returned_first, 0);  // each callback ran inside its submit
}

TEST(CallerRuns, WithoutTheOptionTheWorkerRunsIt) {
  const CallerRunTrace t = caller_run_trace({}, caller_runs(0us), 5);
  ASSERT_EQ(t.kernels.size(), 5u);
  for (const auto& k : t.kernels) EXPECT_EQ(k, "ai-worker-0");
}

TEST(CallerRuns, AModelSlowerThanTheBoundRunsOnTheWorker) {
  // The warm-up's batch takes at least its kernel's time; a bound of 1 us is below it.
  const CallerRunTrace t = caller_run_trace({}, caller_runs(1us), 5);
  ASSERT_EQ(t.kernels.size(), 5u);
  for (const auto& k : t.kernels) EXPECT_EQ(k, "ai-worker-0");
}

TEST(CallerRuns, NotWithAWatchdogABatchingDelayOrOffTheInlinePath) {
  EngineOptions watchdog;
  watchdog.watchdog = 10s;
  EngineOptions delay;
  delay.batching.max_queue_delay = 100us;
  for (const auto& [spec, o] :
       {std::pair{std::string("cpu"), watchdog}, std::pair{std::string("cpu"), delay},
        std::pair{std::string("sim"), EngineOptions{}}}) {
    const CallerRunTrace t = caller_run_trace(o, caller_runs(100ms), 3, spec);
    ASSERT_EQ(t.kernels.size(), 3u) << spec;
    for (const auto& k : t.kernels) EXPECT_NE(k, "submitter") << spec;
  }
}

TEST(CallerRuns, NotForAModelThatDoesNotSupportIt) {
  const CallerRunTrace t = caller_run_trace({}, caller_runs(100ms), 3, "cpu", false);
  ASSERT_EQ(t.kernels.size(), 3u);
  for (const auto& k : t.kernels) EXPECT_EQ(k, "ai-worker-0");
  // The builtin models say no where their cost is read from the input, or a hang is injected.
  for (const char* uri : {"builtin:fixed_cost?cost_from_input=true", "builtin:faulty?mode=hang"}) {
    auto m = load_model(uri);
    ASSERT_TRUE(m.ok()) << uri << ": " << m.status();
    EXPECT_FALSE((*m)->supports_caller_runs()) << uri;
  }
  auto identity = load_model("builtin:identity");
  ASSERT_TRUE(identity.ok());
  EXPECT_TRUE((*identity)->supports_caller_runs());
}

TEST(CallerRuns, ARunFarLongerThanItsBoundTurnsThemOffForTheEngineWithAWarning) {
  std::mutex log_mu;
  std::vector<std::string> warnings;
  set_log_hook([&](LogLevel level, std::string_view m) {
    std::lock_guard lock(log_mu);
    if (level == LogLevel::warning) warnings.emplace_back(m);
  });
  auto model = std::make_shared<ThreadProbeModel>();
  EngineOptions o;
  o.workers = 1;
  o.spin_wait = 0us;
  auto e = make_engine(model, o);
  ASSERT_TRUE(e);
  std::vector<Clock::duration> took;
  std::thread submitter([&] {
    name_this_thread("submitter");
    EXPECT_TRUE(get_within(e->submit({one_row(0)}), 10s).ok());  // measured: well under 1 ms
    // After the slow one, the average needs 13 fast batches to come back under the bound: the
    // last request would run on its caller again but for the trip.
    for (int i = 1; i <= 18; ++i) {
      std::this_thread::sleep_for(20ms);
      model->set_sleep(i == 2 ? 40ms : 0ms);  // the second takes 40 ms: over 16 x 1 ms and 10 ms
      const auto t0 = Clock::now();
      auto f = e->submit({one_row(static_cast<float>(i))}, caller_runs(1ms));
      took.push_back(Clock::now() - t0);
      EXPECT_TRUE(get_within(f, 10s).ok());
    }
  });
  submitter.join();
  e->shutdown();
  set_log_hook(nullptr);
  const auto threads = model->threads();
  ASSERT_EQ(threads.size(), 19u);
  EXPECT_EQ(threads[1], "submitter");
  EXPECT_EQ(threads[2], "submitter");  // the prediction failed here...
  for (std::size_t i = 3; i < threads.size(); ++i) {
    EXPECT_EQ(threads[i], "ai-worker-0") << i;  // ...so every later one woke the worker
  }
  EXPECT_GE(took[1], 40ms);
  std::lock_guard lock(log_mu);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("no longer run requests"), std::string::npos) << warnings[0];
}

TEST(CallerRuns, WithoutAnInlineCallbackTheCallbackStillRunsOnTheCompletionExecutor) {
  const CallerRunTrace t = caller_run_trace({}, caller_runs(100ms, false), 5);
  ASSERT_EQ(t.kernels.size(), 5u);
  for (const auto& k : t.kernels) EXPECT_EQ(k, "submitter");
  for (const auto& c : t.callbacks) EXPECT_EQ(c.rfind("ai-callback", 0), 0u) << c;
}

TEST(CallerRunsAttack, ManySubmittersRacingShutdownEveryRequestEndsOnce) {
  // Lent workers, queued requests and a shutdown(cancel) at once: each accepted request ends
  // exactly once, each refused one never, and shutdown waits for the batches run by callers.
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto model = std::make_shared<ScriptedModel>([](const testing::Call& c) {
      Decision d;
      if (c.index % 7 == 0) d.delay = 200us;
      if (c.index % 11 == 0) d.status = internal_error("scripted failure");
      return d;
    });
    EngineOptions o;
    o.workers = 1 + round % 3;
    o.spin_wait = 0us;
    o.retry.max_attempts = 2;
    auto e = make_engine(model, o);
    ASSERT_TRUE(e);
    ASSERT_TRUE(get_within(e->submit({one_row(0)}), 10s).ok());  // a measured batch
    constexpr int kThreads = 6, kEach = 60;
    std::vector<std::atomic<int>> seen(kThreads * kEach);
    std::atomic<int> wrong{0}, ended{0}, accepted{0};
    std::vector<std::thread> submitters;
    for (int t = 0; t < kThreads; ++t) {
      submitters.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          const int id = t * kEach + i;
          RequestOptions ro = caller_runs(100ms, id % 2 == 0);
          Status s = e->submit(
              {one_row(static_cast<float>(id))},
              [&, id](const Result<Outputs>& r) {
                if (r.ok() && (*r)[0].data_as<float>()[0] != static_cast<float>(id)) ++wrong;
                ++seen[static_cast<std::size_t>(id)];
                ++ended;
              },
              ro);
          if (s.ok()) ++accepted;
          if (i % 10 == 0) std::this_thread::sleep_for(50us);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
    e->shutdown(ShutdownMode::cancel);
    for (auto& th : submitters) th.join();
    ASSERT_TRUE(testing::eventually([&] { return ended.load() == accepted.load(); }, 20s))
        << ended.load() << " of " << accepted.load();
    EXPECT_EQ(wrong.load(), 0);
    for (auto& s : seen) EXPECT_LE(s.load(), 1);
  }
}

TEST(CallerRunsAttack, AWorkerLentToASlowCallerServesTheQueueOnlyAfterItsGivenBack) {
  // The first request after the warm-up runs on its caller for 300 ms (the average allowed it);
  // another thread's request meanwhile waits in the queue, since the only worker is lent, then
  // runs on the worker; a drain waits for both.
  std::atomic<bool> slow{false};
  auto model = std::make_shared<ScriptedModel>([&](const testing::Call&) {
    Decision d;
    if (slow.exchange(false)) d.delay = 300ms;
    return d;
  });
  EngineOptions o;
  o.workers = 1;
  o.spin_wait = 0us;
  auto e = make_engine(model, o);
  ASSERT_TRUE(e);
  ASSERT_TRUE(get_within(e->submit({one_row(0)}), 10s).ok());
  std::this_thread::sleep_for(20ms);
  slow = true;
  Future<Outputs> first;
  Clock::duration submit_took{};
  std::thread caller([&] {
    const auto t0 = Clock::now();
    first = e->submit({one_row(1)}, caller_runs(100ms));
    submit_took = Clock::now() - t0;  // the model ran inside it
  });
  ASSERT_TRUE(testing::eventually([&] { return !slow.load(); }, 5s));  // the slow call began
  const auto before = Clock::now();
  Future<Outputs> second = e->submit({one_row(2)});
  EXPECT_FALSE(second.wait_for(100ms));  // queued behind the lent worker
  auto r2 = get_within(second, 10s);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ((*r2)[0].data_as<float>()[0], 2.0f);
  EXPECT_GE(Clock::now() - before, 200ms);
  caller.join();
  EXPECT_GE(submit_took, 250ms);
  auto r1 = get_within(first, 1s);  // ready once its submit returned
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ((*r1)[0].data_as<float>()[0], 1.0f);
  e->shutdown();
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.inflight_requests, 0);
}

}  // namespace
}  // namespace asyncinfer
