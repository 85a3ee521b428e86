#include "asyncinfer/tensor.hpp"

#include "asyncinfer/detail/enum_names.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <utility>

namespace asyncinfer {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t size;
  std::string_view name;
};
constexpr std::array<DTypeInfo, 14> kDTypes = {{
    {DType::f32, 4, "f32"},
    {DType::f16, 2, "f16"},
    {DType::bf16, 2, "bf16"},
    {DType::f64, 8, "f64"},
    {DType::i8, 1, "i8"},
    {DType::u8, 1, "u8"},
    {DType::i32, 4, "i32"},
    {DType::i64, 8, "i64"},
    {DType::boolean, 1, "bool"},
    {DType::i16, 2, "i16"},
    {DType::u16, 2, "u16"},
    {DType::u32, 4, "u32"},
    {DType::u64, 8, "u64"},
    {DType::bytes, 0, "bytes"},
}};

constexpr bool indexed_by_dtype() {
  for (std::size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(indexed_by_dtype(), "kDTypes must be in DType order");

struct Alias {
  std::string_view name;
  DType dtype;
};
// Lower-case aliases; "TYPE_" prefixes (Triton model configs) are stripped before lookup.
constexpr std::array<Alias, 34> kAliases = {{
    {"f32", DType::f32},       {"fp32", DType::f32},     {"float32", DType::f32},
    {"float", DType::f32},     {"f16", DType::f16},      {"fp16", DType::f16},
    {"float16", DType::f16},   {"half", DType::f16},     {"bf16", DType::bf16},
    {"bfloat16", DType::bf16}, {"f64", DType::f64},      {"fp64", DType::f64},
    {"float64", DType::f64},   {"double", DType::f64},   {"i8", DType::i8},
    {"int8", DType::i8},       {"u8", DType::u8},        {"uint8", DType::u8},
    {"i32", DType::i32},       {"int32", DType::i32},    {"i64", DType::i64},
    {"int64", DType::i64},     {"bool", DType::boolean}, {"boolean", DType::boolean},
    {"i16", DType::i16},       {"int16", DType::i16},    {"u16", DType::u16},
    {"uint16", DType::u16},    {"u32", DType::u32},      {"uint32", DType::u32},
    {"u64", DType::u64},       {"uint64", DType::u64},   {"bytes", DType::bytes},
    {"string", DType::bytes},
}};

/// Length prefix of serialized bytes elements: 4 bytes, little-endian.
constexpr std::size_t kPrefix = 4;

std::uint32_t read_prefix(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

/// Offset, from `data`, of element `index` of serialized bytes elements (all of whose prefixes
/// lie within `size`: the tensor was checked when it was made).
Result<std::size_t> element_offset(const unsigned char* data, std::size_t size, std::size_t index) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < index; ++i) {
    if (size - at < kPrefix) {
      return invalid_argument_error("bytes element " + std::to_string(i) +
                                    ": its length prefix runs past the tensor's " +
                                    std::to_string(size) + " bytes");
    }
    const std::size_t len = read_prefix(data + at);
    at += kPrefix;
    if (len > size - at) {
      return invalid_argument_error("bytes element " + std::to_string(i) + " has length " +
                                    std::to_string(len) + ", beyond the " +
                                    std::to_string(size - at) + " bytes left");
    }
    at += len;
  }
  return at;
}

}  // namespace

std::size_t dtype_size(DType dtype) noexcept {
  return kDTypes[static_cast<std::size_t>(dtype)].size;
}

std::string_view to_string(DType dtype) noexcept {
  return kDTypes[static_cast<std::size_t>(dtype)].name;
}

Result<DType> parse_dtype(std::string_view name) {
  std::string lower;
  lower.reserve(name.size());
  for (char c : name)
    lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.rfind("type_", 0) == 0) lower.erase(0, 5);
  for (const Alias& a : kAliases) {
    if (a.name == lower) return a.dtype;
  }
  return invalid_argument_error("unknown dtype '" + std::string(name) +
                                "': expected one of f32, f16, bf16, f64, i8, u8, i16, u16, i32, "
                                "u32, i64, u64, bool, bytes (or float32, float16, bfloat16, "
                                "float64, int8, uint8, int16, uint16, int32, uint32, int64, "
                                "uint64, boolean, string; FP32, INT64, BYTES, TYPE_FP32, "
                                "TYPE_STRING, ...)");
}

