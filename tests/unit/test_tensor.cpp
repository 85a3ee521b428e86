#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "asyncinfer/tensor.hpp"

namespace asyncinfer {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i8), 1u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  EXPECT_EQ(dtype_size(DType::i16), 2u);
  EXPECT_EQ(dtype_size(DType::u16), 2u);
  EXPECT_EQ(dtype_size(DType::u32), 4u);
  EXPECT_EQ(dtype_size(DType::u64), 8u);
  EXPECT_EQ(to_string(DType::u32), "u32");
  EXPECT_EQ(to_string(DType::bf16), "bf16");
  EXPECT_EQ(to_string(DType::boolean), "bool");
}

TEST(DType, ParsesNamesAndAliases) {
  EXPECT_EQ(*parse_dtype("f32"), DType::f32);
  EXPECT_EQ(*parse_dtype("float32"), DType::f32);
  EXPECT_EQ(*parse_dtype("TYPE_FP16"), DType::f16);
  EXPECT_EQ(*parse_dtype("BFloat16"), DType::bf16);
  EXPECT_EQ(*parse_dtype("int64"), DType::i64);
  EXPECT_EQ(*parse_dtype("uint8"), DType::u8);
  EXPECT_EQ(*parse_dtype("bool"), DType::boolean);
  // The Open Inference Protocol's datatype names.
  EXPECT_EQ(*parse_dtype("INT16"), DType::i16);
  EXPECT_EQ(*parse_dtype("UINT16"), DType::u16);
  EXPECT_EQ(*parse_dtype("UINT32"), DType::u32);
  EXPECT_EQ(*parse_dtype("TYPE_UINT64"), DType::u64);
  EXPECT_EQ(*parse_dtype("FP64"), DType::f64);
  EXPECT_EQ(*parse_dtype("BOOL"), DType::boolean);
  auto bad = parse_dtype("complex64");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("complex64"), std::string_view::npos);
  EXPECT_NE(bad.status().message().find("expected one of"), std::string_view::npos);
}

TEST(Shape, ByteSizeAndCount) {
  const Shape s{4, 1, 32, 32};
  EXPECT_EQ(*checked_element_count(s), 4096u);
  EXPECT_EQ(*checked_byte_size(DType::f32, s), 16384u);
  EXPECT_EQ(*checked_byte_size(DType::f16, s), 8192u);
  EXPECT_EQ(*checked_element_count(Shape{}), 1u);  // a scalar
  EXPECT_EQ(*checked_element_count(Shape{3, 0, 5}), 0u);
  EXPECT_EQ(shape_to_string(s), "[4,1,32,32]");
}

TEST(Shape, NegativeDimIsInvalid) {
  auto r = checked_byte_size(DType::f32, Shape{2, -1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("negative dim"), std::string_view::npos);
}

TEST(Shape, OverflowIsInvalidNotAWrap) {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  auto elems = checked_element_count(Shape{big, big});
  ASSERT_FALSE(elems.ok());
  EXPECT_EQ(elems.status().code(), StatusCode::invalid_argument);
  // The element count fits but the byte size does not.
  const std::int64_t n = static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max() / 4);
  ASSERT_TRUE(checked_element_count(Shape{n}).ok());
  auto bytes = checked_byte_size(DType::f64, Shape{n});
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.status().message().find("overflows"), std::string_view::npos);
  EXPECT_FALSE(Tensor::empty(DType::f32, Shape{big, 2}).ok());
}

