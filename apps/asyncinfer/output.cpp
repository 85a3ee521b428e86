// output.cpp — table, JSON and CSV renderings of a bench report (output.hpp).
#include "output.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace asyncinfer::cli {
namespace {

using json = nlohmann::ordered_json;

/// Rounds to 3 decimals so the JSON stays readable (µs: nanosecond resolution).
double r3(double v) { return std::round(v * 1000.0) / 1000.0; }

json opt(const std::optional<double>& v) { return v ? json(r3(*v)) : json(nullptr); }
json opt(const std::optional<std::int64_t>& v) { return v ? json(*v) : json(nullptr); }

std::optional<double> div_opt(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b == 0) return std::nullopt;
  return *a / *b;
}

json latency_json(const LatencySummary& s) {
  return json{{"count", s.count},  {"min", opt(s.min)},   {"mean", opt(s.mean)},
              {"p50", opt(s.p50)}, {"p90", opt(s.p90)},   {"p95", opt(s.p95)},
              {"p99", opt(s.p99)}, {"p999", opt(s.p999)}, {"max", opt(s.max)}};
}

json hist_json(const HistogramSummary& h) {
  return json{{"count", h.count}, {"mean", opt(h.mean)}, {"p50", opt(h.p50)}, {"p99", opt(h.p99)}};
}

json config_json(const BenchReport& rep, const RunResult* run) {
  const BenchOptions& o = *rep.options;
  json compare = json::array();
  for (Mode m : o.compare) compare.push_back(to_string(m));
  json input_shape = json::array();
  for (const InputShapeArg& s : o.input_shapes) input_shape.push_back(s.to_string());
  json c{
      {"model", o.model},
      {"model_signature", rep.model_signature},
      {"device", o.device},
      {"device_description", rep.device_description},
      {"inputs", rep.inputs},
      {"mode", to_string(run != nullptr ? run->mode : o.mode)},
      {"concurrency", nullptr},
      {"request_rate", nullptr},
      {"arrivals", to_string(o.arrivals)},
      {"compare", compare},
      {"workers", o.workers},
      {"max_batch_size", opt(o.max_batch_size)},  // as given; null = the engine's rule
      {"max_batch", opt(o.max_batch_size)},       // the old name of max_batch_size, for readers
      {"max_queue_delay_us", o.max_queue_delay_us},
      {"preferred_batch", o.preferred_batch},
      {"inflight_per_worker", o.inflight_per_worker},
      {"priority_levels", o.priority_levels},
      {"priority", o.priority.to_string().empty() ? json(nullptr) : json(o.priority.to_string())},
      {"timeout_ms", o.timeout_ms > 0 ? json(o.timeout_ms) : json(nullptr)},
      {"completion_threads", o.completion_threads},
      {"spin_wait_us", o.spin_wait_us},
      {"queue_capacity", o.queue_capacity > 0 ? json(o.queue_capacity) : json(nullptr)},
      {"max_attempts", o.max_attempts},
      {"intra_op_threads", o.intra_op_threads},
      {"contention", o.contention},
      {"warmup", o.warmup},
      {"warmup_s", o.warmup_s},
      {"duration_s", o.requests > 0 ? json(nullptr) : json(o.duration_s)},
      {"requests", o.requests > 0 ? json(o.requests) : json(nullptr)},
      {"input_shape", input_shape},
      {"batch_rows", o.batch_rows},
      {"data", o.data.to_string()},
      {"seed", o.seed},
  };
  if (run != nullptr) {
    if (run->mode != Mode::rate) c["concurrency"] = run->concurrency;
    if (run->request_rate) c["request_rate"] = *run->request_rate;
  } else {
    c["concurrency"] = o.concurrency.size() == 1 ? json(o.concurrency[0]) : json(o.concurrency);
    if (!o.request_rate.empty()) {
      c["request_rate"] =
          o.request_rate.size() == 1 ? json(o.request_rate[0]) : json(o.request_rate);
    }
  }
  return c;
}

json machine_json(const MachineInfo& m) {
  return json{{"cores", m.cores},
              {"cpu_model", m.cpu_model},
              {"os", m.os},
              {"compiler", m.compiler},
              {"allocator", m.allocator}};
}

