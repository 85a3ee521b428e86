// request.hpp (internal) — a request's record, its life cycle, and a batch's record.
//
// Life of a request (Stage): submitting → queued → running → (retry_wait → queued → running)* →
// terminal; a running request also goes back to queued when its batch is split or its stream is
// replaced. Every change of stage goes through transition() below, which checks it against the
// table of legal transitions (kStageMoves) and makes it with one compare-and-swap, so exactly one
// party ends a request: completion, deadline, cancel, retry exhaustion or shutdown. The loser of a
// race does nothing (a late result is counted and dropped).
//
// The queue rule: every transition out of `submitting`, `queued` or `retry_wait`, and every one
// into `queued` or `retry_wait`, happens under the queue mutex, the Scheduler's (scheduler.hpp; the
// batcher moves queued → running under it too). transition() takes that lock as an argument and
// checks that it is held; only running → terminal may happen without it (transition_running()).
//
// `submitting` is the window between a request becoming visible (the id API registers it in the
// result store first) and its acceptance. Whatever ends it there (cancel(id)) does not end it:
// it records the reason in `refusal`, and accept() refuses the request with it, so the request
// is never accepted, never counted as submitted, and takes no place in the ordered-delivery
// sequence (its submit returns the error).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "asyncinfer/detail/transitions.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"
#include "engine/lifecycle.hpp"

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

/// The terminal stage for an outcome, and back.
inline Stage stage_for(Outcome o) noexcept {
  return static_cast<Stage>(static_cast<int>(Stage::completed) + static_cast<int>(o));
}
inline Outcome outcome_of(Stage terminal) noexcept {
  return static_cast<Outcome>(static_cast<int>(terminal) - static_cast<int>(Stage::completed));
}
static_assert(static_cast<int>(Stage::shut_down) - static_cast<int>(Stage::completed) ==
              static_cast<int>(Outcome::shut_down));

/// The terminal stage for an error code (outcome_for_error).
inline Stage stage_for_error(StatusCode code) noexcept {
  return stage_for(outcome_for_error(code));
}

inline constexpr int kStages = static_cast<int>(Stage::shut_down) + 1;

/// The legal transitions (the header's diagram). Terminal stages go nowhere; `submitting` only to
/// `queued` (a request ended there is refused, not ended: see `refusal`).
inline constexpr Transitions<Stage, kStages> kStageMoves{
    "request stage",
    {"submitting", "queued", "running", "retry_wait", "completed", "failed", "timed_out",
     "cancelled", "shut_down"},
    {
        {Stage::submitting, Stage::queued},
        {Stage::queued, Stage::running},
        {Stage::running, Stage::queued},
        {Stage::running, Stage::retry_wait},
        {Stage::retry_wait, Stage::queued},
        // Every stage before the end may end, with any outcome.
        {Stage::queued, Stage::completed},
        {Stage::queued, Stage::failed},
        {Stage::queued, Stage::timed_out},
        {Stage::queued, Stage::cancelled},
        {Stage::queued, Stage::shut_down},
        {Stage::running, Stage::completed},
        {Stage::running, Stage::failed},
        {Stage::running, Stage::timed_out},
        {Stage::running, Stage::cancelled},
        {Stage::running, Stage::shut_down},
        {Stage::retry_wait, Stage::completed},
        {Stage::retry_wait, Stage::failed},
        {Stage::retry_wait, Stage::timed_out},
        {Stage::retry_wait, Stage::cancelled},
        {Stage::retry_wait, Stage::shut_down},
    }};

/// Whether from → to must happen under the queue mutex (the queue rule in the header).
constexpr bool needs_queue_lock(Stage from, Stage to) noexcept {
  return from != Stage::running || to == Stage::queued || to == Stage::retry_wait;
}

struct Batch;
struct Sequence;  // sequence_batcher.hpp

/// A batch's record of a sequence one of its requests belongs to (Batch::sequences).
struct SequenceRun {
  std::shared_ptr<Sequence> sequence;
  bool end = false;  ///< the request that ran was the sequence's END
};

struct Request {
  std::uint64_t seq = 0;  ///< submit order, engine-wide
  std::string id;         ///< id-based API only
  Inputs inputs;
  std::int64_t rows = 1;        ///< dim 0 (batch rows this request brings)
  std::uint64_t shape_key = 0;  ///< hash of dtypes and non-batch dims (batch compatibility)
  /// Which inputs are ragged (TensorSpec::ragged: their non-batch dims may differ within a
  /// batch), owned by the engine; null when none is.
  const std::vector<bool>* ragged = nullptr;
  int level = 0;  ///< 0-based priority level, 0 = highest
  std::string tag;
  std::string sequence_key;
  std::uint64_t order_seq = 0;

