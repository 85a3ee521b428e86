// drivers.hpp — the load generators of `asyncinfer bench` and the one call that runs a point.
//
//   sync   one caller thread: Engine::infer, one request at a time.
//   async  closed loop: `concurrency` requests in flight; each completion callback records its
//          sample and submits the next request (no thread per request, no driver lock).
//   rate   open loop: the send times are computed ahead (poisson or constant arrivals); one
//          driver thread paces with sleep_until and submits with a callback; latency runs from
//          the INTENDED send time, so a late driver or a full queue shows up as latency instead
//          of being hidden (coordinated omission).
//
// Every run uses a fresh engine: the first inference is timed apart, then the warm-up (requests
// or seconds, excluded), then the measured window. Samples go to per-thread storage (one shard
// per thread that records) and are merged after the run.
#pragma once

#include <memory>
#include <string>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "bench_options.hpp"
#include "inputs.hpp"
#include "run_result.hpp"

namespace asyncinfer::cli {

/// One run to make: a mode and its load parameter.
struct RunPoint {
  Mode mode = Mode::async;  ///< sync | async | rate (pipeline: pipeline_bench.hpp)
  int concurrency = 1;      ///< async
  double request_rate = 0;  ///< rate
};

/// "async c=64", "rate 200/s poisson", "sync": how tables and progress lines name a point.
std::string label_of(const RunPoint& point, const BenchOptions& options);

/// What every run of one bench invocation shares.
struct BenchContext {
  const BenchOptions& options;
  std::shared_ptr<Model> model;
  std::shared_ptr<Device> device;
  const InputPlan& plan;
  const InputPool& inputs;
  bool progress = false;  ///< \r-updated progress line on stderr
};

/// The engine options a run uses (from --workers, --max-batch-size, ...).
EngineOptions engine_options(const BenchOptions& options, const RunPoint& point);

/// Runs one point on a fresh engine. An error means the run could not be made (engine creation
/// failed, ...); request failures are counted in the result instead.
Result<RunResult> run_point(const BenchContext& context, const RunPoint& point);

}  // namespace asyncinfer::cli
