"""triton_python_backend_utils for asyncinfer's python backend.

The module that a Triton `model.py` imports as `pb_utils`, written for asyncinfer: the names and
behaviour follow Triton's Python backend (github.com/triton-inference-server/python_backend,
README "Usage" and src/resources/triton_python_backend_utils.py), so that existing model.py
files run unchanged. The process stub (asyncinfer_python_stub.py) installs it in sys.modules
before it imports model.py; it is not meant to be imported from anywhere else.

Covered: Tensor (name, as_numpy, is_cpu), InferenceRequest as handed to execute (inputs,
requested_output_names, request_id, correlation_id, flags, parameters, get_response_sender,
is_cancelled), InferenceResponse (output_tensors, error), TritonError with its codes,
TritonModelException, get_input_tensor_by_name, get_output_tensor_by_name,
get_input_config_by_name, get_output_config_by_name, triton_string_to_numpy,
triton_to_numpy_type, numpy_to_triton_type, serialize_byte_tensor, deserialize_bytes_tensor,
Logger (into the server's log), the TRITONSERVER_* flags, business logic scripting
(InferenceRequest.exec and async_exec, decoupled or not), is_model_ready, load_model,
unload_model, and custom metrics (MetricFamily, Metric). ModelConfig (auto_complete_config).
Tensor.to_dlpack and from_dlpack for host memory, which carry BF16 (numpy has no type for it).
Not covered: GPU tensors, load_model's files.
"""

import ctypes
import json
import struct
import sys

import numpy as np

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Triton's config data types (model_config.proto's TYPE_* names) and their numpy types.
_TRITON_TO_NUMPY = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# model_config.proto's DataType numbers (TYPE_INVALID = 0), as Triton's triton_to_numpy_type.
_TYPE_NUMBERS = {
    1: "TYPE_BOOL", 2: "TYPE_UINT8", 3: "TYPE_UINT16", 4: "TYPE_UINT32", 5: "TYPE_UINT64",
    6: "TYPE_INT8", 7: "TYPE_INT16", 8: "TYPE_INT32", 9: "TYPE_INT64", 10: "TYPE_FP16",
    11: "TYPE_FP32", 12: "TYPE_FP64", 13: "TYPE_STRING",
}


def triton_string_to_numpy(triton_type_string):
    """numpy type of a config data type name ("TYPE_FP32" -> np.float32); None if unknown."""
    return _TRITON_TO_NUMPY.get(triton_type_string)


def triton_to_numpy_type(data_type):
    """numpy type of a config DataType number (11 -> np.float32); None if unknown."""
    name = _TYPE_NUMBERS.get(data_type)
    return None if name is None else _TRITON_TO_NUMPY[name]


def numpy_to_triton_type(data_type):
    """config DataType number of a numpy type (np.float32 -> 11); None if it has none."""
    dt = np.dtype(data_type)
    if dt.kind in ("O", "S", "U"):
        return 13
    for number, name in _TYPE_NUMBERS.items():
        t = _TRITON_TO_NUMPY[name]
        if t is not np.object_ and np.dtype(t) == dt:
            return number
    return None


def serialize_byte_tensor(input_tensor):
    """The 4-byte little-endian length-prefixed form of a BYTES array (Triton's wire form), as
    a 1-D uint8 array; None for an empty array. Elements may be bytes or str (UTF-8)."""
    if input_tensor.size == 0:
        return None
    parts = []
    for obj in np.nditer(input_tensor, flags=["refs_ok"], order="C"):
        item = obj.item()
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(item)))
        parts.append(bytes(item))
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor):
    """The elements (bytes objects) of a length-prefixed BYTES buffer, as a 1-D object array."""
    buf = memoryview(bytes(encoded_tensor))
    out = []
    offset = 0
    while offset < len(buf):
        (length,) = struct.unpack_from("<I", buf, offset)
        offset += 4
        out.append(bytes(buf[offset:offset + length]))
        offset += length
    return np.array(out, dtype=np.object_)


