// A worker's recovery (worker.hpp): the hang watchdog, replacing a hung worker's stream and model
// instance (recycle), giving up after bounded attempts, its health (and telling
// EngineOptions::on_health_change when it changes), and the circuit breaker.
#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"
#include "engine/worker.hpp"

namespace asyncinfer::detail {

std::chrono::milliseconds Worker::watchdog_limit(const Batch& batch) const {
  if (batch.io == nullptr || !batch.io->coalesced) return ctx_.opt.watchdog;
  return ctx_.opt.watchdog * static_cast<std::int64_t>(batch.requests.size());
}

void Worker::on_watchdog(const std::shared_ptr<Batch>& batch) {
  if (batch->done.load(std::memory_order_acquire)) return;
  {
    // A batch queued on the stream behind an older one that has not finished has not started:
    // its time runs from when the one ahead ends. Check again later instead of failing it.
    std::lock_guard lock(mu_);
    bool behind = life_ == WorkerLife::recycling ||
                  batch->generation != generation_;  // its stream is going away:
    // it comes back through requeue_all when that stream is destroyed
    for (const auto& other : running_) {
      if (behind) break;
      if (other.get() == batch.get()) break;  // `running` is in launch order
      if (!other->done.load(std::memory_order_acquire) && other->generation == batch->generation) {
        behind = true;
      }
    }
    if (behind) {
      std::lock_guard wl(batch->watchdog_mu);
      batch->watchdog = ctx_.timer.add(saturating_add(Clock::now(), watchdog_limit(*batch)),
                                       [this, batch] { on_watchdog(batch); });
      return;
    }
  }
  if (batch->done.exchange(true)) return;
  // Its work is abandoned with its instance: its turn at the execution gate goes back now, so
  // that the worker's next batch (and other models) are not held up by a hung instance.
  if (ctx_.opt.execution_gate != nullptr) leave_gate(*batch);
  ctx_.counters.watchdog_fired.fetch_add(1, std::memory_order_relaxed);
  bool taken_out = false;  // healthy (or paused) until now, recovering from now
  {
    std::lock_guard lock(mu_);
    if (batch->generation == generation_) {
      taken_out = life_ == WorkerLife::serving;
      if (taken_out) {
        kWorkerLifeMoves.move(life_, WorkerLife::recycling);
        recycle_wanted_.store(true, std::memory_order_release);
      }
    }
  }
  if (taken_out) ctx_.health_changed();
  failed_batches_.fetch_add(1, std::memory_order_relaxed);
  breaker_failure(StatusCode::deadline_exceeded);
  scheduler_.wake_workers();  // a worker waiting for work in next_batch sees the flag
  release_slot(*batch);
  batch->stop.request_stop();  // cancellable backends end the hung work
  const Status st = deadline_exceeded_error(
      "worker " + std::to_string(index_) +
      ": the batch did not reach its completion point "
      "within the " +
      std::to_string(watchdog_limit(*batch).count()) +
      " ms hang watchdog; the worker's stream and model instance are being replaced");
  if (batch->io != nullptr && batch->io->coalesced) {
    // Coalesced requests run again, each alone (BatchFailure::batch_failed): only the one that
    // hangs fails, on its own watchdog.
    ctx_.failures.batch_failed(batch, st);
  } else {
    for (const auto& r : batch->requests) resolver_.try_resolve(r, Stage::timed_out, st);
  }
  scheduler_.batch_finished(*batch);
}

void Worker::recycle() {
  std::unique_ptr<Stream> old_stream = std::move(stream_);
  std::unique_ptr<ModelInstance> old_instance = std::move(instance_);
  const bool abandon = old_stream != nullptr || old_instance != nullptr;
  {
    std::lock_guard lock(mu_);
    ++generation_;
    if (abandon) ++abandoned_;
  }
  if (abandon) {
    recycles_.fetch_add(1, std::memory_order_relaxed);
    Task reap([this, s = std::move(old_stream), i = std::move(old_instance)]() mutable {
      s.reset();  // waits for its running work where the backend cannot stop it
      i.reset();
      {
        std::lock_guard lock(mu_);
        --abandoned_;
      }
      cv_.notify_all();
      ctx_.health_changed();  // a worker paused for its abandoned work may serve again
    });
    if (!ctx_.reaper.post(std::move(reap))) reap();  // NOLINT(bugprone-use-after-move)
  }
  const Status s = make_stream_and_instance();
  int failures = 0;
  bool gave_up = false;
  bool last_worker = false;
  std::chrono::milliseconds wait{0};
  {
    std::lock_guard lock(mu_);
    if (s.ok()) {
      kWorkerLifeMoves.move(life_, WorkerLife::serving);
      recycle_wanted_.store(false, std::memory_order_release);
      recycle_failures_ = 0;
      last_error_.clear();
    } else {
      failures = ++recycle_failures_;
      last_error_ = s.to_string();
      if (failures >= ctx_.opt.recovery.max_recycle_attempts) {
        kWorkerLifeMoves.move(life_, WorkerLife::gave_up);
        gave_up = true;
        // Under mu_ with gave_up: whoever sees the worker unhealthy (health()) then sees it
        // gone from live_workers (metrics()) too.
        last_worker = ctx_.counters.live_workers.fetch_sub(1, std::memory_order_acq_rel) == 1;
      } else {
        wait = recycle_backoff(failures);
        next_recycle_ = deadline_after(wait);
      }
    }
  }
  if (s.ok()) {
    ctx_.health_changed();  // healthy again (or paused until its abandoned work ends)
    return;
  }
  recycle_attempts_failed_.fetch_add(1, std::memory_order_relaxed);
  if (gave_up) {
    ctx_.health_changed();  // recovering -> unhealthy for good
    give_up(last_worker, "worker " + std::to_string(index_) +
                             " is unhealthy: no model instance after " + std::to_string(failures) +
                             " attempt" + (failures == 1 ? "" : "s") +
                             "; last error: " + s.to_string());
    return;
  }
  ctx_.recycle_log.log(LogLevel::warning,
                       "engine: worker " + std::to_string(index_) +
                           " could not replace its stream and model instance (attempt " +
                           std::to_string(failures) + " of " +
                           std::to_string(ctx_.opt.recovery.max_recycle_attempts) + "; next in " +
                           ms_text(wait) + "): " + s.to_string());
}

std::chrono::milliseconds Worker::recycle_backoff(int failures) const {
  std::chrono::milliseconds wait = ctx_.opt.recovery.recycle_backoff;
  for (int i = 1; i < failures && wait < ctx_.opt.recovery.max_recycle_backoff; ++i) {
    wait = detail::saturating_sum(wait, wait);
  }
  return std::min(wait, ctx_.opt.recovery.max_recycle_backoff);
}

void Worker::give_up(bool last_worker, const std::string& cause) {
  log(LogLevel::error, "engine: " + cause);
  cv_.notify_all();
  if (last_worker) ctx_.failures.no_worker_left(cause);
}

std::pair<WorkerHealth, std::string> Worker::health_locked() const {
  if (life_ == WorkerLife::gave_up) {
    return {WorkerHealth::unhealthy, "no model instance after " +
                                         std::to_string(recycle_failures_) +
                                         " attempts; last error: " + last_error_};
  }
  const int max_abandoned = ctx_.opt.recovery.max_abandoned_instances;
  const bool recycling = life_ == WorkerLife::recycling;
  if ((recycling && abandoned_ > 0 && abandoned_ >= max_abandoned) || abandoned_ > max_abandoned) {
    return {WorkerHealth::paused, "waiting for " + std::to_string(abandoned_) +
                                      " abandoned model instance(s) to finish their work "
                                      "(max_abandoned_instances " +
                                      std::to_string(max_abandoned) + ")"};
  }
  if (recycling) {
    return {WorkerHealth::recovering,
            last_error_.empty()
                ? std::string("replacing its stream and model instance after a hang")
                : "replacing its stream and model instance after a hang; attempt " +
                      std::to_string(recycle_failures_) + " failed: " + last_error_};
  }
  return {WorkerHealth::healthy, std::string()};
}

void Worker::breaker_success() {
  if (ctx_.opt.breaker.failure_threshold <= 0) return;
  std::lock_guard lock(mu_);
  breaker_.record_success();
}

void Worker::breaker_failure(StatusCode code) {
  if (ctx_.opt.breaker.failure_threshold <= 0) return;
  bool opened = false;
  {
    std::lock_guard lock(mu_);
    opened = breaker_.record_failure(code, Clock::now());
  }
  if (opened) {
    // A worker waiting for work in next_batch must not take the next request now.
    scheduler_.wake_workers();
  }
}

}  // namespace asyncinfer::detail
