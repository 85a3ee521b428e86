// HTTP content codings with zlib (http_compression.hpp).
#include "http_compression.hpp"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <vector>

#include "asyncinfer/detail/enum_names.hpp"

namespace asyncinfer::server {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

/// zlib's windowBits for a coding: 15 + 16 selects the gzip wrapper, 15 the zlib one.
int window_bits(ContentCoding coding) { return coding == ContentCoding::gzip ? 15 + 16 : 15; }

/// The q of one Accept-Encoding element's parameters (";q=0.5"); 1 when absent, -1 when bad.
double quality(std::string_view params) {
  double q = 1.0;
  while (!params.empty()) {
    const std::size_t semi = params.find(';');
    std::string_view p = trim(params.substr(0, semi));
    params = semi == std::string_view::npos ? std::string_view() : params.substr(semi + 1);
    if (p.size() >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
      p.remove_prefix(2);
      auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), q);
      if (ec != std::errc() || end != p.data() + p.size() || q < 0 || q > 1) return -1;
    }
  }
  return q;
}

}  // namespace

namespace {
constexpr detail::EnumNames<ContentCoding, 3> kCodingNames{{"identity", "gzip", "deflate"},
                                                           "identity"};
}  // namespace

std::string_view to_string(ContentCoding coding) noexcept { return kCodingNames.name(coding); }

std::optional<ContentCoding> request_coding(std::string_view content_encoding) {
  const std::string_view c = trim(content_encoding);
  if (c.empty() || iequals(c, "identity")) return ContentCoding::identity;
  if (iequals(c, "gzip") || iequals(c, "x-gzip")) return ContentCoding::gzip;
  if (iequals(c, "deflate")) return ContentCoding::deflate;
  return std::nullopt;
}

ContentCoding response_coding(std::string_view accept_encoding) {
  // q of identity, gzip, deflate; -1 = not named.
  double named[3] = {-1, -1, -1};
  double star = -1;
  while (!accept_encoding.empty()) {
    const std::size_t comma = accept_encoding.find(',');
    std::string_view element = accept_encoding.substr(0, comma);
    accept_encoding =
        comma == std::string_view::npos ? std::string_view() : accept_encoding.substr(comma + 1);
    const std::size_t semi = element.find(';');
    const std::string_view name = trim(element.substr(0, semi));
    const double q = semi == std::string_view::npos ? 1.0 : quality(element.substr(semi + 1));
    if (q < 0) continue;  // a malformed element is ignored
    if (iequals(name, "identity")) {
      named[0] = q;
    } else if (iequals(name, "gzip") || iequals(name, "x-gzip")) {
      named[1] = q;
    } else if (iequals(name, "deflate")) {
      named[2] = q;
    } else if (name == "*") {
      star = q;
    }
  }
  auto q_of = [&](int i) { return named[i] >= 0 ? named[i] : star; };
  const double gzip = q_of(1);
  const double deflate = q_of(2);
  // identity is acceptable unless refused by name or by "*;q=0" (RFC 9110 §12.5.3).
  const double identity = named[0] >= 0 ? named[0] : (star == 0 ? 0 : 0.001);
  if (gzip > 0 && gzip >= deflate && gzip >= identity) return ContentCoding::gzip;
  if (deflate > 0 && deflate >= identity) return ContentCoding::deflate;
  return ContentCoding::identity;
}

namespace {

/// zlib counts in uInt (32 bits): bodies and buffers past 4 GiB are fed in pieces.
constexpr std::size_t kZlibChunk = std::numeric_limits<uInt>::max();

/// Gives zlib the next piece of the input (`next`, `left` bytes not yet given) once it has used
/// the last one.
void feed(z_stream& z, const Bytef*& next, std::size_t& left) {
  if (z.avail_in != 0 || left == 0) return;
  const std::size_t n = std::min(left, kZlibChunk);
  z.next_in = const_cast<Bytef*>(next);
  z.avail_in = static_cast<uInt>(n);
  next += n;
  left -= n;
}

/// Points zlib's output at `out` past its first `produced` bytes; returns where it starts, so
/// that the bytes written are `z.next_out - start`.
Bytef* room(z_stream& z, std::string& out, std::size_t produced) {
  auto* start = reinterpret_cast<Bytef*>(out.data() + produced);
  z.next_out = start;
  z.avail_out = static_cast<uInt>(std::min(out.size() - produced, kZlibChunk));
  return start;
}

}  // namespace

