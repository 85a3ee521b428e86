// http_bench.cpp — `asyncinfer bench --url http://HOST:PORT/v2/models/M[/versions/V]/infer`:
// the load generator's HTTP mode, against `asyncinfer serve` or any Open Inference Protocol
// server (Triton, KServe).
//
// It reads the model's metadata (GET on the URL without /infer), builds one request from it
// (--batch-rows rows, random data, JSON or with --binary Triton's binary tensor extension for
// inputs and outputs), then drives it with the bench's modes: async = closed loop, --concurrency
// connections each with one request in flight; rate = open loop at --request-rate (Poisson or
// constant arrivals) over --concurrency connections, latency measured from the intended send
// time (so a stalled server is not hidden by a stalled generator). Keep-alive throughout; one I/O
// thread (Boost.Beast), so the generator takes one core.
#if ASYNCINFER_HAVE_SERVER
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "http_bench.hpp"
#include "stats.hpp"

namespace asyncinfer::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct Url {
  std::string host;
  std::string port;
  std::string path;
};

bool parse_url(const std::string& url, Url& out) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return false;
  const std::size_t slash = url.find('/', scheme.size());
  const std::string hostport = url.substr(scheme.size(), slash - scheme.size());
  out.path = slash == std::string::npos ? "/" : url.substr(slash);
  const std::size_t colon = hostport.rfind(':');
  out.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  out.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  return !out.host.empty();
}

std::size_t datatype_size(const std::string& dt) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1},   {"UINT8", 1}, {"INT8", 1},   {"UINT16", 2}, {"INT16", 2},
      {"FP16", 2},   {"BF16", 2},  {"UINT32", 4}, {"INT32", 4},  {"FP32", 4},
      {"UINT64", 8}, {"INT64", 8}, {"FP64", 8}};
  auto it = sizes.find(dt);
  return it == sizes.end() ? 0 : it->second;
}

/// One request body built from the model's metadata.
struct Body {
  std::string bytes;
  std::size_t json_size = 0;  ///< Inference-Header-Content-Length (binary only)
  std::string describe;
};

int fail(const std::string& what) {
  std::fprintf(stderr, "asyncinfer bench: error: --url: %s\n", what.c_str());
  return kExitUsage;
}

std::optional<Body> build_body(const json& meta, std::int64_t rows, bool binary, std::uint64_t seed,
                               std::string* error) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uf(0.f, 1.f);
  json request = {{"inputs", json::array()}};
  std::string raw;
  Body body;
  for (const json& in : meta.at("inputs")) {
    const std::string name = in.at("name");
    const std::string dt = in.at("datatype");
    std::vector<std::int64_t> shape = in.at("shape");
    std::size_t n = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] < 0) {
        if (i != 0) {
          *error = "input '" + name + "' has a variable dim " + std::to_string(i) +
                   "; the HTTP mode fills only the batch dim (--batch-rows)";
          return std::nullopt;
        }
        shape[i] = rows;
      }
      n *= static_cast<std::size_t>(shape[i]);
    }
    const std::size_t size = datatype_size(dt);
    if (size == 0) {
      *error = "input '" + name + "' has datatype " + dt + ", which the HTTP mode cannot fill";
      return std::nullopt;
    }
    json t = {{"name", name}, {"shape", shape}, {"datatype", dt}};
    if (binary) {
      std::string bytes(n * size, '\0');
      for (std::size_t i = 0; i < n; ++i) {
        if (dt == "FP32") {
          const float v = uf(rng);
          std::memcpy(bytes.data() + i * 4, &v, 4);
        } else {
          bytes[i * size] = static_cast<char>(rng() % 2);  // small values; 0/1 for BOOL
        }
      }
      t["parameters"] = {{"binary_data_size", bytes.size()}};
      raw += bytes;
    } else {
      if (dt == "FP16" || dt == "BF16") {
        *error = "input '" + name + "' is " + dt + ", which has no JSON form; add --binary";
        return std::nullopt;
      }
      json data = json::array();
      for (std::size_t i = 0; i < n; ++i) {
        if (dt == "FP32" || dt == "FP64") {
          data.push_back(uf(rng));
        } else if (dt == "BOOL") {
          data.push_back(rng() % 2 == 1);
        } else {
          data.push_back(static_cast<int>(rng() % 2));
        }
      }
      t["data"] = std::move(data);
    }
    request["inputs"].push_back(std::move(t));
    body.describe += (body.describe.empty() ? "" : ", ") + name + " " + dt + json(shape).dump();
  }
  if (binary) request["parameters"] = {{"binary_data_output", true}};
  body.bytes = request.dump();
  body.json_size = body.bytes.size();
  body.bytes += raw;
  body.describe += binary ? " (binary)" : " (JSON)";
  return body;
}

