// classification.hpp — Triton's classification extension: a requested output with the parameter
// `classification: N` (tritonclient: InferRequestedOutput(name, class_count=N)) is answered,
// instead of its values, with the N largest of them per batch item, as BYTES strings "value:index"
// or "value:index:label" (the label from the line `index` of the output's `label_filename`).
//
// As Triton's server does it (docs/protocol/extension_classification.md; server
// src/classification.cc, the HTTP and gRPC frontends): a batched model's output [B, ...] becomes
// BYTES [B, min(N, elements per item)], an unbatched one BYTES [min(N, elements)]; items are
// ranked by value, largest first (ties: the lower index first, here); a value is written as C++'s
// std::to_string writes its type ("0.750000" for FP32/FP64, "7" for the integer types). BOOL,
// BYTES, FP16 and BF16 outputs cannot be classified.
//
// Thread safety: free functions over immutable inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"
#include "inference_server.hpp"

namespace asyncinfer::server {

/// An output's labels (its label_filename's lines, in order); shared by the versions' requests.
using ClassLabels = std::shared_ptr<const std::vector<std::string>>;

/// The `classification` parameter of the requested output named `output`: 0 when absent (no
/// classification). invalid_argument naming the output when it is not an integer in 0..2^32-1.
Result<std::uint32_t> class_count(const Parameters& parameters, std::string_view output);

/// invalid_argument in Triton's words when outputs of `dtype` cannot be classified.
Status check_classifiable(DType dtype);

/// The top `count` (>= 1) classes of `output` (host memory; a batched model's: dim 0 is the
/// batch), labelled from `labels` when given and long enough. invalid_argument for a dtype that
/// cannot be classified or a batched output without dims.
Result<Tensor> classify(const Tensor& output, bool batched, std::uint32_t count,
                        const std::vector<std::string>* labels);

/// Reads a label file: one label per line ("\n" or "\r\n"), the last line's end optional.
/// not_found / invalid_argument naming the file when it cannot be read or is over 64 MiB.
Result<ClassLabels> read_class_labels(const std::string& path);

}  // namespace asyncinfer::server
