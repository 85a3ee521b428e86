#include "asyncinfer/tensor.hpp"

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
constexpr std::array<DTypeInfo, 13> kDTypes = {{
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
constexpr std::array<Alias, 32> kAliases = {{
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
    {"u64", DType::u64},       {"uint64", DType::u64},
}};

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
                                "u32, i64, u64, bool (or float32, float16, bfloat16, float64, "
                                "int8, uint8, int16, uint16, int32, uint32, int64, uint64, "
                                "boolean; FP32, INT64, TYPE_FP32, ...)");
}

std::string_view to_string(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::host:
      return "host";
    case MemoryKind::pinned_host:
      return "pinned_host";
    case MemoryKind::device:
      return "device";
  }
  return "unknown";
}

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
  const std::size_t es = dtype_size(dtype);
  if (count > std::numeric_limits<std::size_t>::max() / es) {
    return invalid_argument_error("shape " + shape_to_string(shape) + " of " +
                                  std::string(to_string(dtype)) +
                                  " has a byte size that overflows size_t");
  }
  return count * es;
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
  ASYNCINFER_ASSIGN_OR_RETURN(std::size_t bytes, checked_byte_size(dtype, shape));
  ASYNCINFER_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(bytes));
  return from_storage(std::move(storage), dtype, std::move(shape));
}

Result<Tensor> Tensor::zeros(DType dtype, Shape shape) {
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, empty(dtype, std::move(shape)));
  if (t.byte_size() > 0) std::memset(t.data(), 0, t.byte_size());
  return t;
}

Result<Tensor> Tensor::from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape,
                                    std::size_t offset) {
  if (!storage) return invalid_argument_error("Tensor::from_storage: storage is null");
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

Result<Tensor> Tensor::slice(std::int64_t begin, std::int64_t end) const {
  if (!defined()) return invalid_argument_error("slice of an undefined tensor");
  if (shape_.empty()) return invalid_argument_error("slice of a rank-0 tensor " + describe());
  if (begin < 0 || end < begin || end > shape_[0]) {
    return invalid_argument_error("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                  ") is outside dim 0 of " + describe());
  }
  const std::size_t row_elems = shape_[0] == 0 ? 0 : numel_ / static_cast<std::size_t>(shape_[0]);
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
  return from_storage(storage_, dtype_, std::move(shape), offset_);
}

Result<Tensor> Tensor::clone() const {
  if (!defined()) return invalid_argument_error("clone of an undefined tensor");
  if (!is_host_accessible()) {
    return failed_precondition_error("clone of device tensor " + describe() +
                                     ": copy it to the host on a stream first");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, empty(dtype_, shape_));
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
  }
  Shape shape = first.shape();
  shape[0] = rows;
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(first.dtype(), std::move(shape)));
  auto* dst = static_cast<unsigned char*>(out.data());
  for (const Tensor& p : parts) {
    if (p.byte_size() > 0) std::memcpy(dst, p.data(), p.byte_size());
    dst += p.byte_size();
  }
  return out;
}

}  // namespace asyncinfer
