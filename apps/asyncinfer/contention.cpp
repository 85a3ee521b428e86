#include "contention.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace asyncinfer::cli {
namespace {

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// The child: spins until `end_ns` (async-signal-safe calls only), then exits.
[[noreturn]] void spin_until(std::int64_t end_ns) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the bench
  volatile std::uint64_t sink = 0;
  while (monotonic_ns() < end_ns) {
    for (int i = 0; i < 1000; ++i) sink = sink + static_cast<std::uint64_t>(i);
  }
  _exit(0);
}

}  // namespace

Result<BusyLoad> BusyLoad::start(int processes, std::chrono::milliseconds limit) {
  BusyLoad load;
  const std::int64_t end_ns =
      monotonic_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
  for (int i = 0; i < processes; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      return internal_error(std::string("--contention: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) spin_until(end_ns);
    load.children_.push_back(pid);
  }
  return load;
}

BusyLoad::~BusyLoad() {
  for (pid_t pid : children_) kill(pid, SIGKILL);
  for (pid_t pid : children_) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace asyncinfer::cli
