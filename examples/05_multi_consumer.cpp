// Article §3.2 — many consumers, each with its own stream.
//
// workers = num_consumers: each worker owns a stream and its own model instance (AscendCL cannot
// run one loaded model on two streams at once). Requests spread over the workers; results are
// fetched by id.
#include <cstdio>
#include <string>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

int main() {
  EngineOptions options;
  options.workers = 4;                  // num_consumers=4
  options.queue_capacity = 1000;        // maxsize=1000
  options.batching.max_batch_size = 1;  // one request per call, as in the article
  auto engine = Engine::create(*load_model("builtin:fixed_cost?base_us=4000&shape=8"),
                               *open_device("sim:compute_engines=4"), options);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  Engine& e = **engine;
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) {
    Status s = e.submit("req_" + std::to_string(i), {*Tensor::zeros(DType::f32, {1, 8})});
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  }
  int completed = 0;
  for (int i = 0; i < 100; ++i) {
    auto r = e.result("req_" + std::to_string(i), 10s);
    completed += r.ok() ? 1 : 0;
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("100 requests of 4 ms on 4 consumers: %.0f ms (one consumer would need 400 ms)\n",
              ms);
  for (const auto& w : e.metrics().workers) {
    std::printf("  consumer %d ran %llu requests\n", w.index,
                static_cast<unsigned long long>(w.batches));
  }
  return completed == 100 ? 0 : 1;
}
