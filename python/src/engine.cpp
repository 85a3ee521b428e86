// engine.cpp — asyncinfer.Engine over asyncinfer::Engine (engine.hpp): its arguments, methods,
// metrics and the class itself. The option and policy classes are in options.cpp,
// AsyncInferQueue in async_infer_queue.cpp.
#include "engine.hpp"

#include <pybind11/stl.h>

#include <vector>

#include "convert.hpp"
#include "future.hpp"
#include "options.hpp"
#include "tensors.hpp"

namespace asyncinfer::python {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

// ---- futures of engine requests --------------------------------------------------------------

class EngineSource final : public FutureSource {
 public:
  EngineSource(Future<Outputs> f, const EngineHolder* holder) : f_(std::move(f)) {
    owner = holder;
    stats = holder->stats;
  }
  bool ready() const noexcept override { return f_.is_ready(); }
  void wait() override { f_.wait(); }
  bool wait_for(nanoseconds timeout) override { return f_.wait_for(timeout); }
  Status wait_refused() override { return f_.state()->wait_would_never_end(); }
  bool cancel() override { return f_.cancel(); }
  Status status() const override { return f_.state()->result().status(); }
  py::object value() override { return to_python(f_.state()->result().value()); }
  void on_complete(detail::UniqueFunction<void()> fn) override {
    f_.on_complete([fn = std::move(fn)](const Result<Outputs>&) mutable { fn(); });
  }

