// The routing of the HTTP frontend (Session's handling, http_server_impl.hpp): the Open Inference
// Protocol's endpoints (/v2, health, model metadata and readiness, Triton's repository index,
// inference) on the API port and /metrics on the metrics port; an inference request is decoded
// (oip_json.hpp), submitted to its engine, and its completion posted back to the session's I/O
// thread.
#include <charconv>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http_compression.hpp"
#include "http_server_impl.hpp"
#include "server_log.hpp"
#include "trace.hpp"

namespace asyncinfer::server {
namespace {

/// Percent-decodes one path segment ("my%20model" → "my model"); false for a bad escape.
bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    unsigned v = 0;
    auto [p, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, v, 16);
    if (ec != std::errc() || p != in.data() + i + 3) return false;
    out += static_cast<char>(v);
    i += 2;
  }
  return true;
}

/// A body (or a response) of this size or more is decoded (encoded) on the codec pool rather
/// than on an I/O thread, so that a large one never holds up the health probes and the other
/// connections of that thread (issue 23: probes answer within 50 ms under any such load).
constexpr std::size_t kCodecInlineBytes = 64 * 1024;
/// A response body of this size or more is compressed on the codec pool (zlib's fastest level
/// takes roughly 50 µs per 16 KiB here).
constexpr std::size_t kCompressInlineBytes = 16 * 1024;

/// The path of a request target: an absolute-form target ("http://host:port/v2/...", RFC 9112
/// §3.2.2, which a server must accept) loses its scheme and authority, any target its query.
std::string_view target_path(std::string_view target) {
  if (target.size() > 0 && target[0] != '/') {
    const std::size_t scheme = target.find("://");
    if (scheme != std::string_view::npos) {
      const std::size_t path = target.find('/', scheme + 3);
      target = path == std::string_view::npos ? std::string_view("/") : target.substr(path);
    }
  }
  return target.substr(0, target.find('?'));
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  std::size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    const std::size_t j = path.find('/', i);
    const std::size_t end = j == std::string_view::npos ? path.size() : j;
    if (end > i) parts.push_back(path.substr(i, end - i));
    i = end;
  }
  return parts;
}

}  // namespace

// ---- handling --------------------------------------------------------------------------------

void Session::on_request() {
  clear_deadline();
  request_read_at_ = Clock::now();
  request_ = parser_->release();
  parser_.reset();
  // RFC 9112 §6.1: chunked framing in HTTP/1.0 may be faulty: answer, then close.
  keep_alive_ = request_.keep_alive() &&
                !(request_.version() < 11 && request_.count(http::field::transfer_encoding) > 0);
  version_ = request_.version();
  method_ = request_.method();
  request_kind_ = RequestKind::other;
  if (kind_ == Kind::metrics) return handle_metrics();
  handle_api();
}

