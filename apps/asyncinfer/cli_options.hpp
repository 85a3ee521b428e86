// cli_options.hpp — how the subcommands declare options that need more than CLI11's own
// conversions: each is parsed and checked once, by the command's own parser, as CLI11 reads it.
//
// add_parsed_option binds an option to a parser returning Result<T>: on success the value goes
// to its typed field; on failure CLI11 reports the parser's message (which names the option and
// what was expected) as a usage error, so main() exits with kExitUsage (2). Checks that need
// several options (a priority against --priority-levels) stay in the command's validate step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "asyncinfer/model.hpp"
#include "asyncinfer/status.hpp"

namespace asyncinfer::cli {

/// `--name TEXT`, parsed by `parse(std::string_view) -> Result<T>` into `target`.
template <class T, class Parse>
CLI::Option* add_parsed_option(CLI::App& app, const std::string& name, T& target, Parse parse,
                               const std::string& help) {
  return app.add_option_function<std::string>(
      name,
      [&target, parse](const std::string& text) {
        auto r = parse(text);
        if (!r.ok()) throw CLI::ValidationError(std::string(r.status().message()));
        target = std::move(*r);
      },
      help);
}

/// `--name A,B,...`: each item parsed by `parse` and appended to `target` (cleared first).
template <class T, class Parse>
CLI::Option* add_parsed_list_option(CLI::App& app, const std::string& name, std::vector<T>& target,
                                    Parse parse, const std::string& help) {
  return app
      .add_option_function<std::vector<std::string>>(
          name,
          [&target, parse](const std::vector<std::string>& items) {
            target.clear();
            for (const std::string& text : items) {
              auto r = parse(text);
              if (!r.ok()) throw CLI::ValidationError(std::string(r.status().message()));
              target.push_back(std::move(*r));
            }
          },
          help)
      ->delimiter(',');
}

/// --max-batch-size N (Triton's and Ray Serve's name), the largest batch the engine forms, in
/// rows: BatchingOptions::max_batch_size. Not given = the engine's rule (the model's batch
/// limit, or 64 when it sets none). `old_name` ("--max-batch", "--batch") is kept as a hidden
/// alias for old scripts.
inline CLI::Option* add_max_batch_size_option(CLI::App& app, std::optional<std::int64_t>& target,
                                              const std::string& old_name) {
  const auto range = CLI::Range(std::int64_t{1}, std::int64_t{1} << 30);
  auto set = [&target](const std::int64_t& n) { target = n; };
  CLI::Option* opt =
      app.add_option_function<std::int64_t>(
             "--max-batch-size", set,
             "Largest batch in rows (default: the model's batch limit, or 64 when it sets none); "
             "1 = no batching; above the model's limit is an error")
          ->check(range);
  app.add_option_function<std::int64_t>(old_name, set, "old name of --max-batch-size")
      ->check(range)
      ->group("");
  return opt;
}

/// --backend-parameter KEY=VALUE, repeatable: OpenVINO's properties for an .onnx or .xml model
/// (NUM_STREAMS=2, INFERENCE_PRECISION_HINT=f32, ...), as Triton's config.pbtxt `parameters`.
inline CLI::Option* add_backend_parameter_option(CLI::App& app, BackendParameters& target) {
  return app
      .add_option_function<std::vector<std::string>>(
          "--backend-parameter",
          [&target](const std::vector<std::string>& items) {
            target.clear();
            for (const std::string& item : items) {
              const std::size_t eq = item.find('=');
              if (eq == std::string::npos || eq == 0) {
                throw CLI::ValidationError("--backend-parameter: '" + item +
                                           "' is not KEY=VALUE (e.g. NUM_STREAMS=2)");
              }
              target.emplace_back(item.substr(0, eq), item.substr(eq + 1));
            }
          },
          "KEY=VALUE for the model backend's own library, repeatable: OpenVINO properties for "
          ".onnx and .xml models (NUM_STREAMS=2, PERFORMANCE_HINT=LATENCY, "
          "INFERENCE_PRECISION_HINT=f32, ...)")
      ->take_all();
}

}  // namespace asyncinfer::cli
