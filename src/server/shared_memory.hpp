// shared_memory.hpp — Triton's system shared memory extension: the regions clients register, and
// what inputs and outputs that name them are checked against, read from and written to.
//
// A client creates a POSIX shared memory object (shm_open; tritonclient's
// utils.shared_memory.create_shared_memory_region), writes its inputs there and registers a
// window of it under a name: (name, key, offset, byte_size). An input that names the region is
// then copied into the request when the request is decoded; an output that names one is written
// into it, and the response carries no data for it.
//
// Why copies, and no mapping (issue 45). The region is the client's memory, and a client can lie
// about it. A server that maps it and reads it in place is knocked over by a client that shrinks
// the object (ftruncate): the next read or write of a mapped page beyond the new end is SIGBUS,
// and the whole process dies with every client's connection. And a model that reads in place
// reads bytes the client may rewrite while the request waits, so the response cache's key (made
// at submit) and the model's input could differ: one client could store its chosen answer under
// another input's key. So a region keeps the object's descriptor, not a mapping: inputs are read
// with pread() at decode, into memory the request owns and counts against --max-inflight-bytes,
// and outputs are written with pwrite() after an fstat() that checks the object still holds the
// window. A truncated object gives a short count, which is that request's error; the key and the
// model see the same bytes; no address space or vm.max_map_count is spent per region. The cost is
// one copy of each input, as for an input in the request body.
//
// Lifetime: a region is a shared_ptr<const SharedMemoryRegion>. The manager holds one reference,
// each request that writes an output into the region another, and the descriptor is closed with
// the last: a region unregistered while requests use it stays open until they end (Triton's
// rule), and a name may be registered again at once.
//
// Limits: at most `max_regions` regions at once (--max-shm-regions): each holds one descriptor,
// taken from the budget that client connections share. Past it, a registration is
// resource_exhausted (HTTP 503 / gRPC RESOURCE_EXHAUSTED) naming the option.
//
// Errors, as Triton gives them (triton_extensions.md §11): a duplicate name is already_exists
// (HTTP 400); a key that cannot be opened is internal (500); a window outside the object, a tensor
// outside the window, or an object that no longer holds the window is invalid_argument (400); an
// unknown name in a request or a status call is invalid_argument.
//
// Source: Triton server docs/protocol/extension_shared_memory.md, src/shared_memory_manager.cc.
//
// Thread safety: every method may be called from any thread (one mutex over the name table;
// lookups are one map find under it; pread / pwrite at explicit offsets share no file position).
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

/// One registered window [offset, offset + byte_size) of a shared memory object, opened
/// read-write. Its descriptor is closed when the last reference goes.
class SharedMemoryRegion {
 public:
  /// Takes over `fd` (the object, opened read-write).
  SharedMemoryRegion(std::string name, std::string key, std::size_t offset, std::size_t byte_size,
                     int fd);
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const noexcept { return name_; }
  const std::string& key() const noexcept { return key_; }
  std::size_t offset() const noexcept { return offset_; }
  std::size_t byte_size() const noexcept { return byte_size_; }

  /// Copies `n` bytes from the window's byte `at` into `dst` (pread). invalid_argument naming
  /// `what` when the object now ends before them (the client shrank it), internal for another
  /// read error. The caller has checked [at, at + n) against byte_size(). Blocking: one or a
  /// few system calls.
  Status read(std::size_t at, void* dst, std::size_t n, const std::string& what) const;
  /// Copies `n` bytes from `src` to the window's byte `at` (pwrite), after checking that the
  /// object still holds them (a write past its end would grow the client's object).
  /// invalid_argument naming `what` when it does not, internal for another write error.
  Status write(std::size_t at, const void* src, std::size_t n, const std::string& what) const;

 private:
  /// The error of an object that ends before the window's byte `at + n`.
  Status truncated(std::size_t at, std::size_t n, std::size_t object_size,
                   const std::string& what) const;

  std::string name_;
  std::string key_;
  std::size_t offset_;
  std::size_t byte_size_;
  int fd_;
};

using SharedMemoryRef = std::shared_ptr<const SharedMemoryRegion>;

/// Where a tensor lies in a region: the parameters shared_memory_region, shared_memory_byte_size
/// and shared_memory_offset (relative to the region's window) of an input or an output.
struct SharedMemoryTensor {
  std::string region;
  std::size_t byte_size = 0;
  std::size_t offset = 0;
};

class MemoryBudget;

class SharedMemoryManager {
 public:
  /// `budget`: what inputs copied from regions are counted against (outlives the manager; may
  /// be null: not counted). `max_regions`: regions registered at once; 0 = no limit.
  SharedMemoryManager(MemoryBudget* budget, std::size_t max_regions)
      : budget_(budget), max_regions_(max_regions) {}
  SharedMemoryManager(const SharedMemoryManager&) = delete;
  SharedMemoryManager& operator=(const SharedMemoryManager&) = delete;

  /// Opens `key` (shm_open, read-write), checks that [offset, offset + byte_size) lies inside
  /// the object and keeps its descriptor. already_exists for a name in use; internal when the
  /// key cannot be opened; invalid_argument for an empty name or key, a zero byte_size, or a
  /// window outside the object; resource_exhausted when max_regions are registered. Blocking: a
  /// few system calls.
  Status register_region(const std::string& name, const std::string& key, std::size_t offset,
                         std::size_t byte_size);
  /// Forgets `name` (every region when empty); requests using it keep it open. An unknown
  /// name is not an error (Triton's rule).
  void unregister(std::string_view name);
  /// Every region (name empty), or the one named; invalid_argument for an unknown name.
  Result<std::vector<SharedMemoryRef>> status(std::string_view name) const;
  /// The region `name`, for a request; invalid_argument naming it when it is not registered.
  Result<SharedMemoryRef> find(std::string_view name) const;

  /// Checks that `t` (the parameters of tensor `what`) lies inside its region and returns the
  /// region; invalid_argument names the tensor, the region and the sizes.
  Result<SharedMemoryRef> window(const SharedMemoryTensor& t, const std::string& what) const;

  /// A new host tensor holding a copy of the `t.byte_size` bytes of `region` at `t.offset`,
  /// counted against the budget while it lives. For BYTES the bytes must hold numel()
  /// well-formed elements that fill them exactly; invalid_argument otherwise, naming `what`, and
  /// when the client's object no longer holds them; resource_exhausted when the budget cannot
  /// take them (--max-inflight-bytes).
  Result<Tensor> read_tensor(const SharedMemoryRef& region, const SharedMemoryTensor& t,
                             DType dtype, Shape shape, const std::string& what) const;

  std::size_t max_regions() const noexcept { return max_regions_; }

 private:
  MemoryBudget* const budget_;
  const std::size_t max_regions_;
  mutable std::mutex mu_;
  std::map<std::string, SharedMemoryRef, std::less<>> regions_;
};

}  // namespace asyncinfer::server
