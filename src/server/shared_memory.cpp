// SharedMemoryManager (shared_memory.hpp): registering, mapping and finding the system shared
// memory regions of Triton's extension, and the in-place tensors over them.
#include "shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "model_config.hpp"

namespace asyncinfer::server {

SharedMemoryRegion::SharedMemoryRegion(std::string name, std::string key, std::size_t offset,
                                       std::size_t byte_size, void* mapping,
                                       std::size_t mapping_size, std::size_t window_start)
    : name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      mapping_(mapping),
      mapping_size_(mapping_size),
      window_start_(window_start) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
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
  {
    std::lock_guard lock(mu_);
    if (regions_.count(name) > 0) {
      return already_exists_error(what + " is already registered; unregister it first");
    }
  }
  // Opened and mapped outside the lock: a slow file system call never holds up the requests
  // that look regions up.
  const int fd = ::shm_open(key.c_str(), O_RDWR, 0);
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
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t map_from = offset / page * page;  // mmap's offset must be page-aligned
  const std::size_t window_start = offset - map_from;
  const std::size_t length = window_start + byte_size;
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(map_from));
  const int e = errno;
  ::close(fd);  // the mapping keeps the object
  if (p == MAP_FAILED) {
    return internal_error("unable to map shared memory key '" + key + "' for " + what + ": " +
                          std::strerror(e));
  }
  auto region =
      std::make_shared<const SharedMemoryRegion>(name, key, offset, byte_size, p, length,
                                                 window_start);
  std::lock_guard lock(mu_);
  if (!regions_.emplace(name, std::move(region)).second) {  // registered meanwhile
    return already_exists_error(what + " is already registered; unregister it first");
  }
  return Status();
}

void SharedMemoryManager::unregister(std::string_view name) {
  std::map<std::string, SharedMemoryRef, std::less<>> gone;  // unmapped outside the lock
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

Result<Tensor> tensor_in_region(const SharedMemoryRef& region, const SharedMemoryTensor& t,
                                DType dtype, Shape shape, const std::string& what) {
  // The storage views the client's bytes; its deleter only lets go of the region.
  auto storage = std::make_shared<Storage>(region->data() + t.offset, t.byte_size, Placement{},
                                           [keep = region](void*) {});
  if (dtype == DType::bytes) {
    auto tensor = Tensor::from_storage(storage, dtype, std::move(shape));
    if (!tensor.ok()) return tensor.status().with_context(what + " (in shared memory)");
    if (tensor->byte_size() != t.byte_size) {
      return invalid_argument_error(what + ": shared_memory_byte_size " +
                                    std::to_string(t.byte_size) + " holds " +
                                    std::to_string(t.byte_size - tensor->byte_size()) +
                                    " bytes after its " + std::to_string(tensor->numel()) +
                                    " BYTES elements");
    }
    return tensor;
  }
  auto expected = checked_byte_size(dtype, shape);
  if (!expected.ok()) return expected.status().with_context(what);
  if (*expected != t.byte_size) {
    return invalid_argument_error(what + ": shared_memory_byte_size " +
                                  std::to_string(t.byte_size) + " does not match shape " +
                                  shape_to_string(shape) + " of " + std::string(oip_datatype(dtype)) +
                                  " (" + std::to_string(*expected) + " bytes)");
  }
  return Tensor::from_storage(std::move(storage), dtype, std::move(shape));
}

}  // namespace asyncinfer::server
