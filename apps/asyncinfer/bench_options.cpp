// bench_options.cpp — checks and parsers for `asyncinfer bench` options (bench_options.hpp).
#include "bench_options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace asyncinfer::cli {
namespace {

Status bad(std::string_view option, const std::string& what) {
  return invalid_argument_error(std::string(option) + ": " + what);
}

/// 'text' (built by appending: GCC 12 warns falsely on "literal" + std::string&&). Not named
/// quoted: with a std::string argument, GCC 13's <iomanip> std::quoted wins by argument-dependent
/// lookup.
std::string single_quoted(std::string_view text) {
  std::string q;
  q.reserve(text.size() + 2);
  q += '\'';
  q.append(text);
  q += '\'';
  return q;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status check_min(std::string_view option, double value, double min) {
  if (!(value >= min)) return bad(option, num(value) + " is below the minimum " + num(min));
  return Status();
}

}  // namespace

std::string InputShapeArg::to_string() const {
  std::string text = name.empty() ? "" : name + ":";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    text += (i == 0 ? "" : "x") + std::to_string(dims[i]);
  }
  return text;
}

std::string_view to_string(Arrivals a) noexcept {
  return a == Arrivals::constant ? "constant" : "poisson";
}

std::string PriorityArg::to_string() const {
  if (mixed) return "mixed";
  return level > 0 ? std::to_string(level) : std::string();
}

std::string DataArg::to_string() const {
  switch (kind) {
    case Kind::zeros:
      return "zeros";
    case Kind::file:
      return "file:" + path;
    case Kind::random:
      break;
  }
  return "random";
}

Result<std::vector<std::int64_t>> parse_dims(std::string_view text, std::string_view option) {
  const std::string expect = "expected dims >= 1 separated by 'x', e.g. 1x32x32";
  if (text.empty()) return bad(option, "empty shape; " + expect);
  std::vector<std::int64_t> dims;
  std::size_t pos = 0;
  while (true) {
    const std::size_t x = text.find('x', pos);
    const std::string_view item =
        text.substr(pos, x == std::string_view::npos ? std::string_view::npos : x - pos);
    std::int64_t v = 0;
    const char* first = item.data();
    const char* last = item.data() + item.size();
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (item.empty() || ec != std::errc() || ptr != last || v < 1 || v > (std::int64_t{1} << 40)) {
      return bad(option, "bad shape '" + std::string(text) + "' (item '" + std::string(item) +
                             "'); " + expect);
    }
    dims.push_back(v);
    if (x == std::string_view::npos) break;
    pos = x + 1;
  }
  return dims;
}

Result<InputShapeArg> parse_input_shape(std::string_view text) {
  InputShapeArg arg;
  const std::size_t colon = text.rfind(':');
  std::string_view dims = text;
  if (colon != std::string_view::npos) {
    arg.name = std::string(text.substr(0, colon));
    dims = text.substr(colon + 1);
    if (arg.name.empty()) {
      return bad("--input-shape", "empty input name in '" + std::string(text) +
                                      "'; expected DIMS or NAME:DIMS, e.g. 1x32x32 or x:1x32x32");
    }
  }
  ASYNCINFER_ASSIGN_OR_RETURN(arg.dims, parse_dims(dims, "--input-shape"));
  return arg;
}

Result<PriorityArg> parse_priority(std::string_view text) {
  PriorityArg p;
  if (text.empty()) return p;
  if (text == "mixed") {
    p.mixed = true;
    return p;
  }
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), p.level);
  if (ec != std::errc() || ptr != text.data() + text.size() || p.level < 1) {
    return bad("--priority", single_quoted(text) +
                                 " is not a level 1..N (1 = highest; N = --priority-levels) or "
                                 "'mixed'");
  }
  return p;
}

Result<Arrivals> parse_arrivals(std::string_view text) {
  if (text == "poisson") return Arrivals::poisson;
  if (text == "constant") return Arrivals::constant;
  return bad("--arrivals", single_quoted(text) + " is not one of poisson, constant");
}

Result<DataArg> parse_data(std::string_view text) {
  DataArg d;
  if (text == "random") return d;
  if (text == "zeros") {
    d.kind = DataArg::Kind::zeros;
    return d;
  }
  if (text.starts_with("file:") && text.size() > 5) {
    d.kind = DataArg::Kind::file;
    d.path = std::string(text.substr(5));
    return d;
  }
  return bad("--data", single_quoted(text) + " is not one of random, zeros, file:<path.raw>");
}

