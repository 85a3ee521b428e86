// otlp_exporter.cpp — OTLP/HTTP span export (otlp_exporter.hpp).
#include "otlp_exporter.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

#include "otlp_trace.pb.h"

namespace asyncinfer::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

std::string bytes_of(const auto& a) {
  return std::string(reinterpret_cast<const char*>(a.data()), a.size());
}

bool all_zero(const std::array<std::uint8_t, 8>& a) {
  for (std::uint8_t b : a) {
    if (b != 0) return false;
  }
  return true;
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string encode_otlp_request(const std::vector<OtlpSpan>& spans,
                                const std::vector<std::pair<std::string, std::string>>& resource) {
  otlp::ExportTraceServiceRequest request;
  otlp::ResourceSpans* rs = request.add_resource_spans();
  for (const auto& [k, v] : resource) {
    otlp::KeyValue* kv = rs->mutable_resource()->add_attributes();
    kv->set_key(k);
    kv->mutable_value()->set_string_value(v);
  }
  otlp::ScopeSpans* ss = rs->add_scope_spans();
  ss->mutable_scope()->set_name("triton-server");
  for (const OtlpSpan& s : spans) {
    otlp::Span* out = ss->add_spans();
    out->set_trace_id(bytes_of(s.trace_id));
    out->set_span_id(bytes_of(s.span_id));
    if (!all_zero(s.parent_span_id)) out->set_parent_span_id(bytes_of(s.parent_span_id));
    out->set_name(s.name);
    out->set_kind(otlp::Span::SPAN_KIND_SERVER);
    out->set_start_time_unix_nano(s.start_unix_ns);
    out->set_end_time_unix_nano(s.end_unix_ns);
    for (const auto& [k, v] : s.string_attributes) {
      otlp::KeyValue* kv = out->add_attributes();
      kv->set_key(k);
      kv->mutable_value()->set_string_value(v);
    }
    for (const auto& [k, v] : s.int_attributes) {
      otlp::KeyValue* kv = out->add_attributes();
      kv->set_key(k);
      kv->mutable_value()->set_int_value(v);
    }
    for (const auto& [name, ns] : s.events) {
      otlp::Span::Event* e = out->add_events();
      e->set_name(name);
      e->set_time_unix_nano(ns);
    }
  }
  return request.SerializeAsString();
}

Result<HttpUrl> parse_http_url(const std::string& url) {
  constexpr std::string_view scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return invalid_argument_error("'" + url +
                                  "' is not an http:// URL (OTLP/HTTP without TLS here)");
  }
  const std::string rest = url.substr(scheme.size());
  const std::size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  HttpUrl out;
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  const std::size_t colon = authority.rfind(':');
  if (colon == std::string::npos) {
    out.host = authority;
    out.port = "80";
  } else {
    out.host = authority.substr(0, colon);
    out.port = authority.substr(colon + 1);
    if (out.port.empty() || out.port.find_first_not_of("0123456789") != std::string::npos ||
        out.port.size() > 5 || std::stoi(out.port) > 65535) {
      return invalid_argument_error("'" + url + "' has a bad port");
    }
  }
  if (out.host.empty()) return invalid_argument_error("'" + url + "' has no host");
  return out;
}

OtlpExporter::OtlpExporter(const OtelConfig& config, std::function<void(const std::string&)> log)
    : config_(config), log_(std::move(log)) {
  auto url = parse_http_url(config_.url);
  if (url.ok()) url_ = *url;
  thread_ = std::thread([this] { run(); });
}

OtlpExporter::~OtlpExporter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OtlpExporter::add(std::vector<OtlpSpan> spans) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    for (OtlpSpan& s : spans) {
      if (queue_.size() >= config_.bsp_max_queue_size) {
        ++dropped_;
        continue;
      }
      wake = wake || queue_.empty();  // the thread waits for a first span without a timeout
      queue_.push_back(std::move(s));
    }
    wake = wake || queue_.size() >= config_.bsp_max_export_batch_size;
  }
  if (wake) cv_.notify_one();
}

void OtlpExporter::run() {
  const auto delay = std::chrono::milliseconds(config_.bsp_schedule_delay_ms);
  const std::size_t batch_max = std::max<std::uint32_t>(1, config_.bsp_max_export_batch_size);
  std::unique_lock lock(mu_);
  while (true) {
    // Sleep until a span arrives; then until a full batch waits, the schedule delay has passed
    // since, or the exporter stops.
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    cv_.wait_for(lock, delay, [&] { return stop_ || queue_.size() >= batch_max; });
    const bool stopping = stop_;
    while (!queue_.empty()) {
      std::vector<OtlpSpan> batch;
      const std::size_t n = std::min(batch_max, queue_.size());
      batch.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      const std::uint64_t dropped = std::exchange(dropped_, 0);
      lock.unlock();
      Status s = send(encode_otlp_request(batch, config_.resource));
      const std::int64_t now = steady_ns();
      if ((!s.ok() || dropped > 0) && log_ &&
          (last_error_log_ns_ == 0 || now - last_error_log_ns_ > 60'000'000'000)) {
        last_error_log_ns_ = now;
        std::string line = "warning: trace export to " + config_.url + ": ";
        line += s.ok() ? "sent"
                       : std::string(s.message()) + "; " + std::to_string(batch.size()) +
                             " spans dropped";
        if (dropped > 0) line += "; " + std::to_string(dropped) + " spans found the queue full";
        log_(line + " (said again at most once a minute)");
      }
      lock.lock();
      if (!stopping && queue_.size() < batch_max) break;  // the rest waits for its delay
    }
    if (stopping) return;
  }
}

Status OtlpExporter::send(const std::string& body) {
  if (url_.host.empty()) return invalid_argument_error("no collector URL");
  try {
    net::io_context io;
    net::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    const auto results = resolver.resolve(url_.host, url_.port);
    stream.expires_after(std::chrono::seconds(5));
    stream.connect(results);
    http::request<http::string_body> req{http::verb::post, url_.target, 11};
    req.set(http::field::host, url_.host + ":" + url_.port);
    req.set(http::field::content_type, "application/x-protobuf");
    req.set(http::field::user_agent, "asyncinfer");
    req.body() = body;
    req.prepare_payload();
    stream.expires_after(std::chrono::seconds(5));
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    stream.expires_after(std::chrono::seconds(5));
    http::read(stream, buffer, res);
    beast::error_code ec;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
    if (res.result_int() / 100 != 2) {
      return unavailable_error("the collector answered " + std::to_string(res.result_int()));
    }
    return Status();
  } catch (const std::exception& e) {
    return unavailable_error(e.what());
  }
}

}  // namespace asyncinfer::server
