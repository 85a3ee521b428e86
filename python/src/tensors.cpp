// tensors.cpp — Python tensors in and out (tensors.hpp).
#include "tensors.hpp"

#include <dlpack/dlpack.h>

#include <array>
#include <cstring>

#include "convert.hpp"
#include "runtime.hpp"

namespace asyncinfer::python {
namespace {

constexpr std::size_t kDTypes = static_cast<std::size_t>(DType::u64) + 1;
std::array<PyObject*, kDTypes> g_numpy_dtypes{};  // leaked: live as long as the interpreter
PyObject* g_torch_tensor = nullptr;               // torch.Tensor once torch has been imported
PyObject* g_torch_bool = nullptr;
constexpr int kDLBoolCode = 6;  // kDLBool in DLPack >= 0.8 (Debian's header is 0.6)

const char* kAccepted =
    "expected a numpy.ndarray, a CPU torch.Tensor, an asyncinfer.Tensor or an object with "
    "__dlpack__";
const char* kDTypesText =
    "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64 "
    "(bfloat16 through torch or DLPack; BYTES as a numpy array of dtype object holding bytes or "
    "str, or of dtype S)";

std::string type_name(py::handle h) {
  return py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>();
}

std::string where(const std::string& name) { return "input '" + name + "'"; }

bool dtype_from_numpy(char kind, py::ssize_t size, DType* out) {
  switch (kind) {
    case 'b':
      if (size == 1) return *out = DType::boolean, true;
      return false;
    case 'i':
      switch (size) {
        case 1:
          return *out = DType::i8, true;
        case 2:
          return *out = DType::i16, true;
        case 4:
          return *out = DType::i32, true;
        case 8:
          return *out = DType::i64, true;
        default:
          return false;
      }
    case 'u':
      switch (size) {
        case 1:
          return *out = DType::u8, true;
        case 2:
          return *out = DType::u16, true;
        case 4:
          return *out = DType::u32, true;
        case 8:
          return *out = DType::u64, true;
        default:
          return false;
      }
    case 'f':
      switch (size) {
        case 2:
          return *out = DType::f16, true;
        case 4:
          return *out = DType::f32, true;
        case 8:
          return *out = DType::f64, true;
        default:
          return false;
      }
    default:
      return false;
  }
}

bool dtype_from_dlpack(DLDataType t, DType* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLInt:
      return dtype_from_numpy('i', t.bits / 8, out) && t.bits % 8 == 0;
    case kDLUInt:
      return dtype_from_numpy('u', t.bits / 8, out) && t.bits % 8 == 0;
    case kDLFloat:
      return dtype_from_numpy('f', t.bits / 8, out) && t.bits % 8 == 0;
    case kDLBfloat:
      if (t.bits == 16) return *out = DType::bf16, true;
      return false;
    case kDLBoolCode:
      if (t.bits == 8) return *out = DType::boolean, true;
      return false;
    default:
      return false;
  }
}

DLDataType dlpack_dtype(DType d) {
  const auto bits = static_cast<std::uint8_t>(dtype_size(d) * 8);
  switch (d) {
    case DType::f32:
    case DType::f16:
    case DType::f64:
      return {kDLFloat, bits, 1};
    case DType::bf16:
      return {kDLBfloat, bits, 1};
    case DType::i8:
    case DType::i16:
    case DType::i32:
    case DType::i64:
      return {kDLInt, bits, 1};
    case DType::u8:
    case DType::u16:
    case DType::u32:
    case DType::u64:
      return {kDLUInt, bits, 1};
    case DType::boolean:
      return {static_cast<std::uint8_t>(kDLBoolCode), 8, 1};
    case DType::bytes:
      break;  // never exported: to_python gives bytes tensors as numpy object arrays
  }
  return {kDLUInt, 8, 1};
}

/// A new host tensor holding a copy of `bytes` at `data`.
Tensor copy_memory(const void* data, std::size_t bytes, DType dtype, Shape shape,
                   const std::string& name) {
  auto t = Tensor::empty(dtype, std::move(shape));
  if (!t.ok()) raise_status(t.status().with_context(where(name)));
  if (bytes != t->byte_size()) {
    raise_status(internal_error(where(name) + ": byte size mismatch"));
  }
  if (bytes > 0) std::memcpy(t->data(), data, bytes);
  return std::move(*t);
}

/// Wraps `bytes` at `data`, owned by `owner` (a new reference is taken), as a host tensor.
Tensor share_memory(void* data, std::size_t bytes, py::handle owner, DType dtype, Shape shape,
                    const std::string& name) {
  if (data == nullptr || bytes == 0) return copy_memory(data, bytes, dtype, std::move(shape), name);
  PyObject* ref = owner.inc_ref().ptr();
  auto storage = std::make_shared<Storage>(
      data, bytes, Placement{}, [ref](void*) { release_later(ref); }, true);
  auto t = Tensor::from_storage(std::move(storage), dtype, std::move(shape));
  if (!t.ok()) raise_status(t.status().with_context(where(name)));
  return std::move(*t);
}

/// A BYTES tensor from a numpy array of dtype object (each element bytes, or str taken as UTF-8)
/// or of dtype S (each element without its trailing NULs, as numpy reads them): the form
/// tritonclient's np_to_triton_dtype maps to BYTES. Always a copy, into the serialized form.
Tensor bytes_from_numpy(py::array arr, const std::string& name) {
  Shape shape(static_cast<std::size_t>(arr.ndim()));
  for (std::size_t i = 0; i < shape.size(); ++i) shape[i] = arr.shape(static_cast<py::ssize_t>(i));
  py::list flat = arr.attr("ravel")().attr("tolist")();
  std::string serialized;
  std::size_t i = 0;
  for (py::handle e : flat) {
    char* data = nullptr;
    Py_ssize_t size = 0;
    if (PyBytes_Check(e.ptr())) {
      PyBytes_AsStringAndSize(e.ptr(), &data, &size);
    } else if (PyUnicode_Check(e.ptr())) {
      const char* utf8 = PyUnicode_AsUTF8AndSize(e.ptr(), &size);
      if (utf8 == nullptr) throw py::error_already_set();
      data = const_cast<char*>(utf8);
    } else {
      raise_invalid(where(name) + ": BYTES element " + std::to_string(i) + " is " +
                    type_name(e) + "; expected bytes or str (a numpy array of dtype object is "
                    "read as BYTES)");
    }
    if (static_cast<std::size_t>(size) > 0xffffffffu) {
      raise_invalid(where(name) + ": BYTES element " + std::to_string(i) +
                    " is 4 GiB or more; elements have a 32-bit length");
    }
    append_serialized_element(serialized, std::string_view(data, static_cast<std::size_t>(size)));
    ++i;
  }
  auto t = Tensor::from_serialized(std::move(shape), std::move(serialized));
  if (!t.ok()) raise_status(t.status().with_context(where(name)));
  return std::move(*t);
}

Tensor from_numpy(py::array arr, const std::string& name, bool share) {
  py::dtype dt = arr.dtype();
  if (dt.kind() == 'O' || dt.kind() == 'S') return bytes_from_numpy(arr, name);
  DType dtype{};
  if (!dtype_from_numpy(dt.kind(), dt.itemsize(), &dtype)) {
    raise_invalid(where(name) + ": numpy dtype " + py::str(dt).cast<std::string>() +
                  " is not a tensor dtype the engine supports; expected one of " + kDTypesText);
  }
  const char order = dt.byteorder();
  if (order == '>') {
    raise_invalid(where(name) + ": big-endian numpy data (dtype " +
                  py::str(dt).cast<std::string>() +
                  "); convert with arr.astype(arr.dtype.newbyteorder('='))");
  }
  if ((arr.flags() & py::array::c_style) == 0) {
    // Non-contiguous (a slice, a transpose): copied once into a contiguous array of our own,
    // which the tensor may then share.
    arr = py::module_::import("numpy").attr("ascontiguousarray")(arr);
    share = true;
  }
  Shape shape(static_cast<std::size_t>(arr.ndim()));
  for (std::size_t i = 0; i < shape.size(); ++i) shape[i] = arr.shape(static_cast<py::ssize_t>(i));
  const auto bytes = static_cast<std::size_t>(arr.nbytes());
  void* data = const_cast<void*>(arr.data());
  if (share) return share_memory(data, bytes, arr, dtype, std::move(shape), name);
  return copy_memory(data, bytes, dtype, std::move(shape), name);
}

bool is_host_device(std::int64_t type) {
  return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

const char* dlpack_device_name(std::int64_t type) {
  switch (type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLOpenCL:
      return "opencl";
    case kDLVulkan:
      return "vulkan";
    case kDLMetal:
      return "metal";
    case kDLVPI:
      return "vpi";
    case kDLROCM:
      return "rocm";
    case kDLROCMHost:
      return "rocm_host";
    case kDLExtDev:
      return "ext_dev";
    case kDLCUDAManaged:
      return "cuda_managed";
    default:
      return "unknown";
  }
}

void destroy_managed(void* p) {
  auto* m = static_cast<DLManagedTensor*>(p);
  if (m->deleter != nullptr) m->deleter(m);
}

Tensor from_dlpack(py::handle obj, const std::string& name, bool share) {
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple dev = obj.attr("__dlpack_device__")();
    const auto type = dev[0].cast<std::int64_t>();
    if (!is_host_device(type)) {
      raise_invalid(where(name) + ": a " + type_name(obj) + " on DLPack device " +
                    dlpack_device_name(type) + ":" + py::str(dev[1]).cast<std::string>() +
                    "; the engine takes host memory: copy it to the CPU first");
    }
  }
  py::object cap = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    raise_invalid(where(name) + ": __dlpack__() of a " + type_name(obj) +
                  " did not return an unconsumed 'dltensor' capsule");
  }
  // We own it from here: a capsule of ours calls its deleter (with the GIL) when released.
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  py::capsule owner(managed, &destroy_managed);
  const DLTensor& t = managed->dl_tensor;
  if (!is_host_device(t.device.device_type)) {
    raise_invalid(where(name) + ": DLPack tensor on device " +
                  dlpack_device_name(t.device.device_type) +
                  "; the engine takes host memory: copy it to the CPU first");
  }
  DType dtype{};
  if (!dtype_from_dlpack(t.dtype, &dtype)) {
    raise_invalid(where(name) + ": DLPack dtype (code " + std::to_string(t.dtype.code) + ", bits " +
                  std::to_string(t.dtype.bits) + ", lanes " + std::to_string(t.dtype.lanes) +
                  ") is not a tensor dtype the engine supports; expected one of " + kDTypesText);
  }
  Shape shape(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) {
    std::int64_t expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && t.strides[i] != expected) {
        raise_invalid(where(name) + ": a non-contiguous DLPack tensor (" + type_name(obj) +
                      "); pass a contiguous one");
      }
      expected *= shape[i];
    }
  }
  auto bytes = checked_byte_size(dtype, shape);
  if (!bytes.ok()) raise_status(bytes.status().with_context(where(name)));
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  if (share) return share_memory(data, *bytes, owner, dtype, std::move(shape), name);
  return copy_memory(data, *bytes, dtype, std::move(shape), name);
}

