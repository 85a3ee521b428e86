// commands.hpp — the subcommands of the `asyncinfer` tool (run, bench, info). Each lives in its
// own file and registers itself on the top-level CLI11 app; main.cpp only parses and dispatches.
//
// To add a subcommand `foo`: write foo.cpp with `Command add_foo_command(CLI::App& parent)`,
// declare it here, and add one line in main.cpp. Options that CLI11 cannot convert by itself
// (modes, lists of named values) are declared with cli_options.hpp, so each is parsed once.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace asyncinfer::cli {

/// Exit codes of the tool.
enum ExitCode : int {
  kExitOk = 0,
  kExitRunFailed = 1,  ///< the run could not be made, or nothing succeeded
  kExitUsage = 2,      ///< bad options (named in the message)
};

/// A registered subcommand: its CLI11 app and what to run when it was chosen on the command
/// line (called after a successful parse; returns the exit code).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_bench_command(CLI::App& parent);  // bench.cpp
Command add_info_command(CLI::App& parent);   // info.cpp
Command add_run_command(CLI::App& parent);    // run.cpp
Command add_serve_command(CLI::App& parent);  // serve.cpp

}  // namespace asyncinfer::cli
