// async_infer_queue.cpp — asyncinfer.AsyncInferQueue: a pool of requests in flight over
// Engine::submit with a callback, after OpenVINO's (engine.hpp declares init_async_infer_queue).
#include <pybind11/stl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "convert.hpp"
#include "engine.hpp"
#include "tensors.hpp"

namespace asyncinfer::python {
namespace {

/// OpenVINO's AsyncInferQueue (pyopenvino/core/async_infer_queue.cpp) over Engine::submit with a
/// callback: `jobs` requests in flight at most; start_async waits (without the GIL) for a free
/// job; the user callback runs on the completion thread with the GIL; exceptions it raises are
/// logged, counted, and the first is raised again by wait_all(), as OpenVINO does.
class PyAsyncInferQueue {
 public:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int busy = 0;  // under mu
    int jobs = 0;
    PyRef callback;             // GIL
    std::vector<PyRef> errors;  // GIL
  };

  PyAsyncInferQueue(py::object engine, int jobs)
      : engine_obj_(std::move(engine)),
        engine_(engine_obj_.cast<PyEngine&>()),
        state_(std::make_shared<State>()) {
    if (jobs < 0)
      raise_invalid("AsyncInferQueue: jobs is " + std::to_string(jobs) + ", expected >= 0");
    if (jobs == 0) {
      // Enough to keep every worker's in-flight window full of full batches.
      const EngineOptions& o = engine_.engine().options();
      std::int64_t batch = o.batching.max_batch_size.value_or(1);  // set: the value in effect
      if (!engine_.engine().signature().batched) batch = 1;
      std::int64_t n = static_cast<std::int64_t>(o.workers) * o.max_inflight_per_worker * batch;
      n = std::min<std::int64_t>(n, static_cast<std::int64_t>(o.queue_capacity));
      jobs = static_cast<int>(std::max<std::int64_t>(n, 1));
    }
    state_->jobs = jobs;
  }

  void set_callback(const py::object& fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) {
      raise_invalid("AsyncInferQueue.set_callback: fn is not callable");
    }
    state_->callback = fn.is_none() ? PyRef() : PyRef(fn);
  }

  void start_async(const py::object& inputs, const py::object& userdata, const py::object& timeout,
                   int priority, const py::object& deadline, bool share_inputs) {
    drain_releases();
    Engine& e = engine_.engine();
    RequestOptions ro = request_options(timeout, priority, deadline, py::none(), py::none());
    Inputs in = to_inputs(inputs, e.request_signature(), share_inputs);
    take_job();
    auto st = state_;
    Engine::Callback cb = [st, userdata = PyRef(userdata),
                           owner = static_cast<const void*>(engine_.holder().get()),
                           stats = engine_.holder()->stats](const Result<Outputs>& r) mutable {
      {
        LibraryGil gil(owner);
        if (gil) {
          deliver(*st, r, userdata, stats.get());
          userdata.reset();
        } else {
          userdata.leak();
        }
      }
      {
        std::lock_guard lock(st->mu);
        --st->busy;
      }
      st->cv.notify_all();
    };
    Status s = submit_call(e, [&] { return e.submit(std::move(in), std::move(cb), ro); });
    if (!s.ok()) {
      give_back_job();
      raise_status(s);
    }
  }

