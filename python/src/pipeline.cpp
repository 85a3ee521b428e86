// pipeline.cpp — asyncinfer.Pipeline and asyncinfer.Stage over asyncinfer::Pipeline (article §4).
//
// A Python value flows through the stages. A host stage is a Python callable, fn(value) ->
// value, run on the stage's thread holding the GIL. An engine stage (or a model stage) takes
// tensors and runs without the GIL: the value before it is converted to the engine's inputs
// (copied, so a stage may reuse its buffers), and its outputs reach the next host stage (or the
// result) as a list of numpy arrays. Window, ordered delivery, priorities and deadlines are the
// C++ pipeline's. An exception raised by a stage fails the item; result() raises that same
// exception (with its traceback), and the C++ metrics count the failure at that stage.
#include <pybind11/stl.h>

#include <algorithm>
#include <any>
#include <memory>
#include <vector>

#include "asyncinfer/pipeline.hpp"
#include "convert.hpp"
#include "engine.hpp"
#include "future.hpp"
#include "tensors.hpp"

namespace asyncinfer::python {
namespace {

/// Travels in PipelineItem::user: the Python value between stages, and a stage's exception.
struct ItemBox {
  PyRef value;
  PyRef error;
};
using BoxPtr = std::shared_ptr<ItemBox>;

/// Owns the C++ pipeline of one asyncinfer.Pipeline (not the library's PipelineCore): shared by the
/// Python object, the exit registry and the stages' Python code, like EngineHolder (engine.hpp).
struct PipelineHolder final : ExitStoppable {
  std::unique_ptr<Pipeline> pipeline;
  std::shared_ptr<BindingStats> stats = std::make_shared<BindingStats>();
  int exit_order() const noexcept override { return 1; }  // before the engines its stages use
  void stop_at_exit() noexcept override { pipeline->shutdown(ShutdownMode::drain); }
  void cancel_at_exit() noexcept override { pipeline->shutdown(ShutdownMode::cancel); }
};

py::object item_value(const PipelineItem& item, const ItemBox& box) {
  if (box.value) return box.value.object();
  return to_python(item.tensors);
}

class PipelineSource final : public FutureSource {
 public:
  PipelineSource(Future<PipelineItem> f, BoxPtr box, const PipelineHolder* holder)
      : f_(std::move(f)), box_(std::move(box)) {
    owner = holder;
    stats = holder->stats;
  }
  bool ready() const noexcept override { return f_.is_ready(); }
  void wait() override { f_.wait(); }
  bool wait_for(std::chrono::nanoseconds timeout) override { return f_.wait_for(timeout); }
  bool cancel() override { return f_.cancel(); }
  Status status() const override { return f_.state()->result().status(); }
  py::object value() override { return item_value(f_.state()->result().value(), *box_); }
  py::object python_error() override { return box_->error ? box_->error.object() : py::object(); }
  void on_complete(detail::UniqueFunction<void()> fn) override {
    f_.on_complete([fn = std::move(fn)](const Result<PipelineItem>&) mutable { fn(); });
  }

 private:
  Future<PipelineItem> f_;
  BoxPtr box_;
};

/// A stage as the user describes it.
struct PyStage {
  std::string name;
  StageKind kind = StageKind::host;
  py::object fn;  // host
  int concurrency = 1;
  py::object engine;  // engine stage: the asyncinfer.Engine
  std::shared_ptr<Model> model;
  std::shared_ptr<Device> device;
  int stream_depth = 2;

