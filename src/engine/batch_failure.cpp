// A failed batch (worker.cpp's completion point, the watchdog, a recycle): split it so that one
// bad request fails alone, put its requests back in the queue, retry them (retry_scheduler.cpp)
// or end them; and failures that arrive after their requests had ended (late failures), counted
// and logged, rate-limited.
#include "engine/engine_context.hpp"

namespace asyncinfer::detail {

void EngineContext::batch_failed(const std::shared_ptr<Batch>& batch, const Status& st) {
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
  if (sequence_plan != nullptr) {
    // A sequence's request runs once (its model's state may have moved on): each fails with
    // the batch's error; its sequence goes on with its next request.
    for (const auto& r : live) fail_alone(r, st);
    return;
  }
  if (live.size() > 1 && opt.batching.split_failed_batches && !opt.retry.is_retryable(code) &&
      code != StatusCode::cancelled && code != StatusCode::aborted &&
      code != StatusCode::deadline_exceeded) {
    split_batches.fetch_add(1, std::memory_order_relaxed);
    requeue(live, /*solo=*/true, &st);
    return;
  }
  for (const auto& r : live) retry_or_fail(r, st);
}

void EngineContext::fail_alone(const std::shared_ptr<Request>& r, Status s) {
  // The request is running (it was dispatched): end it here.
  const Status copy = s;
  if (!resolver.try_resolve(r, detail::stage_for_error(s.code()), std::move(s)))
    late_failure(1, copy, *r);
}

void EngineContext::requeue(const std::vector<std::shared_ptr<Request>>& rs, bool solo,
                            const Status* cause) {
  detail::Requeued out = scheduler.requeue(rs, solo);
  for (auto& r : out.refused) {
    end_unservable(r, out.unavailable, "engine shut down before the request completed");
  }
  for (auto& r : out.partial) {
    fail_partial(r, cause != nullptr ? *cause : unavailable_error("its batch did not complete"));
  }
}

void EngineContext::fail_partial(const std::shared_ptr<Request>& r, const Status& st) {
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
  if (!resolver.try_resolve(r, detail::stage_for_error(s.code()), std::move(s)))
    late_failure(1, copy, *r);
}

void EngineContext::end_unservable(const std::shared_ptr<Request>& r,
                                   const std::optional<Status>& unavailable,
                                   const char* shut_down) {
  if (unavailable) {
    resolver.try_resolve(
        r, Stage::failed,
        Status(unavailable->code(), with_tag(std::string(unavailable->message()), r->tag)));
  } else {
    resolver.try_resolve(r, Stage::shut_down, aborted_error(with_tag(shut_down, r->tag)));
  }
}

void EngineContext::requeue_all(const std::shared_ptr<Batch>& batch) {
  std::vector<std::shared_ptr<Request>> live;
  for (const auto& r : batch->requests) {
    if (r->stage.load(std::memory_order_acquire) == Stage::running) live.push_back(r);
  }
  requeue(live, /*solo=*/false);
}

void EngineContext::late_failure(std::size_t n, const Status& st, const Request& example) {
  late_failures.fetch_add(n, std::memory_order_relaxed);
  {
    std::lock_guard lock(reasons_mu);
    late_failures_by_reason[std::string(to_string(st.code()))] += n;
  }
  const Stage at = example.stage.load(std::memory_order_acquire);
  late_log.log(LogLevel::warning,
               with_tag("engine: a failure arrived after its request had ended", example.tag) +
                   " (" + std::string(to_string(detail::to_state(at))) +
                   (n > 1 ? ", " + std::to_string(n) + " requests of one batch" : "") +
                   "): " + st.to_string());
}

void EngineContext::late_outcome(const Batch& batch, const Status& st) {
  if (batch.requests.empty()) return;
  if (st.ok()) {
    late_completions.fetch_add(batch.requests.size(), std::memory_order_relaxed);
  } else if (!own_stop(batch, st)) {
    late_failure(batch.requests.size(), st, *batch.requests.front());
  }
}

bool EngineContext::own_stop(const Batch& batch, const Status& st) {
  return st.code() == StatusCode::aborted ||
         (st.code() == StatusCode::cancelled && batch.stop.stop_requested());
}

}  // namespace asyncinfer::detail
