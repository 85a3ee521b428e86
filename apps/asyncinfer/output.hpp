// output.hpp — what one `asyncinfer bench` invocation produced, and its renderings: the human
// table, the JSON document (schema in docs/bench.md) and CSV.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_options.hpp"
#include "machine.hpp"
#include "run_result.hpp"

namespace asyncinfer::cli {

/// Version of the JSON schema; bumped only on incompatible changes (fields are only added).
inline constexpr int kJsonSchemaVersion = 1;

/// What one bench invocation ran: one run, a comparison of modes, or a sweep of one mode.
enum class ReportKind : std::uint8_t { single, compare, sweep, contention };
/// "single", "compare", "sweep", "contention" (the JSON's "kind").
std::string_view to_string(ReportKind kind) noexcept;

struct BenchReport {
  ReportKind kind = ReportKind::single;
  const BenchOptions* options = nullptr;
  std::string device_description;  ///< DeviceInfo::description
  std::string model_signature;     ///< ModelSignature::to_string()
  std::string inputs;              ///< InputPlan::describe()
  MachineInfo machine;
  std::vector<RunResult> runs;
  /// --contention: medians of the quiet and the contended runs (alternated, same settings).
  struct Contention {
    int processes = 0;  ///< busy-looping processes beside the contended runs
    int rounds = 0;
    double quiet_rps = 0;
    double contended_rps = 0;
  };
  std::optional<Contention> contention;
  /// Lines printed after the table (e.g. the --contention summary).
  std::vector<std::string> notes;
};

/// Ratio of each run to the first (compare): throughput, p50 and p99 latency.
struct Ratio {
  Mode mode = Mode::sync;
  std::string label;
  std::optional<double> throughput, p50, p99;
};
std::vector<Ratio> ratios(const BenchReport& report);

nlohmann::ordered_json to_json(const BenchReport& report);
std::string to_csv(const BenchReport& report);
void print_table(std::FILE* out, const BenchReport& report);

/// "12.3 us", "4.56 ms", "1.23 s"; "-" for nullopt.
std::string format_us(std::optional<double> us);

}  // namespace asyncinfer::cli
