// oip_json_internal.hpp — the JSON helpers the HTTP encoding's files share (internal to
// src/server/http): parsing with a nesting limit and quoting a string. nlohmann_json throughout.
//
// The encoding's files (oip_json.hpp has the design):
//   oip_json.cpp         these helpers; error bodies, server and model metadata, repository index
//   oip_json_decode.cpp  an inference request: JSON inputs, binary inputs, a raw binary body
//   oip_json_reader.cpp  the SAX handler of a request's JSON header (oip_json_reader.hpp)
//   oip_json_encode.cpp  an inference response: JSON outputs and binary outputs after the JSON
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer::server {

using json = nlohmann::json;

/// Parses JSON text with a nesting limit checked as the parser goes (it stops at the first
/// array or object deeper than `max_depth`).
Result<json> parse_json(std::string_view text, int max_depth);

/// `s` as a JSON string literal (invalid UTF-8 replaced).
std::string quote(std::string_view s);

/// FP16 and BF16 have no JSON form (the OIP sends them in binary only).
inline bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

}  // namespace asyncinfer::server