  bool takes_tensors() const { return kind != StageKind::host; }
  const ModelSignature& signature() const {
    return engine ? engine.cast<PyEngine&>().engine().signature() : model->signature();
  }
};

PyStage stage_from(const py::handle& h, std::size_t index) {
  if (py::isinstance<PyStage>(h)) return h.cast<PyStage>();
  if (py::isinstance<PyEngine>(h)) {
    PyStage s;
    s.name = "engine" + std::to_string(index);
    s.kind = StageKind::engine;
    s.engine = py::reinterpret_borrow<py::object>(h);
    return s;
  }
  if (PyCallable_Check(h.ptr())) {
    PyStage s;
    s.name = py::hasattr(h, "__name__") ? py::str(h.attr("__name__")).cast<std::string>()
                                        : "stage" + std::to_string(index);
    s.fn = py::reinterpret_borrow<py::object>(h);
    return s;
  }
  raise_invalid(
      "Pipeline: stage " + std::to_string(index) + " is a " +
      py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>() +
      "; expected an asyncinfer.Stage, a callable (a host stage) or an asyncinfer.Engine");
}

/// The C++ host stage for a Python callable.
HostStageFn host_stage(const PyStage& s, const ModelSignature* next, const PipelineHolder* holder) {
  auto fn = std::make_shared<PyRef>(s.fn);
  return [fn, next, owner = static_cast<const void*>(holder)](PipelineItem& item) -> Status {
    LibraryGil gil(owner);
    if (!gil) return aborted_error("the Python interpreter is exiting");
    ItemBox& box = **std::any_cast<BoxPtr>(&item.user);
    try {
      py::object in = item_value(item, box);
      box.value.reset();
      item.tensors.clear();
      py::object out = fn->object()(in);
      if (next != nullptr) {
        item.tensors = to_inputs(out, *next, /*share=*/false);
        Status v = validate_inputs(*next, item.tensors);
        if (!v.ok()) raise_status(v);
      } else {
        box.value = PyRef(out);
      }
      return Status();
    } catch (py::error_already_set& e) {
      if (e.trace()) PyException_SetTraceback(e.value().ptr(), e.trace().ptr());
      box.error = PyRef(e.value());
      StatusCode code = StatusCode::internal;
      if (py::hasattr(e.value(), "code")) {
        py::object c = e.value().attr("code");
        if (py::isinstance<py::str>(c)) {
          StatusCode parsed{};
          if (parse_status_code(c.cast<std::string>(), &parsed) && parsed != StatusCode::ok) {
            code = parsed;
          }
        }
      }
      const std::string type =
          py::str(py::type::handle_of(e.value()).attr("__name__")).cast<std::string>();
      return Status(code, type + ": " + py::str(e.value()).cast<std::string>());
    }
  };
}

class PyPipeline {
 public:
  PyPipeline(const py::sequence& stages, std::size_t window, bool ordered, int priority_levels,
             int default_priority, int completion_threads, const py::object& drain_timeout)
      : holder_(std::make_shared<PipelineHolder>()) {
    if (exiting()) raise_status(unavailable_error("the interpreter is exiting"));
    std::vector<PyStage> in;
    for (std::size_t i = 0; i < py::len(stages); ++i) in.push_back(stage_from(stages[i], i));
    std::vector<StageSpec> specs;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const PyStage& s = in[i];
      const ModelSignature* next =
          i + 1 < in.size() && in[i + 1].takes_tensors() ? &in[i + 1].signature() : nullptr;
      switch (s.kind) {
        case StageKind::host:
          specs.push_back(
              StageSpec::host(s.name, host_stage(s, next, holder_.get()), s.concurrency));
          break;
        case StageKind::engine:
          keep_.emplace_back(s.engine);
          owners_.push_back(s.engine.cast<PyEngine&>().holder().get());
          specs.push_back(StageSpec::run_engine(s.name, s.engine.cast<PyEngine&>().engine()));
          break;
        case StageKind::device:
          specs.push_back(StageSpec::run_model(s.name, s.device, s.model, s.stream_depth));
          break;
      }
    }
    if (!in.empty() && in.front().takes_tensors()) first_ = &in.front().signature();
    owners_.push_back(holder_.get());
    PipelineOptions o;
    o.window = window;
    o.ordered = ordered;
    o.priority_levels = priority_levels;
    o.default_priority = default_priority;
    o.completion_threads = completion_threads;
    o.drain_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        to_duration_required(drain_timeout, "drain_timeout"));
    auto p = without_gil([&] { return Pipeline::create(std::move(specs), o); });
    if (!p.ok()) raise_status(p.status());
    holder_->pipeline = std::move(*p);
    register_for_exit(holder_);
  }

