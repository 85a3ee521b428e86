// machine.hpp — what the bench ran on (cores, CPU model, allocator) and process CPU time
// (getrusage).
#pragma once

#include <string>

namespace asyncinfer::cli {

struct MachineInfo {
  unsigned cores = 0;     ///< std::thread::hardware_concurrency()
  std::string cpu_model;  ///< "model name" of /proc/cpuinfo ("unknown" if absent)
  std::string os;         ///< uname: sysname release machine
  std::string compiler;   ///< what built the tool
  /// The malloc this process runs on: "tcmalloc (gperftools 2.10)" where the program links it
  /// (CMake's ASYNCINFER_MALLOC) or it is preloaded, "jemalloc" when preloaded, else "glibc".
  std::string allocator;
};
MachineInfo machine_info();

/// Process CPU seconds (getrusage RUSAGE_SELF), user and system.
struct CpuTimes {
  double user_s = 0;
  double sys_s = 0;
};
CpuTimes process_cpu_times();

}  // namespace asyncinfer::cli
