// drivers.cpp — sync, async (closed loop) and rate (open loop) load generators (drivers.hpp).
#include "drivers.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "machine.hpp"

namespace asyncinfer::cli {
namespace {

using std::chrono::duration;
using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

constexpr std::size_t kCodes = static_cast<std::size_t>(StatusCode::internal) + 1;

double us_between(Clock::time_point a, Clock::time_point b) {
  return duration<double, std::micro>(b - a).count();
}

std::int64_t to_ns(Clock::time_point t) {
  return duration_cast<nanoseconds>(t.time_since_epoch()).count();
}

Clock::time_point from_ns(std::int64_t ns) { return Clock::time_point(nanoseconds(ns)); }

/// xorshift64*: a per-thread generator for priority draws (cheap, no shared state).
std::uint64_t next_random(std::uint64_t& s) {
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 0x2545F4914F6CDD1DULL;
}

// ---- per-thread sample storage ----------------------------------------------------------------

/// What one thread recorded. Written only by its owner; read by the main thread after the run
/// (and `progress`, relaxed, during it).
struct alignas(64) Shard {
  std::vector<double> latency_us;                // measured, ok
  std::vector<double> lag_us;                    // rate driver: send lateness of measured requests
  std::array<std::uint64_t, kCodes> failed{};    // measured, ended with an error
  std::array<std::uint64_t, kCodes> rejected{};  // measured, refused at submit
  std::uint64_t warmup_done = 0;
  Clock::time_point last_end{};  // latest end of a measured request
  std::uint64_t rng = 0;
  std::atomic<std::uint64_t> progress{0};  // every request that ended (warm-up included)

