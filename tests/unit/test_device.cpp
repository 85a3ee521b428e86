// Device conformance suite: the same behaviour checked on every built backend (cpu, sim, and cuda
// where a GPU is present; skipped with the CUDA error text where not).
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;

/// A one-shot gate a kernel can block on; opened by the test (or the kernel's stop token).
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  /// Blocks until opened or `stop` fires; true when opened.
  bool pass(std::stop_token stop) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, stop, testing::kWatchdog, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable_any cv_;
  bool open_ = false;
};

Kernel host_kernel(std::function<void()> fn) {
  Kernel k;
  k.name = "test";
  k.host_fn = [fn = std::move(fn)](std::stop_token) {
    fn();
    return Status();
  };
  return k;
}

Kernel gate_kernel(Gate& gate, std::atomic<bool>* stopped = nullptr) {
  Kernel k;
  k.name = "gate";
  k.host_fn = [&gate, stopped](std::stop_token stop) {
    if (!gate.pass(stop)) {
      if (stopped != nullptr) *stopped = true;
      return cancelled_error("gate kernel stopped");
    }
    return Status();
  };
  return k;
}

/// What a host function received.
struct Reported {
  Status status;
  StatusCode code() const { return status.code(); }
  std::string_view message() const { return status.message(); }
  bool ok() const { return status.ok(); }
};
std::ostream& operator<<(std::ostream& os, const Reported& r) { return os << r.status; }

/// Launches a host function and returns a future of the status it receives.
Future<Reported> host_func_status(Stream& s) {
  auto p = std::make_shared<Promise<Reported>>();
  Future<Reported> f = p->get_future();
  Status launched = s.launch_host_func([p](Status st) { p->set_value(Reported{std::move(st)}); });
  EXPECT_TRUE(launched.ok()) << launched;
  return f;
}

class DeviceConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto d = open_device(GetParam());
    if (!d.ok()) {
      ASSERT_EQ(d.status().code(), StatusCode::unavailable) << d.status();
      GTEST_SKIP() << "device " << GetParam() << " not available: " << d.status();
    }
    device_ = *d;
  }
  std::unique_ptr<Stream> stream(int priority = 0) {
    StreamOptions o;
    o.priority = priority;
    auto s = device_->create_stream(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  std::unique_ptr<Event> event(bool timing = false) {
    auto e = device_->create_event(EventOptions{timing});
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  std::shared_ptr<Device> device_;
};

TEST_P(DeviceConformance, InfoIsFilledIn) {
  const DeviceInfo& info = device_->info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_FALSE(info.description.empty());
  EXPECT_GE(info.compute_engines, 1);
  EXPECT_EQ(device_->name(), info.name);
}

TEST_P(DeviceConformance, WorkRunsInStreamOrder) {
  auto s = stream();
  std::vector<int> order;  // written only by the stream, in order
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(s->enqueue(host_kernel([&order, i] { order.push_back(i); })).ok());
  }
  ASSERT_TRUE(s->synchronize().ok());
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
  EXPECT_TRUE(s->query());
}

TEST_P(DeviceConformance, EnqueueNeverBlocksTheCaller) {
  auto s = stream();
  Gate gate;
  ASSERT_TRUE(s->enqueue(gate_kernel(gate)).ok());
  auto e = event();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(s->enqueue(host_kernel([] {})).ok());
  ASSERT_TRUE(s->record(*e).ok());
  EXPECT_FALSE(s->query());  // the stream is held by the gate while we got here
  EXPECT_FALSE(e->query());
  gate.open();
  EXPECT_TRUE(e->synchronize().ok());
  EXPECT_TRUE(e->query());
}

TEST_P(DeviceConformance, CrossStreamWaitBlocksOnlyTheWaitingStream) {
  auto a = stream();
  auto b = stream();
  auto e = event();
  Gate gate;
  std::atomic<int> flag{0};
  ASSERT_TRUE(a->enqueue(gate_kernel(gate)).ok());
  ASSERT_TRUE(a->enqueue(host_kernel([&] { flag = 1; })).ok());
  ASSERT_TRUE(a->record(*e).ok());
  ASSERT_TRUE(b->wait(*e).ok());  // returns at once although `a` is held
  std::atomic<int> seen{-1};
  ASSERT_TRUE(b->enqueue(host_kernel([&] { seen = flag.load(); })).ok());
  // Another stream not depending on `e` still runs.
  auto c = stream();
  ASSERT_TRUE(c->enqueue(host_kernel([] {})).ok());
  EXPECT_TRUE(c->synchronize_for(testing::kWatchdog).ok());
  EXPECT_EQ(seen.load(), -1);
  gate.open();
  ASSERT_TRUE(b->synchronize_for(testing::kWatchdog).ok());
  EXPECT_EQ(seen.load(), 1);
}

TEST_P(DeviceConformance, ReRecordDoesNotMoveAnEarlierWait) {
  auto a = stream();
  auto b = stream();
  auto e = event();
  Gate first, second;
  ASSERT_TRUE(a->enqueue(gate_kernel(first)).ok());
  ASSERT_TRUE(a->record(*e).ok());  // point 1
  ASSERT_TRUE(b->wait(*e).ok());    // b captures point 1
  std::atomic<bool> b_ran{false};
  ASSERT_TRUE(b->enqueue(host_kernel([&] { b_ran = true; })).ok());
  ASSERT_TRUE(a->enqueue(gate_kernel(second)).ok());
  ASSERT_TRUE(a->record(*e).ok());  // point 2: must not hold b
  first.open();
  ASSERT_TRUE(b->synchronize_for(testing::kWatchdog).ok());
  EXPECT_TRUE(b_ran.load());
  EXPECT_FALSE(e->query());  // the event now stands for point 2
  second.open();
  EXPECT_TRUE(e->synchronize_for(testing::kWatchdog).ok());
}

TEST_P(DeviceConformance, UnrecordedEventIsCompleteAndWaitIsANoOp) {
  auto s = stream();
  auto e = event();
  EXPECT_TRUE(e->query());
  EXPECT_TRUE(e->synchronize().ok());
  EXPECT_TRUE(s->wait(*e).ok());
  EXPECT_TRUE(s->synchronize_for(testing::kWatchdog).ok());
}

TEST_P(DeviceConformance, HostFunctionsRunExactlyOnceInStreamOrder) {
  auto s = stream();
  constexpr int kN = 1000;
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::atomic<int>> calls(kN);
  Promise<int> all;
  auto all_f = all.get_future();
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(s->enqueue(host_kernel([] {})).ok());
    ASSERT_TRUE(s->launch_host_func([&, i](Status st) {
                   EXPECT_TRUE(st.ok()) << st;
                   calls[static_cast<std::size_t>(i)]++;
                   bool last = false;
                   {
                     std::lock_guard lock(mu);
                     order.push_back(i);
                     last = order.size() == kN;
                   }
                   // Last, with `mu` released: once the test wakes, its locals are gone. (Set
                   // under the lock, the unlock after it wrote into the test's freed stack: TSan
                   // saw a torn mutex pointer in the teardown, "unlock of an unlocked mutex".)
                   if (last) all.set_value(1);
                 }).ok());
  }
  ASSERT_TRUE(get_within(all_f).ok());
  for (auto& c : calls) EXPECT_EQ(c.load(), 1);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST_P(DeviceConformance, SynchronizeForExpiresOnAStuckStreamWhichStaysUsable) {
  auto s = stream();
  Gate gate;
  ASSERT_TRUE(s->enqueue(gate_kernel(gate)).ok());
  Status st = s->synchronize_for(20ms);
  EXPECT_EQ(st.code(), StatusCode::deadline_exceeded) << st;
  gate.open();
  EXPECT_TRUE(s->synchronize_for(testing::kWatchdog).ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(s->enqueue(host_kernel([&] { ran = true; })).ok());
  EXPECT_TRUE(s->synchronize_for(testing::kWatchdog).ok());
  EXPECT_TRUE(ran.load());
}

TEST_P(DeviceConformance, ErrorsReachTheNextHostFunctionAndFlowThroughEvents) {
  auto a = stream();
  auto b = stream();
  Kernel bad;
  bad.name = "bad";
  bad.host_fn = [](std::stop_token) { return unavailable_error("device busy"); };
  ASSERT_TRUE(a->enqueue(std::move(bad)).ok());
  auto e = event();
  ASSERT_TRUE(a->record(*e).ok());
  auto first = host_func_status(*a);
  auto second = host_func_status(*a);
  auto r1 = get_within(first);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->code(), StatusCode::unavailable) << *r1;
  EXPECT_NE(r1->message().find("bad"), std::string_view::npos) << *r1;  // names the kernel
  EXPECT_TRUE(get_within(second)->ok());  // delivered once, then cleared
  // The event recorded after the failure carries it to a stream that waits on it.
  EXPECT_EQ(e->synchronize().code(), StatusCode::unavailable);
  ASSERT_TRUE(b->wait(*e).ok());
  auto inherited = host_func_status(*b);
  EXPECT_EQ(get_within(inherited)->code(), StatusCode::unavailable);
}

TEST_P(DeviceConformance, ThrowingKernelBecomesAnInternalError) {
  auto s = stream();
  Kernel k;
  k.name = "thrower";
  k.host_fn = [](std::stop_token) -> Status { throw std::runtime_error("model bug"); };
  ASSERT_TRUE(s->enqueue(std::move(k)).ok());
  auto st = host_func_status(*s);
  auto r = get_within(st);
  EXPECT_EQ(r->code(), StatusCode::internal);
  EXPECT_NE(r->message().find("model bug"), std::string_view::npos);
}

TEST_P(DeviceConformance, DestroyingAStreamWithPendingWorkLeavesNothingPending) {
  if (!device_->info().cancellable_work) GTEST_SKIP() << "running work cannot be stopped here";
  auto s = stream();
  auto e = event();
  Gate never;  // stays closed: only the stream's destruction can end this kernel
  std::atomic<bool> stopped{false};
  std::atomic<bool> started{false};
  Kernel blocker;
  blocker.name = "blocker";
  blocker.host_fn = [&](std::stop_token stop) {
    started = true;
    if (!never.pass(stop)) stopped = true;
    return Status();
  };
  ASSERT_TRUE(s->enqueue(std::move(blocker)).ok());
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s->enqueue(host_kernel([&] { ran++; })).ok());
  ASSERT_TRUE(s->record(*e).ok());
  auto hf = host_func_status(*s);
  auto other = stream();
  ASSERT_TRUE(other->wait(*e).ok());
  ASSERT_TRUE(testing::eventually([&] { return started.load(); }));
  s.reset();
  EXPECT_TRUE(stopped.load());
  EXPECT_EQ(ran.load(), 0);  // unstarted kernels are dropped
  auto r = get_within(hf);   // the host function still ran, once, told why
  EXPECT_EQ(r->code(), StatusCode::aborted) << *r;
  EXPECT_TRUE(e->query());
  EXPECT_EQ(e->synchronize().code(), StatusCode::aborted);
  EXPECT_TRUE(other->synchronize_for(testing::kWatchdog).code() == StatusCode::aborted);
}

