// options.hpp — the engine's option and policy types as Python classes (RequestState,
// ShutdownMode, QueueFullPolicy, RetryPolicy, CircuitBreakerOptions, RecoveryOptions), and the
// converters of Engine's option arguments.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "asyncinfer/engine.hpp"
#include "convert.hpp"

namespace asyncinfer::python {

namespace py = pybind11;

/// Engine.shutdown's mode: 'drain', 'cancel' or an asyncinfer.ShutdownMode.
ShutdownMode shutdown_mode(const py::object& mode);
/// The queue_full_policy option: 'reject', 'block' or an asyncinfer.QueueFullPolicy.
QueueFullPolicy queue_full_policy(const py::object& p);

/// A policy option given as the asyncinfer class `cls` or a dict of its fields; None = defaults.
template <class Policy>
Policy policy_arg(const py::object& v, const char* option, const char* cls) {
  if (v.is_none()) return {};
  if (py::isinstance<Policy>(v)) return v.cast<Policy>();
  if (PyDict_Check(v.ptr())) {
    py::object type = py::module_::import("asyncinfer").attr(cls);
    return type(**py::reinterpret_borrow<py::dict>(v)).cast<Policy>();
  }
  raise_invalid(std::string(option) + ": expected asyncinfer." + cls +
                " or a dict of its fields, got " + py::repr(v).cast<std::string>());
}

/// Engine.options: the options as a dict, in the units of the constructor's arguments.
py::dict options_dict(const EngineOptions& o);

/// Defines the enums and the policy classes; called before init_engine.
void init_options(py::module_& m);

}  // namespace asyncinfer::python
