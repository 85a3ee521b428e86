// Triton's generate extension (docs/protocol/extension_generate.md, provisional):
// POST /v2/models/{m}[/versions/{v}]/generate answers one JSON object; /generate_stream answers
// Server-Sent Events (text/event-stream, one `data: <json>` event per response) over a chunked
// HTTP/1.1 response, for decoupled models above all.
//
// The request is a JSON object: a member naming a model input becomes that tensor (a scalar or a
// 1-D array; a batched model gets a batch dim of 1 in front), `parameters` and every other member
// become request parameters. A response is an object of id, model_name, model_version and one
// member per output (a scalar for one element, else the flat list).
//
// Back-pressure: the model's responses wait in an EventQueue of at most kMaxQueuedEvents
// events; when it is full the model's send waits (RequestOptions::on_response), so a client that
// reads slowly slows its model down and the server's memory stays bounded. A client that goes
// away (a read or write error) ends the queue: the waiting send returns cancelled and the request
// is cancelled in the engine; so does one that takes no byte of the stream for --idle-timeout
// (a progress check armed with the first write and not moved by the later ones, since the
// kernel takes writes for a while from a client that reads nothing; counted as a stalled
// stream).
#include <cstring>

#include "http_server_impl.hpp"
#include "oip_json_internal.hpp"
#include "trace.hpp"

