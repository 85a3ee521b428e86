// module.cpp — the extension module asyncinfer._asyncinfer: models, devices, and the pieces
// defined next to it (errors, tensors, futures, engine, pipeline). The package
// (python/asyncinfer/__init__.py) re-exports it; __init__.pyi documents it for editors.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "asyncinfer/asyncinfer.hpp"
#include "convert.hpp"
#include "engine.hpp"
#include "future.hpp"
#include "options.hpp"
#include "runtime.hpp"
#include "tensors.hpp"

namespace asyncinfer::python {
void init_pipeline(py::module_& m);
namespace {

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) t[i] = s[i];
  return t;
}

TensorSpec spec_arg(const py::handle& h, bool batched) {
  if (py::isinstance<TensorSpec>(h)) return h.cast<TensorSpec>();
  auto r = parse_tensor_spec(py::str(h).cast<std::string>(), batched);
  if (!r.ok()) raise_status(r.status());
  return *r;
}

void init_model_device(py::module_& m) {
  py::class_<TensorSpec>(m, "TensorSpec", "One named model input or output.")
      .def(py::init([](std::string name, const std::string& dtype, const Shape& shape) {
             auto d = parse_dtype(dtype);
             if (!d.ok()) raise_status(d.status());
             return TensorSpec{std::move(name), *d, shape};
           }),
           py::arg("name"), py::arg("dtype"), py::arg("shape"),
           "dtype: 'f32', 'float32', 'FP32', ...; shape: full dims, -1 for a dynamic dim.")
      .def_readonly("name", &TensorSpec::name)
      .def_property_readonly(
          "dtype", [](const TensorSpec& s) { return std::string(to_string(s.dtype)); },
          "Short dtype name ('f32', 'i64', 'bf16', ...).")
      .def_property_readonly(
          "numpy_dtype", [](const TensorSpec& s) { return std::string(numpy_name(s.dtype)); },
          "The numpy dtype name ('float32', ...; 'bfloat16' has no numpy dtype).")
      .def_property_readonly(
          "shape", [](const TensorSpec& s) { return shape_tuple(s.shape); },
          "Full shape; -1 marks a dynamic dim (dim 0 is the batch dim of a batched model).")
      .def("__repr__", [](const TensorSpec& s) {
        return "TensorSpec('" + s.name + "', '" + std::string(to_string(s.dtype)) + "', " +
               shape_to_string(s.shape) + ")";
      });

  py::class_<ModelSignature>(m, "ModelSignature", "A model's named inputs and outputs.")
      .def_readonly("inputs", &ModelSignature::inputs, "list of TensorSpec")
      .def_readonly("outputs", &ModelSignature::outputs, "list of TensorSpec")
      .def_readonly("batched", &ModelSignature::batched,
                    "dim 0 of every input and output is the batch dim")
      .def_readonly("batch_limit", &ModelSignature::batch_limit,
                    "the largest batch in rows the model accepts; None = no limit of its own "
                    "(ignored when not batched)")
      .def("__str__", &ModelSignature::to_string)
      .def("__repr__",
           [](const ModelSignature& s) { return "<ModelSignature " + s.to_string() + ">"; });

  py::class_<Model, std::shared_ptr<Model>>(m, "Model",
                                            "A loaded model (C++ asyncinfer::Model); immutable, "
                                            "shareable between engines.")
      .def_property_readonly(
          "signature", [](const Model& md) { return md.signature(); }, "The ModelSignature.")
      .def_property_readonly(
          "name", [](const Model& md) { return md.name(); }, "The URI or path it was loaded from.")
      .def_property_readonly(
          "cancellable", [](const Model& md) { return md.cancellable(); },
          "Whether running work stops early when its requests are cancelled.")
      .def("__repr__", [](const Model& md) {
        return "<asyncinfer.Model '" + md.name() + "': " + md.signature().to_string() + ">";
      });

  py::class_<DeviceCapabilities>(m, "DeviceCapabilities",
                                 "What the engine and the model backends rely on when they "
                                 "drive a device (C++ DeviceCapabilities).")
      .def_readonly("caller_run_streams", &DeviceCapabilities::caller_run_streams,
                    "a stream can run on the caller's thread (the engine's inline path)")
      .def_readonly("host_funcs_may_call_device", &DeviceCapabilities::host_funcs_may_call_device,
                    "the thread that reaches a host function may call the device")
      .def_readonly("host_addressable_memory", &DeviceCapabilities::host_addressable_memory,
                    "host code may read and write device memory in place")
      .def("__repr__", [](const DeviceCapabilities& c) {
        auto yn = [](bool b) { return b ? "True" : "False"; };
        return std::string("<DeviceCapabilities caller_run_streams=") + yn(c.caller_run_streams) +
               " host_funcs_may_call_device=" + yn(c.host_funcs_may_call_device) +
               " host_addressable_memory=" + yn(c.host_addressable_memory) + ">";
      });

  py::class_<DeviceInfo>(m, "DeviceInfo", "What a device is and can do.")
      .def_readonly("name", &DeviceInfo::name, "as opened: 'cpu', 'sim', 'cuda:0'")
      .def_property_readonly(
          "kind", [](const DeviceInfo& i) { return std::string(to_string(i.kind)); },
          "'cpu', 'sim', 'cuda' or 'npu'")
      .def_readonly("description", &DeviceInfo::description)
      .def_readonly("is_async", &DeviceInfo::async, "enqueue returns before the work runs")
      .def_readonly("simulated", &DeviceInfo::simulated,
                    "timings are simulated ('sim'), not measured hardware")
      .def_readonly("unified_memory", &DeviceInfo::unified_memory)
      .def_readonly("cancellable_work", &DeviceInfo::cancellable_work)
      .def_readonly("compute_engines", &DeviceInfo::compute_engines)
      .def_readonly("copy_engines", &DeviceInfo::copy_engines)
      .def_readonly("capabilities", &DeviceInfo::capabilities)
      .def("__repr__", [](const DeviceInfo& i) {
        return "<DeviceInfo " + i.name + ": " + i.description + ">";
      });

  py::class_<Device, std::shared_ptr<Device>>(m, "Device",
                                              "A device (C++ asyncinfer::Device): 'cpu', 'sim', "
                                              "'cuda:N'. Shareable between engines.")
      .def_property_readonly(
          "info", [](const Device& d) { return d.info(); }, "The DeviceInfo.")
      .def_property_readonly(
          "name", [](const Device& d) { return d.name(); }, "As opened.")
      .def_property_readonly("kind",
                             [](const Device& d) { return std::string(to_string(d.kind())); })
      .def("__repr__", [](const Device& d) {
        return "<asyncinfer.Device '" + d.name() + "': " + d.info().description + ">";
      });

  m.def(
      "load_model",
      [](const std::string& uri, const py::object& inputs, const py::object& outputs,
         std::optional<std::int64_t> batch_limit, std::optional<bool> batched,
         const py::object& backend_parameters) {
        ModelOptions o;
        if (!backend_parameters.is_none()) {
          for (auto item : py::cast<py::dict>(backend_parameters)) {
            o.backend_parameters.emplace_back(py::str(item.first).cast<std::string>(),
                                              py::str(item.second).cast<std::string>());
          }
        }
        o.batch_limit = batch_limit;
        o.batched = batched;
        const bool batched_specs = batched.value_or(true);
        if (!inputs.is_none()) {
          for (py::handle h : inputs) o.inputs.push_back(spec_arg(h, batched_specs));
        }
        if (!outputs.is_none()) {
          for (py::handle h : outputs) o.outputs.push_back(spec_arg(h, batched_specs));
        }
        auto r = without_gil([&] { return load_model(uri, o); });
        if (!r.ok()) raise_status(r.status());
        return *r;
      },
      py::arg("uri"), py::kw_only(), py::arg("inputs") = py::none(),
      py::arg("outputs") = py::none(), py::arg("batch_limit") = py::none(),
      py::arg("batched") = py::none(), py::arg("backend_parameters") = py::none(),
      R"doc(
Loads a model: 'builtin:identity', 'builtin:fixed_cost?base_us=2000', 'builtin:faulty?...',
'torch:<file>' or a path ending in '.pt' (TorchScript through libtorch), 'openvino:<file>' or a
path ending in '.onnx' or '.xml' (ONNX and OpenVINO IR through OpenVINO's runtime; the signature
comes from the model), 'builtin:gemm' (cuda).

backend_parameters: a dict of the backend's own settings (values are passed as strings;
docs/backends.md lists each backend's keys): OpenVINO properties for an openvino model
({'NUM_STREAMS': '2', 'INFERENCE_PRECISION_HINT': 'f32'}); for a TorchScript model
'signature_path' (its signature file) and 'warmup_runs' (forward passes at each instance's
creation, default 2). A backend refuses a key it does not know; the built-in models take none.

TorchScript: the signature comes from '<file>.json' (or backend_parameters' signature_path), or
from inputs / outputs: TensorSpec objects or 'name:dtype:dims' strings ('input:f32:1x32x32'; the
batch dim is added unless batched=False).

batch_limit: the model's batch limit (the largest batch in rows it accepts, >= 1; its
signature's batch_limit); None = the model's own (TorchScript: the signature file's). It is not
the engine's max_batch_size, the largest batch the engine forms (Engine(max_batch_size=...)),
which may not exceed it. batched: whether dim 0 is the batch dim (openvino: None = when dim 0 is
dynamic everywhere; TorchScript specs: None = True).

Raises InvalidArgument for a bad URI or signature (the message lists the accepted forms),
NotFound for a missing file, Unavailable for a backend that was not built. Blocks (loading)
without the GIL.
)doc");

  m.def(
      "open_device",
      [](const std::string& spec) {
        auto r = open_device(spec);
        if (!r.ok()) raise_status(r.status());
        return *r;
      },
      py::arg("spec"), R"doc(
Opens a device: 'cpu' (each stream one host thread), 'sim' or 'sim:<key>=<value>,...' (a
simulated accelerator; docs/backends.md lists the keys), 'cuda' or 'cuda:<index>'.
Raises InvalidArgument for an unknown name (listing the backends built), Unavailable for a
backend that was not built or has no hardware.
)doc");

  m.def("device_backends", &device_backends,
        "Names of the device backends built into this library, e.g. ['cpu', 'sim', 'cuda'].");
  m.def("model_backends", &model_backends,
        "The model kinds built into this library, e.g. ['builtin:identity', ..., 'torch'].");
}

}  // namespace
}  // namespace asyncinfer::python

PYBIND11_MODULE(_asyncinfer, m) {
  namespace aip = asyncinfer::python;
  m.doc() =
      "asyncinfer's C++ engine from Python (pybind11). Import the package, `import asyncinfer`, "
      "not this module.";
  // The classes are named after the package users import (asyncinfer.Engine in help(), reprs
  // and signatures), not after this private module; the name is restored below.
  pybind11::object own_name = m.attr("__name__");
  m.attr("__name__") = "asyncinfer";
  aip::init_runtime(m);
  aip::init_errors(m);
  aip::init_tensors(m);
  aip::init_model_device(m);
  aip::init_future(m);
  aip::init_options(m);
  aip::init_engine(m);
  aip::init_async_infer_queue(m);
  aip::init_pipeline(m);
  m.attr("__version__") = ASYNCINFER_VERSION;
  m.attr("__name__") = own_name;
}
