// bench_options.hpp — the parsed options of `asyncinfer bench`, their checks, and the text
// parsers the options use (shapes, lists, priority). No CLI11 here, so tests can use it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer::cli {

/// Modes a single run can have. "sweep" runs one of them at several points.
inline constexpr std::array<std::string_view, 4> kRunModes = {"sync", "async", "rate", "pipeline"};
inline constexpr std::string_view kAllModes = "sync, async, rate, sweep, pipeline";

/// One input's per-item shape from --input-shape: "1x32x32" (every input) or "name:1x32x32".
struct InputShapeArg {
  std::string name;  ///< empty: applies to every input not named elsewhere
  std::vector<std::int64_t> dims;
};

/// Everything `bench` was asked to do, as parsed (defaults filled in).
struct BenchOptions {
  // What to run on.
  std::string model;
  std::string device = "cpu";
  std::string stages;  ///< --stages: measure a pipeline of timed stages instead of a model
  // How to drive it.
  std::string mode = "async";
  std::vector<int> concurrency = {1};
  bool concurrency_given = false;    ///< --concurrency was on the command line
  std::vector<double> request_rate;  ///< empty unless given
  std::string arrivals = "poisson";  ///< poisson | constant
  std::vector<std::string> compare;  ///< --compare modes (empty: off)
  // Engine.
  int workers = 0;             ///< 0 = the engine's rule; run_bench fills in the number chosen
  std::int64_t max_batch = 0;  ///< 0 = the model's
  std::int64_t max_queue_delay_us = 0;
  std::vector<std::int64_t> preferred_batch;
  int inflight_per_worker = 2;
  int priority_levels = 3;
  std::string priority;   ///< "" = engine default, "1".."N", or "mixed"
  double timeout_ms = 0;  ///< 0 = none
  int completion_threads = 1;
  std::int64_t queue_capacity = 0;  ///< 0 = auto (max(4096, 2 × concurrency))
  int max_attempts = 1;
  int intra_op_threads = 0;  ///< 0 = the engine's rule (EngineOptions::intra_op_threads)
  // CPU contention (contention.hpp): with N > 0 every run is made `contention_rounds` times
  // quiet and as often with N busy-looping processes beside it, alternating, and the medians
  // are compared.
  int contention = 0;
  int contention_rounds = 3;
  // Length.
  std::int64_t warmup = 0;    ///< warm-up requests (after the first inference)
  double warmup_s = 0;        ///< or warm-up seconds
  double duration_s = 0;      ///< measured seconds (0 = use requests)
  std::int64_t requests = 0;  ///< measured requests (0 = use duration)
  // Inputs.
  std::vector<std::string> input_shape;  ///< raw --input-shape values
  std::int64_t batch_rows = 1;
  std::string data = "random";  ///< random | zeros | file:<path>
  std::uint64_t seed = 42;
  // Output.
  std::string json;  ///< "" = none, "-" = stdout
  std::string csv;
  std::string report;
  bool quiet = false;
  bool fail_on_error = false;

  /// Default measured length when neither --duration-s nor --requests is given.
  static constexpr double kDefaultDurationS = 5.0;
};

/// Checks what CLI11 cannot (cross-option rules, list values, mode names, shapes, priority).
/// On success fills in defaults (e.g. duration). invalid_argument naming the option otherwise.
Status validate(BenchOptions& o);

/// "1x32x32" → {1, 32, 32}. Dims must be integers >= 1 ("-1" is not allowed here: the bench
/// sends concrete shapes). invalid_argument naming `option` and the bad text.
Result<std::vector<std::int64_t>> parse_dims(std::string_view text, std::string_view option);
/// "1x32x32" or "name:1x32x32".
Result<InputShapeArg> parse_input_shape(std::string_view text);
/// "" → 0 (engine default), "mixed" → -1, "k" → k in 1..levels.
Result<int> parse_priority(std::string_view text, int levels);

/// Whether `mode` is one of kRunModes.
bool is_run_mode(std::string_view mode) noexcept;

}  // namespace asyncinfer::cli