void Session::handle_metrics() {
  const std::string_view target = target_path(request_.target());
  if (target != "/metrics")
    return respond_error(404, "not found: the metrics port serves /metrics");
  if (method_ != http::verb::get && method_ != http::verb::head) return respond_method("GET");
  respond(200, impl_.core.metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
}

namespace {

/// The API category of an API path (split; p[0] is "v2") for --http-restricted-api; nullopt
/// for a path that is none (answered 404).
std::optional<ApiCategory> category_of(const std::vector<std::string_view>& p) {
  if (p.size() == 1) return ApiCategory::metadata;
  const std::string_view top = p[1];
  if (top == "health") return ApiCategory::health;
  if (top == "repository") return ApiCategory::model_repository;
  if (top == "systemsharedmemory" || top == "cudasharedmemory") return ApiCategory::shared_memory;
  if (top == "logging") return ApiCategory::logging;
  if (top == "trace") return ApiCategory::trace;
  if (top != "models") return std::nullopt;
  if (p.size() == 3 && p[2] == "stats") return ApiCategory::statistics;
  const std::size_t next = p.size() >= 5 && p[3] == "versions" ? 5 : 3;
  if (next >= p.size()) return ApiCategory::metadata;
  const std::string_view action = p[next];
  if (action == "ready") return ApiCategory::health;
  if (action == "stats") return ApiCategory::statistics;
  if (action == "config") return ApiCategory::model_config;
  if (action == "trace") return ApiCategory::trace;
  if (action == "infer" || action == "generate" || action == "generate_stream") {
    return ApiCategory::inference;
  }
  return std::nullopt;
}

}  // namespace

void Session::handle_api() {
  const std::string_view target = target_path(request_.target());
  const std::vector<std::string_view> p = split_path(target);
  // HEAD is answered as GET without the body (RFC 9110 §9.3.2).
  const http::verb method = method_ == http::verb::head ? http::verb::get : method_;
  auto is = [&](std::size_t n, std::initializer_list<std::string_view> fixed) {
    if (p.size() != n) return false;
    std::size_t i = 0;
    for (std::string_view f : fixed) {
      if (!f.empty() && p[i] != f) return false;
      ++i;
    }
    return true;
  };
  auto need = [&](http::verb v) {
    if (method == v) return true;
    respond_method(v == http::verb::get ? "GET" : "POST");
    return false;
  };
  if (p.empty() || p[0] != "v2") return not_found(target);
  if (!impl_.opt.restricted.empty()) {
    const std::optional<ApiCategory> category = category_of(p);
    const ApiRestriction* r = category ? impl_.opt.restricted.find(*category) : nullptr;
    if (r != nullptr) {
      auto header = request_.find(r->key);
      const std::string_view got =
          header == request_.end() ? std::string_view() : std::string_view(header->value());
      if (!restriction_met(*r, header == request_.end() ? nullptr : &got)) {
        return respond_error(403, "This API is restricted, expecting header '" + r->key + "'");
      }
    }
  }
  if (p.size() == 1) {
    if (need(http::verb::get)) respond(200, server_metadata_json(impl_.core));
    return;
  }
  if (is(3, {"v2", "health", "live"})) {
    if (!need(http::verb::get)) return;
    if (impl_.core.live()) return respond(200, "", "");
    return respond_error(503, "server is not live");
  }
  if (is(3, {"v2", "health", "ready"})) {
    if (!need(http::verb::get)) return;
    if (impl_.core.ready()) return respond(200, "", "");
    return respond_error(503, impl_.core.unready_reason());
  }
  if (is(3, {"v2", "repository", "index"})) {
    if (!need(http::verb::post)) return;
    auto ready_only = parse_index_request(request_.body(), impl_.opt.max_json_depth);
    if (!ready_only.ok()) return respond_status(ready_only.status());
    return respond(200, repository_index_json(impl_.core.repository(), *ready_only));
  }
  // /v2/repository/models/{m}/load and /unload (Triton's repository extension).
  if (p.size() == 5 && p[1] == "repository" && p[2] == "models" &&
      (p[4] == "load" || p[4] == "unload")) {
    if (!need(http::verb::post)) return;
    std::string model;
    if (!percent_decode(p[3], model)) return respond_error(400, "bad percent-escape in model name");
    return handle_repository(model, p[4] == "load");
  }
  if (is(2, {"v2", "logging"})) {  // Triton's logging extension (server_log.hpp)
    if (method == http::verb::get) {
      return respond(200, log_settings_json(impl_.core.log().settings()));
    }
    if (method != http::verb::post) return respond_method("GET, POST");
    auto changes = parse_log_settings_request(request_.body(), impl_.opt.max_json_depth);
    if (!changes.ok()) return respond_status(changes.status());
    auto settings = impl_.core.log().update(*changes);
    if (!settings.ok()) return respond_status(settings.status());
    return respond(200, log_settings_json(*settings));
  }
  if (is(3, {"v2", "trace", "setting"})) return handle_trace_setting("");
  if (p.size() == 5 && p[1] == "models" && p[3] == "trace" && p[4] == "setting") {
    std::string model;
    if (!percent_decode(p[2], model)) return respond_error(400, "bad percent-escape in model name");
    return handle_trace_setting(model);
  }
  if (p[1] == "systemsharedmemory" || p[1] == "cudasharedmemory") {
    return handle_shared_memory(p, p[1] == "cudasharedmemory", method);
  }
  if (p.size() < 3 || p[1] != "models") return not_found(target);
  if (p.size() == 3 && p[2] == "stats") {  // every model's (Triton: as for a model "stats")
    if (!need(http::verb::get)) return;
    auto versions = impl_.core.stats_versions("", "");
    if (!versions.ok()) return respond_status(versions.status());
    return respond(200, model_statistics_json(*versions));
  }
  // /v2/models/{m}[/versions/{v}][/ready|/infer|/config]
  std::string model;
  std::string version;
  if (!percent_decode(p[2], model)) return respond_error(400, "bad percent-escape in model name");
  std::size_t next = 3;
  if (p.size() >= 5 && p[3] == "versions") {
    if (!percent_decode(p[4], version)) return respond_error(400, "bad percent-escape in version");
    next = 5;
  } else if (p.size() == 4 && p[3] == "versions") {
    return not_found(target);
  }
  std::string_view action = next < p.size() ? p[next] : std::string_view();
  if (next + (action.empty() ? 0 : 1) != p.size()) return not_found(target);

  if (action.empty()) {
    if (!need(http::verb::get)) return;
    auto mv = impl_.core.find(model, version);
    if (!mv.ok()) return respond_status(mv.status());
    // The model of the version found (its namespace's), not the name looked up again.
    auto sm = impl_.core.model_of(**mv);
    if (sm == nullptr) return respond_error(404, "unknown model '" + model + "'");
    return respond(200, model_metadata_json(*sm, **mv, version.empty() ? nullptr : mv->get()));
  }
  if (action == "ready") {
    if (!need(http::verb::get)) return;
    auto mv = impl_.core.find(model, version);
    if (mv.ok()) return respond(200, "", "");
    // Triton: a known model that is not ready answers 400.
    const int status =
        mv.status().code() == StatusCode::unavailable ? 400 : http_status(mv.status().code());
    return respond_error(status, mv.status().message());
  }
  if (action == "stats") {
    if (!need(http::verb::get)) return;
    auto versions = impl_.core.stats_versions(model, version);
    if (!versions.ok()) return respond_status(versions.status());
    return respond(200, model_statistics_json(*versions));
  }
  if (action == "config") {
    if (!need(http::verb::get)) return;
    auto mv = impl_.core.find(model, version);
    if (!mv.ok()) return respond_status(mv.status());
    return respond(200, (*mv)->config_json);
  }
  if (action == "infer") {
    if (!need(http::verb::post)) return;
    return handle_infer(model, version);
  }
  if (action == "generate" || action == "generate_stream") {
    if (!need(http::verb::post)) return;
    return handle_generate(model, version, action == "generate_stream");
  }
  not_found(target);
}

void Session::handle_shared_memory(const std::vector<std::string_view>& p, bool cuda,
                                   http::verb method) {
  // /v2/systemsharedmemory[/region/{r}]/{status,register,unregister} (Triton's extension).
  std::string region;
  std::string_view action;
  if (p.size() == 3) {
    action = p[2];
    if (action == "register") return not_found(request_.target());  // needs a region
  } else if (p.size() == 5 && p[2] == "region") {
    if (!percent_decode(p[3], region)) return respond_error(400, "bad percent-escape in region");
    action = p[4];
  } else {
    return not_found(request_.target());
  }
  if (action != "status" && action != "register" && action != "unregister") {
    return not_found(request_.target());
  }
  const http::verb want = action == "status" ? http::verb::get : http::verb::post;
  if (method != want) return respond_method(want == http::verb::get ? "GET" : "POST");
  if (cuda) {
    // No CUDA regions here (the extension is not listed): there is nothing to show or
    // unregister, and registering one is not supported.
    if (action == "status") {
      if (!region.empty()) {
        return respond_error(400, "no CUDA shared memory region '" + region + "' is registered");
      }
      return respond(200, "[]");
    }
    if (action == "unregister") return respond(200, "", "");
    return respond_error(501,
                         "CUDA shared memory is not supported by this server; use system "
                         "shared memory (/v2/systemsharedmemory)");
  }
  SharedMemoryManager& shm = impl_.core.shared_memory();
  if (action == "status") {
    auto regions = shm.status(region);
    if (!regions.ok()) return respond_status(regions.status());
    return respond(200, shared_memory_status_json(*regions));
  }
  if (action == "unregister") {
    shm.unregister(region);
    return respond(200, "", "");
  }
  auto call = parse_shared_memory_register(request_.body(), impl_.opt.max_json_depth);
  if (!call.ok()) return respond_status(call.status());
  Status s = shm.register_region(region, call->key, call->offset, call->byte_size);
  if (!s.ok()) return respond_status(s);
  respond(200, "", "");
}

void Session::handle_trace_setting(const std::string& model) {
  // Triton's trace extension (trace.hpp): a model's settings need the model to be ready.
  const http::verb method = method_ == http::verb::head ? http::verb::get : method_;
  if (method != http::verb::get && method != http::verb::post) return respond_method("GET, POST");
  if (!model.empty()) {
    if (Status s = impl_.core.check_trace_model(model); !s.ok()) return respond_status(s);
  }
  TraceManager& tracer = impl_.core.tracer();
  if (method == http::verb::get) return respond(200, trace_settings_json(tracer.settings(model)));
  auto update = parse_trace_settings_request(request_.body(), impl_.opt.max_json_depth);
  if (!update.ok()) return respond_status(update.status());
  auto settings = tracer.update(model, *update);
  if (!settings.ok()) return respond_status(settings.status());
  respond(200, trace_settings_json(*settings));
}

void Session::handle_infer(const std::string& model, const std::string& version) {
  request_kind_ = RequestKind::infer;
  auto mv = impl_.core.find(model, version);
  if (!mv.ok()) return respond_status(mv.status());
  if ((*mv)->signature.decoupled) return respond_error(501, decoupled_message(model));
  ContentCoding coding = ContentCoding::identity;
  if (auto it = request_.find(http::field::content_encoding); it != request_.end()) {
    // Several Content-Encoding lines mean codings applied one after another: not supported.
    const std::optional<ContentCoding> c = request_.count(http::field::content_encoding) == 1
                                               ? request_coding(it->value())
                                               : std::nullopt;
    if (!c) {
      Response res{http::status::not_implemented, version_};
      res.set(http::field::accept_encoding, "gzip, deflate");
      res.set(http::field::content_type, "application/json");
      res.body() = error_json(
          "Content-Encoding '" + std::string(it->value()) + "'" +
          (request_.count(http::field::content_encoding) > 1 ? " in several header lines" : "") +
          " is not supported (one of gzip, deflate or identity)");
      return send(std::move(res));
    }
    coding = *c;
  }
  response_coding_ = ContentCoding::identity;
  if (auto it = request_.find(http::field::accept_encoding); it != request_.end()) {
    response_coding_ = response_coding(it->value());
  }
  std::optional<std::size_t> header_length;
  if (auto it = request_.find("Inference-Header-Content-Length"); it != request_.end()) {
    const std::string_view v = it->value();
    std::size_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || p != v.data() + v.size()) {
      return respond_error(400, "Inference-Header-Content-Length '" + std::string(v) +
                                    "' is not a non-negative integer");
    }
    header_length = n;
  }
  ModelRef m = std::move(*mv);
  if (impl_.core.tracer().active()) [[unlikely]]  // Triton's trace extension (trace.hpp)
    sample_trace(m->model_name);
  if (coding == ContentCoding::identity && request_.body().size() < kCodecInlineBytes) {
    auto decoded = decode_infer_request(*m, request_.body(), header_length,
                                        impl_.opt.max_json_depth, &impl_.core.shared_memory());
    request_.body() = std::string();  // the inputs were copied into tensors
    return on_decoded(m, std::move(decoded));
  }
  // A large body is decoded off the I/O threads; meanwhile the socket is watched, so that a
  // client that goes away is noticed.
  set_phase(Phase::handling);
  if (!reading_ && buffer_.size() == 0) read_some();
  // A compressed body is inflated there too, however small: it may inflate to the body limit.
  // The inflated copy (at most --max-body-bytes) is not counted against the memory budget; the
  // codec pool's threads bound how many exist at once. The tensors decoded from it are
  // (on_decoded).
  net::post(impl_.codec(), [self = shared_from_this(), m, header_length, coding,
                            body = std::move(request_.body())]() mutable {
    Result<DecodedInfer> decoded = internal_error("unset");
    bool too_large = false;
    if (coding == ContentCoding::identity) {
      decoded = decode_infer_request(*m, body, header_length, self->impl_.opt.max_json_depth,
                                     &self->impl_.core.shared_memory());
    } else {
      Result<std::string> inflated = inflate_body(body, coding, self->impl_.opt.max_body_bytes);
      body = std::string();
      if (inflated.ok()) {
        decoded = decode_infer_request(*m, *inflated, header_length, self->impl_.opt.max_json_depth,
                                       &self->impl_.core.shared_memory());
      } else {
        too_large = inflated.status().code() == StatusCode::resource_exhausted;
        decoded = inflated.status();
      }
    }
    body = std::string();
    const bool inflated = coding != ContentCoding::identity;
    net::post(self->executor(),
              [self, m, too_large, inflated, decoded = std::move(decoded)]() mutable {
                self->on_decoded(m, std::move(decoded), too_large, inflated);
              });
  });
}

