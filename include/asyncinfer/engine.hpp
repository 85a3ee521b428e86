// engine.hpp — the inference engine: the article's §1–§5 as one coherent object.
//
// A request is submitted and the call returns at once; completion arrives as a future (§2.2), a
// callback (§2.1), or a result fetched by request id (§3.1). Inside:
//
//   submit ─► bounded priority queue ─► workers (each: one stream, one model instance, up to
//   max_inflight_per_worker batches queued on its stream) ─► stream completion point (host
//   function on the completion executor) ─► future / callback / result store
//
//   (On a device that can run a stream on the caller's thread — DeviceCapabilities::
//   caller_run_streams, the cpu device — and with no hang watchdog, the worker runs its batch and
//   the completion point itself: the request crosses two threads, submitter → worker →
//   completion thread.)
//
//   - Queue: bounded (queue_capacity); priority levels 1..N (1 highest), FIFO within a level;
//     optional aging promotes a request that has waited longer than `priority_aging` to the top
//     level. When full: reject at once (resource_exhausted) or block the producer up to
//     submit_timeout (queue_full_policy).
//   - Dynamic batching (after Triton's dynamic batcher): a worker with a free in-flight slot takes
//     shape-compatible requests (same dtypes and non-batch dims, those of ragged inputs aside) in
//     priority order up to the max batch size, passing over the others. With max_queue_delay > 0
//     it waits — a timed wait, never a poll — until the earliest of: the batch cannot grow, a
//     request was passed over (it is not held back by the delay), the requests in order make a
//     preferred batch size, the oldest request has waited max_queue_delay, or a request's
//     deadline is near. Inputs are concatenated along dim 0
//     (a single request's tensors are used as they are; a model that takes requests apart gets
//     each request's own); outputs are split back as views. Where batching is off, a model that
//     runs each request alone (Model::coalesced_requests: the python backend) gets the requests
//     already queued in one launch, coalesced, not batched; a coalesced launch that fails runs
//     its requests again, each alone.
//   - Deadlines (RequestOptions::timeout/deadline, EngineOptions::default_timeout): cover queue,
//     execution and retries; fired by the deadline timer whether or not the queue is touched. A
//     queued request leaves the queue at once; a running one resolves timed_out at once, its
//     batch's stop token fires when all its requests have ended (cancellable backends stop), and
//     a late result is discarded and counted (late_completions).
//   - Cancellation: cancel(id) and Future::cancel(), same paths as deadlines.
//   - Failure: RetryPolicy (policy.hpp) for retryable codes, with backoff waits on the timer; a
//     batch that fails with a non-retryable error is re-run request by request
//     (split_failed_batches) so one bad request fails alone; per-worker circuit breaker; a hang
//     watchdog that fails a batch whose completion point is not reached in time and recycles the
//     worker (new stream, new model instance; the old ones are destroyed off the hot path).
//   - Admission control (optional): reject at submit when the predicted wait (queue depth ×
//     recent service time per request ÷ workers) already exceeds the request's deadline.
//   - Ordered delivery (optional): results reach futures and callbacks in submit order, per
//     sequence key when one is given (so one slow client does not hold up the others). A request
//     takes its place in that order when it is accepted; one that ends before (cancel(id) while
//     its submit still waits for room, a deadline that passes meanwhile, shutdown) is refused —
//     its submit returns the error — and takes no place, so it can never hold up its key.
//   - Worker recovery (RecoveryOptions, policy.hpp): bounded replacement attempts with backoff; a
//     worker that cannot get a model instance is reported unhealthy (health(), metrics()); with
//     none left, queued requests and new submits fail `unavailable` naming the cause. Each change
//     of a worker's health, and the start of shutdown, is pushed to
//     EngineOptions::on_health_change.
//   - Time: every duration and time point taken here may be `max()` for "no limit" (an option
//     holding `max()` of its own type; functions take any unit); nothing overflows
//     (detail/chrono.hpp). Messages go through the log hook (log.hpp).
//
// Guarantees (docs/design.md): every accepted request ends in exactly one terminal state
// (completed, failed, timed_out, cancelled, shut_down); its future is fulfilled once and its
// callback runs once, on the completion executor, with no engine lock held (a callback may submit
// or wait on other futures, except, with ordered delivery, on a later request of its own key: see
// EngineOptions::ordered_delivery); a request refused at submit gets its error synchronously and is
// never half-registered; threads are fixed by the options; queue, in-flight window and result
// store are bounded; after submit returns the caller may reuse its input buffers (the engine holds
// reference-counted tensors — do not write into a tensor you submitted; pass a copy if you must).
//
// Thread safety: every member function may be called from any thread, including from callbacks
// (except shutdown() and the destructor, which must not be called from a callback: they wait for
// the completion executor that runs it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/device.hpp"
#include "asyncinfer/execution_gate.hpp"
#include "asyncinfer/future.hpp"
#include "asyncinfer/metrics.hpp"
#include "asyncinfer/model.hpp"
#include "asyncinfer/policy.hpp"
#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer {

