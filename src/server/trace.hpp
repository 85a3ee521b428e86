// trace.hpp — Triton's trace extension (docs/protocol/extension_trace.md, docs/user_guide/trace.md
// of triton-inference-server/server): which requests are traced, and where their traces go.
//
// Settings, global and per model (Triton's names; GET/POST /v2[/models/{m}]/trace/setting, gRPC
// TraceSetting):
//   trace_level    OFF, or any of TIMESTAMPS and TENSORS (a bit set; OFF = 0, the default);
//   trace_rate     every rate-th request of the model is traced (1000);
//   trace_count    how many more are traced; -1 = no limit (-1). It counts down as requests are
//                  sampled, and GET shows what is left, as Triton does;
//   log_frequency  triton mode: traces written per file <trace_file>.<n>; 0 = all of them to
//                  <trace_file> when the setting ends (replaced, or at shutdown) (0);
//   trace_file     triton mode: where (read only over the API);
//   trace_mode     triton (JSON records in trace_file) or opentelemetry (spans exported over
//                  OTLP/HTTP, otlp_exporter.hpp); fixed at start.
// A model's setting falls back field by field to the global one: a field the model never set, or
// cleared (a JSON null, an empty gRPC value), follows the global field as it changes. A cleared
// global field returns to its value at start (--trace-config). As in Triton's TraceManager
// (src/tracer.cc), an update replaces the setting object: its sample counter and count restart.
//
// The cost when tracing is off (every level OFF, the default): frontends ask active(), one
// relaxed atomic load, and do nothing else. A sampled request carries a Trace: the frontend
// records its own activities (HTTP_RECV_START, GRPC_SEND_END...), the server REQUEST_START and
// REQUEST_END, and the engine fills a RequestTimeline with QUEUE_START..COMPUTE_END from the
// clocks it reads anyway for Triton's statistics. The trace is written when its last holder
// lets it go.
//
// Child traces (Triton's InferenceTrace::SpawnChildTrace): each step of a traced ensemble
// request, and each call a python model makes with trace=request.trace() under a traced
// request, is traced as a child of that request's trace: the parent's setting and level, an id
// of its own, parent_id the parent's id. Children are not sampled (rate and count count only the
// requests that come from clients). A child holds its parent, so the parent is written after its
// children: in triton mode their records go into the parent's, written as one trace; in
// opentelemetry mode the child's model span hangs under the parent's model span, in the
// parent's OpenTelemetry trace, with no InferRequest span of its own.
//
// Thread safety: every member of TraceManager may be called from any thread. A Trace may be
// recorded into from several threads (each record under its own lock).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "asyncinfer/status.hpp"