bool torch_loaded() {
  if (g_torch_tensor != nullptr) return true;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
  if (torch == nullptr) return false;
  py::handle mod(torch);
  if (!py::hasattr(mod, "Tensor") || !py::hasattr(mod, "bool")) return false;  // half imported
  g_torch_tensor = py::object(mod.attr("Tensor")).release().ptr();
  g_torch_bool = py::object(mod.attr("bool")).release().ptr();
  return true;
}

Tensor from_torch(py::object t, const std::string& name, bool share) {
  py::object device = t.attr("device");
  if (device.attr("type").cast<std::string>() != "cpu") {
    raise_invalid(where(name) + ": a torch tensor on " + py::str(device).cast<std::string>() +
                  "; the engine takes host memory: pass tensor.cpu()");
  }
  if (t.attr("requires_grad").cast<bool>()) t = t.attr("detach")();
  if (py::object(t.attr("dtype")).is(py::handle(g_torch_bool))) {
    // torch 1.13 cannot export bool over DLPack; numpy() views the same memory.
    return from_numpy(t.attr("numpy")(), name, share);
  }
  if (!t.attr("is_contiguous")().cast<bool>()) {
    t = t.attr("contiguous")();  // copied once; the copy is ours to share
    share = true;
  }
  return from_dlpack(t, name, share);
}

