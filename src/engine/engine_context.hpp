// engine_context.hpp (internal) — EngineContext: what the engine's workers share with each other
// and with EngineCore, so that a Worker (worker.hpp) needs no pointer to EngineCore.
//
// What it holds:
//   - the engine's fixed configuration (model, device, options, signature, the sequence plan, the
//     inline path), the executors a worker hands work to (the completion-point executor, the
//     deadline timer, the reaper pool), and the Scheduler and the Resolver — all by reference:
//     EngineCore owns them;
//   - two owned parts: the EngineCounters (engine_counters.hpp: the engine-wide counters,
//     histograms and Triton statistics that the workers bump and that fill EngineCore's
//     metrics()), and the BatchFailure (batch_failure.hpp: a failed batch split, requeued,
//     retried or ended, late failures, the end of everything waiting when the last worker gave
//     up);
//   - the health-change hook (engine_context.cpp) and the check of a model's outputs
//     (worker.cpp).
//
// Thread safety: the references and configuration are fixed at construction; the owned parts
// are thread-safe (see their headers); both methods may be called from any thread and take no
// lock. No method blocks. User code runs only in health_changed() (EngineOptions::
// on_health_change), with no engine lock held.
//
// Lifetime: EngineCore constructs it after the executors, the Scheduler and the Resolver, and
// stops the executors (shutdown()) before any of them is destroyed.
#pragma once

#include <cstdint>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/executor.hpp"
#include "asyncinfer/log.hpp"
#include "asyncinfer/model.hpp"
#include "core/spin_wait.hpp"
#include "engine/batch_failure.hpp"
#include "engine/engine_counters.hpp"
#include "engine/resolver.hpp"
#include "engine/scheduler.hpp"
#include "engine/sequence_batcher.hpp"

namespace asyncinfer::detail {

struct EngineContext {
  /// `run_inline`: the engine runs a worker's batches on its own thread (worker.hpp).
  /// `plan`: set on a sequence engine (EngineOptions::sequence_batching), else null. Does not
  /// own anything it is given (`dispatcher` runs completion points where the device forbids
  /// running them where the stream reaches them); all of it must outlive this object.
  EngineContext(Model& the_model, Device& the_device, const EngineOptions& options,
                const ModelSignature& signature, const SequencePlan* plan, std::int64_t batch_rows,
                bool run_inline, Executor& dispatcher, DeadlineTimer& deadline_timer,
                ThreadPool& reaper_pool, Scheduler& the_scheduler, Resolver& the_resolver);
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  /// Calls EngineOptions::on_health_change (if any): after a worker's health changed, or when
  /// shutdown begins. With no engine lock held (EngineCore's shutdown mutex aside, inside
  /// shutdown()); an exception is reported and dropped. (engine_context.cpp)
  void health_changed() noexcept;

  /// Whether a model's outputs for `rows` rows match its signature. (worker.cpp)
  Status check_outputs(const std::vector<Tensor>& outs, std::int64_t rows) const;

  // ---- fixed at construction ------------------------------------------------------------------

  Model& model;
  Device& device;
  const EngineOptions& opt;
  const ModelSignature& sig;
  /// Sequence engines (EngineOptions::sequence_batching): where the model's inputs come from;
  /// null otherwise.
  const SequencePlan* const sequence_plan;
  const std::int64_t max_rows;
  const bool unified;  // DeviceInfo::unified_memory: no copies to and from the device
  /// Model::takes_requests_apart on a unified-memory device: a batch of several requests keeps
  /// each request's tensors (BatchIO::request_inputs, request_outputs), joined and split nowhere.
  const bool apart;
  /// Requests a launch may carry when the engine does not batch the model (max_rows 1, no
  /// sequence batching) and the model runs each alone (Model::coalesced_requests, needing
  /// `apart`); 0 = one request a launch.
  const int coalesce;
  const bool inline_path;  // worker.hpp: caller-run streams (cpu) and no hang watchdog
  /// Whether and how long the workers (Worker::loop) and the completion threads
  /// (EngineCore::start) spin before they sleep: EngineOptions::spin_wait as Engine::create
  /// resolved it (spin_wait.hpp).
  const SpinPolicy spin;
  InlineExecutor inline_executor;  // runs a completion point where the stream reaches it
  /// Where the streams' completion points run: where the device allows it
  /// (DeviceCapabilities::host_funcs_may_call_device: cpu, sim) the thread that reaches the point
  /// in the stream runs the (library-only) completion code, saving a thread hand-off per batch;
  /// elsewhere (cuda, whose callback thread must not call CUDA) the dispatcher thread.
  Executor& completion_point;
  DeadlineTimer& timer;
  ThreadPool& reaper;
  Scheduler& scheduler;
  Resolver& resolver;

  // ---- owned parts (thread-safe) --------------------------------------------------------------

  EngineCounters counters;  // read by EngineCore::metrics (EngineCounters::add_to)
  BatchFailure failures;    // after the counters it bumps
  LogLimiter recycle_log;   // failed recycle attempts (worker_recovery.cpp)
};

}  // namespace asyncinfer::detail
