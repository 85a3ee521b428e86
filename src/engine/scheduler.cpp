// The engine's Scheduler (scheduler.hpp): the queue, the retry waiting set, admission and the
// engine's life cycle, under one mutex.
#include "engine/scheduler.hpp"

#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"
#include "engine/lifecycle.hpp"

namespace asyncinfer::detail {

namespace {

/// A worker's flags say it must stop taking work: a recycle is wanted, or its breaker opened.
bool must_stop(const Taker& t) {
  const auto set = [](const std::atomic<bool>* f) {
    return f != nullptr && f->load(std::memory_order_acquire);
  };
  return set(t.recycle_wanted) || set(t.breaker_open);
}

}  // namespace

Scheduler::Scheduler(const EngineOptions& o, bool batched)
    : queue_capacity_(o.queue_capacity),
      queue_full_policy_(o.queue_full_policy),
      submit_timeout_(std::chrono::duration_cast<std::chrono::milliseconds>(o.submit_timeout)),
      batched_(batched),
      max_queue_delay_(o.batching.max_queue_delay),
      preferred_batch_sizes_(o.batching.preferred_batch_sizes),
      priority_aging_(o.priority_aging),
      workers_(static_cast<std::size_t>(std::max(o.workers, 1))),
      queue_(o.priority_levels),
      retry_(o.retry),
      admission_(o.admission_control, o.workers),
      lending_(static_cast<std::size_t>(std::max(o.workers, 0))) {
  if (o.sequence_batching) {
    sequences_.emplace(*o.sequence_batching, o.workers, o.batching.max_batch_size.value_or(1));
  }
}

// ---- life cycle ---------------------------------------------------------------------------------

void Scheduler::set_state(EngineState to, const std::unique_lock<std::mutex>& lock) {
  const EngineState from = state_.load(std::memory_order_relaxed);
  kEngineStateMoves.check(from, to);
  if (!lock.owns_lock() || lock.mutex() != &mu_) {
    kEngineStateMoves.fail(from, to, "without the scheduler's mutex");
  }
  state_.store(to, std::memory_order_release);
}

EngineState Scheduler::begin_shutdown(EngineState want) {
  EngineState was;
  {
    std::unique_lock lock(mu_);
    was = state();
    if (was >= want) return was;
    set_state(want, lock);
  }
  wake_all();
  return was;
}

void Scheduler::wait_drained(Clock::time_point until) {
  std::unique_lock lock(mu_);
  const auto drained_or_cancelled = [this] {
    return state() != EngineState::draining ||
           (queued_locked() == 0 && retry_.empty() && inflight_batches_ == 0);
  };
  if (no_limit(until)) {
    drain_cv_.wait(lock, drained_or_cancelled);
  } else {
    drain_cv_.wait_until(lock, until, drained_or_cancelled);
  }
  // Drained, timed out, or escalated by a cancel: what is left (nothing after a drain) ends
  // shut_down, and the workers still waiting (a breaker cool-down, a recycle backoff, abandoned
  // work) leave.
  if (state() == EngineState::draining) set_state(EngineState::cancelling, lock);
  lock.unlock();
  wake_all();
}

void Scheduler::stopped() {
  std::unique_lock lock(mu_);
  set_state(EngineState::stopped, lock);
}

void Scheduler::wake_all() {
  { std::lock_guard lock(mu_); }  // a waiter between its check and its wait sees the change
  work_cv_.notify_all();
  space_cv_.notify_all();
  drain_cv_.notify_all();
}

void Scheduler::wake_workers() {
  { std::lock_guard lock(mu_); }
  work_cv_.notify_all();
}

void Scheduler::notify_progress() {
  { std::lock_guard lock(mu_); }
  work_cv_.notify_all();
  drain_cv_.notify_all();
}

// ---- accepting ----------------------------------------------------------------------------------

std::optional<Refusal> Scheduler::admit(Request& r, std::unique_lock<std::mutex>& lock,
                                        Clock::time_point& now) {
  const auto ended = [&r]() -> Refusal {
    const Status& s = *r.refusal;
    return {s.code() == StatusCode::cancelled ? "cancelled" : "ended_before_accepted", s};
  };
  const auto closed = [this]() -> std::optional<Refusal> {
    if (!accepting()) return Refusal{"shut_down", unavailable_error("engine is shut down")};
    if (no_workers_) return Refusal{"unavailable", *no_workers_};
    return std::nullopt;
  };
  if (r.refusal) return ended();
  if (auto c = closed()) return c;
  now = r.enqueued;  // prepare()'s reading, unless the submit waits below
  if (queued_locked() >= queue_capacity_) {
    if (queue_full_policy_ == QueueFullPolicy::reject) {
      return Refusal{"queue_full", resource_exhausted_error(with_tag("queue full", r.tag) + ": " +
                                                            std::to_string(queued_locked()) +
                                                            " requests queued (queue_capacity " +
                                                            std::to_string(queue_capacity_) + ")")};
    }
    // Wait for room, but not past the request's own deadline: a request whose deadline passes
    // here ends before it is accepted, so it is refused.
    const Clock::time_point until = std::min(deadline_after(submit_timeout_), r.deadline);
    const auto ready = [&] {
      return !accepting() || r.refusal.has_value() || no_workers_.has_value() ||
             queued_locked() < queue_capacity_;
    };
    if (no_limit(until)) {
      space_cv_.wait(lock, ready);
    } else {
      space_cv_.wait_until(lock, until, ready);
    }
    if (r.refusal) return ended();
    if (auto c = closed()) return c;
    if (queued_locked() >= queue_capacity_) {
      if (Clock::now() >= r.deadline) {
        return Refusal{"deadline",
                       deadline_exceeded_error(with_tag("request timed out", r.tag) + " after " +
                                               ms_text(Clock::now() - r.submitted) +
                                               " while its submit waited for room in the queue "
                                               "(not accepted)")};
      }
      return Refusal{"queue_full",
                     resource_exhausted_error(with_tag("queue full", r.tag) + ": still " +
                                              std::to_string(queued_locked()) +
                                              " requests queued after waiting " +
                                              ms_text(submit_timeout_) + " (submit_timeout)")};
    }
    now = Clock::now();
  }
  if (auto why = admission_.check(queued_locked(), now, r.deadline)) {
    return Refusal{"admission", resource_exhausted_error(with_tag(*why, r.tag))};
  }
  return std::nullopt;
}

void Scheduler::enqueue_accepted(const std::shared_ptr<Request>& r, Clock::time_point now,
                                 std::unique_lock<std::mutex>& lock) {
  r->enqueued = now;
  r->waiting_since = now;
  transition(*r, Stage::submitting, Stage::queued, lock);
  retry_.on_request(now);
  queue_.push_back(r);
  arrivals_.note();
  const bool any_lent = lending_.any_lent();
  lock.unlock();
  notify_one_worker(any_lent);
}

void Scheduler::enqueue_sequence(const std::shared_ptr<Request>& r, Clock::time_point now,
                                 std::unique_lock<std::mutex>& lock) {
  r->enqueued = now;
  r->waiting_since = now;
  transition(*r, Stage::submitting, Stage::queued, lock);
  arrivals_.note();
  lock.unlock();
  // The worker holding the sequence's slot must wake, not just any: all of them look.
  work_cv_.notify_all();
}

bool Scheduler::lend(const std::shared_ptr<Request>& r, Clock::time_point now, Lent& out,
                     const std::unique_lock<std::mutex>& lock) {
  if (!queue_.empty() || no_workers_) return false;
  const Taker* t = lending_.lend(r->caller_run_max, [&](const Taker& taker) {
    return !must_stop(taker) && r->rows <= taker.max_rows;
  });
  if (t == nullptr) return false;
  r->enqueued = now;
  r->waiting_since = now;
  retry_.on_request(now);
  transition(*r, Stage::submitting, Stage::queued, lock);
  auto batch = std::make_shared<Batch>();
  batch->worker = t->worker;
  r->batch = batch;  // before the transition: whoever sees `running` sees the batch
  transition(*r, Stage::queued, Stage::running, lock);
  batch->requests.push_back(r);
  batch->rows = r->rows;
  batch->live.store(1, std::memory_order_relaxed);
  ++inflight_batches_;
  out.batch = std::move(batch);
  out.worker = t->worker;
  return true;
}

void Scheduler::give_back(int worker) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    const Taker* asleep = lending_.give_back(worker);
    // Still asleep in next_batch, where it may have swallowed a notification meant for it
    // meanwhile: wake it (and the others) when anything asks for a worker.
    wake = queued_locked() > 0 || !accepting() || asleep == nullptr || must_stop(*asleep);
    // Under the lock: once it is released, a shutdown may join the worker and return, and the
    // engine may be gone.
    if (wake) work_cv_.notify_all();
  }
}