class TritonError(Exception):
    """An error a model returns in an InferenceResponse (or raises). Codes as Triton's."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, msg, code=INTERNAL):
        super().__init__(msg)
        self._msg = str(msg)
        self._code = code

    def message(self):
        return self._msg

    def code(self):
        return self._code

    def __repr__(self):
        return "TritonError(%r, code=%d)" % (self._msg, self._code)


class TritonModelException(Exception):
    """Raised by this module for a misuse it can detect (Triton raises the same type)."""

    def message(self):
        return str(self)


# DLPack (github.com/dmlc/dlpack, include/dlpack/dlpack.h): the structs a "dltensor" capsule
# points at, as far as they are read or changed here.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU = 1  # kDLCPU
_DL_UINT = 1  # kDLUInt
_DL_BFLOAT = 4  # kDLBfloat
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dl_tensor(capsule):
    """The DLTensor at the head of an unconsumed "dltensor" capsule's DLManagedTensor."""
    try:
        return _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    except (ValueError, TypeError) as e:
        raise TritonModelException("not a DLPack capsule (an unconsumed \"dltensor\"): %s" % e)


class _Capsule:
    """A capsule handed to numpy.from_dlpack, which takes an object with __dlpack__."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, *_args, **_kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (_DL_CPU, 0)


class Tensor:
    """One named tensor. Inputs are views of the shared memory the server wrote them to: valid
    while the request is being executed (copy what you keep longer). BYTES tensors are numpy
    object arrays of bytes. BF16 tensors have no numpy type: as_numpy() refuses them, as Triton's
    does; to_dlpack() and from_dlpack() carry them (and any other CPU tensor) to and from
    frameworks (torch.utils.dlpack, numpy.from_dlpack)."""

    def __init__(self, name, data, *_unused):
        if not isinstance(name, str):
            raise TritonModelException("Tensor name must be a str, got %r" % (name,))
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                "Tensor '%s': data must be a numpy array, got %s" % (name, type(data).__name__))
        self._name = name
        self._data = data
        self._bf16 = False  # _data holds BF16's bits as uint16

    @classmethod
    def _of_bf16(cls, name, bits):
        """A BF16 tensor over `bits`, a uint16 array of its bit patterns."""
        t = cls(name, bits)
        t._bf16 = True
        return t

    def name(self):
        return self._name

    def as_numpy(self):
        if self._bf16:
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to numpy; use to_dlpack and "
                "from_dlpack (tensor '%s')" % self._name)
        return self._data

    def is_cpu(self):
        return True

    def shape(self):
        return list(self._data.shape)

    def triton_dtype(self):
        if self._bf16:
            return 14  # model_config.proto's TYPE_BF16
        return numpy_to_triton_type(self._data.dtype)

    def to_dlpack(self):
        """A DLPack capsule over this tensor's memory (no copy; valid while the tensor is, as an
        input's memory is while its request executes). BYTES cannot be given (Triton's rule)."""
        if self._data.dtype.kind in ("O", "S", "U"):
            raise TritonModelException("Tensor '%s': a BYTES tensor has no DLPack form"
                                       % self._name)
        capsule = self._data.__dlpack__()
        if self._bf16:
            _dl_tensor(capsule).dtype.code = _DL_BFLOAT  # numpy exports the bits as uint16
        return capsule

    @staticmethod
    def from_dlpack(name, capsule):
        """A Tensor named `name` over a DLPack capsule's memory (or an object's __dlpack__()),
        e.g. torch.utils.dlpack.to_dlpack(t); no copy. Host memory only; BF16 is kept as BF16."""
        if not isinstance(name, str):
            raise TritonModelException("Tensor name must be a str, got %r" % (name,))
        if hasattr(capsule, "__dlpack__"):
            capsule = capsule.__dlpack__()
        dl = _dl_tensor(capsule)
        if dl.device.device_type != _DL_CPU:
            raise TritonModelException(
                "Tensor '%s': DLPack device type %d; asyncinfer's python backend takes host "
                "(CPU) memory only" % (name, dl.device.device_type))
        bf16 = dl.dtype.code == _DL_BFLOAT and dl.dtype.bits == 16 and dl.dtype.lanes == 1
        if bf16:
            dl.dtype.code = _DL_UINT  # numpy takes the bits as uint16
        arr = np.from_dlpack(_Capsule(capsule))
        return Tensor._of_bf16(name, arr) if bf16 else Tensor(name, arr)

    def __repr__(self):
        dtype = "bf16" if self._bf16 else self._data.dtype
        return "Tensor(%r, %s%s)" % (self._name, dtype, list(self._data.shape))


class InferenceResponse:
    """A model's answer to one request: output tensors, or an error."""

    def __init__(self, output_tensors=None, error=None, parameters=None):
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException("InferenceResponse output_tensors must be a list")
        for t in output_tensors:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    "InferenceResponse output_tensors must hold pb_utils.Tensor, got %s"
                    % type(t).__name__)
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = parameters

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        """The response's parameters as a JSON object's text."""
        p = self._parameters
        return p if isinstance(p, str) else json.dumps(p or {})