  ~PyPipeline() {
    if (!holder_ || !holder_->pipeline) return;
    unregister_for_exit(holder_.get());
    if (CallbackScope::current() != nullptr) {
      // See ~PyEngine. The engines of engine stages go with it, released after it is gone.
      struct Doomed {
        std::vector<PyRef> keep;  // declared first: destroyed after the pipeline
        std::shared_ptr<PipelineHolder> holder;
      };
      auto doomed = std::make_shared<Doomed>(Doomed{std::move(keep_), std::move(holder_)});
      destroy_elsewhere(std::move(doomed));
      return;
    }
    without_gil([&] { holder_.reset(); });
    drain_releases();
  }
  PyPipeline(const PyPipeline&) = delete;
  PyPipeline& operator=(const PyPipeline&) = delete;

  py::object submit(const py::object& value, int priority, const py::object& timeout,
                    const py::object& deadline) {
    drain_releases();
    auto box = std::make_shared<ItemBox>();
    PipelineItem item = make_item(value, box);
    const ItemOptions io = item_options(priority, timeout, deadline);
    Future<PipelineItem> f =
        without_gil([&] { return holder_->pipeline->submit(std::move(item), io); });
    return make_future(
        std::make_unique<PipelineSource>(std::move(f), std::move(box), holder_.get()));
  }

  py::list run(const py::iterable& values, int priority, const py::object& timeout,
               const py::object& deadline) {
    drain_releases();
    std::vector<BoxPtr> boxes;
    std::vector<PipelineItem> items;
    for (py::handle v : values) {
      boxes.push_back(std::make_shared<ItemBox>());
      items.push_back(make_item(py::reinterpret_borrow<py::object>(v), boxes.back()));
    }
    const ItemOptions io = item_options(priority, timeout, deadline);
    auto results = without_gil([&] { return holder_->pipeline->run(std::move(items), io); });
    drain_releases();
    py::list out;
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) {
        if (boxes[i]->error) {
          py::object e = boxes[i]->error.object();
          PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
          throw py::error_already_set();
        }
        raise_status(results[i].status());
      }
      out.append(item_value(*results[i], *boxes[i]));
    }
    return out;
  }

  void shutdown(const py::object& mode) {
    const void* here = CallbackScope::current();
    if (here != nullptr && std::find(owners_.begin(), owners_.end(), here) != owners_.end()) {
      raise_status(failed_precondition_error(
          "Pipeline.shutdown() called from one of its stages or callbacks, or from a callback of "
          "an engine it uses: it would wait for itself"));
    }
    ShutdownMode m = ShutdownMode::drain;
    if (py::isinstance<ShutdownMode>(mode)) {
      m = mode.cast<ShutdownMode>();
    } else if (py::isinstance<py::str>(mode) && mode.cast<std::string>() == "cancel") {
      m = ShutdownMode::cancel;
    } else if (!py::isinstance<py::str>(mode) || mode.cast<std::string>() != "drain") {
      raise_invalid("shutdown: mode must be 'drain' or 'cancel'");
    }
    without_gil([&] { holder_->pipeline->shutdown(m); });
    drain_releases();
  }

  PipelineMetrics metrics() const { return holder_->pipeline->metrics(); }

 private:
  PipelineItem make_item(const py::object& value, const BoxPtr& box) {
    PipelineItem item;
    if (first_ != nullptr) {
      item.tensors = to_inputs(value, *first_, /*share=*/false);
      Status v = validate_inputs(*first_, item.tensors);
      if (!v.ok()) raise_status(v.with_context("bad input"));
    } else {
      box->value = PyRef(value);
    }
    item.user = box;
    return item;
  }

  static ItemOptions item_options(int priority, const py::object& timeout,
                                  const py::object& deadline) {
    ItemOptions io;
    io.priority = priority;
    if (auto t = to_duration(timeout, "timeout")) {
      io.timeout = std::chrono::duration_cast<std::chrono::microseconds>(*t);
    }
    io.deadline = to_deadline(deadline, "deadline");
    return io;
  }

  std::vector<PyRef> keep_;  // engines of engine stages: destroyed after the pipeline
  const ModelSignature* first_ = nullptr;
  std::vector<const void*> owners_;  // the threads shutdown() must not be called from
  std::shared_ptr<PipelineHolder> holder_;
};

