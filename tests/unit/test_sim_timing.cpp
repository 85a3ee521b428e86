// The simulated accelerator's timing: generous bounds that check that overlap exists (and that
// serial work does not overlap), not how fast this machine is. Simulated times come from timing
// events (the sim's ideal timeline); wall-clock bounds are loose.
#include <gtest/gtest.h>

#include "asyncinfer/device.hpp"
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

struct Sim {
  explicit Sim(const std::string& spec) : device(*open_device(spec)) {}
  std::unique_ptr<Stream> stream() { return std::move(*device->create_stream()); }
  std::unique_ptr<Event> timed() { return std::move(*device->create_event(EventOptions{true})); }
  std::shared_ptr<Device> device;
};

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

TEST(SimTiming, ThreeItemsOnOneEngineRunBackToBack) {
  Sim sim("sim");
  auto s = sim.stream();
  auto start = sim.timed();
  auto end = sim.timed();
  const auto t0 = Clock::now();
  ASSERT_TRUE(s->record(*start).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->enqueue(busy(2ms)).ok());
  ASSERT_TRUE(s->record(*end).ok());
  ASSERT_TRUE(end->synchronize().ok());
  const double wall = ms(Clock::now() - t0);
  const double simulated = *elapsed_time_us(*start, *end) / 1000.0;
  EXPECT_NEAR(simulated, 6.0, 0.3);
  EXPECT_GE(wall, 5.9);
  EXPECT_LT(wall, 60.0);
}

TEST(SimTiming, TwoStreamsOnTwoComputeEnginesOverlap) {
  Sim sim("sim:compute_engines=2");
  auto a = sim.stream();
  auto b = sim.stream();
  auto start = sim.timed();
  auto end_a = sim.timed();
  auto end_b = sim.timed();
  const auto t0 = Clock::now();
  ASSERT_TRUE(a->record(*start).ok());
  ASSERT_TRUE(b->wait(*start).ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a->enqueue(busy(2ms)).ok());
    ASSERT_TRUE(b->enqueue(busy(2ms)).ok());
  }
  ASSERT_TRUE(a->record(*end_a).ok());
  ASSERT_TRUE(b->record(*end_b).ok());
  ASSERT_TRUE(end_a->synchronize().ok());
  ASSERT_TRUE(end_b->synchronize().ok());
  const double wall = ms(Clock::now() - t0);
  const double sim_a = *elapsed_time_us(*start, *end_a) / 1000.0;
  const double sim_b = *elapsed_time_us(*start, *end_b) / 1000.0;
  EXPECT_NEAR(sim_a, 10.0, 0.5);
  EXPECT_NEAR(sim_b, 10.0, 0.5);
  EXPECT_GE(wall, 9.9);
  EXPECT_LT(wall, 19.0);  // about 10 ms, not 20
}

TEST(SimTiming, TwoStreamsOnOneComputeEngineSerialise) {
  Sim sim("sim:compute_engines=1");
  auto a = sim.stream();
  auto b = sim.stream();
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a->enqueue(busy(2ms)).ok());
    ASSERT_TRUE(b->enqueue(busy(2ms)).ok());
  }
  ASSERT_TRUE(a->synchronize().ok());
  ASSERT_TRUE(b->synchronize().ok());
  EXPECT_GE(ms(Clock::now() - t0), 19.9);  // one engine: 20 ms of work cannot take less
}

TEST(SimTiming, CopyAndComputeOnDifferentEnginesOverlap) {
  // 24,000 bytes at 12 bytes/us = 2 ms of host-to-device copy, next to a 2 ms kernel.
  Sim sim("sim:copy_bytes_per_us=12,copy_latency_us=0");
  auto copy_stream = sim.stream();
  auto compute_stream = sim.stream();
  auto host = *Tensor::zeros(DType::u8, {24000});
  auto dev = *sim.device->empty(DType::u8, {24000}, MemoryKind::device);
  auto start = sim.timed();
  auto end_copy = sim.timed();
  auto end_compute = sim.timed();
  const auto t0 = Clock::now();
  ASSERT_TRUE(copy_stream->record(*start).ok());
  ASSERT_TRUE(compute_stream->wait(*start).ok());
  ASSERT_TRUE(copy_stream->copy(dev, host).ok());
  ASSERT_TRUE(compute_stream->enqueue(busy(2ms)).ok());
  ASSERT_TRUE(copy_stream->record(*end_copy).ok());
  ASSERT_TRUE(compute_stream->record(*end_compute).ok());
  ASSERT_TRUE(end_copy->synchronize().ok());
  ASSERT_TRUE(end_compute->synchronize().ok());
  EXPECT_NEAR(*elapsed_time_us(*start, *end_copy) / 1000.0, 2.0, 0.2);
  EXPECT_NEAR(*elapsed_time_us(*start, *end_compute) / 1000.0, 2.0, 0.2);
  EXPECT_LT(ms(Clock::now() - t0), 3.9);  // overlapped: about 2 ms, not 4
}

TEST(SimTiming, CancelledKernelFreesItsEngineEarly) {
  Sim sim("sim");
  auto s = sim.stream();
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
