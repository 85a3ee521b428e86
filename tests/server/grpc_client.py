"""Helpers for the gRPC tests: the stubs that protoc and grpc_python_plugin generated from the
project's grpc_service.proto (and the standard health.proto), and requests built the way
Triton's tritonclient.grpc builds them (raw_input_contents, little-endian) or with typed
contents (the KServe SDK's default)."""

import struct

import grpc

import grpc_service_pb2 as pb  # noqa: F401  (generated at build time; see CMakeLists.txt)
import grpc_service_pb2_grpc as pb_grpc
import health_pb2
import health_pb2_grpc

SERVICE = "inference.GRPCInferenceService"

# OIP datatype -> (struct format of one element, InferTensorContents field or None)
FORMATS = {
    "BOOL": ("?", "bool_contents"),
    "UINT8": ("B", "uint_contents"),
    "UINT16": ("H", "uint_contents"),
    "UINT32": ("I", "uint_contents"),
    "UINT64": ("Q", "uint64_contents"),
    "INT8": ("b", "int_contents"),
    "INT16": ("h", "int_contents"),
    "INT32": ("i", "int_contents"),
    "INT64": ("q", "int64_contents"),
    "FP32": ("f", "fp32_contents"),
    "FP64": ("d", "fp64_contents"),
    "FP16": ("e", None),
    "BF16": (None, None),
}


def pack(datatype, values):
    fmt = FORMATS[datatype][0]
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def unpack(datatype, raw):
    fmt = FORMATS[datatype][0]
    n = len(raw) // struct.calcsize(fmt)
    return list(struct.unpack("<%d%s" % (n, fmt), raw))


def channel(target, max_message=64 << 20):
    return grpc.insecure_channel(target, options=[
        ("grpc.max_send_message_length", max_message),
        ("grpc.max_receive_message_length", max_message)])


def stub(ch):
    return pb_grpc.GRPCInferenceServiceStub(ch)


def health_stub(ch):
    return health_pb2_grpc.HealthStub(ch)


def infer_request(model, inputs, version="", request_id="", outputs=(), parameters=None,
                  typed=False):
    """inputs: [(name, datatype, shape, values or raw bytes)]."""
    r = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, data in inputs:
        t = r.inputs.add()
        t.name = name
        t.datatype = datatype
        t.shape.extend(shape)
        if typed:
            getattr(t.contents, FORMATS[datatype][1]).extend(data)
        else:
            r.raw_input_contents.append(data if isinstance(data, bytes) else pack(datatype, data))
    for o in outputs:
        r.outputs.add().name = o
    for k, v in (parameters or {}).items():
        set_parameter(r.parameters[k], v)
    return r


def set_parameter(p, v):
    if isinstance(v, bool):
        p.bool_param = v
    elif isinstance(v, int):
        p.int64_param = v
    elif isinstance(v, float):
        p.double_param = v
    else:
        p.string_param = v


def slow_request(cost_us, request_id="", model="slow", parameters=None):
    """A request to a cost_from_input model: it occupies the device for cost_us."""
    return infer_request(model, [("input0", "FP32", [1, 1], [float(cost_us)])],
                         request_id=request_id, parameters=parameters)


def output(response, name):
    """(datatype, shape, raw bytes) of an output, read from raw_output_contents as Triton's
    client does."""
    for i, o in enumerate(response.outputs):
        if o.name == name:
            return o.datatype, list(o.shape), response.raw_output_contents[i]
    raise KeyError(name)
