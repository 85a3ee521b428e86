// BatchFailure (batch_failure.hpp): a failed batch (worker.cpp's completion point, the watchdog,
// a recycle) split so that one bad request fails alone, its requests put back in the queue,
// retried after their backoff or ended; failures that arrive after their requests had ended (late
// failures), counted and logged, rate-limited; and the end of everything waiting when the last
// worker gave up.
#include "engine/batch_failure.hpp"

namespace asyncinfer::detail {

BatchFailure::BatchFailure(const EngineOptions& options, const SequencePlan* sequence_plan,
                           Scheduler& scheduler, Resolver& resolver, DeadlineTimer& timer,
                           EngineCounters& counters)
    : opt_(options),
      sequence_plan_(sequence_plan),
      scheduler_(scheduler),
      resolver_(resolver),
      timer_(timer),
      counters_(counters) {}

void BatchFailure::batch_failed(const std::shared_ptr<Batch>& batch, const Status& st) {
  std::vector<std::shared_ptr<Request>> live;
  std::size_t ended = 0;
  const Request* first_ended = nullptr;
  for (const auto& r : batch->requests) {
    const Stage at = r->stage.load(std::memory_order_acquire);
    if (at == Stage::running) {
      live.push_back(r);
    } else if (detail::is_final(at)) {
      if (ended++ == 0) first_ended = r.get();
    }
  }
  if (ended > 0 && !own_stop(*batch, st)) late_failure(ended, st, *first_ended);
  const StatusCode code = st.code();
  if (sequence_plan_ != nullptr) {
    // A sequence's request runs once (its model's state may have moved on): each fails with
    // the batch's error; its sequence goes on with its next request.
    for (const auto& r : live) fail_alone(r, st);
    return;
  }
  // Coalesced requests (Model::coalesced_requests) shared a launch only because they came
  // together: one that fails it (its process crashed, hung, or answered out of shape) must not
  // fail the others, which run again, each alone.
  const bool coalesced = batch->io != nullptr && batch->io->coalesced;
  if (live.size() > 1 && code != StatusCode::cancelled && code != StatusCode::aborted &&
      (coalesced || (opt_.batching.split_failed_batches && !opt_.retry.is_retryable(code) &&
                     code != StatusCode::deadline_exceeded))) {
    counters_.split_batches.fetch_add(1, std::memory_order_relaxed);
    requeue(live, /*solo=*/true, &st);
    return;
  }
  for (const auto& r : live) retry_or_fail(r, st);
}

void BatchFailure::fail_alone(const std::shared_ptr<Request>& r, Status s) {
  // The request is running (it was dispatched): end it here.
  const Status copy = s;
  if (!resolver_.try_resolve(r, detail::stage_for_error(s.code()), std::move(s)))
    late_failure(1, copy, *r);
}

void BatchFailure::requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo,
                           const Status* cause) {
  detail::Requeued out = scheduler_.requeue(rs, solo);
  for (auto& r : out.refused) {
    end_unservable(r, out.unavailable, "engine shut down before the request completed");
  }
  for (auto& r : out.partial) {
    fail_partial(r, cause != nullptr ? *cause : unavailable_error("its batch did not complete"));
  }
}

void BatchFailure::fail_partial(const std::shared_ptr<Request>& r, const Status& st) {
  Status s(
      st.code() == StatusCode::ok ? StatusCode::internal : st.code(),
      with_tag(r->sequence ? std::string(st.message()) +
                                 "; not run again, as a request of a sequence runs once (its "
                                 "model's state may have moved on)"
                           : std::string(st.message()) +
                                 "; not run again, as a decoupled request runs once (" +
                                 std::to_string(r->responses_sent.load(std::memory_order_relaxed)) +
                                 " of its responses were sent)",
               r->tag));
  const Status copy = s;
  if (!resolver_.try_resolve(r, detail::stage_for_error(s.code()), std::move(s)))
    late_failure(1, copy, *r);
}

