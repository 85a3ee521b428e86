// report.cpp — the HTML report (report.hpp). Plain string building: a tiny SVG plotter with
// linear and log axes.
#include "report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "stats.hpp"

namespace asyncinfer::cli {
namespace {

constexpr std::array<const char*, 10> kColors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                 "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                 "#bcbd22", "#17becf"};

const char* color(std::size_t i) { return kColors[i % kColors.size()]; }

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string num(double v, const char* f = "%.2f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// Short axis label: 1, 2, 5, 10, 20, ..., 1k, 2k, ... 1M.
std::string tick_text(double v) {
  const double a = std::fabs(v);
  if (a >= 1e6) return num(v / 1e6, "%gM");
  if (a >= 1e3) return num(v / 1e3, "%gk");
  return num(v, "%g");
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double pos(double v, double from, double to) const {  // pixel of value v
    double t;
    if (log) {
      const double l = std::log10(std::max(v, lo));
      t = (l - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    } else {
      t = (v - lo) / (hi - lo);
    }
    return from + (to - from) * std::clamp(t, 0.0, 1.0);
  }
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      for (double d = std::pow(10.0, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10) {
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = d * m;
          if (v >= lo * 0.9999 && v <= hi * 1.0001) out.push_back(v);
        }
      }
      return out;
    }
    const double span = hi - lo;
    const double raw = span / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
      if (raw <= m * mag) {
        step = m * mag;
        break;
      }
    }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
    return out;
  }
};

/// Makes a range that fits [lo, hi] with a little room; log axes get decade-friendly bounds.
Axis make_axis(double lo, double hi, bool log) {
  Axis a;
  a.log = log && lo > 0;
  if (!(hi > lo)) {
    hi = lo == 0 ? 1 : lo * 1.5;
    lo = lo == 0 ? 0 : lo * 0.5;
  }
  if (a.log) {
    a.lo = std::pow(10.0, std::floor(std::log10(lo)));
    a.hi = std::pow(10.0, std::ceil(std::log10(hi)));
    if (a.hi / a.lo > 1e6) a.lo = a.hi / 1e6;
  } else {
    a.lo = std::min(0.0, lo);
    a.hi = hi * 1.05;
  }
  return a;
}

struct Series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;
  bool markers = false;
  bool dashed = false;
};

constexpr double kW = 720, kH = 360, kL = 70, kR = 20, kT = 20, kB = 50;

std::string chart(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                  const Axis& x, const Axis& y, const std::vector<Series>& series) {
  std::string s;
  s += "<figure><figcaption>" + esc(title) + "</figcaption>\n";
  s += "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " + num(kW, "%g") + " " +
       num(kH, "%g") + "' width='" + num(kW, "%g") + "' height='" + num(kH, "%g") + "'>\n";
  const double x0 = kL, x1 = kW - kR, y0 = kH - kB, y1 = kT;
  s += "<rect x='" + num(x0) + "' y='" + num(y1) + "' width='" + num(x1 - x0) + "' height='" +
       num(y0 - y1) + "' fill='#fff' stroke='#999'/>\n";
  for (double t : x.ticks()) {
    const double px = x.pos(t, x0, x1);
    s += "<line x1='" + num(px) + "' y1='" + num(y1) + "' x2='" + num(px) + "' y2='" + num(y0) +
         "' stroke='#eee'/><text x='" + num(px) + "' y='" + num(y0 + 16) +
         "' text-anchor='middle'>" + tick_text(t) + "</text>\n";
  }
  for (double t : y.ticks()) {
    const double py = y.pos(t, y0, y1);
    s += "<line x1='" + num(x0) + "' y1='" + num(py) + "' x2='" + num(x1) + "' y2='" + num(py) +
         "' stroke='#eee'/><text x='" + num(x0 - 6) + "' y='" + num(py + 4) +
         "' text-anchor='end'>" + tick_text(t) + "</text>\n";
  }
  s += "<text x='" + num((x0 + x1) / 2) + "' y='" + num(kH - 10) + "' text-anchor='middle'>" +
       esc(xlabel) + "</text>\n";
  s += "<text transform='translate(16," + num((y0 + y1) / 2) +
       ") rotate(-90)' text-anchor='middle'>" + esc(ylabel) + "</text>\n";
  double ly = y1 + 14;
  for (const Series& se : series) {
    if (se.points.empty()) continue;
    std::string pts;
    for (const auto& [vx, vy] : se.points) {
      pts += num(x.pos(vx, x0, x1)) + "," + num(y.pos(vy, y0, y1)) + " ";
    }
    s += "<polyline fill='none' stroke='" + se.color + "' stroke-width='2'" +
         (se.dashed ? " stroke-dasharray='6 4'" : "") + " points='" + pts + "'/>\n";
    if (se.markers) {
      for (const auto& [vx, vy] : se.points) {
        s += "<circle cx='" + num(x.pos(vx, x0, x1)) + "' cy='" + num(y.pos(vy, y0, y1)) +
             "' r='3.5' fill='" + se.color + "'/>\n";
      }
    }
    s += "<line x1='" + num(x0 + 12) + "' y1='" + num(ly - 4) + "' x2='" + num(x0 + 36) + "' y2='" +
         num(ly - 4) + "' stroke='" + se.color + "' stroke-width='2'" +
         (se.dashed ? " stroke-dasharray='6 4'" : "") + "/><text x='" + num(x0 + 42) + "' y='" +
         num(ly) + "'>" + esc(se.name) + "</text>\n";
    ly += 16;
  }
  s += "</svg></figure>\n";
  return s;
}

