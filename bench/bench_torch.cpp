// The bare model through libtorch, no engine: forward passes at batch sizes 1 to 64 on the CPU,
// with one intra-op thread and with every core. Its best throughput is this machine's limit for the
// model; the engine is measured against it (docs/performance.md).
//
//   bench_torch <model.pt> [--benchmark_* flags]
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/script.h>

#include <cstdio>
#include <string>
#include <thread>

namespace {
std::string g_model;

void BM_DigitsForward(benchmark::State& state) {
  static torch::jit::Module module = [] {
    torch::jit::Module m = torch::jit::load(g_model);
    m.eval();
    return m;
  }();
  at::set_num_threads(static_cast<int>(state.range(1)));
  const std::int64_t batch = state.range(0);
  c10::InferenceMode guard;
  const torch::Tensor x = torch::randn({batch, 1, 32, 32});
  for (int i = 0; i < 3; ++i) module.forward({x});  // warm-up
  for (auto _ : state) {
    auto y = module.forward({x}).toTensor();
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
// Args: batch size, intra-op threads (1, and every core).
BENCHMARK(BM_DigitsForward)
    ->ArgsProduct({{1, 2, 4, 8, 16, 32, 64},
                   {1, static_cast<std::int64_t>(std::thread::hardware_concurrency())}})
    ->ArgNames({"batch", "threads"})
    ->UseRealTime();
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: bench_torch <model.pt> [--benchmark_* flags]\n");
    return 2;
  }
  g_model = argv[1];
  argv[1] = argv[0];
  ++argv;
  --argc;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
