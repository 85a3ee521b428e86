// ensemble.hpp — Triton's ensembles (platform: "ensemble"): a graph of steps over other models of
// the repository, resolved against those models when the ensemble loads.
//
// Design: an ensemble has no engine of its own. Each request runs the graph: a step is submitted
// to its model (through InferenceServer, as a client's request would be, so the step model's own
// batching, deadlines, statistics and reloads apply) as soon as every tensor it reads exists, so
// steps that do not depend on each other run at once and successive requests overlap in every
// step model. Tensors pass from step to step as the same reference-counted Tensor objects (no
// copy). docs/design.md says why this is not the in-process Pipeline.
//
// Thread safety: EnsembleGraph is immutable once resolved; EnsembleCounters are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "asyncinfer/metrics.hpp"
#include "asyncinfer/model.hpp"
#include "model_config.hpp"

namespace asyncinfer::server {

/// Ensembles inside ensembles: at most this many in one chain (an ensemble whose steps are plain
/// models is a chain of 1). A deeper one is refused when it loads; a chain that a later reload of
/// a step made deeper (or a cycle) fails its requests at the step past the limit.
inline constexpr int kMaxEnsembleNesting = 8;

/// An ensemble's steps with every tensor named by an index.
struct EnsembleGraph {
  struct Step {
    std::string label;    ///< "step 0 (model 'preprocess')"
    std::string model;    ///< the step model's name
    std::string version;  ///< "" = its highest ready version, else the number
    /// The step model's inputs (names and dtypes as resolved) and the tensor fed to each. A
    /// request matches them by name against the version it finds (which a reload may change).
    std::vector<std::string> input_names;
    std::vector<DType> input_dtypes;
    std::vector<std::size_t> inputs;
    /// The step model's outputs the ensemble uses, and the tensor each becomes.
    std::vector<std::string> output_names;
    std::vector<DType> output_dtypes;
    std::vector<std::size_t> outputs;
    /// The steps that read this step's outputs, each with how many of its inputs do.
    std::vector<std::pair<std::size_t, std::size_t>> feeds;
    /// How many of this step's inputs other steps produce (it starts when they all exist).
    std::size_t waits_for = 0;
  };
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::vector<std::string> tensors;  ///< names, by index
  std::vector<std::size_t> inputs;   ///< the tensor of each ensemble input (signature order)
  std::vector<std::size_t> outputs;  ///< the tensor of each ensemble output (signature order)
  std::vector<Step> steps;
};

/// Resolves `plan`'s steps (check_ensemble_graph has passed) against the step models:
/// `signature_of` gives a step model's signature (not_found / unavailable naming the model when
/// it is unknown or not loaded). invalid_argument naming the step and the tensor for an input
/// or output the step model does not have, an input left unmapped, or a tensor whose dtype or
/// shape differs between its producer and a reader.
Result<std::shared_ptr<const EnsembleGraph>> resolve_ensemble(
    const ModelPlan& plan,
    const std::function<Result<ModelSignature>(const EnsembleStep&)>& signature_of);

/// Triton's statistics of an ensemble's own requests (its steps' are their models').
/// `queue` counts every successful request, as Triton's does (perf_analyzer finds the version
/// an ensemble ran as from the growth of its queue count: without it, `perf_analyzer -m E` with
/// no `-x` fails with "failed to find the requested model version"). Its duration is the
/// ensemble's own wait: from the request's arrival until its first step was handed to that
/// step's model. The compute parts are the steps' own, in their models' statistics.
struct EnsembleCounters {
  std::atomic<std::uint64_t> success_count{0};
  std::atomic<std::uint64_t> success_ns{0};
  std::atomic<std::uint64_t> fail_count{0};
  std::atomic<std::uint64_t> fail_ns{0};
  std::atomic<std::uint64_t> queue_ns{0};
  std::atomic<std::int64_t> last_inference_ms{0};

  /// One request ended: ok or not, its duration, its rows (Triton counts inferences by rows) and
  /// its queue time (successful requests only).
  void record(bool ok, std::uint64_t ns, std::uint64_t rows, std::uint64_t queued) noexcept;
  std::atomic<std::uint64_t> inference_count{0};
  InferenceStats stats() const;
};

}  // namespace asyncinfer::server