std::string signature_names(const ModelSignature& sig) {
  std::string out;
  for (const TensorSpec& s : sig.inputs) {
    if (!out.empty()) out += ", ";
    out += s.name + " " + std::string(to_string(s.dtype)) + shape_to_string(s.shape);
  }
  return out;
}

// ---- DLPack export of asyncinfer.Tensor --------------------------------------------------------

struct Exported {
  DLManagedTensor managed{};
  Tensor tensor;
  Shape shape;
};

void delete_exported(DLManagedTensor* m) { delete static_cast<Exported*>(m->manager_ctx); }

void exported_capsule_destructor(PyObject* cap) {
  // Still named "dltensor": nobody consumed it, so it is ours to free.
  if (PyCapsule_IsValid(cap, "dltensor") != 0) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

py::object export_dlpack(const Tensor& t) {
  auto* e = new Exported();
  e->tensor = t;
  e->shape = t.shape();
  DLTensor& d = e->managed.dl_tensor;
  d.data = t.data();
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<std::int32_t>(e->shape.size());
  d.dtype = dlpack_dtype(t.dtype());
  d.shape = e->shape.data();
  d.strides = nullptr;  // compact row-major
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = &delete_exported;
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", &exported_capsule_destructor);
  if (cap == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

py::array numpy_view(const Tensor& t, DType as) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(as));
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(py::reinterpret_borrow<py::dtype>(g_numpy_dtypes[static_cast<std::size_t>(as)]),
                   std::move(shape), std::move(strides), t.data(), base);
}

}  // namespace