  void bump() noexcept {
    progress.store(progress.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  void record(const Result<Outputs>& r, Clock::time_point from, Clock::time_point end,
              bool measured) {
    bump();
    if (!measured) {
      ++warmup_done;
      return;
    }
    if (end > last_end) last_end = end;
    if (r.ok()) {
      latency_us.push_back(us_between(from, end));
    } else {
      ++failed[static_cast<std::size_t>(r.status().code())];
    }
  }
  void refused(StatusCode code, bool measured, Clock::time_point now) {
    bump();
    if (!measured) {
      ++warmup_done;
      return;
    }
    if (now > last_end) last_end = now;
    ++rejected[static_cast<std::size_t>(code)];
  }
};

/// Owns the shards; hands each thread its own (cached in a thread_local).
class Recorder {
 public:
  Recorder(std::size_t reserve, std::uint64_t seed)
      : id_(next_id()), reserve_(reserve), seed_(seed) {}

  Shard& local() {
    thread_local std::uint64_t cached_id = 0;
    thread_local Shard* cached = nullptr;
    if (cached_id == id_) return *cached;
    std::lock_guard lock(mu_);
    auto shard = std::make_unique<Shard>();
    shard->latency_us.reserve(reserve_);
    shard->rng = (seed_ + 0x9E3779B97F4A7C15ULL * (shards_.size() + 1)) | 1U;
    shards_.push_back(std::move(shard));
    cached = shards_.back().get();
    cached_id = id_;
    return *cached;
  }

  std::uint64_t progress() const {
    std::lock_guard lock(mu_);
    std::uint64_t n = 0;
    for (const auto& s : shards_) n += s->progress.load(std::memory_order_relaxed);
    return n;
  }

  /// After the run (every recording thread is done with its shard).
  const std::vector<std::unique_ptr<Shard>>& shards() const { return shards_; }

 private:
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> ids{0};
    return ids.fetch_add(1) + 1;
  }
  const std::uint64_t id_;
  const std::size_t reserve_;
  const std::uint64_t seed_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

// ---- the measured window and the end of the run -----------------------------------------------

/// Decides which requests are warm-up and which are measured, marks the start of the window
/// (taking the "before" snapshots there) and detects the end of the run.
class Measurement {
 public:
  enum class Verdict { warmup, measured, stop };

  Measurement(Engine& engine, const BenchOptions& o, std::size_t reserve)
      : recorder(reserve, o.seed),
        engine_(engine),
        warmup_count_(static_cast<std::uint64_t>(o.warmup)),
        warmup_time_(duration_cast<nanoseconds>(duration<double>(o.warmup_s))),
        by_requests_(o.requests > 0),
        requests_(static_cast<std::uint64_t>(o.requests)),
        duration_(duration_cast<nanoseconds>(duration<double>(o.duration_s))) {}

  void begin(Clock::time_point start) { run_start_ = start; }

  /// Closed loop (sync, async): the verdict for a request about to be sent at `now`; `seq` gets
  /// its sequence number (input selection).
  Verdict classify(Clock::time_point now, std::uint64_t& seq) {
    if (aborted()) return Verdict::stop;
    seq = issued_.fetch_add(1, std::memory_order_relaxed);
    if (warmup_count_ > 0 ? seq < warmup_count_
                          : warmup_time_.count() > 0 && now < run_start_ + warmup_time_) {
      return Verdict::warmup;
    }
    const Clock::time_point t0 = ensure_started(now);
    if (by_requests_) {
      const std::uint64_t m = warmup_count_ > 0 || warmup_time_.count() == 0
                                  ? seq - warmup_count_
                                  : measured_issued_.fetch_add(1, std::memory_order_relaxed);
      return m < requests_ ? Verdict::measured : Verdict::stop;
    }
    return now < t0 + duration_ ? Verdict::measured : Verdict::stop;
  }

  /// Marks the start of the window at `t0` unless already marked; returns the start.
  Clock::time_point ensure_started(Clock::time_point t0) {
    std::int64_t cur = t0_ns_.load(std::memory_order_acquire);
    if (cur != 0) return from_ns(cur);
    const std::int64_t want = to_ns(t0);
    if (t0_ns_.compare_exchange_strong(cur, want, std::memory_order_acq_rel)) {
      snapshot_before();
      return t0;
    }
    return from_ns(cur);
  }

  bool started() const { return t0_ns_.load(std::memory_order_acquire) != 0; }
  /// Stops every driver at its next send (the run stalled and its work was cancelled).
  void abort() { aborted_.store(true, std::memory_order_relaxed); }
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  Clock::time_point t0() const { return from_ns(t0_ns_.load(std::memory_order_acquire)); }

  // End detection: `pending` holds one token per lane (async) or per request in flight (rate),
  // plus one for the driver; the run is over when it reaches zero.
  void add_pending(std::int64_t n = 1) { pending_.fetch_add(n, std::memory_order_relaxed); }
  void done_pending() {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Notify under the lock: the waiter may destroy this object as soon as it can see
      // finished_, which it can only after the unlock.
      std::lock_guard lock(end_mu_);
      finished_ = true;
      end_cv_.notify_all();
    }
  }
  /// Waits at most `d`; true when the run is over.
  bool wait_for(nanoseconds d) {
    std::unique_lock lock(end_mu_);
    return end_cv_.wait_for(lock, d, [this] { return finished_; });
  }

  struct Before {
    bool taken = false;
    EngineMetrics metrics;
    CpuTimes cpu;
    Clock::time_point wall{};
  };
  Before before() const {
    std::lock_guard lock(before_mu_);
    return before_;
  }

  Recorder recorder;

 private:
  void snapshot_before() {
    Before b;
    b.taken = true;
    b.metrics = engine_.metrics();
    b.cpu = process_cpu_times();
    b.wall = Clock::now();
    std::lock_guard lock(before_mu_);
    before_ = std::move(b);
  }

  Engine& engine_;
  const std::uint64_t warmup_count_;
  const nanoseconds warmup_time_;
  const bool by_requests_;
  const std::uint64_t requests_;
  const nanoseconds duration_;
  Clock::time_point run_start_{};
  alignas(64) std::atomic<std::uint64_t> issued_{0};
  alignas(64) std::atomic<std::uint64_t> measured_issued_{0};
  alignas(64) std::atomic<std::int64_t> t0_ns_{0};
  alignas(64) std::atomic<std::int64_t> pending_{0};
  std::atomic<bool> aborted_{false};
  std::mutex end_mu_;
  std::condition_variable end_cv_;
  bool finished_ = false;
  mutable std::mutex before_mu_;
  Before before_;
};

/// Request options per priority draw: index 0 = the fixed priority (or the engine default);
/// with "mixed", one entry per level.
class Priorities {
 public:
  explicit Priorities(const BenchOptions& o) {
    std::optional<microseconds> timeout;
    if (o.timeout_ms > 0) {
      // Saturating: --timeout-ms 1e300 means no limit, not an overflow.
      timeout = detail::saturating_cast<microseconds>(
          std::chrono::duration<double, std::milli>(o.timeout_ms));
    }
    if (o.priority.mixed) {
      for (int level = 1; level <= o.priority_levels; ++level) {
        RequestOptions r;
        r.priority = level;
        r.timeout = timeout;
        options_.push_back(std::move(r));
      }
    } else {
      RequestOptions r;
      r.priority = o.priority.level;  // 0: the engine's default level
      r.timeout = timeout;
      options_.push_back(std::move(r));
    }
  }
  const RequestOptions& first() const { return options_[0]; }
  const RequestOptions& pick(Shard& shard) const {
    if (options_.size() == 1) return options_[0];
    return options_[static_cast<std::size_t>(next_random(shard.rng) % options_.size())];
  }

