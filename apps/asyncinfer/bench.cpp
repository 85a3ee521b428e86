// bench.cpp — `asyncinfer bench`: options, the runs to make (single, --compare, sweep), and the
// outputs (table, --json, --csv, --report). The load generators are in drivers.cpp.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "bench_options.hpp"
#include "cli_options.hpp"
#include "commands.hpp"
#include "contention.hpp"
#include "drivers.hpp"
#include "http_bench.hpp"
#include "inputs.hpp"
#include "machine.hpp"
#include "output.hpp"
#include "pipeline_bench.hpp"
#include "report.hpp"

namespace asyncinfer::cli {
namespace {

constexpr const char* kPrefix = "asyncinfer bench: error: ";

int usage(const std::string& message) {
  std::fprintf(stderr, "%s%s\nRun with --help for more information.\n", kPrefix, message.c_str());
  return kExitUsage;
}

/// An error from the library, printed with the option it concerns. Before any run starts (device,
/// model, inputs) every error is a usage error: the configuration asked for cannot be had
/// (unknown name, missing file, backend not built, no hardware). Once runs start, bad-argument
/// errors (e.g. EngineOptions) are still usage errors; the rest are run failures.
int library_error(const std::string& option, const Status& s, bool setup) {
  const bool user =
      setup || s.code() == StatusCode::invalid_argument || s.code() == StatusCode::not_found;
  std::fprintf(stderr, "%s%s%s\n", kPrefix, option.empty() ? "" : (option + ": ").c_str(),
               s.to_string().c_str());
  return user ? kExitUsage : kExitRunFailed;
}

/// Writes `text` to `path` ("-" = stdout). False (with a message) when it cannot.
bool write_output(const std::string& option, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "%s%s: cannot write '%s'\n", kPrefix, option.c_str(), path.c_str());
    return false;
  }
  return true;
}

std::vector<RunPoint> points_of(const BenchOptions& o, ReportKind& kind) {
  std::vector<RunPoint> points;
  auto point = [&](Mode mode, int c, double r) {
    RunPoint p;
    p.mode = mode;
    p.concurrency = c;
    p.request_rate = r;
    return p;
  };
  const int c0 = o.concurrency.front();
  const double r0 = o.request_rate.empty() ? 0 : o.request_rate.front();
  if (!o.compare.empty()) {
    kind = ReportKind::compare;
    for (Mode m : o.compare) points.push_back(point(m, c0, r0));
  } else if (o.mode == Mode::sweep) {
    kind = ReportKind::sweep;
    if (!o.request_rate.empty()) {
      for (double r : o.request_rate) points.push_back(point(Mode::rate, 0, r));
    } else {
      const Mode mode = o.stages.empty() ? Mode::async : Mode::pipeline;
      for (int c : o.concurrency) points.push_back(point(mode, c, 0));
    }
  } else {
    kind = ReportKind::single;
    points.push_back(point(o.mode, c0, r0));
  }
  return points;
}

