// EngineCore::metrics() and health() (engine.hpp's EngineMetrics and EngineHealth): snapshots
// of the counters, histograms and per-worker state, each read under the lock that guards it.
#include "engine/engine_core.hpp"

namespace asyncinfer {

using detail::Batch;
using detail::ms_text;
using detail::Pending;
using detail::Request;
using detail::Stage;
using detail::Worker;
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
    m.late_failures_by_reason = late_failures_by_reason_;
  }
  m.batches = batches_.load();
  m.attempts = attempts_.load();
  m.retries = retries_.load();
  m.retries_denied_by_budget = retries_denied_.load();
  m.split_batches = split_batches_.load();
  m.late_completions = late_completions_.load();
  m.late_failures = late_failures_.load();
  m.model_exceptions = model_exceptions_.load();
  m.watchdog_fired = watchdog_fired_.load();
  const detail::Scheduler::Depths depths = scheduler_.depths();
  m.queue_depth = depths.queued;
  m.retry_waiting = depths.retry_waiting;
  m.batches_per_s = m.uptime_s > 0 ? static_cast<double>(m.batches) / m.uptime_s : 0;
  m.live_workers = live_workers_.load();
  for (const auto& w : workers_) {
    WorkerMetrics wm;
    wm.index = w->index;
    {
      std::lock_guard lock(w->mu);
      wm.breaker = detail::to_string(w->breaker.state());
      wm.inflight_batches = w->inflight;
      wm.abandoned_instances = w->abandoned;
      auto [health, reason] = health_of(*w);
      wm.health = std::string(to_string(health));
      wm.health_reason = std::move(reason);
    }
    wm.batches = w->batches.load();
    wm.failed_batches = w->failed_batches.load();
    wm.recycles = w->recycles.load();
    wm.recycle_failures = w->recycle_attempts_failed.load();
    wm.stream_batches = w->stream_batches.load();
    m.workers.push_back(std::move(wm));
  }
  m.queue_us = queue_us_.snapshot();
  m.compute_us = compute_us_.snapshot();
  m.batch_size = batch_size_.snapshot();
  m.stats.inference_count = inference_count_.load(std::memory_order_relaxed);
  m.stats.execution_count = execution_count_.load(std::memory_order_relaxed);
  m.stats.last_inference_ms = last_inference_ms_.load(std::memory_order_relaxed);
  m.stats.queue = stat_queue_.load();
  m.stats.compute_input = stat_input_.load();
  m.stats.compute_infer = stat_infer_.load();
  m.stats.compute_output = stat_output_.load();
  m.stats.batch_stats = batch_stats_.snapshot();
  return m;
}

EngineHealth EngineCore::health() const {
  EngineHealth h;
  h.live = accepting();
  int healthy = 0;
  std::string first_reason;
  for (const auto& w : workers_) {
    WorkerStatus ws;
    ws.index = w->index;
    {
      std::lock_guard lock(w->mu);
      auto [health, reason] = health_of(*w);
      ws.health = health;
      ws.reason = std::move(reason);
    }
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
