// The floor for the engine's open-loop latency: the same Poisson load as `asyncinfer bench --mode
// rate` (exponential gaps from a seeded std::mt19937_64), fed to a bare libtorch loop with no
// engine in between. A generator thread appends each request (a [1,1,H,W] f32 image) to one
// queue at its scheduled time; `workers` threads, each with its own module and one intra-op
// thread (the engine's default), take everything queued (up to `max_batch`), run one forward and
// end those requests. That is the engine's batching rule with queue delay 0, minus the engine:
// one condition-variable wake per batch and nothing else. Latency runs from a request's scheduled
// time to the end of its forward, as the bench measures it (send lag included).
//
//   bench_torch_floor <model.pt> <rate req/s> [duration_s=3] [workers=2] [max_batch=64] [seed=1]
//
// Prints throughput, latency percentiles and the mean batch (docs/performance.md, the digits
// model at half load).
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <sys/prctl.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

struct Pending {
  Clock::time_point queued;  // its scheduled time
  int image = 0;
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: bench_torch_floor <model.pt> <rate req/s> [duration_s=3] [workers=2] "
                 "[max_batch=64] [seed=1]\n");
    return 2;
  }
  const std::string path = argv[1];
  const double rate = std::atof(argv[2]);
  const double duration_s = argc > 3 ? std::atof(argv[3]) : 3.0;
  const int workers = argc > 4 ? std::atoi(argv[4]) : 2;
  const auto max_batch = static_cast<std::size_t>(argc > 5 ? std::atoi(argv[5]) : 64);
  const auto seed = static_cast<std::uint64_t>(argc > 6 ? std::atoll(argv[6]) : 1);
  if (rate <= 0 || duration_s <= 0 || workers < 1 || max_batch < 1) {
    std::fprintf(stderr, "bench_torch_floor: rate, duration, workers and max_batch must be > 0\n");
    return 2;
  }
  at::set_num_threads(1);  // one intra-op thread per worker, as the engine's default
  c10::InferenceMode mode;
  std::vector<torch::jit::Module> modules;
  for (int i = 0; i < workers; ++i) {
    modules.push_back(torch::jit::load(path));
    modules.back().eval();
  }
  const torch::Tensor images = torch::randn({64, 1, 32, 32});
  for (auto& m : modules) {
    for (int i = 0; i < 3; ++i) m.forward({images.slice(0, 0, 1)});  // warm-up
  }

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> queue;
  bool done = false;
  std::vector<double> latencies_us;
  std::size_t batches = 0;
  std::size_t rows = 0;

  auto worker = [&](int index) {
    c10::InferenceMode guard;
    at::set_num_threads(1);
    std::vector<Pending> take;
    std::vector<torch::Tensor> parts;
    std::vector<double> mine;
    for (;;) {
      take.clear();
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return done || !queue.empty(); });
        if (queue.empty()) break;
        while (!queue.empty() && take.size() < max_batch) {
          take.push_back(queue.front());
          queue.pop_front();
        }
      }
      parts.clear();
      for (const Pending& p : take) parts.push_back(images.slice(0, p.image, p.image + 1));
      auto y = modules[static_cast<std::size_t>(index)].forward({torch::cat(parts)}).toTensor();
      (void)y.data_ptr<float>();
      const auto end = Clock::now();
      for (const Pending& p : take) {
        mine.push_back(std::chrono::duration<double, std::micro>(end - p.queued).count());
      }
      std::lock_guard lock(mu);
      ++batches;
      rows += take.size();
    }
    std::lock_guard lock(mu);
    latencies_us.insert(latencies_us.end(), mine.begin(), mine.end());
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i) threads.emplace_back(worker, i);

  // The generator: exponential gaps of mean 1/rate, each request sent at its scheduled time.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(duration_s));
  double t = 0;
  std::size_t sent = 0;
  for (;;) {
    const auto at =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
    if (at >= end) break;
    // Paced as `asyncinfer bench` paces (drivers.cpp): sleep to 20 us before, then yield.
    if (at - Clock::now() > std::chrono::microseconds(40)) {
      std::this_thread::sleep_until(at - std::chrono::microseconds(20));
    }
    while (Clock::now() < at) std::this_thread::yield();
    {
      std::lock_guard lock(mu);
      queue.push_back({at, static_cast<int>(sent % 64)});
    }
    cv.notify_one();
    ++sent;
    t += gap(rng);
  }
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  for (auto& th : threads) th.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("bare libtorch, %d worker(s) of 1 intra-op thread, poisson %.0f req/s for %.1f s\n",
              workers, rate, duration_s);
  std::printf("  requests %zu in %.3f s: %.1f req/s; mean batch %.2f over %zu batches\n", sent,
              wall, static_cast<double>(sent) / wall,
              batches == 0 ? 0.0 : static_cast<double>(rows) / static_cast<double>(batches),
              batches);
  std::printf("  latency  p50 %.1f us | p90 %.1f us | p99 %.1f us\n", percentile(latencies_us, 50),
              percentile(latencies_us, 90), percentile(latencies_us, 99));
  return 0;
}
