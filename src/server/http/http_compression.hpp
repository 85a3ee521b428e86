// http_compression.hpp — HTTP content codings for inference requests and responses, as Triton's
// HTTP frontend does them: a request body with `Content-Encoding: gzip` or `deflate` is inflated
// before it is parsed; a response is compressed with the coding of highest q in the request's
// `Accept-Encoding` among identity, gzip and deflate. "deflate" is the zlib format (RFC 9110
// §8.4.1.2), gzip RFC 1952. zlib (Debian's zlib1g-dev) does the work.
// Sources: triton-inference-server/server src/http_server.cc, src/data_compressor.h.
//
// Thread safety: free functions over values; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "asyncinfer/status.hpp"

namespace asyncinfer::server {

enum class ContentCoding : std::uint8_t { identity, gzip, deflate };

/// "identity", "gzip" or "deflate".
std::string_view to_string(ContentCoding coding) noexcept;

/// The coding a request's Content-Encoding names (empty = identity; case-insensitive); nullopt
/// for any other coding or a list of several (HTTP 501, with `Accept-Encoding: gzip, deflate`).
std::optional<ContentCoding> request_coding(std::string_view content_encoding);

/// The coding to answer with for an Accept-Encoding header: the highest q among identity, gzip
/// and deflate (`*` stands for those the header does not name; a tie goes to gzip, then deflate);
/// identity when the header is empty or accepts neither gzip nor deflate.
ContentCoding response_coding(std::string_view accept_encoding);

/// Inflates `in`, which is in `coding` (not identity), into at most `max_bytes` bytes; it stops
/// as soon as the output would pass that, so a small body that inflates without bound (a "zip
/// bomb") costs no more than `max_bytes` of memory. resource_exhausted when the output passes
/// `max_bytes` (HTTP 413), invalid_argument when `in` is not valid data of that coding or ends
/// early.
Result<std::string> inflate_body(std::string_view in, ContentCoding coding, std::size_t max_bytes);

/// `in` compressed in `coding` (not identity), at zlib's fastest level (1).
std::string deflate_body(std::string_view in, ContentCoding coding);

}  // namespace asyncinfer::server
