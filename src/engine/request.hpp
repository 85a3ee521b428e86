// request.hpp (internal) — a request's record and a batch's record inside the engine.
//
// Life of a request (Stage): submitting → queued → running → (retry_wait → queued → running)* →
// terminal. Every change of stage is a compare-and-swap, and changes out of `submitting` and
// `queued` happen under the queue mutex (the batcher moves queued → running under it too), so
// exactly one party ends a request: completion, deadline, cancel, retry exhaustion or shutdown.
// The loser of a race does nothing (a late result is counted and dropped).
//
// `submitting` is the window between a request becoming visible (the id API registers it in the
// result store first) and its acceptance. Whatever ends it there (cancel(id)) does not end it:
// it records the reason in `refusal`, and accept() refuses the request with it, so the request
// is never accepted, never counted as submitted, and takes no place in the ordered-delivery
// sequence (its submit returns the error).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"

namespace asyncinfer::detail {

enum class Stage : std::uint8_t {
  submitting,
  queued,
  running,
  retry_wait,
  completed,
  failed,
  timed_out,
  cancelled,
  shut_down,
};

inline bool is_final(Stage s) noexcept { return s >= Stage::completed; }

inline RequestState to_state(Stage s) noexcept {
  switch (s) {
    case Stage::submitting:
    case Stage::queued:
    case Stage::retry_wait:
      return RequestState::pending;
    case Stage::running:
      return RequestState::running;
    case Stage::completed:
      return RequestState::completed;
    case Stage::failed:
      return RequestState::failed;
    case Stage::timed_out:
      return RequestState::timed_out;
    case Stage::cancelled:
      return RequestState::cancelled;
    case Stage::shut_down:
      return RequestState::shut_down;
  }
  return RequestState::unknown;
}

/// The terminal stage for an error code.
inline Stage stage_for_error(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::deadline_exceeded:
      return Stage::timed_out;
    case StatusCode::cancelled:
      return Stage::cancelled;
    case StatusCode::aborted:
      return Stage::shut_down;
    default:
      return Stage::failed;
  }
}

struct Batch;

struct Request {
  std::uint64_t seq = 0;  ///< submit order, engine-wide
  std::string id;         ///< id-based API only
  Inputs inputs;
  std::int64_t rows = 1;        ///< dim 0 (batch rows this request brings)
  std::uint64_t shape_key = 0;  ///< hash of dtypes and non-batch dims (batch compatibility)
  int level = 0;                ///< 0-based priority level, 0 = highest
  std::string tag;
  std::string sequence_key;
  std::uint64_t order_seq = 0;

  Clock::time_point submitted{};
  Clock::time_point enqueued{};  ///< this attempt's entry into the queue
  Clock::time_point deadline = Clock::time_point::max();

  std::atomic<Stage> stage{Stage::submitting};
  /// Set while `submitting` by whoever would have ended it; accept() refuses with it. Under the
  /// queue mutex.
  std::optional<Status> refusal;
  std::atomic<int> attempts{0};  ///< executions so far (read by the deadline message too)
  bool solo = false;  ///< run alone (a failed batch is being split); under the queue mutex
  Status last_error;  ///< the last failed attempt's error; under timer_mu

  // Sink: a promise (future and id APIs) or a callback.
  std::optional<Promise<Outputs>> promise;
  std::shared_ptr<FutureState<Outputs>> future_state;  ///< id API: what result() waits on
  Engine::Callback callback;
  bool has_callback = false;

  // Timers and last_error, guarded by timer_mu (armed, disarmed and read from different threads).
  std::mutex timer_mu;
  TimerId deadline_timer;
  TimerId retry_timer;

  std::weak_ptr<Batch> batch;  ///< while running

  // Intrusive queue links, guarded by the queue mutex.
  Request* prev = nullptr;
  Request* next = nullptr;
  bool in_queue = false;
  std::shared_ptr<Request> queue_ref;  ///< keeps a queued request alive
};

/// One batch on a worker's stream.
struct Batch {
  std::vector<std::shared_ptr<Request>> requests;
  std::int64_t rows = 0;
  int worker = 0;
  std::uint64_t generation = 0;  ///< of the worker's stream when launched
  std::shared_ptr<BatchIO> io;
  std::vector<Tensor> host_outputs;  ///< device → host copies (non-unified devices)
  std::stop_source stop;
  std::atomic<int> live{0};       ///< requests not yet ended early
  std::atomic<bool> done{false};  ///< completion point handled (vs the watchdog)
  /// Counted in its worker's batches on the stream (launched, completion point not yet run).
  std::atomic<bool> on_stream{false};
  Clock::time_point compute_start{};
  TimerId watchdog;
  std::mutex watchdog_mu;
};

/// Whether two requests may share a batch: same number of inputs, dtypes and non-batch dims.
bool batch_compatible(const Request& a, const Request& b) noexcept;
/// Hash of dtypes and non-batch dims.
std::uint64_t compute_shape_key(const Inputs& inputs, bool batched) noexcept;

}  // namespace asyncinfer::detail
