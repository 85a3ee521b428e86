// sequence_batcher.hpp (internal) — sequences for stateful models (EngineOptions::
// sequence_batching): which slot of which worker a sequence holds, the requests it has waiting,
// the backlog of sequences without a slot, and the inputs the engine adds to each request (the
// control inputs and the implicit state).
//
// After Triton's sequence batcher (server docs: user_guide/architecture.md "Stateful Models",
// user_guide/model_configuration.md "Sequence Batcher"; core: sequence_batch_scheduler.cc), with
// the engine's own threads: there is no batcher thread and no reaper thread. A sequence is bound
// to a free slot when its first request is accepted (or waits in the backlog, oldest first, for
// the next slot freed); the workers take their slots' next requests in Scheduler::next_batch, and
// free idle slots there, sleeping at most until the next idle expiry (a timed wait, not a poll).
//
// What differs from Triton, on purpose: a batch holds only the slots that have a request waiting
// (Triton's direct strategy pads the others with READY = 0 rows, so that a model keeping state in
// its own memory finds a sequence at the same row every time). Here a sequence's state lives with
// the sequence (implicit state, or keyed by the CORRID control in a Python model), never with a
// row, so the padding would only cost compute. READY is therefore 1 on every row sent.
//
// Thread safety: SequenceTable is used under the Scheduler's mutex only (every method), like the
// request queue. SequencePlan is immutable after make(). A Sequence's `state` is read and written
// only by the worker running the sequence's one request in flight; the Scheduler's mutex orders
// one request's write before the next request's read (batch_finished, then next_batch).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "engine/request.hpp"

namespace asyncinfer::detail {

/// Where each of the model's inputs and outputs comes from on a sequence engine, fixed at create.
struct SequencePlan {
  /// Per model input: >= 0 = index into the request's inputs; -1 - k = the k-th of `controls`;
  /// -1 - controls.size() - k = the k-th state.
  std::vector<int> input_source;
  /// Per model output: -1 = the request's; k >= 0 = kept as the k-th state (not returned).
  std::vector<int> output_state;
  /// What a request brings and gets: the model's signature without the control and state
  /// inputs and the state outputs (Engine::request_signature).
  ModelSignature request_signature;
  std::vector<SequenceControl> controls;
  std::vector<SequenceState> states;
  /// Each state's first value (SequenceState::initial, or zeros), one row (batch dim added).
  std::vector<Tensor> initial;
  bool batched = true;
  std::string model_name;

  /// Checks `o` against the model's signature: every control and state names a model input
  /// (state outputs: a model output) of its dtype and shape, each once, with an allowed dtype.
  /// invalid_argument names the control or state and what was expected.
  static Result<SequencePlan> make(const SequenceBatchingOptions& o, const ModelSignature& sig);

  /// The model's inputs for request `r` of its sequence: its own, its control values, and its
  /// sequence's state (the initial one on START). Allocates the small control tensors.
  Result<Inputs> model_inputs(const Request& r) const;
  /// Keeps the state outputs of `outs` (one request's rows) in the request's sequence and
  /// removes them from `outs`.
  void keep_state(Request& r, Outputs& outs) const;
};

/// One live sequence. Shared by the table and its requests (Request::sequence).
struct Sequence {
  CorrelationId id;
  std::deque<std::shared_ptr<Request>> pending;  ///< accepted, queued, in submit order
  int worker = -1;  ///< its slot: worker and index; -1 while backlogged or after release
  int slot = -1;
  bool running = false;  ///< one of its requests is in a batch
  bool closed = false;   ///< its END request was accepted (or withdrawn): no more requests join
  bool backlogged = false;
  bool released = false;             ///< its slot was freed (or it left the backlog): it is over
  Clock::time_point last_request{};  ///< the latest accepted request (idle time counts from it)
  /// Implicit state (SequencePlan::states), written by the run of each of its requests.
  std::vector<Tensor> state;
};

/// The live sequences of one engine, their slots and the backlog. Under the Scheduler's mutex.
class SequenceTable {
 public:
  SequenceTable(const SequenceBatchingOptions& o, int workers, std::int64_t max_rows);

  /// Takes accepted request `r` (Request::sequence_flags set, stage still `submitting`): finds
  /// or starts its sequence, binds a new one to a free slot or puts it in the backlog, and adds
  /// `r` to the sequence's waiting requests. A refusal (Triton's wording) when `r` is not a START
  /// and its ID has no live sequence. `now`: the time of acceptance.
  std::optional<Status> add(const std::shared_ptr<Request>& r, Clock::time_point now);

  /// The next request of each of `worker`'s slots that has one waiting and nothing running, in
  /// slot order, at most `max_rows`; each moves to running (its sequence marked). Frees idle
  /// slots first (their sequences end) and gives freed slots to the backlog. `wake`: when the
  /// next slot turns idle (time_point::max(): none).
  std::vector<std::shared_ptr<Request>> take(int worker, std::int64_t max_rows,
                                             Clock::time_point now, Clock::time_point& wake);

  /// A batch with `runs` has finished: its sequences run no more; those whose END ran are over
  /// (their slots go to the backlog). Returns whether a slot changed hands or a request waits
  /// (the workers should look again).
  bool finished(const std::vector<SequenceRun>& runs, Clock::time_point now);

  /// Takes queued request `r` out of its sequence (cancelled, timed out). When `r` waits in the
  /// backlog, `to` is timed_out and `also` is given, its whole sequence leaves the backlog
  /// (Triton: the backlog expired): the sequence's other requests are moved to `*also`, for the
  /// caller to end with backlog_expired().
  void withdraw(Request& r, Stage to, std::vector<std::shared_ptr<Request>>* also);

  /// Every waiting request, oldest sequence first.
  void append_waiting(std::vector<std::shared_ptr<Request>>& out) const;
  std::int64_t queued() const noexcept { return queued_; }

  struct Counts {
    std::int64_t live = 0;            ///< sequences with a slot or in the backlog
    std::int64_t backlog = 0;         ///< sequences waiting for a slot
    std::uint64_t idle_released = 0;  ///< slots freed by max_sequence_idle
    std::uint64_t backlog_expired = 0;
  };
  Counts counts() const;

  /// Triton's error for the requests of a backlogged sequence whose timeout expired.
  static Status backlog_expired();

 private:
  void bind(const std::shared_ptr<Sequence>& s, int worker, int slot);
  /// Frees `s`'s slot (or takes it out of the backlog), exactly once; gives the slot to the
  /// oldest backlogged sequence.
  void release(Sequence& s);
  /// Releases `s` when it is closed and has nothing waiting or running.
  void release_if_over(Sequence& s);
  void forget(const Sequence& s);  // drops its ID's entry when the entry is `s`

  const SequenceBatchingOptions& opt_;
  std::map<CorrelationId, std::shared_ptr<Sequence>> by_id_;  ///< sequences still taking requests
  /// [worker][slot]: the sequence holding it (null = free).
  std::vector<std::vector<std::shared_ptr<Sequence>>> slots_;
  std::vector<std::size_t> next_slot_;  ///< per worker: the slot take() looks at first
  std::deque<std::shared_ptr<Sequence>> backlog_;
  std::int64_t queued_ = 0;
  std::int64_t live_ = 0;
  std::uint64_t idle_released_ = 0;
  std::uint64_t backlog_expired_ = 0;
};

}  // namespace asyncinfer::detail
