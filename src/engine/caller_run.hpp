// caller_run.hpp (internal) — the caller-run fast path behind one door: a request run by the thread
// that submits it, on an idle worker's stream and model instance, instead of being queued and
// waking that worker (RequestOptions::caller_run_max_compute; the HTTP server's
// HttpOptions::caller_run sets it for the requests its I/O threads submit).
//
// The path, in order:
//   1. EngineCore::prepare gives the request its bound (CallerRun::bound): the option's value
//      where the engine allows caller runs (CallerRun::applies: the inline path, no
//      max_queue_delay, not decoupled, no sequence batching or execution gate, and the model
//      supports it) and they have not tripped; 0 otherwise (Request::caller_run_max).
//   2. Scheduler::accept, under its mutex, lends a worker when nothing is queued, a worker
//      sleeps on the empty queue with none of its flags set, and the model's recent compute time
//      per batch is within the request's bound (WorkerLending::lend); the request becomes that
//      worker's batch of one (Lent), and no worker wakes.
//   3. EngineCore::accept runs it (CallerRun::run): the worker's run_lent on the submitting
//      thread, then Scheduler::give_back. A run that took far longer than its bound trips caller
//      runs off for good: the caller's thread may serve others (an HTTP I/O thread).
//
// A lent worker stays in its wait in Scheduler::next_batch, whatever wakes it, until it is given
// back: its stream and instance are the caller's meanwhile. While any worker is lent, a worker
// is woken with notify_all (a lent worker that took a notify_one would keep it).
//
// Thread safety: WorkerLending is not thread-safe but for observe(), which is lock-free: the
// Scheduler owns it and guards it with its mutex (the queue mutex). CallerRun may be used from any
// thread at once (its trip flag is atomic); run() blocks for the model's run.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "asyncinfer/detail/chrono.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/log.hpp"
#include "engine/lifecycle.hpp"
#include "engine/request.hpp"

namespace asyncinfer::detail {

struct Taker;  // scheduler.hpp: a worker asking for work

/// A worker lent to the thread that submits a request: Scheduler::accept found it asleep on an
/// empty queue and made the request a batch of one for it. The submitting thread runs the batch
/// as the worker would (Worker::run_lent), then gives the worker back (Scheduler::give_back).
struct Lent {
  std::shared_ptr<Batch> batch;
  int worker = -1;
};

/// The Scheduler's side: which workers sleep on the empty queue and may be lent, which are lent
/// now, and the model's recent compute time per batch that bounds a caller run. Every method but
/// observe() and compute_us() runs under the Scheduler's mutex.
class WorkerLending {
 public:
  /// Where a worker waits for work in Scheduler::next_batch. `asleep` is its Taker while it
  /// sleeps on an empty queue (null while it is awake, spinning or elsewhere); `lent` while a
  /// caller runs a batch for it: it then waits whatever wakes it, and `asleep` stays set.
  struct Seat {
    const Taker* asleep = nullptr;
    bool lent = false;
  };

  explicit WorkerLending(std::size_t workers) : seats_(workers) {}
  WorkerLending(const WorkerLending&) = delete;
  WorkerLending& operator=(const WorkerLending&) = delete;

  /// Worker `worker`'s seat, made when first asked for (a deque: growing keeps references).
  Seat& seat(int worker) {
    const auto w = static_cast<std::size_t>(worker);
    if (w >= seats_.size()) seats_.resize(w + 1);
    return seats_[w];
  }
  /// Whether any worker is lent now.
  bool any_lent() const noexcept { return lent_count_ > 0; }

  /// Lends a worker to a request whose caller may run it within `bound` of compute per batch:
  /// when the model's recent average (observe()) is known and within `bound`, the first worker
  /// asleep, not lent, that `can_take(taker)` accepts (its flags, its rows) is marked lent.
  /// Returns its Taker, or null (nothing lent).
  template <class CanTake>
  const Taker* lend(std::chrono::microseconds bound, CanTake&& can_take) {
    const double compute = batch_compute_us_.load(std::memory_order_relaxed);
    if (compute <= 0 || compute > static_cast<double>(bound.count())) return nullptr;
    for (Seat& s : seats_) {
      if (s.asleep == nullptr || s.lent || !can_take(*s.asleep)) continue;
      s.lent = true;
      ++lent_count_;
      return s.asleep;
    }
    return nullptr;
  }

