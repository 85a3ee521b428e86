// machine.hpp — what the bench ran on (cores, CPU model) and process CPU time (getrusage).
#pragma once

#include <string>

namespace asyncinfer::cli {

struct MachineInfo {
  unsigned cores = 0;     ///< std::thread::hardware_concurrency()
  std::string cpu_model;  ///< "model name" of /proc/cpuinfo ("unknown" if absent)
  std::string os;         ///< uname: sysname release machine
  std::string compiler;   ///< what built the tool
};
MachineInfo machine_info();

/// Process CPU seconds (getrusage RUSAGE_SELF), user and system.
struct CpuTimes {
  double user_s = 0;
  double sys_s = 0;
};
CpuTimes process_cpu_times();

}  // namespace asyncinfer::cli