const char* numpy_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::f64:
      return "float64";
    case DType::i8:
      return "int8";
    case DType::u8:
      return "uint8";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::boolean:
      return "bool";
    case DType::i16:
      return "int16";
    case DType::u16:
      return "uint16";
    case DType::u32:
      return "uint32";
    case DType::u64:
      return "uint64";
    case DType::bytes:
      return "object";
  }
  return "unknown";
}

Tensor to_tensor(py::handle obj, const std::string& name, bool share) {
  if (py::isinstance<py::array>(obj)) {
    return from_numpy(py::reinterpret_borrow<py::array>(obj), name, share);
  }
  if (py::isinstance<PyTensor>(obj)) {
    // Already engine memory; the engine copies it if this object still refers to it (it does).
    return obj.cast<const PyTensor&>().tensor;
  }
  if (torch_loaded() && PyObject_IsInstance(obj.ptr(), g_torch_tensor) == 1) {
    return from_torch(py::reinterpret_borrow<py::object>(obj), name, share);
  }
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, name, share);
  raise_invalid(where(name) + ": " + kAccepted + ", got " + type_name(obj));
}

Inputs to_inputs(py::handle obj, const ModelSignature& sig, bool share) {
  Inputs out;
  const std::size_t n = sig.inputs.size();
  if (PyDict_Check(obj.ptr())) {
    py::dict d = py::reinterpret_borrow<py::dict>(obj);
    out.reserve(n);
    for (const TensorSpec& spec : sig.inputs) {
      PyObject* v = PyDict_GetItemString(d.ptr(), spec.name.c_str());
      if (v == nullptr) {
        raise_invalid("inputs: no '" + spec.name + "' in the dict; the model takes " +
                      signature_names(sig));
      }
      out.push_back(to_tensor(v, spec.name, share));
    }
    if (static_cast<std::size_t>(PyDict_Size(d.ptr())) != n) {
      for (auto item : d) {
        const std::string key = py::str(item.first).cast<std::string>();
        bool known = false;
        for (const TensorSpec& spec : sig.inputs) known = known || spec.name == key;
        if (!known) {
          raise_invalid("inputs: unknown input '" + key + "'; the model takes " +
                        signature_names(sig));
        }
      }
    }
    return out;
  }
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    const auto got = static_cast<std::size_t>(py::len(seq));
    if (got != n) {
      raise_invalid("inputs: the model takes " + std::to_string(n) + " input(s) (" +
                    signature_names(sig) + "), got " + std::to_string(got));
    }
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back(to_tensor(seq[i], sig.inputs[i].name, share));
    return out;
  }
  if (n != 1) {
    raise_invalid("inputs: the model takes " + std::to_string(n) + " inputs (" +
                  signature_names(sig) + "); pass a list, tuple or dict, got one " +
                  type_name(obj));
  }
  out.push_back(to_tensor(obj, sig.inputs[0].name, share));
  return out;
}