namespace {
constexpr detail::EnumNames<MemoryKind, 3> kMemoryKindNames{{"host", "pinned_host", "device"}};
}  // namespace

std::string_view to_string(MemoryKind kind) noexcept { return kMemoryKindNames.name(kind); }

std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

Result<std::size_t> checked_element_count(std::span<const std::int64_t> shape) {
  std::size_t count = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t d = shape[i];
    if (d < 0) {
      return invalid_argument_error("shape " + shape_to_string(shape) + " has negative dim " +
                                    std::to_string(d) + " at index " + std::to_string(i) +
                                    ": dims must be >= 0");
    }
    const auto ud = static_cast<std::size_t>(d);
    if (ud != 0 && count > std::numeric_limits<std::size_t>::max() / ud) {
      return invalid_argument_error("shape " + shape_to_string(shape) +
                                    " has more elements than fit in size_t");
    }
    count *= ud;
  }
  return count;
}

Result<std::size_t> checked_byte_size(DType dtype, std::span<const std::int64_t> shape) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t count, checked_element_count(shape));
  const std::size_t es = dtype == DType::bytes ? kPrefix : dtype_size(dtype);
  if (count > std::numeric_limits<std::size_t>::max() / es) {
    return invalid_argument_error("shape " + shape_to_string(shape) + " of " +
                                  std::string(to_string(dtype)) +
                                  " has a byte size that overflows size_t");
  }
  return count * es;
}

Result<std::size_t> serialized_bytes_size(const void* data, std::size_t size, std::size_t count) {
  if (count > 0 && data == nullptr) return invalid_argument_error("bytes elements: no data");
  return element_offset(static_cast<const unsigned char*>(data), size, count);
}

void append_serialized_element(std::string& out, std::string_view element) {
  const auto n = static_cast<std::uint32_t>(element.size());
  const char prefix[kPrefix] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                                static_cast<char>((n >> 16) & 0xff),
                                static_cast<char>((n >> 24) & 0xff)};
  out.append(prefix, kPrefix);
  out.append(element);
}

Result<std::shared_ptr<Storage>> Storage::allocate_host(std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  // aligned_alloc needs a size that is a multiple of the alignment; guard the round-up.
  if (bytes > std::numeric_limits<std::size_t>::max() - kAlign) {
    return resource_exhausted_error("host allocation of " + std::to_string(bytes) +
                                    " bytes is too large");
  }
  const std::size_t rounded = std::max<std::size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    return resource_exhausted_error("host allocation of " + std::to_string(bytes) +
                                    " bytes failed");
  }
  return std::make_shared<Storage>(p, bytes, Placement{}, [](void* q) { std::free(q); });
}

Result<Tensor> Tensor::empty(DType dtype, Shape shape) {
  if (dtype == DType::bytes) return zeros(dtype, std::move(shape));  // elements must be readable
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t bytes, checked_byte_size(dtype, shape));
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(bytes));
  return from_storage(std::move(storage), dtype, std::move(shape));
}

Result<Tensor> Tensor::zeros(DType dtype, Shape shape) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t bytes, checked_byte_size(dtype, shape));
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(bytes));
  if (bytes > 0) std::memset(storage->data(), 0, bytes);  // bytes: every length prefix 0
  return from_storage_sized(std::move(storage), dtype, std::move(shape), 0, bytes);
}

Result<Tensor> Tensor::empty_like(const Tensor& like) {
  if (!like.defined()) return invalid_argument_error("Tensor::empty_like: undefined tensor");
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(like.byte_size()));
  return from_storage_sized(std::move(storage), like.dtype(), like.shape(), 0, like.byte_size());
}

Result<Tensor> Tensor::from_strings(Shape shape, std::span<const std::string> elements) {
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t count, checked_element_count(shape));
  if (count != elements.size()) {
    return invalid_argument_error("Tensor::from_strings: shape " + shape_to_string(shape) +
                                  " holds " + std::to_string(count) + " elements, got " +
                                  std::to_string(elements.size()));
  }
  std::string serialized;
  std::size_t total = 0;
  for (std::size_t i = 0; i < elements.size(); ++i) {
    if (elements[i].size() > 0xffffffffu) {
      return invalid_argument_error("Tensor::from_strings: element " + std::to_string(i) +
                                    " is 4 GiB or more; BYTES elements have a 32-bit length");
    }
    total += kPrefix + elements[i].size();
  }
  serialized.reserve(total);
  for (const std::string& e : elements) append_serialized_element(serialized, e);
  return from_serialized(std::move(shape), std::move(serialized));
}

