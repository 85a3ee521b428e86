// inputs.cpp — request inputs of the bench (inputs.hpp).
#include "inputs.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>

namespace asyncinfer::cli {
namespace {

Status bad(std::string_view option, const std::string& what) {
  return invalid_argument_error(std::string(option) + ": " + what);
}

/// IEEE binary16 bits of a finite float (round to nearest even, subnormals flushed to zero).
std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000U;
  const std::int32_t exp = static_cast<std::int32_t>((x >> 23) & 0xFFU) - 127 + 15;
  std::uint32_t mant = x & 0x7FFFFFU;
  if (exp <= 0) return static_cast<std::uint16_t>(sign);
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7C00U);
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1FFFU;
  if (rest > 0x1000U || (rest == 0x1000U && (h & 1U))) ++h;
  return static_cast<std::uint16_t>(h);
}

template <class T>
void put(unsigned char* dst, std::size_t i, T v) {
  std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
}

/// Fills `out` (elements of `dtype`) with random values: floats uniform in [0, 1), integers in
/// [0, 100), bools 0/1.
void fill_random(std::vector<unsigned char>& out, DType dtype, std::mt19937_64& rng) {
  const std::size_t n = out.size() / dtype_size(dtype);
  std::uniform_real_distribution<float> unit(0.0F, 1.0F);
  std::uniform_int_distribution<int> small(0, 99);
  unsigned char* p = out.data();
  for (std::size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::f32:
        put(p, i, unit(rng));
        break;
      case DType::f64:
        put(p, i, static_cast<double>(unit(rng)));
        break;
      case DType::f16:
        put(p, i, float_to_half(unit(rng)));
        break;
      case DType::bf16:
        put(p, i, static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(unit(rng)) >> 16));
        break;
      case DType::i8:
        put(p, i, static_cast<std::int8_t>(small(rng)));
        break;
      case DType::u8:
        put(p, i, static_cast<std::uint8_t>(small(rng)));
        break;
      case DType::i32:
        put(p, i, static_cast<std::int32_t>(small(rng)));
        break;
      case DType::i64:
        put(p, i, static_cast<std::int64_t>(small(rng)));
        break;
      case DType::boolean:
        put(p, i, static_cast<std::uint8_t>(small(rng) & 1));
        break;
      case DType::i16:
        put(p, i, static_cast<std::int16_t>(small(rng)));
        break;
      case DType::u16:
        put(p, i, static_cast<std::uint16_t>(small(rng)));
        break;
      case DType::u32:
        put(p, i, static_cast<std::uint32_t>(small(rng)));
        break;
      case DType::u64:
        put(p, i, static_cast<std::uint64_t>(small(rng)));
        break;
      case DType::bytes:
        break;  // refused by plan_inputs
    }
  }
}

}  // namespace

std::string InputPlan::describe() const {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += "; ";
    s += names[i] + " " + std::string(to_string(dtypes[i])) + shape_to_string(shapes[i]);
  }
  return s;
}

Result<InputPlan> plan_inputs(const ModelSignature& sig, const BenchOptions& o) {
  InputPlan plan;
  if (sig.inputs.empty()) return bad("--model", "the model has no inputs; nothing to send");
  // Overrides: named ones, and at most one unnamed one for every other input.
  std::map<std::string, std::vector<std::int64_t>> named;
  std::optional<std::vector<std::int64_t>> all;
  for (const InputShapeArg& arg : o.input_shapes) {
    if (arg.name.empty()) {
      all = arg.dims;  // validate() allows one unnamed shape at most
      continue;
    }
    const bool known = std::any_of(sig.inputs.begin(), sig.inputs.end(),
                                   [&](const TensorSpec& s) { return s.name == arg.name; });
    if (!known) {
      std::string names;
      for (const auto& s : sig.inputs) names += (names.empty() ? "" : ", ") + s.name;
      return bad("--input-shape",
                 "the model has no input '" + arg.name + "' (inputs: " + names + ")");
    }
    named[arg.name] = arg.dims;
  }
  if (!sig.batched && o.batch_rows != 1) {
    return bad("--batch-rows", "the model is not batched (signature: " + sig.to_string() +
                                   "); only 1 row per request is possible");
  }
  if (sig.batched && sig.batch_limit && o.batch_rows > *sig.batch_limit) {
    return bad("--batch-rows", std::to_string(o.batch_rows) +
                                   " rows exceed the model's batch limit " +
                                   std::to_string(*sig.batch_limit));
  }
  plan.rows = sig.batched ? o.batch_rows : 1;
  for (const TensorSpec& spec : sig.inputs) {
    if (spec.dtype == DType::bytes) {
      return bad("--model", "input '" + spec.name +
                                "' is BYTES; the bench generates fixed-size (numeric) inputs only");
    }
    Shape shape;
    const std::size_t skip = sig.batched ? 1 : 0;  // dims that --input-shape does not cover
    std::vector<std::int64_t> item(
        spec.shape.begin() + static_cast<std::ptrdiff_t>(std::min(skip, spec.shape.size())),
        spec.shape.end());
    for (std::int64_t& d : item) d = d < 0 ? 1 : d;
    const std::vector<std::int64_t>* over = nullptr;
    if (auto it = named.find(spec.name); it != named.end()) {
      over = &it->second;
    } else if (all) {
      over = &*all;
    }
    if (over != nullptr) {
      const std::size_t want = spec.shape.size() - std::min(skip, spec.shape.size());
      if (over->size() != want) {
        return bad("--input-shape", "input '" + spec.name + "' has " + std::to_string(want) +
                                        " dim(s) " + (sig.batched ? "after the batch dim " : "") +
                                        "(model: " + std::string(to_string(spec.dtype)) +
                                        shape_to_string(spec.shape) + "), got " +
                                        shape_to_string(*over));
      }
      for (std::size_t d = 0; d < want; ++d) {
        const std::int64_t fixed = spec.shape[d + skip];
        if (fixed >= 0 && fixed != (*over)[d]) {
          return bad("--input-shape", "input '" + spec.name + "' dim " + std::to_string(d + skip) +
                                          " is fixed at " + std::to_string(fixed) +
                                          " (model: " + shape_to_string(spec.shape) + "), got " +
                                          shape_to_string(*over));
        }
      }
      item = *over;
    }
    if (sig.batched) shape.push_back(plan.rows);
    shape.insert(shape.end(), item.begin(), item.end());
    auto bytes = checked_byte_size(spec.dtype, shape);
    if (!bytes.ok()) return bad("--input-shape", std::string(bytes.status().message()));
    plan.bytes += *bytes;
    plan.names.push_back(spec.name);
    plan.dtypes.push_back(spec.dtype);
    plan.shapes.push_back(std::move(shape));
  }
  if (plan.bytes > (std::size_t{1} << 32)) {
    return bad("--input-shape", "one request would be " + std::to_string(plan.bytes >> 20) +
                                    " MiB; that is more than the bench allows (4 GiB)");
  }
  return plan;
}