using Inputs = std::vector<Tensor>;
using Outputs = std::vector<Tensor>;

/// Where a request is in its life. The last five are terminal.
enum class RequestState : std::uint8_t {
  unknown,  ///< no such id (status() only)
  pending,  ///< queued, or waiting to retry
  running,  ///< in a batch on a worker's stream
  completed,
  failed,
  timed_out,
  cancelled,
  shut_down,
};
std::string_view to_string(RequestState state) noexcept;
std::ostream& operator<<(std::ostream& os, RequestState state);
bool is_terminal(RequestState state) noexcept;

/// When a request's phases began, as the engine saw them (Triton's trace activities): filled by
/// the engine at the completion point of the batch the request ran in, before the request ends,
/// for a request that completes successfully; zero for a phase it did not reach. Times are
/// Clock (steady_clock) nanoseconds since its epoch. The engine writes each field once with a
/// relaxed store; a reader that saw the request's result sees them (the result is published
/// after them). Shared so that a request ended meanwhile (deadline, cancel) by another thread
/// never leaves the engine writing into freed memory.
struct RequestTimeline {
  std::atomic<std::int64_t> queue_start_ns{0};           ///< entered the queue (last attempt)
  std::atomic<std::int64_t> compute_start_ns{0};         ///< its batch taken from the queue
  std::atomic<std::int64_t> compute_input_end_ns{0};     ///< the batch's inputs gathered
  std::atomic<std::int64_t> compute_output_start_ns{0};  ///< the batch's completion point
  std::atomic<std::int64_t> compute_end_ns{0};           ///< outputs split and handed over
};