Withdrawal Scheduler::withdraw(const std::shared_ptr<Request>& r, Stage to, const Status& why,
                               std::shared_ptr<Request>& ref,
                               std::vector<std::shared_ptr<Request>>* also, bool* expired) {
  std::unique_lock lock(mu_);
  const Stage cur = r->stage.load(std::memory_order_acquire);
  if (cur == Stage::submitting) {
    // Its submit has not accepted it yet (request.hpp): it never will. The submit refuses it
    // with this error; no terminal state, no place in the delivery order.
    if (r->refusal) return Withdrawal::already_refused;
    r->refusal =
        Status(why.code(), std::string(why.message()) + " (before its submit accepted it)");
    lock.unlock();
    space_cv_.notify_all();  // its submit may be waiting for room
    return Withdrawal::refused;
  }
  if (cur == Stage::queued && transition(*r, Stage::queued, to, lock)) {
    if (r->sequence) {
      std::vector<std::shared_ptr<Request>> rest;
      const bool expiring = r->sequence->backlogged && to == Stage::timed_out && also != nullptr &&
                            expired != nullptr;
      sequences_->withdraw(*r, to, expiring ? &rest : nullptr);
      if (expiring) *expired = true;
      for (auto& p : rest) {
        if (transition(*p, Stage::queued, to, lock)) also->push_back(p);
      }
      ref = r;
      lock.unlock();
      space_cv_.notify_all();
      work_cv_.notify_all();  // a slot may have changed hands
      if (!accepting()) notify_progress();
      return Withdrawal::from_queue;
    }
    ref = queue_.remove(r.get());
    lock.unlock();
    if (queue_full_policy_ == QueueFullPolicy::block) space_cv_.notify_one();
    if (!accepting()) notify_progress();
    return Withdrawal::from_queue;
  }
  if (cur == Stage::retry_wait && transition(*r, Stage::retry_wait, to, lock)) {
    ref = retry_.unpark(r.get());
    lock.unlock();
    if (!accepting()) notify_progress();
    return Withdrawal::from_retry_wait;
  }
  return Withdrawal::not_waiting;
}

