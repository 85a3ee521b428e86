// execution_gate.hpp — an optional gate an engine's workers pass before each batch runs.
//
// A gate is owned outside the engine (EngineOptions::execution_gate holds a share of it) and may
// be shared by many engines: it is how several models agree on what may run at once. A model
// server's rate limiter (Triton's `--rate-limit=execution_count`, src/engine/resource_pool.hpp)
// is one: an instance runs a batch only when the resources its instance group asks for are free.
//
// The contract, per batch: a worker calls acquire() once it has taken the batch from the queue
// and before the model sees it; when acquire() returns true the worker holds the gate for that
// batch, and calls release() exactly once when the model's work for the batch has ended (its
// completion point ran, or it never reached the stream). A worker holds the gate for at most one
// batch per in-flight slot. The engine requests `stop` when it is cancelling (shutdown(cancel),
// or a drain that timed out): acquire() must then return false promptly, holding nothing. With no
// gate (the default) the engine's hot path costs one pointer test per batch.
#pragma once

#include <stop_token>

namespace asyncinfer {

/// Decides when an engine's worker may run its next batch (see the header's comment). The engine
/// also runs no request on its submitting thread while a gate is set
/// (RequestOptions::caller_run_max_compute is ignored): every batch passes the gate.
class ExecutionGate {
 public:
  virtual ~ExecutionGate() = default;

  /// Blocks until worker `worker` (its index in the engine, 0-based) may run one batch, or until
  /// `stop` is requested. true: granted; the caller must call release(worker) once. false:
  /// stopped, nothing is held. Thread-safe; called by the engine's worker threads.
  virtual bool acquire(int worker, std::stop_token stop) = 0;
  /// Gives back what acquire(worker) granted for one batch. Never blocks for long (no I/O, no
  /// waiting): it runs on the thread that ends the batch. Thread-safe.
  virtual void release(int worker) noexcept = 0;
};

}  // namespace asyncinfer