TEST(Tensor, EmptyZerosAndValues) {
  auto t = Tensor::zeros(DType::i32, {2, 3});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->defined());
  EXPECT_EQ(t->numel(), 6u);
  EXPECT_EQ(t->byte_size(), 24u);
  EXPECT_EQ(t->rank(), 2u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->data_as<std::int32_t>()[i], 0);
  EXPECT_EQ(t->placement().kind, MemoryKind::host);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t->data()) % 64, 0u);
  auto v = Tensor::from_values<float>({2, 2}, std::vector<float>{1, 2, 3, 4});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->data_as<float>()[3], 4.0f);
  EXPECT_EQ(v->describe(), "f32[2,2]");
  EXPECT_FALSE(Tensor::from_values<float>({3}, std::vector<float>{1, 2}).ok());
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, CopiesShareStorageCloneDoesNot) {
  auto a = *Tensor::from_values<float>({3}, std::vector<float>{1, 2, 3});
  Tensor view = a;
  view.data_as<float>()[0] = 9;
  EXPECT_EQ(a.data_as<float>()[0], 9.0f);
  EXPECT_EQ(a.storage().use_count(), 2);
  auto c = *a.clone();
  c.data_as<float>()[1] = 7;
  EXPECT_EQ(a.data_as<float>()[1], 2.0f);
}

TEST(Tensor, SliceIsAViewAlongDim0) {
  auto t =
      *Tensor::from_values<std::int64_t>({4, 2}, std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  auto s = t.slice(1, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shape(), (Shape{2, 2}));
  EXPECT_EQ(s->data_as<std::int64_t>()[0], 2);
  EXPECT_EQ(s->data_as<std::int64_t>()[3], 5);
  EXPECT_EQ(s->storage(), t.storage());
  EXPECT_FALSE(t.slice(3, 5).ok());
  EXPECT_FALSE(t.slice(-1, 1).ok());
  EXPECT_EQ(t.slice(4, 4)->numel(), 0u);
}

TEST(Tensor, ReshapeKeepsElements) {
  auto t = *Tensor::zeros(DType::f32, {2, 6});
  EXPECT_EQ(t.reshape({3, 4})->shape(), (Shape{3, 4}));
  auto bad = t.reshape({5});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("element counts differ"), std::string_view::npos);
}

TEST(Tensor, FromStorageChecksBounds) {
  auto storage = *Storage::allocate_host(16);
  EXPECT_TRUE(Tensor::from_storage(storage, DType::f32, {4}).ok());
  EXPECT_TRUE(Tensor::from_storage(storage, DType::f32, {2}, 8).ok());
  EXPECT_FALSE(Tensor::from_storage(storage, DType::f32, {3}, 8).ok());
  EXPECT_FALSE(Tensor::from_storage(storage, DType::f32, {1}, 17).ok());
  EXPECT_FALSE(Tensor::from_storage(nullptr, DType::f32, {1}).ok());
}

TEST(Tensor, ConcatDim0) {
  auto a = *Tensor::from_values<float>({1, 2}, std::vector<float>{1, 2});
  auto b = *Tensor::from_values<float>({2, 2}, std::vector<float>{3, 4, 5, 6});
  std::vector<Tensor> parts{a, b};
  auto c = concat_dim0(parts);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->shape(), (Shape{3, 2}));
  EXPECT_EQ(c->data_as<float>()[4], 5.0f);
  auto d = *Tensor::from_values<float>({1, 3}, std::vector<float>{1, 2, 3});
  std::vector<Tensor> mismatched{a, d};
  auto bad = concat_dim0(mismatched);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("part 1"), std::string_view::npos);
}

// ---- BYTES: variable-length elements in serialized form (4-byte LE length, then the bytes) ----

std::vector<std::string> elements_of(const Tensor& t) {
  auto views = t.string_elements();
  EXPECT_TRUE(views.ok()) << views.status().to_string();
  std::vector<std::string> out;
  if (views.ok()) {
    for (std::string_view v : *views) out.emplace_back(v);
  }
  return out;
}

TEST(BytesTensor, FromStringsSerializesWithLittleEndianLengths) {
  const std::vector<std::string> in = {"ab", "", std::string("\xff\0", 2)};
  auto t = Tensor::from_strings({3}, in);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->dtype(), DType::bytes);
  EXPECT_EQ(t->numel(), 3u);
  EXPECT_EQ(t->byte_size(), 4u + 2 + 4 + 0 + 4 + 2);
  const auto* p = static_cast<const unsigned char*>(t->data());
  EXPECT_EQ(p[0], 2);
  EXPECT_EQ(p[1], 0);
  EXPECT_EQ(p[6], 0);  // the empty element's length
  EXPECT_EQ(elements_of(*t), in);
  EXPECT_EQ(parse_dtype("TYPE_STRING").value(), DType::bytes);
  EXPECT_EQ(parse_dtype("BYTES").value(), DType::bytes);
  EXPECT_EQ(dtype_size(DType::bytes), 0u);
}

