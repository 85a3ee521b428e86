// Article §2.1 — an engine with completion callbacks.
//
// Callbacks run on the engine's bounded completion executor (a fixed number of threads), never a
// thread per request, and never under an engine lock: a callback may submit more work.
#include <atomic>
#include <cstdio>
#include <latch>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;

int main() {
  auto engine = Engine::create(*load_model("builtin:fixed_cost?base_us=2000&shape=8"),
                               *open_device("sim"), EngineOptions{.workers = 2});
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  constexpr int kRequests = 8;
  std::latch done(kRequests);
  std::atomic<int> ok{0};
  for (int i = 0; i < kRequests; ++i) {
    Tensor input = *Tensor::zeros(DType::f32, {1, 8});
    input.data_as<float>()[0] = static_cast<float>(i);
    Status accepted =
        (*engine)->submit({std::move(input)}, [i, &done, &ok](const Result<Outputs>& r) {
          if (r.ok()) {
            ok++;
            std::printf("on_complete(%d): output[0] = %.0f, shape %s\n", i,
                        (*r)[0].data_as<float>()[0], shape_to_string((*r)[0].shape()).c_str());
          } else {
            std::printf("on_complete(%d): %s\n", i, r.status().to_string().c_str());
          }
          done.count_down();
        });
    if (!accepted.ok()) return std::fprintf(stderr, "%s\n", accepted.to_string().c_str()), 1;
  }
  std::printf("%d requests submitted; doing other work...\n", kRequests);
  done.wait();
  std::printf("%d of %d completed\n", ok.load(), kRequests);
  return ok == kRequests ? 0 : 1;
}