TEST_P(DeviceConformance, CopiesMoveBytes) {
  auto s = stream();
  std::vector<float> values(1024);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  auto host_in = *Tensor::from_values<float>({1024}, values);
  auto dev = device_->empty(DType::f32, {1024}, MemoryKind::device);
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto pinned = device_->empty(DType::f32, {1024}, MemoryKind::pinned_host);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_TRUE(s->copy(*dev, host_in).ok());
  auto dev2 = *device_->empty(DType::f32, {1024}, MemoryKind::device);
  ASSERT_TRUE(s->copy(dev2, *dev).ok());
  ASSERT_TRUE(s->copy(*pinned, dev2).ok());
  ASSERT_TRUE(s->synchronize().ok());
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(pinned->data_as<float>()[i], values[i]);
  }
  auto wrong = *Tensor::zeros(DType::f32, {3});
  EXPECT_EQ(s->copy(wrong, host_in).code(), StatusCode::invalid_argument);
}

TEST_P(DeviceConformance, TimingEventsMeasureElapsedTime) {
  auto s = stream();
  auto start = event(true);
  auto end = event(true);
  ASSERT_TRUE(s->record(*start).ok());
  Kernel k;
  k.name = "sleep";
  k.duration = 5ms;
  ASSERT_TRUE(s->enqueue(std::move(k)).ok());
  ASSERT_TRUE(s->record(*end).ok());
  ASSERT_TRUE(end->synchronize().ok());
  auto us = elapsed_time_us(*start, *end);
  ASSERT_TRUE(us.ok()) << us.status();
  EXPECT_GE(*us, 4900.0);
  EXPECT_LT(*us, 1'000'000.0);
  auto untimed = event(false);
  ASSERT_TRUE(s->record(*untimed).ok());
  ASSERT_TRUE(untimed->synchronize().ok());
  EXPECT_EQ(elapsed_time_us(*start, *untimed).status().code(), StatusCode::failed_precondition);
}

