// The per-batch-size table of Triton's statistics (statistics.hpp).
#include "engine/statistics.hpp"

namespace asyncinfer::detail {

void BatchStatsTable::add(std::int64_t batch_size, std::uint64_t input_ns, std::uint64_t infer_ns,
                          std::uint64_t output_ns) {
  if (batch_size >= 0 && batch_size <= kDirect) {
    Slot& s = slots_[static_cast<std::size_t>(batch_size)];
    s.count.fetch_add(1, std::memory_order_relaxed);
    s.input_ns.fetch_add(input_ns, std::memory_order_relaxed);
    s.infer_ns.fetch_add(infer_ns, std::memory_order_relaxed);
    s.output_ns.fetch_add(output_ns, std::memory_order_relaxed);
    return;
  }
  std::lock_guard lock(mu_);
  BatchSizeStats& b = large_[batch_size];
  b.batch_size = batch_size;
  for (auto [d, ns] : {std::pair{&b.compute_input, input_ns}, std::pair{&b.compute_infer, infer_ns},
                       std::pair{&b.compute_output, output_ns}}) {
    d->count += 1;
    d->ns += ns;
  }
}

std::vector<BatchSizeStats> BatchStatsTable::snapshot() const {
  std::vector<BatchSizeStats> out;
  for (std::int64_t i = 0; i <= kDirect; ++i) {
    const Slot& s = slots_[static_cast<std::size_t>(i)];
    const std::uint64_t n = s.count.load(std::memory_order_relaxed);
    if (n == 0) continue;
    BatchSizeStats b;
    b.batch_size = i;
    b.compute_input = {n, s.input_ns.load(std::memory_order_relaxed)};
    b.compute_infer = {n, s.infer_ns.load(std::memory_order_relaxed)};
    b.compute_output = {n, s.output_ns.load(std::memory_order_relaxed)};
    out.push_back(b);
  }
  std::lock_guard lock(mu_);
  for (const auto& [size, b] : large_) out.push_back(b);
  return out;
}

}  // namespace asyncinfer::detail
