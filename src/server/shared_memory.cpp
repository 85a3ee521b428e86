// SharedMemoryManager (shared_memory.hpp): registering and finding the system shared memory
// regions of Triton's extension, and the copies in and out of them.
#include "shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>  // shm_open
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "limits.hpp"
#include "model_config.hpp"

namespace asyncinfer::server {

SharedMemoryRegion::SharedMemoryRegion(std::string name, std::string key, std::size_t offset,
                                       std::size_t byte_size, int fd)
    : name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      fd_(fd) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  if (fd_ >= 0) ::close(fd_);
}

Status SharedMemoryRegion::truncated(std::size_t at, std::size_t n, std::size_t object_size,
                                     const std::string& what) const {
  return invalid_argument_error(what + ": shared memory region '" + name_ + "' (key '" + key_ +
                                "') needs bytes " + std::to_string(offset_ + at) + " to " +
                                std::to_string(offset_ + at + n) +
                                " of its object, which now holds " + std::to_string(object_size) +
                                " bytes (it was shrunk after registration)");
}

Status SharedMemoryRegion::read(std::size_t at, void* dst, std::size_t n,
                                const std::string& what) const {
  auto* out = static_cast<unsigned char*>(dst);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset_ + at + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return internal_error(what + ": reading shared memory region '" + name_ +
                            "': " + std::strerror(errno));
    }
    if (got == 0) {  // the end of the object: say how large it is now
      struct stat st {};
      const std::size_t size =
          ::fstat(fd_, &st) == 0 ? static_cast<std::size_t>(st.st_size) : offset_ + at + done;
      return truncated(at, n, size, what);
    }
    done += static_cast<std::size_t>(got);
  }
  return Status();
}

Status SharedMemoryRegion::write(std::size_t at, const void* src, std::size_t n,
                                 const std::string& what) const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    return internal_error(what + ": shared memory region '" + name_ + "': " + std::strerror(errno));
  }
  const auto object_size = static_cast<std::size_t>(st.st_size);
  if (offset_ + at + n > object_size) return truncated(at, n, object_size, what);
  const auto* in = static_cast<const unsigned char*>(src);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t put = ::pwrite(fd_, in + done, n - done, static_cast<off_t>(offset_ + at + done));
    if (put < 0) {
      if (errno == EINTR) continue;
      return internal_error(what + ": writing shared memory region '" + name_ +
                            "': " + std::strerror(errno));
    }
    done += static_cast<std::size_t>(put);
  }
  return Status();
}

Status SharedMemoryManager::register_region(const std::string& name, const std::string& key,
                                            std::size_t offset, std::size_t byte_size) {
  const std::string what = "shared memory region '" + name + "'";
  if (name.empty()) return invalid_argument_error("a shared memory region needs a name");
  if (key.empty()) return invalid_argument_error(what + ": \"key\" is empty");
  if (key.find('\0') != std::string::npos) {
    return invalid_argument_error(what + ": \"key\" holds a NUL byte");
  }
  if (byte_size == 0) return invalid_argument_error(what + ": byte_size must be at least 1");
  auto check_table = [&]() -> Status {  // under mu_
    if (regions_.count(name) > 0) {
      return already_exists_error(what + " is already registered; unregister it first");
    }
    if (max_regions_ != 0 && regions_.size() >= max_regions_) {
      return resource_exhausted_error(
          "cannot register " + what + ": " + std::to_string(regions_.size()) +
          " shared memory regions are registered, the limit (--max-shm-regions " +
          std::to_string(max_regions_) + "); unregister one first");
    }
    return Status();
  };
  {
    std::lock_guard lock(mu_);
    ASYNCINFER_RETURN_IF_ERROR(check_table());
  }
  // Opened outside the lock: a slow file system call never holds up the requests that look
  // regions up.
  const int fd = ::shm_open(key.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    return internal_error("unable to open shared memory key '" + key + "' for " + what + ": " +
                          std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return internal_error("unable to stat shared memory key '" + key + "': " + std::strerror(e));
  }
  const auto object_size = static_cast<std::size_t>(st.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    ::close(fd);
    return invalid_argument_error(what + ": offset " + std::to_string(offset) + " + byte_size " +
                                  std::to_string(byte_size) + " lies beyond the " +
                                  std::to_string(object_size) + " bytes of '" + key + "'");
  }
  auto region = std::make_shared<const SharedMemoryRegion>(name, key, offset, byte_size, fd);
  std::lock_guard lock(mu_);
  ASYNCINFER_RETURN_IF_ERROR(check_table());  // registered meanwhile; the region closes fd
  regions_.emplace(name, std::move(region));
  return Status();
}

void SharedMemoryManager::unregister(std::string_view name) {
  std::map<std::string, SharedMemoryRef, std::less<>> gone;  // closed outside the lock
  std::lock_guard lock(mu_);
  if (name.empty()) {
    gone.swap(regions_);
    return;
  }
  if (auto it = regions_.find(name); it != regions_.end()) {
    gone.emplace(it->first, std::move(it->second));
    regions_.erase(it);
  }
}

Result<std::vector<SharedMemoryRef>> SharedMemoryManager::status(std::string_view name) const {
  std::lock_guard lock(mu_);
  std::vector<SharedMemoryRef> out;
  if (name.empty()) {
    for (const auto& [n, r] : regions_) out.push_back(r);
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return invalid_argument_error("no shared memory region '" + std::string(name) +
                                  "' is registered");
  }
  out.push_back(it->second);
  return out;
}

Result<SharedMemoryRef> SharedMemoryManager::find(std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return invalid_argument_error("no shared memory region '" + std::string(name) +
                                  "' is registered");
  }
  return it->second;
}

