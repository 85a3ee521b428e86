// The engine's latency at one request in flight against the machine's wake-up latency, measured
// in the same run, alternating (issue 14: "report the ratio to a mutex + condition-variable round
// trip"). A wake-up on a loaded VM varies from day to day by a factor of several, so the ratio is
// the figure to compare across days; a ratio well below 1 means the common path parks no thread.
//
//   round trip  thread A notifies thread B through a mutex + condition variable, B answers the
//               same way; A times notify → answer (two wake-ups when both park);
//   engine      builtin:identity on cpu, 1 worker, 1 completion thread, 1 request in flight:
//               each callback records submit → callback and submits the next (as `asyncinfer
//               bench` does at concurrency 1).
//
// Usage: bench_wakeup [rounds=5] [samples per round=2000]. Prints p50/p99 of each and the ratio.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "asyncinfer/asyncinfer.hpp"

namespace {
using Clock = std::chrono::steady_clock;

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

void round_trips(int n, std::vector<double>& out) {
  std::mutex mu;
  std::condition_variable cv;
  int ball = 0;  // 1: B's turn, 2: A's turn, -1: stop
  std::thread b([&] {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return ball == 1 || ball == -1; });
      if (ball == -1) return;
      ball = 2;
      cv.notify_all();
    }
  });
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    {
      std::unique_lock lock(mu);
      ball = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return ball == 2; });
    }
    out.push_back(us(Clock::now() - t0));
  }
  {
    std::lock_guard lock(mu);
    ball = -1;
  }
  cv.notify_all();
  b.join();
}

struct Chain {
  asyncinfer::Engine* engine = nullptr;
  asyncinfer::Inputs inputs;
  int left = 0;
  Clock::time_point sent{};
  std::vector<double>* out = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;

  void next() {
    sent = Clock::now();
    asyncinfer::Inputs in = inputs;
    asyncinfer::Status s =
        engine->submit(std::move(in), [this](const asyncinfer::Result<asyncinfer::Outputs>& r) {
          out->push_back(us(Clock::now() - sent));
          if (!r.ok()) std::fprintf(stderr, "request failed: %s\n", r.status().to_string().c_str());
          if (--left > 0) {
            next();
            return;
          }
          std::lock_guard lock(mu);
          done = true;
          cv.notify_all();
        });
    if (!s.ok()) {
      std::fprintf(stderr, "submit failed: %s\n", s.to_string().c_str());
      std::exit(1);
    }
  }
};

void engine_latencies(asyncinfer::Engine& engine, const asyncinfer::Inputs& inputs, int n,
                      std::vector<double>& out) {
  Chain c;
  c.engine = &engine;
  c.inputs = inputs;
  c.left = n;
  c.out = &out;
  c.next();
  std::unique_lock lock(c.mu);
  c.cv.wait(lock, [&] { return c.done; });
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int samples = argc > 2 ? std::atoi(argv[2]) : 2000;
  auto device = asyncinfer::open_device("cpu");
  auto model = asyncinfer::load_model("builtin:identity");
  if (!device.ok() || !model.ok()) {
    std::fprintf(stderr, "cannot open cpu / builtin:identity\n");
    return 1;
  }
  asyncinfer::EngineOptions o;
  o.workers = 1;
  o.completion_threads = 1;
  auto engine = asyncinfer::Engine::create(*model, *device, o);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  asyncinfer::Inputs inputs{*asyncinfer::Tensor::zeros(asyncinfer::DType::f32, {1, 1})};
  std::vector<double> rt;
  std::vector<double> eng;
  engine_latencies(**engine, inputs, 200, eng);  // warm-up
  eng.clear();
  for (int r = 0; r < rounds; ++r) {
    round_trips(samples, rt);
    engine_latencies(**engine, inputs, samples, eng);
  }
  const double rt50 = pct(rt, 0.5);
  const double e50 = pct(eng, 0.5);
  std::printf("wake round trip (mutex + condition variable, 2 threads): p50 %.1f us  p99 %.1f us\n",
              rt50, pct(rt, 0.99));
  std::printf(
      "engine submit -> callback (builtin:identity, cpu, 1 worker, 1 in flight): "
      "p50 %.1f us  p99 %.1f us\n",
      e50, pct(eng, 0.99));
  std::printf("ratio (engine p50 / round trip p50): %.2f  (%d rounds x %d samples, alternating)\n",
              e50 / rt50, rounds, samples);
  return 0;
}
