// serve.cpp — `asyncinfer serve --model-repository DIR [...]`: the models of a Triton-layout
// repository over the Open Inference Protocol (HTTP/REST, and gRPC where it was built) with
// Prometheus metrics, until SIGTERM or SIGINT (graceful drain; a second signal cancels it). A
// thin layer over src/server (docs/serving.md); built only where the server library is
// (ASYNCINFER_HAVE_SERVER; the gRPC frontend: ASYNCINFER_HAVE_GRPC).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "commands.hpp"

#if ASYNCINFER_HAVE_SERVER
#include "frontend.hpp"
#include "http_server.hpp"
#include "inference_server.hpp"
#include "model_repository.hpp"
#include "server_log.hpp"
#include "trace.hpp"
#endif
#if ASYNCINFER_HAVE_SERVER && ASYNCINFER_HAVE_GRPC
#include "grpc_server.hpp"
#endif

#ifndef ASYNCINFER_VERSION
#define ASYNCINFER_VERSION "unknown"
#endif

namespace asyncinfer::cli {
namespace {

struct ServeOptions {
  bool disable_auto_complete_config = false;  ///< Triton's --disable-auto-complete-config
  std::string host = "127.0.0.1";
  int http_port = 8000;
  int metrics_port = 8002;
  int grpc_port = 8001;
  std::size_t grpc_max_message_bytes = 64u << 20;
  double grpc_max_connection_age_s = 0;
  int http_threads = 0;
  int http_spin_wait_us = 0;
  int http_caller_run_us = 50;
  double drain_timeout_s = 30;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double idle_timeout_s = 60;
  std::size_t max_body_bytes = 64u << 20;
  std::size_t max_header_bytes = 16u << 10;
  std::size_t max_connections = 4096;
  std::size_t max_inflight_bytes = std::size_t{1} << 30;
  std::size_t max_shm_regions = 256;
  std::size_t max_model_instances = 0;  // 0: max(16, 4 per core)
  std::size_t grpc_max_connections = 1024;
  std::size_t grpc_max_concurrent_streams = 100;
  std::size_t grpc_max_resets = 1000;
  std::size_t grpc_memory_bytes = std::size_t{1} << 30;
  bool strict_readiness = true;
  std::vector<std::string> cache_config;
  std::string model_control_mode = "none";
  double repository_poll_secs = 15;
  double model_load_timeout_s = 600;
  int model_load_threads = 4;
  std::vector<std::string> load_models;
  std::string model_config_name;
  // Triton's spellings (tritonserver's command line; triton_flags()).
  std::vector<std::string> repositories;  // --model-repository / --model-store, as given
  bool model_namespacing = false;         // --model-namespacing: a name space per repository
  std::optional<bool> allow_http, allow_grpc, allow_metrics, exit_on_error;
  std::optional<std::string> http_address, grpc_address, metrics_address;
  std::optional<double> exit_timeout_secs;
  std::optional<int> log_verbose;
  std::optional<bool> log_info, log_warning, log_error;
  std::optional<std::string> log_format;
  std::vector<std::string> tuning_flags;  // accepted, ignored: "--name=value" each
  std::vector<std::string> http_restricted_api;
  std::vector<std::string> grpc_restricted_protocol;
  std::string http_header_forward_pattern;
  std::string grpc_header_forward_pattern;
  // Triton's trace extension (src/server/trace.hpp): --trace-config, and the older flags.
  std::vector<std::string> trace_config;
  std::optional<std::string> trace_file, trace_rate, trace_count, trace_log_frequency;
  std::vector<std::string> trace_level;
  std::string rate_limit = "off";                 // --rate-limit: execution_count or off
  std::vector<std::string> rate_limit_resources;  // --rate-limit-resource, as given
};

/// Triton's flags that only tune Triton's internals (no counterpart here): accepted with one
/// warning each (add_triton_flags).
constexpr const char* kTritonTuningFlags[] = {
    "--backend-directory",
    "--repoagent-directory",
    "--cache-directory",
    "--backend-config",
    "--pinned-memory-pool-byte-size",
    "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size",
    "--min-supported-compute-capability",
    "--buffer-manager-thread-count",
    "--model-load-retry-count",
    "--host-policy",
    "--id",
    "--allow-gpu-metrics",
    "--allow-cpu-metrics",
    "--metrics-interval-ms",
    "--metrics-config",
    "--grpc-infer-allocation-pool-size",
    "--grpc-max-response-pool-size",
    "--grpc-keepalive-time",
    "--grpc-keepalive-timeout",
    "--grpc-keepalive-permit-without-calls",
    "--grpc-http2-max-pings-without-data",
    "--grpc-http2-min-recv-ping-interval-without-data",
    "--grpc-http2-max-ping-strikes",
    "--grpc-infer-response-compression-level",
    "--disable-auto-complete-config",
    "--response-cache-byte-size",
    "--strict-model-config",
    "--buffer-management-thread-count",
    "--model-load-gpu-limit",
    "--reuse-http-port",
    "--reuse-grpc-port",
    "--grpc-server-cert",
    "--grpc-server-key",
    "--grpc-root-cert",
    "--grpc-max-connection-age-grace",
    "--sagemaker-port",
    "--sagemaker-safe-port-range",
    "--sagemaker-thread-count",
    "--vertex-ai-port",
    "--vertex-ai-thread-count",
    "--vertex-ai-default-model",
};

/// Triton's command-line flags (tritonserver --help of Triton 2.51; docs/serving.md, "Triton's
/// command line"), so that a Triton launch line (a KServe ServingRuntime's, Model Analyzer's)
/// starts `asyncinfer serve` or `tritonserver` (the same program under Triton's name). Those that
/// map to asyncinfer's own options are applied (apply_triton_flags); those that only tune
/// Triton's internals are accepted with one warning; those that would change behaviour
/// asyncinfer does not have are refused at start, saying so.
void add_triton_flags(CLI::App& app, ServeOptions& o) {
  const char* group = "Triton's flags";
  app.add_option("--allow-http", o.allow_http, "Triton: serve HTTP (false is refused)")
      ->group(group);
  app.add_option("--allow-grpc", o.allow_grpc, "Triton: serve gRPC (false = --grpc-port -1)")
      ->group(group);
  app.add_option("--allow-metrics", o.allow_metrics,
                 "Triton: serve /metrics (false = --metrics-port -1)")
      ->group(group);
  app.add_option("--http-address", o.http_address, "Triton: HTTP address (= --host)")->group(group);
  app.add_option("--grpc-address", o.grpc_address, "Triton: gRPC address (= --host)")->group(group);
  app.add_option("--metrics-address", o.metrics_address, "Triton: metrics address (= --host)")
      ->group(group);
  app.add_option("--exit-timeout-secs", o.exit_timeout_secs, "Triton: = --drain-timeout")
      ->group(group)
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--exit-on-error", o.exit_on_error,
                 "Triton: exit at start when a model fails to load (default false here)")
      ->group(group);
  app.add_option("--log-verbose", o.log_verbose, "Triton: log_verbose_level (logging extension)")
      ->group(group)
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--log-info", o.log_info, "Triton: log_info")->group(group);
  app.add_option("--log-warning", o.log_warning, "Triton: log_warning")->group(group);
  app.add_option("--log-error", o.log_error, "Triton: log_error")->group(group);
  app.add_option("--log-format", o.log_format, "Triton: log_format (default or ISO8601)")
      ->group(group)
      ->check(CLI::IsMember({"default", "ISO8601"}));
  app.add_option("--http-thread-count", o.http_threads, "Triton: = --http-threads")->group(group);
  // Triton's trace extension (docs/serving.md, "Trace"); checked at start (parse_trace_config).
  app.add_option("--trace-config", o.trace_config,
                 "Triton: [triton|opentelemetry,]<setting>=<value>, repeatable: rate, level "
                 "(OFF|TIMESTAMPS|TENSORS), count, mode (triton|opentelemetry); triton: file, "
                 "log-frequency; opentelemetry: url, resource=<k>=<v>, bsp_max_queue_size, "
                 "bsp_schedule_delay, bsp_max_export_batch_size")
      ->group(group);
  app.add_option("--trace-file", o.trace_file, "Triton (older): = --trace-config triton,file=")
      ->group(group);
  app.add_option("--trace-level", o.trace_level, "Triton (older): = --trace-config level=")
      ->group(group);
  app.add_option("--trace-rate", o.trace_rate, "Triton (older): = --trace-config rate=")
      ->group(group);
  app.add_option("--trace-count", o.trace_count, "Triton (older): = --trace-config count=")
      ->group(group);
  app.add_option("--trace-log-frequency", o.trace_log_frequency,
                 "Triton (older): = --trace-config triton,log-frequency=")
      ->group(group);
  // Triton internals with no counterpart here: accepted, one warning each.
  for (const char* name : kTritonTuningFlags) {
    const std::string flag = name;
    // --disable-auto-complete-config takes no value in Triton; the others take one.
    if (flag == "--disable-auto-complete-config") {
      app.add_flag_callback(
             flag, [&o] { o.disable_auto_complete_config = true; },
             "Triton: python models' auto_complete_config is not called")
          ->group(group);
      continue;
    }
    app.add_option_function<std::string>(
           flag, [&o, flag](const std::string& v) { o.tuning_flags.push_back(flag + "=" + v); },
           "Triton: accepted and ignored (a warning says so)")
        ->group(group)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  // Triton features whose settings change behaviour asyncinfer does not have: refused unless off.
  auto refuse_unless = [&app, group](const char* name, std::vector<std::string> allowed,
                                     const char* why) {
    app.add_option_function<std::string>(
           name,
           [name, allowed, why](const std::string& v) {
             if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
               throw CLI::ValidationError(name,
                                          std::string("'") + v + "' is not supported: " + why);
             }
           },
           std::string("Triton: refused unless ") + (allowed.empty() ? "absent" : allowed[0]))
        ->group(group);
  };
  app.add_option("--rate-limit", o.rate_limit,
                 "Triton: execution_count (an instance runs a batch only when the resources its "
                 "instance_group rate_limiter lists are free; priority weights the turns) or off "
                 "(the default: rate_limiter settings are not served)")
      ->group(group);
  app.add_option("--rate-limit-resource", o.rate_limit_resources,
                 "Triton: <name>:<count>[:<device>], repeatable: a resource's count, on one "
                 "device or every one (default: the largest count a loaded instance asks for)")
      ->group(group);
  refuse_unless("--log-file", {}, "the log goes to standard error (redirect it)");
  refuse_unless("--grpc-use-ssl", {"false", "0"}, "no TLS here: serve behind a TLS proxy");
  refuse_unless("--grpc-use-ssl-mutual", {"false", "0"}, "no TLS here: serve behind a TLS proxy");
  refuse_unless("--allow-sagemaker", {"false", "0"}, "no SageMaker endpoint here");
  refuse_unless("--allow-vertex-ai", {"false", "0"}, "no Vertex AI endpoint here");
  app.add_option("--model-namespacing", o.model_namespacing,
                 "Triton: true = each --model-repository is a name space of its own, so that two "
                 "may hold a model of the same name (a request by a name two namespaces serve "
                 "fails as ambiguous; an ensemble's steps are its own namespace's first)")
      ->group(group);
}

/// Applies Triton's flags to `o` (after parsing); invalid_argument naming the flag when they
/// cannot be honoured. `warn` gets one line per flag accepted and ignored.
Status apply_triton_flags(ServeOptions& o, const std::function<void(const std::string&)>& warn) {
  if (o.repositories.empty()) {
    return invalid_argument_error("no model repository given (--model-repository DIR)");
  }
  if (o.allow_http && !*o.allow_http) {
    return invalid_argument_error(
        "--allow-http=false is not supported: asyncinfer always serves "
        "HTTP (its health endpoints are what probes read)");
  }
  if (o.allow_grpc && !*o.allow_grpc) o.grpc_port = -1;
  if (o.allow_metrics && !*o.allow_metrics) o.metrics_port = -1;
  std::optional<std::string> address;
  for (const auto* a : {&o.http_address, &o.grpc_address, &o.metrics_address}) {
    if (!*a) continue;
    if (address && *address != **a) {
      return invalid_argument_error(
          "--http-address, --grpc-address and --metrics-address "
          "differ: asyncinfer listens on one address (--host)");
    }
    address = **a;
  }
  if (address) o.host = *address;
  if (o.exit_timeout_secs) o.drain_timeout_s = *o.exit_timeout_secs;
  // Triton reads the mode in any case.
  std::transform(o.rate_limit.begin(), o.rate_limit.end(), o.rate_limit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (o.rate_limit != "execution_count" && o.rate_limit != "off") {
    return invalid_argument_error("--rate-limit '" + o.rate_limit +
                                  "': the modes are execution_count and off");
  }
  for (const std::string& f : o.tuning_flags) {
    warn("warning: " + f + " tunes Triton's internals; asyncinfer ignores it");
  }
  return Status();
}

#if ASYNCINFER_HAVE_SERVER
/// The server's log (server_log.hpp): its lines, the repository's and the library's, with the
/// settings of Triton's logging extension. Lives as long as the process.
server::ServerLog& server_log() {
  static server::ServerLog log("asyncinfer serve");
  return log;
}

void log_line(const std::string& line) { server_log().write_line(line); }
std::chrono::milliseconds ms(double s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000.0 + 0.5));
}

