// Article §2.1 — run a model on a stream, record an event, get a callback on completion.
//
// The article starts a new thread per callback that blocks in event.synchronize(). Here the
// stream itself hands the completion to an executor when it reaches that point: no thread is
// created per request and none blocks waiting.
#include <cstdio>
#include <latch>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

int main() {
  auto device = open_device("sim");  // a simulated accelerator; "cuda:0" on a GPU machine
  if (!device.ok()) return std::fprintf(stderr, "%s\n", device.status().to_string().c_str()), 1;
  auto stream = (*device)->create_stream();
  auto done = (*device)->create_event(EventOptions{.timing = true});
  auto start = (*device)->create_event(EventOptions{.timing = true});
  auto model = load_model("builtin:fixed_cost?base_us=3000&shape=16");
  auto instance = (*model)->create_instance(**device, **stream, {});

  auto io = std::make_shared<BatchIO>();
  io->host_inputs = {*Tensor::zeros(DType::f32, {1, 16})};
  io->inputs = {*(*device)->empty(DType::f32, {1, 16})};
  constexpr int kRequests = 4;
  std::latch all_done(kRequests);
  (void)(*stream)->record(**start);
  for (int i = 0; i < kRequests; ++i) {
    // infer_async: enqueue and return at once.
    (void)(*stream)->copy(io->inputs[0], io->host_inputs[0]);
    (void)(*instance)->enqueue(**stream, io);
    (void)(*stream)->launch_host_func([i, &all_done](Status s) {
      std::printf("request %d complete: %s\n", i, s.to_string().c_str());
      all_done.count_down();
    });
  }
  (void)(*stream)->record(**done);
  std::printf("submitted %d requests; the host is free while the device works\n", kRequests);
  all_done.wait();
  (void)(*done)->synchronize();
  std::printf("device time for %d requests: %.1f ms (3 ms each, in stream order)\n", kRequests,
              *elapsed_time_us(**start, **done) / 1000.0);
  return 0;
}
