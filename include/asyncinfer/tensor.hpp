// tensor.hpp — typed, shaped, contiguous bytes with reference-counted storage.
//
// Design: a Tensor is a small value (dtype, shape, byte offset) over a shared `Storage`. Copying a
// Tensor shares the bytes (it is a view); `clone()` copies them. A batch is split back into
// per-request outputs with `slice()` along dim 0, which shares storage (no copy). Storage knows
// where it lives (host, pinned host, or a device) and how to free itself, so memory allocated by
// a device backend is released by that backend when the last Tensor referring to it goes.
//
// Variable-length elements (DType::bytes, the protocol's BYTES and Triton's TYPE_STRING) are held
// in their serialized form, as Triton holds them: per element, in row-major order, a 4-byte
// little-endian length and then that many bytes, with no padding. That form is what the binary
// extension, gRPC's raw contents, shared memory and warm-up files carry, so a BYTES tensor goes
// from the wire to a model and back without being re-encoded. Its byte_size() is the serialized
// size (prefixes included); every constructor that takes existing bytes checks that exactly
// numel() well-formed elements fill it.
//
// Invariants:
//   - every dim is >= 0 and the byte size (product of dims × dtype size; for bytes, the serialized
//     size) fits in size_t: a shape whose size overflows is rejected with invalid_argument, never
//     wrapped;
//   - offset + byte_size() <= storage bytes;
//   - storage is contiguous row-major (C order); views never change strides.
//
// Thread safety: Tensor is a value; the storage's reference count is atomic. Concurrent writes to
// the same bytes are the caller's to order (by stream order or events).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer {

/// Element types, in short forms (f32 = FP32, ...). The Open Inference Protocol's names (FP32,
/// FP16, BF16, FP64, INT8, UINT8, INT32, INT64, BOOL, INT16, UINT16, UINT32, UINT64, BYTES) map
/// one to one; later additions come last so that earlier values keep their numbers. `bytes` has
/// variable-length elements (see the file comment for its serialized form).
enum class DType : std::uint8_t {
  f32,
  f16,
  bf16,
  f64,
  i8,
  u8,
  i32,
  i64,
  boolean,
  i16,
  u16,
  u32,
  u64,
  bytes
};

/// Bytes per element: f32 4, f16 2, bf16 2, f64 8, i8 1, u8 1, i32 4, i64 8, bool 1, i16 2,
/// u16 2, u32 4, u64 8; 0 for bytes, whose elements have no fixed size.
std::size_t dtype_size(DType dtype) noexcept;
/// Short name: "f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64", "bool", "i16", "u16",
/// "u32", "u64", "bytes".
std::string_view to_string(DType dtype) noexcept;
/// Whether elements have a variable length (DType::bytes).
constexpr bool is_variable_size(DType dtype) noexcept { return dtype == DType::bytes; }
/// Accepts the short names and common aliases ("float32", "float", "FP32", "TYPE_FP32",
/// "int64", "uint8", "bool", "INT16", "UINT64", "BYTES", "TYPE_STRING", "string", ...).
/// invalid_argument names the accepted forms.
Result<DType> parse_dtype(std::string_view name);

/// Storage for IEEE half and bfloat16 values (bit patterns; conversion is the caller's).
struct Float16 {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};

/// The dtype matching a C++ element type, for typed access.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<Float16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<std::int8_t> {
  static constexpr DType value = DType::i8;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};
template <>
struct dtype_of<std::int16_t> {
  static constexpr DType value = DType::i16;
};
template <>
struct dtype_of<std::uint16_t> {
  static constexpr DType value = DType::u16;
};
template <>
struct dtype_of<std::uint32_t> {
  static constexpr DType value = DType::u32;
};
template <>
struct dtype_of<std::uint64_t> {
  static constexpr DType value = DType::u64;
};

using Shape = std::vector<std::int64_t>;

