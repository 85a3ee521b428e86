// ServerModelHost (model_host.hpp): a python model's requests to the server it runs in.
#include "model_host.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "inference_server.hpp"
#include "metrics/prometheus_text.hpp"
#include "model_config.hpp"
#include "trace.hpp"

namespace asyncinfer::server {
namespace {

std::string chain_text(const std::vector<std::string>& callers, const std::string& next) {
  std::string s;
  for (const std::string& c : callers) s += "'" + c + "' -> ";
  return s + "'" + next + "'";
}

// A completed request's outputs by name (the final response of a decoupled model may have none).
detail::HostResponse host_response(InferResponse&& r, bool final) {
  detail::HostResponse out;
  out.final = final;
  out.outputs.reserve(r.outputs.size());
  for (InferOutput& o : r.outputs) out.outputs.emplace_back(o.spec->name, std::move(o.tensor));
  return out;
}

class Call final : public detail::HostCall {
 public:
  void cancel() override {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    inflight_.cancel();
  }
  void set(InflightRequest inflight) {
    std::lock_guard lock(mu_);
    inflight_ = std::move(inflight);
    if (cancelled_) inflight_.cancel();
  }

 private:
  std::mutex mu_;
  bool cancelled_ = false;
  InflightRequest inflight_;
};

bool valid_metric_name(const std::string& name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(const std::string& name) {
  return valid_metric_name(name) && name.find(':') == std::string::npos && name.rfind("__", 0) != 0;
}

}  // namespace

Result<std::shared_ptr<detail::HostCall>> ServerModelHost::infer(detail::HostRequest request,
                                                                 OnResponse on_response) {
  ASYNCINFER_ASSIGN_OR_RETURN(ModelRef ref, server_.find(request.model, request.version));
  const std::vector<std::string> none;
  const std::vector<std::string>& callers = request.context ? request.context->callers : none;
  if (callers.size() >= kMaxCallDepth) {
    return resource_exhausted_error(
        "business logic scripting: the chain of calls " + chain_text(callers, request.model) +
        " is " + std::to_string(callers.size() + 1) + " models deep, over the limit of " +
        std::to_string(kMaxCallDepth));
  }
  if (ref->engine) {
    const auto in_chain =
        static_cast<std::int64_t>(std::count(callers.begin(), callers.end(), ref->model_name));
    const std::int64_t instances = ref->engine->options().workers;
    if (in_chain >= instances) {
      return resource_exhausted_error(
          "business logic scripting: the call " + chain_text(callers, request.model) +
          " could never run: model '" + ref->model_name + "' has " + std::to_string(instances) +
          " instance(s), and each is busy in a caller of this request waiting for it (give it "
          "more instances in instance_group, or do not call it from itself)");
    }
  }
  const bool decoupled = ref->signature.decoupled;
  if (decoupled && !request.decoupled) {
    return invalid_argument_error("model '" + ref->model_name +
                                  "' is decoupled: call it with exec(decoupled=True) or "
                                  "async_exec(decoupled=True), which return its responses one by "
                                  "one");
  }
  InferRequest r;
  r.id = std::move(request.id);
  r.inputs.reserve(request.inputs.size());
  for (auto& [name, tensor] : request.inputs) {
    // Checked as a client's would be (names, dtypes, shapes against the model).
    ASYNCINFER_RETURN_IF_ERROR(
        InferenceServer::check_input(*ref, name, oip_datatype(tensor.dtype()), tensor.shape())
            .status());
    r.inputs.push_back(InferInput{std::move(name), std::move(tensor), false});
  }
  for (std::string& name : request.outputs) r.outputs.push_back(RequestedOutput{std::move(name)});
  if (request.deadline != Clock::time_point::max()) r.deadline = request.deadline;
  if (request.priority > 0) r.parameters["priority"] = std::int64_t{request.priority};
  if (request.sequence) {
    const SequenceFlags& f = *request.sequence;
    if (const auto* n = std::get_if<std::uint64_t>(&f.id)) {
      r.parameters["sequence_id"] = *n;
    } else {
      r.parameters["sequence_id"] = std::get<std::string>(f.id);
    }
    r.parameters["sequence_start"] = f.start;
    r.parameters["sequence_end"] = f.end;
  }
  r.context = std::move(request.context);
  // Under a traced caller that passed trace=request.trace(): a child of its trace (Triton's
  // SpawnChildTrace), whatever the sampling of the called model.
  if (request.trace) [[unlikely]]
    r.trace = Trace::child_of(request.trace);
  // The completion only posts to the calling instance's mailbox: it runs where the request ends,
  // one thread hand-off fewer (RequestOptions::inline_callback).
  r.completion_hands_off = true;
  auto shared = std::make_shared<OnResponse>(std::move(on_response));
  if (decoupled) {
    r.on_response = [shared](InferResponse response, std::stop_token) {
      (*shared)(host_response(std::move(response), false));
      return Status();
    };
  }
  auto call = std::make_shared<Call>();
  ASYNCINFER_ASSIGN_OR_RETURN(
      InflightRequest inflight,
      server_.submit(ref, std::move(r), [shared](Result<InferResponse> result) {
        if (!result.ok()) return (*shared)(result.status());
        (*shared)(host_response(std::move(*result), true));
      }));
  call->set(std::move(inflight));
  return std::shared_ptr<detail::HostCall>(std::move(call));
}

bool ServerModelHost::model_ready(const std::string& model, const std::string& version) {
  Result<ModelRef> ref = server_.find(model, version);
  return ref.ok() && (*ref)->serving();
}

void ServerModelHost::load_model(std::string model, std::optional<std::string> config_json,
                                 Done done) {
  server_.repository().load_model(std::move(model), std::move(config_json), std::move(done));
}

void ServerModelHost::unload_model(std::string model, Done done) {
  server_.repository().unload_model(std::move(model), std::move(done));
}

// ---- custom metrics -----------------------------------------------------------------------------

Result<std::uint64_t> CustomMetrics::metric_family(const std::string& name,
                                                   const std::string& description,
                                                   detail::MetricKind kind) {
  if (!valid_metric_name(name)) {
    return invalid_argument_error("metric family name '" + name +
                                  "' is not a Prometheus name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
  std::lock_guard lock(mu_);
  for (auto& [id, f] : families_) {
    if (f.name != name) continue;
    if (f.kind != kind || f.description != description) {
      return invalid_argument_error("metric family '" + name +
                                    "' exists with another kind or description");
    }
    return id;
  }
  const std::uint64_t id = next_id_++;
  families_.emplace(id, Family{name, description, kind, 0});
  return id;
}

Result<std::uint64_t> CustomMetrics::metric(std::uint64_t family,
                                            const std::map<std::string, std::string>& labels,
                                            const std::vector<double>& buckets) {
  std::lock_guard lock(mu_);
  auto f = families_.find(family);
  if (f == families_.end()) return not_found_error("metric family " + std::to_string(family));
  for (const auto& [key, value] : labels) {
    if (!valid_label_name(key)) {
      return invalid_argument_error("metric label name '" + key +
                                    "' is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)");
    }
  }
  Metric m{family, labels, 0, {}, {}, 0, 0};
  if (f->second.kind == detail::MetricKind::histogram) {
    if (buckets.empty()) {
      return invalid_argument_error("histogram metric of family '" + f->second.name +
                                    "' needs buckets (a list of upper bounds)");
    }
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      if (!std::isfinite(buckets[i]) || (i > 0 && buckets[i] <= buckets[i - 1])) {
        return invalid_argument_error("histogram buckets of family '" + f->second.name +
                                      "' must be finite and increasing");
      }
    }
    m.bounds = buckets;
    m.counts.assign(buckets.size() + 1, 0);
  } else if (!buckets.empty()) {
    return invalid_argument_error("buckets are for histograms; family '" + f->second.name +
                                  "' is not one");
  }
  for (auto& [id, other] : metrics_) {
    if (other.family == family && other.labels == labels) {
      // The same metric (each instance of a model makes its own in initialize()): shared, as
      // Prometheus's families share a label set.
      if (other.bounds != m.bounds) {
        return invalid_argument_error("metric family '" + f->second.name +
                                      "' has a metric with these labels and other buckets");
      }
      ++other.refs;
      return id;
    }
  }
  const std::uint64_t id = next_id_++;
  metrics_.emplace(id, std::move(m));
  ++f->second.metrics;
  return id;
}

Result<double> CustomMetrics::metric_update(std::uint64_t metric, const std::string& op,
                                            double value) {
  std::lock_guard lock(mu_);
  auto it = metrics_.find(metric);
  if (it == metrics_.end()) return not_found_error("metric " + std::to_string(metric));
  Metric& m = it->second;
  const detail::MetricKind kind = families_.at(m.family).kind;
  if (op == "value") return kind == detail::MetricKind::histogram ? m.sum : m.value;
  if (kind == detail::MetricKind::histogram) {
    if (op != "observe") {
      return invalid_argument_error("a histogram metric takes observe(), not " + op + "()");
    }
    const auto b = std::lower_bound(m.bounds.begin(), m.bounds.end(), value) - m.bounds.begin();
    ++m.counts[static_cast<std::size_t>(b)];
    ++m.count;
    m.sum += value;
    return m.sum;
  }
  if (op == "increment") {
    if (kind == detail::MetricKind::counter && value < 0) {
      return invalid_argument_error("a counter cannot be incremented by a negative value");
    }
    m.value += value;
  } else if (op == "set" && kind == detail::MetricKind::gauge) {
    m.value = value;
  } else {
    return invalid_argument_error(
        std::string("a ") + (kind == detail::MetricKind::counter ? "counter" : "gauge") +
        " metric takes " +
        (kind == detail::MetricKind::counter ? "increment()" : "increment() and set()") + ", not " +
        op + "()");
  }
  return m.value;
}

void CustomMetrics::metric_delete(std::uint64_t metric) {
  std::lock_guard lock(mu_);
  auto it = metrics_.find(metric);
  if (it == metrics_.end() || --it->second.refs > 0) return;
  auto f = families_.find(it->second.family);
  metrics_.erase(it);
  if (f != families_.end() && --f->second.metrics == 0) families_.erase(f);
}

void CustomMetrics::collect(metrics::Families& out) const {
  std::lock_guard lock(mu_);
  for (const auto& [fid, f] : families_) {
    for (const auto& [id, m] : metrics_) {
      if (m.family != fid) continue;
      const metrics::Labels labels(m.labels.begin(), m.labels.end());
      switch (f.kind) {
        case detail::MetricKind::counter:
          out.counter(f.name, f.description, labels, m.value);
          break;
        case detail::MetricKind::gauge:
          out.gauge(f.name, f.description, labels, m.value);
          break;
        case detail::MetricKind::histogram: {
          HistogramSnapshot h;
          h.bounds = m.bounds;
          h.counts = m.counts;
          h.count = m.count;
          h.sum = m.sum;
          out.histogram(f.name, f.description, labels, h);
          break;
        }
      }
    }
  }
}

}  // namespace asyncinfer::server