 private:
  std::vector<RequestOptions> options_;
};

// ---- drivers ------------------------------------------------------------------------------------

/// sync: one caller, Engine::infer. Runs on its own thread.
void drive_sync(Engine& engine, Measurement& m, const InputPool& pool, const Priorities& prio) {
  Shard& shard = m.recorder.local();
  while (true) {
    const Clock::time_point now = Clock::now();
    std::uint64_t seq = 0;
    const Measurement::Verdict v = m.classify(now, seq);
    if (v == Measurement::Verdict::stop) break;
    Result<Inputs> in = pool.next(seq);
    if (!in.ok()) {
      shard.refused(in.status().code(), v == Measurement::Verdict::measured, Clock::now());
      break;
    }
    Result<Outputs> r = engine.infer(std::move(*in), prio.pick(shard));
    shard.record(r, now, Clock::now(), v == Measurement::Verdict::measured);
  }
  m.done_pending();
}

/// async: closed loop. Each lane has one request in flight; its completion callback records the
/// sample in the completion thread's shard and submits the lane's next request.
class AsyncDriver {
 public:
  AsyncDriver(Engine& engine, Measurement& m, const InputPool& pool, const Priorities& prio)
      : engine_(engine), m_(m), pool_(pool), prio_(prio) {}

  void start(int lanes) {
    m_.add_pending(lanes + 1);  // a token per lane, one for this driver
    for (int i = 0; i < lanes; ++i) issue(m_.recorder.local());
    m_.done_pending();
  }

 private:
  /// Sends the lane's next request, or ends the lane (returns its token).
  void issue(Shard& shard) {
    const Clock::time_point now = Clock::now();
    std::uint64_t seq = 0;
    const Measurement::Verdict v = m_.classify(now, seq);
    if (v == Measurement::Verdict::stop) {
      m_.done_pending();
      return;
    }
    const bool measured = v == Measurement::Verdict::measured;
    Result<Inputs> in = pool_.next(seq);
    if (!in.ok()) {
      shard.refused(in.status().code(), measured, Clock::now());
      m_.done_pending();
      return;
    }
    Status s = engine_.submit(
        std::move(*in),
        [this, now, measured](const Result<Outputs>& r) { on_done(r, now, measured); },
        prio_.pick(shard));
    if (!s.ok()) {
      // Refused (the callback will not run): the lane ends rather than spin on refusals.
      shard.refused(s.code(), measured, Clock::now());
      m_.done_pending();
    }
  }

  void on_done(const Result<Outputs>& r, Clock::time_point sent, bool measured) {
    const Clock::time_point end = Clock::now();
    Shard& shard = m_.recorder.local();
    shard.record(r, sent, end, measured);
    issue(shard);
  }

