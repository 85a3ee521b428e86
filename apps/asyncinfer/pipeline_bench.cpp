#include "pipeline_bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "asyncinfer/pipeline.hpp"

namespace asyncinfer::cli {
namespace {

using std::chrono::duration;
using std::chrono::microseconds;

void spin_for(microseconds d) {
  const auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

Kernel timed_kernel(microseconds d) {
  Kernel k;
  k.name = "stage";
  k.duration = d;
  k.spin = true;  // on the cpu device the stream thread works for the time
  return k;
}

/// Opens each device kind once (sim stages use --device when it is a sim spec).
Result<std::shared_ptr<Device>> device_for(StageKind kind, const BenchOptions& o,
                                           std::map<StageKind, std::shared_ptr<Device>>& open) {
  auto it = open.find(kind);
  if (it != open.end()) return it->second;
  std::string spec = kind == StageKind::cuda ? "cuda:0" : std::string(to_string(kind));
  if (kind == StageKind::sim && o.device.rfind("sim", 0) == 0) spec = o.device;
  if (kind == StageKind::cuda && o.device.rfind("cuda", 0) == 0) spec = o.device;
  ASYNCINFER_ASSIGN_OR_RETURN(auto d, open_device(spec));
  open.emplace(kind, d);
  return d;
}

bool on_device(const StageArg& s) {
  return s.kind == StageKind::sim || s.kind == StageKind::cpu || s.kind == StageKind::cuda;
}

constexpr StageKind kStageKinds[] = {StageKind::host, StageKind::sleep, StageKind::sim,
                                     StageKind::cpu, StageKind::cuda};

}  // namespace

std::string_view to_string(StageKind kind) noexcept {
  switch (kind) {
    case StageKind::host:
      return "host";
    case StageKind::sleep:
      return "sleep";
    case StageKind::sim:
      return "sim";
    case StageKind::cpu:
      return "cpu";
    case StageKind::cuda:
      return "cuda";
  }
  return "unknown";
}

Result<std::vector<StageArg>> parse_stages(const std::string& text) {
  const std::string forms =
      "expected a list such as host:2ms,sim:5ms,host:2ms (kinds host, sleep, sim, cpu, cuda; "
      "times in us, ms or s; host and sleep may end in :<threads>)";
  std::vector<StageArg> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? text.npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    const std::size_t c1 = item.find(':');
    if (c1 == std::string::npos)
      return invalid_argument_error("--stages: '" + item + "': " + forms);
    StageArg s;
    const std::string kind = item.substr(0, c1);
    const auto* known = std::find_if(std::begin(kStageKinds), std::end(kStageKinds),
                                     [&](StageKind k) { return to_string(k) == kind; });
    if (known == std::end(kStageKinds)) {
      return invalid_argument_error("--stages: unknown stage kind '" + kind + "'; " + forms);
    }
    s.kind = *known;
    std::string rest = item.substr(c1 + 1);
    const std::size_t c2 = rest.find(':');
    if (c2 != std::string::npos) {
      if (on_device(s)) {
        return invalid_argument_error("--stages: '" + item +
                                      "': only host and sleep stages take a thread count");
      }
      char* end = nullptr;
      const long t = std::strtol(rest.c_str() + c2 + 1, &end, 10);
      if (*end != '\0' || t < 1 || t > 256) {
        return invalid_argument_error("--stages: '" + item + "': threads must be 1..256");
      }
      s.threads = static_cast<int>(t);
      rest = rest.substr(0, c2);
    }
    char* end = nullptr;
    const double v = std::strtod(rest.c_str(), &end);
    const std::string unit(end);
    double us = 0;
    if (unit == "us") {
      us = v;
    } else if (unit == "ms") {
      us = v * 1e3;
    } else if (unit == "s") {
      us = v * 1e6;
    } else {
      return invalid_argument_error("--stages: '" + item + "': time '" + rest +
                                    "' needs a unit us, ms or s");
    }
    if (!(us > 0) || us > 60e6) {
      return invalid_argument_error("--stages: '" + item + "': time must be > 0 and <= 60 s");
    }
    s.time = microseconds(static_cast<std::int64_t>(us));
    out.push_back(s);
  }
  if (out.empty()) return invalid_argument_error("--stages: empty; " + forms);
  return out;
}

double stage_bound_per_s(const std::vector<StageArg>& stages) {
  double slowest_us = 0;
  for (const StageArg& s : stages) {
    slowest_us = std::max(slowest_us, static_cast<double>(s.time.count()) / s.threads);
  }
  return slowest_us > 0 ? 1e6 / slowest_us : 0;
}

Result<RunResult> run_stages(const BenchOptions& o, const std::vector<StageArg>& stages,
                             const RunPoint& point, bool progress) {
  RunResult res;
  res.mode = point.mode;
  const int window = o.concurrency_given ? point.concurrency : 8;
  res.concurrency = point.mode == Mode::sync ? 1 : window;
  res.label = point.mode == Mode::sync ? "sync loop" : "pipeline w=" + std::to_string(window);
  res.bound_rps = stage_bound_per_s(stages);
  std::map<StageKind, std::shared_ptr<Device>> devices;
  const std::int64_t warmup = std::max<std::int64_t>(o.warmup, 2);
  const std::int64_t target = o.requests > 0 ? o.requests : 0;
  const double seconds = o.requests > 0 ? 0 : (o.duration_s > 0 ? o.duration_s : 5.0);

  std::vector<double> latencies;
  latencies.reserve(target > 0 ? static_cast<std::size_t>(target) : 1 << 16);
  std::atomic<bool> stop{false};
  auto keep_going = [&](std::int64_t measured, Clock::time_point t0) {
    if (target > 0) return measured < target;
    return duration<double>(Clock::now() - t0).count() < seconds;
  };
  auto show = [&](std::int64_t n, Clock::time_point t0) {
    if (!progress) return;
    std::fprintf(stderr, "\r[%s] %lld items, %.1f s", res.label.c_str(), static_cast<long long>(n),
                 duration<double>(Clock::now() - t0).count());
  };

  if (point.mode == Mode::sync) {
    // One item after another: host stages run here, device stages are enqueued and waited for.
    std::vector<std::unique_ptr<Stream>> streams(stages.size());
    for (std::size_t i = 0; i < stages.size(); ++i) {
      if (!on_device(stages[i])) continue;
      ASYNCINFER_ASSIGN_OR_RETURN(auto d, device_for(stages[i].kind, o, devices));
      ASYNCINFER_ASSIGN_OR_RETURN(streams[i], d->create_stream());
    }
    auto one_item = [&]() -> Status {
      for (std::size_t i = 0; i < stages.size(); ++i) {
        const StageArg& s = stages[i];
        if (s.kind == StageKind::host) {
          spin_for(s.time);
        } else if (s.kind == StageKind::sleep) {
          std::this_thread::sleep_for(s.time);
        } else {
          ASYNCINFER_RETURN_IF_ERROR(streams[i]->enqueue(timed_kernel(s.time)));
          ASYNCINFER_RETURN_IF_ERROR(streams[i]->synchronize());
        }
      }
      return Status();
    };
    for (std::int64_t i = 0; i < warmup; ++i) ASYNCINFER_RETURN_IF_ERROR(one_item());
    const double cpu0 = cpu_seconds();
    const Clock::time_point t0 = Clock::now();
    while (keep_going(static_cast<std::int64_t>(latencies.size()), t0)) {
      const Clock::time_point s = Clock::now();
      ASYNCINFER_RETURN_IF_ERROR(one_item());
      latencies.push_back(duration<double, std::micro>(Clock::now() - s).count());
      if (latencies.size() % 64 == 0) show(static_cast<std::int64_t>(latencies.size()), t0);
    }
    res.duration_s = duration<double>(Clock::now() - t0).count();
    res.cpu_user_s = cpu_seconds() - cpu0;
  } else {
    std::vector<StageSpec> specs;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const StageArg s = stages[i];
      const std::string name = std::string(to_string(s.kind)) + std::to_string(i);
      if (s.kind == StageKind::host) {
        specs.push_back(StageSpec::host(
            name, [s](PipelineItem&) { return spin_for(s.time), Status(); }, s.threads));
      } else if (s.kind == StageKind::sleep) {
        specs.push_back(StageSpec::host(
            name, [s](PipelineItem&) { return std::this_thread::sleep_for(s.time), Status(); },
            s.threads));
      } else {
        ASYNCINFER_ASSIGN_OR_RETURN(auto d, device_for(s.kind, o, devices));
        specs.push_back(StageSpec::on_device(
            name, d, [s](PipelineItem&, Stream& st) { return st.enqueue(timed_kernel(s.time)); }));
      }
    }
    ASYNCINFER_ASSIGN_OR_RETURN(
        auto pipeline, Pipeline::create(std::move(specs),
                                        PipelineOptions{.window = static_cast<std::size_t>(window),
                                                        .ordered = false}));
    std::mutex mu;
    std::int64_t measured = 0;
    std::int64_t failed = 0;
    std::map<std::string, std::uint64_t> failures;
    Clock::time_point t0{};
    Clock::time_point last_end{};
    std::atomic<bool> measuring{false};
    std::vector<Future<PipelineItem>> tail;
    double cpu0 = 0;
    for (std::int64_t submitted = 0;; ++submitted) {
      if (submitted == warmup) {
        // Wait for the warm-up items, then start the clock.
        for (auto& f : tail) f.wait();
        tail.clear();
        cpu0 = cpu_seconds();
        t0 = Clock::now();
        measuring = true;
      }
      if (measuring && (!keep_going(submitted - warmup, t0) || stop)) break;
      const Clock::time_point s = Clock::now();
      auto f = pipeline->submit(PipelineItem{});  // blocks while the window is full
      if (measuring) {
        f.on_complete([&, s](const Result<PipelineItem>& r) {
          const Clock::time_point e = Clock::now();
          std::lock_guard lock(mu);
          if (r.ok()) {
            latencies.push_back(duration<double, std::micro>(e - s).count());
            last_end = std::max(last_end, e);
          } else {
            ++failed;
            failures[std::string(to_string(r.status().code()))]++;
          }
          ++measured;
        });
      }
      tail.push_back(std::move(f));
      if (tail.size() > static_cast<std::size_t>(4 * window)) tail.erase(tail.begin());
      if (measuring && (submitted - warmup) % 64 == 0) show(submitted - warmup, t0);
    }
    pipeline->shutdown();  // drains: every measured item has completed
    res.duration_s = duration<double>(last_end - t0).count();
    res.cpu_user_s = cpu_seconds() - cpu0;
    res.failed = static_cast<std::uint64_t>(failed);
    res.failures = failures;
    const PipelineMetrics m = pipeline->metrics();
    std::string util;
    for (const StageMetrics& s : m.stages) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s %.0f%%", util.empty() ? "" : ", ", s.name.c_str(),
                    100.0 * s.utilisation);
      util += buf;
    }
    res.stage_utilisation = util + " (bottleneck " + m.bottleneck() + ")";
  }
  if (progress) std::fputc('\n', stderr);
  res.completed = latencies.size();
  res.requests = res.completed + res.failed;
  res.warmup_requests = static_cast<std::uint64_t>(warmup);
  res.latency_us = std::move(latencies);
  res.latency = summarize(res.latency_us);
  if (res.duration_s > 0) {
    res.throughput_rps = static_cast<double>(res.completed) / res.duration_s;
    res.rows_per_s = res.throughput_rps;
    res.cpu_util = res.cpu_user_s / res.duration_s;
  }
  return res;
}

}  // namespace asyncinfer::cli
