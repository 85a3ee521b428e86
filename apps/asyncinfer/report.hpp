// report.hpp — `--report out.html`: one self-contained page (inline SVG and CSS, nothing fetched)
// with the latency CDF of every run, a latency histogram per run, a summary table, and for a
// sweep the throughput-vs-latency curve (p50 and p99).
#pragma once

#include <string>

#include "output.hpp"

namespace asyncinfer::cli {

std::string render_html_report(const BenchReport& report);

}  // namespace asyncinfer::cli