json run_json(const BenchReport& rep, const RunResult& r) {
  json failures = json::object();
  for (const auto& [reason, n] : r.failures) failures[reason] = n;
  json j{
      {"mode", to_string(r.mode)},
      {"label", r.label},
      {"concurrency", r.mode == Mode::rate ? json(nullptr) : json(r.concurrency)},
      {"request_rate", opt(r.request_rate)},
      {"arrivals", r.arrivals ? json(to_string(*r.arrivals)) : json(nullptr)},
      {"max_batch_size", opt(r.max_batch_size)},
      {"requests", r.requests},
      {"completed", r.completed},
      {"failed", r.failed},
      {"warmup_requests", r.warmup_requests},
      {"warmup_s", r3(r.warmup_s)},
      {"duration_s", r3(r.duration_s * 1000.0) / 1000.0},
      {"throughput_rps", r3(r.throughput_rps)},
      {"rows_per_s", r3(r.rows_per_s)},
      {"rows_per_request", r.rows_per_request},
      {"latency_us", latency_json(r.latency)},
      {"queue_us", hist_json(r.queue_us)},
      {"compute_us", hist_json(r.compute_us)},
      {"batch_size_mean", opt(r.batch_size_mean)},
      {"batches", r.batches},
      {"failures", failures},
      {"cpu_util", opt(r.cpu_util)},
      {"cpu_user_s", r3(r.cpu_user_s)},
      {"cpu_sys_s", r3(r.cpu_sys_s)},
      {"first_inference_us", opt(r.first_inference_us)},
      {"bound_rps", opt(r.bound_rps)},
      {"fraction_of_bound",
       r.bound_rps && *r.bound_rps > 0 ? json(r.throughput_rps / *r.bound_rps) : json(nullptr)},
      {"send_lag_us", r.send_lag_us ? latency_json(*r.send_lag_us) : json(nullptr)},
      {"config", config_json(rep, &r)},
      {"machine", machine_json(rep.machine)},
  };
  return j;
}

