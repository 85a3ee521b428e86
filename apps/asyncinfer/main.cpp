// main.cpp — the `asyncinfer` command-line tool: parses the command line and dispatches to the
// chosen subcommand (each in its own file; see commands.hpp).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <vector>

#include "commands.hpp"

#ifndef ASYNCINFER_VERSION
#define ASYNCINFER_VERSION "unknown"
#endif

namespace {

int run_tool(int argc, char** argv) {
  using namespace asyncinfer::cli;
  CLI::App app{"asyncinfer: command-line tool of the asyncinfer inference runtime", "asyncinfer"};
  app.set_version_flag("--version", "asyncinfer " ASYNCINFER_VERSION);
  app.require_subcommand(1);
  app.get_formatter()->column_width(36);

  std::vector<Command> commands;
  commands.push_back(add_run_command(app));
  commands.push_back(add_bench_command(app));
  commands.push_back(add_info_command(app));
  commands.push_back(add_serve_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help/version (code 0) or the error
    return code == 0 ? kExitOk : kExitUsage;
  }
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  // This program links tcmalloc (CMakeLists.txt, "the programs' allocator"). OpenVINO's TBB
  // dlopen()s its topology helper (tbbbind -> hwloc) with RTLD_DEEPBIND, which binds hwloc's
  // free() to glibc's while its memory came from tcmalloc: "free(): invalid pointer" at the first
  // model compile. TBB_ENABLE_SANITIZERS=1 is oneTBB's switch that drops RTLD_DEEPBIND (made for
  // sanitizers, which interpose malloc the same way). Set here, before any thread exists; a value
  // the user set is kept.
  ::setenv("TBB_ENABLE_SANITIZERS", "1", 0);
  // Run as `tritonserver` (the link installed beside this program), it is `asyncinfer serve`
  // with Triton's command line (serve.cpp, add_triton_flags): a Triton launch line works as is.
  std::vector<char*> args(argv, argv + argc);
  const std::string_view self = argc > 0 ? std::string_view(argv[0]) : std::string_view();
  const std::size_t slash = self.rfind('/');
  if (self.substr(slash == std::string_view::npos ? 0 : slash + 1) == "tritonserver") {
    static char serve[] = "serve";
    args.insert(args.begin() + 1, serve);
  }
  try {
    return run_tool(static_cast<int>(args.size()), args.data());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncinfer: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "asyncinfer: error: unknown exception\n");
  }
  return asyncinfer::cli::kExitRunFailed;
}
