// Micro benchmarks of the core: futures, the completion executor, the deadline timer.
#include <benchmark/benchmark.h>

#include <atomic>
#include <latch>

#include "asyncinfer/executor.hpp"
#include "asyncinfer/future.hpp"

namespace asyncinfer {
namespace {

// A promise/future pair: create, set, get (one thread).
void BM_FutureCreateSetGet(benchmark::State& state) {
  for (auto _ : state) {
    Promise<int> p;
    Future<int> f = p.get_future();
    p.set_value(1);
    benchmark::DoNotOptimize(f.get());
  }
}
BENCHMARK(BM_FutureCreateSetGet);

// The same with a callback registered before the value is set.
void BM_FutureCallback(benchmark::State& state) {
  int sum = 0;
  for (auto _ : state) {
    Promise<int> p;
    Future<int> f = p.get_future();
    f.on_complete([&sum](const Result<int>& r) { sum += *r; });
    p.set_value(1);
  }
  benchmark::DoNotOptimize(sum);
}
BENCHMARK(BM_FutureCallback);

// Set on one thread, waited on by another: the cross-thread wake-up.
void BM_FutureCrossThreadWake(benchmark::State& state) {
  ThreadPool pool(1, "bench");
  for (auto _ : state) {
    Promise<int> p;
    Future<int> f = p.get_future();
    pool.post([p = std::move(p)]() mutable { p.set_value(1); });
    benchmark::DoNotOptimize(f.get());
  }
}
BENCHMARK(BM_FutureCrossThreadWake)->UseRealTime();

// Callback dispatch through the executor: post a batch of tasks, wait for all.
void BM_ExecutorDispatch(benchmark::State& state) {
  const auto threads = static_cast<std::size_t>(state.range(0));
  ThreadPool pool(threads, "bench");
  constexpr int kBatch = 1024;
  for (auto _ : state) {
    std::latch done(kBatch);
    for (int i = 0; i < kBatch; ++i) pool.post([&done] { done.count_down(); });
    done.wait();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_ExecutorDispatch)->Arg(1)->Arg(2)->UseRealTime();

// Arm and disarm a timer (the common case: a request ends before its deadline).
void BM_TimerAddCancel(benchmark::State& state) {
  DeadlineTimer timer;
  const auto far = Clock::now() + std::chrono::hours(1);
  for (auto _ : state) {
    TimerId id = timer.add(far, [] {});
    benchmark::DoNotOptimize(timer.cancel(id));
  }
}
BENCHMARK(BM_TimerAddCancel);

// Arm with 10,000 other timers pending.
void BM_TimerAddCancelWithBacklog(benchmark::State& state) {
  DeadlineTimer timer;
  const auto far = Clock::now() + std::chrono::hours(1);
  for (int i = 0; i < 10'000; ++i) timer.add(far + std::chrono::microseconds(i), [] {});
  for (auto _ : state) {
    TimerId id = timer.add(far + std::chrono::microseconds(5000), [] {});
    benchmark::DoNotOptimize(timer.cancel(id));
  }
}
BENCHMARK(BM_TimerAddCancelWithBacklog);

}  // namespace
}  // namespace asyncinfer

BENCHMARK_MAIN();