Result<InputPool> InputPool::make(const InputPlan& plan, const DataArg& data, std::uint64_t seed) {
  InputPool pool;
  pool.plan_ = plan;
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < plan.shapes.size(); ++i) {
    sizes.push_back(checked_byte_size(plan.dtypes[i], plan.shapes[i]).value());
  }
  const std::size_t per_request = std::max<std::size_t>(1, plan.bytes);
  auto make_set = [&] {
    std::vector<std::vector<unsigned char>> set;
    set.reserve(sizes.size());
    for (std::size_t b : sizes) set.emplace_back(b, 0);
    return set;
  };
  if (data.kind == DataArg::Kind::zeros) {
    pool.sets_.push_back(make_set());
    return pool;
  }
  if (data.kind == DataArg::Kind::random) {
    // Distinct sets so caches do not see one buffer only; at most ~32 MiB in all.
    const std::size_t count = std::clamp<std::size_t>((32U << 20) / per_request, 1, 64);
    std::mt19937_64 rng(seed);
    for (std::size_t s = 0; s < count; ++s) {
      auto set = make_set();
      for (std::size_t i = 0; i < set.size(); ++i) fill_random(set[i], plan.dtypes[i], rng);
      pool.sets_.push_back(std::move(set));
    }
    return pool;
  }
  const std::string& path = data.path;
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("--data: cannot open '" + path + "'");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  if (bytes.empty()) return bad("--data", "file '" + path + "' is empty");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t elem = dtype_size(plan.dtypes[i]);
    if (bytes.size() % elem != 0) {
      return bad("--data", "file '" + path + "' holds " + std::to_string(bytes.size()) +
                               " bytes, not a whole number of " +
                               std::string(to_string(plan.dtypes[i])) + " elements");
    }
  }
  // The file is read as a stream of requests, wrapping around: as many distinct sets as it
  // holds (at least one, at most 1024).
  const std::size_t count = std::clamp<std::size_t>(bytes.size() / per_request, 1, 1024);
  std::size_t pos = 0;
  for (std::size_t s = 0; s < count; ++s) {
    auto set = make_set();
    for (auto& buf : set) {
      for (std::size_t j = 0; j < buf.size();) {
        const std::size_t take = std::min(buf.size() - j, bytes.size() - pos);
        std::memcpy(buf.data() + j, bytes.data() + pos, take);
        j += take;
        pos = (pos + take) % bytes.size();
      }
    }
    pool.sets_.push_back(std::move(set));
  }
  return pool;
}

Result<Inputs> InputPool::next(std::uint64_t k) const {
  const auto& set = sets_[static_cast<std::size_t>(k % sets_.size())];
  Inputs inputs;
  inputs.reserve(set.size());
  for (std::size_t i = 0; i < set.size(); ++i) {
    ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(plan_.dtypes[i], plan_.shapes[i]));
    if (!set[i].empty()) std::memcpy(t.data(), set[i].data(), set[i].size());
    inputs.push_back(std::move(t));
  }
  return inputs;
}

}  // namespace asyncinfer::cli
