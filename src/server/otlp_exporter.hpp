// otlp_exporter.hpp — the OpenTelemetry trace mode's exporter: spans batched on a thread of its
// own and POSTed to a collector over OTLP/HTTP (application/x-protobuf, otlp_trace.proto), as
// OpenTelemetry's BatchSpanProcessor and OtlpHttpExporter do for Triton (src/tracer.cc).
//
// A request never waits for it: add() puts spans in a bounded queue (bsp_max_queue_size; a span
// that does not fit is dropped and counted) and returns. The thread sends a batch (at most
// bsp_max_export_batch_size spans) when that many wait, or bsp_schedule_delay after the oldest
// arrived. A collector that is down or slow costs the thread a failed connect or a 5 s timeout;
// the batch is dropped and one line in the log says so (again at most once a minute).
//
// Thread safety: add() may be called from any thread; the destructor sends what is queued (one
// last attempt) and joins the thread.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asyncinfer/status.hpp"
#include "trace.hpp"

namespace asyncinfer::server {

/// One finished span, in OTLP's terms (trace/v1 Span), protocol-neutral.
struct OtlpSpan {
  std::array<std::uint8_t, 16> trace_id{};
  std::array<std::uint8_t, 8> span_id{};
  std::array<std::uint8_t, 8> parent_span_id{};  ///< all zero: a root span
  std::string name;
  std::uint64_t start_unix_ns = 0;
  std::uint64_t end_unix_ns = 0;
  /// Attributes: a string, or an integer.
  std::vector<std::pair<std::string, std::string>> string_attributes;
  std::vector<std::pair<std::string, std::int64_t>> int_attributes;
  std::vector<std::pair<std::string, std::uint64_t>> events;  ///< name, unix ns
};

/// The bytes of an ExportTraceServiceRequest holding `spans` under one resource (`resource`
/// attributes, strings) and the instrumentation scope "triton-server" (Triton's tracer name).
std::string encode_otlp_request(const std::vector<OtlpSpan>& spans,
                                const std::vector<std::pair<std::string, std::string>>& resource);

/// An http:// URL split into host, port and target; invalid_argument otherwise.
struct HttpUrl {
  std::string host;
  std::string port;
  std::string target;
};
Result<HttpUrl> parse_http_url(const std::string& url);

class OtlpExporter {
 public:
  /// Starts the thread. `config.url` must parse (parse_http_url; checked at start by
  /// parse_trace_config). `log` gets a line per failed export (rate-limited); may be empty.
  OtlpExporter(const OtelConfig& config, std::function<void(const std::string&)> log);
  ~OtlpExporter();
  OtlpExporter(const OtlpExporter&) = delete;
  OtlpExporter& operator=(const OtlpExporter&) = delete;

  /// Queues the spans of one request; never blocks on the network. Spans past
  /// bsp_max_queue_size are dropped.
  void add(std::vector<OtlpSpan> spans);

 private:
  void run();
  /// POSTs one batch; the error when the collector cannot be reached or answers other than 2xx.
  Status send(const std::string& body);

  const OtelConfig config_;
  HttpUrl url_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<OtlpSpan> queue_;          // under mu_
  bool stop_ = false;                   // under mu_
  std::uint64_t dropped_ = 0;           // under mu_: spans that found the queue full
  std::int64_t last_error_log_ns_ = 0;  // the thread's
  std::thread thread_;
};

}  // namespace asyncinfer::server