/// "[4,1,32,32]".
std::string shape_to_string(std::span<const std::int64_t> shape);
/// Product of dims; invalid_argument for a negative dim or an overflow.
Result<std::size_t> checked_element_count(std::span<const std::int64_t> shape);
/// Product of dims × dtype_size; invalid_argument for a negative dim or an overflow of size_t.
/// For bytes, the smallest serialized size (every element empty: 4 bytes each).
Result<std::size_t> checked_byte_size(DType dtype, std::span<const std::int64_t> shape);

/// The serialized size of `count` elements starting at `data` (at most `size` bytes): each a
/// 4-byte little-endian length and its bytes. invalid_argument names the element whose length
/// prefix, or whose bytes, run past the end. O(count); reads only the prefixes.
Result<std::size_t> serialized_bytes_size(const void* data, std::size_t size, std::size_t count);
/// Appends one element in serialized form (its 4-byte little-endian length, then its bytes).
/// Elements of 4 GiB or more cannot be represented; the caller checks.
void append_serialized_element(std::string& out, std::string_view element);

/// Where bytes live.
enum class MemoryKind : std::uint8_t {
  host,         ///< pageable host memory
  pinned_host,  ///< page-locked host memory (fast asynchronous copies on a device with DMA)
  device,       ///< memory of device `device_id` (on cpu/sim, host memory owned by that device)
};
std::string_view to_string(MemoryKind kind) noexcept;

struct Placement {
  MemoryKind kind = MemoryKind::host;
  int device_id = -1;  ///< for device memory; -1 for host memory
  friend bool operator==(const Placement&, const Placement&) = default;
};