 private:
  Future<Outputs> f_;
};

// ---- arguments ---------------------------------------------------------------------------------

std::shared_ptr<Model> model_arg(const py::object& model) {
  if (py::isinstance<py::str>(model)) {
    const auto uri = model.cast<std::string>();
    auto m = without_gil([&] { return load_model(uri); });
    if (!m.ok()) raise_status(m.status());
    return *m;
  }
  return model.cast<std::shared_ptr<Model>>();
}

std::shared_ptr<Device> device_arg(const py::object& device) {
  if (py::isinstance<py::str>(device)) {
    auto d = open_device(device.cast<std::string>());
    if (!d.ok()) raise_status(d.status());
    return *d;
  }
  return device.cast<std::shared_ptr<Device>>();
}

// ---- metrics -----------------------------------------------------------------------------------

EngineMetrics snapshot(const PyEngine& e) {
  EngineMetrics m = e.engine().metrics();
  m.callback_exceptions += e.holder()->stats->callback_exceptions.load(std::memory_order_relaxed);
  return m;
}

py::dict metrics_dict(const EngineMetrics& m) {
  py::dict d;
  d["model"] = m.model;
  d["uptime_s"] = m.uptime_s;
  d["submitted"] = m.submitted;
  d["rejected"] = m.rejected;
  d["completed"] = m.completed;
  d["failed"] = m.failed;
  d["timed_out"] = m.timed_out;
  d["cancelled"] = m.cancelled;
  d["shut_down"] = m.shut_down;
  d["failures_by_reason"] = m.failures_by_reason;
  d["rejections_by_reason"] = m.rejections_by_reason;
  d["batches"] = m.batches;
  d["attempts"] = m.attempts;
  d["retries"] = m.retries;
  d["retries_denied_by_budget"] = m.retries_denied_by_budget;
  d["split_batches"] = m.split_batches;
  d["late_completions"] = m.late_completions;
  d["callback_exceptions"] = m.callback_exceptions;
  d["model_exceptions"] = m.model_exceptions;
  d["watchdog_fired"] = m.watchdog_fired;
  d["queue_depth"] = m.queue_depth;
  d["inflight_requests"] = m.inflight_requests;
  d["retry_waiting"] = m.retry_waiting;
  d["sequences_live"] = m.sequences_live;
  d["sequence_backlog"] = m.sequence_backlog;
  d["sequences_idle_released"] = m.sequences_idle_released;
  d["sequence_backlog_expired"] = m.sequence_backlog_expired;
  d["batches_per_s"] = m.batches_per_s;
  d["late_failures"] = m.late_failures;
  d["late_failures_by_reason"] = m.late_failures_by_reason;
  d["result_store_size"] = m.result_store_size;
  d["ordered_backlog"] = m.ordered_backlog;
  d["ordered_backlog_total"] = m.ordered_backlog_total;
  d["live_workers"] = m.live_workers;
  py::list workers;
  for (const WorkerMetrics& w : m.workers) {
    py::dict wd;
    wd["index"] = w.index;
    wd["breaker"] = w.breaker;
    wd["batches"] = w.batches;
    wd["failed_batches"] = w.failed_batches;
    wd["recycles"] = w.recycles;
    wd["recycle_failures"] = w.recycle_failures;
    wd["health"] = w.health;
    wd["health_reason"] = w.health_reason;
    wd["stream_batches"] = w.stream_batches;
    wd["abandoned_instances"] = w.abandoned_instances;
    wd["inflight_batches"] = w.inflight_batches;
    workers.append(wd);
  }
  d["workers"] = workers;
  d["queue_us"] = histogram_dict(m.queue_us);
  d["compute_us"] = histogram_dict(m.compute_us);
  d["request_us"] = histogram_dict(m.request_us);
  d["batch_size"] = histogram_dict(m.batch_size);
  return d;
}

// ---- Engine methods ------------------------------------------------------------------------

/// The callback of submit(callback=): fn(outputs or exception), once, GIL held.
Engine::Callback python_callback(const py::object& fn,
                                 const std::shared_ptr<EngineHolder>& holder) {
  if (!PyCallable_Check(fn.ptr())) raise_invalid("submit: callback is not callable");
  return [fn = PyRef(fn), owner = static_cast<const void*>(holder.get()),
          stats = holder->stats](const Result<Outputs>& r) mutable {
    LibraryGil gil(owner);
    if (!gil) return fn.leak();
    try {
      py::object arg = r.ok() ? py::object(to_python(*r)) : make_exception(r.status());
      fn.object()(arg);
    } catch (py::error_already_set& e) {
      report_callback_exception(e, "callback " + py::repr(fn.get()).cast<std::string>(),
                                stats.get());
    }
    fn.reset();
  };
}

std::optional<SequenceFlags> sequence_flags(const py::object& id, bool start, bool end) {
  if (id.is_none()) {
    if (start || end) raise_invalid("sequence_start and sequence_end need a sequence_id");
    return std::nullopt;
  }
  SequenceFlags f;
  f.start = start;
  f.end = end;
  if (py::isinstance<py::str>(id)) {
    f.id = id.cast<std::string>();
  } else if (py::isinstance<py::int_>(id) && !py::isinstance<py::bool_>(id)) {
    if (id.cast<py::int_>() < py::int_(0)) {
      raise_invalid("sequence_id must be a non-negative int (uint64) or a str");
    }
    f.id = id.cast<std::uint64_t>();
  } else {
    raise_invalid("sequence_id must be an int (uint64) or a str, got " +
                  py::repr(id).cast<std::string>());
  }
  return f;
}

DType dtype_arg(const py::handle& v, const std::string& what) {
  auto d = parse_dtype(py::str(v).cast<std::string>());
  if (!d.ok()) raise_invalid(what + ": " + std::string(d.status().message()));
  return *d;
}

/// Engine(sequence_batching=...): a dict with the fields of SequenceBatchingOptions (engine.hpp).
SequenceBatchingOptions sequence_batching_arg(const py::object& v) {
  if (!PyDict_Check(v.ptr())) {
    raise_invalid("sequence_batching: expected a dict, got " + py::repr(v).cast<std::string>());
  }
  const auto d = py::reinterpret_borrow<py::dict>(v);
  static const char* const kKeys[] = {"strategy", "slots_per_worker", "max_sequence_idle",
                                      "controls", "states",           "model_name"};
  for (const auto& [k, unused] : d) {
    const std::string key = py::str(k).cast<std::string>();
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      raise_invalid("sequence_batching: unknown key '" + key +
                    "' (strategy, slots_per_worker, max_sequence_idle, controls, states, "
                    "model_name)");
    }
  }
  SequenceBatchingOptions o;
  if (d.contains("strategy")) {
    const std::string s = py::str(d["strategy"]).cast<std::string>();
    if (s == "direct") {
      o.strategy = SequenceBatchingOptions::Strategy::direct;
    } else if (s == "oldest") {
      o.strategy = SequenceBatchingOptions::Strategy::oldest;
    } else {
      raise_invalid("sequence_batching: strategy '" + s + "': expected 'direct' or 'oldest'");
    }
  }
  if (d.contains("slots_per_worker")) o.slots_per_worker = d["slots_per_worker"].cast<int>();
  if (d.contains("max_sequence_idle")) {
    o.max_sequence_idle =
        to_duration_as<microseconds>(d["max_sequence_idle"], "sequence_batching max_sequence_idle");
  }
  if (d.contains("model_name")) o.model_name = py::str(d["model_name"]).cast<std::string>();
  if (d.contains("controls")) {
    for (const py::handle c : d["controls"]) {
      const auto cd = py::reinterpret_borrow<py::dict>(c);
      SequenceControl sc;
      const std::string kind = py::str(cd["kind"]).cast<std::string>();
      if (kind == "start") {
        sc.kind = SequenceControl::Kind::start;
      } else if (kind == "end") {
        sc.kind = SequenceControl::Kind::end;
      } else if (kind == "ready") {
        sc.kind = SequenceControl::Kind::ready;
      } else if (kind == "corrid") {
        sc.kind = SequenceControl::Kind::corrid;
      } else {
        raise_invalid("sequence_batching control kind '" + kind +
                      "': expected start, end, ready or corrid");
      }
      sc.input = py::str(cd["input"]).cast<std::string>();
      if (cd.contains("dtype")) sc.dtype = dtype_arg(cd["dtype"], "sequence_batching control");
      if (cd.contains("false_true")) {
        auto ft = cd["false_true"].cast<std::vector<double>>();
        if (ft.size() != 2) raise_invalid("sequence_batching control false_true: 2 values");
        sc.false_value = ft[0];
        sc.true_value = ft[1];
      }
      o.controls.push_back(std::move(sc));
    }
  }
  if (d.contains("states")) {
    for (const py::handle st : d["states"]) {
      const auto sd = py::reinterpret_borrow<py::dict>(st);
      SequenceState ss;
      ss.input = py::str(sd["input"]).cast<std::string>();
      ss.output = py::str(sd["output"]).cast<std::string>();
      ss.dtype = dtype_arg(sd["dtype"], "sequence_batching state");
      ss.dims = sd["dims"].cast<Shape>();
      o.states.push_back(std::move(ss));
    }
  }
  return o;
}

