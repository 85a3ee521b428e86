// What fills EngineMetrics (engine.hpp): the EngineCounters' own part (add_to), and
// EngineCore::metrics() and health() — snapshots of the counters, histograms and per-worker
// state, each read under the lock that guards it.
#include "engine/engine_core.hpp"
#include "engine/engine_counters.hpp"

namespace asyncinfer {

namespace detail {

void EngineCounters::count_rejection(const char* reason) {
  rejected.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(rejections_mu_);
  rejections_by_reason_[reason]++;
}

void EngineCounters::count_late_failures(std::size_t n, StatusCode code) {
  late_failures.fetch_add(n, std::memory_order_relaxed);
  std::lock_guard lock(late_mu_);
  late_failures_by_reason_[std::string(to_string(code))] += n;
}

void EngineCounters::add_to(EngineMetrics& m) const {
  m.submitted = submitted.load();
  m.rejected = rejected.load();
  {
    std::lock_guard lock(rejections_mu_);
    m.rejections_by_reason = rejections_by_reason_;
  }
  {
    std::lock_guard lock(late_mu_);
    m.late_failures_by_reason = late_failures_by_reason_;
  }
  m.batches = batches.load();
  m.attempts = attempts.load();
  m.retries = retries.load();
  m.retries_denied_by_budget = retries_denied.load();
  m.split_batches = split_batches.load();
  m.late_completions = late_completions.load();
  m.late_failures = late_failures.load();
  m.model_exceptions = model_exceptions.load();
  m.watchdog_fired = watchdog_fired.load();
  m.live_workers = live_workers.load();
  m.queue_us = queue_us.snapshot();
  m.compute_us = compute_us.snapshot();
  m.batch_size = batch_size.snapshot();
  m.stats.inference_count = inference_count.load(std::memory_order_relaxed);
  m.stats.execution_count = execution_count.load(std::memory_order_relaxed);
  m.stats.last_inference_ms = last_inference_ms.load(std::memory_order_relaxed);
  m.stats.queue = stat_queue.load();
  m.stats.compute_input = stat_input.load();
  m.stats.compute_infer = stat_infer.load();
  m.stats.compute_output = stat_output.load();
  m.stats.batch_stats = batch_stats.snapshot();
}

}  // namespace detail

EngineMetrics EngineCore::metrics() const {
  EngineMetrics m;
  m.model = model_->name();
  m.uptime_s = detail::elapsed_s_since(started_);
  // The outcomes first, then the counters: a request is counted submitted, and a batch
  // attempted, before its outcome is, so the snapshot never shows more outcomes than those.
  resolver_.add_metrics(m);
  ctx_.counters.add_to(m);
  const detail::Scheduler::Depths depths = scheduler_.depths();
  m.queue_depth = depths.queued;
  m.retry_waiting = depths.retry_waiting;
  m.sequences_live = depths.sequences.live;
  m.sequence_backlog = depths.sequences.backlog;
  m.sequences_idle_released = depths.sequences.idle_released;
  m.sequence_backlog_expired = depths.sequences.backlog_expired;
  m.batches_per_s = m.uptime_s > 0 ? static_cast<double>(m.batches) / m.uptime_s : 0;
  for (const auto& w : workers_) m.workers.push_back(w->metrics());
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
