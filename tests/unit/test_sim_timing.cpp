// The simulated accelerator's timing: bounds that check that overlap exists (and that serial work
// does not overlap), not how fast this machine is. All work is enqueued behind a gate first, so
// the simulated timeline (read with timing events) does not depend on how fast the test thread
// enqueues, even under sanitizers; wall-clock bounds are loose.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "asyncinfer/device.hpp"
#include "device/sim/engine_timeline.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;

Kernel busy(std::chrono::nanoseconds d) {
  Kernel k;
  k.name = "busy";
  k.duration = d;
  return k;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// A sim device and a gate: streams made with gated() wait on a point that the test releases.
struct GatedSim {
  explicit GatedSim(const std::string& spec) : device(*open_device(spec)) {
    gate_stream = std::move(*device->create_stream());
    start = timed();
    Kernel hold;
    hold.name = "gate";
    hold.host_fn = [this](std::stop_token stop) {
      std::unique_lock lock(mu);
      cv.wait(lock, stop, [this] { return released; });
      return Status();
    };
    EXPECT_TRUE(gate_stream->enqueue(std::move(hold)).ok());
    EXPECT_TRUE(gate_stream->record(*start).ok());
  }
  std::unique_ptr<Stream> gated() {
    auto s = std::move(*device->create_stream());
    EXPECT_TRUE(s->wait(*start).ok());
    return s;
  }
  std::unique_ptr<Event> timed() { return std::move(*device->create_event(EventOptions{true})); }
  /// Releases the gated streams; returns a time no later than the release (read before it: read
  /// after, a descheduled test thread could see work that had already run, as under TSan in CI).
  Clock::time_point open() {
    const Clock::time_point before = Clock::now();
    {
      std::lock_guard lock(mu);
      released = true;
    }
    cv.notify_all();
    return before;
  }
  double sim_ms_to(Event& end) { return *elapsed_time_us(*start, end) / 1000.0; }

  // Declared first so they outlive the gate stream (destroyed last-declared first).
  std::mutex mu;
  std::condition_variable_any cv;
  bool released = false;
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> gate_stream;
  std::unique_ptr<Event> start;
};

TEST(SimTiming, ThreeItemsOnOneEngineRunBackToBack) {
  GatedSim sim("sim");
  auto s = sim.gated();
  auto end = sim.timed();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->enqueue(busy(2ms)).ok());
  ASSERT_TRUE(s->record(*end).ok());
  const auto t0 = sim.open();
  ASSERT_TRUE(end->synchronize().ok());
  EXPECT_NEAR(sim.sim_ms_to(*end), 6.0, 0.2);
  EXPECT_GE(ms(Clock::now() - t0), 5.9);
  EXPECT_LT(ms(Clock::now() - t0), 1000.0);  // a hang guard; the timeline proves the rest
}

TEST(SimTiming, TwoStreamsOnTwoComputeEnginesOverlap) {
  GatedSim sim("sim:compute_engines=2");
  auto a = sim.gated();
  auto b = sim.gated();
  auto end_a = sim.timed();
  auto end_b = sim.timed();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a->enqueue(busy(2ms)).ok());
    ASSERT_TRUE(b->enqueue(busy(2ms)).ok());
  }
  ASSERT_TRUE(a->record(*end_a).ok());
  ASSERT_TRUE(b->record(*end_b).ok());
  const auto t0 = sim.open();
  ASSERT_TRUE(end_a->synchronize().ok());
  ASSERT_TRUE(end_b->synchronize().ok());
  const double wall = ms(Clock::now() - t0);
  EXPECT_NEAR(sim.sim_ms_to(*end_a), 10.0, 0.3);  // about 10 ms, not 20
  EXPECT_NEAR(sim.sim_ms_to(*end_b), 10.0, 0.3);
  EXPECT_GE(wall, 9.9);
  // The simulated timeline above proves the overlap; the wall clock, which a loaded machine (or a
  // sanitizer) stretches, is only bounded loosely.
  EXPECT_LT(wall, 1000.0);
}