py::object submit(PyEngine& self, const py::object& inputs, const py::object& callback,
                  const py::object& timeout, int priority, const py::object& deadline,
                  const py::object& sequence_key, const py::object& tag, bool share_inputs,
                  const py::object& sequence_id, bool sequence_start, bool sequence_end) {
  drain_releases();
  Engine& e = self.engine();
  RequestOptions ro = request_options(timeout, priority, deadline, sequence_key, tag);
  ro.sequence = sequence_flags(sequence_id, sequence_start, sequence_end);
  Inputs in = to_inputs(inputs, e.request_signature(), share_inputs);
  if (!callback.is_none()) {
    Engine::Callback cb = python_callback(callback, self.holder());
    Status s = submit_call(e, [&] { return e.submit(std::move(in), std::move(cb), ro); });
    if (!s.ok()) raise_status(s);
    return py::none();
  }
  // Bad input raises here and nothing is submitted; the engine's other refusals (queue full,
  // stopped) arrive in the returned future, which is then already done, as in C++.
  Status v = validate_inputs(e.request_signature(), in);
  if (!v.ok()) raise_status(v.with_context("bad input"));
  Future<Outputs> f = submit_call(e, [&] { return e.submit(std::move(in), ro); });
  return make_future(std::make_unique<EngineSource>(std::move(f), self.holder().get()));
}

py::object infer(PyEngine& self, const py::object& inputs, const py::object& timeout, int priority,
                 const py::object& deadline, const py::object& sequence_key, const py::object& tag,
                 bool share_inputs, const py::object& sequence_id, bool sequence_start,
                 bool sequence_end) {
  drain_releases();
  Engine& e = self.engine();
  RequestOptions ro = request_options(timeout, priority, deadline, sequence_key, tag);
  ro.sequence = sequence_flags(sequence_id, sequence_start, sequence_end);
  Inputs in = to_inputs(inputs, e.request_signature(), share_inputs);
  Result<Outputs> r = without_gil([&] { return e.infer(std::move(in), ro); });
  drain_releases();
  if (!r.ok()) raise_status(r.status());
  return to_python(*r);
}

