// Article §4.1 — pre-processing, inference and post-processing as a three-stage pipeline.
//
// The article records one event object for every item (a race once two items are in flight) and
// its infer_batch runs the items one after another. Here each device stage owns one event per
// in-flight slot, the window bounds the items in flight, and the stages overlap for real.
//
// Workload (per item): pre 2 ms of host CPU work, inference 5 ms on the simulated accelerator,
// post 2 ms of host CPU work. A sync loop needs 9 ms an item; the pipeline is bound by its
// slowest stage: 1 / 5 ms = 200 items/s, 1.8x the sync loop.
#include <cstdio>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

namespace {
void cpu_work(std::chrono::microseconds d) {  // stands in for decode/resize, softmax/top-k
  const auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

Kernel inference() {
  Kernel k;
  k.name = "model";
  k.duration = 5ms;
  return k;
}
}  // namespace

int main(int argc, char** argv) {
  const int items = argc > 1 ? std::atoi(argv[1]) : 200;
  auto device = open_device("sim");
  if (!device.ok()) return std::fprintf(stderr, "%s\n", device.status().to_string().c_str()), 1;

  // The sync loop: each step waits for the one before.
  auto stream = *(*device)->create_stream();
  const auto s0 = Clock::now();
  for (int i = 0; i < items; ++i) {
    cpu_work(2ms);
    (void)stream->enqueue(inference());
    (void)stream->synchronize();
    cpu_work(2ms);
  }
  const double sync_s = std::chrono::duration<double>(Clock::now() - s0).count();

  // The pipeline.
  auto pipeline = Pipeline::create(
      {StageSpec::host("pre", [](PipelineItem&) { return cpu_work(2ms), Status(); }),
       StageSpec::on_device("infer", *device,
                            [](PipelineItem&, Stream& s) { return s.enqueue(inference()); }),
       StageSpec::host("post", [](PipelineItem&) { return cpu_work(2ms), Status(); })},
      PipelineOptions{.window = 8});
  if (!pipeline.ok()) return std::fprintf(stderr, "%s\n", pipeline.status().to_string().c_str()), 1;
  std::vector<PipelineItem> batch(static_cast<std::size_t>(items));
  const auto p0 = Clock::now();
  auto results = (*pipeline)->run(std::move(batch));  // infer_batch
  const double pipe_s = std::chrono::duration<double>(Clock::now() - p0).count();
  int ok = 0;
  for (auto& r : results) ok += r.ok() ? 1 : 0;

  const double bound = 200.0;  // items/s: 1 / 5 ms
  const double sync_rate = items / sync_s;
  const double pipe_rate = items / pipe_s;
  std::printf("sync loop : %7.1f items/s (%.1f ms per item)\n", sync_rate, 1000.0 / sync_rate);
  std::printf(
      "pipeline  : %7.1f items/s = %.1f%% of the bound 1/(5 ms); %.2fx the sync loop "
      "(bound 1.8x)\n",
      pipe_rate, 100.0 * pipe_rate / bound, pipe_rate / sync_rate);
  const auto m = (*pipeline)->metrics();
  for (const auto& s : m.stages) {
    std::printf("  stage %-5s utilisation %5.1f%%, mean queue %.2f ms\n", s.name.c_str(),
                100.0 * s.utilisation, s.queue_us.mean() / 1000.0);
  }
  std::printf("bottleneck: %s; max in flight %lld of window 8\n", m.bottleneck().c_str(),
              static_cast<long long>(m.max_in_flight));
  return ok == items ? 0 : 1;
}