TEST(SimTiming, TwoStreamsOnOneComputeEngineSerialise) {
  GatedSim sim("sim:compute_engines=1");
  auto a = sim.gated();
  auto b = sim.gated();
  auto end_a = sim.timed();
  auto end_b = sim.timed();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a->enqueue(busy(2ms)).ok());
    ASSERT_TRUE(b->enqueue(busy(2ms)).ok());
  }
  ASSERT_TRUE(a->record(*end_a).ok());
  ASSERT_TRUE(b->record(*end_b).ok());
  const auto t0 = sim.open();
  ASSERT_TRUE(end_a->synchronize().ok());
  ASSERT_TRUE(end_b->synchronize().ok());
  EXPECT_NEAR(std::max(sim.sim_ms_to(*end_a), sim.sim_ms_to(*end_b)), 20.0, 0.3);
  EXPECT_GE(ms(Clock::now() - t0), 19.9);  // one engine: 20 ms of work cannot take less
}

TEST(SimTiming, CopyAndComputeOnDifferentEnginesOverlap) {
  // 24,000 bytes at 12 bytes/us = 2 ms of host-to-device copy, next to a 2 ms kernel.
  GatedSim sim("sim:copy_bytes_per_us=12,copy_latency_us=0");
  auto copy_stream = sim.gated();
  auto compute_stream = sim.gated();
  auto host = *Tensor::zeros(DType::u8, {24000});
  auto dev = *sim.device->empty(DType::u8, {24000}, MemoryKind::device);
  auto end_copy = sim.timed();
  auto end_compute = sim.timed();
  ASSERT_TRUE(copy_stream->copy(dev, host).ok());
  ASSERT_TRUE(compute_stream->enqueue(busy(2ms)).ok());
  ASSERT_TRUE(copy_stream->record(*end_copy).ok());
  ASSERT_TRUE(compute_stream->record(*end_compute).ok());
  const auto t0 = sim.open();
  ASSERT_TRUE(end_copy->synchronize().ok());
  ASSERT_TRUE(end_compute->synchronize().ok());
  EXPECT_NEAR(sim.sim_ms_to(*end_copy), 2.0, 0.2);
  EXPECT_NEAR(sim.sim_ms_to(*end_compute), 2.0, 0.2);  // overlapped: both end at ~2 ms, not 4
  EXPECT_LT(ms(Clock::now() - t0), 1000.0);            // a hang guard; the timeline proves the rest
}

TEST(SimTiming, CopiesInOneDirectionShareTheirEngine) {
  GatedSim sim("sim:copy_bytes_per_us=12,copy_latency_us=0");
  auto a = sim.gated();
  auto b = sim.gated();
  auto host_a = *Tensor::zeros(DType::u8, {12000});
  auto host_b = *Tensor::zeros(DType::u8, {12000});
  auto dev_a = *sim.device->empty(DType::u8, {12000}, MemoryKind::device);
  auto dev_b = *sim.device->empty(DType::u8, {12000}, MemoryKind::device);
  auto end_a = sim.timed();
  auto end_b = sim.timed();
  ASSERT_TRUE(a->copy(dev_a, host_a).ok());
  ASSERT_TRUE(b->copy(dev_b, host_b).ok());
  ASSERT_TRUE(a->record(*end_a).ok());
  ASSERT_TRUE(b->record(*end_b).ok());
  sim.open();
  ASSERT_TRUE(end_a->synchronize().ok());
  ASSERT_TRUE(end_b->synchronize().ok());
  EXPECT_NEAR(std::max(sim.sim_ms_to(*end_a), sim.sim_ms_to(*end_b)), 2.0, 0.2);  // 1 + 1 ms
}

// The engine choice, replayed in host orders that a loaded machine produces.
using detail::EngineTimeline;
constexpr Clock::time_point at_ms(int m) {
  return Clock::time_point{} + std::chrono::milliseconds(m);
}

TEST(SimEngineTimeline, AStreamThatRunsAheadKeepsItsEngineAndLeavesTheIdleOneToALateStream) {
  // The order seen in CI: streams A and B both start at t=100 on two engines, but B's thread is
  // late, so A reserves its first two items before B reserves its first.
  EngineTimeline engines(2);
  const auto a1 = engines.reserve(at_ms(100), 2ms);
  const auto a2 = engines.reserve(a1.end, 2ms);
  const auto b1 = engines.reserve(at_ms(100), 2ms);
  EXPECT_EQ(a1.start, at_ms(100));
  EXPECT_EQ(a2.index, a1.index);  // A stays on its engine ...
  EXPECT_EQ(a2.start, at_ms(102));
  EXPECT_NE(b1.index, a1.index);  // ... so B, late on the host, is on time in simulated time.
  EXPECT_EQ(b1.start, at_ms(100));
  EXPECT_EQ(b1.end, at_ms(102));
}

