// A worker's recovery (worker.hpp): the hang watchdog, replacing a hung worker's stream and model
// instance (recycle), giving up after bounded attempts, its health (and telling
// EngineOptions::on_health_change when it changes), and the circuit breaker.
#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"
#include "engine/engine_core.hpp"

namespace asyncinfer {

using detail::Batch;
using detail::Breaker;
using detail::deadline_after;
using detail::ms_text;
using detail::Pending;
using detail::Request;
using detail::saturating_add;
using detail::Stage;
using detail::Worker;

void EngineCore::on_watchdog(const std::shared_ptr<Batch>& batch) {
  if (batch->done.load(std::memory_order_acquire)) return;
  {
    // A batch queued on the stream behind an older one that has not finished has not started:
    // its time runs from when the one ahead ends. Check again later instead of failing it.
    Worker& w = *workers_[static_cast<std::size_t>(batch->worker)];
    std::lock_guard lock(w.mu);
    bool behind = w.recycle || batch->generation != w.generation;  // its stream is going away:
    // it comes back through requeue_all when that stream is destroyed
    for (const auto& other : w.running) {
      if (behind) break;
      if (other.get() == batch.get()) break;  // `running` is in launch order
      if (!other->done.load(std::memory_order_acquire) && other->generation == batch->generation) {
        behind = true;
      }
    }
    if (behind) {
      std::lock_guard wl(batch->watchdog_mu);
      batch->watchdog = timer_.add(saturating_add(Clock::now(), opt_.watchdog),
                                   [this, batch] { on_watchdog(batch); });
      return;
    }
  }
  if (batch->done.exchange(true)) return;
  watchdog_fired_.fetch_add(1, std::memory_order_relaxed);
  Worker& w = *workers_[static_cast<std::size_t>(batch->worker)];
  bool taken_out = false;  // healthy (or paused) until now, recovering from now
  {
    std::lock_guard lock(w.mu);
    if (batch->generation == w.generation) {
      taken_out = !w.recycle && !w.gave_up;
      w.recycle = true;
      w.recycle_wanted.store(true, std::memory_order_release);
    }
  }
  if (taken_out) health_changed();
  w.failed_batches.fetch_add(1, std::memory_order_relaxed);
  breaker_failure(w, StatusCode::deadline_exceeded);
  scheduler_.wake_workers();  // a worker waiting for work in next_batch sees the flag
  release_slot(w, *batch);
  batch->stop.request_stop();  // cancellable backends end the hung work
  const Status st = deadline_exceeded_error(
      "worker " + std::to_string(w.index) +
      ": the batch did not reach its completion point "
      "within the " +
      std::to_string(opt_.watchdog.count()) +
      " ms hang watchdog; the worker's stream and model instance are being replaced");
  for (const auto& r : batch->requests) resolver_.try_resolve(r, Stage::timed_out, st);
  scheduler_.batch_finished();
}

void EngineCore::recycle(Worker& w) {
  std::unique_ptr<Stream> old_stream = std::move(w.stream);
  std::unique_ptr<ModelInstance> old_instance = std::move(w.instance);
  const bool abandon = old_stream != nullptr || old_instance != nullptr;
  {
    std::lock_guard lock(w.mu);
    ++w.generation;
    if (abandon) ++w.abandoned;
  }
  if (abandon) {
    w.recycles.fetch_add(1, std::memory_order_relaxed);
    Task reap([this, &w, s = std::move(old_stream), i = std::move(old_instance)]() mutable {
      s.reset();  // waits for its running work where the backend cannot stop it
      i.reset();
      {
        std::lock_guard lock(w.mu);
        --w.abandoned;
      }
      w.cv.notify_all();
      health_changed();  // a worker paused for its abandoned work may serve again
    });
    if (!reaper_.post(std::move(reap))) reap();  // NOLINT(bugprone-use-after-move)
  }
  const Status s = make_stream_and_instance(w, intra_op_threads_);
  int failures = 0;
  bool gave_up = false;
  bool last_worker = false;
  std::chrono::milliseconds wait{0};
  {
    std::lock_guard lock(w.mu);
    if (s.ok()) {
      w.recycle = false;
      w.recycle_wanted.store(false, std::memory_order_release);
      w.recycle_failures = 0;
      w.last_error.clear();
    } else {
      failures = ++w.recycle_failures;
      w.last_error = s.to_string();
      if (failures >= opt_.recovery.max_recycle_attempts) {
        w.gave_up = true;
        gave_up = true;
        // Under w.mu with gave_up: whoever sees the worker unhealthy (health()) then sees it
        // gone from live_workers (metrics()) too.
        last_worker = live_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1;
      } else {
        wait = recycle_backoff(failures);
        w.next_recycle = deadline_after(wait);
      }
    }
  }
  if (s.ok()) {
    health_changed();  // healthy again (or paused until its abandoned work ends)
    return;
  }
  w.recycle_attempts_failed.fetch_add(1, std::memory_order_relaxed);
  if (gave_up) {
    health_changed();  // recovering -> unhealthy for good
    worker_gave_up(w, last_worker,
                   "worker " + std::to_string(w.index) + " is unhealthy: no model instance after " +
                       std::to_string(failures) + " attempt" + (failures == 1 ? "" : "s") +
                       "; last error: " + s.to_string());
    return;
  }
  recycle_log_.log(LogLevel::warning,
                   "engine: worker " + std::to_string(w.index) +
                       " could not replace its stream and model instance (attempt " +
                       std::to_string(failures) + " of " +
                       std::to_string(opt_.recovery.max_recycle_attempts) + "; next in " +
                       ms_text(wait) + "): " + s.to_string());
}

std::chrono::milliseconds EngineCore::recycle_backoff(int failures) const {
  std::chrono::milliseconds wait = opt_.recovery.recycle_backoff;
  for (int i = 1; i < failures && wait < opt_.recovery.max_recycle_backoff; ++i) {
    wait = detail::saturating_sum(wait, wait);
  }
  return std::min(wait, opt_.recovery.max_recycle_backoff);
}

void EngineCore::worker_gave_up(Worker& w, bool last_worker, const std::string& cause) {
  log(LogLevel::error, "engine: " + cause);
  w.cv.notify_all();
  if (!last_worker) return;
  const Status st = unavailable_error("no worker of the engine can serve requests: " + cause);
  // Later submits are refused with `st` (blocked ones too); what waits ends with it.
  for (auto& r : scheduler_.no_workers(st)) end_unservable(r, st, "");
  scheduler_.wake_all();
}

void EngineCore::health_changed() noexcept {
  if (!opt_.on_health_change) return;
  try {
    opt_.on_health_change();
  } catch (...) {
    detail::report_callback_exception("on_health_change", std::current_exception());
  }
}

std::pair<WorkerHealth, std::string> EngineCore::health_of(const Worker& w) const {
  if (w.gave_up) {
    return {WorkerHealth::unhealthy, "no model instance after " +
                                         std::to_string(w.recycle_failures) +
                                         " attempts; last error: " + w.last_error};
  }
  const int max_abandoned = opt_.recovery.max_abandoned_instances;
  if ((w.recycle && w.abandoned > 0 && w.abandoned >= max_abandoned) ||
      w.abandoned > max_abandoned) {
    return {WorkerHealth::paused, "waiting for " + std::to_string(w.abandoned) +
                                      " abandoned model instance(s) to finish their work "
                                      "(max_abandoned_instances " +
                                      std::to_string(max_abandoned) + ")"};
  }
  if (w.recycle) {
    return {WorkerHealth::recovering,
            w.last_error.empty()
                ? std::string("replacing its stream and model instance after a hang")
                : "replacing its stream and model instance after a hang; attempt " +
                      std::to_string(w.recycle_failures) + " failed: " + w.last_error};
  }
  return {WorkerHealth::healthy, std::string()};
}

void EngineCore::breaker_success(Worker& w) {
  if (opt_.breaker.failure_threshold <= 0) return;
  std::lock_guard lock(w.mu);
  w.breaker.record_success();
}

void EngineCore::breaker_failure(Worker& w, StatusCode code) {
  if (opt_.breaker.failure_threshold <= 0) return;
  bool opened = false;
  {
    std::lock_guard lock(w.mu);
    opened = w.breaker.record_failure(code, Clock::now());
  }
  if (opened) {
    // A worker waiting for work in next_batch must not take the next request now.
    scheduler_.wake_workers();
  }
}

}  // namespace asyncinfer
