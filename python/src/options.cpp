// options.cpp — the engine's option and policy types as Python classes, and the converters of
// Engine's option arguments (options.hpp).
#include "options.hpp"

#include <pybind11/stl.h>

#include <optional>

namespace asyncinfer::python {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

py::object optional_seconds(const std::optional<microseconds>& d) {
  if (!d) return py::none();
  return py::float_(to_seconds(*d));
}

}  // namespace

ShutdownMode shutdown_mode(const py::object& mode) {
  if (py::isinstance<ShutdownMode>(mode)) return mode.cast<ShutdownMode>();
  if (py::isinstance<py::str>(mode)) {
    const auto s = mode.cast<std::string>();
    if (s == "drain") return ShutdownMode::drain;
    if (s == "cancel") return ShutdownMode::cancel;
  }
  raise_invalid("shutdown: mode " + py::repr(mode).cast<std::string>() +
                " is neither 'drain' nor 'cancel' (or asyncinfer.ShutdownMode)");
}

QueueFullPolicy queue_full_policy(const py::object& p) {
  if (py::isinstance<QueueFullPolicy>(p)) return p.cast<QueueFullPolicy>();
  if (py::isinstance<py::str>(p)) {
    const auto s = p.cast<std::string>();
    if (s == "reject") return QueueFullPolicy::reject;
    if (s == "block") return QueueFullPolicy::block;
  }
  raise_invalid("queue_full_policy: " + py::repr(p).cast<std::string>() +
                " is neither 'reject' nor 'block'");
}

py::dict options_dict(const EngineOptions& o) {
  py::dict d;
  d["workers"] = o.workers;
  d["max_inflight_per_worker"] = o.max_inflight_per_worker;
  d["queue_capacity"] = o.queue_capacity;
  d["queue_full_policy"] = o.queue_full_policy == QueueFullPolicy::block ? "block" : "reject";
  d["submit_timeout"] = to_seconds(o.submit_timeout);
  d["completion_threads"] = o.completion_threads;
  d["spin_wait_us"] = static_cast<std::int64_t>(o.spin_wait.count());
  d["priority_levels"] = o.priority_levels;
  d["default_priority"] = o.default_priority;
  d["priority_aging"] = to_seconds(o.priority_aging);
  d["max_batch_size"] = o.batching.max_batch_size;
  d["preferred_batch_sizes"] = o.batching.preferred_batch_sizes;
  d["max_queue_delay_us"] = o.batching.max_queue_delay.count();
  d["split_failed_batches"] = o.batching.split_failed_batches;
  d["ordered_delivery"] = o.ordered_delivery;
  d["default_timeout"] = optional_seconds(o.default_timeout);
  d["allow_timeout_override"] = o.allow_timeout_override;
  d["admission_control"] = o.admission_control;
  d["retry"] = o.retry;
  d["breaker"] = o.breaker;
  d["recovery"] = o.recovery;
  d["watchdog"] = to_seconds(o.watchdog);
  d["result_store_capacity"] = o.result_store_capacity;
  d["result_ttl"] = to_seconds(o.result_ttl);
  d["intra_op_threads"] = o.intra_op_threads;
  d["drain_timeout"] = to_seconds(o.drain_timeout);
  return d;
}

