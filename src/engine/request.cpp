#include "engine/request.hpp"

#include <algorithm>

namespace asyncinfer::detail {

bool batch_compatible(const Request& a, const Request& b) noexcept {
  if (a.shape_key != b.shape_key || a.inputs.size() != b.inputs.size()) return false;
  for (std::size_t i = 0; i < a.inputs.size(); ++i) {
    const Tensor& x = a.inputs[i];
    const Tensor& y = b.inputs[i];
    if (x.defined() != y.defined()) return false;  // an optional input one of them left out
    if (x.dtype() != y.dtype() || x.rank() != y.rank()) return false;
    if (a.ragged != nullptr && i < a.ragged->size() && (*a.ragged)[i]) continue;
    if (!std::equal(x.shape().begin() + (x.rank() > 0 ? 1 : 0), x.shape().end(),
                    y.shape().begin() + (y.rank() > 0 ? 1 : 0))) {
      return false;
    }
  }
  return true;
}

std::int64_t request_rows(const Inputs& inputs) noexcept {
  for (const Tensor& t : inputs) {
    if (t.defined()) return t.rank() > 0 ? t.shape()[0] : 1;
  }
  return 1;
}

std::uint64_t compute_shape_key(const Inputs& inputs, bool batched,
                                const std::vector<bool>* ragged) noexcept {
  // FNV-1a over dtypes and the dims after the batch dim.
  std::uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffU;
      h *= 1099511628211ULL;
    }
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {  // an optional input left out
      mix(~0ULL);
      continue;
    }
    mix(static_cast<std::uint64_t>(t.dtype()));
    mix(t.rank());
    if (ragged != nullptr && i < ragged->size() && (*ragged)[i]) continue;
    for (std::size_t d = batched ? 1 : 0; d < t.rank(); ++d) {
      mix(static_cast<std::uint64_t>(t.shape()[d]));
    }
  }
  return h;
}

}  // namespace asyncinfer::detail
