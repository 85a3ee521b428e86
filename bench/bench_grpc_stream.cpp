// bench_grpc_stream: a closed-loop gRPC load generator for `asyncinfer serve` (or any server of the
// Open Inference Protocol with Triton's ModelStreamInfer), on grpc++'s callback API and the
// project's generated inference::GRPCInferenceService stubs.
//
//   --mode unary    N clients, each its own channel (its own connection), each with --inflight
//                   ModelInfer calls in flight: when one returns, the next is issued.
//   --mode stream   N ModelStreamInfer streams (on --connections channels, one per stream by
//                   default), each with --inflight requests outstanding: a request is written,
//                   its response read (matched by id), the next written.
//
// It reports requests/s over the measured window (after --warmup-s), p50/p90/p99 latency (write
// or call start to response), the client's own CPU seconds (getrusage) and, with --server-pid,
// the server's CPU (/proc/<pid>/stat) over the same window, so the two can be told apart. Every
// response is checked: a failed call, an error_message on the stream, a response with no
// outputs, an unknown id, or a stream that ends early is an error; errors are counted, the first
// few printed, and any error makes the exit status 1.
//
//   bench_grpc_stream --address 127.0.0.1:8001 --model identity --mode stream -c 64
//                     --input input0:FP32:1x16 --duration-s 5 --server-pid <pid>

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "grpc_service.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelStreamInferResponse;

struct InputSpec {
  std::string name;
  std::string datatype;
  std::vector<std::int64_t> shape;
};

std::size_t element_size(const std::string& dt) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1},  {"INT8", 1},   {"UINT8", 1}, {"INT16", 2},  {"UINT16", 2},
      {"FP16", 2},  {"BF16", 2},   {"INT32", 4}, {"UINT32", 4}, {"FP32", 4},
      {"INT64", 8}, {"UINT64", 8}, {"FP64", 8}};
  auto it = sizes.find(dt);
  return it == sizes.end() ? 0 : it->second;
}

/// NAME:DATATYPE:DIMS, DIMS as 1x16 (or 1,16). Throws CLI::ValidationError with the reason.
InputSpec parse_input(const std::string& text) {
  const auto a = text.find(':');
  const auto b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos || a == 0) {
    throw CLI::ValidationError("'" + text +
                               "': expected NAME:DATATYPE:DIMS, e.g. input0:FP32:1x16");
  }
  InputSpec s{text.substr(0, a), text.substr(a + 1, b - a - 1), {}};
  if (element_size(s.datatype) == 0) {
    throw CLI::ValidationError(
        "'" + text + "': datatype '" + s.datatype +
        "' is not a fixed-size OIP datatype (FP32, INT64, ...; BYTES is not supported)");
  }
  std::string dims = text.substr(b + 1);
  std::replace(dims.begin(), dims.end(), ',', 'x');
  std::stringstream in(dims);
  std::string d;
  while (std::getline(in, d, 'x')) {
    char* end = nullptr;
    const long long v = std::strtoll(d.c_str(), &end, 10);
    if (d.empty() || *end != '\0' || v <= 0) {
      throw CLI::ValidationError("'" + text + "': dimension '" + d + "' is not a positive integer");
    }
    s.shape.push_back(v);
  }
  if (s.shape.empty()) throw CLI::ValidationError("'" + text + "': no dimensions");
  return s;
}

/// Deterministic contents: small non-negative values of the datatype (no NaN or denormals).
std::string make_contents(const InputSpec& s) {
  std::size_t n = 1;
  for (auto d : s.shape) n *= static_cast<std::size_t>(d);
  const std::size_t es = element_size(s.datatype);
  std::string out(n * es, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    char* p = out.data() + i * es;
    if (s.datatype == "FP32") {
      const float v = static_cast<float>(i % 17) / 16.0f;
      std::memcpy(p, &v, 4);
    } else if (s.datatype == "FP64") {
      const double v = static_cast<double>(i % 17) / 16.0;
      std::memcpy(p, &v, 8);
    } else if (s.datatype == "BOOL") {
      *p = static_cast<char>(i % 2);
    } else if (s.datatype != "FP16" && s.datatype != "BF16") {
      *p = static_cast<char>(i % 7);  // little-endian: the low byte
    }
  }
  return out;
}

