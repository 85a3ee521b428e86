// worker.hpp (internal) — one engine worker: a thread, a device stream and a model instance.
//
// The worker loop (EngineCore::worker_loop, worker.cpp) leaves at once when the engine is
// cancelling or stopped, whatever else is pending; otherwise, in order: an unhealthy worker (it
// gave up) waits for shutdown; a pending recycle waits for its backoff and for the
// abandoned-instance limit, then replaces the stream and model instance (bounded attempts, then
// unhealthy); an open breaker waits for its cool-down; then the worker asks the batcher
// (batcher.hpp) for a batch when it has a free in-flight slot, assembles it, enqueues it on its
// stream with a completion point, and arms the hang watchdog.
//
// The inline path (a device with DeviceCapabilities::caller_run_streams, such as cpu, and no hang
// watchdog): the worker's stream has no thread of its own,
// and the worker runs each batch it launched itself, right after launching it (kernel, then the
// completion point): one thread hand-off fewer per batch. With a watchdog the batch runs on the
// stream's thread as on other devices, so that a hung model leaves the worker free to replace it.
//
// worker.cpp holds the loop, launch, batch assembly and the completion point;
// worker_recovery.cpp the watchdog, recycling, giving up and the circuit breaker.
//
// Locks: `mu` guards the fields marked so; never held together with the engine's queue mutex.
// The atomic mirrors (`recycle_wanted`, the breaker's open_flag()) let the batcher's caller, which
// holds the queue mutex, see that the worker must stop taking work without taking `mu`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/model.hpp"
#include "engine/circuit_breaker.hpp"
#include "engine/request.hpp"

namespace asyncinfer::detail {

class HostStream;

struct Worker {
  Worker(int i, CircuitBreakerOptions b) : index(i), breaker(b) {}

  const int index;
  std::unique_ptr<Stream> stream;  // replaced only by the worker thread (recycle)
  // The inline path (EngineCore::inline_path_): `stream` is a caller-run stream, and this is
  // it; the worker runs each batch it launched on its own thread (run_pending). Null otherwise.
  HostStream* caller_stream = nullptr;
  std::unique_ptr<ModelInstance> instance;
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;                 // under mu
  int inflight = 0;                             // under mu
  std::vector<std::shared_ptr<Batch>> running;  // under mu
  bool recycle = false;                         // under mu: a new stream + instance is needed
  std::atomic<bool> recycle_wanted{false};      // the same, readable without mu (next_batch)
  int recycle_failures = 0;                     // under mu: failed attempts in a row
  Clock::time_point next_recycle{};             // under mu: backoff after a failed attempt
  bool gave_up = false;                         // under mu: unhealthy for good
  std::string last_error;                       // under mu: why the last attempt failed
  int abandoned = 0;                            // under mu: replaced instances not yet destroyed
  CircuitBreaker breaker;                       // under mu (but for its open_flag())
  std::atomic<std::uint64_t> batches{0};
  /// When its last batch reached its completion point (steady clock, ns since its epoch): a batch
  /// launched while the one before ran waited for it on the stream, which Triton's statistics
  /// count as queue time, not compute (EngineCore::complete).
  std::atomic<std::int64_t> last_completion_ns{0};
  std::atomic<std::uint64_t> failed_batches{0};
  std::atomic<std::uint64_t> recycles{0};
  std::atomic<std::uint64_t> recycle_attempts_failed{0};
  std::atomic<std::int64_t> stream_batches{0};  // launched, completion point not yet run
  std::jthread thread;
};

}  // namespace asyncinfer::detail