  Engine& engine_;
  Measurement& m_;
  const InputPool& pool_;
  const Priorities& prio_;
};

/// rate: the schedule of intended send offsets (ns from the run start), computed ahead, and the
/// index of the first measured request.
struct Schedule {
  std::vector<std::int64_t> offsets;
  std::size_t first_measured = 0;
  std::int64_t t0_offset = 0;
};

Result<Schedule> make_schedule(const BenchOptions& o, double rate) {
  Schedule s;
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(rate);  // seconds, mean 1/rate
  const double step_ns = 1e9 / rate;
  const auto warm_ns = static_cast<std::int64_t>(std::llround(o.warmup_s * 1e9));
  const auto dur_ns = static_cast<std::int64_t>(std::llround(o.duration_s * 1e9));
  const bool constant = o.arrivals == Arrivals::constant;
  constexpr std::size_t kMax = 100'000'000;
  double t = 0;  // ns; the first request goes at the start
  bool measuring = false;
  std::uint64_t measured = 0;
  for (std::size_t k = 0;; ++k) {
    if (constant) t = static_cast<double>(k) * step_ns;
    const auto off = static_cast<std::int64_t>(t);
    if (!measuring) {
      const bool warm = o.warmup > 0 ? k < static_cast<std::size_t>(o.warmup) : off < warm_ns;
      if (!warm) {
        measuring = true;
        s.first_measured = k;
        s.t0_offset = o.warmup > 0 ? off : warm_ns;  // the window starts at the warm-up's end
      }
    }
    if (measuring) {
      if (o.requests > 0 ? measured >= static_cast<std::uint64_t>(o.requests)
                         : off >= s.t0_offset + dur_ns) {
        break;
      }
      ++measured;
    }
    if (s.offsets.size() >= kMax) {
      return invalid_argument_error(
          "--request-rate: the schedule would hold more than 100 million requests; lower "
          "--request-rate, --duration-s or --requests");
    }
    s.offsets.push_back(off);
    if (!constant) t += gap(rng) * 1e9;
  }
  return s;
}

/// Waits until `t`: sleep_until (the thread's timer slack is 1 µs) to just before it, then
/// yields the last few microseconds away so the send is on time without burning a core.
void pace_until(Clock::time_point t) {
  constexpr auto kSpin = microseconds(20);
  Clock::time_point now = Clock::now();
  if (t - now > 2 * kSpin) std::this_thread::sleep_until(t - kSpin);
  while (Clock::now() < t) std::this_thread::yield();
}

class RateDriver {
 public:
  RateDriver(Engine& engine, Measurement& m, const InputPool& pool, const Priorities& prio)
      : engine_(engine), m_(m), pool_(pool), prio_(prio) {}

  void run(const Schedule& s, Clock::time_point start) {
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    Shard& shard = m_.recorder.local();
    shard.lag_us.reserve(s.offsets.size() - std::min(s.offsets.size(), s.first_measured));
    for (std::size_t k = 0; k < s.offsets.size() && !m_.aborted(); ++k) {
      const Clock::time_point intended = start + nanoseconds(s.offsets[k]);
      pace_until(intended);
      const bool measured = k >= s.first_measured;
      if (measured && k == s.first_measured) m_.ensure_started(start + nanoseconds(s.t0_offset));
      const Clock::time_point now = Clock::now();
      if (measured) shard.lag_us.push_back(us_between(intended, now));
      Result<Inputs> in = pool_.next(k);
      if (!in.ok()) {
        shard.refused(in.status().code(), measured, now);
        continue;
      }
      m_.add_pending();
      Status st = engine_.submit(
          std::move(*in),
          [this, intended, measured](const Result<Outputs>& r) {
            const Clock::time_point end = Clock::now();
            m_.recorder.local().record(r, intended, end, measured);
            m_.done_pending();
          },
          prio_.pick(shard));
      if (!st.ok()) {
        shard.refused(st.code(), measured, Clock::now());
        m_.done_pending();  // cannot reach zero: this driver still holds its token
      }
    }
    m_.done_pending();
  }

