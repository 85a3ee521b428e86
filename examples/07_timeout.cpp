// Article §5.1 — timeouts.
//
// The article creates a new thread pool per call and lets the work run on after the timeout.
// Here a deadline covers queue + execution, is fired by the engine's one timer thread whether or
// not the queue moves, frees the request's slot at once, stops cancellable device work, and a
// late result is discarded (counted) without the caller ever seeing it.
#include <cstdio>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

int main() {
  EngineOptions options;
  options.default_timeout = 5s;  // default_timeout=5.0
  options.max_inflight_per_worker = 1;
  options.batching.max_batch_size = 1;
  // Each item's first element is its cost in microseconds.
  auto engine = Engine::create(*load_model("builtin:fixed_cost?cost_from_input=true&shape=4"),
                               *open_device("sim"), options);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  Engine& e = **engine;
  auto input = [](float cost_us) {
    Tensor t = *Tensor::zeros(DType::f32, {1, 4});
    t.data_as<float>()[0] = cost_us;
    return Inputs{t};
  };
  auto long_job = e.submit(input(900'000));  // 900 ms
  const auto t0 = Clock::now();
  auto r = e.infer(input(1'000), RequestOptions{.timeout = 100ms});  // infer_with_timeout(3.0)
  std::printf("queued behind a 900 ms job with a 100 ms timeout, returned after %.0f ms: %s\n",
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
              r.status().to_string().c_str());
  auto lj = long_job.get();
  std::printf("the job ahead still completed: %s\n",
              lj.ok() ? "ok" : lj.status().to_string().c_str());
  const auto m = e.metrics();
  std::printf("timed_out=%llu completed=%llu threads created per call: 0\n",
              static_cast<unsigned long long>(m.timed_out),
              static_cast<unsigned long long>(m.completed));
  return r.status().code() == StatusCode::deadline_exceeded && lj.ok() ? 0 : 1;
}
