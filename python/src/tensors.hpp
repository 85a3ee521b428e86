// tensors.hpp — numpy arrays, torch tensors and DLPack objects in; numpy arrays out.
//
// Inputs (to_inputs): one array (a model with one input), a list or tuple in signature order,
// or a dict keyed by input name. Each is one of
//   - numpy.ndarray of bool, int8/16/32/64, uint8/16/32/64, float16/32/64 (buffer protocol
//     semantics: data pointer, shape, strides; native byte order);
//   - a CPU torch.Tensor of those dtypes or bfloat16 (DLPack, torch's own exporter; bool
//     through tensor.numpy(), since torch 1.13 cannot export bool over DLPack); a tensor that
//     requires grad is detached (no copy);
//   - any other object with __dlpack__ / __dlpack_device__ on the CPU;
//   - asyncinfer.Tensor (an output handed back in).
// Sharing: with share=true the engine reads the caller's memory (no copy; the tensor keeps the
// Python object alive, released through PyRef's queue if the last reference goes on a library
// thread). With share=false the bytes are copied once into engine memory, so the caller may
// overwrite its array as soon as the call returns (guarantee 6). A non-contiguous array is
// always copied once into a contiguous one (say so in every docstring that takes inputs).
// Errors raise InvalidArgument naming the input, what it got and what was expected: a dtype
// the engine lacks (object, str, complex, datetime arrays), big-endian data, a tensor on
// another device, a wrong count, unknown or missing dict keys. Dtype and shape against the
// signature are checked by the engine (validate_inputs), whose message names both.
//
// Outputs (to_python): a numpy array viewing the engine's tensor, writable, kept alive by a
// capsule that owns a Tensor reference; numpy's own __dlpack__ makes it torch.from_dlpack-able.
// bfloat16, which numpy lacks, comes back as asyncinfer.Tensor (DLPack export; numpy() gives
// the raw uint16 bit patterns).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer::python {

namespace py = pybind11;

/// An engine tensor handed to Python where numpy cannot view it (bfloat16), or wrapped by the
/// user; supports DLPack export.
struct PyTensor {
  Tensor tensor;
};

void init_tensors(py::module_& m);

/// One tensor from a Python object; `name` is used in error messages.
Tensor to_tensor(py::handle obj, const std::string& name, bool share);
/// One request's inputs (see the header comment for the accepted forms).
Inputs to_inputs(py::handle obj, const ModelSignature& signature, bool share);

/// A numpy view of `t` (or an asyncinfer.Tensor for bfloat16).
py::object to_python(const Tensor& t);
/// A list with one entry per output.
py::list to_python(const Outputs& outputs);

/// "float32" style numpy name of a dtype ("bfloat16" for bf16).
const char* numpy_name(DType dtype) noexcept;

}  // namespace asyncinfer::python
