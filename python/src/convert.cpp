// convert.cpp — the exception classes, the time conversions and metrics helpers (convert.hpp).
#include "convert.hpp"

#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <limits>

namespace asyncinfer::python {
namespace {

constexpr std::size_t kCodes = static_cast<std::size_t>(StatusCode::internal) + 1;
// Leaked on purpose: the classes live as long as the interpreter, and nothing here may run
// during static destruction.
std::array<PyObject*, kCodes> g_classes{};
PyObject* g_error = nullptr;
PyObject* g_timedelta = nullptr;

struct ClassSpec {
  StatusCode code;
  const char* name;
  const char* extra_base;  // "module:attr" of a built-in base, or nullptr
  const char* doc;
};

constexpr ClassSpec kSpecs[] = {
    {StatusCode::cancelled, "Cancelled", "concurrent.futures:CancelledError",
     "The request was cancelled (Future.cancel(), Engine.cancel(id)). Also a "
     "concurrent.futures.CancelledError."},
    {StatusCode::invalid_argument, "InvalidArgument", "builtins:ValueError",
     "Bad input or option: the message names what was wrong and what was expected. Never "
     "retried. Also a ValueError."},
    {StatusCode::deadline_exceeded, "DeadlineExceeded", "builtins:TimeoutError",
     "The request's timeout or deadline passed before it ended (or Engine.result(id, timeout) "
     "ran out). Also a TimeoutError."},
    {StatusCode::not_found, "NotFound", nullptr,
     "Unknown, expired or evicted request id; missing model file."},
    {StatusCode::already_exists, "AlreadyExists", nullptr,
     "A pending or running request already has this id."},
    {StatusCode::resource_exhausted, "ResourceExhausted", nullptr,
     "Queue full, result store full, admission refused, or out of memory."},
    {StatusCode::failed_precondition, "FailedPrecondition", nullptr,
     "The object is not in a state that allows the call (e.g. release() of a pending id)."},
    {StatusCode::aborted, "Aborted", nullptr,
     "Ended by shutdown before it could finish (the request's state is shut_down)."},
    {StatusCode::unavailable, "Unavailable", nullptr,
     "Transient: the engine is stopped or stopping, the device is busy or absent. Retryable."},
    {StatusCode::internal, "Internal", nullptr,
     "A broken invariant, an exception in a model or stage, a broken promise."},
};

py::object import_attr(const char* spec) {
  std::string s(spec);
  const auto colon = s.find(':');
  return py::module_::import(s.substr(0, colon).c_str()).attr(s.substr(colon + 1).c_str());
}

}  // namespace

void init_errors(py::module_& m) {
  py::dict base_dict;
  base_dict["code"] = py::none();
  g_error = PyErr_NewExceptionWithDoc(
      "asyncinfer.Error",
      "Base of every asyncinfer error. `code` is the C++ StatusCode name (e.g. "
      "'invalid_argument'); `message` (also str(e)) the C++ message.",
      PyExc_Exception, base_dict.ptr());
  if (g_error == nullptr) throw py::error_already_set();
  m.add_object("Error", py::handle(g_error));
  for (const ClassSpec& spec : kSpecs) {
    py::tuple bases = spec.extra_base != nullptr
                          ? py::make_tuple(py::handle(g_error), import_attr(spec.extra_base))
                          : py::make_tuple(py::handle(g_error));
    py::dict dict;
    dict["code"] = py::str(std::string(to_string(spec.code)));
    const std::string full = std::string("asyncinfer.") + spec.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), spec.doc, bases.ptr(), dict.ptr());
    if (cls == nullptr) throw py::error_already_set();
    g_classes[static_cast<std::size_t>(spec.code)] = cls;
    m.add_object(spec.name, py::handle(cls));
  }
  g_timedelta = import_attr("datetime:timedelta").release().ptr();
}

py::object make_exception(const Status& status) {
  const auto index = static_cast<std::size_t>(status.code());
  PyObject* cls = index < kCodes && g_classes[index] != nullptr ? g_classes[index] : g_error;
  py::str message(std::string(status.message()));
  py::object exc = py::reinterpret_borrow<py::object>(cls)(message);
  exc.attr("code") = py::str(std::string(to_string(status.code())));
  exc.attr("message") = message;
  return exc;
}

void raise_status(const Status& status) {
  py::object exc = make_exception(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void raise_invalid(const std::string& message) { raise_status(invalid_argument_error(message)); }

void raise_wait_timeout(const std::string& message) {
  PyErr_SetString(PyExc_TimeoutError, message.c_str());
  throw py::error_already_set();
}

StatusCode code_from_python(py::handle h, const char* what) {
  py::object code = py::reinterpret_borrow<py::object>(h);
  if (PyType_Check(h.ptr()) && py::hasattr(h, "code")) code = h.attr("code");
  if (py::isinstance<py::str>(code)) {
    StatusCode out{};
    if (parse_status_code(code.cast<std::string>(), &out)) return out;
  }
  raise_invalid(std::string(what) + ": " + py::repr(h).cast<std::string>() +
                " is not a status code; expected a code name such as 'unavailable' or an "
                "asyncinfer exception class such as asyncinfer.Unavailable");
}

std::optional<std::chrono::nanoseconds> to_duration(py::handle h, const char* what) {
  if (h.is_none()) return std::nullopt;
  double seconds = 0;
  if (PyObject_IsInstance(h.ptr(), g_timedelta) == 1) {
    seconds = h.attr("total_seconds")().cast<double>();
  } else if (PyFloat_Check(h.ptr()) || (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()))) {
    seconds = PyFloat_AsDouble(h.ptr());
    if (seconds == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  } else {
    raise_invalid(std::string(what) +
                  ": expected seconds (int, float or datetime.timedelta), got " +
                  std::string(py::str(py::type::handle_of(h).attr("__name__"))));
  }
  if (std::isnan(seconds)) raise_invalid(std::string(what) + ": NaN is not a duration");
  // Beyond what nanoseconds hold means "no limit" (the engine saturates such durations too).
  constexpr double kMax = static_cast<double>(std::numeric_limits<std::int64_t>::max()) / 1e9;
  if (seconds >= kMax) return std::chrono::nanoseconds::max();
  if (seconds <= -kMax) return std::chrono::nanoseconds::min();
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(seconds * 1e9)));
}

std::chrono::nanoseconds to_duration_required(py::handle h, const char* what) {
  auto d = to_duration(h, what);
  if (!d) raise_invalid(std::string(what) + ": expected seconds, got None");
  return *d;
}

std::optional<Clock::time_point> to_deadline(py::handle h, const char* what) {
  if (h.is_none()) return std::nullopt;
  if (!PyFloat_Check(h.ptr()) && !(PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()))) {
    raise_invalid(std::string(what) +
                  ": expected a time.monotonic() value in seconds (int or float), got " +
                  std::string(py::str(py::type::handle_of(h).attr("__name__"))));
  }
  const double seconds = PyFloat_AsDouble(h.ptr());
  if (std::isnan(seconds)) raise_invalid(std::string(what) + ": NaN is not a time");
  const auto since_epoch =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  return Clock::time_point(since_epoch);
}

double to_seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

py::dict histogram_dict(const HistogramSnapshot& h) {
  py::dict d;
  d["count"] = h.count;
  d["sum"] = h.sum;
  d["max"] = h.max;
  d["mean"] = h.mean();
  d["p50"] = h.percentile(0.50);
  d["p90"] = h.percentile(0.90);
  d["p99"] = h.percentile(0.99);
  d["bounds"] = h.bounds;
  d["counts"] = h.counts;
  return d;
}

}  // namespace asyncinfer::python