TEST(BytesTensor, MalformedSerializedFormsAreRefusedNamingTheElement) {
  std::string two;
  append_serialized_element(two, "a");
  append_serialized_element(two, "bc");
  EXPECT_TRUE(Tensor::from_serialized({2}, two).ok());
  auto extra = Tensor::from_serialized({1}, two);  // one element and 6 bytes after it
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("6 bytes follow"), std::string_view::npos);
  std::string beyond = two;
  beyond[5] = 9;  // element 1 claims 9 bytes, 2 are left
  auto b = Tensor::from_serialized({2}, beyond);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("element 1 has length 9"), std::string_view::npos)
      << b.status().message();
  auto cut = Tensor::from_serialized({2}, two.substr(0, 7));  // element 1's prefix is cut
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("element 1"), std::string_view::npos);
  EXPECT_FALSE(Tensor::from_strings({2}, std::vector<std::string>{"one"}).ok());
}

TEST(BytesTensor, SliceConcatCloneAndReshapeKeepTheElements) {
  const std::vector<std::string> a_in = {"r0a", "", "r1a", "long row one element"};
  const std::vector<std::string> b_in = {"x", "yy"};
  auto a = *Tensor::from_strings({2, 2}, a_in);
  auto b = *Tensor::from_strings({1, 2}, b_in);
  std::vector<Tensor> parts{a, b};
  auto c = concat_dim0(parts);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->shape(), (Shape{3, 2}));
  EXPECT_EQ(c->byte_size(), a.byte_size() + b.byte_size());
  auto row1 = c->slice(1, 2);
  ASSERT_TRUE(row1.ok());
  EXPECT_EQ(elements_of(*row1), (std::vector<std::string>{"r1a", "long row one element"}));
  auto rows12 = c->slice(1, 3);
  ASSERT_TRUE(rows12.ok());
  EXPECT_EQ(elements_of(*rows12),
            (std::vector<std::string>{"r1a", "long row one element", "x", "yy"}));
  EXPECT_EQ(c->slice(3, 3)->byte_size(), 0u);
  auto copy = c->clone();
  ASSERT_TRUE(copy.ok());
  EXPECT_NE(copy->data(), c->data());
  EXPECT_EQ(elements_of(*copy), elements_of(*c));
  auto flat = c->reshape({6});
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->byte_size(), c->byte_size());
  // zeros and empty give empty strings; a view of storage is checked.
  auto z = *Tensor::zeros(DType::bytes, {2, 3});
  EXPECT_EQ(z.byte_size(), 24u);
  EXPECT_EQ(elements_of(z), std::vector<std::string>(6));
  EXPECT_EQ(elements_of(*Tensor::empty(DType::bytes, {2})), std::vector<std::string>(2));
  auto storage = *Storage::allocate_host(4);
  std::memset(storage->data(), 0xff, 4);  // a length of 4 GiB - 1 in a 4-byte storage
  EXPECT_FALSE(Tensor::from_storage(storage, DType::bytes, {1}).ok());
  EXPECT_TRUE(Tensor::from_storage_sized(storage, DType::bytes, {1}, 0, 4).ok());
  EXPECT_FALSE(Tensor::from_storage_sized(storage, DType::bytes, {2}, 0, 4).ok());
  auto like = Tensor::empty_like(*c);
  ASSERT_TRUE(like.ok());
  EXPECT_EQ(like->byte_size(), c->byte_size());
}

TEST(TensorDeathTest, WrongTypedAccessAborts) {
  auto t = *Tensor::zeros(DType::f32, {1});
  EXPECT_DEATH((void)t.data_as<double>(), "check failed");
}

}  // namespace
}  // namespace asyncinfer