// ---- workers ------------------------------------------------------------------------------------

std::shared_ptr<Batch> Scheduler::next_batch(const Taker& taker) {
  BatcherConfig config;
  config.batched = batched_;
  config.max_rows = taker.max_rows;
  config.coalesce = taker.coalesce;
  config.max_queue_delay = max_queue_delay_;
  config.preferred_batch_sizes = preferred_batch_sizes_;
  config.priority_aging = priority_aging_;
  std::unique_lock lock = lock_spinning(mu_);
  WorkerLending::Seat& me = lending_.seat(taker.worker);
  bool spun = false;
  for (;;) {
    if (me.lent) {
      // A caller runs a batch with this worker's stream and instance (accept()): nothing else
      // until it is given back, not even leaving for a shutdown (which would destroy them).
      work_cv_.wait(lock);
      continue;
    }
    me.asleep = nullptr;  // awake, under the lock
    if (cancelling()) return nullptr;
    if (must_stop(taker)) return nullptr;
    if (sequences_) {
      Clock::time_point wake;
      if (auto batch = take_sequences(taker, wake, lock)) {
        lock.unlock();
        work_cv_.notify_all();  // a slot freed here may have gone to another worker's sequence
        if (queue_full_policy_ == QueueFullPolicy::block) space_cv_.notify_all();
        return batch;
      }
      if (!accepting() && queued_locked() == 0 && retry_.empty() && inflight_batches_ == 0) {
        return nullptr;
      }
      if (no_limit(wake)) {
        work_cv_.wait(lock);
      } else {
        work_cv_.wait_until(lock, wake);  // the next idle slot's expiry: a timer, not a poll
      }
      continue;
    }
    if (queue_.empty()) {
      if (!accepting() && retry_.empty() && inflight_batches_ == 0) return nullptr;
      if (taker.spin != nullptr && !spun) {
        // Stay awake briefly for the next request (spin_wait.hpp): its accept() then wakes
        // nobody. Whatever else would wake this wait (a state change, the taker's flags) is
        // seen when the spin ends, at most its budget later.
        spun = true;
        arrivals_.spin_unlocked(lock, *taker.spin,
                                [&] { return !accepting() || must_stop(taker); });
        continue;
      }
      me.asleep = &taker;  // accept() may lend it from here (Lent)
      work_cv_.wait(lock);
      continue;
    }
    config.flush = !accepting();
    if (taker.coalesce > 1 && workers_ > 1) {
      // Coalesced launches: a worker takes its share of what is queued, so that the other
      // instances are not left idle while one runs them all (Triton hands each request to a
      // free instance).
      const std::size_t share = (queue_.size() + workers_ - 1) / workers_;
      config.coalesce = static_cast<int>(
          std::min(static_cast<std::size_t>(taker.coalesce), std::max<std::size_t>(share, 1)));
    }
    const BatchPlan plan = plan_batch(queue_, config, Clock::now());
    if (!plan.ready()) {
      if (no_limit(plan.wake)) {
        work_cv_.wait(lock);  // a new request, a stopping engine or a recycle wakes it
      } else {
        work_cv_.wait_until(lock, plan.wake);
      }
      continue;
    }
    auto batch = std::make_shared<Batch>();
    batch->worker = taker.worker;
    batch->requests.reserve(plan.take.size());
    for (Request* r : plan.take) {
      r->batch = batch;  // before the transition: whoever sees `running` sees the batch
      transition(*r, Stage::queued, Stage::running, lock);
      batch->requests.push_back(queue_.remove(r));
    }
    batch->rows = plan.rows;
    batch->live.store(static_cast<int>(batch->requests.size()), std::memory_order_relaxed);
    ++inflight_batches_;
    lock.unlock();
    if (queue_full_policy_ == QueueFullPolicy::block) space_cv_.notify_all();
    return batch;
  }
}

