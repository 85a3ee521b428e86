// machine.cpp — machine description and process CPU times (machine.hpp).
#include "machine.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <algorithm>
#include <fstream>
#include <thread>

namespace asyncinfer::cli {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string cpu_model_from_proc() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::string fallback;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && !value.empty()) return value;
    // Some ARM kernels name the part only.
    if ((key == "Hardware" || key == "CPU part" || key == "uarch") && fallback.empty()) {
      fallback = value;
    }
  }
  return fallback.empty() ? "unknown" : fallback;
}

/// Looked up, not linked: whichever malloc the process was linked or preloaded with.
std::string allocator_in_use() {
  using TcVersion = const char* (*)(int*, int*, const char**);
  if (auto tc = reinterpret_cast<TcVersion>(dlsym(RTLD_DEFAULT, "tc_version"))) {
    const char* version = tc(nullptr, nullptr, nullptr);
    return std::string("tcmalloc (") + (version != nullptr ? version : "gperftools") + ")";
  }
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  return "glibc";
}

double seconds(const timeval& tv) {
  return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
}

}  // namespace

MachineInfo machine_info() {
  MachineInfo m;
  m.cores = std::max(1U, std::thread::hardware_concurrency());
  m.cpu_model = cpu_model_from_proc();
  utsname u{};
  if (uname(&u) == 0) {
    m.os = std::string(u.sysname) + " " + u.release + " " + u.machine;
  }
#if defined(__clang__)
  m.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  m.compiler = "gcc " __VERSION__;
#else
  m.compiler = "unknown";
#endif
  m.allocator = allocator_in_use();
  return m;
}

CpuTimes process_cpu_times() {
  rusage ru{};
  CpuTimes t;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    t.user_s = seconds(ru.ru_utime);
    t.sys_s = seconds(ru.ru_stime);
  }
  return t;
}

}  // namespace asyncinfer::cli