// The event pool must never hand out an event whose point is pending or that a stream still
// waits on. 10,000 iterations alternate long and short work on two streams; every result is
// compared with the serial reference.
TEST_P(DeviceConformance, EventPoolNeverRecyclesAnEventWithAPendingWait) {
  auto producer = stream();
  auto consumer = stream();
  EventPool pool(device_, EventOptions{}, 8);
  constexpr int kIters = 10'000;
  std::vector<std::int64_t> cells(kIters, -1);
  std::vector<std::int64_t> out(kIters, -1);
  std::atomic<int> unsafe_loans{0};
  const auto watchdog = Clock::now() + 120s;
  for (int i = 0; i < kIters; ++i) {
    ASSERT_LT(Clock::now(), watchdog) << "watchdog: iteration " << i;
    const bool long_on_producer = (i % 2) == 0;
    Kernel produce = host_kernel([&cells, i] { cells[static_cast<std::size_t>(i)] = 3 * i + 1; });
    produce.duration = long_on_producer ? 20us : 0us;
    ASSERT_TRUE(producer->enqueue(std::move(produce)).ok());
    Result<PooledEvent> ev = pool.acquire();
    while (!ev.ok()) {  // all 8 events busy: let the consumer catch up, then try again
      ASSERT_EQ(ev.status().code(), StatusCode::resource_exhausted);
      ASSERT_TRUE(consumer->synchronize_for(testing::kWatchdog).ok());
      ev = pool.acquire();
    }
    if ((*ev)->pending_waits() != 0 || !(*ev)->query()) unsafe_loans++;
    ASSERT_TRUE(producer->record(**ev).ok());
    ASSERT_TRUE(consumer->wait(**ev).ok());
    Kernel consume = host_kernel([&cells, &out, i] {
      out[static_cast<std::size_t>(i)] = cells[static_cast<std::size_t>(i)] * 2;
    });
    consume.duration = long_on_producer ? 0us : 20us;
    ASSERT_TRUE(consumer->enqueue(std::move(consume)).ok());
    // The loan ends here, while the consumer's wait may still be pending.
  }
  ASSERT_TRUE(consumer->synchronize_for(testing::kWatchdog).ok());
  ASSERT_TRUE(producer->synchronize_for(testing::kWatchdog).ok());
  EXPECT_EQ(unsafe_loans.load(), 0);
  EXPECT_LE(pool.created(), 8u);
  for (int i = 0; i < kIters; ++i) {
    ASSERT_EQ(out[static_cast<std::size_t>(i)], 2 * (3 * i + 1)) << "iteration " << i;
  }
}

TEST_P(DeviceConformance, StreamsAndEventsOutliveNothingTheyNeed) {
  // Dropping the last user reference to the device while streams and events exist is safe.
  auto s = stream();
  auto e = event();
  std::weak_ptr<Device> weak = device_;
  device_.reset();
  ASSERT_TRUE(s->record(*e).ok());
  EXPECT_TRUE(e->synchronize_for(testing::kWatchdog).ok());
  s.reset();
  e.reset();
  EXPECT_TRUE(weak.expired());
}

std::vector<std::string> backends_under_test() {
  std::vector<std::string> names = {"cpu", "sim"};
  for (const auto& b : device_backends()) {
    if (b == "cuda") names.push_back("cuda:0");
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllBackends, DeviceConformance, ::testing::ValuesIn(backends_under_test()),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) {
                             if (c == ':') c = '_';
                           }
                           return n;
                         });

// ---- registry -----------------------------------------------------------------------------

TEST(DeviceRegistry, UnknownAndUnbuiltNamesAreClearErrors) {
  auto unknown = open_device("tpu");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(unknown.status().message().find("tpu"), std::string_view::npos);
  EXPECT_NE(unknown.status().message().find("sim"), std::string_view::npos);
  auto npu = open_device("npu:0");
  ASSERT_FALSE(npu.ok());
  EXPECT_EQ(npu.status().code(), StatusCode::unavailable);
  EXPECT_NE(npu.status().message().find("CANN"), std::string_view::npos);
  const auto built = device_backends();
  EXPECT_NE(std::find(built.begin(), built.end(), "cpu"), built.end());
  EXPECT_NE(std::find(built.begin(), built.end(), "sim"), built.end());
  if (std::find(built.begin(), built.end(), "cuda") == built.end()) {
    EXPECT_EQ(open_device("cuda:0").status().code(), StatusCode::unavailable);
  }
}

TEST(DeviceRegistry, SimOptionsAreCheckedByName) {
  EXPECT_TRUE(open_device("sim:compute_engines=2,copy_bytes_per_us=5000").ok());
  auto bad_key = open_device("sim:engines=2");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_EQ(bad_key.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad_key.status().message().find("compute_engines"), std::string_view::npos);
  auto bad_value = open_device("sim:compute_engines=0");
  ASSERT_FALSE(bad_value.ok());
  EXPECT_NE(bad_value.status().message().find("compute_engines=0"), std::string_view::npos);
  EXPECT_FALSE(open_device("cpu:threads=2").ok());
  auto d = open_device("sim:compute_engines=3,copy_engines=1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->info().compute_engines, 3);
  EXPECT_EQ((*d)->info().copy_engines, 1);
  EXPECT_TRUE((*d)->info().simulated);
}

}  // namespace
}  // namespace asyncinfer