/// Per-request options.
struct RequestOptions {
  /// Priority level, 1 = highest … EngineOptions::priority_levels; 0 = the engine's default.
  int priority = 0;
  /// Time allowed from submit to the terminal state (queue + execution + retries). max(): none.
  std::optional<std::chrono::microseconds> timeout;
  /// Absolute deadline; when both are given the earlier applies. time_point::max(): none.
  std::optional<Clock::time_point> deadline;
  /// With ordered delivery: results are ordered within each key (empty = one shared order).
  std::string sequence_key;
  /// Free text echoed in error messages (e.g. a client or trace id).
  std::string tag;
  /// The completion callback (submit with a callback, or on_complete()/then() on the returned
  /// future) only hands the result over to another executor (Asio's post to a strand, a queue
  /// push): it does not block, does not call into this engine, and returns within microseconds.
  /// It then runs on the thread that ends the request (the worker at the batch's completion
  /// point, the deadline timer, a cancelling caller, or shutdown) instead of being posted to the
  /// completion executor: one thread hand-off fewer per request (Asio's dispatch against post).
  /// It still runs exactly once, but where it runs the engine may hold a lock of its own (the
  /// caller-run stream's, on the inline path; shutdown's, when shutdown cancels it): a callback
  /// that called into the engine could deadlock there. Ignored with ordered delivery, whose
  /// callbacks always run on the completion executor, in order. The HTTP front end sets it: its
  /// callbacks post to the connection's I/O thread (at one connection, server-side p50 77 → 37 us:
  /// docs/performance.md).
  bool inline_callback = false;
  /// Caller runs: 0 (the default) never. Otherwise submit may run the request itself, on the
  /// calling thread, instead of waking a worker, when all of these hold at acceptance:
  ///   - the engine runs on the inline path (a cpu device with no hang watchdog: each batch runs
  ///     on a worker's own thread, with no stream thread);
  ///   - a worker is asleep waiting for work (not spinning, not running a batch) and nothing is
  ///     queued, so a worker would take this request alone and at once;
  ///   - no max_queue_delay is configured (a batcher waiting for company is not bypassed), and
  ///     the model is not decoupled (its on_response may block for back-pressure);
  ///   - the model supports it (Model::supports_caller_runs: builtin models without a cost read
  ///     from the input; not libtorch, not python);
  ///   - the model's recent batches took at most this long to compute (a moving average of the
  ///     compute time per batch, weight 1/8; nothing runs on the caller before the first batch
  ///     completed).
  /// It then runs as that worker would run it, with that worker's stream and model instance,
  /// while the worker stays asleep (it cannot take work until the request's batch has ended).
  /// Everything else holds: deadlines, cancellation, statistics, retries, the breaker. submit
  /// then returns after the model ran, and after the completion callback ran when it is inline
  /// (inline_callback); a future is then ready, unless the batch failed and the request waits
  /// for a retry. Two cross-thread wake-ups fewer per request where requests arrive one at a
  /// time: the HTTP front end sets it for its I/O threads (`--http-caller-run-us`). The average
  /// is a prediction: one caller run that takes longer than 16 × this and 10 ms turns caller
  /// runs off for the engine's life, with a warning in the log.
  std::chrono::microseconds caller_run_max_compute{0};
  /// Decoupled models (ModelSignature::decoupled), where it is required: receives each response
  /// the model sends before the final one, in the order sent, one host tensor per signature
  /// output with this request's rows. The completion (future or callback) then carries the final
  /// response, whose outputs may be empty (the final flag alone), and is delivered only after any
  /// call of on_response in progress has returned: no response follows the final one. It runs on
  /// the model's thread while the batch runs, and may block to apply back-pressure (the model's
  /// send waits; a watchdog counts that time), but then it must also wait on `stop`, which fires
  /// when the request ends (cancelled, timed out, shut down), and return at once when it does. It
  /// must not call into this engine. A non-ok return says the receiver is gone: the model's send
  /// returns it. A decoupled request runs once: no retry, no split of a failed batch, no re-run
  /// on a replaced stream (its client may hold part of an answer); it fails instead.
  std::function<Status(Outputs, std::stop_token stop)> on_response;
  /// Stateful models (EngineOptions::sequence_batching), where it is required: the sequence this
  /// request belongs to. Refused (invalid_argument) on an engine without sequence batching.
  std::optional<SequenceFlags> sequence;
  /// Handed to the model with the request (BatchIO::contexts): its id, parameters and callers.
  /// Null (the default) = none; costs nothing then.
  std::shared_ptr<const RequestContext> context;
  /// Filled with the request's phases (RequestTimeline) when not null: the server's traces ask
  /// for it for sampled requests only. Null (the default) costs one branch per request.
  std::shared_ptr<RequestTimeline> timeline;
};

/// The largest batch the engine forms for a batched model that sets no limit of its own
/// (ModelSignature::batch_limit unset) when BatchingOptions::max_batch_size is unset.
inline constexpr std::int64_t kDefaultMaxBatchSize = 64;

/// Dynamic batching (Triton: max_batch_size, preferred_batch_size, max_queue_delay_microseconds;
/// Ray Serve: max_batch_size, batch_wait_timeout_s).
struct BatchingOptions {
  /// The largest batch the engine forms, in rows (the sum of the requests' dim 0): Triton's
  /// dynamic batcher's and Ray Serve's max_batch_size, not a model config's (whose 0 means "no
  /// batch dim"; docs/design.md, "Batch sizes"). The one rule, which every face of asyncinfer
  /// follows (the CLI's --max-batch-size, Python's Engine(max_batch_size=), the server):
  ///   unset (default)  the model's ModelSignature::batch_limit, or kDefaultMaxBatchSize (64)
  ///                    when the model sets no limit;
  ///   N >= 1           N; 1 turns batching off. Engine::create refuses (invalid_argument) an N
  ///                    above the model's batch limit rather than lower it silently, and an N
  ///                    below 1.
  /// Unbatched models (ModelSignature::batched false) always run one request per call; the value
  /// is then ignored. Engine::options() reports the value in effect: always set, 1 for
  /// unbatched models.
  std::optional<std::int64_t> max_batch_size;
  /// Batch sizes to prefer (Triton's preferred_batch_size): the longest run of queued requests,
  /// in order from the first, whose rows make one is dispatched at once; a batch that the next
  /// request would carry past the largest one goes at once as it is.
  std::vector<std::int64_t> preferred_batch_sizes;
  /// Longest a worker holds a forming batch waiting for more requests. 0 = take what is queued;
  /// max() = until the batch is full or a preferred size is reached (or a deadline nears).
  std::chrono::microseconds max_queue_delay{0};
  /// Re-run a batch that failed with a non-retryable error one request at a time.
  bool split_failed_batches = true;
};