std::shared_ptr<Batch> Scheduler::take_sequences(const Taker& taker, Clock::time_point& wake,
                                                 const std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<Request>> taken =
      sequences_->take(taker.worker, taker.max_rows, Clock::now(), wake);
  if (taken.empty()) return nullptr;
  auto batch = std::make_shared<Batch>();
  batch->worker = taker.worker;
  batch->requests.reserve(taken.size());
  for (auto& r : taken) {
    batch->sequences.push_back({r->sequence, r->sequence_flags->end});
    r->batch = batch;  // before the transition: whoever sees `running` sees the batch
    // Every waiting request is `queued` (one that ended left its sequence under this lock).
    if (transition(*r, Stage::queued, Stage::running, lock))
      batch->requests.push_back(std::move(r));
  }
  batch->rows = static_cast<std::int64_t>(batch->requests.size());
  batch->live.store(static_cast<int>(batch->requests.size()), std::memory_order_relaxed);
  ++inflight_batches_;
  return batch;
}

void Scheduler::batch_finished(const Batch& batch) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    --inflight_batches_;
    if (sequences_ && !batch.sequences.empty()) {
      wake = sequences_->finished(batch.sequences, Clock::now());
    }
  }
  if (wake) work_cv_.notify_all();
  if (!accepting()) notify_progress();
}