int report_outputs(const BenchOptions& o, BenchReport& rep);

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// `--contention N`: the point `rounds` times quiet and as often beside N busy-looping processes,
/// alternating (quiet first), so that drift of the machine hits both alike; medians compared.
int run_contention(const BenchContext& ctx, const RunPoint& point, BenchReport& rep) {
  const BenchOptions& o = ctx.options;
  // Each busy process stops by itself after this, even if the bench is stuck.
  const auto limit =
      detail::saturating_sum(detail::saturating_cast<std::chrono::milliseconds>(
                                 std::chrono::duration<double>(o.duration_s + o.warmup_s)),
                             std::chrono::milliseconds(60'000));
  std::vector<double> quiet;
  std::vector<double> busy;
  for (int round = 1; round <= o.contention_rounds; ++round) {
    for (const bool contended : {false, true}) {
      std::optional<BusyLoad> load;
      if (contended) {
        auto started = BusyLoad::start(o.contention, limit);
        if (!started.ok()) return library_error("--contention", started.status(), false);
        load.emplace(std::move(*started));
      }
      Result<RunResult> r = run_point(ctx, point);
      load.reset();
      if (!r.ok()) return library_error("", r.status(), false);
      r->label += contended ? " busy" + std::to_string(o.contention) : " quiet";
      r->label += " #" + std::to_string(round);
      (contended ? busy : quiet).push_back(r->throughput_rps);
      rep.runs.push_back(std::move(*r));
    }
  }
  BenchReport::Contention c;
  c.processes = o.contention;
  c.rounds = o.contention_rounds;
  c.quiet_rps = median(quiet);
  c.contended_rps = median(busy);
  rep.contention = c;
  char line[256];
  std::snprintf(line, sizeof line,
                "contention: quiet median %.1f req/s; beside %d busy process(es) median %.1f "
                "req/s = %.1f %% of quiet (%d rounds each, alternated)",
                c.quiet_rps, c.processes, c.contended_rps,
                c.quiet_rps > 0 ? 100.0 * c.contended_rps / c.quiet_rps : 0.0, c.rounds);
  rep.notes.emplace_back(line);
  rep.kind = ReportKind::contention;
  return kExitOk;
}

/// `--stages`: a pipeline of timed stages instead of a model (pipeline_bench.hpp).
int run_stage_bench(BenchOptions& o) {
  auto stages = parse_stages(o.stages);
  if (!stages.ok()) return usage(std::string(stages.status().message()));
  BenchReport rep;
  rep.options = &o;
  rep.device_description = "stages " + o.stages;
  char bound[64];
  std::snprintf(bound, sizeof bound, "%.1f items/s", stage_bound_per_s(*stages));
  rep.model_signature = std::string("pipeline of ") + std::to_string(stages->size()) +
                        " timed stages; bound " + bound;
  rep.inputs = "none (timed stages)";
  rep.machine = machine_info();
  const std::vector<RunPoint> points = points_of(o, rep.kind);
  const bool progress = !o.quiet && isatty(STDERR_FILENO) != 0;
  for (const RunPoint& p : points) {
    Result<RunResult> r = run_stages(o, *stages, p, progress);
    if (!r.ok()) return library_error("--stages", r.status(), false);
    rep.runs.push_back(std::move(*r));
  }
  return report_outputs(o, rep);
}

int run_bench(BenchOptions& o) {
  Status v = validate(o);
  if (!v.ok()) return usage(std::string(v.message()));
  if (!o.stages.empty()) return run_stage_bench(o);

  auto device = open_device(o.device);
  if (!device.ok()) return library_error("--device", device.status(), true);
  ModelOptions mo;
  mo.backend_parameters = o.backend_parameters;
  auto model = load_model(o.model, mo);
  if (!model.ok()) return library_error("--model", model.status(), true);
  const ModelSignature& sig = (*model)->signature();
  {
    // Report what the engine will choose for what was left to it (--workers 0, the default).
    EngineOptions asked;
    asked.workers = o.workers;
    asked.intra_op_threads = o.intra_op_threads;
    const EngineOptions chosen = Engine::resolve_options(**model, **device, asked);
    o.workers = chosen.workers;
    o.intra_op_threads = chosen.intra_op_threads;
  }

  auto plan = plan_inputs(sig, o);
  if (!plan.ok()) return usage(std::string(plan.status().message()));
  auto pool = InputPool::make(*plan, o.data, o.seed);
  if (!pool.ok()) return usage(std::string(pool.status().message()));  // names --data
  {
    // Refuse inputs the model would refuse, before any engine starts.
    auto sample = pool->next(0);
    if (!sample.ok()) return library_error("", sample.status(), true);
    Status s = validate_inputs(sig, *sample);
    if (!s.ok()) {
      return usage("--input-shape/--batch-rows: the model refuses " + plan->describe() + ": " +
                   std::string(s.message()));
    }
  }

  BenchReport rep;
  rep.options = &o;
  rep.device_description = (*device)->info().description;
  rep.model_signature = sig.to_string();
  rep.inputs = plan->describe() + " (" + std::to_string(plan->rows) + " row(s) per request)";
  rep.machine = machine_info();
  const std::vector<RunPoint> points = points_of(o, rep.kind);

  const bool tty = isatty(STDERR_FILENO) != 0;
  BenchContext ctx{o, *model, *device, *plan, *pool, !o.quiet && tty};
  if (o.contention > 0) {
    const int rc = run_contention(ctx, points.front(), rep);
    if (rc != kExitOk) return rc;
    return report_outputs(o, rep);
  }
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (ctx.progress && points.size() > 1) {
      std::fprintf(stderr, "[%zu/%zu] %s\n", i + 1, points.size(), label_of(points[i], o).c_str());
    }
    Result<RunResult> r = run_point(ctx, points[i]);
    if (!r.ok()) return library_error("", r.status(), false);
    rep.runs.push_back(std::move(*r));
  }
  return report_outputs(o, rep);
}

/// Prints the table and writes --json, --csv and --report; the exit code of the whole bench.
int report_outputs(const BenchOptions& o, BenchReport& rep) {
  // Outputs. A machine-readable stream on stdout moves the table to stderr.
  const bool stdout_taken = o.json == "-" || o.csv == "-";
  if (!stdout_taken) {
    print_table(stdout, rep);
    std::fflush(stdout);
  } else if (!o.quiet) {
    print_table(stderr, rep);
  }
  bool ok = true;
  if (!o.json.empty()) ok = write_output("--json", o.json, to_json(rep).dump(2) + "\n") && ok;
  if (!o.csv.empty()) ok = write_output("--csv", o.csv, to_csv(rep)) && ok;
  if (!o.report.empty()) ok = write_output("--report", o.report, render_html_report(rep)) && ok;
  if (!ok) return kExitRunFailed;

  for (const RunResult& r : rep.runs) {
    if (r.requests > 0 && r.completed == 0) {
      std::fprintf(stderr, "%s%s: no request succeeded\n", kPrefix, r.label.c_str());
      return kExitRunFailed;
    }
    if (o.fail_on_error && r.failed > 0) {
      std::fprintf(stderr, "%s%s: %llu request(s) failed (--fail-on-error)\n", kPrefix,
                   r.label.c_str(), static_cast<unsigned long long>(r.failed));
      return kExitRunFailed;
    }
  }
  return kExitOk;
}

}  // namespace

