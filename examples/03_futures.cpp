// Article §2.2 — the Future mode, and infer_batch.
//
// The article's thread pool shares one stream among its workers; here each worker owns a stream
// and a model instance. result(timeout) becomes wait_for + get, and infer_batch is when_all.
#include <cstdio>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

int main() {
  auto engine = Engine::create(*load_model("builtin:fixed_cost?base_us=2000&shape=8"),
                               *open_device("sim:compute_engines=2"), EngineOptions{.workers = 2});
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  Engine& e = **engine;
  // Submit three requests; the host is free meanwhile.
  Future<Outputs> f1 = e.submit({*Tensor::zeros(DType::f32, {1, 8})});
  Future<Outputs> f2 = e.submit({*Tensor::zeros(DType::f32, {2, 8})});
  Future<Outputs> f3 = e.submit({*Tensor::zeros(DType::f32, {3, 8})});
  for (Future<Outputs>* f : {&f1, &f2, &f3}) {
    if (!f->wait_for(5s)) return std::fprintf(stderr, "timed out\n"), 1;  // result(timeout=5.0)
    auto r = f->get();
    std::printf("result: %s\n",
                r.ok() ? shape_to_string((*r)[0].shape()).c_str() : r.status().to_string().c_str());
  }
  // infer_batch: many requests, one wait, each result with its own status.
  std::vector<Future<Outputs>> batch;
  for (int i = 0; i < 16; ++i) batch.push_back(e.submit({*Tensor::zeros(DType::f32, {1, 8})}));
  auto all = when_all(std::move(batch)).get();
  int ok = 0;
  for (const auto& r : *all) ok += r.ok() ? 1 : 0;
  std::printf("infer_batch: %d of %zu ok; mean batch size on the device %.1f\n", ok, all->size(),
              e.metrics().batch_size.mean());
  // A continuation instead of a wait.
  auto shape = e.submit({*Tensor::zeros(DType::f32, {4, 8})})
                   .then([](const Outputs& out) { return shape_to_string(out[0].shape()); })
                   .get();
  std::printf("then(): %s\n", shape->c_str());
  return ok == 16 ? 0 : 1;
}