std::string histogram_chart(const RunResult& r, const char* col) {
  const HistogramBins h = histogram_bins(r.latency_us, 40);
  if (h.counts.empty()) return "<p>" + esc(r.label) + ": no samples</p>\n";
  const std::uint64_t top = *std::max_element(h.counts.begin(), h.counts.end());
  const bool log = h.edges.front() > 0 && h.edges.back() > h.edges.front();
  Axis x = make_axis(h.edges.front(), h.edges.back(), log);
  Axis y = make_axis(0, static_cast<double>(top), false);
  std::string s = "<figure><figcaption>Latency histogram: " + esc(r.label) + " (" +
                  std::to_string(r.latency.count) + " samples)</figcaption>\n";
  s += "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " + num(kW, "%g") + " " +
       num(kH, "%g") + "' width='" + num(kW, "%g") + "' height='" + num(kH, "%g") + "'>\n";
  const double x0 = kL, x1 = kW - kR, y0 = kH - kB, y1 = kT;
  s += "<rect x='" + num(x0) + "' y='" + num(y1) + "' width='" + num(x1 - x0) + "' height='" +
       num(y0 - y1) + "' fill='#fff' stroke='#999'/>\n";
  for (double t : x.ticks()) {
    const double px = x.pos(t, x0, x1);
    s += "<text x='" + num(px) + "' y='" + num(y0 + 16) + "' text-anchor='middle'>" + tick_text(t) +
         "</text>\n";
  }
  for (double t : y.ticks()) {
    const double py = y.pos(t, y0, y1);
    s += "<line x1='" + num(x0) + "' y1='" + num(py) + "' x2='" + num(x1) + "' y2='" + num(py) +
         "' stroke='#eee'/><text x='" + num(x0 - 6) + "' y='" + num(py + 4) +
         "' text-anchor='end'>" + tick_text(t) + "</text>\n";
  }
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    const double a = x.pos(h.edges[i], x0, x1);
    const double b = x.pos(h.edges[i + 1], x0, x1);
    const double top_px = y.pos(static_cast<double>(h.counts[i]), y0, y1);
    s += "<rect x='" + num(a) + "' y='" + num(top_px) + "' width='" +
         num(std::max(0.5, b - a - 0.5)) + "' height='" + num(y0 - top_px) + "' fill='" + col +
         "'/>\n";
  }
  s += "<text x='" + num((x0 + x1) / 2) + "' y='" + num(kH - 10) +
       "' text-anchor='middle'>latency (us)</text>\n";
  s += "<text transform='translate(16," + num((y0 + y1) / 2) +
       ") rotate(-90)' text-anchor='middle'>requests</text>\n";
  s += "</svg></figure>\n";
  return s;
}

}  // namespace

