// cuda_memory.hpp (internal) — the memory of one cuda device: device memory from a stream-ordered
// pool, cached pinned host memory, and the mapped host "slots" through which host threads and the
// backend's kernels signal each other.
//
// Mapping (CUDA Runtime API reference, "Stream Ordered Memory Allocator", "Memory Management"):
//   device       cudaMallocFromPoolAsync from a per-device cudaMemPool (release threshold: keep
//                everything) on an internal allocation stream, freed with cudaFreeAsync (cudaMalloc
//                / cudaFree where the device has no memory pools).
//   pinned_host  cudaHostAlloc in size classes, cached and reused (returned to CUDA when the device
//                and its last tensor are gone).
//   host         Storage::allocate_host (the device does not wrap it).
// Device storage is not host-accessible.
//
// Invariants: only user threads allocate (CUDA calls); what a CUDA callback may do here touches
// host memory only — SlotPool::release, and a storage deleter, which defers a device free made on
// a callback thread to the next allocation or to teardown. The owners outlive their users: storage
// deleters hold the MemoryCore, streams hold the SlotPool.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

#include "device/cuda/cuda_common.hpp"

namespace asyncinfer::detail::cuda {

// ---- flags in mapped host memory ----------------------------------------------------------------

/// 16 bytes of mapped page-locked host memory, read by device kernels and written by host threads
/// (or the reverse for `cut`). For a cancellable spin kernel: stop (host sets), cut (kernel sets
/// when it ended early). For a stream: stop is the stream's abort flag, counter the number of host
/// worker jobs finished (the host-wait kernel's target).
struct alignas(16) MappedSlot {
  std::uint32_t stop;
  std::uint32_t cut;
  std::uint64_t counter;
};
static_assert(sizeof(MappedSlot) == 16);

inline void store_flag(std::uint32_t& flag, std::uint32_t value) noexcept {
  std::atomic_ref<std::uint32_t>(flag).store(value, std::memory_order_seq_cst);
}
inline std::uint32_t load_flag(std::uint32_t& flag) noexcept {
  return std::atomic_ref<std::uint32_t>(flag).load(std::memory_order_acquire);
}

/// Mapped slots of one device, allocated in chunks (cudaHostAlloc with cudaHostAllocMapped; with
/// unified addressing, which every 64-bit CUDA 13 platform has, the device sees them at the host
/// address). acquire() may allocate (user threads only); release() only touches host memory, so
/// CUDA callbacks may call it.
class SlotPool {
 public:
  explicit SlotPool(int ordinal) : ordinal_(ordinal) {}
  ~SlotPool() {
    run_outside_callbacks([chunks = std::move(chunks_)] {
      for (void* c : chunks) (void)cudaFreeHost(c);
    });
  }
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  /// A zeroed slot. The calling thread's current device must be this pool's.
  Result<MappedSlot*> acquire();
  /// Host memory only: CUDA callbacks may call it.
  void release(MappedSlot* s) noexcept;

 private:
  static constexpr std::size_t kChunkSlots = 256;

  Status grow();

  const int ordinal_;
  std::mutex mu_;
  std::vector<void*> chunks_;
  std::vector<MappedSlot*> free_;
};

// ---- device and pinned memory ---------------------------------------------------------------

/// Device and pinned host memory of one device. Storage deleters hold it, so it outlives the
/// device while tensors remain. Releases from a CUDA callback (a stream letting go of a copied
/// tensor) are deferred to the next allocation or to teardown.
class MemoryCore : public std::enable_shared_from_this<MemoryCore> {
 public:
  static Result<std::shared_ptr<MemoryCore>> create(int ordinal);
  ~MemoryCore();
  MemoryCore(const MemoryCore&) = delete;
  MemoryCore& operator=(const MemoryCore&) = delete;

  Result<std::shared_ptr<Storage>> allocate_device(std::size_t bytes);
  Result<std::shared_ptr<Storage>> allocate_pinned(std::size_t bytes);

 private:
  explicit MemoryCore(int ordinal) : ordinal_(ordinal) {}

  /// Pinned blocks come in size classes: 4 KiB, then four steps per power of two (at most 25%
  /// slack), so freed blocks are reused by requests of similar size.
  static std::size_t size_class(std::size_t bytes);
  /// The deleter of every storage (only touches host state on a CUDA callback thread).
  static void release(const std::shared_ptr<MemoryCore>& self, void* p, std::size_t cls,
                      bool device);
  void free_device(void* p);
  void flush_deferred();

  const int ordinal_;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t alloc_stream_ = nullptr;
  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> pinned_free_;
  std::vector<void*> pinned_all_;
  std::vector<void*> deferred_device_;
};

}  // namespace asyncinfer::detail::cuda