enum class QueueFullPolicy : std::uint8_t {
  reject,  ///< resource_exhausted at once
  block,   ///< wait for space up to submit_timeout, then resource_exhausted
};

enum class ShutdownMode : std::uint8_t {
  drain,   ///< finish queued and running work, then stop
  cancel,  ///< resolve queued and running work as shut_down at once, then stop
};

/// A worker's health (Engine::health(), WorkerMetrics::health).
enum class WorkerHealth : std::uint8_t {
  healthy,     ///< serving
  recovering,  ///< replacing its stream and model instance after a hang (maybe after a failed try)
  paused,      ///< takes no work until abandoned work ends (RecoveryOptions)
  unhealthy,   ///< gave up: no model instance after RecoveryOptions::max_recycle_attempts
};
std::string_view to_string(WorkerHealth health) noexcept;

struct WorkerStatus {
  int index = 0;
  WorkerHealth health = WorkerHealth::healthy;
  std::string reason;  ///< why it is not healthy (the last error); empty when healthy
};

/// What a liveness or readiness probe needs (KServe / Triton: server live, model ready).
struct EngineHealth {
  bool live = true;    ///< shutdown() has not begun
  bool ready = false;  ///< live, and at least one worker is healthy: a submit can be served now
  std::string reason;  ///< why not ready; empty when ready
  std::vector<WorkerStatus> workers;
};

/// A control input the engine makes for each request of a sequence (Triton's
/// sequence_batching.control_input): the model reads it as an ordinary input, one element per
/// request (shape [1, 1] in a batched model's request, so [rows, 1] in its batch; [1] unbatched).
struct SequenceControl {
  enum class Kind : std::uint8_t {
    start,   ///< CONTROL_SEQUENCE_START: true on the sequence's first request
    end,     ///< CONTROL_SEQUENCE_END: true on its last
    ready,   ///< CONTROL_SEQUENCE_READY: true where the row holds a request (always, here: rows
             ///< without a request are never sent)
    corrid,  ///< CONTROL_SEQUENCE_CORRID: the correlation ID, of `dtype`
  };
  Kind kind = Kind::start;
  std::string input;  ///< the model input it fills
  /// start, end, ready: i32, f32 or boolean (Triton's int32_false_true, fp32_false_true,
  /// bool_false_true). corrid: u64, i64, u32, i32 (an integer ID) or bytes (either kind of ID).
  DType dtype = DType::i32;
  double false_value = 0;
  double true_value = 1;
};

/// Implicit state (Triton's sequence_batching.state): the model's output `output` for request i
/// of a sequence is its input `input` for request i + 1, kept by the engine with the sequence
/// (a view of the output, no copy) and dropped with it. The first request of a sequence gets
/// `initial` (zeros of `dims` when unset).
struct SequenceState {
  std::string input;
  std::string output;
  DType dtype = DType::f32;
  Shape dims;  ///< without the batch dim
  std::optional<Tensor> initial;
};

/// Sequence batching for stateful models (Triton's sequence_batching; docs/design.md,
/// "Sequences"). Every request carries RequestOptions::sequence. A sequence is bound to one slot
/// of one worker (its model instance) when its first request arrives, and keeps it until its END
/// request has run or it has been idle for max_sequence_idle; its requests run there in the
/// order they were submitted, one at a time. A new sequence waits in a backlog while no slot is
/// free, and takes the first slot freed. A worker's batch holds the next request of each of its
/// slots' sequences that has one waiting (at most max batch size rows), slots in order.
struct SequenceBatchingOptions {
  enum class Strategy : std::uint8_t {
    direct,  ///< Triton's direct: slots_per_worker = the max batch size
    oldest,  ///< Triton's oldest: slots_per_worker = max_candidate_sequences
  };
  Strategy strategy = Strategy::direct;
  /// Slots (live sequences) per worker; 0 = the engine's max batch size (1 unbatched).
  int slots_per_worker = 0;
  /// A sequence with no request for this long loses its slot (Triton's
  /// max_sequence_idle_microseconds, default 1 s); its next request then needs START again.
  std::chrono::microseconds max_sequence_idle{1'000'000};
  std::vector<SequenceControl> controls;
  std::vector<SequenceState> states;
  /// The model's name in errors (Triton's wording: "... to model 'M' ..."); empty = the
  /// model's own (Model::name()).
  std::string model_name;
};