std::string render_html_report(const BenchReport& rep) {
  const BenchOptions& o = *rep.options;
  std::string h;
  h += "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n";
  h += "<title>asyncinfer bench: " + esc(o.model) + "</title>\n";
  h += "<style>body{font:14px sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
       "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}"
       "td:first-child{text-align:left}figure{margin:1.5em 0}figcaption{font-weight:bold;"
       "margin-bottom:.4em}svg text{font:11px sans-serif;fill:#333}code{background:#f4f4f4}"
       "</style></head><body>\n";
  h += "<h1>asyncinfer bench</h1>\n<p>Model <code>" + esc(o.model) + "</code> on device <code>" +
       esc(o.device) + "</code> (" + esc(rep.device_description) +
       ")<br>Signature: " + esc(rep.model_signature) + "<br>Inputs: " + esc(rep.inputs) +
       "<br>Machine: " + std::to_string(rep.machine.cores) + " cores, " +
       esc(rep.machine.cpu_model) + "</p>\n";

  h += "<h2>Summary</h2>\n<table><tr><th>run</th><th>requests</th><th>failed</th>"
       "<th>req/s</th><th>rows/s</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th>"
       "<th>p99.9</th><th>max</th><th>queue p50/p99</th><th>compute p50/p99</th>"
       "<th>mean batch</th><th>cpu</th></tr>\n";
  for (const RunResult& r : rep.runs) {
    h += "<tr><td>" + esc(r.label) + "</td><td>" + std::to_string(r.requests) + "</td><td>" +
         std::to_string(r.failed) + "</td><td>" + num(r.throughput_rps, "%.1f") + "</td><td>" +
         num(r.rows_per_s, "%.1f") + "</td><td>" + format_us(r.latency.p50) + "</td><td>" +
         format_us(r.latency.p90) + "</td><td>" + format_us(r.latency.p95) + "</td><td>" +
         format_us(r.latency.p99) + "</td><td>" + format_us(r.latency.p999) + "</td><td>" +
         format_us(r.latency.max) + "</td><td>" + format_us(r.queue_us.p50) + " / " +
         format_us(r.queue_us.p99) + "</td><td>" + format_us(r.compute_us.p50) + " / " +
         format_us(r.compute_us.p99) + "</td><td>" +
         (r.batch_size_mean ? num(*r.batch_size_mean) : std::string("-")) + "</td><td>" +
         (r.cpu_util ? num(*r.cpu_util) : std::string("-")) + "</td></tr>\n";
  }
  h += "</table>\n<p>Latency: completion callback time minus send time (rate mode: minus the "
       "intended send time), every sample kept; percentiles by nearest rank. Queue and compute "
       "times are the engine's histogram estimates.</p>\n";

  // Latency CDFs, all runs on one chart.
  double lo = 0, hi = 0;
  bool any = false;
  for (const RunResult& r : rep.runs) {
    if (r.latency_us.empty()) continue;
    lo = any ? std::min(lo, r.latency_us.front()) : r.latency_us.front();
    hi = any ? std::max(hi, r.latency_us.back()) : r.latency_us.back();
    any = true;
  }
  h += "<h2>Latency distribution</h2>\n";
  if (any) {
    std::vector<Series> cdfs;
    for (std::size_t i = 0; i < rep.runs.size(); ++i) {
      const RunResult& r = rep.runs[i];
      Series se{r.label, color(i), {}, false, false};
      for (const CdfPoint& p : cdf_points(r.latency_us, 300)) {
        se.points.emplace_back(p.value, p.fraction);
      }
      cdfs.push_back(std::move(se));
    }
    Axis x = make_axis(std::max(lo, 1e-3), hi, true);
    Axis y{0, 1, false};
    h += chart("Latency CDF (fraction of requests at or below)", "latency (us, log scale)",
               "fraction", x, y, cdfs);
    for (std::size_t i = 0; i < rep.runs.size(); ++i) {
      h += histogram_chart(rep.runs[i], color(i));
    }
  } else {
    h += "<p>No samples.</p>\n";
  }

  if (rep.kind == ReportKind::sweep && !rep.runs.empty()) {
    Series p50{"p50", color(0), {}, true, false};
    Series p99{"p99", color(1), {}, true, true};
    double xmax = 0, ymin = 0, ymax = 0;
    bool first = true;
    for (const RunResult& r : rep.runs) {
      if (!r.latency.p50 || !r.latency.p99) continue;
      p50.points.emplace_back(r.throughput_rps, *r.latency.p50);
      p99.points.emplace_back(r.throughput_rps, *r.latency.p99);
      xmax = std::max(xmax, r.throughput_rps);
      ymin = first ? *r.latency.p50 : std::min(ymin, *r.latency.p50);
      ymax = std::max(ymax, *r.latency.p99);
      first = false;
    }
    h += "<h2>Throughput vs latency</h2>\n";
    if (!first) {
      Axis x = make_axis(0, xmax, false);
      Axis y = make_axis(std::max(ymin, 1e-3), ymax, true);
      h += chart("Latency against throughput, one point per sweep step", "throughput (req/s)",
                 "latency (us, log scale)", x, y, {p50, p99});
      h += "<p>Points, in sweep order: ";
      for (std::size_t i = 0; i < rep.runs.size(); ++i) {
        h += (i ? ", " : "") + esc(rep.runs[i].label);
      }
      h += "</p>\n";
    } else {
      h += "<p>No samples.</p>\n";
    }
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace asyncinfer::cli