Result<std::string> inflate_body(std::string_view in, ContentCoding coding, std::size_t max_bytes) {
  z_stream z{};
  if (inflateInit2(&z, window_bits(coding)) != Z_OK) {
    return internal_error("zlib: inflateInit2 failed");
  }
  std::string out;
  // One byte past the limit tells "too large" from "exactly the limit".
  const std::size_t cap =
      max_bytes == std::numeric_limits<std::size_t>::max() ? max_bytes : max_bytes + 1;
  out.resize(std::min<std::size_t>(std::max<std::size_t>(in.size() * 4, 4096), cap));
  const auto* next_in = reinterpret_cast<const Bytef*>(in.data());
  std::size_t in_left = in.size();
  std::size_t produced = 0;
  int rc = Z_OK;
  bool ended = false;
  std::string trailing;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= cap) break;  // past the limit
      out.resize(std::min(out.size() * 2, cap));
    }
    feed(z, next_in, in_left);
    Bytef* const out_at = room(z, out, produced);
    rc = inflate(&z, Z_NO_FLUSH);
    produced += static_cast<std::size_t>(z.next_out - out_at);
    if (rc == Z_STREAM_END) {
      const bool more = z.avail_in > 0 || in_left > 0;
      if (!more) {
        ended = true;
        break;
      }
      // RFC 1952 §2.2: a gzip file may hold several members, read one after another (as
      // `gzip -d` does). After a zlib stream nothing may follow.
      if (coding != ContentCoding::gzip) {
        trailing = "data follows the end of the deflate stream";
        break;
      }
      if (inflateReset(&z) != Z_OK) break;
      continue;
    }
    if (rc == Z_BUF_ERROR && z.avail_out == 0) continue;  // more room needed
    if (rc != Z_OK) break;
    if (z.avail_in == 0 && in_left == 0 && z.avail_out > 0) {
      rc = Z_BUF_ERROR;  // all input used, no end of stream: the body ends early
      break;
    }
  }
  const std::string error = z.msg != nullptr ? z.msg : "";
  inflateEnd(&z);
  if (produced > max_bytes) {
    return resource_exhausted_error(
        "request body exceeds the maximum allowed value of " + std::to_string(max_bytes) +
        " bytes once inflated (Content-Encoding: " + std::string(to_string(coding)) + ")");
  }
  if (!ended) {
    std::string why = !trailing.empty()   ? trailing
                      : !error.empty()    ? error
                      : rc == Z_BUF_ERROR ? std::string("it ends early")
                                          : std::string("zlib error");
    return invalid_argument_error("request body is not valid " + std::string(to_string(coding)) +
                                  " data (" + why + "), as its Content-Encoding says");
  }
  out.resize(produced);
  return out;
}

std::string deflate_body(std::string_view in, ContentCoding coding) {
  z_stream z{};
  // memLevel 8 is zlib's default (deflateInit's). Level 1: these are answers on the request's
  // path, where speed matters more than the last percent of size.
  ASYNCINFER_CHECK(deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, window_bits(coding), 8,
                                Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out;
  out.resize(std::max<std::size_t>(in.size() / 2, 256));
  const auto* next_in = reinterpret_cast<const Bytef*>(in.data());
  std::size_t in_left = in.size();
  std::size_t produced = 0;
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    feed(z, next_in, in_left);
    Bytef* const out_at = room(z, out, produced);
    const int rc = deflate(&z, in_left == 0 ? Z_FINISH : Z_NO_FLUSH);
    produced += static_cast<std::size_t>(z.next_out - out_at);
    if (rc == Z_STREAM_END) break;
    // Z_OK or Z_BUF_ERROR: more output room or more input; anything else is a broken invariant.
    ASYNCINFER_CHECK(rc == Z_OK || rc == Z_BUF_ERROR);
  }
  deflateEnd(&z);
  out.resize(produced);
  return out;
}

}  // namespace asyncinfer::server