Status validate(BenchOptions& o) {
  if (o.model.empty() && o.stages.empty()) {
    return bad("--model", "required (e.g. builtin:identity, path/to/model.pt), or --stages");
  }
  if (!o.compare.empty() && o.mode == Mode::sweep) {
    return bad("--compare", "cannot be combined with --mode sweep");
  }
  // The modes that will run: a single one, a comparison of several, or a sweep.
  const std::vector<Mode> modes = o.compare.empty() ? std::vector<Mode>{o.mode} : o.compare;
  for (Mode m : modes) {
    if (m == Mode::pipeline && o.stages.empty()) {
      return bad("--stages", "required by mode pipeline (e.g. host:2ms,sim:5ms,host:2ms)");
    }
    if (!o.stages.empty() && m != Mode::sync && m != Mode::pipeline && m != Mode::sweep) {
      return bad("--mode",
                 "with --stages the modes are sync (the stages one after another) "
                 "and pipeline; got '" +
                     std::string(to_string(m)) + "'");
    }
    if (m == Mode::rate && o.request_rate.empty()) {
      return bad("--request-rate", "required by mode rate (requests per second, e.g. 500)");
    }
    if (m != Mode::sweep) {
      if (o.request_rate.size() > 1) {
        return bad("--request-rate", "a list of rates needs --mode sweep");
      }
      if (o.concurrency.size() > 1) {
        return bad("--concurrency", "a list of values needs --mode sweep");
      }
    }
  }
  if (o.device.empty())
    return bad("--device", "empty; expected cpu, sim, sim:<key>=<value>,..., cuda:0");
  for (int c : o.concurrency) {
    if (c < 1)
      return bad("--concurrency", std::to_string(c) + " is below 1; expected integers >= 1");
  }
  if (o.concurrency.empty()) return bad("--concurrency", "empty list; expected integers >= 1");
  for (double r : o.request_rate) {
    if (!(r > 0) || !std::isfinite(r)) {
      return bad("--request-rate", num(r) + " is not > 0; expected requests per second > 0");
    }
  }
  if (o.mode == Mode::sweep && o.compare.empty()) {
    const bool by_rate = !o.request_rate.empty();
    if (by_rate && o.concurrency_given) {
      return bad("--mode sweep", "give either --concurrency LIST or --request-rate LIST, not both");
    }
    if (!by_rate && !o.concurrency_given) {
      return bad(
          "--mode sweep",
          "needs --concurrency LIST (e.g. 1,4,16) or --request-rate LIST (e.g. 100,200,400)");
    }
  }
  // Engine.
  ASYNCINFER_RETURN_IF_ERROR(check_min("--workers", o.workers, 0));
  ASYNCINFER_RETURN_IF_ERROR(
      check_min("--max-queue-delay-us", static_cast<double>(o.max_queue_delay_us), 0));
  for (std::int64_t p : o.preferred_batch) {
    ASYNCINFER_RETURN_IF_ERROR(check_min("--preferred-batch", static_cast<double>(p), 1));
  }
  ASYNCINFER_RETURN_IF_ERROR(check_min("--inflight-per-worker", o.inflight_per_worker, 1));
  if (o.priority_levels < 1 || o.priority_levels > 64) {
    return bad("--priority-levels", std::to_string(o.priority_levels) + " is outside 1..64");
  }
  if (o.priority.level > o.priority_levels) {
    return bad("--priority", single_quoted(o.priority.to_string()) + " is not one of 1.." +
                                 std::to_string(o.priority_levels) +
                                 " (1 = highest; see --priority-levels) or 'mixed'");
  }
  if (!(o.timeout_ms >= 0) || !std::isfinite(o.timeout_ms)) {
    return bad("--timeout-ms", num(o.timeout_ms) + " is not >= 0 (0 = no timeout)");
  }
  ASYNCINFER_RETURN_IF_ERROR(check_min("--completion-threads", o.completion_threads, 1));
  ASYNCINFER_RETURN_IF_ERROR(
      check_min("--queue-capacity", static_cast<double>(o.queue_capacity), 0));
  ASYNCINFER_RETURN_IF_ERROR(check_min("--max-attempts", o.max_attempts, 1));
  ASYNCINFER_RETURN_IF_ERROR(check_min("--intra-op-threads", o.intra_op_threads, 0));
  ASYNCINFER_RETURN_IF_ERROR(check_min("--contention", o.contention, 0));
  ASYNCINFER_RETURN_IF_ERROR(check_min("--contention-rounds", o.contention_rounds, 1));
  if (o.contention > 0 && (!o.compare.empty() || o.mode == Mode::sweep)) {
    return bad("--contention", "runs one point quiet and contended; not with --compare or sweep");
  }
  if (o.contention > 0 && !o.stages.empty()) {
    return bad("--contention", "measures a model; not with --stages");
  }
  // Length.
  ASYNCINFER_RETURN_IF_ERROR(check_min("--warmup", static_cast<double>(o.warmup), 0));
  ASYNCINFER_RETURN_IF_ERROR(check_min("--warmup-s", o.warmup_s, 0));
  if (o.warmup > 0 && o.warmup_s > 0) {
    return bad("--warmup", "give either --warmup N (requests) or --warmup-s S (seconds), not both");
  }
  ASYNCINFER_RETURN_IF_ERROR(check_min("--duration-s", o.duration_s, 0));
  ASYNCINFER_RETURN_IF_ERROR(check_min("--requests", static_cast<double>(o.requests), 0));
  if (o.duration_s > 0 && o.requests > 0) {
    return bad("--duration-s", "give either --duration-s S or --requests N, not both");
  }
  if (!std::isfinite(o.duration_s) || !std::isfinite(o.warmup_s)) {
    return bad("--duration-s", "must be finite");
  }
  if (o.duration_s == 0 && o.requests == 0) o.duration_s = BenchOptions::kDefaultDurationS;
  // Inputs.
  int unnamed = 0;
  for (const InputShapeArg& s : o.input_shapes) unnamed += s.name.empty() ? 1 : 0;
  if (unnamed > 1) return bad("--input-shape", "given twice without an input name; use NAME:DIMS");
  ASYNCINFER_RETURN_IF_ERROR(check_min("--batch-rows", static_cast<double>(o.batch_rows), 1));
  return Status();
}

}  // namespace asyncinfer::cli