/// Many connections need many descriptors: raise the soft limit to the hard one (as nginx's
/// worker_rlimit_nofile does); the connections get what is left of it less a reserve.
std::size_t raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur == RLIM_INFINITY ? 0 : static_cast<std::size_t>(r.rlim_cur);
}

/// Descriptors open now.
std::size_t open_fds() {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

/// What client connections may take of the descriptor limit: the limit less what is open now
/// (the models are loaded) and a reserve for what the server opens later (gRPC's and the engines'
/// own, accept() itself, model files, one per shared memory region); 0 = no limit known.
std::size_t connection_fds(std::size_t limit, std::size_t shm_regions) {
  if (limit == 0) return 0;
  const std::size_t reserve = 64 + limit / 16 + shm_regions;
  const std::size_t used = open_fds();
  return limit > used + reserve + 16 ? limit - used - reserve : 16;
}

int run_serve(const ServeOptions& given) {
  using namespace asyncinfer::server;
  ServeOptions o = given;
  // Before any thread exists (the engines start theirs while loading).
  block_shutdown_signals();
  // The library's messages (a worker's, an engine's) go to the server's log, at their level, and
  // say it as the default hook did ("warning: ...").
  set_log_hook([](LogLevel level, std::string_view message) {
    if (level == LogLevel::info) return server_log().write(level, message);
    server_log().write(level, std::string(to_string(level)) + ": " + std::string(message));
  });
  if (Status t = apply_triton_flags(o, log_line); !t.ok()) {
    std::fprintf(stderr, "asyncinfer serve: error: %s\n", std::string(t.message()).c_str());
    return kExitUsage;
  }
  {
    Parameters log_settings;  // Triton's --log-* flags: the logging extension's settings
    if (o.log_verbose) log_settings["log_verbose_level"] = std::int64_t{*o.log_verbose};
    if (o.log_info) log_settings["log_info"] = *o.log_info;
    if (o.log_warning) log_settings["log_warning"] = *o.log_warning;
    if (o.log_error) log_settings["log_error"] = *o.log_error;
    if (o.log_format) log_settings["log_format"] = *o.log_format;
    if (auto applied = server_log().update(log_settings); !applied.ok()) {
      std::fprintf(stderr, "asyncinfer serve: error: %s\n", applied.status().to_string().c_str());
      return kExitUsage;
    }
  }
  // Triton's trace extension: its settings at start (an error is the command line's).
  LegacyTraceFlags legacy_trace{o.trace_file, o.trace_level, o.trace_rate, o.trace_count,
                                o.trace_log_frequency};
  auto trace_config = parse_trace_config(o.trace_config, legacy_trace, log_line);
  if (!trace_config.ok()) {
    std::fprintf(stderr, "asyncinfer serve: error: %s\n",
                 std::string(trace_config.status().message()).c_str());
    return kExitUsage;
  }
  const std::size_t fds = raise_fd_limit();
  // Options checked before the models load (a load may take minutes).
  auto cache_bytes = parse_cache_config(o.cache_config);
  if (!cache_bytes.ok()) {
    std::fprintf(stderr, "asyncinfer serve: error: %s\n", cache_bytes.status().to_string().c_str());
    return kExitUsage;
  }
  if (!o.model_config_name.empty()) {
    if (Status r = check_model_config_name(o.model_config_name); !r.ok()) {
      std::fprintf(stderr, "asyncinfer serve: error: %s\n", r.to_string().c_str());
      return kExitUsage;
    }
  }
  RestrictedApis http_restricted;
  RestrictedApis grpc_restricted;
  for (auto [specs, restricted, option, prefix] :
       {std::tuple{&o.http_restricted_api, &http_restricted, "--http-restricted-api", ""},
        std::tuple{&o.grpc_restricted_protocol, &grpc_restricted, "--grpc-restricted-protocol",
                   "triton-grpc-protocol-"}}) {
    for (const std::string& spec : *specs) {
      if (Status r = restricted->add(spec, option, prefix); !r.ok()) {
        std::fprintf(stderr, "asyncinfer serve: error: %s\n", r.to_string().c_str());
        return kExitUsage;
      }
    }
  }

  std::shared_ptr<const HeaderForward> http_forward;
  std::shared_ptr<const HeaderForward> grpc_forward;
  for (auto [pattern, forward, option] :
       {std::tuple{&o.http_header_forward_pattern, &http_forward, "--http-header-forward-pattern"},
        std::tuple{&o.grpc_header_forward_pattern, &grpc_forward,
                   "--grpc-header-forward-pattern"}}) {
    if (pattern->empty()) continue;
    auto made = HeaderForward::create(*pattern, option);
    if (!made.ok()) {
      std::fprintf(stderr, "asyncinfer serve: error: %s\n", made.status().to_string().c_str());
      return kExitUsage;
    }
    *forward = std::move(*made);
  }

  auto mode = parse_model_control_mode(o.model_control_mode);
  if (!mode.ok()) {
    std::fprintf(stderr, "asyncinfer serve: error: %s\n", mode.status().to_string().c_str());
    return kExitUsage;
  }
  if (!o.load_models.empty() && *mode != ModelControlMode::explicit_mode) {
    std::fprintf(stderr,
                 "asyncinfer serve: error: --load-model needs --model-control-mode explicit (in "
                 "%s mode every model is loaded)\n",
                 o.model_control_mode.c_str());
    return kExitUsage;
  }
  RepositoryOptions ro;
  std::vector<RateLimitResource> resources;  // checked whatever the mode, as Triton does
  for (const std::string& spec : o.rate_limit_resources) {
    auto r = parse_rate_limit_resource(spec);
    if (!r.ok()) {
      std::fprintf(stderr, "asyncinfer serve: error: %s\n",
                   std::string(r.status().message()).c_str());
      return kExitUsage;
    }
    resources.push_back(std::move(*r));
  }
  if (o.rate_limit == "execution_count") {
    ro.rate_limiter = make_rate_limiter(std::move(resources));
    log_line("rate limiter: execution_count (" + std::to_string(o.rate_limit_resources.size()) +
             " resource counts given)");
  }
  ro.control_mode = *mode;
  ro.load_models = o.load_models;
  ro.poll_interval = ms(o.repository_poll_secs);
  ro.drain_timeout = ms(o.drain_timeout_s);
  ro.max_instances =
      o.max_model_instances != 0
          ? o.max_model_instances
          : std::max<std::size_t>(16, 4 * std::max(1u, std::thread::hardware_concurrency()));
  ro.max_warmup_bytes = o.max_inflight_bytes;
  ro.load_timeout =
      o.model_load_timeout_s > 0 ? ms(o.model_load_timeout_s) : std::chrono::milliseconds::max();
  ro.load_threads = o.model_load_threads;
  ro.auto_complete_config = !o.disable_auto_complete_config;
  ro.model_config_name = o.model_config_name;
  ro.model_namespacing = o.model_namespacing;
  // SIGTERM or SIGINT while the models load cuts the loads short and ends the server: a hanging
  // model.py's initialize() does not hold the exit for --model-load-timeout.
  std::stop_source start_stop;
  ro.start_stop = start_stop.get_token();
  std::atomic<int> start_signal{0};
  auto repository = [&] {
    StartupSignalWatch watch([&](int s) {
      start_signal.store(s);
      start_stop.request_stop();
    });
    return ModelRepository::load(
        std::vector<std::filesystem::path>(o.repositories.begin(), o.repositories.end()), log_line,
        ro);
  }();  // the watch has ended: a signal from now on waits for run_until_signalled
  if (const int s = start_signal.load(); s != 0) {
    log_line(std::string("received ") + StartupSignalWatch::name(s) +
             " while the models loaded: the loads were cancelled; exiting");
    return 0;
  }
  if (!repository.ok()) {
    std::fprintf(stderr, "asyncinfer serve: error: --model-repository: %s\n",
                 repository.status().to_string().c_str());
    return kExitUsage;
  }
  ServerOptions so;
  so.version = ASYNCINFER_VERSION;
  so.strict_readiness = o.strict_readiness;
  so.max_inflight_bytes = o.max_inflight_bytes;
  so.max_shm_regions = o.max_shm_regions;
  so.connection_fds = connection_fds(fds, o.max_shm_regions);
  so.response_cache_bytes = *cache_bytes;
  so.log = &server_log();
  auto snapshot = (*repository)->snapshot();
  for (const auto& m : snapshot->models) {
    for (const auto& v : m->versions) {
      if (v->response_cache && so.response_cache_bytes == 0) {
        log_line("model '" + m->name + "' version " + v->version_text +
                 ": response_cache is enabled but the server has no cache (--cache-config "
                 "local,size=BYTES); its responses are computed every time");
      }
    }
  }
  if (so.response_cache_bytes > 0) {
    log_line("response cache: " + std::to_string(so.response_cache_bytes) + " bytes (local)");
  }
  if (so.connection_fds > 0) {
    log_line("connections: " + std::to_string(so.connection_fds) +
             " file descriptors for client connections (the process may open " +
             std::to_string(fds) + "; the rest is open or held in reserve)");
  }
  if (trace_config->level != 0) {
    log_line(trace_config->mode == TraceMode::triton
                 ? "trace: triton mode, every " + std::to_string(trace_config->rate) +
                       "th request to " + trace_config->file
                 : "trace: opentelemetry mode, every " + std::to_string(trace_config->rate) +
                       "th request, spans to " + trace_config->otel.url);
  }
  // Before the server, which samples requests into it, and gone after it (its files closed).
  TraceManager tracer(std::move(*trace_config), log_line);
  so.trace = &tracer;
  InferenceServer core(std::move(*repository), so);

  HttpOptions ho;
  ho.restricted = http_restricted;
  ho.header_forward = http_forward;
  ho.host = o.host;
  ho.http_port = o.http_port;
  ho.metrics_port = o.metrics_port;
  ho.threads = o.http_threads;
  ho.spin_wait = std::chrono::microseconds(o.http_spin_wait_us);
  ho.caller_run = std::chrono::microseconds(o.http_caller_run_us);
  ho.max_body_bytes = o.max_body_bytes;
  ho.max_header_bytes = o.max_header_bytes;
  ho.header_timeout = ms(o.header_timeout_s);
  ho.body_timeout = ms(o.body_timeout_s);
  ho.idle_timeout = ms(o.idle_timeout_s);
  ho.max_connections = o.max_connections;
  // The order of shutdown is decided here (frontend.hpp): the engines stop before the frontends
  // whose connections their callbacks write to.
  auto refuse = [&core](const Status& s) {
    std::fprintf(stderr, "asyncinfer serve: error: %s\n", s.to_string().c_str());
    core.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    return s.code() == StatusCode::invalid_argument ? kExitUsage : kExitRunFailed;
  };
  HttpServer http(core, ho);
  Status s = http.start();
  if (!s.ok()) return refuse(s);
  log_line("http: listening on " + o.host + ":" + std::to_string(http.http_port()) + " (" +
           std::to_string(http.io_threads()) + " I/O threads)");
  if (http.metrics_port() >= 0) {
    log_line("metrics: listening on " + o.host + ":" + std::to_string(http.metrics_port()) +
             " (/metrics)");
  }
  std::vector<Frontend*> frontends = {&http};
#if ASYNCINFER_HAVE_GRPC
  std::optional<GrpcServer> grpc;
  if (o.grpc_port >= 0) {
    GrpcOptions go;
    go.restricted = grpc_restricted;
    go.header_forward = grpc_forward;
    go.host = o.host;
    go.port = o.grpc_port;
    go.max_message_bytes = o.grpc_max_message_bytes;
    go.max_connection_age = ms(o.grpc_max_connection_age_s);
    go.max_connection_idle = ms(o.idle_timeout_s);
    go.stream_stall_timeout = ms(o.idle_timeout_s);
    go.max_connections = o.grpc_max_connections;
    go.max_concurrent_streams = o.grpc_max_concurrent_streams;
    go.max_resets = o.grpc_max_resets;
    go.memory_bytes = o.grpc_memory_bytes;
    grpc.emplace(core, go);
    s = grpc->start();
    if (!s.ok()) return refuse(s);
    log_line("grpc: listening on " + o.host + ":" + std::to_string(grpc->grpc_port()) +
             " (inference.GRPCInferenceService, grpc.health.v1.Health; max message " +
             std::to_string(go.max_message_bytes) + " bytes, " +
             std::to_string(go.max_concurrent_streams) + " streams per connection)");
    frontends.push_back(&*grpc);
  }
#else
  if (o.grpc_port >= 0) {
    log_line(
        "grpc: not built (needs libgrpc++-dev and protobuf-compiler-grpc; run "
        "scripts/setup.sh and rebuild); serving HTTP only");
  }
#endif
  if (o.exit_on_error.value_or(false) && !core.ready()) {
    log_line("error: a model failed to load and --exit-on-error is true: exiting");
    core.shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    return kExitRunFailed;
  }
  log_line(core.ready() ? "ready" : "not ready: a model failed to load (see above)");
  return run_until_signalled(core, frontends, ms(o.drain_timeout_s), log_line);
}
#else
int run_serve(const ServeOptions&) {
  std::fprintf(stderr,
               "asyncinfer serve: not built: the server needs Boost (libboost-dev), protobuf "
               "(libprotobuf-dev, protobuf-compiler) and prometheus-cpp-dev; run "
               "scripts/setup.sh and rebuild\n");
  return kExitRunFailed;
}
#endif

}  // namespace

