// trace.cpp — Triton's trace extension (trace.hpp).
#include "trace.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "asyncinfer/detail/enum_names.hpp"
#include "model_config.hpp"
#include "otlp_exporter.hpp"

namespace asyncinfer::server {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

/// The whole of `text` as an integer in [lo, hi]; nullopt otherwise.
std::optional<std::int64_t> parse_integer(std::string_view text, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || v < lo || v > hi) return std::nullopt;
  return v;
}

constexpr std::int64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();

/// A setting's number in Triton's words when it does not parse.
Result<std::int64_t> setting_number(std::string_view name, std::string_view text, std::int64_t lo,
                                    std::int64_t hi) {
  if (auto v = parse_integer(text, lo, hi)) return *v;
  if (parse_integer(text, std::numeric_limits<std::int64_t>::min(),
                    std::numeric_limits<std::int64_t>::max())) {
    if (name == "trace_count" &&
        parse_integer(text, std::numeric_limits<std::int64_t>::min(), -2)) {
      return invalid_argument_error("Unable to parse '" + std::string(name) +
                                    "'. Expecting value >= -1, got: " + std::string(text));
    }
    return invalid_argument_error("Unable to parse '" + std::string(name) +
                                  "', value is out of range [ " + std::to_string(lo) + ", " +
                                  std::to_string(hi) + " ], got: " + std::string(text));
  }
  return invalid_argument_error("Unable to parse '" + std::string(name) +
                                "', got: " + std::string(text));
}

/// A --trace-config level value (Triton's ParseTraceLevelOption); nullopt when unknown.
std::optional<std::uint32_t> cli_level(std::string_view value) {
  const std::string v = lower(value);
  if (v == "false" || v == "off") return 0u;
  if (v == "true" || v == "on" || v == "min" || v == "max" || v == "timestamps") {
    return kTraceTimestamps;
  }
  if (v == "tensors") return kTraceTensors;
  return std::nullopt;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

template <std::size_t N>
void random_bytes(std::array<std::uint8_t, N>& out) {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  for (std::size_t i = 0; i < N; i += 8) {
    std::uint64_t r = engine();
    for (std::size_t j = i; j < std::min(N, i + 8); ++j, r >>= 8) {
      out[j] = static_cast<std::uint8_t>(r);
    }
  }
}

}  // namespace

namespace {
constexpr detail::EnumNames<TraceMode, 2> kTraceModeNames{{"triton", "opentelemetry"},
                                                          "opentelemetry"};
}  // namespace

std::string_view to_string(TraceMode mode) noexcept { return kTraceModeNames.name(mode); }

// ---- --trace-config
// ------------------------------------------------------------------------------

