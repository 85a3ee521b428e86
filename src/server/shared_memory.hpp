// shared_memory.hpp — Triton's system shared memory extension: the regions clients register,
// mapped into the server, and what inputs and outputs that name them are checked against.
//
// A client creates a POSIX shared memory object (shm_open; tritonclient's
// utils.shared_memory.create_shared_memory_region), writes its inputs there and registers a
// window of it under a name: (name, key, offset, byte_size). An input that names the region is
// then read in place, without a copy into the request; an output that names one is written into
// it, and the response carries no data for it.
//
// Lifetime: a region is a shared_ptr<const SharedMemoryRegion>. The manager holds one reference,
// each request that reads or writes the region another, and the mapping goes with the last: a
// region unregistered while requests use it stays mapped until they end (Triton's rule), and a
// name may be registered again at once.
//
// Errors, as Triton gives them (triton_extensions.md §11): a duplicate name is already_exists
// (HTTP 400); a key that cannot be opened or mapped is internal (500); a window outside the
// object, or a tensor outside the window, is invalid_argument (400); an unknown name in a request
// or a status call is invalid_argument.
//
// Source: Triton server docs/protocol/extension_shared_memory.md, src/shared_memory_manager.cc.
//
// Thread safety: every method may be called from any thread (one mutex over the name table;
// lookups are one map find under it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer::server {

/// One registered window [offset, offset + byte_size) of a shared memory object, mapped
/// read-write. Unmapped when the last reference goes.
class SharedMemoryRegion {
 public:
  /// Takes over `mapping` (mmap'd, `mapping_size` bytes), whose byte `window_start` is the
  /// object's byte `offset`.
  SharedMemoryRegion(std::string name, std::string key, std::size_t offset, std::size_t byte_size,
                     void* mapping, std::size_t mapping_size, std::size_t window_start);
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const noexcept { return name_; }
  const std::string& key() const noexcept { return key_; }
  std::size_t offset() const noexcept { return offset_; }
  std::size_t byte_size() const noexcept { return byte_size_; }
  /// The window's first byte (the object's byte `offset`).
  unsigned char* data() const noexcept {
    return static_cast<unsigned char*>(mapping_) + window_start_;
  }

 private:
  std::string name_;
  std::string key_;
  std::size_t offset_;
  std::size_t byte_size_;
  void* mapping_;
  std::size_t mapping_size_;
  std::size_t window_start_;
};

using SharedMemoryRef = std::shared_ptr<const SharedMemoryRegion>;

/// Where a tensor lies in a region: the parameters shared_memory_region, shared_memory_byte_size
/// and shared_memory_offset (relative to the region's window) of an input or an output.
struct SharedMemoryTensor {
  std::string region;
  std::size_t byte_size = 0;
  std::size_t offset = 0;
};

class SharedMemoryManager {
 public:
  SharedMemoryManager() = default;
  SharedMemoryManager(const SharedMemoryManager&) = delete;
  SharedMemoryManager& operator=(const SharedMemoryManager&) = delete;

  /// Opens `key` (shm_open, read-write), checks that [offset, offset + byte_size) lies inside
  /// the object and maps it. already_exists for a name in use; internal when the key cannot be
  /// opened or mapped; invalid_argument for an empty name or key, a zero byte_size, or a window
  /// outside the object. Blocking: a few system calls.
  Status register_region(const std::string& name, const std::string& key, std::size_t offset,
                         std::size_t byte_size);
  /// Forgets `name` (every region when empty); requests using it keep their mapping. An unknown
  /// name is not an error (Triton's rule).
  void unregister(std::string_view name);
  /// Every region (name empty), or the one named; invalid_argument for an unknown name.
  Result<std::vector<SharedMemoryRef>> status(std::string_view name) const;
  /// The region `name`, for a request; invalid_argument naming it when it is not registered.
  Result<SharedMemoryRef> find(std::string_view name) const;

  /// Checks that `t` (the parameters of tensor `what`) lies inside its region and returns the
  /// region; invalid_argument names the tensor, the region and the sizes.
  Result<SharedMemoryRef> window(const SharedMemoryTensor& t, const std::string& what) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, SharedMemoryRef, std::less<>> regions_;
};

/// A host tensor that views `byte_size` bytes of `region` from `offset` in place and keeps the
/// region mapped while it lives. For BYTES the bytes must hold numel() well-formed elements that
/// fill them exactly; invalid_argument otherwise, naming `what`.
Result<Tensor> tensor_in_region(const SharedMemoryRef& region, const SharedMemoryTensor& t,
                                DType dtype, Shape shape, const std::string& what);

}  // namespace asyncinfer::server
