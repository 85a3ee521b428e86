// contention.hpp — a bounded CPU load for `asyncinfer bench --contention N`.
//
// A server always shares its cores (its own I/O threads, other processes), and thread pools that
// spin-wait for each other (OpenMP teams inside libtorch) collapse when one of their threads loses
// its core. BusyLoad starts N child processes that each spin on the CPU — unrelated processes, as
// a neighbour would be, not threads of this one, and not pinned — for at most `limit`, and stops
// them when destroyed. The children only read the clock and exit: nothing else runs after fork.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer::cli {

class BusyLoad {
 public:
  /// Starts `processes` spinning children, each of which exits by itself after `limit` (and when
  /// this process dies). internal when fork fails.
  static Result<BusyLoad> start(int processes, std::chrono::milliseconds limit);
  BusyLoad(BusyLoad&& other) noexcept : children_(std::move(other.children_)) {}
  BusyLoad& operator=(BusyLoad&&) = delete;
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;
  /// Kills and reaps the children.
  ~BusyLoad();
  const std::vector<pid_t>& children() const noexcept { return children_; }

 private:
  BusyLoad() = default;
  std::vector<pid_t> children_;
};

}  // namespace asyncinfer::cli