void submit_id(PyEngine& self, const std::string& id, const py::object& inputs,
               const py::object& timeout, int priority, const py::object& deadline,
               const py::object& sequence_key, const py::object& tag, bool share_inputs,
               const py::object& sequence_id, bool sequence_start, bool sequence_end) {
  drain_releases();
  Engine& e = self.engine();
  RequestOptions ro = request_options(timeout, priority, deadline, sequence_key, tag);
  ro.sequence = sequence_flags(sequence_id, sequence_start, sequence_end);
  Inputs in = to_inputs(inputs, e.request_signature(), share_inputs);
  Status s = submit_call(e, [&] { return e.submit(id, std::move(in), ro); });
  if (!s.ok()) raise_status(s);
}

py::object result_by_id(PyEngine& self, const std::string& id, const py::object& timeout) {
  drain_releases();
  Engine& e = self.engine();
  auto t = to_duration(timeout, "timeout").value_or(nanoseconds::max());
  if (t < nanoseconds::zero()) t = nanoseconds::zero();
  Result<Outputs> r = without_gil([&] { return e.result(id, t); });
  if (!r.ok()) raise_status(r.status());
  return to_python(*r);
}

void shutdown(PyEngine& self, const py::object& mode, const py::object& drain_timeout) {
  if (CallbackScope::inside(self.holder().get())) {
    raise_status(failed_precondition_error(
        "Engine.shutdown() called from one of this engine's callbacks: it would wait for the "
        "callback itself; call it from another thread"));
  }
  const ShutdownMode m = shutdown_mode(mode);
  std::optional<milliseconds> dt;
  if (auto d = to_duration(drain_timeout, "drain_timeout")) {
    dt = std::chrono::duration_cast<milliseconds>(*d);
  }
  without_gil([&] { self.engine().shutdown(m, dt); });
  drain_releases();
}

// ---- documentation -----------------------------------------------------------------------------

constexpr const char* kEngineDoc = R"doc(
The inference engine (C++ asyncinfer::Engine): a bounded priority queue, a dynamic batcher,
``workers`` workers (each one stream and one model instance), deadlines, retries, a result store
for the id-based API, metrics.

Engine(model, device='cpu', *, <every EngineOptions field>)

model: an asyncinfer.Model, or a URI for load_model ('builtin:identity', 'models/data/digits.pt', 'resnet50.onnx').
device: an asyncinfer.Device, or a spec for open_device ('cpu', 'sim', 'cuda:0').

Units: every duration is in seconds (int, float or datetime.timedelta) except
``max_queue_delay_us`` (microseconds, Triton's max_queue_delay_microseconds).

Options (defaults are the C++ EngineOptions defaults):
  workers                 workers (streams + model instances), the article's §3.2 consumers;
                          0 = one per core for a model that computes on host cores, else 1
  max_inflight_per_worker batches queued on a worker's stream ahead of completion
  queue_capacity          requests waiting in the queue
  queue_full_policy       'reject' (ResourceExhausted at once) or 'block' (wait up to submit_timeout)
  submit_timeout          s; how long 'block' waits for queue space
  completion_threads      threads that run callbacks and fulfil futures
  spin_wait_us            µs an engine thread spins for its next piece of work at low load
                          before it sleeps (0..1000; 0 = sleep at once)
  priority_levels         priorities 1 (highest) .. priority_levels
  default_priority        the priority of requests that give none
  priority_aging          s; 0 = off; a request queued this long is served as priority 1
  max_batch_size          largest batch the engine forms, in rows; None = the model's batch
                          limit (64 when it sets none); 1 = no batching
  preferred_batch_sizes   batch sizes dispatched at once when reachable
  max_queue_delay_us      µs a forming batch may wait for more requests
  split_failed_batches    re-run a failed batch request by request (one bad request fails alone)
  ordered_delivery        results reach futures/callbacks in submit order (per sequence_key)
  default_timeout         s or None; requests may only shorten it unless allow_timeout_override
  allow_timeout_override  a request's timeout may exceed default_timeout
  admission_control       refuse at submit a request whose predicted wait exceeds its deadline
  retry                   asyncinfer.RetryPolicy (or a dict of its fields)
  breaker                 asyncinfer.CircuitBreakerOptions (or a dict of its fields)
  recovery                asyncinfer.RecoveryOptions (or a dict of its fields)
  watchdog                s; 0 = off; a batch not done in this time fails and its worker is recycled
  result_store_capacity   finished results kept for the id-based API
  result_ttl              s; finished results older than this are forgotten
  intra_op_threads        libtorch threads per instance; 0 = 1 (docs/models.md, "Threads")
  drain_timeout           s; shutdown('drain') falls back to cancel after this long

Raises InvalidArgument naming a bad option; errors creating model instances pass through (e.g.
Unavailable for a model that cannot run on the device). Creating the engine blocks (model
instances are made and warmed up) with the GIL released.

A context manager: ``with Engine(...) as engine:`` ends in shutdown('drain'). At interpreter
exit every live engine is shut down (drain, bounded by drain_timeout), so requests in flight
end and their callbacks run. Thread-safe: every method may be called from any Python thread;
shutdown() not from one of the engine's own callbacks.
)doc";

}  // namespace