struct EngineOptions {
  /// Workers; each owns one stream and one model instance (the article's §3.2 consumers).
  /// 0 = auto: the model's own preference where it has one (Model::preferred_instances: OpenVINO's
  /// optimal number of infer requests), else for a model whose work runs on host cores
  /// (Model::uses_host_cores: libtorch on cpu or sim) one worker per core available to the
  /// process (sched_getaffinity); otherwise 1; at most 16. Engine::options() reports the number
  /// chosen. (Like OpenVINO's throughput hint: many single-thread streams rather than one wide one,
  /// which degrades gracefully when another process takes a core; docs/models.md, "Threads".)
  int workers = 0;
  /// Batches queued on a worker's stream ahead of completion, so the host prepares the next
  /// batch while the device runs the current one. On the cpu device (DeviceCapabilities::
  /// caller_run_streams) with no `watchdog`, the
  /// worker runs each batch itself on its own thread (a cpu stream has no device to overlap
  /// with, and the hand-off to a stream thread costs a wake-up per batch), so one at a time,
  /// unless the model says it overlaps batches (Model::pipelined_batches: a Python model's
  /// process), which also raises this to the number it asks for.
  int max_inflight_per_worker = 2;
  /// Requests waiting in the queue (retries waiting for their backoff do not count).
  std::size_t queue_capacity = 4096;
  QueueFullPolicy queue_full_policy = QueueFullPolicy::reject;
  /// With `block`: the longest a submit waits for room (max(): as long as it takes). A request
  /// whose deadline passes first is refused with deadline_exceeded.
  std::chrono::microseconds submit_timeout{1'000'000};
  /// Threads that run completion callbacks and fulfil futures.
  int completion_threads = 1;
  /// How long an engine thread stays awake, spinning, for its next piece of work before it
  /// sleeps: a worker that finds the queue empty, and a completion thread that finds nothing to
  /// run, while at most one request per worker is undelivered (in flight, or its callback not
  /// yet run). At one request in flight this
  /// saves the two futex wake-ups a request otherwise costs (tens of µs each when they cross
  /// vCPUs on a virtual machine); a thread whose spins keep running out stops spinning for a
  /// while, so a server whose next request is a network round trip away spends little on it.
  /// 0 = never spin (sleep at once); an engine created on a thread allowed fewer than 2 cores
  /// never spins (Engine::options() then says 0). At most 1,000 µs; values near that cost
  /// latency where busy threads outnumber the cores (many engines, a loaded host), since a
  /// spinner holds a core until its budget runs out. Source: src/core/spin_wait.hpp.
  std::chrono::microseconds spin_wait{10};
  /// Priority levels 1..priority_levels; requests without one get default_priority.
  int priority_levels = 3;
  int default_priority = 2;
  /// 0 = off. Otherwise a request that has waited this long is served as if at level 1
  /// (max(): never).
  std::chrono::microseconds priority_aging{0};
  BatchingOptions batching;
  /// Results reach futures and callbacks in submit order (per sequence key). A callback of an
  /// ordered request (or a continuation of its future) cannot wait for a LATER request of the
  /// same key: that request is delivered only after the callback returns. Such a wait returns at
  /// once instead of never: Future::get() and Engine::result() give failed_precondition naming
  /// both requests and the key, Future::wait_for()/wait_until() return false and wait() returns
  /// with the result unset; the later request is delivered as usual once the callback returns.
  /// The check covers the engine's own futures (submit, try_submit) and ids (result), not a
  /// future derived from them with then() or when_all(), whose wait blocks up to its timeout.
  /// Waiting for other keys, or on unordered engines, is fine.
  bool ordered_delivery = false;

