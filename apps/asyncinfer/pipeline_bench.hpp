// pipeline_bench.hpp — `asyncinfer bench --stages host:2ms,sim:5ms,host:2ms`: measures any such
// pipeline with the same output as the engine modes.
//
// Stage kinds: host (CPU work: the thread spins for the time), sleep (a host wait), sim (a kernel
// of that length on the simulated accelerator), cpu (a kernel on a cpu-device stream, spinning),
// cuda (a spin kernel on cuda:0). Times take us, ms or s. A host or sleep stage may end in
// ":<threads>" (e.g. host:4ms:2, two threads). Modes: sync (each item runs the stages one after
// another, waiting for the device) and pipeline (the stages overlap; --concurrency sets the
// window, default 8); --compare sync,pipeline runs both. The bound is 1 / (the slowest stage's
// time ÷ its threads); the table and the JSON give the fraction of it reached.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"
#include "bench_options.hpp"
#include "drivers.hpp"
#include "run_result.hpp"

namespace asyncinfer::cli {

/// What a stage is: work on a host thread (host: spinning, sleep: waiting) or a kernel on a
/// device stream (sim, cpu, cuda).
enum class StageKind : std::uint8_t { host, sleep, sim, cpu, cuda };
std::string_view to_string(StageKind kind) noexcept;

struct StageArg {
  StageKind kind = StageKind::host;
  std::chrono::microseconds time{0};
  int threads = 1;
};

/// Parses --stages; invalid_argument names the bad item and the accepted forms.
Result<std::vector<StageArg>> parse_stages(const std::string& text);

/// Items per second the slowest stage allows.
double stage_bound_per_s(const std::vector<StageArg>& stages);

/// One run of the stages in `point.mode` (sync or pipeline).
Result<RunResult> run_stages(const BenchOptions& o, const std::vector<StageArg>& stages,
                             const RunPoint& point, bool progress);

}  // namespace asyncinfer::cli