class PreferredMemory:
    """Where a BLS call's outputs should be (Triton's pb_utils.PreferredMemory): asyncinfer's
    python backend has host memory only, so every value means the host."""

    def __init__(self, preferred_memory_type=0, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


TRITONSERVER_MEMORY_GPU = 2
TRITONSERVER_MEMORY_CPU = 0


class InferenceTrace:
    """Triton's trace of a request (request.trace()): a call made with
    InferenceRequest(..., trace=request.trace()) is traced as a child of that request's trace
    when the request is traced (Triton's "Tracing for BLS models"); without it, or for a request
    that is not traced, the call is not traced."""

    def __init__(self, context=None):
        self._context = context
        self._request = None  # the request's index in the batch being executed (the stub's)
        self._batch = None    # which execute() that batch was (the stub's count)

    def get_context(self, mode="triton"):
        return self._context


class InferenceRequest:
    """A request: one handed to execute(), or one a model makes to call another model of the
    server (business logic scripting) with exec() or async_exec(). The constructor is Triton's
    (python_backend's pb_utils.InferenceRequest): model_name, inputs, requested_output_names,
    and optionally model_version (-1 = the default), correlation_id (an int or str sequence ID),
    flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END), timeout (microseconds; 0 = the
    caller's remaining deadline only), parameters (a dict of str, int and bool)."""

    def __init__(self, request_id="", correlation_id=0, inputs=None,
                 requested_output_names=None, model_name="", model_version=-1, flags=0,
                 timeout=0, preferred_memory=None, trace=None, parameters=None, _sender=None):
        if inputs is None:
            raise TritonModelException("InferenceRequest needs inputs (a list of pb_utils.Tensor)")
        if requested_output_names is None:
            raise TritonModelException("InferenceRequest needs requested_output_names")
        if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        for t in inputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    "InferenceRequest inputs must be pb_utils.Tensor, got %s" % type(t).__name__)
        if isinstance(model_name, bytes):
            model_name = model_name.decode("utf-8")
        if parameters is None:
            parameters = "{}"
        elif isinstance(parameters, dict):
            for k, v in parameters.items():
                if not isinstance(k, str) or not isinstance(v, (str, int, bool)):
                    raise TritonModelException(
                        "InferenceRequest parameters must map str to str, int or bool")
            parameters = json.dumps(parameters)
        elif not isinstance(parameters, str):
            raise TritonModelException("InferenceRequest parameters must be a dict")
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters
        self._sender = _sender
        self._model_name = model_name
        self._model_version = model_version
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()

    @classmethod
    def _of_batch(cls, inputs, requested_output_names, request_id, correlation_id, flags,
                  parameters, sender, model_name, trace):
        """A request of the batch handed to execute(), as the stub decoded it: its fields are
        the server's and already checked, so __init__'s checks (for a model's own requests) are
        skipped on this per-request path."""
        r = cls.__new__(cls)
        r._inputs = inputs
        r._requested = requested_output_names
        r._request_id = request_id
        r._correlation_id = correlation_id
        r._flags = flags
        r._timeout = 0
        r._parameters = parameters
        r._sender = sender
        r._model_name = model_name
        r._model_version = -1
        r._trace = trace
        return r

    def inputs(self):
        return self._inputs

    def requested_output_names(self):
        return self._requested

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def parameters(self):
        """The request's parameters as a JSON object's text."""
        return self._parameters

    def model_name(self):
        return self._model_name

    def model_version(self):
        return self._model_version

    def timeout(self):
        return self._timeout

    def trace(self):
        """The request's trace (an InferenceTrace), for InferenceRequest(..., trace=)."""
        return self._trace

    def is_cancelled(self):
        return self._sender is not None and self._sender.is_cancelled()

    def set_release_flags(self, flags):
        """Triton's request rescheduling: only TRITONSERVER_REQUEST_RELEASE_ALL (what happens
        anyway) is accepted. TRITONSERVER_REQUEST_RELEASE_RESCHEDULE needs iterative sequences
        (sequence_batching { iterative_sequence: true }), which asyncinfer refuses at load."""
        if flags == TRITONSERVER_REQUEST_RELEASE_ALL:
            return
        raise TritonModelException(
            "set_release_flags(%r): request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) "
            "is not supported by asyncinfer; it needs sequence_batching { iterative_sequence: "
            "true }, which is refused at load" % (flags,))

    def get_response_sender(self):
        if self._sender is None or not self._sender._decoupled:
            raise TritonModelException(
                "get_response_sender() is for decoupled models: the model's config needs "
                "model_transaction_policy { decoupled: true }")
        return self._sender

    def exec(self, decoupled=False):
        """Runs this request on model_name, in the server, and blocks for its response (an
        InferenceResponse, with has_error() set on failure). decoupled=True: an iterator over
        the responses of a decoupled model, the last one final (maybe without outputs), with
        cancel()."""
        return _host.exec(self, decoupled)

    async def async_exec(self, decoupled=False):
        """exec() for an `async def execute`: awaits the response without blocking the event
        loop, so that many calls run at once (asyncio.gather)."""
        return await _host.async_exec(self, decoupled)


