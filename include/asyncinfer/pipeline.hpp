// pipeline.hpp — N stages overlapped on streams (the article's §4.1, done right).
//
// A Pipeline runs each item through its stages in order; different items occupy different stages
// at the same time, so pre-processing, inference and post-processing overlap. Stages:
//   - host:   a function on host threads (serial, or `concurrency` threads in parallel);
//   - device: a function that enqueues device work on the stage's own stream (it must not block);
//             the next device stage's stream waits on this stage's event, so no host thread waits
//             between device stages;
//   - model:  a device stage that runs a model instance on the stage's stream (copies to and from
//             device memory where the device needs them);
//   - engine: submits the item's tensors to an Engine (batching, deadlines, retries) and continues
//             when the engine's callback arrives.
//
// Invariants:
//   - a window bounds the items in flight (from submit until every stage, and every device
//     operation, is done with them): a faster source blocks in submit() (backpressure), so memory
//     stays flat;
//   - each device stage owns one event per window slot; a slot — and so its events — is reused
//     only after all device work of its previous item has passed (the article records one event
//     object for every item, which races as soon as two items are in flight);
//   - an item carries its priority and deadline through every stage: each stage serves its queue
//     highest priority first (FIFO within a level), so a high-priority item overtakes queued
//     low-priority items at each stage, not only at the first;
//   - every submitted item ends exactly once: ok, or the error of the first stage that failed it
//     (named in the message), or timed out, cancelled, or shut down; the pipeline carries on;
//   - ordered delivery (default): results reach futures in submit order.
//
// Thread safety: submit(), run(), metrics() and shutdown() may be called from any thread
// (shutdown() not from a stage function or a continuation). Stage functions for one stage run
// concurrently only if that stage's concurrency is > 1.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/future.hpp"
#include "asyncinfer/metrics.hpp"
#include "asyncinfer/model.hpp"

namespace asyncinfer {

/// What travels through a pipeline: tensors and anything else the stages need.
struct PipelineItem {
  std::vector<Tensor> tensors;
  std::any user;
};

/// A host stage: transforms the item in place. A non-ok status (or an exception) fails the item.
using HostStageFn = std::function<Status(PipelineItem& item)>;
/// A device stage: enqueues the item's work on `stream` and returns without waiting for it. It may
/// replace item.tensors with tensors the enqueued work will fill (stream order makes them valid
/// for later stages). Errors during execution flow to the stage's completion point.
using DeviceStageFn = std::function<Status(PipelineItem& item, Stream& stream)>;

enum class StageKind : std::uint8_t { host, device, engine };

/// One stage. Build with the factory functions.
struct StageSpec {
  std::string name;
  StageKind kind = StageKind::host;
  int concurrency = 1;  ///< host stages: parallel threads
  HostStageFn host_fn;
  std::shared_ptr<Device> device;  ///< device stages
  DeviceStageFn device_fn;
  int stream_depth = 2;          ///< device stages: items enqueued ahead on the stream
  std::shared_ptr<Model> model;  ///< model stages (a kind of device stage)
  Engine* engine = nullptr;      ///< engine stages; the engine must outlive the pipeline

  static StageSpec host(std::string name, HostStageFn fn, int concurrency = 1);
  static StageSpec on_device(std::string name, std::shared_ptr<Device> device, DeviceStageFn fn,
                             int stream_depth = 2);
  /// Runs `model` on its own instance and stream: item.tensors are the model's inputs (one per
  /// signature input, host memory, dim 0 the batch) and become its outputs (host memory).
  static StageSpec run_model(std::string name, std::shared_ptr<Device> device,
                             std::shared_ptr<Model> model, int stream_depth = 2);
  static StageSpec run_engine(std::string name, Engine& engine);
};

struct PipelineOptions {
  /// Items in flight at most; submit() blocks while it is full.
  std::size_t window = 8;
  /// Results reach futures in submit order.
  bool ordered = true;
  int priority_levels = 3;
  int default_priority = 2;
  /// Threads that run future continuations.
  int completion_threads = 1;
  /// shutdown(drain) falls back to cancel after this long.
  std::chrono::milliseconds drain_timeout{30'000};
};

/// Per-item options.
struct ItemOptions {
  int priority = 0;  ///< 1 = highest … priority_levels; 0 = the default
  std::optional<std::chrono::microseconds> timeout;
  std::optional<Clock::time_point> deadline;
};

struct StageMetrics {
  std::string name;
  std::string kind;
  int concurrency = 1;
  std::uint64_t items = 0;  ///< items this stage finished (ok or failed)
  std::uint64_t failures = 0;
  double busy_s = 0;             ///< host: time in the stage function; device/engine: occupancy
  double utilisation = 0;        ///< busy_s ÷ (elapsed × concurrency)
  std::int64_t queued = 0;       ///< waiting at this stage now
  HistogramSnapshot queue_us;    ///< time items waited at this stage
  HistogramSnapshot service_us;  ///< time the stage spent on one item
};

struct PipelineMetrics {
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t timed_out = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t shut_down = 0;
  std::int64_t in_flight = 0;
  std::int64_t max_in_flight = 0;  ///< never above the window
  double elapsed_s = 0;            ///< since the first submit
  double items_per_s = 0;          ///< completed ÷ elapsed
  std::vector<StageMetrics> stages;
  HistogramSnapshot latency_us;  ///< submit → delivered

  /// The stage with the highest utilisation (the bottleneck), or "" before any item.
  std::string bottleneck() const;
  std::string to_prometheus(std::string_view prefix = "asyncinfer") const;
};

class PipelineCore;

class Pipeline {
 public:
  /// invalid_argument for an empty stage list, a stage without its function/device/model/engine,
  /// a window of 0, or bad priority options; errors from creating streams, events or model
  /// instances are passed on, naming the stage.
  static Result<std::unique_ptr<Pipeline>> create(std::vector<StageSpec> stages,
                                                  PipelineOptions options = {});
  ~Pipeline();  ///< shutdown(drain)
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Sends `item` through the stages. Blocks while the window is full (backpressure); returns a
  /// future of the item as the last stage left it. After shutdown: a ready `unavailable` future.
  [[nodiscard]] Future<PipelineItem> submit(PipelineItem item, const ItemOptions& options = {});
  /// The article's infer_batch: submits every item (respecting the window) and waits for all.
  /// Results in input order, each with its own status. Blocks.
  std::vector<Result<PipelineItem>> run(std::vector<PipelineItem> items,
                                        const ItemOptions& options = {});
  /// Stops: drain finishes items in flight (falling back to cancel after the drain timeout);
  /// cancel resolves them as shut_down (aborted) at once. Joins every thread. Idempotent.
  /// Thread-safe: a cancel from another thread while a drain runs cuts that drain short, and
  /// returns once that shutdown has finished. Blocks.
  void shutdown(ShutdownMode mode = ShutdownMode::drain);

  PipelineMetrics metrics() const;

 private:
  explicit Pipeline(std::shared_ptr<PipelineCore> core);
  std::shared_ptr<PipelineCore> core_;
};

}  // namespace asyncinfer