Result<SharedMemoryRef> SharedMemoryManager::window(const SharedMemoryTensor& t,
                                                    const std::string& what) const {
  auto region = find(t.region);
  if (!region.ok()) return region.status().with_context(what);
  const std::size_t size = (*region)->byte_size();
  if (t.offset > size || t.byte_size > size - t.offset) {
    return invalid_argument_error(what + ": shared_memory_offset " + std::to_string(t.offset) +
                                  " + shared_memory_byte_size " + std::to_string(t.byte_size) +
                                  " lies beyond the " + std::to_string(size) +
                                  " bytes of shared memory region '" + t.region + "'");
  }
  return region;
}

Result<Tensor> SharedMemoryManager::read_tensor(const SharedMemoryRef& region,
                                                const SharedMemoryTensor& t, DType dtype,
                                                Shape shape, const std::string& what) const {
  if (dtype != DType::bytes) {
    auto expected = checked_byte_size(dtype, shape);
    if (!expected.ok()) return expected.status().with_context(what);
    if (*expected != t.byte_size) {
      return invalid_argument_error(
          what + ": shared_memory_byte_size " + std::to_string(t.byte_size) +
          " does not match shape " + shape_to_string(shape) + " of " +
          std::string(oip_datatype(dtype)) + " (" + std::to_string(*expected) + " bytes)");
    }
  }
  // The copy is counted against the in-flight budget for as long as it lives, as a request
  // body is: a 200-byte request naming a 2 GiB window is refused past the limit, not held.
  auto lease = std::make_shared<MemoryBudget::Lease>(budget_ != nullptr ? budget_->lease()
                                                                        : MemoryBudget::Lease());
  if (!lease->reserve(t.byte_size)) {
    return resource_exhausted_error(what + " (" + std::to_string(t.byte_size) +
                                    " bytes in shared memory region '" + t.region +
                                    "'): " + budget_->exhausted_message(t.byte_size));
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Storage> copy, Storage::allocate_host(t.byte_size));
  ASYNCINFER_RETURN_IF_ERROR(region->read(t.offset, copy->data(), t.byte_size, what));
  // The tensor's storage holds the copy and the lease: the budget gets the bytes back when
  // the last view of the input goes.
  void* bytes = copy->data();
  auto storage = std::make_shared<Storage>(bytes, t.byte_size, Placement{},
                                           [copy = std::move(copy), lease](void*) mutable {
                                             copy.reset();
                                             lease->release();
                                           });
  if (dtype == DType::bytes) {
    auto tensor = Tensor::from_storage(storage, dtype, std::move(shape));
    if (!tensor.ok()) return tensor.status().with_context(what + " (in shared memory)");
    if (tensor->byte_size() != t.byte_size) {
      return invalid_argument_error(
          what + ": shared_memory_byte_size " + std::to_string(t.byte_size) + " holds " +
          std::to_string(t.byte_size - tensor->byte_size()) + " bytes after its " +
          std::to_string(tensor->numel()) + " BYTES elements");
    }
    return tensor;
  }
  return Tensor::from_storage(std::move(storage), dtype, std::move(shape));
}

}  // namespace asyncinfer::server
