// convert.hpp — Status codes as Python exceptions; Python durations and times as std::chrono.
//
// Exceptions: asyncinfer.Error is the base of one class per StatusCode (the table in
// convert.cpp). Some also derive from the built-in a Python user already catches:
// InvalidArgument is a ValueError, DeadlineExceeded a TimeoutError, Cancelled a
// concurrent.futures.CancelledError. Each class has `code` (the C++ code name, e.g.
// "invalid_argument"); each raised instance has `code` and `message` (the C++ message).
//
// Time: durations are seconds (int, float or datetime.timedelta), as everywhere in Python's
// standard library; deadlines are time.monotonic() values (the same clock as C++'s
// steady_clock on Linux). Bad values raise InvalidArgument naming the argument.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>
#include <string>

#include "asyncinfer/executor.hpp"
#include "asyncinfer/metrics.hpp"
#include "asyncinfer/status.hpp"

namespace asyncinfer::python {

namespace py = pybind11;

/// Creates the exception classes in `m`. Called once at import.
void init_errors(py::module_& m);

/// The exception instance for a non-ok status (GIL held).
py::object make_exception(const Status& status);
/// Raises the exception for a non-ok status (throws py::error_already_set).
[[noreturn]] void raise_status(const Status& status);
/// Raises InvalidArgument with `message`.
[[noreturn]] void raise_invalid(const std::string& message);
/// Raises the built-in TimeoutError (a wait ran out; the request goes on).
[[noreturn]] void raise_wait_timeout(const std::string& message);
/// The StatusCode of an asyncinfer exception class or a code name ("unavailable").
StatusCode code_from_python(py::handle h, const char* what);

/// Seconds (int, float, timedelta) as a duration; None gives nullopt. `what` names the argument.
std::optional<std::chrono::nanoseconds> to_duration(py::handle h, const char* what);
/// The same, where None is not allowed.
std::chrono::nanoseconds to_duration_required(py::handle h, const char* what);
/// A time.monotonic() value as a steady_clock time point; None gives nullopt.
std::optional<Clock::time_point> to_deadline(py::handle h, const char* what);
/// A duration as float seconds.
double to_seconds(std::chrono::nanoseconds d);

/// A histogram as a dict: count, sum, max, mean, p50, p90, p99, bounds, counts (its units).
py::dict histogram_dict(const HistogramSnapshot& h);

template <class D>
D to_duration_as(py::handle h, const char* what) {
  return std::chrono::duration_cast<D>(to_duration_required(h, what));
}

}  // namespace asyncinfer::python