  Clock::time_point submitted{};
  Clock::time_point enqueued{};  ///< this attempt's entry into the queue
  /// Since when this attempt has waited to run: set with `enqueued`, and again when a failed or
  /// stale batch puts it back (requeue keeps `enqueued`, which the batcher's ageing uses).
  Clock::time_point waiting_since{};
  /// Time spent queued, every attempt together (Triton's queue statistic). Written by the
  /// worker that dispatches it, read when it completes in that batch.
  std::uint64_t queue_ns = 0;
  Clock::time_point deadline = Clock::time_point::max();
  /// RequestOptions::caller_run_max_compute where the engine allows caller runs at all
  /// (CallerRun::bound, caller_run.hpp); 0 otherwise. Set by prepare(), read by accept().
  std::chrono::microseconds caller_run_max{0};

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
  bool inline_callback = false;  ///< RequestOptions::inline_callback (set before accept)
  /// Decoupled models: RequestOptions::on_response, and how many responses it has taken. A send
  /// holds response_mu while it checks the stage and calls on_response; ending the request fires
  /// response_stop (so a blocked on_response returns) and then takes response_mu, so the final
  /// result is delivered after any send in progress, never before one.
  std::function<Status(Outputs, std::stop_token)> on_response;
  std::atomic<std::uint64_t> responses_sent{0};
  std::mutex response_mu;
  std::stop_source response_stop{std::nostopstate};

  // Timers and last_error, guarded by timer_mu (armed, disarmed and read from different threads).
  std::mutex timer_mu;
  TimerId deadline_timer;
  TimerId retry_timer;

  std::weak_ptr<Batch> batch;  ///< while running

  /// Stateful models (EngineOptions::sequence_batching): the request's flags, and its sequence
  /// once accepted (under the queue mutex until it runs; sequence_batcher.hpp).
  std::optional<SequenceFlags> sequence_flags;
  std::shared_ptr<Sequence> sequence;
  /// RequestOptions::context (BatchIO::contexts).
  std::shared_ptr<const RequestContext> context;
  /// RequestOptions::timeline: written by the worker whose batch completes it (worker.cpp).
  std::shared_ptr<RequestTimeline> timeline;

  // Intrusive queue links, guarded by the queue mutex.
  Request* prev = nullptr;
  Request* next = nullptr;
  bool in_queue = false;
  std::shared_ptr<Request> queue_ref;  ///< keeps a queued request alive
};

/// Moves `r` from `from` to `to` if it is in `from` (one compare-and-swap); false when it is not
/// (someone else moved it first). `queue_lock` must hold the engine's queue mutex.
inline bool transition(Request& r, Stage from, Stage to,
                       const std::unique_lock<std::mutex>& queue_lock) noexcept {
  kStageMoves.check(from, to);
  if (!queue_lock.owns_lock()) kStageMoves.fail(from, to, "the queue mutex is not held");
  return r.stage.compare_exchange_strong(from, to, std::memory_order_acq_rel);
}

/// running → a terminal stage, the one transition made without the queue mutex.
inline bool transition_running(Request& r, Stage to) noexcept {
  Stage from = Stage::running;
  if (needs_queue_lock(from, to) || !kStageMoves.allows(from, to)) {
    kStageMoves.fail(from, to, "only running -> terminal may be made without the queue mutex");
  }
  return r.stage.compare_exchange_strong(from, to, std::memory_order_acq_rel);
}

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
  /// It holds its worker's turn at EngineOptions::execution_gate (given back once, when its work
  /// ends: Worker::leave_gate).
  std::atomic<bool> gate_held{false};
  Clock::time_point dispatched{};    ///< taken from the queue (Triton's compute_input starts)
  Clock::time_point inputs_ready{};  ///< inputs gathered, copies enqueued (compute_infer starts)
  Clock::time_point compute_start{};
  TimerId watchdog;
  std::mutex watchdog_mu;
  /// Sequence engines: the sequences of its requests, set when it is formed (even a request that
  /// fails in assembly leaves its sequence here), handed back in Scheduler::batch_finished.
  std::vector<SequenceRun> sequences;
};

/// A finished request and its result, waiting for delivery (ordered delivery, callback batches).
struct Pending {
  std::shared_ptr<Request> request;
  Result<Outputs> result;
};

/// Whether two requests may share a batch: same number of inputs, dtypes and non-batch dims
/// (ranks only for a's ragged inputs, Request::ragged).
bool batch_compatible(const Request& a, const Request& b) noexcept;
/// Hash of dtypes and non-batch dims (ranks only for the inputs `ragged` marks, if given).
std::uint64_t compute_shape_key(const Inputs& inputs, bool batched,
                                const std::vector<bool>* ragged = nullptr) noexcept;
/// Rows (dim 0) of a batched request: of its first input that it gives (an optional input may
/// be left out); 1 when it gives none.
std::int64_t request_rows(const Inputs& inputs) noexcept;

}  // namespace asyncinfer::detail
