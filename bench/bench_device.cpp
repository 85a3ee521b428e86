// Micro benchmarks of the device primitives on the cpu and sim backends.
#include <benchmark/benchmark.h>

#include <latch>

#include "asyncinfer/device.hpp"

namespace asyncinfer {
namespace {

const char* const kDevices[] = {"cpu", "sim"};

// Enqueue a kernel and a host function; wait for the host function (the completion round trip).
void BM_EnqueueHostFuncRoundTrip(benchmark::State& state) {
  auto device = *open_device(kDevices[state.range(0)]);
  auto stream = *device->create_stream();
  for (auto _ : state) {
    std::latch done(1);
    Kernel k;
    k.name = "noop";
    (void)stream->enqueue(std::move(k));
    (void)stream->launch_host_func([&done](Status) { done.count_down(); });
    done.wait();
  }
  state.SetLabel(kDevices[state.range(0)]);
}
BENCHMARK(BM_EnqueueHostFuncRoundTrip)->Arg(0)->Arg(1)->UseRealTime();

// Enqueue throughput: 1024 empty kernels and one synchronize.
void BM_EnqueueThroughput(benchmark::State& state) {
  auto device = *open_device(kDevices[state.range(0)]);
  auto stream = *device->create_stream();
  for (auto _ : state) {
    for (int i = 0; i < 1024; ++i) {
      Kernel k;
      k.name = "noop";
      (void)stream->enqueue(std::move(k));
    }
    (void)stream->synchronize();
  }
  state.SetItemsProcessed(state.iterations() * 1024);
  state.SetLabel(kDevices[state.range(0)]);
}
BENCHMARK(BM_EnqueueThroughput)->Arg(0)->Arg(1)->UseRealTime();

// Record an event and query it until complete (the event is reached almost at once).
void BM_EventRecordQuery(benchmark::State& state) {
  auto device = *open_device(kDevices[state.range(0)]);
  auto stream = *device->create_stream();
  auto event = *device->create_event();
  for (auto _ : state) {
    (void)stream->record(*event);
    (void)event->synchronize();
    benchmark::DoNotOptimize(event->query());
  }
  state.SetLabel(kDevices[state.range(0)]);
}
BENCHMARK(BM_EventRecordQuery)->Arg(0)->Arg(1)->UseRealTime();

// Cross-stream wait: stream A records, stream B waits and completes a host function.
void BM_CrossStreamWait(benchmark::State& state) {
  auto device = *open_device(kDevices[state.range(0)]);
  auto a = *device->create_stream();
  auto b = *device->create_stream();
  auto event = *device->create_event();
  for (auto _ : state) {
    std::latch done(1);
    (void)a->record(*event);
    (void)b->wait(*event);
    (void)b->launch_host_func([&done](Status) { done.count_down(); });
    done.wait();
  }
  state.SetLabel(kDevices[state.range(0)]);
}
BENCHMARK(BM_CrossStreamWait)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace asyncinfer

BENCHMARK_MAIN();