py::object to_python(const Tensor& t) {
  if (!t.is_host_accessible()) {
    auto host = t.clone();
    if (!host.ok()) raise_status(host.status().with_context("output in device memory"));
    return to_python(*host);
  }
  if (t.dtype() == DType::bf16) return py::cast(PyTensor{t});
  if (t.dtype() == DType::bytes) {
    // A numpy array of dtype object holding one bytes per element, as tritonclient's
    // deserialize_bytes_tensor returns them (a copy: numpy cannot view variable-length data).
    auto elements = t.string_elements();
    if (!elements.ok()) raise_status(elements.status());
    py::list items(elements->size());
    for (std::size_t i = 0; i < elements->size(); ++i) {
      items[i] = py::bytes((*elements)[i].data(), (*elements)[i].size());
    }
    py::module_ np = py::module_::import("numpy");
    py::object arr = np.attr("empty")(py::int_(elements->size()), py::str("object"));
    for (std::size_t i = 0; i < elements->size(); ++i) arr[py::int_(i)] = items[i];
    py::tuple shape(t.rank());
    for (std::size_t d = 0; d < t.rank(); ++d) shape[d] = py::int_(t.shape()[d]);
    return arr.attr("reshape")(shape);
  }
  return numpy_view(t, t.dtype());
}

py::list to_python(const Outputs& outputs) {
  py::list out(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    out[i] = to_python(outputs[i]);
  }
  return out;
}

void init_tensors(py::module_& m) {
  py::module_ np = py::module_::import("numpy");
  for (std::size_t i = 0; i < kDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    const char* name = d == DType::bf16 ? "uint16" : numpy_name(d);  // bf16 viewed as its bits
    g_numpy_dtypes[i] = py::dtype(name).release().ptr();
  }

  py::class_<PyTensor>(m, "Tensor", R"doc(
An engine tensor that numpy cannot view (bfloat16), or one handed back as an input.

Export it with DLPack (``torch.from_dlpack(t)``: no copy) or view its bytes with ``numpy()``.
Inputs may be asyncinfer.Tensor objects: the engine copies them (guarantee 6).
)doc")
      .def_property_readonly(
          "dtype", [](const PyTensor& t) { return std::string(to_string(t.tensor.dtype())); },
          "Short dtype name: 'bf16', 'f32', ...")
      .def_property_readonly(
          "shape",
          [](const PyTensor& t) {
            py::tuple s(t.tensor.rank());
            for (std::size_t i = 0; i < t.tensor.rank(); ++i) s[i] = t.tensor.shape()[i];
            return s;
          },
          "The shape, a tuple of ints.")
      .def_property_readonly(
          "nbytes", [](const PyTensor& t) { return t.tensor.byte_size(); }, "Size in bytes.")
      .def(
          "numpy", [](const PyTensor& t) { return numpy_view(t.tensor, t.tensor.dtype()); },
          "A numpy view of the bytes (no copy); bfloat16 values appear as their uint16 bit "
          "patterns (numpy has no bfloat16).")
      .def(
          "__dlpack__",
          [](const PyTensor& t, const py::object& stream) {
            if (!stream.is_none()) {
              raise_invalid("__dlpack__: a host tensor has no stream; pass stream=None");
            }
            return export_dlpack(t.tensor);
          },
          py::arg("stream") = py::none(),
          "DLPack capsule of the tensor (host memory, no copy), for torch.from_dlpack.")
      .def(
          "__dlpack_device__", [](const PyTensor&) { return py::make_tuple(int(kDLCPU), 0); },
          "(kDLCPU, 0): the tensor is in host memory.")
      .def("__repr__",
           [](const PyTensor& t) { return "asyncinfer.Tensor(" + t.tensor.describe() + ")"; });
}

}  // namespace asyncinfer::python