void BatchFailure::end_unservable(const std::shared_ptr<Request>& r,
                                  const std::optional<Status>& unavailable, const char* shut_down) {
  if (unavailable) {
    resolver_.try_resolve(
        r, Stage::failed,
        Status(unavailable->code(), with_tag(std::string(unavailable->message()), r->tag)));
  } else {
    resolver_.try_resolve(r, Stage::shut_down, aborted_error(with_tag(shut_down, r->tag)));
  }
}

void BatchFailure::requeue_all(const std::shared_ptr<Batch>& batch) {
  std::vector<std::shared_ptr<Request>> live;
  for (const auto& r : batch->requests) {
    if (r->stage.load(std::memory_order_acquire) == Stage::running) live.push_back(r);
  }
  requeue(live, /*solo=*/false);
}

void BatchFailure::late_failure(std::size_t n, const Status& st, const Request& example) {
  counters_.count_late_failures(n, st.code());
  const Stage at = example.stage.load(std::memory_order_acquire);
  late_log_.log(LogLevel::warning,
                with_tag("engine: a failure arrived after its request had ended", example.tag) +
                    " (" + std::string(to_string(detail::to_state(at))) +
                    (n > 1 ? ", " + std::to_string(n) + " requests of one batch" : "") +
                    "): " + st.to_string());
}

void BatchFailure::late_outcome(const Batch& batch, const Status& st) {
  if (batch.requests.empty()) return;
  if (st.ok()) {
    counters_.late_completions.fetch_add(batch.requests.size(), std::memory_order_relaxed);
  } else if (!own_stop(batch, st)) {
    late_failure(batch.requests.size(), st, *batch.requests.front());
  }
}

bool BatchFailure::own_stop(const Batch& batch, const Status& st) {
  return st.code() == StatusCode::aborted ||
         (st.code() == StatusCode::cancelled && batch.stop.stop_requested());
}

void BatchFailure::retry_or_fail(const std::shared_ptr<Request>& r, const Status& st) {
  {
    std::lock_guard tl(r->timer_mu);
    r->last_error = st;
  }
  if (r->on_response) return fail_partial(r, st);  // decoupled: runs once
  const int tries = r->attempts.load(std::memory_order_relaxed);
  const detail::RetryDecision d =
      scheduler_.decide_retry(tries, st.code(), r->deadline, Clock::now());
  if (d.denied_by_budget) counters_.retries_denied.fetch_add(1, std::memory_order_relaxed);
  if (d.retry) {
    if (!scheduler_.park_for_retry(r)) {
      late_failure(1, st, *r);  // ended meanwhile (deadline, cancel)
      return;
    }
    counters_.retries.fetch_add(1, std::memory_order_relaxed);
    TimerId id = timer_.add(d.at, [this, r] { requeue_after_backoff(r); });
    std::lock_guard tl(r->timer_mu);
    r->retry_timer = id;
    return;
  }
  Status final = detail::RetryScheduler::final_status(st, tries, d.why_not, r->tag);
  const Status copy = final;
  if (!resolver_.try_resolve(r, detail::stage_for_error(final.code()), std::move(final))) {
    late_failure(1, copy, *r);  // ended meanwhile (deadline, cancel)
  }
}

void BatchFailure::requeue_after_backoff(const std::shared_ptr<Request>& r) {
  const detail::BackoffEnd end = scheduler_.requeue_after_backoff(r);
  if (end.unservable) {
    end_unservable(r, end.unavailable, "engine shut down while the request waited to retry");
  }
}

void BatchFailure::no_worker_left(const std::string& cause) {
  const Status st = unavailable_error("no worker of the engine can serve requests: " + cause);
  // Later submits are refused with `st` (blocked ones too); what waits ends with it.
  for (auto& r : scheduler_.no_workers(st)) end_unservable(r, st, "");
  scheduler_.wake_all();
}

}  // namespace asyncinfer::detail
