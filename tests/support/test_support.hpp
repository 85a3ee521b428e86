// Helpers shared by the tests: waits that fail instead of hanging.
#pragma once

#include <gtest/gtest.h>
#include <pthread.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "asyncinfer/future.hpp"

namespace asyncinfer::testing {

using namespace std::chrono_literals;

/// Generous bound for "this must finish": a test that exceeds it fails instead of hanging.
inline constexpr auto kWatchdog = std::chrono::seconds(30);

/// Waits for `f` at most `limit`; fails the test (and returns an error) on expiry.
template <class T>
Result<T> get_within(const Future<T>& f, std::chrono::milliseconds limit = kWatchdog) {
  if (!f.wait_for(limit)) {
    ADD_FAILURE() << "future not ready within " << limit.count() << " ms";
    return deadline_exceeded_error("test watchdog expired");
  }
  return f.get();
}

/// Polls `pred` (a test-only helper; the library itself never polls) until true or `limit`.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = kWatchdog) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

/// The calling thread's name (pthread_setname_np; the library names its threads "ai-...").
inline std::string this_thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

/// Threads of this process, from /proc/self/status.
inline int process_threads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

/// Threads of this process whose name (/proc/self/task/*/comm) starts with `prefix`: unlike
/// process_threads(), blind to threads that a runtime (a sanitizer's background thread) starts
/// on its own at any moment.
inline int threads_named(const std::string& prefix) {
  int n = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "comm");
    std::string name;
    if (std::getline(in, name) && name.rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

/// Resident set size in KiB, from /proc/self/status.
inline long process_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace asyncinfer::testing
