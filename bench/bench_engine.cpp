// The engine's own overhead with a no-op model (builtin:identity on cpu): a closed loop that
// keeps N requests in flight by resubmitting from each completion callback, with nothing else
// recorded (asyncinfer bench adds per-request sample recording on top of this).
#include <benchmark/benchmark.h>

#include <atomic>
#include <functional>
#include <latch>

#include "asyncinfer/asyncinfer.hpp"

namespace asyncinfer {
namespace {

// Args: workers, requests in flight.
void BM_EngineClosedLoop(benchmark::State& state) {
  EngineOptions o;
  o.workers = static_cast<int>(state.range(0));
  o.queue_capacity = 1 << 20;
  auto engine =
      std::move(*Engine::create(*load_model("builtin:identity?shape=4"), *open_device("cpu"), o));
  const int in_flight = static_cast<int>(state.range(1));
  constexpr int kPerIteration = 100'000;
  for (auto _ : state) {
    std::atomic<int> issued{0};
    std::latch done(kPerIteration);
    std::function<void()> fire = [&] {
      if (issued.fetch_add(1) >= kPerIteration) return;
      (void)engine->submit({*Tensor::zeros(DType::f32, {1, 4})}, [&](const Result<Outputs>&) {
        fire();  // resubmit first: the latch may release the benchmark thread
        done.count_down();
      });
    };
    for (int i = 0; i < in_flight; ++i) fire();
    done.wait();
  }
  state.SetItemsProcessed(state.iterations() * kPerIteration);
  const EngineMetrics m = engine->metrics();
  state.counters["batch_mean"] = m.batch_size.mean();
}
BENCHMARK(BM_EngineClosedLoop)
    ->ArgsProduct({{1, 2}, {1, 64, 1024}})
    ->ArgNames({"workers", "in_flight"})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace asyncinfer

BENCHMARK_MAIN();