void Session::sample_trace(const std::string& model) {
  std::optional<TraceParent> parent;
  if (auto it = request_.find("traceparent"); it != request_.end()) {
    parent = parse_traceparent(it->value());
  }
  trace_ = impl_.core.tracer().sample(model, parent);
  if (trace_) {
    const std::int64_t read = trace_ns(request_read_at_);
    trace_->record("HTTP_RECV_START", recv_start_ns_ != 0 ? recv_start_ns_ : read);
    trace_->record("HTTP_RECV_END", read);
  }
}

void Session::forward_headers(Parameters& parameters) const {
  if (!impl_.opt.header_forward) return;
  for (const auto& field : request_) {
    impl_.opt.header_forward->forward(field.name_string(), field.value(), parameters);
  }
}

void Session::on_decoded(const ModelRef& model, Result<DecodedInfer> decoded, bool body_too_large,
                         bool inflated) {
  if (closed()) return;
  if (client_gone()) return close();
  if (!decoded.ok()) {
    if (body_too_large) {  // Triton's 413: the inflated body passed --max-body-bytes
      keep_alive_ = false;
      return respond_error(413, decoded.status().message());
    }
    return respond_status(decoded.status());
  }
  decoded_ = std::move(*decoded);
  forward_headers(decoded_.request.parameters);
  // The body is gone; the request's tensors are what it holds now, until its response. A body
  // read whole was counted as it arrived; an inflated one only now, where the budget may refuse.
  const std::size_t tensors = input_bytes(decoded_.request);
  if (inflated && tensors > lease_.bytes() && !lease_.reserve(tensors)) {
    return respond_error(503, impl_.core.memory().exhausted_message(tensors - lease_.bytes()));
  }
  lease_.hold(tensors);
  auto self = shared_from_this();
  decoded_.request.completion_hands_off = true;  // the callback below only posts
  if (trace_) [[unlikely]]
    decoded_.request.trace = trace_;
  // This thread may run the request itself (HttpOptions::caller_run) when its inputs are small:
  // the model's recent average says nothing of a request many times larger than its own.
  if (tensors < kCodecInlineBytes) decoded_.request.caller_run_max_compute = impl_.opt.caller_run;
  auto accepted = impl_.core.submit(
      model, std::move(decoded_.request), [self](Result<InferResponse> r) mutable {
        // On the thread that ended the request: hand the result to this session's I/O thread.
        net::post(self->executor(),
                  [self, r = std::move(r)]() mutable { self->on_infer_done(std::move(r)); });
      });
  if (!accepted.ok()) return respond_status(accepted.status());
  ++loop_.submitted;  // until on_infer_done
  inflight_ = std::move(*accepted);
  set_phase(Phase::handling);
  // Watch the socket meanwhile: a disconnect cancels the request.
  if (!reading_ && buffer_.size() == 0) read_some();
}