namespace asyncinfer::server {

namespace {

/// Element `i` of a host tensor as a JSON value (BYTES as a string: invalid UTF-8 replaced).
json element(const Tensor& t, std::size_t i, const char*& bytes_cursor) {
  switch (t.dtype()) {
    case DType::f32:
      return t.data_as<float>()[i];
    case DType::f64:
      return t.data_as<double>()[i];
    case DType::i8:
      return t.data_as<std::int8_t>()[i];
    case DType::i16:
      return t.data_as<std::int16_t>()[i];
    case DType::i32:
      return t.data_as<std::int32_t>()[i];
    case DType::i64:
      return t.data_as<std::int64_t>()[i];
    case DType::u8:
      return t.data_as<std::uint8_t>()[i];
    case DType::u16:
      return t.data_as<std::uint16_t>()[i];
    case DType::u32:
      return t.data_as<std::uint32_t>()[i];
    case DType::u64:
      return t.data_as<std::uint64_t>()[i];
    case DType::boolean:
      return t.data_as<bool>()[i];
    case DType::bytes: {
      std::uint32_t n = 0;
      std::memcpy(&n, bytes_cursor, 4);  // checked at the completion point (check_outputs)
      std::string s(bytes_cursor + 4, n);
      bytes_cursor += 4 + n;
      return json::parse(quote(s));
    }
    case DType::f16:
    case DType::bf16:
      break;
  }
  return nullptr;
}

/// One response as Triton's generate answers it.
Result<std::string> generate_json(const InferResponse& r) {
  json out = json::object();
  if (!r.id.empty()) out["id"] = r.id;
  out["model_name"] = r.model->model_name;
  out["model_version"] = r.model->version_text;
  for (const InferOutput& o : r.outputs) {
    if (is_half(o.tensor.dtype())) {
      return invalid_argument_error("output '" + o.spec->name + "' is " +
                                    std::string(to_string(o.tensor.dtype())) +
                                    ", which has no JSON form (use /infer with binary data)");
    }
    const std::size_t n = o.tensor.numel();
    const char* cursor = static_cast<const char*>(o.tensor.data());
    if (n == 1) {
      out[o.spec->name] = element(o.tensor, 0, cursor);
    } else {
      json list = json::array();
      for (std::size_t i = 0; i < n; ++i) list.push_back(element(o.tensor, i, cursor));
      out[o.spec->name] = std::move(list);
    }
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

using ordered_json = nlohmann::ordered_json;

/// A JSON scalar as a parameter; invalid_argument in Triton's words for arrays, objects and null
/// (its HTTP frontend's SetTritonParameterFromJsonParameter).
Result<ParameterValue> parameter_of(const std::string& key, const ordered_json& v) {
  if (v.is_boolean()) return ParameterValue(v.get<bool>());
  if (v.is_number_unsigned()) return ParameterValue(v.get<std::uint64_t>());
  if (v.is_number_integer()) return ParameterValue(v.get<std::int64_t>());
  if (v.is_number_float()) return ParameterValue(v.get<double>());
  if (v.is_string()) return ParameterValue(v.get<std::string>());
  return invalid_argument_error("parameter '" + key +
                                "' has invalid type. It should be either 'int', 'bool', or "
                                "'string'. (a model input or a scalar request parameter)");
}

/// The shape of input `spec` holding `elements` values, as Triton's generate deduces it: the
/// fixed dims take their share, the innermost variable dim the rest, the other variable dims 1
/// (a batched model's batch dim among them).
Result<Shape> generate_shape(const TensorSpec& spec, std::size_t elements) {
  Shape shape = spec.shape;
  std::size_t left = elements;
  const auto cannot = [&] {
    return invalid_argument_error("The schema can not convert input '" + spec.name +
                                  "' to tensor with proper shape (" + std::to_string(elements) +
                                  " elements for dims " + shape_to_string(spec.shape) + ")");
  };
  for (auto d = shape.rbegin(); d != shape.rend(); ++d) {
    if (*d == -1) continue;
    if (*d == 0 ? left != 0 : left % static_cast<std::size_t>(*d) != 0) return cannot();
    if (*d != 0) left /= static_cast<std::size_t>(*d);
  }
  for (auto d = shape.rbegin(); d != shape.rend(); ++d) {
    if (*d != -1) continue;
    *d = static_cast<std::int64_t>(left);
    left = 1;
  }
  if (left != 1 && elements != 0) return cannot();
  return shape;
}

/// A member naming input `spec` as its tensor: a scalar or a 1-D array, in Triton's words where
/// a value has the wrong type (TritonJson's).
Result<Tensor> input_of(const TensorSpec& spec, const ordered_json& v) {
  const std::string what = "input '" + spec.name + "'";
  const ordered_json list = v.is_array() ? v : ordered_json::array({v});
  ASYNCINFER_ASSIGN_OR_RETURN(Shape shape, generate_shape(spec, list.size()));
  const DType d = spec.dtype;
  if (d == DType::bytes) {
    std::vector<std::string> elements;
    for (const ordered_json& e : list) {
      if (!e.is_string()) {
        return invalid_argument_error("attempt to access JSON non-string as string (" + what +
                                      " is BYTES: give strings)");
      }
      elements.push_back(e.get<std::string>());
    }
    return Tensor::from_strings(shape, elements);
  }
  if (is_half(d)) {
    return invalid_argument_error(what + " is " + std::string(to_string(d)) +
                                  ", which has no JSON form (use /infer with binary data)");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(d, shape));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const ordered_json& e = list[i];
    if (d == DType::boolean) {
      if (!e.is_boolean()) {
        return invalid_argument_error("attempt to access JSON non-boolean as boolean (" + what +
                                      " is BOOL: give true or false)");
      }
      static_cast<bool*>(t.data())[i] = e.get<bool>();
      continue;
    }
    if (!e.is_number()) {
      return invalid_argument_error("attempt to access JSON non-number as number (" + what +
                                    " is " + std::string(to_string(d)) + ": give numbers)");
    }
    auto put = [&]<class T>(T*) { static_cast<T*>(t.data())[i] = e.get<T>(); };
    switch (d) {
      case DType::f32:
        put(static_cast<float*>(nullptr));
        break;
      case DType::f64:
        put(static_cast<double*>(nullptr));
        break;
      case DType::i8:
        put(static_cast<std::int8_t*>(nullptr));
        break;
      case DType::i16:
        put(static_cast<std::int16_t*>(nullptr));
        break;
      case DType::i32:
        put(static_cast<std::int32_t*>(nullptr));
        break;
      case DType::i64:
        put(static_cast<std::int64_t*>(nullptr));
        break;
      case DType::u8:
        put(static_cast<std::uint8_t*>(nullptr));
        break;
      case DType::u16:
        put(static_cast<std::uint16_t*>(nullptr));
        break;
      case DType::u32:
        put(static_cast<std::uint32_t*>(nullptr));
        break;
      case DType::u64:
        put(static_cast<std::uint64_t*>(nullptr));
        break;
      default:
        break;
    }
  }
  return t;
}

/// The generate request body as an InferRequest, its members taken in the order they come (as
/// Triton's frontend takes them: the first bad one is the one reported).
Result<InferRequest> decode_generate(const ModelVersion& model, std::string_view body,
                                     int max_depth) {
  // Depth and syntax as every JSON body here; then again in document order, noting the first
  // top-level key given twice.
  ASYNCINFER_RETURN_IF_ERROR(parse_json(body, max_depth).status());
  std::vector<std::string> keys;
  std::string twice;
  ordered_json doc = ordered_json::parse(
      body.begin(), body.end(),
      [&](int depth, ordered_json::parse_event_t event, ordered_json& value) {
        if (depth == 1 && event == ordered_json::parse_event_t::key) {
          const std::string key = value.get<std::string>();
          if (twice.empty() && std::find(keys.begin(), keys.end(), key) != keys.end()) {
            twice = key;
          }
          keys.push_back(key);
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    return invalid_argument_error(
        "the generate request must be a JSON object of inputs and "
        "parameters");
  }
  const auto input_spec = [&](const std::string& key) {
    return std::find_if(model.signature.inputs.begin(), model.signature.inputs.end(),
                        [&](const TensorSpec& s) { return s.name == key; });
  };
  if (!twice.empty() && input_spec(twice) != model.signature.inputs.end()) {
    return invalid_argument_error("input '" + twice + "' already exists in request");
  }
  InferRequest req;
  for (auto& [key, value] : doc.items()) {
    if (key == "parameters") {
      if (!value.is_object()) {
        return invalid_argument_error("Expected JSON object for keyword: 'parameters'");
      }
      for (auto& [pk, pv] : value.items()) {
        auto p = parameter_of(pk, pv);
        if (!p.ok()) return p.status().with_context("Converting keyword: 'parameters'");
        req.parameters[pk] = std::move(*p);
      }
      continue;
    }
    if (key == "id" && value.is_string()) {
      req.id = value.get<std::string>();
      continue;
    }
    auto spec = input_spec(key);
    if (spec != model.signature.inputs.end()) {
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, input_of(*spec, value));
      req.inputs.push_back({key, std::move(t)});
      continue;
    }
    ASYNCINFER_ASSIGN_OR_RETURN(req.parameters[key], parameter_of(key, value));
  }
  return req;
}

std::string sse_event(std::string_view data) {
  std::string e = "data: ";
  e += data;
  e += "\n\n";
  return e;
}

}  // namespace

// ---- the session's side -------------------------------------------------------------------------

void Session::handle_generate(const std::string& model, const std::string& version, bool stream) {
  request_kind_ = stream ? RequestKind::generate_stream : RequestKind::generate;
  auto mv = impl_.core.find(model, version);
  if (!mv.ok()) return respond_status(mv.status());
  if (request_.find(http::field::content_encoding) != request_.end()) {
    return respond_error(400, "generate takes no Content-Encoding (send the JSON as it is)");
  }
  if (stream && version_ < 11) {
    return respond_error(505, "generate_stream needs HTTP/1.1 (its events use chunked coding)");
  }
  ModelRef m = std::move(*mv);
  // Traced as /infer is (Triton's generate runs through the same inference path).
  if (impl_.core.tracer().active()) [[unlikely]]
    sample_trace(m->model_name);
  auto decoded = decode_generate(*m, request_.body(), impl_.opt.max_json_depth);
  request_.body() = std::string();
  if (!decoded.ok()) return respond_status(decoded.status());
  InferRequest req = std::move(*decoded);
  forward_headers(req.parameters);
  if (trace_) [[unlikely]]
    req.trace = trace_;
  lease_.hold(input_bytes(req));
  auto self = shared_from_this();
  events_ = std::make_shared<EventQueue>();
  auto events = events_;
  if (m->signature.decoupled) {
    // Each response before the final one: an event (or, for /generate, one to count).
    req.on_response = [self, events, stream](InferResponse r, std::stop_token stop) -> Status {
      if (!events->reserve(stop)) return cancelled_error("the generate client has gone away");
      Result<std::string> text = generate_json(r);
      net::post(self->executor(), [self, events, stream, text = std::move(text)]() mutable {
        self->on_generate_response(events, std::move(text), stream);
      });
      return Status();
    };
  }
  generated_ = 0;
  sse_status_ = 200;
  auto accepted = impl_.core.submit(m, std::move(req), [self](Result<InferResponse> r) mutable {
    net::post(self->executor(),
              [self, r = std::move(r)]() mutable { self->on_generate_done(std::move(r)); });
  });
  if (!accepted.ok()) {
    events_.reset();
    return respond_status(accepted.status());
  }
  inflight_ = std::move(*accepted);
  set_phase(Phase::handling);
  clear_deadline();
  if (!reading_ && buffer_.size() == 0) read_some();
}

void Session::on_generate_response(const std::shared_ptr<EventQueue>& events,
                                   Result<std::string> text, bool stream) {
  if (closed() || client_gone() || events != events_) {  // gone, or another request's by now
    events->written();
    return;
  }
  ++generated_;
  if (!stream) {
    // /generate: one response is its answer; a second one is an error, given at the end.
    if (generated_ == 1) generate_answer_ = std::move(text);
    events_->written();
    return;
  }
  if (!text.ok()) text = error_json(text.status().message());
  sse_pending_.push_back(sse_event(*text));
  pump_events();
}

void Session::on_generate_done(Result<InferResponse> r) {
  inflight_ = InflightRequest();
  if (closed()) return;
  if (client_gone()) return close();
  const bool final_has_data = r.ok() && !r->outputs.empty();
  if (request_kind_ != RequestKind::generate_stream) {
    events_->close();
    events_.reset();
    if (!r.ok()) return respond_status(r.status());
    const std::uint64_t total = generated_ + (final_has_data ? 1 : 0);
    if (total != 1) {  // Triton's words first
      return respond_error(400, "generate expects model to produce exactly 1 response, model '" +
                                    r->model->model_name + "' sent " + std::to_string(total) +
                                    " (use generate_stream)");
    }
    Result<std::string> text = final_has_data ? generate_json(*r) : std::move(generate_answer_);
    generate_answer_ = std::string();
    if (!text.ok()) return respond_status(text.status());
    if (trace_) [[unlikely]]
      trace_->record_now("HTTP_SEND_START");
    return respond(200, std::move(*text));
  }
  // The final response's send: from now until the stream's last chunk is written (HTTP_SEND_END).
  if (trace_) [[unlikely]]
    trace_->record_now("HTTP_SEND_START");
  if (!r.ok() && sse_ == SseState::none) {
    // The model's first response is an error: the stream's header carries its status and the
    // error is its one event, as Triton answers (errors before the model ran are plain JSON).
    sse_status_ = http_status(r.status().code());
  }
  if (!r.ok()) {
    sse_pending_.push_back(sse_event(error_json(r.status().message())));
  } else if (final_has_data) {
    Result<std::string> text = generate_json(*r);
    sse_pending_.push_back(sse_event(text.ok() ? *text : error_json(text.status().message())));
  }
  // The header first, if no response came before the final one (its write is pending then).
  if (sse_ == SseState::none) pump_events();
  set_sse(SseState::final);
  pump_events();
}

void Session::pump_events() {
  if (sse_writing_ || closed()) return;
  if (sse_ == SseState::none) {
    // The header: 200, text/event-stream, chunked (its status is the first response's).
    set_sse(SseState::header);
    sse_writing_ = true;
    set_phase(Phase::writing);
    if (kind_ == Kind::api) {
      impl_.metrics.count_request(
          static_cast<std::size_t>(std::clamp(sse_status_ / 100, 1, 5) - 1));
    }
    sse_header_.emplace(static_cast<http::status>(sse_status_), version_);
    sse_header_->set(http::field::content_type, "text/event-stream; charset=utf-8");
    sse_header_->set(http::field::cache_control, "no-cache");
    const bool keep = keep_alive_ && !draining();
    sse_header_->keep_alive(keep);
    keep_alive_ = keep;
    sse_header_->chunked(true);
    sse_serializer_.emplace(*sse_header_);
    arm_stream_check();
    http::async_write_header(socket_, *sse_serializer_,
                             [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                               self->written_ += n;
                               self->on_event_written(ec, false);
                             });
    return;
  }
  if (!sse_pending_.empty()) {
    sse_writing_ = true;
    arm_stream_check();
    net::async_write(socket_, http::make_chunk(net::buffer(sse_pending_.front())),
                     [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                       self->written_ += n;
                       self->on_event_written(ec, true);
                     });
    return;
  }
  if (sse_ == SseState::final) {
    set_sse(SseState::last);
    sse_writing_ = true;
    arm_stream_check();
    net::async_write(socket_, http::make_chunk_last(),
                     [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                       self->written_ += n;
                       self->on_event_written(ec, false);
                     });
    return;
  }
  // Waiting for the model, whose own deadline applies; while the kernel still holds events the
  // client has not taken, the progress check stays armed.
  if (unsent_bytes() == 0) clear_deadline();
}

void Session::on_event_written(beast::error_code ec, bool event) {
  sse_writing_ = false;
  if (sse_ == SseState::header) set_sse(SseState::events);  // the header is written
  if (event) {
    sse_pending_.pop_front();
    if (events_) events_->written();
  }
  if (closed()) return;
  if (ec || client_gone()) {
    if (events_) events_->close();
    return close();
  }
  if (sse_ == SseState::last) {
    // The stream is whole: the request ends as any other.
    set_sse(SseState::none);
    sse_serializer_.reset();
    sse_header_.reset();
    events_->close();
    events_.reset();
    return on_write(ec);
  }
  pump_events();
}

}  // namespace asyncinfer::server
