// server_metrics.hpp — a frontend's own metrics (requests by status, connections, server-side
// latency) and the /metrics page that joins them with the engines'.
//
// Design: recording is lock-free (relaxed atomics, asyncinfer::Histogram); the page is built at
// scrape time from snapshots by the project's one exporter (src/metrics/prometheus_text.hpp, on
// prometheus-cpp), which the library's EngineMetrics::to_prometheus uses too, so an engine's
// families have the same names, help and labels in both. Engine metric names follow Triton's
// (nv_inference_request_success, nv_inference_queue_duration_us, ...) with the prefix
// asyncinfer_ and the labels model and version.
//
// Thread safety: every member is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "asyncinfer/metrics.hpp"

namespace asyncinfer::metrics {
class Families;
}

namespace asyncinfer::server {

class ModelRepository;

/// Metrics of one frontend (protocol), e.g. "http" → asyncinfer_http_requests_total.
class ProtocolMetrics {
 public:
  /// The label of the request counter and its values, e.g. {"status_class", {"1xx", ...}}.
  struct Labels {
    std::string name;
    std::vector<std::string> values;
  };
  /// `connections` false: the connection families are left out (a frontend that cannot see its
  /// connections, as gRPC's).
  ProtocolMetrics(std::string protocol, Labels labels, bool connections = true);

  /// Counts one finished request under label value `index` (into Labels::values).
  void count_request(std::size_t index) noexcept;
  void connection_opened() noexcept;
  void connection_closed() noexcept;
  /// A connection refused, e.g. over the connection limit.
  void connection_rejected() noexcept;
  /// A response stream (gRPC ModelStreamInfer, HTTP generate_stream) cancelled because its
  /// client read nothing for the idle timeout (--idle-timeout): its requests were cancelled.
  void stream_stalled() noexcept;
  /// Server-side time of one inference request, from the request read in full to the response
  /// handed to the transport, in µs.
  void observe_infer_us(double us) noexcept { infer_us_.observe(us); }

  std::int64_t active_connections() const noexcept {
    return active_.load(std::memory_order_relaxed);
  }
  std::uint64_t requests(std::size_t index) const noexcept;
  std::uint64_t stalled_streams() const noexcept {
    return stalled_streams_.load(std::memory_order_relaxed);
  }
  HistogramSnapshot infer_us() const { return infer_us_.snapshot(); }
  const std::string& protocol() const noexcept { return protocol_; }

  /// Adds this frontend's families.
  void collect(metrics::Families& out) const;

 private:
  void collect_connections(const std::string& prefix, metrics::Families& out) const;
  void collect_latency(const std::string& prefix, metrics::Families& out) const;

  std::string protocol_;
  Labels labels_;
  bool connections_families_ = true;
  std::vector<std::atomic<std::uint64_t>> requests_;
  std::atomic<std::int64_t> active_{0};
  std::atomic<std::uint64_t> connections_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::atomic<std::uint64_t> stalled_streams_{0};
  Histogram infer_us_;
};

/// Adds the families of every engine in `repository` (the library's own, from the one exporter,
/// metrics/prometheus_text.hpp, with labels model and version, and namespace between them with
/// --model-namespacing, as Triton's) and the readiness of each version.
void collect_engine_metrics(const ModelRepository& repository, metrics::Families& out);

}  // namespace asyncinfer::server