struct Options {
  std::string address;
  std::string model;
  std::string model_version;
  std::string mode;
  int concurrency = 1;
  int connections = 0;  // 0: one per client (unary) or per stream
  int inflight = 1;
  double duration_s = 5;
  double warmup_s = 1;
  double connect_timeout_s = 10;
  std::vector<std::string> inputs;
  int server_pid = 0;
};

/// Shared by every client: the measuring phase, counters, the first errors.
struct Shared {
  // 0 warm-up, 1 measuring, 2 draining (no new requests).
  std::atomic<int> phase{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> measured_errors{0};
  std::mutex mu;
  std::vector<std::string> first_errors;
  std::condition_variable cv;
  int finished = 0;

  void error(const std::string& what) {
    errors.fetch_add(1, std::memory_order_relaxed);
    if (phase.load(std::memory_order_relaxed) == 1) {
      measured_errors.fetch_add(1, std::memory_order_relaxed);
    }
    std::lock_guard lock(mu);
    if (first_errors.size() < 5) first_errors.push_back(what);
  }
  void finish() {
    std::lock_guard lock(mu);
    ++finished;
    cv.notify_all();
  }
};

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// A successful response must carry its outputs' contents; returns the problem or "".
std::string check_response(const ModelInferResponse& r, const std::string& model) {
  if (r.model_name() != model) return "response for model '" + r.model_name() + "'";
  if (r.outputs_size() == 0) return "response without outputs";
  if (r.raw_output_contents_size() != r.outputs_size()) {
    bool typed = true;
    for (const auto& o : r.outputs()) typed = typed && o.has_contents();
    if (!typed) return "response without the outputs' contents";
  }
  return {};
}

// ---- unary: one closed loop per slot ----------------------------------------------------------

class UnarySlot {
 public:
  UnarySlot(Shared& sh, GRPCInferenceService::Stub& stub, ModelInferRequest req, std::string model)
      : sh_(sh), stub_(stub), req_(std::move(req)), model_(std::move(model)) {}

  void start() { issue(); }
  std::vector<double> latencies;

 private:
  void issue() {
    // The context of the call that just returned is still referenced by gRPC until its callback
    // returns: alternate two and reset the other one.
    cur_ ^= 1;
    ctx_[cur_] = std::make_unique<grpc::ClientContext>();
    resp_.Clear();
    req_.set_id(std::to_string(++seq_));
    t0_ = Clock::now();
    stub_.async()->ModelInfer(ctx_[cur_].get(), &req_, &resp_,
                              [this](grpc::Status s) { done(std::move(s)); });
  }

  void done(grpc::Status s) {
    const auto t1 = Clock::now();
    const int phase = sh_.phase.load(std::memory_order_acquire);
    if (!s.ok()) {
      sh_.error("ModelInfer: " + std::to_string(s.error_code()) + " " + s.error_message());
    } else if (auto bad = check_response(resp_, model_); !bad.empty()) {
      sh_.error("ModelInfer: " + bad);
    } else if (resp_.id() != req_.id()) {
      sh_.error("ModelInfer: response id '" + resp_.id() + "', request id '" + req_.id() + "'");
    } else if (phase == 1) {
      latencies.push_back(micros(t0_, t1));
    }
    if (phase == 2) {
      sh_.finish();
      return;
    }
    issue();
  }

  Shared& sh_;
  GRPCInferenceService::Stub& stub_;
  ModelInferRequest req_;
  std::string model_;
  ModelInferResponse resp_;
  std::unique_ptr<grpc::ClientContext> ctx_[2];
  int cur_ = 0;
  std::uint64_t seq_ = 0;
  Clock::time_point t0_;
};

// ---- stream: one ModelStreamInfer with `inflight` requests outstanding -------------------------

class StreamSlot : public grpc::ClientBidiReactor<ModelInferRequest, ModelStreamInferResponse> {
 public:
  StreamSlot(Shared& sh, GRPCInferenceService::Stub& stub, ModelInferRequest req, std::string model,
             int inflight)
      : sh_(sh), stub_(stub), req_(std::move(req)), model_(std::move(model)), inflight_(inflight) {}