Result<Tensor> Tensor::from_serialized(Shape shape, std::string serialized) {
  auto owned = std::make_unique<std::string>(std::move(serialized));
  // A std::string's buffer is not over-aligned, which bytes elements do not need.
  void* data = owned->data();
  const std::size_t size = owned->size();
  auto storage = std::make_shared<Storage>(data, size, Placement{},
                                           [s = owned.release()](void*) { delete s; });
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, from_storage(storage, DType::bytes, std::move(shape)));
  if (t.byte_size() != size) {
    return invalid_argument_error("BYTES " + shape_to_string(t.shape()) + ": " +
                                  std::to_string(size - t.byte_size()) + " bytes follow its " +
                                  std::to_string(t.numel()) + " elements");
  }
  return t;
}

Result<Tensor> Tensor::from_storage_sized(std::shared_ptr<Storage> storage, DType dtype,
                                          Shape shape, std::size_t offset, std::size_t byte_size) {
  if (!storage) return invalid_argument_error("Tensor::from_storage_sized: storage is null");
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t least, checked_byte_size(dtype, shape));
  if (dtype == DType::bytes ? byte_size < least : byte_size != least) {
    return invalid_argument_error("Tensor::from_storage_sized: " + std::string(to_string(dtype)) +
                                  shape_to_string(shape) + " cannot be " +
                                  std::to_string(byte_size) + " bytes");
  }
  if (offset > storage->bytes() || byte_size > storage->bytes() - offset) {
    return invalid_argument_error("Tensor::from_storage_sized: " + std::to_string(byte_size) +
                                  " bytes at offset " + std::to_string(offset) +
                                  " do not fit in storage of " + std::to_string(storage->bytes()) +
                                  " bytes");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t count, checked_element_count(shape));
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.numel_ = count;
  t.byte_size_ = byte_size;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  return t;
}