void Session::handle_repository(const std::string& model, bool load) {
  auto call = parse_repository_call(request_.body(), impl_.opt.max_json_depth, load);
  if (!call.ok()) return respond_status(call.status());
  // Answered once the repository's control thread is done (a load: when the model serves);
  // meanwhile the socket is watched, so that a client that goes away is noticed.
  set_phase(Phase::handling);
  clear_deadline();
  if (!reading_ && buffer_.size() == 0) read_some();
  auto answer = [self = shared_from_this()](const Status& s) {
    net::post(self->executor(), [self, s] { self->on_repository_done(s); });
  };
  if (load) {
    impl_.core.repository().load_model(
        model, LoadParameters{std::move(call->config), std::move(call->files)}, std::move(answer));
  } else {
    impl_.core.repository().unload_model(model, std::move(answer));
  }
}

void Session::on_repository_done(const Status& s) {
  if (closed()) return;
  if (client_gone()) return close();
  if (!s.ok()) {
    // Triton's codes: a model with no folder is 500 (INTERNAL), a refused call 503.
    return respond_status(s);
  }
  respond(200, "", "");
}

void Session::on_infer_done(Result<InferResponse> r) {
  ++loop_.received;
  inflight_ = InflightRequest();
  if (closed()) return;
  if (client_gone()) return close();
  if (!r.ok()) return respond_status(r.status());
  const ContentCoding coding = response_coding_;
  if (output_bytes(*r) < kCodecInlineBytes) {
    EncodedResponse enc = encode_infer_response(*r, decoded_);
    if (coding == ContentCoding::identity) return send_infer(std::move(enc));
    // JSON text may be several times its tensors' size: compress a large one off the I/O thread.
    if (enc.body.size() < kCompressInlineBytes) {
      enc.body = deflate_body(enc.body, coding);
      return send_infer(std::move(enc));
    }
    net::post(impl_.codec(), [self = shared_from_this(), coding, enc = std::move(enc)]() mutable {
      enc.body = deflate_body(enc.body, coding);
      net::post(self->executor(),
                [self, enc = std::move(enc)]() mutable { self->send_infer(std::move(enc)); });
    });
    return;
  }
  net::post(impl_.codec(), [self = shared_from_this(), coding, r = std::move(*r)]() mutable {
    EncodedResponse enc = encode_infer_response(r, self->decoded_);
    r = InferResponse();
    if (coding != ContentCoding::identity) enc.body = deflate_body(enc.body, coding);
    net::post(self->executor(),
              [self, enc = std::move(enc)]() mutable { self->send_infer(std::move(enc)); });
  });
}