  /// `worker`, lent by lend(), is given back. Returns its Taker while it is still asleep in
  /// next_batch (where it may have swallowed a notification meant for it), else null.
  const Taker* give_back(int worker) {
    Seat& s = seat(worker);
    s.lent = false;
    --lent_count_;
    return s.asleep;
  }

  /// A batch computed in `compute_us`: the moving average per batch (EWMA 1/8) that bounds a
  /// caller run. Lock-free; one writer at a time is not guaranteed: a lost update among racing
  /// batches only delays the average.
  void observe(double compute_us) noexcept {
    const double was = batch_compute_us_.load(std::memory_order_relaxed);
    batch_compute_us_.store(was == 0 ? compute_us : was + (compute_us - was) / 8,
                            std::memory_order_relaxed);
  }
  double compute_us() const noexcept { return batch_compute_us_.load(std::memory_order_relaxed); }

 private:
  std::deque<Seat> seats_;  // one per worker index seen
  int lent_count_ = 0;      // workers lent now
  std::atomic<double> batch_compute_us_{0};
};

/// The engine's side: whether its requests may run on their callers, and running one there.
class CallerRun {
 public:
  /// A caller run that took longer than 16 × its bound and than this trips caller runs off (a
  /// stalled VM takes a few milliseconds; a mispredicted model, its whole cost).
  static constexpr int kTripMs = 10;

  /// Whether RequestOptions::caller_run_max_compute applies to an engine: the inline path
  /// (`inline_path`: caller-run streams, no hang watchdog), not decoupled, no max_queue_delay, no
  /// sequence batching, no execution gate, and `model_supports` (Model::supports_caller_runs).
  static bool applies(bool inline_path, const ModelSignature& sig, const EngineOptions& opt,
                      bool model_supports) noexcept {
    return inline_path && !sig.decoupled && opt.batching.max_queue_delay.count() == 0 &&
           !opt.sequence_batching && !opt.execution_gate && model_supports;
  }

  /// `enabled`: applies(). `model_name` names the model in the trip's warning.
  CallerRun(bool enabled, std::string model_name)
      : enabled_(enabled), model_name_(std::move(model_name)) {}
  CallerRun(const CallerRun&) = delete;
  CallerRun& operator=(const CallerRun&) = delete;

  /// The bound a request gets (Request::caller_run_max): `o.caller_run_max_compute` while caller
  /// runs apply and have not tripped; 0 (never run by its caller) otherwise.
  std::chrono::microseconds bound(const RequestOptions& o) const noexcept {
    if (enabled_ && !tripped_.load(std::memory_order_relaxed)) return o.caller_run_max_compute;
    return std::chrono::microseconds(0);
  }
  bool tripped() const noexcept { return tripped_.load(std::memory_order_relaxed); }

  /// Runs a lent worker's batch here: `run()` (the worker's run_lent), then `give_back()` (the
  /// Scheduler's, even when `run` throws). The model's recent average let it run here; when this
  /// run took far longer than `bound` (a cost that follows the inputs' values after all, or a
  /// host that stalled it), caller runs trip off for good, with one warning. Blocks for `run`.
  template <class Run, class GiveBack>
  void run(std::chrono::microseconds bound, Run&& run, GiveBack&& give_back) {
    const Clock::time_point start = Clock::now();
    {
      struct Guard {
        GiveBack& give_back;
        ~Guard() { give_back(); }
      } guard{give_back};
      run();
    }
    const Clock::duration took = Clock::now() - start;
    const Clock::duration trip =
        std::max<Clock::duration>(16 * bound, std::chrono::milliseconds(kTripMs));
    if (took > trip && !tripped_.exchange(true)) {
      asyncinfer::log(LogLevel::warning,
                      "engine: model '" + model_name_ + "': a request run by its caller took " +
                          ms_text(took) + " against a recent average within " +
                          std::to_string(bound.count()) +
                          " us; its callers no longer run requests (caller_run_max_compute)");
    }
  }

 private:
  const bool enabled_;
  const std::string model_name_;
  std::atomic<bool> tripped_{false};
};

}  // namespace asyncinfer::detail