  void start() {
    stub_.async()->ModelStreamInfer(&ctx_, this);
    StartRead(&resp_);
    {
      std::lock_guard lock(mu_);
      to_send_ = inflight_;
      send_locked();
    }
    StartCall();
  }
  /// Cuts the stream off (the drain took too long).
  void cancel() { ctx_.TryCancel(); }

  std::vector<double> latencies;

 private:
  void send_locked() {
    if (writing_ || closing_) return;
    if (sh_.phase.load(std::memory_order_acquire) == 2) to_send_ = 0;
    if (to_send_ > 0) {
      --to_send_;
      const std::uint64_t id = ++seq_;
      req_.set_id(std::to_string(id));
      sent_.emplace_back(id, Clock::now());
      writing_ = true;
      StartWrite(&req_);
    } else if (sent_.empty()) {
      closing_ = true;
      StartWritesDone();
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;  // the stream is gone; OnDone tells why
      return;
    }
    send_locked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const auto t1 = Clock::now();
    const int phase = sh_.phase.load(std::memory_order_acquire);
    const auto& r = resp_.infer_response();
    std::optional<Clock::time_point> t0;
    {
      std::lock_guard lock(mu_);
      for (auto it = sent_.begin(); it != sent_.end(); ++it) {
        if (std::to_string(it->first) == r.id()) {
          t0 = it->second;
          sent_.erase(it);
          break;
        }
      }
    }
    if (!t0) {
      sh_.error("ModelStreamInfer: response with unknown id '" + r.id() + "'" +
                (resp_.error_message().empty() ? "" : ": " + resp_.error_message()));
    } else if (!resp_.error_message().empty()) {
      sh_.error("ModelStreamInfer: " + resp_.error_message());
    } else if (auto bad = check_response(r, model_); !bad.empty()) {
      sh_.error("ModelStreamInfer: " + bad);
    } else if (phase == 1) {
      latencies.push_back(micros(*t0, t1));
    }
    {
      std::lock_guard lock(mu_);
      if (t0) ++to_send_;
      if (!broken_) send_locked();
    }
    resp_.Clear();
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& s) override {
    bool early;
    {
      std::lock_guard lock(mu_);
      early = !closing_ || !sent_.empty();
    }
    if (!s.ok()) {
      sh_.error("ModelStreamInfer ended: " + std::to_string(s.error_code()) + " " +
                s.error_message());
    } else if (early) {
      sh_.error("ModelStreamInfer ended by the server with requests unanswered");
    }
    sh_.finish();
  }

  Shared& sh_;
  GRPCInferenceService::Stub& stub_;
  ModelInferRequest req_;
  std::string model_;
  const int inflight_;
  grpc::ClientContext ctx_;
  ModelStreamInferResponse resp_;
  std::mutex mu_;
  bool writing_ = false;
  bool closing_ = false;
  bool broken_ = false;
  int to_send_ = 0;
  std::uint64_t seq_ = 0;
  std::vector<std::pair<std::uint64_t, Clock::time_point>> sent_;
};

// ---- CPU accounting -----------------------------------------------------------------------------

double self_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/// utime + stime of a process from /proc/<pid>/stat, in seconds; nullopt when unreadable.
std::optional<double> proc_cpu_s(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::stringstream in(text.substr(close + 2));
  std::string field;
  double ut = 0, st = 0;
  // After the command: state is field 3; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) ut = std::stod(field);
    if (i == 15) st = std::stod(field);
  }
  if (!in) return std::nullopt;
  return (ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

/// The inputs from ModelMetadata: variable dimensions (-1) become 1.
std::vector<InputSpec> inputs_from_metadata(GRPCInferenceService::Stub& stub, const Options& o) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<long>(o.connect_timeout_s * 1000)));
  inference::ModelMetadataRequest req;
  req.set_name(o.model);
  req.set_version(o.model_version);
  inference::ModelMetadataResponse resp;
  const auto s = stub.ModelMetadata(&ctx, req, &resp);
  if (!s.ok()) {
    throw std::runtime_error("ModelMetadata of '" + o.model + "': " + s.error_message() +
                             " (or give the inputs with --input)");
  }
  std::vector<InputSpec> out;
  for (const auto& t : resp.inputs()) {
    InputSpec s2{t.name(), t.datatype(), {}};
    if (element_size(s2.datatype) == 0) {
      throw std::runtime_error("input '" + t.name() + "' has datatype " + t.datatype() +
                               ", which this bench cannot fill");
    }
    for (auto d : t.shape()) s2.shape.push_back(d < 0 ? 1 : d);
    out.push_back(std::move(s2));
  }
  if (out.empty()) throw std::runtime_error("ModelMetadata of '" + o.model + "' lists no inputs");
  return out;
}