  /// Default request timeout (none when unset or max()). A request may only shorten it unless
  /// allow_timeout_override is set (Triton's rule).
  std::optional<std::chrono::microseconds> default_timeout;
  bool allow_timeout_override = false;
  /// Reject at submit when the predicted wait already exceeds the request's deadline.
  bool admission_control = false;
  RetryPolicy retry;
  CircuitBreakerOptions breaker;
  /// 0 = off. A batch whose completion point is not reached within this time fails with
  /// deadline_exceeded and its worker is recycled (see `recovery`). On cpu a watchdog makes each
  /// batch run on its stream's thread, not on the worker's (max_inflight_per_worker), so that a
  /// hung model leaves the worker free to replace it. A coalesced launch
  /// (Model::coalesced_requests) gets this time for each of its requests.
  std::chrono::milliseconds watchdog{0};
  /// Bounded replacement of a worker's stream and model instance, and of abandoned work.
  RecoveryOptions recovery;
  /// Told when EngineHealth::ready may have changed, so that a server can push its readiness
  /// instead of asking for it on a timer: a worker's health changed (the hang watchdog took it
  /// out to be recycled, a recycle succeeded, it gave up, abandoned work it waited for ended) or
  /// shutdown began (live turns false). A hint, not the state: it may come when ready did not
  /// flip; health() gives the value. Runs on the engine's thread that made the change (the
  /// deadline timer, a worker, a reaper) or on the thread calling shutdown(), with no engine
  /// lock held: it may call health() and metrics(). Within shutdown() it runs inside that call,
  /// so it must not call shutdown() nor destroy the engine. Must not block (it holds up that
  /// thread: the timer's deadlines, a worker's recovery); an exception from it is reported on
  /// the log hook and dropped. Empty: none.
  std::function<void()> on_health_change;