RequestOptions request_options(const py::object& timeout, int priority, const py::object& deadline,
                               const py::object& sequence_key, const py::object& tag) {
  RequestOptions o;
  o.priority = priority;
  if (auto t = to_duration(timeout, "timeout")) {
    o.timeout = std::chrono::duration_cast<microseconds>(*t);
  }
  o.deadline = to_deadline(deadline, "deadline");
  if (!sequence_key.is_none()) o.sequence_key = py::str(sequence_key).cast<std::string>();
  if (!tag.is_none()) o.tag = py::str(tag).cast<std::string>();
  return o;
}

const char* const kInputsDoc = R"doc(
inputs: one array (a model with one input), a list/tuple in signature order, or a dict by input
name. Each is a numpy.ndarray, a CPU torch.Tensor, an asyncinfer.Tensor or any CPU object with
__dlpack__, of dtype bool, int8..int64, uint8..uint64, float16/32/64 (bfloat16 through torch);
shapes as the signature says (dim 0 the batch). A non-contiguous array is copied once into a
contiguous one. Bad input raises InvalidArgument naming the input, what it got and what was
expected, and nothing is submitted.
timeout: s (None = the engine's default_timeout); priority: 1 = highest, 0 = the engine's
default; deadline: an absolute time.monotonic() value; sequence_key: ordered-delivery key;
tag: free text echoed in error messages.
sequence_id, sequence_start, sequence_end: an engine with sequence_batching (a stateful model)
needs sequence_id (an int, uint64, or a str) on every request, sequence_start=True on a
sequence's first request and sequence_end=True on its last (Triton's sequence parameters); the
inputs then leave out what sequence batching fills (Engine.request_signature).)doc";

PyEngine::PyEngine(std::shared_ptr<Model> model, std::shared_ptr<Device> device,
                   EngineOptions options)
    : model_(std::move(model)),
      device_(std::move(device)),
      holder_(std::make_shared<EngineHolder>()) {
  if (exiting()) raise_status(unavailable_error("the interpreter is exiting"));
  auto e = without_gil([&] { return Engine::create(model_, device_, std::move(options)); });
  if (!e.ok()) raise_status(e.status());
  holder_->engine = std::move(*e);
  register_for_exit(holder_);
}

PyEngine::~PyEngine() {
  if (!holder_) return;
  unregister_for_exit(holder_.get());
  if (CallbackScope::current() != nullptr) {
    // The last reference went on a library thread (a callback, or the garbage collector running
    // there): on one of this engine's own completion threads its destructor would wait for that
    // very thread, and on another engine's or a pipeline's it would hold that thread up.
    destroy_elsewhere(std::move(holder_));
    return;
  }
  without_gil([&] { holder_.reset(); });
  drain_releases();
}