  void wait_all() {
    if (CallbackScope::inside(engine_.holder().get())) {
      raise_status(failed_precondition_error(
          "AsyncInferQueue.wait_all() called from a callback: it would wait for itself"));
    }
    without_gil([&] {
      std::unique_lock lock(state_->mu);
      state_->cv.wait(lock, [&] { return state_->busy == 0; });
    });
    drain_releases();
    if (!state_->errors.empty()) {
      py::object first = state_->errors.front().object();
      state_->errors.clear();
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(first.ptr())), first.ptr());
      throw py::error_already_set();
    }
  }

  bool is_ready() const {
    std::lock_guard lock(state_->mu);
    return state_->busy < state_->jobs;
  }
  int jobs() const noexcept { return state_->jobs; }
  int busy() const {
    std::lock_guard lock(state_->mu);
    return state_->busy;
  }

 private:
  static void deliver(State& st, const Result<Outputs>& r, const PyRef& userdata,
                      BindingStats* stats) {
    try {
      py::object arg = r.ok() ? py::object(to_python(*r)) : make_exception(r.status());
      if (st.callback) {
        // Hold our own reference: the callback may replace itself with set_callback().
        py::object fn = st.callback.object();
        try {
          fn(arg, userdata ? userdata.object() : py::none());
        } catch (py::error_already_set& e) {
          st.errors.emplace_back(e.value());
          report_callback_exception(e, "AsyncInferQueue callback", stats);
        }
      } else if (!r.ok()) {
        st.errors.emplace_back(arg);  // no callback to tell: wait_all() raises it
      }
    } catch (py::error_already_set& e) {
      report_callback_exception(e, "AsyncInferQueue result conversion", stats);
    }
  }

  void take_job() {
    {
      std::lock_guard lock(state_->mu);
      if (state_->busy < state_->jobs) {
        ++state_->busy;
        return;
      }
    }
    if (CallbackScope::inside(engine_.holder().get())) {
      raise_status(resource_exhausted_error(
          "AsyncInferQueue.start_async() from a callback while all " +
          std::to_string(state_->jobs) +
          " jobs are busy: waiting would block the callback that frees one"));
    }
    without_gil([&] {
      std::unique_lock lock(state_->mu);
      state_->cv.wait(lock, [&] { return state_->busy < state_->jobs; });
      ++state_->busy;
    });
  }

  void give_back_job() {
    {
      std::lock_guard lock(state_->mu);
      --state_->busy;
    }
    state_->cv.notify_all();
  }

  py::object engine_obj_;  // keeps the engine alive
  PyEngine& engine_;
  std::shared_ptr<State> state_;
};

}  // namespace

void init_async_infer_queue(py::module_& m) {
  py::class_<PyAsyncInferQueue>(m, "AsyncInferQueue", R"doc(
A pool of ``jobs`` requests in flight, after OpenVINO's AsyncInferQueue.

    queue = asyncinfer.AsyncInferQueue(engine, jobs=8)
    queue.set_callback(lambda outputs, userdata: ...)
    for i, x in enumerate(images):
        queue.start_async(x, userdata=i)     # waits while all jobs are busy
    queue.wait_all()

jobs=0 picks workers × max_inflight_per_worker × max batch size. The callback receives the
outputs (a list of numpy arrays) or the exception the request ended with, and the userdata; it
runs on the engine's completion thread holding the GIL. An exception it raises is logged and
counted, and wait_all() raises the first one (as OpenVINO does). Without a callback, successful
results are dropped and failures are raised by wait_all().
)doc")
      .def(py::init<py::object, int>(), py::arg("engine"), py::arg("jobs") = 0)
      .def("set_callback", &PyAsyncInferQueue::set_callback, py::arg("fn"),
           "Sets fn(outputs_or_exception, userdata), called once per request (None: none).")
      .def("start_async", &PyAsyncInferQueue::start_async, py::arg("inputs"),
           py::arg("userdata") = py::none(), py::kw_only(), py::arg("timeout") = py::none(),
           py::arg("priority") = 0, py::arg("deadline") = py::none(),
           py::arg("share_inputs") = false,
           (std::string(R"doc(
Starts one request; blocks, without the GIL, while all jobs are busy. Raises what submit()
raises for a refused request, and ResourceExhausted when called from a callback while all jobs
are busy (waiting there would block the callback that frees one).
)doc") + kInputsDoc)
               .c_str())
      .def("wait_all", &PyAsyncInferQueue::wait_all, R"doc(
Blocks, without the GIL, until every started request has ended and its callback returned;
then raises the first exception a callback raised (or a failure nobody was called back for)
since the last wait_all().
)doc")
      .def("is_ready", &PyAsyncInferQueue::is_ready,
           "True when a job is free (start_async will not wait).")
      .def_property_readonly("jobs", &PyAsyncInferQueue::jobs, "Requests in flight at most.")
      .def_property_readonly("busy", &PyAsyncInferQueue::busy, "Requests in flight now.")
      .def("__len__", &PyAsyncInferQueue::jobs);
}

}  // namespace asyncinfer::python