struct Shared {
  net::io_context ioc{1};
  Url url;
  http::request<http::string_body> request;
  bool open_loop = false;
  Clock::time_point start, measure_from, stop_at;
  std::int64_t max_requests = 0;  ///< measured requests (0 = until stop_at)
  std::int64_t sent = 0;
  std::vector<double> latencies_us;
  std::map<int, std::uint64_t> errors;  ///< status (0 = transport) → count
  std::uint64_t measured_ok = 0;
  Clock::time_point last_done;
  std::deque<Clock::time_point> backlog;  ///< open loop: arrivals waiting for a connection
  bool stopping = false;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Shared& s, const tcp::resolver::results_type& endpoints)
      : s_(s), socket_(s.ioc), endpoints_(endpoints) {}

  bool connect() {
    beast::error_code ec;
    net::connect(socket_, endpoints_, ec);
    if (ec) return false;
    socket_.set_option(tcp::no_delay(true), ec);
    return true;
  }
  bool idle() const { return !busy_; }

  /// Sends one request whose latency counts from `intended`.
  void send(Clock::time_point intended) {
    busy_ = true;
    intended_ = intended;
    http::async_write(socket_, s_.request,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec) return self->done(0);
                        self->read();
                      });
  }

  std::function<void(Connection&)> on_idle;

 private:
  void read() {
    response_.emplace();
    response_->body_limit(1ull << 32);
    http::async_read(socket_, buffer_, *response_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->done(ec ? 0 : self->response_->get().result_int());
                     });
  }

  void done(unsigned status) {
    const Clock::time_point now = Clock::now();
    busy_ = false;
    if (intended_ >= s_.measure_from && (s_.max_requests == 0 ? now <= s_.stop_at : true)) {
      if (status == 200) {
        s_.latencies_us.push_back(
            std::chrono::duration<double, std::micro>(now - intended_).count());
        ++s_.measured_ok;
        s_.last_done = now;
      } else {
        ++s_.errors[static_cast<int>(status)];
      }
    }
    if (status == 0) {  // the connection broke: reconnect
      beast::error_code ec;
      socket_.close(ec);
      socket_ = tcp::socket(s_.ioc);
      buffer_.clear();
      if (!connect()) {
        s_.stopping = true;
        return;
      }
    }
    if (on_idle) on_idle(*this);
  }

  Shared& s_;
  tcp::socket socket_;
  tcp::resolver::results_type endpoints_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> response_;
  Clock::time_point intended_;
  bool busy_ = false;
};

}  // namespace

std::shared_ptr<HttpBenchArgs> add_http_bench_options(CLI::App& bench) {
  auto h = std::make_shared<HttpBenchArgs>();
  bench.add_option("--url", h->url,
                   "HTTP mode: an Open Inference Protocol endpoint, "
                   "http://HOST:PORT/v2/models/M[/versions/V]/infer (asyncinfer serve, Triton); "
                   "modes async (closed loop) and rate (open loop), --concurrency connections");
  bench.add_flag("--binary", h->binary,
                 "HTTP mode: inputs and outputs as binary tensor data (Triton's extension)");
  return h;
}