void init_engine(py::module_& m) {
  const EngineOptions d;
  py::class_<PyEngine>(m, "Engine", kEngineDoc)
      .def(py::init([](const py::object& model, const py::object& device, int workers,
                       int max_inflight_per_worker, std::size_t queue_capacity,
                       const py::object& queue_full_policy_arg, const py::object& submit_timeout,
                       int completion_threads, std::int64_t spin_wait_us, int priority_levels,
                       int default_priority, const py::object& priority_aging,
                       std::optional<std::int64_t> max_batch_size,
                       std::vector<std::int64_t> preferred_batch_sizes,
                       std::int64_t max_queue_delay_us, bool split_failed_batches,
                       bool ordered_delivery, const py::object& default_timeout,
                       bool allow_timeout_override, bool admission_control, const py::object& retry,
                       const py::object& breaker, const py::object& recovery,
                       const py::object& watchdog, std::size_t result_store_capacity,
                       const py::object& result_ttl, int intra_op_threads,
                       const py::object& drain_timeout, const py::object& sequence_batching) {
             EngineOptions o;
             o.workers = workers;
             o.max_inflight_per_worker = max_inflight_per_worker;
             o.queue_capacity = queue_capacity;
             o.queue_full_policy = queue_full_policy(queue_full_policy_arg);
             o.submit_timeout = to_duration_as<microseconds>(submit_timeout, "submit_timeout");
             o.completion_threads = completion_threads;
             o.spin_wait = microseconds(spin_wait_us);
             o.priority_levels = priority_levels;
             o.default_priority = default_priority;
             o.priority_aging = to_duration_as<microseconds>(priority_aging, "priority_aging");
             o.batching.max_batch_size = max_batch_size;
             o.batching.preferred_batch_sizes = std::move(preferred_batch_sizes);
             o.batching.max_queue_delay = microseconds(max_queue_delay_us);
             o.batching.split_failed_batches = split_failed_batches;
             o.ordered_delivery = ordered_delivery;
             if (auto t = to_duration(default_timeout, "default_timeout")) {
               o.default_timeout = std::chrono::duration_cast<microseconds>(*t);
             }
             o.allow_timeout_override = allow_timeout_override;
             o.admission_control = admission_control;
             o.retry = policy_arg<RetryPolicy>(retry, "retry", "RetryPolicy");
             o.breaker =
                 policy_arg<CircuitBreakerOptions>(breaker, "breaker", "CircuitBreakerOptions");
             o.recovery = policy_arg<RecoveryOptions>(recovery, "recovery", "RecoveryOptions");
             o.watchdog = to_duration_as<milliseconds>(watchdog, "watchdog");
             o.result_store_capacity = result_store_capacity;
             o.result_ttl = to_duration_as<milliseconds>(result_ttl, "result_ttl");
             o.intra_op_threads = intra_op_threads;
             o.drain_timeout = to_duration_as<milliseconds>(drain_timeout, "drain_timeout");
             if (!sequence_batching.is_none()) {
               o.sequence_batching = sequence_batching_arg(sequence_batching);
             }
             return std::make_unique<PyEngine>(model_arg(model), device_arg(device), std::move(o));
           }),
           py::arg("model"), py::arg("device") = "cpu", py::kw_only(),
           py::arg("workers") = d.workers,
           py::arg("max_inflight_per_worker") = d.max_inflight_per_worker,
           py::arg("queue_capacity") = d.queue_capacity, py::arg("queue_full_policy") = "reject",
           py::arg("submit_timeout") = to_seconds(d.submit_timeout),
           py::arg("completion_threads") = d.completion_threads,
           py::arg("spin_wait_us") = d.spin_wait.count(),
           py::arg("priority_levels") = d.priority_levels,
           py::arg("default_priority") = d.default_priority,
           py::arg("priority_aging") = to_seconds(d.priority_aging),
           py::arg("max_batch_size") = py::none(),
           py::arg("preferred_batch_sizes") = d.batching.preferred_batch_sizes,
           py::arg("max_queue_delay_us") = d.batching.max_queue_delay.count(),
           py::arg("split_failed_batches") = d.batching.split_failed_batches,
           py::arg("ordered_delivery") = d.ordered_delivery,
           py::arg("default_timeout") = py::none(),
           py::arg("allow_timeout_override") = d.allow_timeout_override,
           py::arg("admission_control") = d.admission_control, py::arg("retry") = py::none(),
           py::arg("breaker") = py::none(), py::arg("recovery") = py::none(),
           py::arg("watchdog") = to_seconds(d.watchdog),
           py::arg("result_store_capacity") = d.result_store_capacity,
           py::arg("result_ttl") = to_seconds(d.result_ttl),
           py::arg("intra_op_threads") = d.intra_op_threads,
           py::arg("drain_timeout") = to_seconds(d.drain_timeout),
           py::arg("sequence_batching") = py::none())
      .def("infer", &infer, py::arg("inputs"), py::kw_only(), py::arg("timeout") = py::none(),
           py::arg("priority") = 0, py::arg("deadline") = py::none(),
           py::arg("sequence_key") = py::none(), py::arg("tag") = py::none(),
           py::arg("share_inputs") = true, py::arg("sequence_id") = py::none(),
           py::arg("sequence_start") = false, py::arg("sequence_end") = false,
           (std::string(R"doc(
Synchronous inference (article §1.1): submits and blocks, without the GIL, until the request
ends. Returns the outputs, a list of numpy arrays (one per model output; bfloat16 outputs as
asyncinfer.Tensor). Raises the request's error: DeadlineExceeded, Cancelled, Aborted (shut
down), Unavailable (engine stopped), ResourceExhausted (queue full), Internal, ...

share_inputs (default True): the engine reads the arrays in place (no copy); since infer()
blocks until the request ends, only another thread writing them meanwhile could race.
)doc") + kInputsDoc)
               .c_str())
      .def("submit", &submit, py::arg("inputs"), py::kw_only(), py::arg("callback") = py::none(),
           py::arg("timeout") = py::none(), py::arg("priority") = 0,
           py::arg("deadline") = py::none(), py::arg("sequence_key") = py::none(),
           py::arg("tag") = py::none(), py::arg("share_inputs") = false,
           py::arg("sequence_id") = py::none(), py::arg("sequence_start") = false,
           py::arg("sequence_end") = false,
           (std::string(R"doc(
Asynchronous inference (article §2.2 / §2.1). Never blocks (except with
queue_full_policy='block', which waits without the GIL).

Without callback: returns an asyncinfer.Future (concurrent.futures.Future protocol; awaitable).
With callback: returns None; ``callback(outputs_or_exception)`` runs exactly once on the
engine's completion thread, holding the GIL: outputs is the list result() would return, or the
exception instance the request ended with. An exception raised by the callback is logged
(logger 'asyncinfer', with its traceback) and counted in metrics()['callback_exceptions'];
the engine goes on.

Bad input raises InvalidArgument here, and nothing is submitted. The engine's other refusals
(queue full: ResourceExhausted; stopped: Unavailable) raise here with a callback, and arrive in
the returned future (already done) without one, as in the C++ API.

share_inputs (default False): the arrays are copied once into engine memory, so the caller may
overwrite them as soon as submit returns (guarantee 6). True: no copy; do not write the arrays
until the request ends (OpenVINO's share_inputs).
)doc") + kInputsDoc)
               .c_str())
      .def("submit_id", &submit_id, py::arg("id"), py::arg("inputs"), py::kw_only(),
           py::arg("timeout") = py::none(), py::arg("priority") = 0,
           py::arg("deadline") = py::none(), py::arg("sequence_key") = py::none(),
           py::arg("tag") = py::none(), py::arg("share_inputs") = false,
           py::arg("sequence_id") = py::none(), py::arg("sequence_start") = false,
           py::arg("sequence_end") = false,
           (std::string(R"doc(
Id-based API (article §3.1): submits the request under ``id``; fetch it with result(id).
Never blocks (except with queue_full_policy='block'). Raises AlreadyExists while a request with
that id is pending or running, ResourceExhausted when the result store is full of live
requests, and the refusals of submit(). Inputs are copied unless share_inputs=True.
)doc") + kInputsDoc)
               .c_str())
      .def("result", &result_by_id, py::arg("id"), py::arg("timeout") = py::none(), R"doc(
The outputs of request ``id``: blocks, on a condition (no polling) and without the GIL, until it
ends or ``timeout`` seconds pass (None: no limit). Raises DeadlineExceeded when the wait runs
out (the request goes on) or the request timed out; NotFound for an unknown, expired or evicted
id (the message says which); the request's own error otherwise. Does not remove the entry
(release() does; result_ttl and result_store_capacity do anyway).
)doc")
      .def(
          "status",
          [](const PyEngine& self, const std::string& id) { return self.engine().status(id); },
          py::arg("id"),
          "The request's RequestState; RequestState.unknown for an unknown, expired, evicted or "
          "released id. Never blocks.")
      .def(
          "cancel",
          [](const PyEngine& self, const std::string& id) {
            Status s = self.engine().cancel(id);
            if (!s.ok()) raise_status(s);
          },
          py::arg("id"), R"doc(
Cancels request ``id``: a queued request leaves the queue at once, a running one ends Cancelled
at once. Raises NotFound for an unknown id, FailedPrecondition when it has already ended.
)doc")
      .def(
          "release",
          [](const PyEngine& self, const std::string& id) {
            Status s = self.engine().release(id);
            if (!s.ok()) raise_status(s);
          },
          py::arg("id"),
          "Forgets a finished request's result now instead of at result_ttl. Raises "
          "FailedPrecondition while it is pending or running, NotFound for an unknown id.")
      .def("shutdown", &shutdown, py::arg("mode") = "drain", py::arg("drain_timeout") = py::none(),
           R"doc(
Stops the engine: submits are refused (Unavailable) from now on. mode='drain' finishes queued
and running work (switching to cancel once drain_timeout seconds pass; None = the engine's
drain_timeout); mode='cancel' ends it as shut_down (Aborted) at once. Wakes every waiter, runs
every callback owed, joins every thread. Idempotent. Blocks, without the GIL. Raises
FailedPrecondition when called from one of this engine's callbacks.
)doc")
      .def("__enter__", [](const py::object& self) { return self; })
      .def(
          "__exit__",
          [](PyEngine& self, const py::args&) {
            shutdown(self, py::str("drain"), py::none());
            return false;
          },
          "shutdown('drain')")
      .def(
          "metrics", [](const PyEngine& self) { return metrics_dict(snapshot(self)); },
          R"doc(
A snapshot of the engine's metrics as a dict: request counts by outcome (submitted, rejected,
completed, failed, timed_out, cancelled, shut_down), failures_by_reason, batches, retries,
callback_exceptions (C++ and Python callbacks), gauges (queue_depth, inflight_requests),
per-worker dicts, and histograms (queue_us, compute_us, request_us in microseconds;
batch_size), each a dict with count, sum, max, mean, p50, p90, p99, bounds, counts.
)doc")
      .def(
          "prometheus",
          [](const PyEngine& self, const std::string& prefix) {
            return snapshot(self).to_prometheus(prefix);
          },
          py::arg("prefix") = "asyncinfer",
          "The metrics in the Prometheus text exposition format (0.0.4), names after Triton's.")
      .def(
          "health",
          [](const PyEngine& self) {
            const EngineHealth h = self.engine().health();
            py::dict out;
            out["live"] = h.live;
            out["ready"] = h.ready;
            out["reason"] = h.reason;
            py::list workers;
            for (const WorkerStatus& w : h.workers) {
              py::dict wd;
              wd["index"] = w.index;
              wd["health"] = std::string(to_string(w.health));
              wd["reason"] = w.reason;
              workers.append(wd);
            }
            out["workers"] = workers;
            return out;
          },
          R"doc(
The engine's health, for a readiness probe: a dict with live (shutdown has not begun), ready
(live and at least one worker healthy), reason (why not ready; '' when ready) and workers, a
list of dicts with index, health ('healthy', 'recovering', 'paused', 'unhealthy') and reason.
Never blocks; thread-safe.
)doc")
      .def_property_readonly(
          "request_signature",
          [](const PyEngine& self) { return self.engine().request_signature(); },
          "What a request brings and its result holds: signature without the inputs that "
          "sequence_batching fills and its state outputs (signature on other engines).")
      .def_property_readonly(
          "signature", [](const PyEngine& self) { return self.engine().signature(); },
          "The model's ModelSignature.")
      .def_property_readonly(
          "options", [](const PyEngine& self) { return options_dict(self.engine().options()); },
          "The engine's options as a dict, in the units of the constructor's arguments.")
      .def_property_readonly(
          "model", [](const PyEngine& self) { return self.model(); }, "The Model.")
      .def_property_readonly(
          "device", [](const PyEngine& self) { return self.device(); }, "The Device.");
}

}  // namespace asyncinfer::python