 private:
  Engine& engine_;
  Measurement& m_;
  const InputPool& pool_;
  const Priorities& prio_;
};

// ---- results ----------------------------------------------------------------------------------

HistogramSummary window_summary(const HistogramSnapshot* before, const HistogramSnapshot& after) {
  HistogramSnapshot d = after;
  if (before != nullptr && before->counts.size() == d.counts.size()) {
    for (std::size_t i = 0; i < d.counts.size(); ++i) {
      d.counts[i] -= std::min(d.counts[i], before->counts[i]);
    }
    d.count -= std::min(d.count, before->count);
    d.sum -= before->sum;
  }
  HistogramSummary s;
  s.count = d.count;
  if (d.count == 0) return s;
  s.mean = d.mean();
  s.p50 = d.percentile(0.50);
  s.p99 = d.percentile(0.99);
  return s;
}

/// Prints the progress line while waiting for the run to end; cancels the engine's work when
/// nothing has ended for a long time (a hung model without --timeout-ms).
void wait_for_end(Measurement& m, Engine& engine, const std::string& label, bool progress,
                  Clock::time_point start) {
  constexpr auto kTick = std::chrono::milliseconds(250);
  constexpr auto kStall = std::chrono::seconds(30);
  std::uint64_t last_count = 0;
  Clock::time_point last_change = start;
  Clock::time_point last_tick = start;
  bool printed = false;
  bool cancelled = false;
  while (!m.wait_for(kTick)) {
    const Clock::time_point now = Clock::now();
    const std::uint64_t count = m.recorder.progress();
    if (count != last_count) last_change = now;
    if (!cancelled && now - last_change > kStall) {
      std::fprintf(stderr,
                   "%sasyncinfer bench: no request has ended for %lld s; cancelling what is "
                   "left (use --timeout-ms to bound requests)\n",
                   printed ? "\n" : "", static_cast<long long>(kStall.count()));
      printed = false;
      cancelled = true;
      m.abort();
      engine.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    }
    if (progress && now - start > std::chrono::seconds(1)) {
      const double dt = duration<double>(now - last_tick).count();
      const double rps = dt > 0 ? static_cast<double>(count - last_count) / dt : 0;
      std::fprintf(stderr, "\r\033[K  %s  %.1f s  %llu done  %.0f req/s", label.c_str(),
                   duration<double>(now - start).count(), static_cast<unsigned long long>(count),
                   rps);
      std::fflush(stderr);
      printed = true;
    }
    last_count = count;
    last_tick = now;
  }
  if (printed) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

}  // namespace

std::string label_of(const RunPoint& p, const BenchOptions& o) {
  char buf[96];
  switch (p.mode) {
    case Mode::async:
      std::snprintf(buf, sizeof buf, "async c=%d", p.concurrency);
      break;
    case Mode::rate:
      std::snprintf(buf, sizeof buf, "rate %g/s %s", p.request_rate,
                    std::string(to_string(o.arrivals)).c_str());
      break;
    default:
      return std::string(to_string(p.mode));
  }
  return buf;
}

EngineOptions engine_options(const BenchOptions& o, const RunPoint& point) {
  EngineOptions e;
  e.workers = o.workers;
  e.max_inflight_per_worker = o.inflight_per_worker;
  e.completion_threads = o.completion_threads;
  e.spin_wait = microseconds(o.spin_wait_us);
  e.priority_levels = o.priority_levels;
  e.default_priority = std::min(e.default_priority, o.priority_levels);
  e.batching.max_batch_size = o.max_batch_size;
  e.batching.max_queue_delay = microseconds(o.max_queue_delay_us);
  e.batching.preferred_batch_sizes = o.preferred_batch;
  e.retry.max_attempts = o.max_attempts;
  e.intra_op_threads = o.intra_op_threads;
  if (o.queue_capacity > 0) {
    e.queue_capacity = static_cast<std::size_t>(o.queue_capacity);
  } else {
    const std::size_t lanes =
        point.mode == Mode::async ? static_cast<std::size_t>(point.concurrency) : 1;
    e.queue_capacity = std::max<std::size_t>(e.queue_capacity, 2 * lanes);
  }
  return e;
}

Result<RunResult> run_point(const BenchContext& ctx, const RunPoint& point) {
  const BenchOptions& o = ctx.options;
  // (Pipelines of timed stages are measured by run_stages(), pipeline_bench.cpp.)
  RunResult res;
  res.mode = point.mode;
  res.label = label_of(point, o);
  res.rows_per_request = ctx.plan.rows;
  if (point.mode == Mode::async) res.concurrency = point.concurrency;
  if (point.mode == Mode::sync) res.concurrency = 1;
  if (point.mode == Mode::rate) {
    res.request_rate = point.request_rate;
    res.arrivals = o.arrivals;
  }

  Result<Schedule> schedule = Schedule{};
  if (point.mode == Mode::rate) {
    schedule = make_schedule(o, point.request_rate);
    if (!schedule.ok()) return schedule.status();
  }

  auto created = Engine::create(ctx.model, ctx.device, engine_options(o, point));
  if (!created.ok()) return created.status().with_context("creating the engine");
  std::unique_ptr<Engine> engine = std::move(*created);
  res.max_batch_size = engine->options().batching.max_batch_size;
  const Priorities prio(o);

  // The first inference on the fresh engine, timed apart (part of the warm-up).
  {
    Result<Inputs> in = ctx.inputs.next(0);
    if (!in.ok()) return in.status();
    const Clock::time_point t = Clock::now();
    Result<Outputs> r = engine->infer(std::move(*in), prio.first());
    res.first_inference_us = us_between(t, Clock::now());
    if (!r.ok() && r.status().code() == StatusCode::invalid_argument) {
      return r.status().with_context("the first inference was refused");
    }
  }

  // Sample storage: reserve for the expected count (split over the recording threads).
  std::size_t expect = 1U << 14;
  if (o.requests > 0) {
    expect = static_cast<std::size_t>(o.requests);
  } else if (point.mode == Mode::rate) {
    expect = static_cast<std::size_t>(point.request_rate * o.duration_s * 1.1) + 16;
  }
  const std::size_t threads = static_cast<std::size_t>(o.completion_threads);
  const std::size_t per_shard = std::min<std::size_t>(expect / threads + 16, 1U << 22);

  Measurement m(*engine, o, per_shard);
  AsyncDriver async(*engine, m, ctx.inputs, prio);
  RateDriver rate(*engine, m, ctx.inputs, prio);
  // Rate mode starts its schedule 1 ms ahead, so its first send is not late already.
  const Clock::time_point start =
      Clock::now() +
      (point.mode == Mode::rate ? std::chrono::milliseconds(1) : std::chrono::milliseconds(0));
  m.begin(start);
  std::thread driver;
  switch (point.mode) {
    case Mode::sync:
      m.add_pending(1);
      driver = std::thread([&] { drive_sync(*engine, m, ctx.inputs, prio); });
      break;
    case Mode::async:
      async.start(point.concurrency);  // the first submits; completions keep the lanes going
      break;
    case Mode::rate:
      m.add_pending(1);
      driver = std::thread([&] { rate.run(*schedule, start); });
      break;
    case Mode::sweep:
    case Mode::pipeline:
      return invalid_argument_error("--mode: " + std::string(to_string(point.mode)) +
                                    " is not a single engine run");
  }
  wait_for_end(m, *engine, res.label, ctx.progress, start);
  if (driver.joinable()) driver.join();

  // ---- collect ----
  const Clock::time_point end_wall = Clock::now();
  const CpuTimes cpu_end = process_cpu_times();
  const EngineMetrics after = engine->metrics();
  const Measurement::Before before = m.before();
  engine.reset();  // drains (nothing is left) and joins the engine's threads

  std::vector<double> lag;
  Clock::time_point last_end{};
  std::size_t total = 0;
  for (const auto& s : m.recorder.shards()) total += s->latency_us.size();
  res.latency_us.reserve(total);
  for (const auto& s : m.recorder.shards()) {
    res.latency_us.insert(res.latency_us.end(), s->latency_us.begin(), s->latency_us.end());
    lag.insert(lag.end(), s->lag_us.begin(), s->lag_us.end());
    res.warmup_requests += s->warmup_done;
    last_end = std::max(last_end, s->last_end);
    for (std::size_t c = 0; c < kCodes; ++c) {
      const std::string name(to_string(static_cast<StatusCode>(c)));
      if (s->failed[c] > 0) res.failures[name] += s->failed[c];
      if (s->rejected[c] > 0) res.failures["rejected:" + name] += s->rejected[c];
    }
  }
  res.warmup_requests += 1;  // the first inference
  res.completed = res.latency_us.size();
  for (const auto& [reason, n] : res.failures) res.failed += n;
  res.requests = res.completed + res.failed;
  res.latency = summarize(res.latency_us);
  if (point.mode == Mode::rate) res.send_lag_us = summarize(lag);

  if (m.started()) {
    const Clock::time_point t0 = m.t0();
    if (o.warmup > 0 || o.warmup_s > 0) {
      res.warmup_s = std::max(0.0, duration<double>(t0 - start).count());
    }
    if (last_end > t0) res.duration_s = duration<double>(last_end - t0).count();
    // A timed window lasts at least its length (an open loop's last request may come early).
    if (o.requests == 0 && res.requests > 0)
      res.duration_s = std::max(res.duration_s, o.duration_s);
  }
  if (res.duration_s > 0) {
    res.throughput_rps = static_cast<double>(res.completed) / res.duration_s;
    res.rows_per_s = res.throughput_rps * static_cast<double>(res.rows_per_request);
  }
  const HistogramSnapshot* qb = before.taken ? &before.metrics.queue_us : nullptr;
  const HistogramSnapshot* cb = before.taken ? &before.metrics.compute_us : nullptr;
  const HistogramSnapshot* bb = before.taken ? &before.metrics.batch_size : nullptr;
  res.queue_us = window_summary(qb, after.queue_us);
  res.compute_us = window_summary(cb, after.compute_us);
  const HistogramSummary batches = window_summary(bb, after.batch_size);
  res.batches = batches.count;
  res.batch_size_mean = batches.mean;
  if (before.taken) {
    res.cpu_user_s = cpu_end.user_s - before.cpu.user_s;
    res.cpu_sys_s = cpu_end.sys_s - before.cpu.sys_s;
    const double wall = duration<double>(end_wall - before.wall).count();
    if (wall > 0) res.cpu_util = (res.cpu_user_s + res.cpu_sys_s) / wall;
  }
  return res;
}

}  // namespace asyncinfer::cli