TEST(SimEngineTimeline, TwoStreamsOnTwoEnginesEndTogetherWhateverTheHostOrder) {
  // Every interleaving of A's and B's five reservations (B up to five behind A) ends at 110.
  for (int lag = 0; lag <= 5; ++lag) {
    EngineTimeline engines(2);
    Clock::time_point a = at_ms(100);
    Clock::time_point b = at_ms(100);
    for (int i = 0; i < 5 + lag; ++i) {
      if (i < 5) a = engines.reserve(a, 2ms).end;
      if (i >= lag) b = engines.reserve(b, 2ms).end;
    }
    EXPECT_EQ(a, at_ms(110)) << "lag " << lag;
    EXPECT_EQ(b, at_ms(110)) << "lag " << lag;
  }
}

TEST(SimEngineTimeline, WhenEveryEngineIsBusyTheItemWaitsForTheFirstToFree) {
  EngineTimeline engines(2);
  engines.reserve(at_ms(0), 5ms);
  const auto second = engines.reserve(at_ms(0), 3ms);
  const auto third = engines.reserve(at_ms(1), 4ms);
  EXPECT_EQ(third.index, second.index);
  EXPECT_EQ(third.start, at_ms(3));
  EXPECT_EQ(third.end, at_ms(7));
}

TEST(SimEngineTimeline, AmongFreeEnginesTheMostRecentlyFreedIsTaken) {
  EngineTimeline engines(3);
  const auto x = engines.reserve(at_ms(0), 4ms);   // engine free at 4
  const auto y = engines.reserve(at_ms(0), 6ms);   // engine free at 6
  const auto z = engines.reserve(at_ms(10), 1ms);  // all free by 10: takes the one free at 6
  EXPECT_EQ(z.index, y.index);
  EXPECT_EQ(z.start, at_ms(10));
  const auto w = engines.reserve(at_ms(5), 1ms);  // free by 5: the one free at 4, then the idle one
  EXPECT_EQ(w.index, x.index);
  EXPECT_EQ(w.start, at_ms(5));
}

TEST(SimEngineTimeline, ReleaseEarlyGivesBackTheUnusedEndUnlessReservedAgain) {
  EngineTimeline engines(1);
  const auto a = engines.reserve(at_ms(0), 10ms);
  engines.release_early(a, at_ms(3));
  EXPECT_EQ(engines.free_at(0), at_ms(3));
  const auto b = engines.reserve(at_ms(3), 10ms);
  engines.release_early(a, at_ms(4));  // stale: b was reserved after a, nothing changes
  EXPECT_EQ(engines.free_at(0), b.end);
  engines.release_early(b, at_ms(1));  // cut before it started: free from its start
  EXPECT_EQ(engines.free_at(0), at_ms(3));
}

TEST(SimTiming, CancelledKernelFreesItsEngineEarly) {
  auto device = *open_device("sim");
  auto s = std::move(*device->create_stream());
  std::stop_source cancel;
  Kernel long_kernel = busy(10s);
  long_kernel.stop = cancel.get_token();
  ASSERT_TRUE(s->enqueue(std::move(long_kernel)).ok());
  auto status = std::make_shared<Promise<StatusCode>>();
  auto f = status->get_future();
  ASSERT_TRUE(s->launch_host_func([status](Status st) { status->set_value(st.code()); }).ok());
  std::this_thread::sleep_for(5ms);
  const auto t0 = Clock::now();
  cancel.request_stop();
  auto r = testing::get_within(f);
  EXPECT_EQ(*r, StatusCode::cancelled);
  // The engine is free again: a 1 ms kernel does not wait for the 10 s one.
  ASSERT_TRUE(s->enqueue(busy(1ms)).ok());
  ASSERT_TRUE(s->synchronize().ok());
  EXPECT_LT(ms(Clock::now() - t0), 1000.0);
}

}  // namespace
}  // namespace asyncinfer