int run_http_bench(const BenchOptions& o, const HttpBenchArgs& h) {
  Shared s;
  if (!parse_url(h.url, s.url) || s.url.path.size() < 7 ||
      s.url.path.compare(s.url.path.size() - 6, 6, "/infer") != 0) {
    return fail("'" + h.url + "' is not http://HOST:PORT/v2/models/MODEL[/versions/V]/infer");
  }
  const bool open_loop = o.mode == Mode::rate;
  if (o.mode != Mode::async && !open_loop) {
    return fail("the HTTP mode runs --mode async (closed loop) or rate (open loop), not '" +
                std::string(to_string(o.mode)) + "'");
  }
  if (open_loop && o.request_rate.size() != 1) return fail("--mode rate needs one --request-rate");
  if (o.concurrency.size() != 1) return fail("one --concurrency (connections) value");
  const int connections = open_loop && !o.concurrency_given ? 64 : o.concurrency[0];
  tcp::resolver resolver(s.ioc);
  beast::error_code ec;
  const auto endpoints = resolver.resolve(s.url.host, s.url.port, ec);
  if (ec) return fail("cannot resolve " + s.url.host + ": " + ec.message());

  // The model's metadata, then one request built from it and tried once.
  json meta;
  {
    tcp::socket sock(s.ioc);
    net::connect(sock, endpoints, ec);
    if (ec) return fail("cannot connect to " + s.url.host + ":" + s.url.port + ": " + ec.message());
    http::request<http::empty_body> get{http::verb::get,
                                        s.url.path.substr(0, s.url.path.size() - 6), 11};
    get.set(http::field::host, s.url.host);
    http::write(sock, get, ec);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    if (!ec) http::read(sock, buf, res, ec);
    if (ec) return fail("metadata: " + ec.message());
    if (res.result_int() != 200) {
      return fail("metadata " + std::string(get.target()) + ": HTTP " +
                  std::to_string(res.result_int()) + " " + res.body());
    }
    meta = json::parse(res.body(), nullptr, false);
    if (meta.is_discarded() || !meta.contains("inputs")) return fail("metadata is not OIP JSON");
  }
  std::string error;
  auto body = build_body(meta, o.batch_rows, h.binary, o.seed, &error);
  if (!body) return fail(error);
  s.request = {http::verb::post, s.url.path, 11};
  s.request.set(http::field::host, s.url.host);
  s.request.set(http::field::content_type,
                h.binary ? "application/octet-stream" : "application/json");
  if (h.binary) s.request.set("Inference-Header-Content-Length", std::to_string(body->json_size));
  s.request.body() = body->bytes;
  s.request.keep_alive(true);
  s.request.prepare_payload();

  std::vector<std::shared_ptr<Connection>> conns;
  for (int i = 0; i < connections; ++i) {
    auto c = std::make_shared<Connection>(s, endpoints);
    if (!c->connect()) return fail("cannot open connection " + std::to_string(i + 1));
    conns.push_back(std::move(c));
  }

  const double warmup_s = o.warmup_s > 0 ? o.warmup_s : (o.warmup > 0 ? 0.0 : 0.5);
  const double duration_s = o.duration_s > 0 ? o.duration_s : (o.requests > 0 ? 0.0 : 5.0);
  s.start = Clock::now();
  s.measure_from = s.start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(warmup_s));
  s.stop_at = duration_s > 0 ? s.measure_from + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(duration_s))
                             : Clock::time_point::max();
  s.max_requests = o.requests;
  s.open_loop = open_loop;
  auto finished = [&s] {
    if (s.stopping) return true;
    if (s.max_requests > 0) return static_cast<std::int64_t>(s.measured_ok) >= s.max_requests;
    return Clock::now() >= s.stop_at;
  };

  // Open loop state; outlives the run below.
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(open_loop ? o.request_rate[0] : 1.0);
  net::steady_timer timer(s.ioc);
  Clock::time_point next = s.start;
  std::function<void()> arrive;
  if (!open_loop) {
    for (auto& c : conns) {
      c->on_idle = [&s, finished](Connection& self) {
        if (!finished()) self.send(Clock::now());
      };
      c->send(Clock::now());
    }
  } else {
    // Arrivals on a timer; each goes to an idle connection or waits in the backlog.
    const double rate = o.request_rate[0];
    for (auto& c : conns) {
      c->on_idle = [&s, finished](Connection& self) {
        if (finished()) {
          s.backlog.clear();
          return;
        }
        if (!s.backlog.empty()) {
          const Clock::time_point t = s.backlog.front();
          s.backlog.pop_front();
          self.send(t);
        }
      };
    }
    arrive = [&, rate]() {
      if (finished()) return;
      const Clock::time_point t = next;
      bool sent = false;
      for (auto& c : conns) {
        if (c->idle()) {
          c->send(t);
          sent = true;
          break;
        }
      }
      if (!sent) s.backlog.push_back(t);
      const double g = o.arrivals == Arrivals::constant ? 1.0 / rate : gap(rng);
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(g));
      timer.expires_at(next);
      timer.async_wait([&arrive](beast::error_code wec) {
        if (!wec) arrive();
      });
    };
    arrive();
  }
  s.ioc.run();

  const Clock::time_point end =
      s.max_requests > 0 ? s.last_done : std::min(s.stop_at, Clock::now());
  const double seconds = std::chrono::duration<double>(end - s.measure_from).count();
  LatencySummary sum = summarize(s.latencies_us);
  auto us = [](const std::optional<double>& v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v.value_or(0));
    return std::string(b);
  };
  std::printf("http %s %s, %s\n", open_loop ? "rate" : "closed loop", h.url.c_str(),
              body->describe.c_str());
  char loop[96];
  std::snprintf(loop, sizeof loop, " (open loop at %g/s, %s arrivals)",
                open_loop ? o.request_rate[0] : 0.0,
                o.arrivals == Arrivals::constant ? "constant" : "poisson");
  std::printf("  connections      %d%s\n", connections,
              open_loop ? loop : " (one request in flight each)");
  std::printf("  throughput       %.1f req/s (%llu ok in %.2f s)\n",
              seconds > 0 ? static_cast<double>(s.measured_ok) / seconds : 0.0,
              static_cast<unsigned long long>(s.measured_ok), seconds);
  std::printf("  latency us       p50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n", us(sum.p50).c_str(),
              us(sum.p90).c_str(), us(sum.p99).c_str(), us(sum.p999).c_str(), us(sum.max).c_str());
  std::uint64_t failed = 0;
  for (const auto& [status, n] : s.errors) {
    std::printf("  failures         %s %llu\n",
                status == 0 ? "transport" : ("HTTP " + std::to_string(status)).c_str(),
                static_cast<unsigned long long>(n));
    failed += n;
  }
  if (s.measured_ok == 0) {
    std::fprintf(stderr, "asyncinfer bench: no request succeeded\n");
    return kExitRunFailed;
  }
  return o.fail_on_error && failed > 0 ? kExitRunFailed : kExitOk;
}

}  // namespace asyncinfer::cli
#else
#include "http_bench.hpp"

namespace asyncinfer::cli {
std::shared_ptr<HttpBenchArgs> add_http_bench_options(CLI::App& bench) {
  auto h = std::make_shared<HttpBenchArgs>();
  bench.add_option("--url", h->url, "HTTP mode (not built: needs Boost, see scripts/setup.sh)");
  bench.add_flag("--binary", h->binary, "HTTP mode: binary tensor data");
  return h;
}
int run_http_bench(const BenchOptions&, const HttpBenchArgs&) {
  std::fprintf(stderr, "asyncinfer bench: --url: not built (needs Boost; see scripts/setup.sh)\n");
  return kExitRunFailed;
}
}  // namespace asyncinfer::cli
#endif