py::dict metrics_dict(const PipelineMetrics& m) {
  py::dict d;
  d["submitted"] = m.submitted;
  d["completed"] = m.completed;
  d["failed"] = m.failed;
  d["timed_out"] = m.timed_out;
  d["cancelled"] = m.cancelled;
  d["shut_down"] = m.shut_down;
  d["in_flight"] = m.in_flight;
  d["max_in_flight"] = m.max_in_flight;
  d["elapsed_s"] = m.elapsed_s;
  d["items_per_s"] = m.items_per_s;
  d["bottleneck"] = m.bottleneck();
  py::list stages;
  for (const StageMetrics& s : m.stages) {
    py::dict sd;
    sd["name"] = s.name;
    sd["kind"] = s.kind;
    sd["concurrency"] = s.concurrency;
    sd["items"] = s.items;
    sd["failures"] = s.failures;
    sd["busy_s"] = s.busy_s;
    sd["utilisation"] = s.utilisation;
    sd["queued"] = s.queued;
    sd["queue_us"] = histogram_dict(s.queue_us);
    sd["service_us"] = histogram_dict(s.service_us);
    stages.append(sd);
  }
  d["stages"] = stages;
  d["latency_us"] = histogram_dict(m.latency_us);
  return d;
}

}  // namespace