std::string csv_cell(const std::optional<double>& v) {
  if (!v) return "";
  std::ostringstream s;
  s.precision(10);
  s << r3(*v);
  return s.str();
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string failures_text(const RunResult& r, const char* sep) {
  if (r.failures.empty()) return "";
  std::string s;
  for (const auto& [reason, n] : r.failures) {
    if (!s.empty()) s += sep;
    s += reason + (std::string(sep) == ";" ? "=" : " ") + std::to_string(n);
  }
  return s;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

std::string format_us(std::optional<double> us) {
  if (!us) return "-";
  const double v = *us;
  if (v < 1000.0) return fmt("%.1f us", v);
  if (v < 1e6) return fmt("%.2f ms", v / 1e3);
  return fmt("%.2f s", v / 1e6);
}

std::string_view to_string(ReportKind kind) noexcept {
  switch (kind) {
    case ReportKind::compare:
      return "compare";
    case ReportKind::sweep:
      return "sweep";
    case ReportKind::contention:
      return "contention";
    case ReportKind::single:
      break;
  }
  return "single";
}

std::vector<Ratio> ratios(const BenchReport& rep) {
  std::vector<Ratio> out;
  if (rep.runs.empty()) return out;
  const RunResult& base = rep.runs.front();
  for (const RunResult& r : rep.runs) {
    Ratio x;
    x.mode = r.mode;
    x.label = r.label;
    x.throughput = div_opt(r.throughput_rps, base.throughput_rps);
    x.p50 = div_opt(r.latency.p50, base.latency.p50);
    x.p99 = div_opt(r.latency.p99, base.latency.p99);
    out.push_back(std::move(x));
  }
  return out;
}

nlohmann::ordered_json to_json(const BenchReport& rep) {
  json doc{
      {"schema_version", kJsonSchemaVersion},
      {"tool", "asyncinfer bench"},
      {"kind", to_string(rep.kind)},
      {"config", config_json(rep, rep.runs.size() == 1 ? &rep.runs[0] : nullptr)},
      {"machine", machine_json(rep.machine)},
  };
  json runs = json::array();
  for (const RunResult& r : rep.runs) runs.push_back(run_json(rep, r));
  if (rep.kind == ReportKind::single && rep.runs.size() == 1) {
    // A single run's fields also sit at the top level, so `.throughput_rps` works directly.
    for (auto& [key, value] : runs[0].items()) {
      if (key != "config" && key != "machine") doc[key] = value;
    }
  }
  doc["runs"] = std::move(runs);
  if (rep.contention) {
    const auto& c = *rep.contention;
    doc["contention"] =
        json{{"busy_processes", c.processes},
             {"rounds", c.rounds},
             {"quiet_rps_median", r3(c.quiet_rps)},
             {"contended_rps_median", r3(c.contended_rps)},
             {"contended_over_quiet",
              c.quiet_rps > 0 ? json(r3(c.contended_rps / c.quiet_rps)) : json(nullptr)}};
  }
  if (rep.kind == ReportKind::compare) {
    json rs = json::array();
    for (const Ratio& x : ratios(rep)) {
      rs.push_back(json{{"mode", to_string(x.mode)},
                        {"label", x.label},
                        {"baseline", to_string(rep.runs.front().mode)},
                        {"throughput", opt(x.throughput)},
                        {"p50", opt(x.p50)},
                        {"p99", opt(x.p99)}});
    }
    doc["ratios"] = std::move(rs);
  }
  return doc;
}

std::string to_csv(const BenchReport& rep) {
  std::string out =
      "label,mode,concurrency,request_rate,arrivals,requests,completed,failed,duration_s,"
      "throughput_rps,rows_per_s,latency_p50_us,latency_p90_us,latency_p95_us,latency_p99_us,"
      "latency_p999_us,latency_max_us,queue_p50_us,queue_p99_us,compute_p50_us,compute_p99_us,"
      "batch_size_mean,cpu_util,first_inference_us,failures\n";
  for (const RunResult& r : rep.runs) {
    std::vector<std::string> cells = {
        csv_quote(r.label),
        std::string(to_string(r.mode)),
        r.mode == Mode::rate ? "" : std::to_string(r.concurrency),
        csv_cell(r.request_rate),
        r.arrivals ? std::string(to_string(*r.arrivals)) : "",
        std::to_string(r.requests),
        std::to_string(r.completed),
        std::to_string(r.failed),
        csv_cell(r.duration_s),
        csv_cell(r.throughput_rps),
        csv_cell(r.rows_per_s),
        csv_cell(r.latency.p50),
        csv_cell(r.latency.p90),
        csv_cell(r.latency.p95),
        csv_cell(r.latency.p99),
        csv_cell(r.latency.p999),
        csv_cell(r.latency.max),
        csv_cell(r.queue_us.p50),
        csv_cell(r.queue_us.p99),
        csv_cell(r.compute_us.p50),
        csv_cell(r.compute_us.p99),
        csv_cell(r.batch_size_mean),
        csv_cell(r.cpu_util),
        csv_cell(r.first_inference_us),
        csv_quote(failures_text(r, ";")),
    };
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out += cells[i];
      out += i + 1 < cells.size() ? ',' : '\n';
    }
  }
  return out;
}

void print_table(std::FILE* f, const BenchReport& rep) {
  const BenchOptions& o = *rep.options;
  std::fprintf(f, "asyncinfer bench: %s on %s (%s)\n", o.model.c_str(), o.device.c_str(),
               rep.device_description.c_str());
  std::fprintf(f, "  model    %s\n", rep.model_signature.c_str());
  std::fprintf(f, "  inputs   %s\n", rep.inputs.c_str());
  // The max batch size in effect (the engine's rule when --max-batch-size is not given).
  std::string max_batch = o.max_batch_size ? std::to_string(*o.max_batch_size) : "model's";
  if (!o.max_batch_size && !rep.runs.empty() && rep.runs[0].max_batch_size) {
    max_batch = std::to_string(*rep.runs[0].max_batch_size) + " (default)";
  }
  std::fprintf(
      f,
      "  engine   %d worker(s) of %d intra-op thread(s), %d in flight per worker, max batch size "
      "%s, queue delay %lld us, %d completion thread(s), spin wait %d us\n",
      o.workers, std::max(1, o.intra_op_threads), o.inflight_per_worker, max_batch.c_str(),
      static_cast<long long>(o.max_queue_delay_us), o.completion_threads, o.spin_wait_us);
  std::fprintf(f, "  machine  %u cores, %s, malloc %s\n", rep.machine.cores,
               rep.machine.cpu_model.c_str(), rep.machine.allocator.c_str());

  if (rep.runs.size() == 1) {
    const RunResult& r = rep.runs[0];
    std::fprintf(f, "\n  run              %s\n", r.label.c_str());
    std::fprintf(
        f, "  requests         %llu measured (%llu ok, %llu failed) in %.3f s; %llu warm-up\n",
        static_cast<unsigned long long>(r.requests), static_cast<unsigned long long>(r.completed),
        static_cast<unsigned long long>(r.failed), r.duration_s,
        static_cast<unsigned long long>(r.warmup_requests));
    std::fprintf(f, "  throughput       %.1f req/s, %.1f rows/s\n", r.throughput_rps, r.rows_per_s);
    if (r.latency.count == 0) {
      std::fprintf(f, "  latency          no samples\n");
    } else {
      std::fprintf(f, "  latency          p50 %s | p90 %s | p95 %s | p99 %s | p99.9 %s | max %s\n",
                   format_us(r.latency.p50).c_str(), format_us(r.latency.p90).c_str(),
                   format_us(r.latency.p95).c_str(), format_us(r.latency.p99).c_str(),
                   format_us(r.latency.p999).c_str(), format_us(r.latency.max).c_str());
    }
    if (r.send_lag_us && r.send_lag_us->count > 0) {
      std::fprintf(f, "  send lag         p50 %s | p99 %s | max %s (driver vs schedule)\n",
                   format_us(r.send_lag_us->p50).c_str(), format_us(r.send_lag_us->p99).c_str(),
                   format_us(r.send_lag_us->max).c_str());
    }
    std::fprintf(f, "  queue time       p50 %s | p99 %s (engine histogram)\n",
                 format_us(r.queue_us.p50).c_str(), format_us(r.queue_us.p99).c_str());
    std::fprintf(f, "  compute time     p50 %s | p99 %s (engine histogram)\n",
                 format_us(r.compute_us.p50).c_str(), format_us(r.compute_us.p99).c_str());
    if (r.batch_size_mean) {
      std::fprintf(f, "  batch size       mean %.2f over %llu batches\n", *r.batch_size_mean,
                   static_cast<unsigned long long>(r.batches));
    } else {
      std::fprintf(f, "  batch size       no batches\n");
    }
    std::fprintf(f, "  failures         %s\n",
                 r.failures.empty() ? "none" : failures_text(r, ", ").c_str());
    if (r.cpu_util) {
      std::fprintf(f, "  cpu              %.2f cores busy (user %.2f s, sys %.2f s) of %u\n",
                   *r.cpu_util, r.cpu_user_s, r.cpu_sys_s, rep.machine.cores);
    }
    if (r.first_inference_us) {
      std::fprintf(f, "  first inference  %s (excluded)\n",
                   format_us(r.first_inference_us).c_str());
    }
    if (r.bound_rps && *r.bound_rps > 0) {
      std::fprintf(f, "  bound            %.1f items/s (1 / slowest stage): %.1f %% reached\n",
                   *r.bound_rps, 100.0 * r.throughput_rps / *r.bound_rps);
    }
    if (!r.stage_utilisation.empty()) {
      std::fprintf(f, "  stages           %s\n", r.stage_utilisation.c_str());
    }
    for (const std::string& n : rep.notes) std::fprintf(f, "  %s\n", n.c_str());
    return;
  }

  std::fprintf(f, "\n  %-22s %11s %11s %9s %9s %9s %9s %9s %9s %19s %19s %6s %7s %5s\n", "run",
               "req/s", "rows/s", "p50", "p90", "p95", "p99", "p99.9", "max", "queue p50/p99",
               "compute p50/p99", "batch", "failed", "cpu");
  for (const RunResult& r : rep.runs) {
    const auto lat = [&](std::optional<double> v) {
      return r.latency.count == 0 ? std::string("n/a") : format_us(v);
    };
    const std::string queue = format_us(r.queue_us.p50) + "/" + format_us(r.queue_us.p99);
    const std::string compute = format_us(r.compute_us.p50) + "/" + format_us(r.compute_us.p99);
    std::fprintf(f, "  %-22s %11.1f %11.1f %9s %9s %9s %9s %9s %9s %19s %19s %6s %7llu %5s\n",
                 r.label.c_str(), r.throughput_rps, r.rows_per_s, lat(r.latency.p50).c_str(),
                 lat(r.latency.p90).c_str(), lat(r.latency.p95).c_str(), lat(r.latency.p99).c_str(),
                 lat(r.latency.p999).c_str(), lat(r.latency.max).c_str(), queue.c_str(),
                 compute.c_str(), r.batch_size_mean ? fmt("%.2f", *r.batch_size_mean).c_str() : "-",
                 static_cast<unsigned long long>(r.failed),
                 r.cpu_util ? fmt("%.2f", *r.cpu_util).c_str() : "-");
  }
  for (const RunResult& r : rep.runs) {
    if (r.latency.count == 0) std::fprintf(f, "  %s: no samples\n", r.label.c_str());
    if (!r.failures.empty()) {
      std::fprintf(f, "  %s failures: %s\n", r.label.c_str(), failures_text(r, ", ").c_str());
    }
  }
  if (rep.kind == ReportKind::compare) {
    std::fprintf(f, "\n  ratios against %s:\n", rep.runs.front().label.c_str());
    for (const Ratio& x : ratios(rep)) {
      const auto show = [](std::optional<double> v) {
        return v ? fmt("%.2fx", *v) : std::string("n/a");
      };
      std::fprintf(f, "  %-22s throughput %8s   p50 latency %8s   p99 latency %8s\n",
                   x.label.c_str(), show(x.throughput).c_str(), show(x.p50).c_str(),
                   show(x.p99).c_str());
    }
  }
  std::fprintf(f, "  (cpu: process CPU seconds per wall second; 1.00 = one core busy)\n");
  if (!rep.notes.empty()) std::fprintf(f, "\n");
  for (const std::string& n : rep.notes) std::fprintf(f, "  %s\n", n.c_str());
}

}  // namespace asyncinfer::cli