/// A block of bytes with its placement and its deleter. Shared by reference count between the
/// tensors that view it; freed by the deleter when the last one goes.
class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  /// `host_accessible`: whether the host may read and write the bytes directly (true for host
  /// memory, and for the device memory of cpu and sim, which is host memory underneath).
  Storage(void* data, std::size_t bytes, Placement placement, Deleter deleter, bool host_accessible)
      : data_(data),
        bytes_(bytes),
        placement_(placement),
        host_accessible_(host_accessible),
        deleter_(std::move(deleter)) {}
  Storage(void* data, std::size_t bytes, Placement placement, Deleter deleter)
      : Storage(data, bytes, placement, std::move(deleter), placement.kind != MemoryKind::device) {}
  ~Storage() {
    if (deleter_ && data_ != nullptr) deleter_(data_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  Placement placement() const noexcept { return placement_; }
  bool host_accessible() const noexcept { return host_accessible_; }

  /// 64-byte aligned pageable host memory; resource_exhausted if the allocation fails.
  static Result<std::shared_ptr<Storage>> allocate_host(std::size_t bytes);

 private:
  void* data_;
  std::size_t bytes_;
  Placement placement_;
  bool host_accessible_;
  Deleter deleter_;
};

class Tensor {
 public:
  /// An undefined tensor (no storage); defined() is false.
  Tensor() = default;

  /// A new host tensor of `shape`, contents uninitialised (for bytes: every element the empty
  /// string). invalid_argument for a bad shape, resource_exhausted when memory runs out.
  static Result<Tensor> empty(DType dtype, Shape shape);
  /// A new host tensor filled with zero bytes (for bytes: every element the empty string).
  static Result<Tensor> zeros(DType dtype, Shape shape);
  /// A view of `storage` from byte `offset`; invalid_argument when it does not fit. For bytes the
  /// storage must be host-accessible and hold numel() well-formed serialized elements from
  /// `offset` (the view's byte size is theirs); invalid_argument names the first bad element.
  static Result<Tensor> from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape,
                                     std::size_t offset = 0);
  /// A view of exactly `byte_size` bytes of `storage` from `offset`, whose contents are not read:
  /// for a bytes tensor whose elements are written afterwards (a copy's destination, a model's
  /// output). For fixed-size dtypes `byte_size` must equal the shape's. invalid_argument when it
  /// does not fit.
  static Result<Tensor> from_storage_sized(std::shared_ptr<Storage> storage, DType dtype,
                                           Shape shape, std::size_t offset, std::size_t byte_size);
  /// A new host tensor of `like`'s dtype, shape and byte size, contents uninitialised: the
  /// destination of a copy of `like` (for bytes, the copy makes its elements well-formed).
  static Result<Tensor> empty_like(const Tensor& like);
  /// A bytes tensor holding `elements` (one per element, row-major); invalid_argument when the
  /// count does not match the shape or an element is 4 GiB or more.
  static Result<Tensor> from_strings(Shape shape, std::span<const std::string> elements);
  /// A bytes tensor over `serialized` (numel() elements in serialized form, taken over without a
  /// copy); invalid_argument when it does not hold exactly that many well-formed elements.
  static Result<Tensor> from_serialized(Shape shape, std::string serialized);
  /// A new host tensor holding a copy of `values`; invalid_argument when the element count does
  /// not match the shape.
  template <class T>
  static Result<Tensor> from_values(Shape shape, std::span<const T> values) {
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, empty(dtype_of<T>::value, std::move(shape)));
    if (t.numel() != values.size()) {
      return invalid_argument_error("Tensor::from_values: shape " + shape_to_string(t.shape()) +
                                    " holds " + std::to_string(t.numel()) + " elements, got " +
                                    std::to_string(values.size()));
    }
    if (!values.empty()) std::memcpy(t.data(), values.data(), values.size_bytes());
    return t;
  }
  template <class T>
  static Result<Tensor> from_values(Shape shape, const std::vector<T>& values) {
    return from_values<T>(std::move(shape), std::span<const T>(values));
  }

  bool defined() const noexcept { return storage_ != nullptr; }
  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  std::size_t rank() const noexcept { return shape_.size(); }
  /// Size of dim `i`; aborts when i >= rank().
  std::int64_t dim(std::size_t i) const {
    ASYNCINFER_CHECK(i < shape_.size());
    return shape_[i];
  }
  std::size_t numel() const noexcept { return numel_; }
  /// Bytes the tensor occupies: numel() × dtype_size(); for bytes, the serialized size.
  std::size_t byte_size() const noexcept { return byte_size_; }
  Placement placement() const noexcept;
  bool is_host_accessible() const noexcept;

  void* data() const noexcept {
    return storage_ ? static_cast<unsigned char*>(storage_->data()) + offset_ : nullptr;
  }
  /// Typed pointer; aborts when T does not match dtype() (a programming error).
  template <class T>
  T* data_as() const {
    ASYNCINFER_CHECK(dtype_of<T>::value == dtype_);
    return static_cast<T*>(data());
  }
  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  std::size_t offset() const noexcept { return offset_; }

  /// The elements of a bytes tensor, as views into its storage (valid while the storage lives).
  /// invalid_argument for another dtype, failed_precondition for device memory, and
  /// invalid_argument when the bytes (written after construction, by a model) are malformed.
  Result<std::vector<std::string_view>> string_elements() const;

  /// Rows [begin, end) along dim 0 as a view sharing storage. invalid_argument for a rank-0
  /// tensor or a range outside [0, dim(0)]. For bytes, O(elements before `end`): it walks the
  /// length prefixes to find the rows.
  Result<Tensor> slice(std::int64_t begin, std::int64_t end) const;
  /// The same bytes with another shape of equal element count (a view).
  Result<Tensor> reshape(Shape shape) const;
  /// A host copy of a host-accessible tensor; failed_precondition for device memory.
  Result<Tensor> clone() const;
  /// "f32[4,1,32,32]".
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;
  std::size_t numel_ = 0;
  std::size_t byte_size_ = 0;
  DType dtype_ = DType::f32;
  Shape shape_;
};

/// Concatenates host-accessible tensors along dim 0 into a new host tensor. All parts need the
/// same dtype and the same dims after dim 0; invalid_argument names the first part that differs.
/// Bytes tensors concatenate their serialized forms.
Result<Tensor> concat_dim0(std::span<const Tensor> parts);

}  // namespace asyncinfer