void init_pipeline(py::module_& m) {
  py::class_<PyStage>(m, "Stage", R"doc(
One pipeline stage; make it with Stage.host, Stage.engine or Stage.model. In a Pipeline's stage
list a plain callable is a host stage and an asyncinfer.Engine an engine stage.
)doc")
      .def_static(
          "host",
          [](std::string name, py::object fn, int concurrency) {
            if (!PyCallable_Check(fn.ptr())) raise_invalid("Stage.host: fn is not callable");
            PyStage s;
            s.name = std::move(name);
            s.fn = std::move(fn);
            s.concurrency = concurrency;
            return s;
          },
          py::arg("name"), py::arg("fn"), py::arg("concurrency") = 1, R"doc(
A host stage: value = fn(value), on ``concurrency`` threads of its own, holding the GIL (so
concurrency > 1 helps only where fn releases it, as numpy and torch do). Before an engine or
model stage, fn returns that stage's inputs (an array, a list or a dict; copied). After one, fn
receives its outputs as a list of numpy arrays. An exception fn raises fails the item: result()
raises it.
)doc")
      .def_static(
          "engine",
          [](std::string name, py::object engine) {
            if (!py::isinstance<PyEngine>(engine)) {
              raise_invalid("Stage.engine: expected an asyncinfer.Engine");
            }
            PyStage s;
            s.name = std::move(name);
            s.kind = StageKind::engine;
            s.engine = std::move(engine);
            return s;
          },
          py::arg("name"), py::arg("engine"),
          "An engine stage: submits the item's tensors to ``engine`` (batching, deadlines, "
          "retries) and continues with its outputs; no GIL. The pipeline keeps the engine alive.")
      .def_static(
          "model",
          [](std::string name, py::object device, std::shared_ptr<Model> model, int depth) {
            PyStage s;
            s.name = std::move(name);
            s.kind = StageKind::device;
            if (py::isinstance<py::str>(device)) {
              auto d = open_device(device.cast<std::string>());
              if (!d.ok()) raise_status(d.status());
              s.device = *d;
            } else {
              s.device = device.cast<std::shared_ptr<Device>>();
            }
            s.model = std::move(model);
            s.stream_depth = depth;
            return s;
          },
          py::arg("name"), py::arg("device"), py::arg("model"), py::arg("stream_depth") = 2,
          "A model stage: runs ``model`` on its own instance and stream of ``device`` (no engine, "
          "no GIL); stream_depth items are enqueued ahead on the stream.")
      .def_readonly("name", &PyStage::name)
      .def("__repr__", [](const PyStage& s) {
        const char* kind = s.kind == StageKind::host     ? "host"
                           : s.kind == StageKind::engine ? "engine"
                                                         : "model";
        return "Stage." + std::string(kind) + "('" + s.name + "')";
      });

  const PipelineOptions d;
  py::class_<PyPipeline>(m, "Pipeline", R"doc(
Stages overlapped so that pre-processing, inference and post-processing of different items run
at the same time (article §4.1; C++ asyncinfer::Pipeline).

    with asyncinfer.Pipeline([preprocess, engine, postprocess], window=8) as pipe:
        futures = [pipe.submit(raw) for raw in images]
        labels = [f.result() for f in futures]

window: items in flight at most (submit blocks, without the GIL, while it is full);
ordered: results in submit order; priority_levels / default_priority as for the engine;
completion_threads: threads that run future callbacks; drain_timeout: s.
A context manager (ends in shutdown('drain')); stopped at interpreter exit like an engine.
)doc")
      .def(py::init<const py::sequence&, std::size_t, bool, int, int, int, const py::object&>(),
           py::arg("stages"), py::kw_only(), py::arg("window") = d.window,
           py::arg("ordered") = d.ordered, py::arg("priority_levels") = d.priority_levels,
           py::arg("default_priority") = d.default_priority,
           py::arg("completion_threads") = d.completion_threads,
           py::arg("drain_timeout") = to_seconds(d.drain_timeout))
      .def("submit", &PyPipeline::submit, py::arg("value"), py::kw_only(), py::arg("priority") = 0,
           py::arg("timeout") = py::none(), py::arg("deadline") = py::none(), R"doc(
Sends ``value`` through the stages; returns an asyncinfer.Future of the last stage's value.
Blocks, without the GIL, while the window is full. priority: 1 = highest (0 = default);
timeout: s; deadline: a time.monotonic() value. They travel with the item through every stage.
After shutdown the future holds Unavailable.
)doc")
      .def("run", &PyPipeline::run, py::arg("values"), py::kw_only(), py::arg("priority") = 0,
           py::arg("timeout") = py::none(), py::arg("deadline") = py::none(),
           "The article's infer_batch: submits every value (respecting the window), waits for all "
           "(without the GIL) and returns their results in order; raises the first failure.")
      .def("shutdown", &PyPipeline::shutdown, py::arg("mode") = "drain",
           "Stops: 'drain' finishes items in flight (cancel after drain_timeout); 'cancel' ends "
           "them as shut down at once. Joins every thread. Idempotent. Blocks without the GIL.")
      .def("__enter__", [](const py::object& self) { return self; })
      .def("__exit__",
           [](PyPipeline& self, const py::args&) {
             self.shutdown(py::str("drain"));
             return false;
           })
      .def(
          "metrics", [](const PyPipeline& self) { return metrics_dict(self.metrics()); },
          "Counts by outcome, in_flight, items_per_s, the bottleneck stage, per-stage dicts "
          "(items, failures, utilisation, queue and service histograms in µs), latency_us.")
      .def(
          "prometheus",
          [](const PyPipeline& self, const std::string& prefix) {
            return self.metrics().to_prometheus(prefix);
          },
          py::arg("prefix") = "asyncinfer", "The metrics in the Prometheus text format.");
}

}  // namespace asyncinfer::python