class ModelConfig:
    """What auto_complete_config(auto_complete_model_config) is given and returns (Triton's
    pb_utils.ModelConfig): the model's configuration as the server read it, which the model may
    complete. A setting that contradicts what the configuration already says raises ValueError,
    and the model does not load."""

    def __init__(self, model_config):
        if isinstance(model_config, str):
            model_config = json.loads(model_config)
        self._config = model_config
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def _name(self):
        return self._config.get("name", "")

    def as_dict(self):
        return self._config

    def set_max_batch_size(self, max_batch_size):
        given = int(self._config.get("max_batch_size", 0))
        if given > max_batch_size:
            raise ValueError(
                "the configuration of model '%s' says max_batch_size %d, but its "
                "auto_complete_config sets max_batch_size %d" % (self._name(), given,
                                                                  max_batch_size))
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    "the configuration of model '%s' schedules with %s, but its "
                    "auto_complete_config sets dynamic_batching" % (self._name(), other))
        self._config.setdefault("dynamic_batching", {})

    def _add_tensor(self, section, tensor):
        what = section  # "input" or "output"
        allowed = ("name", "data_type", "dims") + (("optional",) if section == "input" else ())
        if not isinstance(tensor, dict):
            raise ValueError("add_%s of model '%s' takes a dict" % (what, self._name()))
        for key in tensor:
            if key not in allowed:
                raise ValueError("%s '%s' of model '%s' in auto_complete_config has property "
                                 "'%s'; the properties are %s"
                                 % (what, tensor.get("name", "?"), self._name(), key,
                                    ", ".join(allowed)))
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError("%s '%s' of model '%s' in auto_complete_config has no '%s'"
                                 % (what, tensor.get("name", "?"), self._name(), key))
        for given in self._config[section]:
            if given.get("name") != tensor["name"]:
                continue
            dtype = given.get("data_type", "TYPE_INVALID")
            if dtype not in ("", "TYPE_INVALID") and dtype != tensor["data_type"]:
                raise ValueError(
                    "model '%s': the configuration says data_type %s for %s '%s', its "
                    "auto_complete_config says %s" % (self._name(), dtype, what, tensor["name"],
                                                      tensor["data_type"]))
            dims = [int(d) for d in given.get("dims", [])]
            if dims and dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    "model '%s': the configuration says dims %s for %s '%s', its "
                    "auto_complete_config says %s" % (self._name(), dims, what, tensor["name"],
                                                      list(tensor["dims"])))
            given.setdefault("data_type", tensor["data_type"])
            if given.get("data_type") in ("", "TYPE_INVALID"):
                given["data_type"] = tensor["data_type"]
            if not dims:
                given["dims"] = [int(d) for d in tensor["dims"]]
            return
        entry = {"name": tensor["name"], "data_type": tensor["data_type"],
                 "dims": [int(d) for d in tensor["dims"]]}
        if tensor.get("optional"):
            entry["optional"] = True
        self._config[section].append(entry)

    def add_input(self, input):  # noqa: A002 — Triton's name
        self._add_tensor("input", input)

    def add_output(self, output):
        self._add_tensor("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict):
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError("model_transaction_policy of model '%s' has property '%s'; the "
                                 "one property is 'decoupled'" % (self._name(), key))
        want = bool(transaction_policy_dict.get("decoupled", False))
        given = self._config.get("model_transaction_policy")
        if given is not None and "decoupled" in given and bool(given["decoupled"]) != want:
            raise ValueError(
                "the configuration of model '%s' says decoupled: %s, its auto_complete_config "
                "says %s" % (self._name(), bool(given["decoupled"]), want))
        self._config["model_transaction_policy"] = {"decoupled": want}


_host = None  # the stub's Host (asyncinfer_python_stub.py): the server's side of the calls


def is_model_ready(model_name, model_version=""):
    """Whether the server serves model_name (version "" = any) and it is ready."""
    return bool(_host.ask({"op": "model_ready", "model": str(model_name),
                           "version": str(model_version)}))


def load_model(model_name, config="", files=None):
    """Loads (or reloads) model_name from the repository (explicit model control mode); config:
    a JSON model configuration that replaces its config.pbtxt. Blocks until the load is
    decided; raises TritonModelException with the server's reason on failure."""
    if files:
        raise TritonModelException(
            "load_model: files (a model's files in the request) are not supported by asyncinfer; "
            "put them in the repository")
    _host.ask({"op": "load_model", "model": str(model_name), "config": str(config or "")})


def unload_model(model_name):
    """Unloads model_name (explicit model control mode); its requests in flight finish."""
    _host.ask({"op": "unload_model", "model": str(model_name)})


class Metric:
    """One metric (a label set) of a MetricFamily: increment() (counter, gauge), set() (gauge),
    observe() (histogram), value()."""

    def __init__(self, family, labels=None, buckets=None):
        if labels is None:
            labels = {}
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TritonModelException("Metric labels must be a dict of str to str")
        if buckets is not None:
            buckets = [float(b) for b in buckets]
        self._family = family
        self._id = _host.ask({"op": "metric", "family": family._id, "labels": labels,
                              "buckets": buckets or []})

    def _update(self, what, value):
        return _host.ask({"op": "metric_update", "metric": self._id, "what": what,
                          "value": float(value)})

    def increment(self, value):
        self._update("increment", value)

    def set(self, value):
        self._update("set", value)

    def observe(self, value):
        self._update("observe", value)

    def value(self):
        return self._update("value", 0)

    def __del__(self):
        try:
            _host.tell({"op": "metric_delete", "metric": self._id})
        except Exception:  # noqa: BLE001 — at interpreter exit
            pass


class MetricFamily:
    """Triton's custom metric family: a Prometheus name, its help text and its kind; its metrics
    show on the server's /metrics with the labels each was given."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {0: "counter", 1: "gauge", 2: "histogram"}

    def __init__(self, name, description, kind):
        if kind not in self._KINDS:
            raise TritonModelException(
                "MetricFamily kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM, got %r"
                % (kind,))
        self._name = name
        self._kind = kind
        self._id = _host.ask({"op": "metric_family", "name": str(name),
                              "description": str(description), "kind": self._KINDS[kind]})

    def Metric(self, labels=None, buckets=None):  # noqa: N802 — Triton's name
        if buckets is not None and self._kind != self.HISTOGRAM:
            raise TritonModelException("buckets are for histogram metric families")
        if buckets is None and self._kind == self.HISTOGRAM:
            raise TritonModelException("a histogram metric needs buckets")
        return Metric(self, labels, buckets)


def get_input_tensor_by_name(inference_request, name):
    """The request's input tensor called `name`, or None."""
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response, name):
    """The response's output tensor called `name`, or None."""
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def _config_entry(model_config, section, name):
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    for entry in model_config.get(section, []):
        if entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config):
    """Whether the config says model_transaction_policy { decoupled: true }."""
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


def get_input_config_by_name(model_config, name):
    """The config's `input` entry called `name` (a dict), or None. Accepts the dict or the
    JSON text of args['model_config']."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config, name):
    """The config's `output` entry called `name` (a dict), or None."""
    return _config_entry(model_config, "output", name)


class Logger:
    """Triton's pb_utils.Logger: messages go to the server's log (the stub's stderr)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _NAMES = {0: "I", 1: "W", 2: "E", 3: "V"}

    @classmethod
    def log(cls, message, level=INFO):
        """Into the server's log, with the model's name and instance."""
        if _host is not None:
            _host.log(level, message)
            return
        sys.stderr.write("%s python: %s\n" % (cls._NAMES.get(level, "I"), message))
        sys.stderr.flush()

    @classmethod
    def log_info(cls, message):
        cls.log(message, cls.INFO)

    @classmethod
    def log_warn(cls, message):
        cls.log(message, cls.WARNING)

    @classmethod
    def log_error(cls, message):
        cls.log(message, cls.ERROR)

    @classmethod
    def log_verbose(cls, message):
        cls.log(message, cls.VERBOSE)