void init_options(py::module_& m) {
  py::enum_<RequestState>(m, "RequestState", "Where a request is in its life (Engine.status(id)).")
      .value("unknown", RequestState::unknown, "no such id (or expired, evicted, released)")
      .value("pending", RequestState::pending, "queued, or waiting to retry")
      .value("running", RequestState::running, "in a batch on a worker's stream")
      .value("completed", RequestState::completed)
      .value("failed", RequestState::failed)
      .value("timed_out", RequestState::timed_out)
      .value("cancelled", RequestState::cancelled)
      .value("shut_down", RequestState::shut_down)
      .def_property_readonly(
          "terminal", [](RequestState s) { return is_terminal(s); },
          "True for completed, failed, timed_out, cancelled, shut_down.");

  py::enum_<ShutdownMode>(m, "ShutdownMode", "How Engine.shutdown ends queued and running work.")
      .value("drain", ShutdownMode::drain, "finish queued and running work, then stop")
      .value("cancel", ShutdownMode::cancel, "end queued and running work as shut_down at once");
  py::enum_<QueueFullPolicy>(m, "QueueFullPolicy", "What submit does when the queue is full.")
      .value("reject", QueueFullPolicy::reject, "raise ResourceExhausted at once")
      .value("block", QueueFullPolicy::block, "wait up to submit_timeout (without the GIL)");

  const RetryPolicy rd;
  py::class_<RetryPolicy>(m, "RetryPolicy", R"doc(
Retries (C++ asyncinfer::RetryPolicy): bounded attempts, exponential backoff with full jitter,
only retryable codes, never past the request's deadline, within a retry budget. Durations in
seconds; codes are names ('unavailable') or asyncinfer exception classes (asyncinfer.Unavailable).
InvalidArgument, Cancelled and DeadlineExceeded are never retried (the engine rejects them).
)doc")
      .def(py::init([](int max_attempts, const py::object& initial_backoff, double multiplier,
                       const py::object& max_backoff, const py::iterable& retryable_codes,
                       double budget_ratio, double budget_min_retries_per_s,
                       const py::object& budget_window) {
             RetryPolicy p;
             p.max_attempts = max_attempts;
             p.initial_backoff = to_duration_as<microseconds>(initial_backoff, "initial_backoff");
             p.multiplier = multiplier;
             p.max_backoff = to_duration_as<microseconds>(max_backoff, "max_backoff");
             p.retryable_codes.clear();
             for (py::handle c : retryable_codes) {
               p.retryable_codes.push_back(code_from_python(c, "retryable_codes"));
             }
             p.budget_ratio = budget_ratio;
             p.budget_min_retries_per_s = budget_min_retries_per_s;
             p.budget_window = to_duration_as<milliseconds>(budget_window, "budget_window");
             return p;
           }),
           py::kw_only(), py::arg("max_attempts") = rd.max_attempts,
           py::arg("initial_backoff") = to_seconds(rd.initial_backoff),
           py::arg("multiplier") = rd.multiplier,
           py::arg("max_backoff") = to_seconds(rd.max_backoff),
           py::arg("retryable_codes") = py::make_tuple("unavailable", "resource_exhausted"),
           py::arg("budget_ratio") = rd.budget_ratio,
           py::arg("budget_min_retries_per_s") = rd.budget_min_retries_per_s,
           py::arg("budget_window") = to_seconds(rd.budget_window))
      .def_readwrite("max_attempts", &RetryPolicy::max_attempts,
                     "attempts in all, the first included; 1 = no retries")
      .def_property(
          "initial_backoff", [](const RetryPolicy& p) { return to_seconds(p.initial_backoff); },
          [](RetryPolicy& p, const py::object& v) {
            p.initial_backoff = to_duration_as<microseconds>(v, "initial_backoff");
          },
          "s; the first retry's backoff window")
      .def_readwrite("multiplier", &RetryPolicy::multiplier)
      .def_property(
          "max_backoff", [](const RetryPolicy& p) { return to_seconds(p.max_backoff); },
          [](RetryPolicy& p, const py::object& v) {
            p.max_backoff = to_duration_as<microseconds>(v, "max_backoff");
          },
          "s; the largest backoff window")
      .def_property(
          "retryable_codes",
          [](const RetryPolicy& p) {
            py::list l;
            for (StatusCode c : p.retryable_codes) l.append(std::string(to_string(c)));
            return l;
          },
          [](RetryPolicy& p, const py::iterable& codes) {
            p.retryable_codes.clear();
            for (py::handle c : codes) {
              p.retryable_codes.push_back(code_from_python(c, "retryable_codes"));
            }
          },
          "status code names worth another attempt")
      .def_readwrite("budget_ratio", &RetryPolicy::budget_ratio)
      .def_readwrite("budget_min_retries_per_s", &RetryPolicy::budget_min_retries_per_s)
      .def_property(
          "budget_window", [](const RetryPolicy& p) { return to_seconds(p.budget_window); },
          [](RetryPolicy& p, const py::object& v) {
            p.budget_window = to_duration_as<milliseconds>(v, "budget_window");
          },
          "s; the retry budget's sliding window")
      .def("__repr__", [](const RetryPolicy& p) {
        return "RetryPolicy(max_attempts=" + std::to_string(p.max_attempts) +
               ", initial_backoff=" + std::to_string(to_seconds(p.initial_backoff)) +
               ", max_backoff=" + std::to_string(to_seconds(p.max_backoff)) + ")";
      });

  const CircuitBreakerOptions bd;
  py::class_<CircuitBreakerOptions>(m, "CircuitBreakerOptions", R"doc(
Per-worker circuit breaker: after failure_threshold consecutive failed batches (0 = off) the
worker is taken out for cooldown seconds, then probed with one request.
)doc")
      .def(py::init([](int failure_threshold, const py::object& cooldown) {
             CircuitBreakerOptions b;
             b.failure_threshold = failure_threshold;
             b.cooldown = to_duration_as<milliseconds>(cooldown, "cooldown");
             return b;
           }),
           py::kw_only(), py::arg("failure_threshold") = bd.failure_threshold,
           py::arg("cooldown") = to_seconds(bd.cooldown))
      .def_readwrite("failure_threshold", &CircuitBreakerOptions::failure_threshold)
      .def_property(
          "cooldown", [](const CircuitBreakerOptions& b) { return to_seconds(b.cooldown); },
          [](CircuitBreakerOptions& b, const py::object& v) {
            b.cooldown = to_duration_as<milliseconds>(v, "cooldown");
          },
          "s");

  const RecoveryOptions recd;
  py::class_<RecoveryOptions>(m, "RecoveryOptions", R"doc(
How a worker gets a new stream and model instance after the watchdog fired: at most
max_recycle_attempts tries in a row, waiting recycle_backoff seconds after the first failure and
doubling up to max_recycle_backoff; then the worker is unhealthy for good (health(), metrics()).
A worker keeps at most max_abandoned_instances replaced instances whose work still runs; beyond
that it takes no new work (health 'paused') until one finishes.
)doc")
      .def(py::init([](int max_recycle_attempts, const py::object& recycle_backoff,
                       const py::object& max_recycle_backoff, int max_abandoned_instances) {
             RecoveryOptions r;
             r.max_recycle_attempts = max_recycle_attempts;
             r.recycle_backoff = to_duration_as<milliseconds>(recycle_backoff, "recycle_backoff");
             r.max_recycle_backoff =
                 to_duration_as<milliseconds>(max_recycle_backoff, "max_recycle_backoff");
             r.max_abandoned_instances = max_abandoned_instances;
             return r;
           }),
           py::kw_only(), py::arg("max_recycle_attempts") = recd.max_recycle_attempts,
           py::arg("recycle_backoff") = to_seconds(recd.recycle_backoff),
           py::arg("max_recycle_backoff") = to_seconds(recd.max_recycle_backoff),
           py::arg("max_abandoned_instances") = recd.max_abandoned_instances)
      .def_readwrite("max_recycle_attempts", &RecoveryOptions::max_recycle_attempts)
      .def_property(
          "recycle_backoff", [](const RecoveryOptions& r) { return to_seconds(r.recycle_backoff); },
          [](RecoveryOptions& r, const py::object& v) {
            r.recycle_backoff = to_duration_as<milliseconds>(v, "recycle_backoff");
          },
          "s")
      .def_property(
          "max_recycle_backoff",
          [](const RecoveryOptions& r) { return to_seconds(r.max_recycle_backoff); },
          [](RecoveryOptions& r, const py::object& v) {
            r.max_recycle_backoff = to_duration_as<milliseconds>(v, "max_recycle_backoff");
          },
          "s")
      .def_readwrite("max_abandoned_instances", &RecoveryOptions::max_abandoned_instances)
      .def("__repr__", [](const RecoveryOptions& r) {
        return "RecoveryOptions(max_recycle_attempts=" + std::to_string(r.max_recycle_attempts) +
               ", recycle_backoff=" + std::to_string(to_seconds(r.recycle_backoff)) +
               ", max_recycle_backoff=" + std::to_string(to_seconds(r.max_recycle_backoff)) +
               ", max_abandoned_instances=" + std::to_string(r.max_abandoned_instances) + ")";
      });
}

}  // namespace asyncinfer::python