Command add_serve_command(CLI::App& parent) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* app = parent.add_subcommand(
      "serve",
      "Serve a model repository over the Open Inference Protocol (KServe v2) on HTTP and gRPC");
  app->add_option("--model-repository,--model-store", o->repositories,
                  "Triton-layout repository: DIR/<model>/config.pbtxt, DIR/<model>/<version>/ "
                  "(--model-store: Triton's other name; repeat it for more repositories, one "
                  "name space unless --model-namespacing=true)")
      ->required();
  app->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  app->add_option("--http-port", o->http_port, "HTTP port (0 = a free port, logged)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app->add_option("--metrics-port", o->metrics_port,
                  "Prometheus /metrics port (0 = a free port, -1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  app->add_option("--grpc-port", o->grpc_port, "gRPC port (0 = a free port, logged; -1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  app->add_option("--grpc-max-message-bytes", o->grpc_max_message_bytes,
                  "Largest gRPC message received or sent (RESOURCE_EXHAUSTED above)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1024}, std::size_t{2147483647}));
  app->add_option("--grpc-max-connection-age", o->grpc_max_connection_age_s,
                  "Seconds after which a gRPC connection gets GOAWAY so the client reconnects "
                  "(spreads clients behind a connection-level balancer; 0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app->add_option("--http-threads", o->http_threads, "I/O threads (0 = one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app->add_option("--http-spin-wait-us", o->http_spin_wait_us,
                  "Microseconds an HTTP I/O thread whose one request is in an engine busy-polls "
                  "for the answer before it sleeps (0 = never; a latency mode for few "
                  "connections, with the model's spin_wait_us)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app->add_option("--http-caller-run-us", o->http_caller_run_us,
                  "An HTTP I/O thread runs an inference request itself, instead of waking an "
                  "idle engine worker, when the model's recent batches took at most this many "
                  "microseconds on the cpu device (0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app->add_option("--drain-timeout", o->drain_timeout_s,
                  "Seconds in-flight requests get to finish after SIGTERM/SIGINT")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app->add_option("--header-timeout", o->header_timeout_s,
                  "Seconds a request header may take from its first byte (408 after)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  app->add_option("--body-timeout", o->body_timeout_s,
                  "Seconds a request body may take (408 after)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  app->add_option("--idle-timeout", o->idle_timeout_s,
                  "Seconds an idle keep-alive connection stays open")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  app->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body (413 above)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40));
  app->add_option("--max-header-bytes", o->max_header_bytes, "Largest request header (431 above)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{256}, std::size_t{1} << 24));
  app->add_option("--cache-config", o->cache_config,
                  "Triton's response cache: local,size=BYTES (an LRU by bytes, for the models "
                  "whose config has response_cache { enable: true })");
  app->add_option("--model-control-mode", o->model_control_mode,
                  "Triton's model control: none (every model at start, fixed), poll (also "
                  "rescan the repository and load, reload or unload what changed), explicit "
                  "(--load-model at start, then POST /v2/repository/models/NAME/load and "
                  "/unload)")
      ->capture_default_str()
      ->transform(CLI::IsMember({"none", "poll", "explicit"}, CLI::ignore_case));
  app->add_option("--repository-poll-secs", o->repository_poll_secs,
                  "poll mode: seconds between two scans of the repository")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 86400.0));
  app->add_option("--model-load-timeout", o->model_load_timeout_s,
                  "Seconds one model version's load may take (its file, every instance's "
                  "creation: a model.py's initialize(), and its warm-up); past it the load is "
                  "cancelled and the version is UNAVAILABLE (0 = no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0 * 7));
  app->add_option("--model-load-thread-count", o->model_load_threads,
                  "Models loaded at once (at start, and explicit mode's load calls; one model's "
                  "loads stay in order)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app->add_option("--load-model", o->load_models,
                  "explicit mode: a model to load at start (repeatable; * = every model)");
  add_triton_flags(*app, *o);
  app->add_option("--model-config-name", o->model_config_name,
                  "Triton's custom configuration: a model whose folder has "
                  "configs/<name>.pbtxt loads with it instead of config.pbtxt");
  app->add_option("--http-restricted-api", o->http_restricted_api,
                  "Triton's <api>[,<api>...]:<key>=<value>: those HTTP API categories (health, "
                  "metadata, inference, shared-memory, model-config, model-repository, "
                  "statistics, trace, logging) answer only requests with the header <key>: "
                  "<value> (403 otherwise); repeatable, a category in one group");
  app->add_option("--grpc-restricted-protocol", o->grpc_restricted_protocol,
                  "Triton's <api>[,<api>...]:<key>=<value> for gRPC: the calls of those "
                  "categories need the metadata triton-grpc-protocol-<key>: <value> "
                  "(UNAVAILABLE otherwise); repeatable");
  app->add_option("--http-header-forward-pattern", o->http_header_forward_pattern,
                  "Triton's: request headers whose name matches this RE2 pattern (anywhere, "
                  "case-insensitive unless it says (?-i)) reach the model as string request "
                  "parameters");
  app->add_option("--grpc-header-forward-pattern", o->grpc_header_forward_pattern,
                  "Triton's: the same for gRPC metadata");
  app->add_option("--max-connections", o->max_connections,
                  "Open HTTP connections at most (429 above)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
  app->add_option("--max-inflight-bytes", o->max_inflight_bytes,
                  "Bytes all requests in flight may hold together: bodies, decoded tensors, "
                  "responses (HTTP 503 / gRPC RESOURCE_EXHAUSTED above; 0 = no limit)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 44));
  app->add_option("--max-shm-regions", o->max_shm_regions,
                  "System shared memory regions registered at once, each holding one "
                  "descriptor (a registration past it is refused: HTTP 503 / gRPC "
                  "RESOURCE_EXHAUSTED; 0 = no limit)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 20));
  app->add_option("--max-model-instances", o->max_model_instances,
                  "Instances one model version may have, all instance groups together (a "
                  "config asking for more is refused at load; 0 = 4 per core, at least 16)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{4096}));
  app->add_option("--grpc-max-connections", o->grpc_max_connections,
                  "Open gRPC connections at most (closed at once above)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
  app->add_option("--grpc-max-concurrent-streams", o->grpc_max_concurrent_streams,
                  "HTTP/2 MAX_CONCURRENT_STREAMS: calls one gRPC connection may have open")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  app->add_option("--grpc-max-resets", o->grpc_max_resets,
                  "Calls a gRPC client may cancel within 10 s before its connection is closed "
                  "(HTTP/2 rapid reset)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  app->add_option("--grpc-memory-bytes", o->grpc_memory_bytes,
                  "Memory gRPC's transports may take (grpc::ResourceQuota; 0 = unbounded)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 44));
  app->add_option("--strict-readiness", o->strict_readiness,
                  "Ready only when every model version loaded and can serve (Triton's default); "
                  "true or false")
      ->default_str("true");
  return Command{app, [o] { return run_serve(*o); }};
}

}  // namespace asyncinfer::cli