namespace asyncinfer::server {

/// Trace level bits (Triton's TRITONSERVER_InferenceTraceLevel): 0 = OFF.
inline constexpr std::uint32_t kTraceTimestamps = 0x4;
inline constexpr std::uint32_t kTraceTensors = 0x8;

enum class TraceMode : std::uint8_t { triton, opentelemetry };
/// "triton" or "opentelemetry".
std::string_view to_string(TraceMode mode) noexcept;

/// The OpenTelemetry mode's settings (--trace-config opentelemetry,<key>=<value>).
struct OtelConfig {
  /// The collector's OTLP/HTTP traces endpoint (http:// only).
  std::string url = "http://localhost:4318/v1/traces";
  /// Resource attributes (resource=<key>=<value>, repeatable), in the order given.
  std::vector<std::pair<std::string, std::string>> resource;
  /// The batch span processor's settings (OpenTelemetry's OTEL_BSP_*; Triton's defaults).
  std::uint32_t bsp_max_queue_size = 2048;        ///< spans held at most; more are dropped
  std::uint32_t bsp_schedule_delay_ms = 5000;     ///< a batch leaves at least this often
  std::uint32_t bsp_max_export_batch_size = 512;  ///< spans per export request at most
};

/// The settings at start: Triton's --trace-config (and the older --trace-* flags).
struct TraceConfig {
  std::uint32_t level = 0;  ///< kTrace* bits; 0 = OFF
  std::uint32_t rate = 1000;
  std::int32_t count = -1;
  std::uint32_t log_frequency = 0;
  std::string file;
  TraceMode mode = TraceMode::triton;
  OtelConfig otel;
};

/// Triton's older trace flags (--trace-file, --trace-level, --trace-rate, --trace-count,
/// --trace-log-frequency), as given; --trace-config's keys win over them.
struct LegacyTraceFlags {
  std::optional<std::string> file;
  std::vector<std::string> levels;
  std::optional<std::string> rate;
  std::optional<std::string> count;
  std::optional<std::string> log_frequency;
};

/// Parses Triton's --trace-config values (`[triton|opentelemetry,]<key>=<value>`, in the order
/// given; global keys rate, level (repeatable: the levels add up; off/false = OFF;
/// timestamps/on/true/min/max; tensors), count, mode; triton keys file, log-frequency;
/// opentelemetry keys url, resource (<k>=<v>), bsp_max_queue_size, bsp_schedule_delay,
/// bsp_max_export_batch_size), after the older flags in `legacy`. The OTEL_BSP_* environment
/// variables give the batch settings not given here, as in Triton. invalid_argument naming the
/// value and what is wrong: no '=', an unknown mode, an unknown key, a number that does not
/// parse or is out of range, a url that is not http://host[:port]/path, level TIMESTAMPS or
/// TENSORS in triton mode without a file. `warn` gets a line for each older flag overridden.
Result<TraceConfig> parse_trace_config(const std::vector<std::string>& specs,
                                       const LegacyTraceFlags& legacy = {},
                                       const std::function<void(const std::string&)>& warn = {});

/// One setting of an update: kept (absent), set to a value, or cleared (back to the fallback).
template <class T>
struct TraceSettingChange {
  enum class Op : std::uint8_t { keep, set, clear };
  Op op = Op::keep;
  T value{};
};

/// A trace-setting update, parsed from HTTP's JSON or gRPC's map (parse_trace_setting_update).
struct TraceSettingUpdate {
  TraceSettingChange<std::uint32_t> level;
  TraceSettingChange<std::uint32_t> rate;
  TraceSettingChange<std::int32_t> count;
  TraceSettingChange<std::uint32_t> log_frequency;
};

/// The settings asked for, each a list of strings (trace_level: its levels; the others: one
/// value), or nullopt to clear it (JSON null, an empty gRPC value). Names other than Triton's are
/// ignored, as Triton ignores them. invalid_argument in Triton's words: trace_file given ("trace
/// file location can not be updated through network protocol"), OFF with another level,
/// an unknown level, a number that does not parse or is out of range ("Unable to parse
/// 'trace_rate', got: x"), trace_count below -1, several values for a one-value setting.
Result<TraceSettingUpdate> parse_trace_setting_update(
    const std::map<std::string, std::optional<std::vector<std::string>>, std::less<>>& given);

class TraceManager;
class OtlpExporter;

/// A snapshot of the settings a model (or the server) traces with.
struct TraceSettings {
  std::uint32_t level = 0;
  std::uint32_t rate = 0;
  std::int32_t count = -1;  ///< what is left to sample; -1 = no limit
  std::uint32_t log_frequency = 0;
  std::string file;
  TraceMode mode = TraceMode::triton;
  const OtelConfig* otel = nullptr;  ///< the manager's (opentelemetry mode shows it)
};

/// The settings as Triton answers them over HTTP: every value a string, trace_level a list;
/// log_frequency and trace_file in triton mode, url, resource and bsp_* in opentelemetry mode.
std::string trace_settings_json(const TraceSettings& settings);
/// The same, as name → values (gRPC TraceSettingResponse's map).
std::vector<std::pair<std::string, std::vector<std::string>>> trace_settings_values(
    const TraceSettings& settings);

/// A Clock time point as a trace's timestamp: nanoseconds since Clock's (steady_clock's) epoch,
/// as Triton's traces give them.
inline std::int64_t trace_ns(Clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// A W3C trace context (traceparent header, https://www.w3.org/TR/trace-context/ §3.2).
struct TraceParent {
  std::array<std::uint8_t, 16> trace_id{};
  std::array<std::uint8_t, 8> span_id{};
  std::uint8_t flags = 0;
};
/// Parses a traceparent value ("00-<32 hex>-<16 hex>-<2 hex>"); nullopt when malformed or all
/// zero ids, which the spec says to ignore.
std::optional<TraceParent> parse_traceparent(std::string_view value) noexcept;

/// One sampled request's trace, or a child of one. Recording is thread-safe. The record is
/// written (triton mode: to its setting's file, a child's with its parent's; opentelemetry: as
/// spans to the exporter) when the last shared_ptr to it goes.
class Trace final : public TraceHandle {
 public:
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  /// Records `activity` (Triton's name: "HTTP_RECV_START") at steady-clock `ns` (nanoseconds
  /// since Clock's epoch).
  void record(std::string_view activity, std::int64_t ns);
  /// record() at Clock::now().
  void record_now(std::string_view activity);
  /// Names the model version that runs the request, and the request's id (before
  /// REQUEST_START).
  void set_model(std::string name, std::int64_t version, std::string request_id);
  /// What the engine fills for this request (RequestOptions::timeline).
  const std::shared_ptr<RequestTimeline>& timeline() const noexcept { return timeline_; }
  /// Takes the engine's phases from the timeline (QUEUE_START .. COMPUTE_END, those reached).
  void record_timeline();
  /// Whether its setting's level has TENSORS in triton mode (Triton writes tensors only there).
  bool traces_tensors() const noexcept;
  /// Records tensor `name` once for each of `activities` (TENSOR_QUEUE_INPUT,
  /// TENSOR_BACKEND_INPUT, TENSOR_BACKEND_OUTPUT) as Triton's TENSORS level writes it: its
  /// elements as text ("data": "1,2,3"; BYTES quoted; FP16 and BF16 empty, as Triton's),
  /// "shape" and "dtype". The text is made once, however many activities. A tensor not in host
  /// memory has empty data. Does nothing unless traces_tensors(). Thread-safe.
  void record_tensor(std::initializer_list<std::string_view> activities, std::string_view name,
                     const Tensor& tensor);
  std::uint64_t id() const noexcept { return id_; }
  /// The parent trace's id; 0 for a trace of its own (a client's request).
  std::uint64_t parent_id() const noexcept { return parent_trace_ ? parent_trace_->id_ : 0; }

  /// A child of `parent` (a Trace; null gives null): Triton's SpawnChildTrace, for an ensemble's
  /// step or a model's call made under the parent's request. Not sampled: the parent's setting
  /// decided. Thread-safe.
  static std::shared_ptr<Trace> child_of(const std::shared_ptr<TraceHandle>& parent);
  /// The server's Trace behind `handle` (every TraceHandle is one); null for null.
  static std::shared_ptr<Trace> of(const std::shared_ptr<TraceHandle>& handle) noexcept {
    return std::static_pointer_cast<Trace>(handle);
  }

 private:
  friend class TraceManager;
  struct Setting;
  Trace(std::shared_ptr<Setting> setting, std::uint64_t id, std::optional<TraceParent> parent,
        std::shared_ptr<Trace> parent_trace);
  /// Triton mode: this trace's own JSON records (comma-separated; "" for none).
  std::string triton_records(const std::vector<std::pair<std::string, std::int64_t>>& events,
                             std::vector<std::string>& tensors) const;
  /// Opentelemetry mode: this trace's spans to the exporter.
  void export_spans(const std::vector<std::pair<std::string, std::int64_t>>& events) const;

  std::shared_ptr<Setting> setting_;
  const std::uint64_t id_;
  const std::optional<TraceParent> parent_;    // the client's W3C context (opentelemetry mode)
  const std::shared_ptr<Trace> parent_trace_;  // a child's parent: held until the child is written
  // Opentelemetry mode: the trace's OpenTelemetry trace id, and its model span's id, fixed at
  // the start so that children made before it is written can name them.
  std::array<std::uint8_t, 16> otel_trace_id_{};
  std::array<std::uint8_t, 8> model_span_id_{};
  std::shared_ptr<RequestTimeline> timeline_ = std::make_shared<RequestTimeline>();
  std::mutex mu_;
  std::string model_;
  std::int64_t version_ = -1;
  std::string request_id_;
  std::vector<std::pair<std::string, std::int64_t>> events_;  // under mu_, in record order
  std::vector<std::string> tensors_;  // under mu_: record_tensor's JSON records, in order
  std::string children_;              // under mu_: the written children's records (triton mode)
};

class TraceManager {
 public:
  /// Starts with `config` as the global setting (and its start values, which a cleared global
  /// field returns to). In opentelemetry mode with a level it starts the exporter's thread.
  /// `log` gets the lines of failed writes and exports (rate-limited); may be empty.
  explicit TraceManager(TraceConfig config, std::function<void(const std::string&)> log = {});
  /// Writes what is buffered (triton mode) and flushes the exporter (a last export, waiting at
  /// most a second).
  ~TraceManager();
  TraceManager(const TraceManager&) = delete;
  TraceManager& operator=(const TraceManager&) = delete;

  /// Whether any setting traces (a level other than OFF): frontends ask it before anything else
  /// of tracing, so that tracing off costs one relaxed load per request.
  bool active() const noexcept { return active_.load(std::memory_order_relaxed); }

  /// The settings of `model` ("" = the global ones).
  TraceSettings settings(std::string_view model) const;
  /// Applies `update` to `model`'s settings ("" = the global ones, which the models that fall
  /// back to them follow) and returns them. invalid_argument ("Attempting to set invalid trace
  /// setting :...") for a setting that would trace but cannot (a rate of 0; triton mode with no
  /// file); nothing changed then.
  Result<TraceSettings> update(std::string_view model, const TraceSettingUpdate& update);

  /// A trace for the next request of `model`, or null when it is not sampled (every rate-th,
  /// while count lasts). In opentelemetry mode a request with a valid `parent` is always traced
  /// (Triton since 24.01), under that parent. Call only when active(); takes two short locks.
  std::shared_ptr<Trace> sample(std::string_view model, const std::optional<TraceParent>& parent);

 private:
  friend class Trace;
  std::shared_ptr<Trace::Setting> make_setting(const TraceSettings& values,
                                               std::array<bool, 4> specified) const;
  void refresh_active();  // under mu_

  const TraceConfig config_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<OtlpExporter> exporter_;
  struct File;
  std::shared_ptr<File> file_;
  std::atomic<bool> active_{false};
  // Trace ids, from 1 (0 is "no parent"); shared with the settings, whose children take theirs.
  const std::shared_ptr<std::atomic<std::uint64_t>> next_id_ =
      std::make_shared<std::atomic<std::uint64_t>>(1);
  mutable std::mutex mu_;  // the settings below
  std::shared_ptr<Trace::Setting> default_;
  std::shared_ptr<Trace::Setting> global_;
  std::map<std::string, std::shared_ptr<Trace::Setting>, std::less<>> models_;
};

}  // namespace asyncinfer::server