Result<TraceConfig> parse_trace_config(const std::vector<std::string>& specs,
                                       const LegacyTraceFlags& legacy,
                                       const std::function<void(const std::string&)>& warn) {
  TraceConfig c;
  auto bad = [](const std::string& what, const std::string& why) {
    return invalid_argument_error("Bad option: \"--trace-config " + what + "\": " + why);
  };
  auto number = [&](const std::string& what, const std::string& v, std::int64_t lo,
                    std::int64_t hi) -> Result<std::int64_t> {
    if (auto n = parse_integer(v, lo, hi)) return *n;
    return bad(what, "'" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
  };
  // The older flags first; --trace-config's keys override them.
  auto legacy_number = [](const char* flag, const std::string& v, std::int64_t lo,
                          std::int64_t hi) -> Result<std::int64_t> {
    if (auto n = parse_integer(v, lo, hi)) return *n;
    return invalid_argument_error(std::string(flag) + ": '" + v + "' is not an integer in [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  if (legacy.file) c.file = *legacy.file;
  for (const std::string& l : legacy.levels) {
    auto bits = cli_level(l);
    if (!bits) return invalid_argument_error("--trace-level: invalid value for trace level: " + l);
    c.level |= *bits;
  }
  if (legacy.rate) {
    ASYNCINFER_ASSIGN_OR_RETURN(auto n, legacy_number("--trace-rate", *legacy.rate, 0, kU32Max));
    c.rate = static_cast<std::uint32_t>(n);
  }
  if (legacy.count) {
    ASYNCINFER_ASSIGN_OR_RETURN(auto n, legacy_number("--trace-count", *legacy.count, -1, kI32Max));
    c.count = static_cast<std::int32_t>(n);
  }
  if (legacy.log_frequency) {
    ASYNCINFER_ASSIGN_OR_RETURN(
        auto n, legacy_number("--trace-log-frequency", *legacy.log_frequency, 0, kU32Max));
    c.log_frequency = static_cast<std::uint32_t>(n);
  }
  bool level_given = false;
  std::optional<std::uint32_t> bsp_queue, bsp_delay, bsp_batch;
  for (const std::string& spec : specs) {
    const std::size_t comma = spec.find(',');
    const std::size_t first_eq = spec.find('=');
    if (comma == 0) {
      return invalid_argument_error(
          "No trace mode specified. --trace-config option format is "
          "<trace mode>,<setting>=<value> or <setting>=<value>. Got " +
          spec);
    }
    // A comma after the '=' belongs to the value (resource=a=b,c is not a mode).
    const bool has_mode =
        comma != std::string::npos && (first_eq == std::string::npos || comma < first_eq);
    std::string mode = has_mode ? lower(spec.substr(0, comma)) : "";
    const std::size_t key_at = has_mode ? comma + 1 : 0;
    const std::size_t eq_at = spec.find('=', key_at);
    if (eq_at == std::string::npos || eq_at == key_at || eq_at + 1 == spec.size()) {
      return invalid_argument_error(
          "--trace-config option format is '<trace mode>,<setting>=<value>'. Got " + spec);
    }
    const std::string key = spec.substr(key_at, eq_at - key_at);
    const std::string value = spec.substr(eq_at + 1);
    if (has_mode && !kTraceModeNames.parse(mode)) {
      return invalid_argument_error("invalid value for trace mode option: " + mode +
                                    ". Available options are \"triton\" and \"opentelemetry\"");
    }
    if (mode.empty()) {
      if (key == "rate") {
        ASYNCINFER_ASSIGN_OR_RETURN(auto n, number(key, value, 0, kU32Max));
        if (legacy.rate && warn) warn("warning: --trace-config rate overrides --trace-rate");
        c.rate = static_cast<std::uint32_t>(n);
      } else if (key == "level") {
        auto bits = cli_level(value);
        if (!bits) return bad(key, "invalid value for trace level option: " + value);
        if (!legacy.levels.empty() && !level_given && warn) {
          warn("warning: --trace-config level overrides --trace-level");
        }
        if (!level_given && !legacy.levels.empty()) c.level = 0;
        level_given = true;
        c.level |= *bits;
      } else if (key == "count") {
        ASYNCINFER_ASSIGN_OR_RETURN(auto n, number(key, value, -1, kI32Max));
        if (legacy.count && warn) warn("warning: --trace-config count overrides --trace-count");
        c.count = static_cast<std::int32_t>(n);
      } else if (key == "mode") {
        if (auto m = kTraceModeNames.parse(lower(value))) {
          c.mode = *m;
        } else {
          return bad(key, "invalid value for trace mode option: " + value +
                              ". Available options are \"triton\" and \"opentelemetry\"");
        }
      } else {
        return bad(key, "unknown setting (global settings: rate, level, count, mode)");
      }
    } else if (mode == "triton") {
      if (key == "file") {
        if (legacy.file && warn) warn("warning: --trace-config triton,file overrides --trace-file");
        c.file = value;
      } else if (key == "log-frequency") {
        ASYNCINFER_ASSIGN_OR_RETURN(auto n, number("triton," + key, value, 0, kU32Max));
        if (legacy.log_frequency && warn) {
          warn("warning: --trace-config triton,log-frequency overrides --trace-log-frequency");
        }
        c.log_frequency = static_cast<std::uint32_t>(n);
      } else {
        return bad("triton," + key, "unknown setting (triton settings: file, log-frequency)");
      }
    } else {
      const std::string what = "opentelemetry," + key;
      if (key == "url") {
        if (auto u = parse_http_url(value); !u.ok())
          return bad(what, std::string(u.status().message()));
        c.otel.url = value;
      } else if (key == "resource") {
        const std::size_t at = value.find('=');
        if (at == std::string::npos || at == 0) {
          return bad(what, "expects resource=<key>=<value>, got " + value);
        }
        c.otel.resource.emplace_back(value.substr(0, at), value.substr(at + 1));
      } else if (key == "bsp_max_queue_size" || key == "bsp_schedule_delay" ||
                 key == "bsp_max_export_batch_size") {
        ASYNCINFER_ASSIGN_OR_RETURN(auto n, number(what, value, 0, kU32Max));
        auto v = static_cast<std::uint32_t>(n);
        (key == "bsp_max_queue_size"   ? bsp_queue
         : key == "bsp_schedule_delay" ? bsp_delay
                                       : bsp_batch) = v;
      } else {
        return bad(what,
                   "unknown setting (opentelemetry settings: url, resource, bsp_max_queue_size, "
                   "bsp_schedule_delay, bsp_max_export_batch_size)");
      }
    }
  }
  // The batch span processor's settings not given: OTEL_BSP_* from the environment, else
  // OpenTelemetry's defaults (as Triton does).
  for (auto [given, env, field] :
       {std::tuple{&bsp_queue, "OTEL_BSP_MAX_QUEUE_SIZE", &c.otel.bsp_max_queue_size},
        std::tuple{&bsp_delay, "OTEL_BSP_SCHEDULE_DELAY", &c.otel.bsp_schedule_delay_ms},
        std::tuple{&bsp_batch, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                   &c.otel.bsp_max_export_batch_size}}) {
    if (*given) {
      *field = **given;
      continue;
    }
    if (const char* e = std::getenv(env); e != nullptr && *e != '\0') {
      auto n = parse_integer(e, 0, kU32Max);
      if (!n)
        return invalid_argument_error(std::string("Bad option: \"") + env + "\": '" + e + "'");
      *field = static_cast<std::uint32_t>(*n);
    }
  }
  if (c.level != 0 && c.mode == TraceMode::triton && c.file.empty()) {
    return invalid_argument_error(
        "--trace-config level=" +
        std::string(c.level & kTraceTimestamps ? "TIMESTAMPS" : "TENSORS") +
        " in triton mode needs a file: --trace-config triton,file=<path>");
  }
  if (c.level != 0 && c.rate == 0) {
    return invalid_argument_error("--trace-config rate=0: the sample rate must be non-zero");
  }
  return c;
}

// ---- the trace-setting API
// -------------------------------------------------------------------------

Result<TraceSettingUpdate> parse_trace_setting_update(
    const std::map<std::string, std::optional<std::vector<std::string>>, std::less<>>& given) {
  TraceSettingUpdate u;
  if (given.contains("trace_file")) {
    return invalid_argument_error(
        "trace file location can not be updated through network protocol");
  }
  if (auto it = given.find("trace_level"); it != given.end()) {
    if (!it->second || it->second->empty()) {
      u.level.op = TraceSettingChange<std::uint32_t>::Op::clear;
    } else {
      std::uint32_t level = 0;
      for (const std::string& l : *it->second) {
        if (l == "OFF") {
          if (it->second->size() != 1) {
            return invalid_argument_error("Expect only one trace level 'OFF' is specified");
          }
        } else if (l == "TIMESTAMPS") {
          level |= kTraceTimestamps;
        } else if (l == "TENSORS") {
          level |= kTraceTensors;
        } else {
          return invalid_argument_error("Unable to parse 'trace_level', got: " + l +
                                        " (OFF, TIMESTAMPS or TENSORS)");
        }
      }
      u.level = {TraceSettingChange<std::uint32_t>::Op::set, level};
    }
  }
  auto one = [&](std::string_view name, auto& change, std::int64_t lo, std::int64_t hi) -> Status {
    auto it = given.find(name);
    if (it == given.end()) return Status();
    using Op = typename std::remove_reference_t<decltype(change)>::Op;
    if (!it->second || it->second->empty()) {
      change.op = Op::clear;
      return Status();
    }
    if (it->second->size() != 1) {
      return invalid_argument_error("expect only 1 value for '" + std::string(name) + "'");
    }
    auto n = setting_number(name, it->second->front(), lo, hi);
    if (!n.ok()) return n.status();
    change.op = Op::set;
    change.value = static_cast<decltype(change.value)>(*n);
    return Status();
  };
  if (Status s = one("trace_rate", u.rate, 0, kU32Max); !s.ok()) return s;
  if (Status s = one("trace_count", u.count, -1, kI32Max); !s.ok()) return s;
  if (Status s = one("log_frequency", u.log_frequency, 0, kU32Max); !s.ok()) return s;
  return u;
}

std::vector<std::pair<std::string, std::vector<std::string>>> trace_settings_values(
    const TraceSettings& s) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  std::vector<std::string> levels;
  if (s.level == 0) levels.emplace_back("OFF");
  if (s.level & kTraceTimestamps) levels.emplace_back("TIMESTAMPS");
  if (s.level & kTraceTensors) levels.emplace_back("TENSORS");
  out.emplace_back("trace_level", std::move(levels));
  out.push_back({"trace_rate", {std::to_string(s.rate)}});
  out.push_back({"trace_count", {std::to_string(s.count)}});
  if (s.mode == TraceMode::triton) {
    out.push_back({"log_frequency", {std::to_string(s.log_frequency)}});
    out.push_back({"trace_file", {s.file}});
  }
  out.push_back({"trace_mode", {std::string(to_string(s.mode))}});
  if (s.mode == TraceMode::opentelemetry && s.otel != nullptr) {
    out.push_back({"url", {s.otel->url}});
    std::vector<std::string> resource;
    for (const auto& [k, v] : s.otel->resource) resource.push_back(k + "=" + v);
    if (!resource.empty()) out.emplace_back("resource", std::move(resource));
    out.push_back({"bsp_max_queue_size", {std::to_string(s.otel->bsp_max_queue_size)}});
    out.push_back({"bsp_schedule_delay", {std::to_string(s.otel->bsp_schedule_delay_ms)}});
    out.push_back(
        {"bsp_max_export_batch_size", {std::to_string(s.otel->bsp_max_export_batch_size)}});
  }
  return out;
}

std::string trace_settings_json(const TraceSettings& settings) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (auto& [name, values] : trace_settings_values(settings)) {
    if (name == "trace_level") {
      j[name] = values;
    } else if (values.size() == 1) {
      j[name] = values.front();
    } else {
      std::string joined;
      for (const std::string& v : values) joined += (joined.empty() ? "" : ",") + v;
      j[name] = joined;
    }
  }
  return j.dump();
}

std::optional<TraceParent> parse_traceparent(std::string_view v) noexcept {
  // version "-" trace-id "-" parent-id "-" trace-flags, lower-case hex.
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  if (v.substr(0, 2) == "ff") return std::nullopt;
  if (v.substr(0, 2) == "00" && v.size() != 55) return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto bytes = [&](std::string_view s, std::uint8_t* out) {
    for (std::size_t i = 0; i < s.size(); i += 2) {
      const int hi = hex(s[i]);
      const int lo = hex(s[i + 1]);
      if (hi < 0 || lo < 0) return false;
      out[i / 2] = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    return true;
  };
  TraceParent p;
  std::uint8_t version = 0;
  if (!bytes(v.substr(0, 2), &version) || !bytes(v.substr(3, 32), p.trace_id.data()) ||
      !bytes(v.substr(36, 16), p.span_id.data()) || !bytes(v.substr(53, 2), &p.flags)) {
    return std::nullopt;
  }
  auto zero = [](const auto& a) {
    return std::all_of(a.begin(), a.end(), [](auto b) { return b == 0; });
  };
  if (zero(p.trace_id) || zero(p.span_id)) return std::nullopt;
  return p;
}

// ---- files
// -----------------------------------------------------------------------------------------

/// The trace file of triton mode: a JSON array of records, opened at the first write and closed
/// ("]") when the manager goes; and its indexed siblings <file>.<n>, each a whole array.
struct TraceManager::File {
  File(std::string file_path, std::function<void(const std::string&)> log_line)
      : path(std::move(file_path)), log(std::move(log_line)) {}
  ~File() {
    if (out != nullptr) {
      std::fputs("]", out);
      std::fclose(out);
    }
  }
  void fail(const std::string& which) {
    if (log && !failed.exchange(true)) log("error: cannot write trace file " + which);
  }
  /// Appends `records` (comma-separated JSON objects) to the main file.
  void append(const std::string& records) {
    std::lock_guard lock(mu);
    if (out == nullptr) {
      out = std::fopen(path.c_str(), "w");
      if (out == nullptr) return fail(path);
      std::fputs("[", out);
    } else {
      std::fputs(",", out);
    }
    std::fwrite(records.data(), 1, records.size(), out);
    std::fflush(out);
  }
  /// Writes `records` as the next indexed file.
  void write_indexed(const std::string& records) {
    const std::string name = path + "." + std::to_string(index.fetch_add(1));
    std::FILE* f = std::fopen(name.c_str(), "w");
    if (f == nullptr) return fail(name);
    std::fputs("[", f);
    std::fwrite(records.data(), 1, records.size(), f);
    std::fputs("]", f);
    std::fclose(f);
  }

  const std::string path;
  const std::function<void(const std::string&)> log;
  std::mutex mu;
  std::FILE* out = nullptr;  // under mu
  std::atomic<std::uint32_t> index{0};
  std::atomic<bool> failed{false};
};

// ---- a setting
// ---------------------------------------------------------------------------------------

/// One setting object (Triton's TraceSetting): its values, which of them the setting names itself
/// (the others follow its fallback), and the sampling state of the traces made under it.
struct Trace::Setting {
  Setting(TraceSettings v, std::array<bool, 4> given, std::shared_ptr<TraceManager::File> to,
          OtlpExporter* spans_to, std::shared_ptr<std::atomic<std::uint64_t>> id_source)
      : values(std::move(v)),
        specified(given),
        file(std::move(to)),
        exporter(spans_to),
        ids(std::move(id_source)) {}
  ~Setting() {
    // What is still buffered: to the main file, or the next indexed one with log_frequency.
    if (values.mode == TraceMode::triton && in_stream > 0 && file) {
      if (values.log_frequency != 0) {
        file->write_indexed(stream);
      } else {
        file->append(stream);
      }
    }
  }
  /// Why it cannot trace ("" when it can).
  std::string invalid_reason() const {
    if (values.level == 0) return "tracing is disabled";
    if (values.rate == 0) return "sample rate must be non-zero";
    if (values.mode == TraceMode::triton && values.file.empty()) {
      return "trace file name is not given";
    }
    return "";
  }
  /// Whether the next request is sampled (Triton's TraceSetting::SampleTrace).
  bool sample(bool force) {
    std::lock_guard lock(mu);
    if (values.rate == 0) return force;
    if ((values.level == 0 || values.count == 0 ||
         (values.mode == TraceMode::triton && values.file.empty())) &&
        !force) {
      return false;
    }
    bool hit = (++sampled % values.rate) == 0;
    if (hit && values.count > 0) {
      --values.count;
      ++created;
    } else if (hit && values.count == 0) {
      hit = false;
    } else if (hit) {
      ++created;
    }
    return hit || force;
  }
  /// A finished trace's records (triton mode; Triton's TraceSetting::WriteTrace).
  void write(const std::string& records) {
    std::unique_lock lock(mu);
    if (in_stream != 0) stream += ",";
    stream += records;
    ++in_stream;
    ++collected;
    if ((values.count == 0 && collected >= created) ||
        (values.log_frequency != 0 && in_stream >= values.log_frequency)) {
      std::string out = std::move(stream);
      stream.clear();
      in_stream = 0;
      lock.unlock();
      if (file) file->write_indexed(out);
    }
  }
  TraceSettings snapshot() const {
    std::lock_guard lock(mu);
    return values;
  }

  mutable std::mutex mu;
  TraceSettings values;                 // count under mu (it counts down)
  const std::array<bool, 4> specified;  // level, rate, count, log_frequency
  const std::shared_ptr<TraceManager::File> file;
  OtlpExporter* const exporter;
  const std::shared_ptr<std::atomic<std::uint64_t>> ids;  // the manager's trace ids
  std::uint64_t sampled = 0;                              // under mu: requests seen
  std::uint64_t created = 0;                              // under mu: traces made
  std::uint64_t collected = 0;                            // under mu: traces written
  std::uint32_t in_stream = 0;                            // under mu
  std::string stream;                                     // under mu
  std::int64_t unix_offset_ns = 0;  // system clock − steady clock, at the setting's making
};

// ---- a trace
// -------------------------------------------------------------------------------------------

Trace::Trace(std::shared_ptr<Setting> setting, std::uint64_t id, std::optional<TraceParent> parent,
             std::shared_ptr<Trace> parent_trace)
    : setting_(std::move(setting)),
      id_(id),
      parent_(parent),
      parent_trace_(std::move(parent_trace)) {
  if (setting_->values.mode != TraceMode::opentelemetry) return;
  if (parent_trace_) {
    otel_trace_id_ = parent_trace_->otel_trace_id_;
  } else if (parent_) {
    otel_trace_id_ = parent_->trace_id;
  } else {
    random_bytes(otel_trace_id_);
  }
  random_bytes(model_span_id_);
}

std::shared_ptr<Trace> Trace::child_of(const std::shared_ptr<TraceHandle>& parent) {
  std::shared_ptr<Trace> p = of(parent);
  if (!p) return nullptr;
  std::shared_ptr<Setting> setting = p->setting_;
  const std::uint64_t id = setting->ids->fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<Trace>(new Trace(std::move(setting), id, std::nullopt, std::move(p)));
}

void Trace::record(std::string_view activity, std::int64_t ns) {
  std::lock_guard lock(mu_);
  events_.emplace_back(std::string(activity), ns);
}

void Trace::record_now(std::string_view activity) { record(activity, now_ns()); }

void Trace::set_model(std::string name, std::int64_t version, std::string request_id) {
  std::lock_guard lock(mu_);
  model_ = std::move(name);
  version_ = version;
  request_id_ = std::move(request_id);
}

void Trace::record_timeline() {
  const RequestTimeline& t = *timeline_;
  for (auto [name, field] : {std::pair{"QUEUE_START", &t.queue_start_ns},
                             std::pair{"COMPUTE_START", &t.compute_start_ns},
                             std::pair{"COMPUTE_INPUT_END", &t.compute_input_end_ns},
                             std::pair{"COMPUTE_OUTPUT_START", &t.compute_output_start_ns},
                             std::pair{"COMPUTE_END", &t.compute_end_ns}}) {
    if (const std::int64_t ns = field->load(std::memory_order_relaxed); ns != 0) record(name, ns);
  }
}

bool Trace::traces_tensors() const noexcept {
  // level and mode are fixed for a setting's life.
  return (setting_->values.level & kTraceTensors) != 0 &&
         setting_->values.mode == TraceMode::triton;
}

namespace {

// A tensor's elements as Triton's TENSORS level writes them (its tracer.cc): comma-separated,
// numbers as an ostream prints them (6 significant digits for floats), BOOL as 0/1, BYTES each
// in escaped quotes, FP16 and BF16 not at all. Unlike Triton's, INT8 and UINT8 are numbers
// (Triton streams them as characters) and BYTES are JSON-escaped, so the file stays JSON.
template <class T>
void append_numbers(std::ostringstream& out, const Tensor& t) {
  const auto* v = static_cast<const T*>(t.data());  // T has the size of the dtype's elements
  for (std::size_t e = 0; e < t.numel(); ++e) {
    if (e != 0) out << ",";
    if constexpr (sizeof(T) == 1) {
      out << static_cast<int>(v[e]);
    } else {
      out << v[e];
    }
  }
}

std::string tensor_text(const Tensor& t) {
  if (!t.defined() || !t.is_host_accessible()) return "";
  std::ostringstream out;
  switch (t.dtype()) {
    case DType::boolean:
      append_numbers<std::uint8_t>(out, t);
      break;
    case DType::u8:
      append_numbers<std::uint8_t>(out, t);
      break;
    case DType::i8:
      append_numbers<std::int8_t>(out, t);
      break;
    case DType::u16:
      append_numbers<std::uint16_t>(out, t);
      break;
    case DType::i16:
      append_numbers<std::int16_t>(out, t);
      break;
    case DType::u32:
      append_numbers<std::uint32_t>(out, t);
      break;
    case DType::i32:
      append_numbers<std::int32_t>(out, t);
      break;
    case DType::u64:
      append_numbers<std::uint64_t>(out, t);
      break;
    case DType::i64:
      append_numbers<std::int64_t>(out, t);
      break;
    case DType::f32:
      append_numbers<float>(out, t);
      break;
    case DType::f64:
      append_numbers<double>(out, t);
      break;
    case DType::f16:
    case DType::bf16:
      break;
    case DType::bytes: {
      auto strings = t.string_elements();
      if (!strings.ok()) return "";
      bool first = true;
      for (std::string_view s : *strings) {
        if (!first) out << ",";
        first = false;
        out << "\"" << s << "\"";
      }
      break;
    }
  }
  return out.str();
}

}  // namespace

void Trace::record_tensor(std::initializer_list<std::string_view> activities, std::string_view name,
                          const Tensor& tensor) {
  if (!traces_tensors() || activities.size() == 0) return;
  std::string shape;
  for (std::size_t i = 0; i < tensor.shape().size(); ++i) {
    shape += (i == 0 ? "" : ",") + std::to_string(tensor.shape()[i]);
  }
  // The tensor's text once (its elements are what costs), then a record per activity around it,
  // in Triton's order: {"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}.
  const nlohmann::ordered_json t = {{"name", name},
                                    {"data", tensor_text(tensor)},
                                    {"shape", shape},
                                    {"dtype", std::string(oip_datatype(tensor.dtype()))}};
  const std::string text = t.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string head = "{\"id\":" + std::to_string(id_) + ",\"activity\":";
  std::vector<std::string> records;
  records.reserve(activities.size());
  for (std::string_view activity : activities) {
    records.push_back(head + nlohmann::json(activity).dump() + ",\"tensor\":" + text + "}");
  }
  std::lock_guard lock(mu_);
  for (std::string& r : records) tensors_.push_back(std::move(r));
}

std::string Trace::triton_records(const std::vector<std::pair<std::string, std::int64_t>>& events,
                                  std::vector<std::string>& tensors) const {
  std::string out;
  for (std::string& t : tensors) out += (out.empty() ? "" : ",") + t;
  if ((setting_->values.level & kTraceTimestamps) == 0) return out;
  const std::string id = std::to_string(id_);
  for (const auto& [name, ns] : events) {
    if (!out.empty()) out += ",";
    if (name == "REQUEST_START") {
      // Triton's record of the trace (its tracer.cc): parent_id only for a child.
      nlohmann::ordered_json m = {{"id", id_}, {"model_name", model_}, {"model_version", version_}};
      if (!request_id_.empty()) m["request_id"] = request_id_;
      if (parent_trace_) m["parent_id"] = parent_trace_->id_;
      out += m.dump() + ",";
    }
    out += "{\"id\":" + id + ",\"timestamps\":[{\"name\":\"" + name +
           "\",\"ns\":" + std::to_string(ns) + "}]}";
  }
  return out;
}

Trace::~Trace() {
  std::vector<std::pair<std::string, std::int64_t>> events;
  std::vector<std::string> tensors;
  std::string children;
  {
    std::lock_guard lock(mu_);
    events = std::move(events_);
    tensors = std::move(tensors_);
    children = std::move(children_);
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  if (setting_->values.mode == TraceMode::triton) {  // the mode is fixed for a setting's life
    std::string out = triton_records(events, tensors);
    if (!children.empty()) out += (out.empty() ? "" : ",") + children;
    if (out.empty()) return;
    if (parent_trace_) {  // written with the parent, which this trace holds until now
      std::lock_guard lock(parent_trace_->mu_);
      std::string& to = parent_trace_->children_;
      to += (to.empty() ? "" : ",") + out;
      return;
    }
    setting_->write(out);
    return;
  }
  if (!events.empty()) export_spans(events);
}

void Trace::export_spans(const std::vector<std::pair<std::string, std::int64_t>>& events) const {
  if (setting_->exporter == nullptr) return;
  // Triton's spans: "InferRequest" (the frontend's activities), under it the model's
  // (REQUEST_START..REQUEST_END), under that "compute" (COMPUTE_START..COMPUTE_END). A child has
  // no InferRequest span: its model span hangs under its parent's model span.
  const std::int64_t offset = setting_->unix_offset_ns;
  auto unix_ns = [offset](std::int64_t ns) { return static_cast<std::uint64_t>(ns + offset); };
  const bool child = parent_trace_ != nullptr;
  OtlpSpan root;
  root.trace_id = otel_trace_id_;
  if (parent_) root.parent_span_id = parent_->span_id;
  random_bytes(root.span_id);
  root.name = "InferRequest";
  root.start_unix_ns = unix_ns(events.front().second);
  root.end_unix_ns = unix_ns(events.back().second);
  OtlpSpan model;
  OtlpSpan compute;
  bool has_model = false;
  bool has_compute = false;
  for (const auto& [name, ns] : events) {
    if (name == "REQUEST_START") {
      has_model = true;
      model.start_unix_ns = model.end_unix_ns = unix_ns(ns);
    }
    if (name == "COMPUTE_START") {
      has_compute = true;
      compute.start_unix_ns = compute.end_unix_ns = unix_ns(ns);
    }
  }
  if (child && !has_model) return;  // never reached its model: nothing to hang anywhere
  for (const auto& [name, ns] : events) {
    const bool compute_event = name.rfind("COMPUTE_", 0) == 0;
    const bool model_event = name == "REQUEST_START" || name == "QUEUE_START" ||
                             name == "REQUEST_END" || name == "INFER_RESPONSE_COMPLETE";
    OtlpSpan& to = compute_event && has_compute          ? compute
                   : (model_event || child) && has_model ? model
                                                         : root;
    to.events.emplace_back(name, unix_ns(ns));
    if (&to != &root) to.end_unix_ns = std::max(to.end_unix_ns, unix_ns(ns));
  }
  std::vector<OtlpSpan> spans;
  if (has_model) {
    model.trace_id = otel_trace_id_;
    model.span_id = model_span_id_;
    model.parent_span_id = child ? parent_trace_->model_span_id_ : root.span_id;
    model.name = model_;
    model.string_attributes.emplace_back("triton.model_name", model_);
    model.int_attributes.emplace_back("triton.model_version", version_);
    model.int_attributes.emplace_back("triton.trace_id", static_cast<std::int64_t>(id_));
    model.int_attributes.emplace_back("triton.trace_parent_id",
                                      static_cast<std::int64_t>(parent_id()));
    if (!request_id_.empty())
      model.string_attributes.emplace_back("triton.request_id", request_id_);
    if (has_compute) {
      compute.trace_id = otel_trace_id_;
      random_bytes(compute.span_id);
      compute.parent_span_id = model.span_id;
      compute.name = "compute";
      spans.push_back(std::move(compute));
    }
    spans.push_back(std::move(model));
  }
  if (!child) spans.push_back(std::move(root));
  setting_->exporter->add(std::move(spans));
}

// ---- the manager
// ---------------------------------------------------------------------------------------

TraceManager::TraceManager(TraceConfig config, std::function<void(const std::string&)> log)
    : config_(std::move(config)), log_(std::move(log)) {
  if (config_.mode == TraceMode::opentelemetry) {
    exporter_ = std::make_unique<OtlpExporter>(config_.otel, log_);
  }
  file_ = std::make_shared<File>(config_.file, log_);
  TraceSettings start;
  start.level = config_.level;
  start.rate = config_.rate;
  start.count = config_.count;
  start.log_frequency = config_.log_frequency;
  start.file = config_.file;
  start.mode = config_.mode;
  start.otel = &config_.otel;
  default_ = make_setting(start, {});
  global_ = make_setting(start, {});
  refresh_active();
}

TraceManager::~TraceManager() {
  {
    std::lock_guard lock(mu_);
    models_.clear();
    global_.reset();
    default_.reset();
  }
  file_.reset();
  exporter_.reset();  // sends what is queued, then joins
}

std::shared_ptr<Trace::Setting> TraceManager::make_setting(const TraceSettings& values,
                                                           std::array<bool, 4> specified) const {
  auto s = std::make_shared<Trace::Setting>(values, specified, file_, exporter_.get(), next_id_);
  s->unix_offset_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count() -
                      now_ns();
  return s;
}

void TraceManager::refresh_active() {
  bool on = global_->values.level != 0;
  for (const auto& [name, s] : models_) on = on || s->values.level != 0;
  active_.store(on, std::memory_order_relaxed);
}

TraceSettings TraceManager::settings(std::string_view model) const {
  std::lock_guard lock(mu_);
  auto it = models_.find(model);
  return (it == models_.end() ? global_ : it->second)->snapshot();
}

Result<TraceSettings> TraceManager::update(std::string_view model, const TraceSettingUpdate& u) {
  std::lock_guard lock(mu_);
  // A model's fields fall back to the global setting; the global's to the start values.
  auto rebuild = [&](const Trace::Setting* current, const Trace::Setting& fallback,
                     const TraceSettingUpdate& change,
                     std::array<bool, 4>* specified) -> TraceSettings {
    TraceSettings v = fallback.snapshot();
    TraceSettings cur = current != nullptr ? current->snapshot() : v;
    using Op = TraceSettingChange<std::uint32_t>::Op;
    auto pick = [&](std::size_t i, auto op, auto value, auto current_value, auto& out) {
      const bool was = current != nullptr && current->specified[i];
      const bool now = static_cast<int>(op) == static_cast<int>(Op::clear)
                           ? false
                           : (was || static_cast<int>(op) == static_cast<int>(Op::set));
      (*specified)[i] = now;
      if (now) out = static_cast<int>(op) == static_cast<int>(Op::set) ? value : current_value;
    };
    pick(0, change.level.op, change.level.value, cur.level, v.level);
    pick(1, change.rate.op, change.rate.value, cur.rate, v.rate);
    pick(2, change.count.op, change.count.value, cur.count, v.count);
    pick(3, change.log_frequency.op, change.log_frequency.value, cur.log_frequency,
         v.log_frequency);
    return v;
  };
  auto check = [](const std::shared_ptr<Trace::Setting>& s) -> Status {
    const std::string why = s->invalid_reason();
    if (!why.empty() && s->values.level != 0) {
      return invalid_argument_error("Attempting to set invalid trace setting :" + why);
    }
    return Status();
  };
  if (model.empty()) {
    std::array<bool, 4> specified{};
    TraceSettings v = rebuild(global_.get(), *default_, u, &specified);
    auto next = make_setting(v, specified);
    if (Status s = check(next); !s.ok()) return s;
    // The models that fall back to the global setting follow it (their counters restart).
    std::map<std::string, std::shared_ptr<Trace::Setting>, std::less<>> models;
    for (const auto& [name, m] : models_) {
      std::array<bool, 4> ms{};
      TraceSettings mv = rebuild(m.get(), *next, TraceSettingUpdate{}, &ms);
      models.emplace(name, make_setting(mv, ms));
    }
    global_ = std::move(next);
    models_ = std::move(models);
    refresh_active();
    return global_->snapshot();
  }
  auto it = models_.find(model);
  std::array<bool, 4> specified{};
  TraceSettings v =
      rebuild(it == models_.end() ? nullptr : it->second.get(), *global_, u, &specified);
  if (std::none_of(specified.begin(), specified.end(), [](bool b) { return b; })) {
    if (it != models_.end()) models_.erase(it);  // back to the global setting, whole
    refresh_active();
    return global_->snapshot();
  }
  auto next = make_setting(v, specified);
  if (Status s = check(next); !s.ok()) return s;
  models_.insert_or_assign(std::string(model), next);
  refresh_active();
  return next->snapshot();
}

std::shared_ptr<Trace> TraceManager::sample(std::string_view model,
                                            const std::optional<TraceParent>& parent) {
  std::shared_ptr<Trace::Setting> setting;
  {
    std::lock_guard lock(mu_);
    auto it = models_.find(model);
    setting = it == models_.end() ? global_ : it->second;
  }
  const bool force = parent.has_value() && setting->values.mode == TraceMode::opentelemetry &&
                     setting->values.level != 0;
  if (!setting->sample(force)) return nullptr;
  const bool otel = setting->values.mode == TraceMode::opentelemetry;
  return std::shared_ptr<Trace>(new Trace(std::move(setting),
                                          next_id_->fetch_add(1, std::memory_order_relaxed),
                                          otel ? parent : std::nullopt, nullptr));
}

}  // namespace asyncinfer::server