  /// Result store of the id-based API: finished entries beyond capacity are evicted oldest
  /// first; finished entries older than result_ttl expire (max(): only capacity evicts).
  std::size_t result_store_capacity = 65536;
  std::chrono::milliseconds result_ttl{60'000};

  /// Threads one model instance may use for one forward pass (libtorch intra-op threads).
  /// 0 = auto: 1. An OpenMP team of several threads waits at every parallel region for its
  /// slowest thread, and collapses (40× on 2 cores) when another process takes one of their cores;
  /// parallelism comes from workers instead. Set it for the latency of one large forward pass on
  /// a machine of your own (docs/faq.md: OpenMP oversubscription). Engine::options() reports it.
  int intra_op_threads = 0;
  /// How long shutdown(drain) — and so the destructor — waits for queued and running work
  /// before it falls back to cancel, so that a hung model cannot make shutdown hang (max(): it
  /// waits for the work as long as it takes).
  std::chrono::milliseconds drain_timeout{30'000};
  /// Abandons Engine::create while it makes the workers' model instances (a model server's load
  /// that timed out, or was unloaded or shut down meanwhile): handed to each instance's creation
  /// (InstanceOptions::stop), so that a backend whose creation may take long (a Python model's
  /// initialize()) ends it; create() then fails with that instance's error (cancelled). Only the
  /// first instances of create() see it, never the recycled ones. Default: never fires.
  std::stop_token create_stop;
  /// Stateful models: sequence batching (see SequenceBatchingOptions). The inputs its controls
  /// and states fill, and its states' outputs, are the model's own: submits leave them out
  /// (Engine::request_signature) and results do not carry the state outputs. Replaces dynamic
  /// batching; no retries (a stateful step runs once); ordered delivery per sequence (each
  /// sequence's results reach their futures and callbacks in its order).
  std::optional<SequenceBatchingOptions> sequence_batching;
  /// A gate every batch passes before the model runs it (execution_gate.hpp): a model server's
  /// rate limiter, shared by the engines of several models. Owned outside the engine (this is a
  /// share of it); it must stay valid while the engine runs. Null (the default): none, and the
  /// hot path costs one pointer test per batch. With a gate no request runs on its submitting
  /// thread (RequestOptions::caller_run_max_compute is ignored).
  std::shared_ptr<ExecutionGate> execution_gate;
};

class EngineCore;

/// The engine. Create with Engine::create; destroying it calls shutdown(drain).
class Engine {
 public:
  using Callback = detail::UniqueFunction<void(const Result<Outputs>&)>;

  /// Starts `options.workers` workers of `model` on `device`. invalid_argument names a bad
  /// option; model instance creation errors are passed on (e.g. unavailable for a model that
  /// cannot run on that device).
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<Model> model,
                                                std::shared_ptr<Device> device,
                                                EngineOptions options = {});
  /// `options` with the automatic values filled in as create() would (workers,
  /// intra_op_threads). Does not validate them.
  static EngineOptions resolve_options(const Model& model, const Device& device,
                                       EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Synchronous inference (the article's §1.1): submits and blocks until the terminal state.
  /// `inputs`: one host tensor per model input (validate_inputs rules).
  Result<Outputs> infer(Inputs inputs, const RequestOptions& options = {});

  /// Asynchronous inference (§2.2). Never blocks (except with QueueFullPolicy::block). A refused
  /// request returns a future that is already complete with the reason.
  [[nodiscard]] Future<Outputs> submit(Inputs inputs, const RequestOptions& options = {});

  /// As submit(inputs, options), but a refused request returns its error here instead of a
  /// ready future. Use it where a refusal must be told apart from a request that was accepted
  /// and has already ended (a fast request's future may be complete, with an error, by the time
  /// submit returns: it ran, and a decoupled one may have sent responses). Never blocks (except
  /// with QueueFullPolicy::block). Thread-safe.
  [[nodiscard]] Result<Future<Outputs>> try_submit(Inputs inputs,
                                                   const RequestOptions& options = {});

  /// Asynchronous inference with a callback (§2.1). The callback runs exactly once on the
  /// completion executor with the result; ok means accepted. When refused, the error is returned
  /// here and the callback is destroyed without being called.
  Status submit(Inputs inputs, Callback callback, const RequestOptions& options = {});

  /// Id-based API (§3.1): submit under `id`. already_exists while a request with that id is
  /// pending or running; resource_exhausted when the result store holds `capacity` live requests.
  Status submit(std::string id, Inputs inputs, const RequestOptions& options = {});
  /// Blocks (on a condition, never polling) until the request `id` ends or `timeout` passes
  /// (deadline_exceeded; the request goes on). not_found for an unknown id, or one that expired
  /// or was evicted (the message says which). Does not remove the entry (see release()).
  Result<Outputs> result(std::string_view id,
                         std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());
  /// The same with a timeout in any unit, converted saturating (milliseconds::max() = no limit).
  template <class Rep, class Period>
  Result<Outputs> result(std::string_view id, std::chrono::duration<Rep, Period> timeout) {
    return result(id, detail::saturating_cast<std::chrono::nanoseconds>(timeout));
  }
  /// The request's state; unknown for an unknown, expired or evicted id. Never blocks.
  RequestState status(std::string_view id) const;
  /// Cancels request `id`: a queued request leaves the queue at once; a running one resolves
  /// cancelled at once (its work is stopped where the backend can). not_found for an unknown
  /// id; failed_precondition when it has already ended.
  Status cancel(std::string_view id);
  /// Forgets a finished request's entry now instead of at TTL expiry. failed_precondition while
  /// it is still pending or running.
  Status release(std::string_view id);

  /// Stops the engine (docs/design.md, guarantee 5): submits are rejected from now on; drain
  /// finishes queued and running work (switching to cancel once `drain_timeout` passes; default
  /// EngineOptions::drain_timeout); cancel resolves it as shut_down at once. Wakes every waiter,
  /// joins every thread. Idempotent. Blocks; bounded by the drain timeout plus the time running
  /// work that cannot be cancelled takes to finish.
  void shutdown(ShutdownMode mode = ShutdownMode::drain,
                std::optional<std::chrono::milliseconds> drain_timeout = std::nullopt);
  /// The same with a drain timeout in any unit, converted saturating (max() = no limit).
  template <class Rep, class Period>
  void shutdown(ShutdownMode mode, std::chrono::duration<Rep, Period> drain_timeout) {
    shutdown(mode, std::optional<std::chrono::milliseconds>(
                       detail::saturating_cast<std::chrono::milliseconds>(drain_timeout)));
  }

  /// Liveness and readiness (for a server's health endpoints). Never blocks on requests.
  EngineHealth health() const;
  EngineMetrics metrics() const;
  const ModelSignature& signature() const noexcept;
  /// What a request brings and what its result holds: signature() without the inputs that
  /// sequence batching fills (controls, states) and without the state outputs. signature() on
  /// other engines.
  const ModelSignature& request_signature() const noexcept;
  /// The options in use: as given to create(), with batching.max_batch_size set to the largest
  /// batch the engine forms (BatchingOptions::max_batch_size's rule; 1 for unbatched models).
  const EngineOptions& options() const noexcept;
  Device& device() const noexcept;

 private:
  explicit Engine(std::shared_ptr<EngineCore> core);
  std::shared_ptr<EngineCore> core_;
};

}  // namespace asyncinfer
