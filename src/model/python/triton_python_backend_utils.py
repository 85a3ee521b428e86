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
Logger, and the TRITONSERVER_* flags. Not covered: business-logic scripting (InferenceRequest
.exec), DLPack and GPU tensors, auto_complete_config.
"""

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


class Tensor:
    """One named tensor. Inputs are views of the shared memory the server wrote them to: valid
    while the request is being executed (copy what you keep longer). BYTES tensors are numpy
    object arrays of bytes."""

    def __init__(self, name, data, *_unused):
        if not isinstance(name, str):
            raise TritonModelException("Tensor name must be a str, got %r" % (name,))
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                "Tensor '%s': data must be a numpy array, got %s" % (name, type(data).__name__))
        self._name = name
        self._data = data

    def name(self):
        return self._name

    def as_numpy(self):
        return self._data

    def is_cpu(self):
        return True

    def shape(self):
        return list(self._data.shape)

    def triton_dtype(self):
        return numpy_to_triton_type(self._data.dtype)

    def to_dlpack(self):
        raise TritonModelException("DLPack is not supported by asyncinfer's python backend")

    @staticmethod
    def from_dlpack(name, capsule):
        raise TritonModelException("DLPack is not supported by asyncinfer's python backend")

    def __repr__(self):
        return "Tensor(%r, %s%s)" % (self._name, self._data.dtype, list(self._data.shape))


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


class InferenceRequest:
    """One request handed to execute(). Built by the stub; a model reads it."""

    def __init__(self, inputs, requested_output_names=(), request_id="", correlation_id=0,
                 flags=0, parameters="{}", _sender=None, _model_name="", _model_version=-1):
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._parameters = parameters
        self._sender = _sender
        self._model_name = _model_name
        self._model_version = _model_version

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
        return self._parameters

    def model_name(self):
        return self._model_name

    def model_version(self):
        return self._model_version

    def timeout(self):
        return 0

    def is_cancelled(self):
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self):
        if self._sender is None or not self._sender._decoupled:
            raise TritonModelException(
                "get_response_sender() is for decoupled models: the model's config needs "
                "model_transaction_policy { decoupled: true }")
        return self._sender

    def exec(self, *args, **kwargs):
        raise TritonModelException(
            "InferenceRequest.exec (business logic scripting) is not supported by asyncinfer's "
            "python backend; use an ensemble")

    def async_exec(self, *args, **kwargs):
        raise TritonModelException(
            "InferenceRequest.async_exec (business logic scripting) is not supported by "
            "asyncinfer's python backend; use an ensemble")


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