Result<Tensor> Tensor::from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape,
                                    std::size_t offset) {
  if (!storage) return invalid_argument_error("Tensor::from_storage: storage is null");
  if (dtype == DType::bytes) {
    ASYNCINFER_ASSIGN_OR_RETURN(std::size_t count, checked_element_count(shape));
    if (!storage->host_accessible()) {
      return invalid_argument_error("Tensor::from_storage: a bytes tensor needs host memory");
    }
    if (offset > storage->bytes()) {
      return invalid_argument_error("Tensor::from_storage: offset " + std::to_string(offset) +
                                    " is beyond storage of " + std::to_string(storage->bytes()) +
                                    " bytes");
    }
    auto size = serialized_bytes_size(static_cast<const unsigned char*>(storage->data()) + offset,
                                      storage->bytes() - offset, count);
    if (!size.ok()) return size.status().with_context("BYTES " + shape_to_string(shape));
    return from_storage_sized(std::move(storage), dtype, std::move(shape), offset, *size);
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t bytes, checked_byte_size(dtype, shape));
  if (offset > storage->bytes() || bytes > storage->bytes() - offset) {
    return invalid_argument_error(
        "Tensor::from_storage: " + std::string(to_string(dtype)) + shape_to_string(shape) + " (" +
        std::to_string(bytes) + " bytes) at offset " + std::to_string(offset) +
        " does not fit in storage of " + std::to_string(storage->bytes()) + " bytes");
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.numel_ = bytes / dtype_size(dtype);
  t.byte_size_ = bytes;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  return t;
}

Placement Tensor::placement() const noexcept {
  return storage_ ? storage_->placement() : Placement{};
}

bool Tensor::is_host_accessible() const noexcept {
  return storage_ != nullptr && storage_->host_accessible();
}

Result<std::vector<std::string_view>> Tensor::string_elements() const {
  if (dtype_ != DType::bytes) {
    return invalid_argument_error("string_elements of " + describe() + ": not a bytes tensor");
  }
  if (numel_ > 0 && !is_host_accessible()) {
    return failed_precondition_error("string_elements of device tensor " + describe());
  }
  std::vector<std::string_view> out;
  out.reserve(numel_);
  const auto* base = static_cast<const unsigned char*>(data());
  std::size_t at = 0;
  for (std::size_t i = 0; i < numel_; ++i) {
    ASYNCINFER_ASSIGN_OR_RETURN(std::size_t next, element_offset(base + at, byte_size_ - at, 1));
    out.emplace_back(reinterpret_cast<const char*>(base + at + kPrefix), next - kPrefix);
    at += next;
  }
  return out;
}

Result<Tensor> Tensor::slice(std::int64_t begin, std::int64_t end) const {
  if (!defined()) return invalid_argument_error("slice of an undefined tensor");
  if (shape_.empty()) return invalid_argument_error("slice of a rank-0 tensor " + describe());
  if (begin < 0 || end < begin || end > shape_[0]) {
    return invalid_argument_error("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                  ") is outside dim 0 of " + describe());
  }
  const std::size_t row_elems = shape_[0] == 0 ? 0 : numel_ / static_cast<std::size_t>(shape_[0]);
  if (dtype_ == DType::bytes) {
    if (!is_host_accessible()) {
      return failed_precondition_error("slice of device bytes tensor " + describe());
    }
    const auto* base = static_cast<const unsigned char*>(data());
    const auto b = static_cast<std::size_t>(begin) * row_elems;
    const auto e = static_cast<std::size_t>(end) * row_elems;
    ASYNCINFER_ASSIGN_OR_RETURN(std::size_t from, element_offset(base, byte_size_, b));
    ASYNCINFER_ASSIGN_OR_RETURN(std::size_t len,
                                element_offset(base + from, byte_size_ - from, e - b));
    Shape s = shape_;
    s[0] = end - begin;
    return from_storage_sized(storage_, dtype_, std::move(s), offset_ + from, len);
  }
  const std::size_t row_bytes = row_elems * dtype_size(dtype_);
  Shape s = shape_;
  s[0] = end - begin;
  return from_storage(storage_, dtype_, std::move(s),
                      offset_ + static_cast<std::size_t>(begin) * row_bytes);
}

Result<Tensor> Tensor::reshape(Shape shape) const {
  if (!defined()) return invalid_argument_error("reshape of an undefined tensor");
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t n, checked_element_count(shape));
  if (n != numel_) {
    return invalid_argument_error("cannot reshape " + describe() + " to " + shape_to_string(shape) +
                                  ": element counts differ");
  }
  return from_storage_sized(storage_, dtype_, std::move(shape), offset_, byte_size_);
}

Result<Tensor> Tensor::clone() const {
  if (!defined()) return invalid_argument_error("clone of an undefined tensor");
  if (!is_host_accessible()) {
    return failed_precondition_error("clone of device tensor " + describe() +
                                     ": copy it to the host on a stream first");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, empty_like(*this));
  if (byte_size() > 0) std::memcpy(t.data(), data(), byte_size());
  return t;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(to_string(dtype_)) + shape_to_string(shape_);
}

Result<Tensor> concat_dim0(std::span<const Tensor> parts) {
  if (parts.empty()) return invalid_argument_error("concat_dim0: no tensors given");
  const Tensor& first = parts[0];
  if (!first.defined() || first.rank() == 0) {
    return invalid_argument_error("concat_dim0: part 0 must be a defined tensor of rank >= 1");
  }
  std::int64_t rows = 0;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    if (!p.defined() || !p.is_host_accessible()) {
      return invalid_argument_error("concat_dim0: part " + std::to_string(i) +
                                    " is undefined or not host-accessible");
    }
    if (p.dtype() != first.dtype() || p.rank() != first.rank() ||
        !std::equal(p.shape().begin() + 1, p.shape().end(), first.shape().begin() + 1)) {
      return invalid_argument_error("concat_dim0: part " + std::to_string(i) + " is " +
                                    p.describe() + " but part 0 is " + first.describe() +
                                    " (dtype and dims after dim 0 must match)");
    }
    rows += p.dim(0);
    bytes += p.byte_size();
  }
  Shape shape = first.shape();
  shape[0] = rows;
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(bytes));
  ASYNCINFER_ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::from_storage_sized(std::move(storage), first.dtype(), std::move(shape), 0, bytes));
  auto* dst = static_cast<unsigned char*>(out.data());
  for (const Tensor& p : parts) {
    if (p.byte_size() > 0) std::memcpy(dst, p.data(), p.byte_size());
    dst += p.byte_size();
  }
  return out;
}

}  // namespace asyncinfer
