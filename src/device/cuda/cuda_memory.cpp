// The memory of one cuda device (cuda_memory.hpp).
#include "device/cuda/cuda_memory.hpp"

namespace asyncinfer::detail::cuda {

// ---- SlotPool -------------------------------------------------------------------------------

Result<MappedSlot*> SlotPool::acquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) ASYNCINFER_RETURN_IF_ERROR(grow());
  MappedSlot* s = free_.back();
  free_.pop_back();
  store_flag(s->stop, 0);
  store_flag(s->cut, 0);
  std::atomic_ref<std::uint64_t>(s->counter).store(0, std::memory_order_seq_cst);
  return s;
}

void SlotPool::release(MappedSlot* s) noexcept {
  if (s == nullptr) return;
  std::lock_guard lock(mu_);
  free_.push_back(s);
}

Status SlotPool::grow() {
  void* chunk = nullptr;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&chunk, kChunkSlots * sizeof(MappedSlot),
                                                cudaHostAllocMapped | cudaHostAllocPortable));
  void* device_view = nullptr;
  Status s = ASYNCINFER_CUDA_STATUS(cudaHostGetDevicePointer(&device_view, chunk, 0));
  if (s.ok() && device_view != chunk) {
    s = unavailable_error("cuda:" + std::to_string(ordinal_) +
                          ": mapped host memory has a different device address (the backend "
                          "needs unified virtual addressing)");
  }
  if (!s.ok()) {
    (void)cudaFreeHost(chunk);
    return s;
  }
  chunks_.push_back(chunk);
  auto* slots = static_cast<MappedSlot*>(chunk);
  for (std::size_t i = 0; i < kChunkSlots; ++i) free_.push_back(&slots[i]);
  return Status();
}

// ---- MemoryCore -----------------------------------------------------------------------------

Result<std::shared_ptr<MemoryCore>> MemoryCore::create(int ordinal) {
  auto core = std::shared_ptr<MemoryCore>(new MemoryCore(ordinal));
  int supported = 0;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ordinal));
  ASYNCINFER_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&core->alloc_stream_, cudaStreamNonBlocking));
  if (supported != 0) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal;
    ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&core->pool_, &props));
    // Keep freed memory in the pool (like a caching allocator): no release at synchronisation.
    std::uint64_t keep_all = ~std::uint64_t{0};
    ASYNCINFER_CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(core->pool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
  }
  return core;
}

MemoryCore::~MemoryCore() {
  run_outside_callbacks([ordinal = ordinal_, pool = pool_, stream = alloc_stream_,
                         device = std::move(deferred_device_), pinned = std::move(pinned_all_)] {
    CudaDeviceGuard guard(ordinal);
    for (void* p : device) {
      if (pool != nullptr) {
        (void)cudaFreeAsync(p, stream);
      } else {
        (void)cudaFree(p);
      }
    }
    if (stream != nullptr) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
    }
    // Released once no allocation from it is outstanding (cudaMemPoolDestroy).
    if (pool != nullptr) (void)cudaMemPoolDestroy(pool);
    for (void* p : pinned) (void)cudaFreeHost(p);
    (void)cudaGetLastError();
  });
}

Result<std::shared_ptr<Storage>> MemoryCore::allocate_device(std::size_t bytes) {
  const Placement where{MemoryKind::device, ordinal_};
  if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, where, nullptr, false);
  CudaDeviceGuard guard(ordinal_);
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  flush_deferred();
  void* p = nullptr;
  Status s;
  if (pool_ != nullptr) {
    s = ASYNCINFER_CUDA_STATUS(cudaMallocFromPoolAsync(&p, bytes, pool_, alloc_stream_));
    // Usable by every stream once the allocating stream has passed it (it holds no kernels).
    if (s.ok()) s = ASYNCINFER_CUDA_STATUS(cudaStreamSynchronize(alloc_stream_));
  } else {
    s = ASYNCINFER_CUDA_STATUS(cudaMalloc(&p, bytes));
  }
  if (!s.ok()) {
    return Status(s.code() == StatusCode::internal ? StatusCode::resource_exhausted : s.code(),
                  "allocating " + std::to_string(bytes) + " bytes of device memory on cuda:" +
                      std::to_string(ordinal_) + ": " + std::string(s.message()));
  }
  auto self = shared_from_this();
  return std::make_shared<Storage>(
      p, bytes, where, [self](void* q) { release(self, q, 0, true); }, false);
}

Result<std::shared_ptr<Storage>> MemoryCore::allocate_pinned(std::size_t bytes) {
  const Placement where{MemoryKind::pinned_host, -1};
  if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, where, nullptr, true);
  const std::size_t cls = size_class(bytes);
  void* p = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = pinned_free_.find(cls);
    if (it != pinned_free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    }
  }
  if (p == nullptr) {
    CudaDeviceGuard guard(ordinal_);
    ASYNCINFER_RETURN_IF_ERROR(guard.status());
    Status s = ASYNCINFER_CUDA_STATUS(cudaHostAlloc(&p, cls, cudaHostAllocPortable));
    if (!s.ok()) {
      return Status(s.code() == StatusCode::internal ? StatusCode::resource_exhausted : s.code(),
                    "allocating " + std::to_string(bytes) +
                        " bytes of pinned host memory: " + std::string(s.message()));
    }
    std::lock_guard lock(mu_);
    pinned_all_.push_back(p);
  }
  auto self = shared_from_this();
  return std::make_shared<Storage>(
      p, bytes, where, [self, cls](void* q) { release(self, q, cls, false); }, true);
}

std::size_t MemoryCore::size_class(std::size_t bytes) {
  constexpr std::size_t kMin = 4096;
  if (bytes <= kMin) return kMin;
  const int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes - 1));
  const std::size_t step = std::size_t{1} << (log2 - 2);
  return (bytes + step - 1) / step * step;
}

void MemoryCore::release(const std::shared_ptr<MemoryCore>& self, void* p, std::size_t cls,
                         bool device) {
  if (device) {
    self->free_device(p);
  } else {
    std::lock_guard lock(self->mu_);
    self->pinned_free_[cls].push_back(p);  // cached until teardown: cudaFreeHost can synchronise
  }
}

void MemoryCore::free_device(void* p) {
  if (in_cuda_callback()) {
    std::lock_guard lock(mu_);
    deferred_device_.push_back(p);
    return;
  }
  CudaDeviceGuard guard(ordinal_);
  // The caller kept the tensor alive until the streams using it passed that use (device.hpp),
  // so freeing on the allocation stream cannot overlap them.
  if (pool_ != nullptr) {
    (void)ASYNCINFER_CUDA_STATUS(cudaFreeAsync(p, alloc_stream_));
  } else {
    (void)ASYNCINFER_CUDA_STATUS(cudaFree(p));
  }
}

void MemoryCore::flush_deferred() {
  std::vector<void*> frees;
  {
    std::lock_guard lock(mu_);
    frees.swap(deferred_device_);
  }
  for (void* p : frees) free_device(p);
}

}  // namespace asyncinfer::detail::cuda
