// EngineCore::metrics() and health() (engine.hpp's EngineMetrics and EngineHealth): snapshots
// of the counters, histograms and per-worker state, each read under the lock that guards it.
#include "engine/engine_core.hpp"

namespace asyncinfer {

EngineMetrics EngineCore::metrics() const {
  EngineMetrics m;
  m.model = model_->name();
  m.uptime_s = detail::elapsed_s_since(started_);
  m.submitted = submitted_.load();
  m.rejected = rejected_.load();
  resolver_.add_metrics(m);
  {
    std::lock_guard lock(reasons_mu_);
    m.rejections_by_reason = rejections_by_reason_;
  }
  {
    std::lock_guard lock(ctx_.reasons_mu);
    m.late_failures_by_reason = ctx_.late_failures_by_reason;
  }
  m.batches = ctx_.batches.load();
  m.attempts = ctx_.attempts.load();
  m.retries = ctx_.retries.load();
  m.retries_denied_by_budget = ctx_.retries_denied.load();
  m.split_batches = ctx_.split_batches.load();
  m.late_completions = ctx_.late_completions.load();
  m.late_failures = ctx_.late_failures.load();
  m.model_exceptions = ctx_.model_exceptions.load();
  m.watchdog_fired = ctx_.watchdog_fired.load();
  const detail::Scheduler::Depths depths = scheduler_.depths();
  m.queue_depth = depths.queued;
  m.retry_waiting = depths.retry_waiting;
  m.sequences_live = depths.sequences.live;
  m.sequence_backlog = depths.sequences.backlog;
  m.sequences_idle_released = depths.sequences.idle_released;
  m.sequence_backlog_expired = depths.sequences.backlog_expired;
  m.batches_per_s = m.uptime_s > 0 ? static_cast<double>(m.batches) / m.uptime_s : 0;
  m.live_workers = ctx_.live_workers.load();
  for (const auto& w : workers_) m.workers.push_back(w->metrics());
  m.queue_us = ctx_.queue_us.snapshot();
  m.compute_us = ctx_.compute_us.snapshot();
  m.batch_size = ctx_.batch_size.snapshot();
  m.stats.inference_count = ctx_.inference_count.load(std::memory_order_relaxed);
  m.stats.execution_count = ctx_.execution_count.load(std::memory_order_relaxed);
  m.stats.last_inference_ms = ctx_.last_inference_ms.load(std::memory_order_relaxed);
  m.stats.queue = ctx_.stat_queue.load();
  m.stats.compute_input = ctx_.stat_input.load();
  m.stats.compute_infer = ctx_.stat_infer.load();
  m.stats.compute_output = ctx_.stat_output.load();
  m.stats.batch_stats = ctx_.batch_stats.snapshot();
  return m;
}

EngineHealth EngineCore::health() const {
  EngineHealth h;
  h.live = accepting();
  int healthy = 0;
  std::string first_reason;
  for (const auto& w : workers_) {
    WorkerStatus ws;
    ws.index = w->index();
    std::tie(ws.health, ws.reason) = w->health();
    if (ws.health == WorkerHealth::healthy) {
      ++healthy;
    } else if (first_reason.empty()) {
      first_reason = "worker " + std::to_string(ws.index) + " " +
                     std::string(to_string(ws.health)) + ": " + ws.reason;
    }
    h.workers.push_back(std::move(ws));
  }
  h.ready = h.live && healthy > 0;
  if (!h.live) {
    h.reason = "the engine is shut down";
  } else if (!h.ready) {
    h.reason = "no healthy worker (" + first_reason + ")";
  }
  return h;
}

}  // namespace asyncinfer