void Session::send_infer(EncodedResponse enc) {
  if (closed()) return;
  if (client_gone()) return close();
  if (trace_) [[unlikely]]
    trace_->record_now("HTTP_SEND_START");
  Response res{http::status::ok, version_};
  res.set(http::field::content_type, enc.binary ? "application/octet-stream" : "application/json");
  // Of the JSON before compression, as Triton sends it.
  if (enc.binary) res.set("Inference-Header-Content-Length", std::to_string(enc.json_size));
  if (response_coding_ != ContentCoding::identity) {
    res.set(http::field::content_encoding, to_string(response_coding_));
  }
  res.set(http::field::vary, "Accept-Encoding");
  res.body() = std::move(enc.body);
  send(std::move(res));
}

// ---- errors of the routing ----------------------------------------------------------------------

void Session::not_found(std::string_view target) {
  respond_error(404, "unknown endpoint " + std::string(http::to_string(method_)) + " " +
                         std::string(target) + " (docs/serving.md lists the endpoints)");
}

void Session::respond_method(const char* allowed) {
  Response res{http::status::method_not_allowed, version_};
  res.set(http::field::allow, allowed);
  res.set(http::field::content_type, "application/json");
  res.body() =
      error_json(std::string(http::to_string(method_)) + " is not allowed here (" + allowed + ")");
  send(std::move(res));
}

}  // namespace asyncinfer::server
