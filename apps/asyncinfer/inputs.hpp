// inputs.hpp — the request inputs the bench sends: shapes resolved from the model signature and
// --input-shape/--batch-rows, contents from --data (random, zeros, or a raw file), prepared ahead
// in a small pool of byte blocks that requests cycle through.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "bench_options.hpp"

namespace asyncinfer::cli {

/// Full shapes (batch dim included when the model is batched) and dtypes of one request.
struct InputPlan {
  std::vector<std::string> names;
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  std::int64_t rows = 1;  ///< dim 0 of every input (1 for unbatched models)
  std::size_t bytes = 0;  ///< bytes of one request, all inputs
  /// "input0 f32[1,1]; ..." for tables.
  std::string describe() const;
};

/// Resolves shapes: per-item dims from the signature with -1 → 1, overridden by --input-shape,
/// with --batch-rows rows. invalid_argument names the option at fault and what the model expects.
Result<InputPlan> plan_inputs(const ModelSignature& signature, const BenchOptions& options);

/// Pre-made request contents. make() does the work up front; next(k) costs one allocation and
/// one memcpy per input, so the tensors handed to the engine are fresh (the engine uses a tensor
/// it exclusively owns without copying it; see Engine guarantee 6).
class InputPool {
 public:
  /// `data`: random (seeded by `seed`), zeros, or a file (raw little-endian bytes of the input
  /// dtypes, used in order and wrapped around). invalid_argument / not_found naming --data when
  /// the file cannot be used.
  static Result<InputPool> make(const InputPlan& plan, const DataArg& data, std::uint64_t seed);

  /// The inputs of request `k` (set k mod size()).
  Result<Inputs> next(std::uint64_t k) const;
  std::size_t size() const noexcept { return sets_.size(); }

 private:
  InputPlan plan_;
  // sets_[s][i]: bytes of input i of set s.
  std::vector<std::vector<std::vector<unsigned char>>> sets_;
};

}  // namespace asyncinfer::cli
