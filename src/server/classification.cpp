// classification.cpp — Triton's classification extension (classification.hpp).
#include "classification.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <numeric>

#include "model_config.hpp"

namespace asyncinfer::server {
namespace {

constexpr std::size_t kMaxLabelFileBytes = std::size_t{64} << 20;

/// Appends the top `k` of `values[0, n)` as "value:index[:label]".
template <typename T>
void top_k(const T* values, std::size_t n, std::size_t k, const std::vector<std::string>* labels,
           std::vector<std::string>& out, std::vector<std::size_t>& order) {
  order.resize(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto larger = [values](std::size_t a, std::size_t b) { return values[a] > values[b]; };
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
      [&](std::size_t a, std::size_t b) { return larger(a, b) || (!larger(b, a) && a < b); });
  for (std::size_t j = 0; j < k; ++j) {
    const std::size_t i = order[j];
    std::string s = std::to_string(values[i]) + ":" + std::to_string(i);
    if (labels != nullptr && i < labels->size()) {
      s += ':';
      s += (*labels)[i];
    }
    out.push_back(std::move(s));
  }
}

template <typename T>
void classify_items(const Tensor& output, std::size_t items, std::size_t per_item, std::size_t k,
                    const std::vector<std::string>* labels, std::vector<std::string>& out) {
  const T* values = static_cast<const T*>(output.data());
  std::vector<std::size_t> order;
  for (std::size_t b = 0; b < items; ++b)
    top_k(values + b * per_item, per_item, k, labels, out, order);
}

}  // namespace

Result<std::uint32_t> class_count(const Parameters& parameters, std::string_view output) {
  auto it = parameters.find("classification");
  if (it == parameters.end()) return std::uint32_t{0};
  auto n =
      parameter_int(it->second, "classification", 0, std::numeric_limits<std::uint32_t>::max());
  if (!n.ok()) return n.status().with_context("output '" + std::string(output) + "'");
  return static_cast<std::uint32_t>(*n);
}

Status check_classifiable(DType dtype) {
  switch (dtype) {
    case DType::u8:
    case DType::u16:
    case DType::u32:
    case DType::u64:
    case DType::i8:
    case DType::i16:
    case DType::i32:
    case DType::i64:
    case DType::f32:
    case DType::f64:
      return Status();
    default:
      return invalid_argument_error(
          "class result not available for output due to unsupported type '" +
          std::string(oip_datatype(dtype)) + "'");
  }
}

Result<Tensor> classify(const Tensor& output, bool batched, std::uint32_t count,
                        const std::vector<std::string>* labels) {
  ASYNCINFER_RETURN_IF_ERROR(check_classifiable(output.dtype()));
  if (!output.is_host_accessible()) return internal_error("the output is not in host memory");
  const Shape& shape = output.shape();
  if (batched && shape.empty()) {
    return invalid_argument_error("a batched model's output has no batch dim to classify");
  }
  const std::size_t items = batched ? static_cast<std::size_t>(shape[0]) : 1;
  std::size_t per_item = 1;  // the elements of one batch item (Triton's batch-1 element count)
  for (std::size_t d = batched ? 1 : 0; d < shape.size(); ++d) {
    per_item *= static_cast<std::size_t>(shape[d]);
  }
  const std::size_t k = std::min<std::size_t>(count, per_item);
  std::vector<std::string> classes;
  classes.reserve(items * k);
  switch (output.dtype()) {
    case DType::u8:
      classify_items<std::uint8_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::u16:
      classify_items<std::uint16_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::u32:
      classify_items<std::uint32_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::u64:
      classify_items<std::uint64_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::i8:
      classify_items<std::int8_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::i16:
      classify_items<std::int16_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::i32:
      classify_items<std::int32_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::i64:
      classify_items<std::int64_t>(output, items, per_item, k, labels, classes);
      break;
    case DType::f32:
      classify_items<float>(output, items, per_item, k, labels, classes);
      break;
    case DType::f64:
      classify_items<double>(output, items, per_item, k, labels, classes);
      break;
    default:
      break;  // refused by check_classifiable
  }
  Shape out_shape;
  if (batched) out_shape.push_back(static_cast<std::int64_t>(items));
  out_shape.push_back(static_cast<std::int64_t>(k));
  return Tensor::from_strings(std::move(out_shape), classes);
}

Result<ClassLabels> read_class_labels(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("label_filename: cannot read " + path);
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxLabelFileBytes) {
      return invalid_argument_error("label_filename: " + path + " is over 64 MiB");
    }
  }
  auto labels = std::make_shared<std::vector<std::string>>();
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels->push_back(std::move(line));
    start = end + 1;
  }
  return ClassLabels(std::move(labels));
}

}  // namespace asyncinfer::server
