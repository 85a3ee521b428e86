// statistics.hpp — the counters behind Triton's model statistics (InferenceStats, metrics.hpp):
// cumulative durations and per-batch-size tables, recorded once per batch on the hot path.
//
// Thread safety: add() from any thread (relaxed atomics; counters, not synchronisation);
// snapshot() from any thread, concurrently (a snapshot taken during an add may see its count
// and not yet its ns).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "asyncinfer/metrics.hpp"

namespace asyncinfer::detail {

/// A DurationStat being counted.
struct DurationCounter {
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::uint64_t> ns{0};

  void add(std::uint64_t n, std::uint64_t total_ns) noexcept {
    count.fetch_add(n, std::memory_order_relaxed);
    ns.fetch_add(total_ns, std::memory_order_relaxed);
  }
  DurationStat load() const noexcept {
    return {count.load(std::memory_order_relaxed), ns.load(std::memory_order_relaxed)};
  }
};

/// The compute durations of each batch size: a slot per size up to 1024 (lock-free), a map
/// under a mutex above.
class BatchStatsTable {
 public:
  void add(std::int64_t batch_size, std::uint64_t input_ns, std::uint64_t infer_ns,
           std::uint64_t output_ns);
  std::vector<BatchSizeStats> snapshot() const;

 private:
  static constexpr std::int64_t kDirect = 1024;
  struct Slot {
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> input_ns{0};
    std::atomic<std::uint64_t> infer_ns{0};
    std::atomic<std::uint64_t> output_ns{0};
  };
  std::unique_ptr<Slot[]> slots_ = std::make_unique<Slot[]>(kDirect + 1);
  mutable std::mutex mu_;
  std::map<std::int64_t, BatchSizeStats> large_;  // under mu_
};

}  // namespace asyncinfer::detail