Requeued Scheduler::requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo) {
  Requeued out;
  {
    std::unique_lock lock(mu_);
    out.unavailable = no_workers_;
    for (auto it = rs.rbegin(); it != rs.rend(); ++it) {
      const std::shared_ptr<Request>& r = *it;
      if (cancelling() || out.unavailable) {
        out.refused.push_back(r);
        continue;
      }
      if (r->on_response || r->sequence) {
        // Decoupled: runs once (its client may have part of an answer); a sequence's request
        // too (the model's state may have moved on).
        out.partial.push_back(r);
        continue;
      }
      if (!transition(*r, Stage::running, Stage::queued, lock)) continue;
      r->solo = r->solo || solo;
      --r->attempts;
      r->batch.reset();
      r->waiting_since = Clock::now();
      queue_.push_front(r);
      arrivals_.note();
    }
  }
  work_cv_.notify_all();
  return out;
}

bool Scheduler::park_for_retry(const std::shared_ptr<Request>& r) {
  std::unique_lock lock(mu_);
  if (!transition(*r, Stage::running, Stage::retry_wait, lock)) return false;
  r->batch.reset();
  retry_.park(r);
  return true;
}

BackoffEnd Scheduler::requeue_after_backoff(const std::shared_ptr<Request>& r) {
  BackoffEnd out;
  std::unique_lock lock(mu_);
  if (!retry_.waiting(r.get())) return out;  // ended meanwhile
  out.unavailable = no_workers_;
  if (cancelling() || out.unavailable) {
    out.unservable = true;
    return out;
  }
  std::shared_ptr<Request> ref = retry_.unpark(r.get());
  if (!transition(*r, Stage::retry_wait, Stage::queued, lock)) return out;
  r->enqueued = Clock::now();
  r->waiting_since = r->enqueued;
  queue_.push_back(ref);  // retries do not count against queue_capacity
  arrivals_.note();
  const bool any_lent = lending_.any_lent();
  lock.unlock();
  notify_one_worker(any_lent);
  out.requeued = true;
  return out;
}

std::vector<std::shared_ptr<Request>> Scheduler::no_workers(const Status& why) {
  std::vector<std::shared_ptr<Request>> left;
  {
    std::lock_guard lock(mu_);
    no_workers_ = why;
    left = waiting_locked();
  }
  space_cv_.notify_all();  // blocked submits are refused now
  return left;
}

// ---- reading ------------------------------------------------------------------------------------

std::vector<std::shared_ptr<Request>> Scheduler::waiting() const {
  std::lock_guard lock(mu_);
  return waiting_locked();
}

std::vector<std::shared_ptr<Request>> Scheduler::waiting_locked() const {
  std::vector<std::shared_ptr<Request>> out;
  for (Request* r : queue_.all()) out.push_back(r->queue_ref);
  if (sequences_) sequences_->append_waiting(out);
  for (auto& ref : retry_.all()) out.push_back(std::move(ref));
  return out;
}

Scheduler::Depths Scheduler::depths() const {
  std::lock_guard lock(mu_);
  Depths d{
      static_cast<std::int64_t>(queued_locked()), static_cast<std::int64_t>(retry_.size()), {}};
  if (sequences_) d.sequences = sequences_->counts();
  return d;
}

}  // namespace asyncinfer::detail