int run(const Options& o) {
  const int nchan = o.connections > 0 ? o.connections : o.concurrency;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<GRPCInferenceService::Stub>> stubs;
  for (int i = 0; i < nchan; ++i) {
    grpc::ChannelArguments args;
    // A distinct argument per channel: gRPC shares a subchannel (a connection) between channels
    // whose arguments are equal; these must not share.
    args.SetInt("asyncinfer.bench_channel", i);
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    channels.push_back(
        grpc::CreateCustomChannel(o.address, grpc::InsecureChannelCredentials(), args));
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<long>(o.connect_timeout_s * 1000));
    if (!channels.back()->WaitForConnected(deadline)) {
      std::fprintf(stderr, "bench_grpc_stream: cannot connect to %s (channel %d) within %g s\n",
                   o.address.c_str(), i, o.connect_timeout_s);
      return 2;
    }
    stubs.push_back(GRPCInferenceService::NewStub(channels.back()));
  }

  std::vector<InputSpec> inputs;
  for (const auto& t : o.inputs) inputs.push_back(parse_input(t));
  if (inputs.empty()) inputs = inputs_from_metadata(*stubs[0], o);

  ModelInferRequest req;
  req.set_model_name(o.model);
  req.set_model_version(o.model_version);
  std::string described;
  for (const auto& in : inputs) {
    auto* t = req.add_inputs();
    t->set_name(in.name);
    t->set_datatype(in.datatype);
    std::string dims;
    for (auto d : in.shape) {
      t->add_shape(d);
      dims += (dims.empty() ? "" : "x") + std::to_string(d);
    }
    req.add_raw_input_contents(make_contents(in));
    described += (described.empty() ? "" : ", ") + in.name + ":" + in.datatype + ":" + dims;
  }

  Shared sh;
  std::vector<std::unique_ptr<UnarySlot>> unary;
  std::vector<std::unique_ptr<StreamSlot>> streams;
  int slots = 0;
  if (o.mode == "unary") {
    for (int c = 0; c < o.concurrency; ++c) {
      for (int k = 0; k < o.inflight; ++k) {
        unary.push_back(std::make_unique<UnarySlot>(sh, *stubs[c % nchan], req, o.model));
      }
    }
    slots = static_cast<int>(unary.size());
  } else {
    for (int c = 0; c < o.concurrency; ++c) {
      streams.push_back(
          std::make_unique<StreamSlot>(sh, *stubs[c % nchan], req, o.model, o.inflight));
    }
    slots = static_cast<int>(streams.size());
  }
  std::printf(
      "bench_grpc_stream: %s %s, model %s, inputs %s; %d %s on %d connections, %d in "
      "flight each; warm-up %g s, measured %g s\n",
      o.address.c_str(), o.mode.c_str(), o.model.c_str(), described.c_str(), o.concurrency,
      o.mode == "unary" ? "clients" : "streams", nchan, o.inflight, o.warmup_s, o.duration_s);
  std::fflush(stdout);

  for (auto& u : unary) u->start();
  for (auto& s : streams) s->start();

  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_s));
  const auto server0 = o.server_pid ? proc_cpu_s(o.server_pid) : std::nullopt;
  const double cpu0 = self_cpu_s();
  const auto t0 = Clock::now();
  sh.phase.store(1, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
  sh.phase.store(2, std::memory_order_release);
  const auto t1 = Clock::now();
  const double cpu1 = self_cpu_s();
  const auto server1 = o.server_pid ? proc_cpu_s(o.server_pid) : std::nullopt;

  // Drain: every slot finishes its outstanding requests (streams close with WritesDone).
  {
    std::unique_lock lock(sh.mu);
    if (!sh.cv.wait_for(lock, std::chrono::seconds(10), [&] { return sh.finished == slots; })) {
      lock.unlock();
      sh.error("drain: " + std::to_string(slots - sh.finished) +
               " clients did not finish within 10 s of the end; cancelled");
      for (auto& s : streams) s->cancel();
      lock.lock();
      if (!sh.cv.wait_for(lock, std::chrono::seconds(10), [&] { return sh.finished == slots; })) {
        std::fprintf(stderr, "bench_grpc_stream: clients still pending after cancel\n");
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }

  std::vector<double> lat;
  for (auto& u : unary) lat.insert(lat.end(), u->latencies.begin(), u->latencies.end());
  for (auto& s : streams) lat.insert(lat.end(), s->latencies.begin(), s->latencies.end());
  std::sort(lat.begin(), lat.end());
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  const double rps = static_cast<double>(lat.size()) / secs;
  std::printf("requests        %zu ok in %.3f s\n", lat.size(), secs);
  std::printf("throughput      %.1f req/s\n", rps);
  std::printf("latency us      p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", percentile(lat, 50),
              percentile(lat, 90), percentile(lat, 99), lat.empty() ? 0.0 : lat.back());
  const double ccpu = cpu1 - cpu0;
  std::printf("client cpu      %.3f s (%.1f us/request)\n", ccpu,
              lat.empty() ? 0.0 : ccpu / static_cast<double>(lat.size()) * 1e6);
  if (o.server_pid) {
    if (server0 && server1) {
      const double scpu = *server1 - *server0;
      std::printf("server cpu      %.3f s (%.1f us/request), pid %d\n", scpu,
                  lat.empty() ? 0.0 : scpu / static_cast<double>(lat.size()) * 1e6, o.server_pid);
    } else {
      std::printf("server cpu      unreadable (/proc/%d/stat)\n", o.server_pid);
    }
  }
  std::printf("errors          %llu (%llu in the measured window)\n",
              static_cast<unsigned long long>(sh.errors.load()),
              static_cast<unsigned long long>(sh.measured_errors.load()));
  for (const auto& e : sh.first_errors) std::printf("  error: %s\n", e.c_str());
  std::fflush(stdout);
  return sh.errors.load() == 0 && !lat.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Closed-loop gRPC load generator: ModelInfer on N channels, or N ModelStreamInfer "
      "streams, against an Open Inference Protocol server"};
  app.add_option("--address,-a", o.address, "Server address, host:port (e.g. 127.0.0.1:8001)")
      ->required();
  app.add_option("--model,-m", o.model, "Model name")->required();
  app.add_option("--model-version", o.model_version, "Model version (empty: the server's choice)");
  app.add_option("--mode", o.mode,
                 "unary: ModelInfer, one channel per client; stream: ModelStreamInfer streams")
      ->required()
      ->check(CLI::IsMember({"unary", "stream"}));
  app.add_option("--concurrency,-c", o.concurrency, "Clients (unary) or streams (stream)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--connections", o.connections,
                 "Channels (connections) the clients or streams are spread over (default: one "
                 "each)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--inflight,-k", o.inflight,
                 "Requests in flight per client or stream (closed loop)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--duration-s,-t", o.duration_s, "Measured seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup-s", o.warmup_s, "Warm-up seconds (not measured)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--connect-timeout-s", o.connect_timeout_s,
                 "Seconds to wait for each connection and for ModelMetadata")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--input,-i", o.inputs,
                 "An input as NAME:DATATYPE:DIMS, e.g. input0:FP32:1x16 (repeat for several; "
                 "default: the model's inputs from ModelMetadata, variable dimensions as 1)")
      ->each([](const std::string& s) { parse_input(s); });
  app.add_option("--server-pid", o.server_pid,
                 "The server's process id: report its CPU time (/proc/<pid>/stat) over the "
                 "measured window")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.connections > o.concurrency) {
    return app.exit(CLI::ValidationError(
        "--connections", std::to_string(o.connections) + " exceeds --concurrency " +
                             std::to_string(o.concurrency) + ": a connection would carry nothing"));
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grpc_stream: %s\n", e.what());
    return 2;
  }
}
