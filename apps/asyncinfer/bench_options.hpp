// bench_options.hpp — the options of `asyncinfer bench`, typed, their parsers and their checks.
// No CLI11 here, so tests can use it.
//
// Each option is parsed once, into its typed field, by the parser below that the command line
// calls as it reads the option (bench.cpp); an error names the option and what was expected.
// validate() then checks what needs several options at once (a mode and the options it needs,
// a priority against --priority-levels, ...) and fills in defaults. The rest of the bench reads
// the typed fields only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/model.hpp"
#include "asyncinfer/status.hpp"
#include "mode.hpp"

namespace asyncinfer::cli {

/// One input's per-item shape from --input-shape: "1x32x32" (every input) or "name:1x32x32".
struct InputShapeArg {
  std::string name;  ///< empty: applies to every input not named elsewhere
  std::vector<std::int64_t> dims;
  /// The option's text back: "1x32x32" or "name:1x32x32".
  std::string to_string() const;
};

/// Arrival process of rate mode (--arrivals).
enum class Arrivals : std::uint8_t { poisson, constant };
std::string_view to_string(Arrivals a) noexcept;

/// --priority: the engine's default level, one level for every request, or a uniform draw.
struct PriorityArg {
  bool mixed = false;
  int level = 0;  ///< 1..levels (1 = highest); 0 = the engine's default level
  /// "" (default), "mixed" or the level.
  std::string to_string() const;
};

/// --data: what requests carry.
struct DataArg {
  enum class Kind : std::uint8_t { random, zeros, file };
  Kind kind = Kind::random;
  std::string path;  ///< file: raw little-endian bytes of the input dtypes
  /// "random", "zeros" or "file:<path>".
  std::string to_string() const;
};

/// Everything `bench` was asked to do, as parsed (defaults filled in).
struct BenchOptions {
  // What to run on.
  std::string model;
  /// --backend-parameter KEY=VALUE (ModelOptions::backend_parameters).
  BackendParameters backend_parameters;
  std::string device = "cpu";
  std::string stages;  ///< --stages: measure a pipeline of timed stages instead of a model
  // How to drive it.
  Mode mode = Mode::async;
  std::vector<int> concurrency = {1};
  bool concurrency_given = false;    ///< --concurrency was on the command line
  std::vector<double> request_rate;  ///< empty unless given
  Arrivals arrivals = Arrivals::poisson;
  std::vector<Mode> compare;  ///< --compare modes (empty: off)
  // Engine.
  int workers = 0;  ///< 0 = the engine's rule; run_bench fills in the number chosen
  /// --max-batch-size: the largest batch the engine forms, in rows; unset = the engine's rule
  /// (BatchingOptions::max_batch_size: the model's batch limit, or 64 when it sets none).
  std::optional<std::int64_t> max_batch_size;
  std::int64_t max_queue_delay_us = 0;
  std::vector<std::int64_t> preferred_batch;
  int inflight_per_worker = 2;
  int priority_levels = 3;
  PriorityArg priority;
  double timeout_ms = 0;  ///< 0 = none
  int completion_threads = 1;
  int spin_wait_us = 10;            // EngineOptions::spin_wait
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
  std::vector<InputShapeArg> input_shapes;
  std::int64_t batch_rows = 1;
  DataArg data;
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

/// Checks what needs several options at once (modes and what they need, lists only with a
/// sweep, the priority against --priority-levels, lengths, ranges). On success fills in defaults
/// (e.g. duration). invalid_argument naming the option otherwise.
Status validate(BenchOptions& o);

/// "1x32x32" → {1, 32, 32}. Dims must be integers >= 1 ("-1" is not allowed here: the bench
/// sends concrete shapes). invalid_argument naming `option` and the bad text.
Result<std::vector<std::int64_t>> parse_dims(std::string_view text, std::string_view option);
/// "1x32x32" or "name:1x32x32" (--input-shape).
Result<InputShapeArg> parse_input_shape(std::string_view text);
/// "" → the engine's default, "mixed", or a level >= 1 (--priority; validate() checks it against
/// --priority-levels).
Result<PriorityArg> parse_priority(std::string_view text);
/// "poisson" or "constant" (--arrivals).
Result<Arrivals> parse_arrivals(std::string_view text);
/// "random", "zeros" or "file:<path>" (--data).
Result<DataArg> parse_data(std::string_view text);

}  // namespace asyncinfer::cli