Command add_bench_command(CLI::App& parent) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* app = parent.add_subcommand(
      "bench", "Measure throughput and latency of a model on a device through the engine");
  app->footer(
      "Modes: sync (one caller, Engine::infer), async (closed loop, --concurrency in flight), "
      "rate (open loop at --request-rate; latency from the intended send time), sweep (a list "
      "of --concurrency or --request-rate values). See docs/bench.md.");

  // What to run on.
  add_backend_parameter_option(*app, o->backend_parameters);
  app->add_option("--model,-m", o->model,
                  "Model URI or path: builtin:identity, builtin:fixed_cost?base_us=&per_item_us=, "
                  "builtin:faulty?..., path/to/model.pt, model.onnx, model.xml (required unless "
                  "--stages)");
  app->add_option("--stages", o->stages,
                  "Measure a pipeline of timed stages instead of a model, e.g. "
                  "host:2ms,sim:5ms,host:2ms (kinds host, sleep, sim, cpu, cuda); modes sync "
                  "and pipeline; --concurrency is the window");
  app->add_option("--device,-d", o->device, "Device: cpu, sim, sim:<key>=<value>,..., cuda:0")
      ->capture_default_str();
  // How to drive it.
  add_parsed_option(
      *app, "--mode", o->mode,
      [](std::string_view t) { return parse_mode(t, "--mode", kAllModes); },
      "sync | async | rate | sweep | pipeline (with --stages)")
      ->default_str("async");
  CLI::Option* conc =
      app->add_option("--concurrency,-c", o->concurrency,
                      "Requests in flight (async); a list such as 1,4,16 for a sweep")
          ->delimiter(',')
          ->capture_default_str();
  app->add_option("--request-rate,-r", o->request_rate,
                  "Requests per second (rate); a list such as 100,200,400 for a sweep")
      ->delimiter(',');
  add_parsed_option(*app, "--arrivals", o->arrivals, parse_arrivals,
                    "Arrival process of rate mode: poisson | constant")
      ->default_str("poisson");
  add_parsed_list_option(
      *app, "--compare", o->compare,
      [](std::string_view t) { return parse_mode(t, "--compare", kRunModes); },
      "Run these modes back to back and print ratios against the first, e.g. sync,async");
  // Engine.
  app->add_option("--workers,-w", o->workers,
                  "Engine workers (streams + model instances); 0 = the engine's rule: the "
                  "model's own count where it has one (OpenVINO's optimal number of infer "
                  "requests), else one per core for a model that computes on host cores "
                  "(libtorch on cpu), else 1")
      ->capture_default_str();
  add_max_batch_size_option(*app, o->max_batch_size, "--max-batch");
  app->add_option("--max-queue-delay-us", o->max_queue_delay_us,
                  "Longest a forming batch waits for more requests (us)")
      ->capture_default_str();
  app->add_option("--preferred-batch", o->preferred_batch,
                  "Preferred batch sizes, e.g. 4,8 (dispatched at once when reachable)")
      ->delimiter(',');
  app->add_option("--inflight-per-worker", o->inflight_per_worker,
                  "Batches queued on a worker's stream ahead of completion")
      ->capture_default_str();
  app->add_option("--priority-levels", o->priority_levels, "Engine priority levels (1..64)")
      ->capture_default_str();
  add_parsed_option(*app, "--priority", o->priority, parse_priority,
                    "Request priority: 1..levels (1 = highest), or 'mixed' to draw uniformly; "
                    "default: the engine's default level");
  app->add_option("--timeout-ms", o->timeout_ms, "Request timeout in ms (0 = none)")
      ->capture_default_str();
  app->add_option("--completion-threads", o->completion_threads,
                  "Engine threads that run completion callbacks")
      ->capture_default_str();
  app->add_option("--spin-wait-us", o->spin_wait_us,
                  "How long an engine thread spins for its next piece of work at low load "
                  "before it sleeps (us; 0 = sleep at once)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app->add_option("--queue-capacity", o->queue_capacity,
                  "Engine queue capacity; 0 = max(4096, 2 x concurrency)")
      ->capture_default_str();
  app->add_option("--max-attempts", o->max_attempts,
                  "Attempts per request, first included (engine retry policy)")
      ->capture_default_str();
  app->add_option("--intra-op-threads", o->intra_op_threads,
                  "Threads per model instance for one forward pass (libtorch intra-op); 0 = the "
                  "engine's rule (docs/models.md)")
      ->capture_default_str();
  // CPU contention.
  app->add_option("--contention", o->contention,
                  "Also measure beside N busy-looping processes (each holds a core): every run "
                  "is made quiet and contended, alternating, and the medians compared")
      ->capture_default_str();
  app->add_option("--contention-rounds", o->contention_rounds,
                  "Quiet and contended runs each, with --contention")
      ->capture_default_str();
  // Length.
  app->add_option("--warmup", o->warmup,
                  "Warm-up requests after the first inference (excluded from the figures)")
      ->capture_default_str();
  app->add_option("--warmup-s", o->warmup_s, "Or warm-up seconds (excluded from the figures)")
      ->capture_default_str();
  app->add_option("--duration-s,-t", o->duration_s,
                  "Measured seconds (default 5 unless --requests is given)");
  app->add_option("--requests,-n", o->requests, "Measured requests (instead of --duration-s)");
  // Inputs.
  add_parsed_list_option(*app, "--input-shape", o->input_shapes, parse_input_shape,
                         "Per-item dims after the batch dim, e.g. 1x32x32, or NAME:DIMS per "
                         "input; default: the model signature with -1 dims as 1");
  app->add_option("--batch-rows", o->batch_rows, "Rows (dim 0) per request")->capture_default_str();
  add_parsed_option(*app, "--data", o->data, parse_data,
                    "Input contents: random | zeros | file:<path.raw> (raw little-endian bytes "
                    "of the input dtype, reused cyclically)")
      ->default_str("random");
  app->add_option("--seed", o->seed, "Seed of random data, arrivals and priority draws")
      ->capture_default_str();
  // Output.
  app->add_option("--json", o->json, "Write the results as JSON to a file, or - for stdout");
  app->add_option("--csv", o->csv, "Write one CSV line per run to a file, or - for stdout");
  app->add_option("--report", o->report, "Write a self-contained HTML report (latency plots)");
  app->add_flag("--quiet,-q", o->quiet,
                "No progress line (and no table when stdout carries JSON/CSV)");
  app->add_flag("--fail-on-error", o->fail_on_error, "Exit 1 when any measured request failed");

  auto http = add_http_bench_options(*app);  // --url: the HTTP mode (http_bench.cpp)

  return Command{app, [o, conc, http] {
                   o->concurrency_given = conc->count() > 0;
                   if (!http->url.empty()) return run_http_bench(*o, *http);
                   return run_bench(*o);
                 }};
}

}  // namespace asyncinfer::cli
