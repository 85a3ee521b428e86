"""gRPC conformance of `asyncinfer serve` (issue 17) with a Python client whose stubs protoc and
grpc_python_plugin generated from the project's grpc_service.proto: every RPC of
inference.GRPCInferenceService and grpc.health.v1.Health; raw and typed contents for each
datatype, always answered raw; ModelStreamInfer with out-of-order responses matched by id;
deadlines (a 100 ms deadline behind long work ends DEADLINE_EXCEEDED on time) and cancellation
(the slot is free at once); every bad-input case with its status code and message while a channel
opened before keeps being served; message size limits (a response over the limit too); metrics;
health that follows readiness, each change pushed to a Watch as it happens (a lost device, a model
unloaded or loaded through the repository API); drain on SIGTERM, which
neither a health Watch nor an idle channel holds past the drain timeout."""

import os
import queue
import re
import shutil
import signal
import struct
import threading
import time

import grpc
import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import EXAMPLE_REPOSITORY, Repository, Server, builtin_config

harness.parse_args()
import grpc_client as gc  # noqa: E402  (needs the stubs' folder on sys.path)
from grpc_client import pb  # noqa: E402

TYPES = {
    "BOOL": ("TYPE_BOOL", "bool", [True, False, True, True]),
    "UINT8": ("TYPE_UINT8", "u8", [0, 1, 128, 255]),
    "UINT16": ("TYPE_UINT16", "u16", [0, 1, 40000, 65535]),
    "UINT32": ("TYPE_UINT32", "u32", [0, 7, 3000000000, 4294967295]),
    "UINT64": ("TYPE_UINT64", "u64", [0, 9, 2 ** 63, 2 ** 64 - 1]),
    "INT8": ("TYPE_INT8", "i8", [-128, -1, 0, 127]),
    "INT16": ("TYPE_INT16", "i16", [-32768, -2, 3, 32767]),
    "INT32": ("TYPE_INT32", "i32", [-2 ** 31, -5, 6, 2 ** 31 - 1]),
    "INT64": ("TYPE_INT64", "i64", [-2 ** 63, -7, 8, 2 ** 63 - 1]),
    "FP32": ("TYPE_FP32", "f32", [0.5, -2.5, 3.0e38, 1.0e-30]),
    "FP64": ("TYPE_FP64", "f64", [0.1, -2.5, 1.0e300, 5e-324]),
    "FP16": ("TYPE_FP16", "f16", [0.5, -2.0, 65504.0, 0.0]),
    "BF16": ("TYPE_BF16", "bf16", None),
}
BF16_RAW = bytes([0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40, 0x00, 0x00])  # 1, -2, 3.14, 0
BIG = 2 * 1024 * 1024  # FP32 elements of the "big" model: 8 MiB, over gRPC's own 4 MB default


def model_name(dt):
    return "types_" + dt.lower()


def make_repository():
    repo = Repository()
    for m in ("identity", "slow"):
        shutil.copytree(os.path.join(EXAMPLE_REPOSITORY, m), os.path.join(repo.path, m))
    for dt, (ctype, short, _) in TYPES.items():
        repo.add(model_name(dt), builtin_config(
            model_name(dt), "builtin:identity?dtype=%s&shape=4&max_batch=4" % short,
            [("input0", ctype, [4])], [("output0", ctype, [4])], max_batch_size=4))
    repo.add("two", builtin_config(
        "two", "builtin:identity?inputs=2&shape=3&max_batch=4",
        [("input0", "TYPE_FP32", [3]), ("input1", "TYPE_FP32", [3])],
        [("output0", "TYPE_FP32", [3]), ("output1", "TYPE_FP32", [3])], max_batch_size=4))
    # Four requests at once on four simulated compute engines, each as long as it asks: the
    # stream's responses come back in completion order.
    repo.add("par", builtin_config(
        "par", "builtin:fixed_cost?cost_from_input=true&shape=1&max_batch=1",
        [("input0", "TYPE_FP32", [1])], [("output0", "TYPE_FP32", [1])], max_batch_size=1,
        device="sim:compute_engines=4",
        extra='instance_group [ { kind: KIND_CPU, count: 4 } ]\n'
              'parameters { key: "max_inflight_per_worker" value { string_value: "1" } }\n'))
    repo.add("mid", builtin_config(
        "mid", "builtin:identity?shape=4096&max_batch=1", [("input0", "TYPE_FP32", [4096])],
        [("output0", "TYPE_FP32", [4096])], max_batch_size=1))
    repo.add("big", builtin_config(
        "big", "builtin:identity?shape=%d&max_batch=1" % BIG, [("input0", "TYPE_FP32", [BIG])],
        [("output0", "TYPE_FP32", [BIG])], max_batch_size=1))
    # No batching, any length (its signature is the backend's: input0/output0 FP32 [-1]): a
    # zero-element input is valid, and a response can be sized to just over a message limit.
    repo.add("nobatch", 'name: "nobatch"\nbackend: "builtin"\nmax_batch_size: 0\n'
             'parameters { key: "uri" value { string_value: '
             '"builtin:identity?shape=-1&max_batch_size=0" } }\n')
    return repo


def response_over(limit, request_id):
    """A request to `nobatch` of at most `limit` bytes whose response is over it: the response
    repeats the request's fields and adds model_version "1" (3 bytes), and "output0" is a byte
    longer than "input0"."""
    n = limit // 4 - 64
    r = gc.infer_request("nobatch", [("input0", "FP32", [n], b"\0" * (4 * n))],
                         request_id=request_id)
    pad = limit - 2 - r.ByteSize()
    r.id = request_id + "x" * pad
    while r.ByteSize() > limit - 2:  # a longer id can take a longer length prefix
        pad -= 1
        r.id = request_id + "x" * pad
    assert limit - 3 <= r.ByteSize() <= limit - 2, r.ByteSize()
    return r


def f32(values):
    return list(struct.unpack("<%df" % len(values), struct.pack("<%df" % len(values), *values)))


def metrics(server):
    text = requests.get(server.metrics_url, timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def metric(server, family, suffix="", **labels):
    """The sum of a family's samples with `labels` (suffix: "_count" of a histogram)."""
    f = metrics(server).get(family)
    names = (family + suffix,) if suffix else (family, family + "_total")
    total = 0.0
    for s in (f.samples if f else []):
        if s.name in names and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


# The wire contract (KServe's open_inference_grpc.proto and Triton's grpc_service.proto, as
# shared/protocol facts): message -> {field: number}. A renamed or renumbered field breaks every
# existing client, so the generated descriptors are checked against it.
WIRE = {
    "ServerLiveResponse": {"live": 1},
    "ServerReadyResponse": {"ready": 1},
    "ModelReadyRequest": {"name": 1, "version": 2},
    "ModelReadyResponse": {"ready": 1},
    "ServerMetadataResponse": {"name": 1, "version": 2, "extensions": 3},
    "ModelMetadataRequest": {"name": 1, "version": 2},
    "ModelMetadataResponse": {"name": 1, "versions": 2, "platform": 3, "inputs": 4,
                              "outputs": 5},
    "ModelMetadataResponse.TensorMetadata": {"name": 1, "datatype": 2, "shape": 3},
    "InferParameter": {"bool_param": 1, "int64_param": 2, "string_param": 3, "double_param": 4,
                       "uint64_param": 5},
    "InferTensorContents": {"bool_contents": 1, "int_contents": 2, "int64_contents": 3,
                            "uint_contents": 4, "uint64_contents": 5, "fp32_contents": 6,
                            "fp64_contents": 7, "bytes_contents": 8},
    "ModelInferRequest": {"model_name": 1, "model_version": 2, "id": 3, "parameters": 4,
                          "inputs": 5, "outputs": 6, "raw_input_contents": 7},
    "ModelInferRequest.InferInputTensor": {"name": 1, "datatype": 2, "shape": 3,
                                           "parameters": 4, "contents": 5},
    "ModelInferRequest.InferRequestedOutputTensor": {"name": 1, "parameters": 2},
    "ModelInferResponse": {"model_name": 1, "model_version": 2, "id": 3, "parameters": 4,
                           "outputs": 5, "raw_output_contents": 6},
    "ModelInferResponse.InferOutputTensor": {"name": 1, "datatype": 2, "shape": 3,
                                             "parameters": 4, "contents": 5},
    "ModelStreamInferResponse": {"error_message": 1, "infer_response": 2},
    "RepositoryIndexRequest": {"repository_name": 1, "ready": 2},
    "RepositoryIndexResponse": {"models": 1},
    "RepositoryIndexResponse.ModelIndex": {"name": 1, "version": 2, "state": 3, "reason": 4},
}
METHODS = {"ServerLive": (False, False), "ServerReady": (False, False),
           "ModelReady": (False, False), "ServerMetadata": (False, False),
           "ModelMetadata": (False, False), "ModelInfer": (False, False),
           "ModelStreamInfer": (True, True), "RepositoryIndex": (False, False)}


class Proto(harness.unittest.TestCase):
    def test_wire_names_and_numbers(self):
        self.assertEqual(pb.DESCRIPTOR.package, "inference")
        for full, fields in WIRE.items():
            with self.subTest(message=full):
                d = pb.DESCRIPTOR.message_types_by_name[full.split(".")[0]]
                for part in full.split(".")[1:]:
                    d = d.nested_types_by_name[part]
                self.assertEqual({f.name: f.number for f in d.fields}, fields)
        self.assertEqual([f.name for f in pb.InferParameter.DESCRIPTOR.oneofs[0].fields],
                         ["bool_param", "int64_param", "string_param", "double_param",
                          "uint64_param"])
        service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        self.assertEqual(service.full_name, gc.SERVICE)
        for name, (client_stream, server_stream) in METHODS.items():
            m = service.methods_by_name[name]
            self.assertEqual((m.input_type.name, m.output_type.name),
                             ({"ModelStreamInfer": "ModelInferRequest"}.get(name, name + "Request"),
                              {"ModelStreamInfer": "ModelStreamInferResponse"}.get(
                                  name, name + "Response")))
            self.assertEqual((m.client_streaming, m.server_streaming),
                             (client_stream, server_stream))


class RpcCase(harness.unittest.TestCase):
    def assert_code(self, code, contains, fn, *args, **kw):
        with self.assertRaises(grpc.RpcError) as e:
            fn(*args, **kw)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertIn(contains, e.exception.details())
        return e.exception.details()


class Conformance(RpcCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = make_repository()
        cls.server = Server(cls.repo.path).start()
        cls.channel = gc.channel(cls.server.grpc_target)
        cls.stub = gc.stub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()
        cls.repo.cleanup()

    def test_port_is_logged_and_not_shared(self):
        self.assertIn("grpc: listening on 127.0.0.1:%d" % self.server.grpc_port, self.server.log())
        # A second server on the same port fails instead of sharing it (no SO_REUSEPORT).
        with self.assertRaises(RuntimeError) as e:
            Server(self.repo.path, "--grpc-port", str(self.server.grpc_port)).start()
        self.assertIn("cannot listen on 127.0.0.1:%d for gRPC" % self.server.grpc_port,
                      str(e.exception))

    def test_server_live_ready_metadata(self):
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.stub.ServerReady(pb.ServerReadyRequest()).ready)
        m = self.stub.ServerMetadata(pb.ServerMetadataRequest())
        self.assertEqual(m.name, "asyncinfer")
        self.assertTrue(m.version)
        self.assertIn("binary_tensor_data", list(m.extensions))  # the same list as GET /v2

    def test_health(self):
        h = gc.health_stub(self.channel)
        serving = gc.health_pb2.HealthCheckResponse.SERVING
        self.assertEqual(h.Check(gc.health_pb2.HealthCheckRequest(service="")).status, serving)
        self.assertEqual(h.Check(gc.health_pb2.HealthCheckRequest(service=gc.SERVICE)).status,
                         serving)
        self.assert_code(grpc.StatusCode.NOT_FOUND, "", h.Check,
                         gc.health_pb2.HealthCheckRequest(service="no.such.Service"))
        watch = h.Watch(gc.health_pb2.HealthCheckRequest(service=""), timeout=10)
        self.assertEqual(next(watch).status, serving)
        watch.cancel()
        # An unknown service: SERVICE_UNKNOWN on Watch, and the call stays open.
        watch = h.Watch(gc.health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        self.assertEqual(next(watch).status, gc.health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        watch.cancel()

    def test_zero_element_input_typed_and_raw(self):
        # Typed: no values to send, so `contents` may be absent (a client that sets no field of
        # it sends none), or present and empty; raw: an empty entry. Each is a tensor of shape
        # [0], as over HTTP.
        absent = gc.infer_request("nobatch", [("input0", "FP32", [0], b"")], request_id="absent")
        del absent.raw_input_contents[:]
        self.assertFalse(absent.inputs[0].HasField("contents"))
        typed = gc.infer_request("nobatch", [("input0", "FP32", [0], [])], typed=True,
                                 request_id="typed")
        raw = gc.infer_request("nobatch", [("input0", "FP32", [0], b"")], request_id="raw")
        for r in (absent, typed, raw):
            out = self.stub.ModelInfer(r, timeout=10)
            self.assertEqual(out.id, r.id)
            self.assertEqual(gc.output(out, "output0"), ("FP32", [0], b""))

    def test_model_metadata(self):
        m = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="identity"))
        self.assertEqual(m.name, "identity")
        self.assertEqual(list(m.versions), ["1", "2"])
        self.assertEqual(m.platform, "asyncinfer_builtin")
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.inputs],
                         [("input0", "FP32", [-1, 16])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.outputs],
                         [("output0", "FP32", [-1, 16])])
        m1 = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="identity", version="1"))
        self.assertEqual(list(m1.versions), ["1"])
        self.assert_code(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found",
                         self.stub.ModelMetadata, pb.ModelMetadataRequest(name="nope"))
        self.assert_code(grpc.StatusCode.NOT_FOUND, "version 7 is not found",
                         self.stub.ModelMetadata,
                         pb.ModelMetadataRequest(name="identity", version="7"))
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, "specified version string 'x'",
                         self.stub.ModelMetadata,
                         pb.ModelMetadataRequest(name="identity", version="x"))

    def test_model_ready(self):
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="identity")).ready)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="identity",
                                                                  version="1")).ready)
        self.assert_code(grpc.StatusCode.NOT_FOUND, "unknown model", self.stub.ModelReady,
                         pb.ModelReadyRequest(name="nope"))

    def test_repository_index(self):
        r = self.stub.RepositoryIndex(pb.RepositoryIndexRequest())
        entries = {(m.name, m.version): m.state for m in r.models}
        self.assertEqual(entries[("identity", "1")], "READY")
        self.assertEqual(entries[("identity", "2")], "READY")
        self.assertIn(("par", "1"), entries)
        self.assertEqual(len(self.stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
                             .models), len(r.models))

    def test_unimplemented_triton_rpc(self):
        # Triton's RepositoryModelLoad is not served: UNIMPLEMENTED, as any server without it
        # answers.
        call = self.channel.unary_unary("/inference.GRPCInferenceService/RepositoryModelLoad")
        self.assert_code(grpc.StatusCode.UNIMPLEMENTED, "", call, b"\x0a\x08identity")

    def test_infer_raw_id_versions(self):
        values = [i / 7.0 for i in range(32)]
        r = self.stub.ModelInfer(gc.infer_request(
            "identity", [("input0", "FP32", [2, 16], values)], request_id="raw-1"))
        self.assertEqual((r.model_name, r.model_version, r.id), ("identity", "2", "raw-1"))
        dt, shape, raw = gc.output(r, "output0")
        self.assertEqual((dt, shape), ("FP32", [2, 16]))
        self.assertEqual(gc.unpack("FP32", raw), f32(values))
        # Outputs are raw only: no typed contents.
        self.assertFalse(r.outputs[0].HasField("contents"))
        r1 = self.stub.ModelInfer(gc.infer_request(
            "identity", [("input0", "FP32", [1, 16], values[:16])], version="1"))
        self.assertEqual((r1.model_version, r1.id), ("1", ""))

    def test_each_datatype_typed_and_raw(self):
        for dt, (_, _, values) in TYPES.items():
            with self.subTest(dt=dt):
                raw = BF16_RAW if dt == "BF16" else gc.pack(dt, values)
                r = self.stub.ModelInfer(gc.infer_request(
                    model_name(dt), [("input0", dt, [1, 4], raw)], request_id=dt))
                self.assertEqual(gc.output(r, "output0"), (dt, [1, 4], raw))
                if dt in ("FP16", "BF16"):
                    continue
                r = self.stub.ModelInfer(gc.infer_request(
                    model_name(dt), [("input0", dt, [1, 4], values)], typed=True))
                out = gc.output(r, "output0")
                self.assertEqual(out[:2], (dt, [1, 4]))
                self.assertEqual(gc.unpack(dt, out[2]),
                                 f32(values) if dt == "FP32" else values)

    def test_output_selection_and_order(self):
        inputs = [("input0", "FP32", [1, 3], [1, 2, 3]), ("input1", "FP32", [1, 3], [4, 5, 6])]
        r = self.stub.ModelInfer(gc.infer_request("two", inputs))
        self.assertEqual([o.name for o in r.outputs], ["output0", "output1"])
        self.assertEqual(len(r.raw_output_contents), 2)
        r = self.stub.ModelInfer(gc.infer_request("two", inputs[::-1],
                                                  outputs=["output1", "output0"]))
        self.assertEqual([o.name for o in r.outputs], ["output1", "output0"])
        self.assertEqual(gc.unpack("FP32", r.raw_output_contents[0]), [4, 5, 6])
        self.assertEqual(gc.unpack("FP32", r.raw_output_contents[1]), [1, 2, 3])
        r = self.stub.ModelInfer(gc.infer_request("two", inputs, outputs=["output1"]))
        self.assertEqual([o.name for o in r.outputs], ["output1"])

    def test_parameters(self):
        req = gc.infer_request("identity", [("input0", "FP32", [1, 16], [1] * 16)],
                               parameters={"timeout": 5_000_000, "priority": 1,
                                           "binary_data_output": True, "user": "x",
                                           "ratio": 0.5})
        req.inputs[0].parameters["note"].string_param = "kept"
        req.outputs.add().name = "output0"
        req.outputs[0].parameters["binary_data"].bool_param = True
        self.assertEqual(gc.output(self.stub.ModelInfer(req), "output0")[1], [1, 16])

    def test_large_message_over_grpc_default(self):
        values = struct.pack("<%df" % BIG, *([0.25] * BIG))
        r = self.stub.ModelInfer(gc.infer_request("big", [("input0", "FP32", [1, BIG], values)]),
                                 timeout=60)
        self.assertEqual(gc.output(r, "output0")[2], values)

    def test_stream_large_outputs(self):
        # Outputs over 8 KiB travel as their own slice, inside the stream's wrapper message.
        reqs, sent = [], {}
        for i in range(3):
            sent[str(i)] = struct.pack("<4096f", *([i + 0.5] * 4096))  # 16 KiB
            reqs.append(gc.infer_request("mid", [("input0", "FP32", [1, 4096], sent[str(i)])],
                                         request_id=str(i)))
        got = list(self.stub.ModelStreamInfer(iter(reqs), timeout=60))
        self.assertEqual(sorted(r.infer_response.id for r in got), ["0", "1", "2"])
        for r in got:
            self.assertEqual(r.error_message, "")
            self.assertEqual(gc.output(r.infer_response, "output0"),
                             ("FP32", [1, 4096], sent[r.infer_response.id]))
        r = self.stub.ModelInfer(reqs[0])
        self.assertEqual(gc.output(r, "output0")[2], sent["0"])

    def test_stream_out_of_order_matched_by_id(self):
        # 400, 300, 200, 100 ms on four engines at once: they complete in reverse order.
        reqs = [gc.slow_request(cost, "id-%d" % cost, model="par")
                for cost in (400_000, 300_000, 200_000, 100_000)]
        start = time.monotonic()
        got = [(r.error_message, r.infer_response.id, time.monotonic() - start)
               for r in self.stub.ModelStreamInfer(iter(reqs), timeout=30)]
        self.assertEqual([g[0] for g in got], [""] * 4)
        self.assertEqual([g[1] for g in got], ["id-100000", "id-200000", "id-300000", "id-400000"])
        self.assertLess(got[-1][2], 3.0)  # they ran together, not one after another (1 s)

    def test_stream_answers_each_request_and_goes_on_after_errors(self):
        ok = gc.infer_request("identity", [("input0", "FP32", [1, 16], [2] * 16)],
                              request_id="good")
        bad_model = gc.infer_request("nope", [("input0", "FP32", [1, 16], [2] * 16)],
                                     request_id="bad-model")
        bad_shape = gc.infer_request("identity", [("input0", "FP32", [1, 15], [2] * 15)],
                                     request_id="bad-shape")
        got = {r.infer_response.id: r for r in
               self.stub.ModelStreamInfer(iter([ok, bad_model, bad_shape, ok]), timeout=30)}
        self.assertEqual(set(got), {"good", "bad-model", "bad-shape"})
        self.assertEqual(got["good"].error_message, "")
        self.assertEqual(gc.output(got["good"].infer_response, "output0")[2], gc.pack("FP32", [2] * 16))
        self.assertIn("Request for unknown model: 'nope' is not found", got["bad-model"].error_message)
        self.assertIn("input 'input0': shape [1,15]", got["bad-shape"].error_message)
        self.assertEqual(got["bad-model"].infer_response.model_name, "nope")

    def test_stream_many_in_flight(self):
        n = 300
        reqs = [gc.infer_request("identity", [("input0", "FP32", [1, 16], [float(i)] * 16)],
                                 request_id=str(i)) for i in range(n)]
        got = {}
        for r in self.stub.ModelStreamInfer(iter(reqs), timeout=60):
            self.assertEqual(r.error_message, "")
            got[r.infer_response.id] = gc.unpack("FP32", r.infer_response.raw_output_contents[0])
        self.assertEqual(len(got), n)
        for i in range(n):
            self.assertEqual(got[str(i)], [float(i)] * 16)

    def test_metrics(self):
        for _ in range(3):
            self.stub.ModelInfer(gc.infer_request("identity",
                                                  [("input0", "FP32", [1, 16], [1] * 16)]))
        with self.assertRaises(grpc.RpcError):
            self.stub.ModelInfer(gc.infer_request("nope", [("input0", "FP32", [1, 16], [1] * 16)]))
        fams = metrics(self.server)
        self.assertGreaterEqual(metric(self.server, "asyncinfer_grpc_requests", grpc_code="OK"), 3)
        self.assertGreaterEqual(metric(self.server, "asyncinfer_grpc_requests",
                                       grpc_code="NOT_FOUND"), 1)
        self.assertGreaterEqual(metric(self.server, "asyncinfer_grpc_infer_duration_us", "_count"), 3)
        self.assertEqual(fams["asyncinfer_grpc_infer_duration_us"].type, "histogram")
        # The frontend accepts gRPC's connections itself (issue 23), so it counts them: this
        # test's channel is one.
        self.assertGreaterEqual(metric(self.server, "asyncinfer_grpc_active_connections"), 1)
        self.assertIn("asyncinfer_grpc_connections", fams)
        self.assertIn("asyncinfer_http_active_connections", fams)


class BadInput(RpcCase):
    """Each case gets its code and a message naming what was wrong; a channel opened before
    keeps being served; at the end every accepted request has ended."""

    @classmethod
    def setUpClass(cls):
        cls.repo = make_repository()
        cls.server = Server(cls.repo.path, "--grpc-max-message-bytes", str(4 << 20)).start()
        cls.sentinel_channel = gc.channel(cls.server.grpc_target)
        cls.sentinel = gc.stub(cls.sentinel_channel)
        cls.channel = gc.channel(cls.server.grpc_target)
        cls.stub = gc.stub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.sentinel_channel.close()
        cls.server.stop()
        cls.repo.cleanup()

    def check_sentinel(self):
        r = self.sentinel.ModelInfer(gc.infer_request(
            "identity", [("input0", "FP32", [1, 16], [3] * 16)], request_id="sentinel"), timeout=10)
        self.assertEqual(gc.output(r, "output0")[2], gc.pack("FP32", [3] * 16))

    def bad(self, code, contains, request):
        details = self.assert_code(code, contains, self.stub.ModelInfer, request, timeout=10)
        self.check_sentinel()
        return details

    def invalid(self, contains, model, inputs, typed=False, **kw):
        return self.bad(grpc.StatusCode.INVALID_ARGUMENT, contains,
                        gc.infer_request(model, inputs, typed=typed, **kw))

    def good_input(self, shape=(1, 16)):
        n = 1
        for d in shape:
            n *= d
        return [("input0", "FP32", list(shape), [1.0] * n)]

    def test_not_a_protobuf(self):
        call = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, "not a valid inference.ModelInferRequest",
                         call, b"\xff\xff\xff\xff", timeout=10)
        self.check_sentinel()

    def test_unknown_model_version_input_output(self):
        self.bad(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found",
                 gc.infer_request("nope", self.good_input()))
        self.bad(grpc.StatusCode.NOT_FOUND, "version 9 is not found",
                 gc.infer_request("identity", self.good_input(), version="9"))
        self.invalid("failed to get model version from specified version string 'v1'", "identity",
                     self.good_input(), version="v1")
        self.invalid("unexpected inference input 'x' for model 'identity' (inputs: input0)", "identity",
                     [("x", "FP32", [1, 16], [1.0] * 16)])
        self.invalid("has no output 'y' (outputs: output0)", "identity", self.good_input(),
                     outputs=["y"])
        self.invalid("output 'output0' is requested twice", "identity", self.good_input(),
                     outputs=["output0", "output0"])

    def test_missing_repeated_and_nameless_inputs(self):
        self.invalid("expected 2 inputs but got 1 inputs for model 'two'. Got input(s) ['input0'], "
                     "but missing required input(s) ['input1']. Please provide all required "
                     "input(s).", "two",
                     [("input0", "FP32", [1, 3], [1, 2, 3])])
        self.invalid("input 'input0' is given twice", "two",
                     [("input0", "FP32", [1, 3], [1, 2, 3])] * 2)
        self.invalid("inputs[0] has no name", "identity", [("", "FP32", [1, 16], [1.0] * 16)])
        self.invalid("datatype is missing", "identity", [("input0", "", [1, 16], b"\0" * 64)])

    def test_datatype_and_shape(self):
        self.invalid("datatype INT32 does not match the model's FP32", "identity",
                     [("input0", "INT32", [1, 16], [1] * 16)])
        self.invalid("FP23", "identity", [("input0", "FP23", [1, 16], b"\0" * 64)])
        self.invalid("datatype BYTES does not match the model's FP32", "identity",
                     [("input0", "BYTES", [1, 16], b"\0" * 64)])
        self.invalid("has a negative dim", "identity", [("input0", "FP32", [1, -16], b"")])
        self.invalid("has 1 dims, the model expects 2", "identity",
                     [("input0", "FP32", [16], [1.0] * 16)])
        self.invalid("batch dim (dim 0) is 0", "identity", [("input0", "FP32", [0, 16], b"")])
        self.invalid("exceeds the model's max_batch_size 8", "identity",
                     self.good_input((9, 16)))
        self.invalid("does not match the model's [-1,16]", "identity",
                     [("input0", "FP32", [1, 15], [1.0] * 15)])
        self.invalid("too large", "identity",
                     [("input0", "FP32", [2 ** 62, 16], b"")])

    def test_raw_count_and_size_mismatch(self):
        r = gc.infer_request("identity", self.good_input())
        r.raw_input_contents.append(b"\0" * 64)
        self.bad(grpc.StatusCode.INVALID_ARGUMENT,
                 "raw_input_contents has 2 entries but the request has 1 inputs", r)
        r = gc.infer_request("two", [("input0", "FP32", [1, 3], [1, 2, 3]),
                                     ("input1", "FP32", [1, 3], [1, 2, 3])])
        del r.raw_input_contents[1]
        self.bad(grpc.StatusCode.INVALID_ARGUMENT,
                 "raw_input_contents has 1 entries but the request has 2 inputs", r)
        self.invalid("input byte size mismatch for input 'input0' for model 'identity'. "
                     "Expected 64, got 63", "identity", [("input0", "FP32", [1, 16], b"\0" * 63)])
        self.invalid("Expected 64, got 65", "identity", [("input0", "FP32", [1, 16], b"\0" * 65)])

    def test_raw_and_typed_together(self):
        r = gc.infer_request("two", [("input0", "FP32", [1, 3], [1, 2, 3]),
                                     ("input1", "FP32", [1, 3], [1, 2, 3])])
        r.inputs[1].contents.fp32_contents.extend([1, 2, 3])
        self.bad(grpc.StatusCode.INVALID_ARGUMENT,
                 "contents field must not be specified when using raw_input_contents for "
                 "'input1' for model 'two'", r)
        # Triton's words come before the count of raw entries is checked: Triton's example
        # grpc_explicit_int_content_client.py sends one raw entry for two inputs and typed
        # contents on the first, and matches on them.
        del r.raw_input_contents[1:]
        r.inputs[1].ClearField("contents")
        r.inputs[0].contents.fp32_contents.extend([1, 2, 3])
        self.bad(grpc.StatusCode.INVALID_ARGUMENT,
                 "contents field must not be specified when using raw_input_contents for "
                 "'input0' for model 'two'", r)

    def test_typed_contents(self):
        self.invalid("contents.fp32_contents has 15 values, shape [1,16] needs 16", "identity",
                     [("input0", "FP32", [1, 16], [1.0] * 15)], typed=True)
        r = gc.infer_request("identity", [("input0", "FP32", [1, 16], [1] * 16)])
        del r.raw_input_contents[:]
        r.inputs[0].contents.int_contents.extend([1] * 16)
        self.bad(grpc.StatusCode.INVALID_ARGUMENT,
                 "FP32 values go in contents.fp32_contents, but contents.int_contents has 16", r)
        self.invalid("contents.int_contents[1] = 128 is out of range for INT8", "types_int8",
                     [("input0", "INT8", [1, 4], [1, 128, 0, 0])], typed=True)
        self.invalid("contents.uint_contents[3] = 65536 is out of range for UINT16", "types_uint16",
                     [("input0", "UINT16", [1, 4], [1, 2, 3, 65536])], typed=True)
        r = gc.infer_request("types_fp16", [("input0", "FP16", [1, 4], [1.0] * 4)])
        del r.raw_input_contents[:]
        r.inputs[0].contents.fp32_contents.extend([1.0] * 4)
        self.bad(grpc.StatusCode.INVALID_ARGUMENT, "FP16 has no typed contents; send it in "
                 "raw_input_contents", r)
        r = gc.infer_request("identity", self.good_input())
        del r.raw_input_contents[:]
        self.bad(grpc.StatusCode.INVALID_ARGUMENT, "input 'input0': no data; set "
                 "contents.fp32_contents or send every input in raw_input_contents", r)

    def test_parameters(self):
        r = gc.infer_request("identity", self.good_input())
        r.parameters["timeout"].SetInParent()  # an InferParameter with no value
        self.bad(grpc.StatusCode.INVALID_ARGUMENT, "parameter 'timeout' has no value", r)
        self.invalid("parameter 'priority' is 5000, outside 0..1000", "identity",
                     self.good_input(), parameters={"priority": 5000})
        self.invalid("parameter 'timeout' must be an integer", "identity", self.good_input(),
                     parameters={"timeout": "soon"})
        r = gc.infer_request("identity", self.good_input(), outputs=["output0"])
        r.outputs[0].parameters["classification"].string_param = "3"
        self.bad(grpc.StatusCode.INVALID_ARGUMENT,
                 "output 'output0': parameter 'classification' must be an integer", r)

    def test_message_over_the_limit(self):
        values = b"\0" * (BIG * 4)  # 8 MiB against this server's 4 MiB
        self.bad(grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max",
                 gc.infer_request("big", [("input0", "FP32", [1, BIG], values)]))

    def test_stream_garbage_after_a_good_request(self):
        good = gc.infer_request("identity", [("input0", "FP32", [1, 16], [5] * 16)],
                                request_id="before-garbage").SerializeToString()
        call = self.channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        responses = call(iter([good, b"\xff\xff\xff\xff"]), timeout=10)
        first = pb.ModelStreamInferResponse.FromString(next(responses))
        self.assertEqual((first.error_message, first.infer_response.id), ("", "before-garbage"))
        with self.assertRaises(grpc.RpcError) as e:
            next(responses)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("stream message 2 is not a valid inference.ModelInferRequest",
                      e.exception.details())
        self.check_sentinel()

    def test_response_over_the_limit(self):
        # Unary: the call ends RESOURCE_EXHAUSTED, counted so.
        before = metric(self.server, "asyncinfer_grpc_requests", grpc_code="RESOURCE_EXHAUSTED")
        self.bad(grpc.StatusCode.RESOURCE_EXHAUSTED, "over the largest message this server sends",
                 response_over(4 << 20, "unary"))
        # A stream answers that request with error_message and goes on.
        requests_ = [gc.infer_request("identity", [("input0", "FP32", [1, 16], [1] * 16)],
                                      request_id="before"),
                     response_over(4 << 20, "too-big"),
                     gc.infer_request("identity", [("input0", "FP32", [1, 16], [2] * 16)],
                                      request_id="after")]

        def one_at_a_time():  # in order, so the responses come back in order
            for r in requests_:
                yield r
                time.sleep(0.2)

        got = [(r.infer_response.id[:7], r.error_message)
               for r in self.stub.ModelStreamInfer(one_at_a_time(), timeout=30)]
        self.assertEqual([g[0] for g in got], ["before", "too-big", "after"], got)
        self.assertEqual(got[0][1], "")
        self.assertIn("over the largest message this server sends (4194304 bytes, "
                      "--grpc-max-message-bytes)", got[1][1])
        self.assertEqual(got[2][1], "")
        self.assertEqual(metric(self.server, "asyncinfer_grpc_requests",
                                grpc_code="RESOURCE_EXHAUSTED"), before + 2)
        self.check_sentinel()

    def test_stream_messages_over_the_limit(self):
        big = gc.infer_request("big", [("input0", "FP32", [1, BIG], b"\0" * (BIG * 4))])
        with self.assertRaises(grpc.RpcError) as e:
            list(self.stub.ModelStreamInfer(iter([big]), timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.check_sentinel()

    def test_zz_nothing_accepted_was_lost(self):
        ended = sum(metric(self.server, "asyncinfer_inference_request_" + k) for k in
                    ("success", "failure", "timed_out", "cancelled", "shut_down"))
        self.assertEqual(metric(self.server, "asyncinfer_inference_request_accepted"), ended)
        self.assertEqual(metric(self.server, "asyncinfer_inference_pending_request_count"), 0)


class Deadlines(RpcCase):
    """On the `slow` model: one request at a time on the simulated device, each as long as its
    first element says (µs)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(EXAMPLE_REPOSITORY).start()
        cls.channel = gc.channel(cls.server.grpc_target)
        cls.stub = gc.stub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()

    def ended(self):
        return sum(metric(self.server, "asyncinfer_inference_request_" + k, model="slow")
                   for k in ("timed_out", "cancelled"))

    def test_deadline_behind_long_work_on_time(self):
        before = self.ended()
        busy = self.stub.ModelInfer.future(gc.slow_request(1_500_000), timeout=30)
        time.sleep(0.2)  # the long request occupies the only worker
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as e:
            self.stub.ModelInfer(gc.slow_request(1000), timeout=0.1)
        took = time.monotonic() - start
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertGreaterEqual(took, 0.09)
        self.assertLess(took, 1.0)  # long before the 1.5 s ahead of it ends
        self.assertEqual(gc.output(busy.result(), "output0")[1], [1, 1])
        # The engine request ended too (its deadline, or the call's cancel at the deadline).
        deadline = time.monotonic() + 5
        while self.ended() <= before:
            self.assertLess(time.monotonic(), deadline, "the engine request did not end")
            time.sleep(0.05)

    def test_timeout_parameter_is_the_servers_deadline(self):
        busy = self.stub.ModelInfer.future(gc.slow_request(1_000_000), timeout=30)
        time.sleep(0.2)
        start = time.monotonic()
        details = self.assert_code(grpc.StatusCode.DEADLINE_EXCEEDED, "timed out",
                                   self.stub.ModelInfer,
                                   gc.slow_request(1000, parameters={"timeout": 100_000}),
                                   timeout=30)
        self.assertLess(time.monotonic() - start, 0.9, details)
        busy.result()

    def test_cancel_frees_the_slot(self):
        before = metric(self.server, "asyncinfer_inference_request_cancelled", model="slow")
        f = self.stub.ModelInfer.future(gc.slow_request(5_000_000), timeout=30)  # 5 s of work
        time.sleep(0.3)
        f.cancel()
        start = time.monotonic()
        r = self.stub.ModelInfer(gc.slow_request(1000), timeout=10)
        self.assertEqual(gc.output(r, "output0")[1], [1, 1])
        self.assertLess(time.monotonic() - start, 2.0)  # the 5 s request no longer holds it
        deadline = time.monotonic() + 5
        while metric(self.server, "asyncinfer_inference_request_cancelled", model="slow") <= before:
            self.assertLess(time.monotonic(), deadline, "the engine request was not cancelled")
            time.sleep(0.05)

    def test_cancel_storm_while_queued_ends_every_call(self):
        """ModelInfer's OnCancel and OnDone run on gRPC's own threads, inline: calls cancelled
        while they wait in the queue race calls timing out beside them. Every call ends with its
        own code, every request the engine accepted ends, and the server goes on serving."""
        def count(kind):
            return metric(self.server, "asyncinfer_inference_request_" + kind, model="slow")

        def ended():  # failure counts the timed-out and cancelled requests too
            return count("success") + count("failure")

        accepted0, ended0, cancelled0 = count("accepted"), ended(), count("cancelled")
        def wait_accepted(n):
            deadline = time.monotonic() + 10
            while count("accepted") < accepted0 + n:
                self.assertLess(time.monotonic(), deadline, "the calls did not reach the engine")
                time.sleep(0.02)

        busy = self.stub.ModelInfer.future(gc.slow_request(1_500_000), timeout=30)
        wait_accepted(1)
        time.sleep(0.1)  # the busy request holds the only worker
        cancelled = [self.stub.ModelInfer.future(gc.slow_request(1000, f"c{i}"), timeout=30)
                     for i in range(30)]
        wait_accepted(31)  # all of them wait behind the busy one
        timed = []
        for i, f in enumerate(cancelled):
            timed.append(self.stub.ModelInfer.future(gc.slow_request(1000, f"t{i}"),
                                                     timeout=0.05 + 0.005 * i))
            f.cancel()
        for f in cancelled:
            self.assertTrue(f.cancelled())
        for f in timed:
            with self.assertRaises(grpc.RpcError) as e:
                f.result(timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertEqual(gc.output(busy.result(timeout=10), "output0")[1], [1, 1])
        deadline = time.monotonic() + 10
        while ended() - ended0 < count("accepted") - accepted0:
            self.assertLess(time.monotonic(), deadline,
                            f"{ended() - ended0} of {count('accepted') - accepted0} engine "
                            "requests ended")
            time.sleep(0.05)
        # The 30 were cancelled in the queue, not run after the busy one (the timed-out ones
        # may count as cancelled too: gRPC's cancel at the deadline or the engine's deadline).
        self.assertGreaterEqual(count("cancelled") - cancelled0, 30)
        r = self.stub.ModelInfer(gc.slow_request(1000, "after"), timeout=10)
        self.assertEqual(r.id, "after")

    def test_stream_cancel_frees_the_slot(self):
        release = threading.Event()

        def requests_then_wait():
            yield gc.slow_request(5_000_000, "long")
            release.wait(30)

        call = self.stub.ModelStreamInfer(requests_then_wait(), timeout=30)
        time.sleep(0.3)
        call.cancel()
        release.set()
        start = time.monotonic()
        self.stub.ModelInfer(gc.slow_request(1000), timeout=10)
        self.assertLess(time.monotonic() - start, 2.0)

    def test_client_gone_frees_the_slot(self):
        ch = gc.channel(self.server.grpc_target)
        gc.stub(ch).ModelInfer.future(gc.slow_request(5_000_000), timeout=30)
        time.sleep(0.3)
        ch.close()  # the connection goes away with the call in it
        start = time.monotonic()
        self.stub.ModelInfer(gc.slow_request(1000), timeout=10)
        self.assertLess(time.monotonic() - start, 2.0)


class WatchReader:
    """Reads a health Watch on a thread of its own, so that each status can be awaited with a
    bound of its own (the call's deadline is far off)."""

    def __init__(self, watch):
        self.watch = watch
        self.statuses = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for r in self.watch:
                self.statuses.put(r.status)
        except grpc.RpcError as e:
            self.statuses.put(e)

    def next(self, within):
        """The next status sent, which must come within `within` seconds."""
        try:
            got = self.statuses.get(timeout=within)
        except queue.Empty:
            raise AssertionError("the Watch sent nothing within %.1f s" % within) from None
        if isinstance(got, grpc.RpcError):
            raise AssertionError("the Watch ended: %s %s" % (got.code(), got.details()))
        return got

    def cancel(self):
        self.watch.cancel()
        self.thread.join(10)


class HealthFollowsReadiness(RpcCase):
    """grpc.health.v1.Health follows the server's readiness, and a Watch is told of each change
    as it happens: nothing looks for it on a timer, so a change that is not pushed never reaches
    the watch (its next status is awaited within 2 s, and no Check is made meanwhile: a Check
    also publishes the status it reads)."""

    def test_lost_device_turns_health_not_serving(self):
        # A model whose device is lost at run time (its first request hangs, the watchdog takes
        # the device, recycling fails) turns the server not ready.
        repo = Repository()
        repo.add("faulty", 'name: "faulty"\nbackend: "builtin"\nmax_batch_size: 8\n'
                 'parameters { key: "uri" value { string_value: '
                 '"builtin:faulty?mode=hang&first=1&instances=1&shape=16" } }\n'
                 'parameters { key: "watchdog_ms" value { string_value: "300" } }\n'
                 'parameters { key: "max_recycle_attempts" value { string_value: "2" } }\n'
                 'parameters { key: "recycle_backoff_ms" value { string_value: "100" } }\n')
        try:
            with Server(repo.path) as server:
                ch = gc.channel(server.grpc_target)
                h = gc.health_stub(ch)
                hc = gc.health_pb2.HealthCheckResponse
                self.assertEqual(h.Check(gc.health_pb2.HealthCheckRequest(service="")).status,
                                 hc.SERVING)
                watch = WatchReader(h.Watch(gc.health_pb2.HealthCheckRequest(service=""),
                                            timeout=30))
                self.assertEqual(watch.next(5), hc.SERVING)
                with self.assertRaises(grpc.RpcError):  # hangs until the watchdog ends it
                    gc.stub(ch).ModelInfer(gc.infer_request(
                        "faulty", [("input0", "FP32", [1, 16], [0] * 16)]), timeout=20)
                # The engine pushes its health change (the watchdog took its only worker out):
                # the watch is told with no question asked (EngineOptions::on_health_change).
                self.assertEqual(watch.next(2), hc.NOT_SERVING)
                self.assertFalse(gc.stub(ch).ServerReady(pb.ServerReadyRequest()).ready)
                # Check answers the readiness of the moment, for both services.
                for service in ("", gc.SERVICE):
                    self.assertEqual(
                        h.Check(gc.health_pb2.HealthCheckRequest(service=service)).status,
                        hc.NOT_SERVING)
                watch.cancel()
                ch.close()
        finally:
            repo.cleanup()


    def test_model_unload_and_load_are_pushed(self):
        # Without strict readiness the server is ready while any version serves, and `broken`
        # (which failed to load) counts: unloading `good`, the one that serves, leaves the server
        # not ready, and loading it again makes it ready.
        repo = Repository()
        tensors = ([("input0", "TYPE_FP32", [16])], [("output0", "TYPE_FP32", [16])])
        repo.add("good", builtin_config("good", "builtin:identity?shape=16&max_batch=8", *tensors))
        repo.add("broken", builtin_config("broken", "builtin:nope", *tensors))
        try:
            with Server(repo.path, "--model-control-mode", "explicit", "--load-model", "good",
                        "--load-model", "broken", "--strict-readiness", "false") as server:
                ch = gc.channel(server.grpc_target)
                hc = gc.health_pb2.HealthCheckResponse
                watch = WatchReader(gc.health_stub(ch).Watch(
                    gc.health_pb2.HealthCheckRequest(service=""), timeout=60))
                self.assertEqual(watch.next(5), hc.SERVING)
                for action, status in (("unload", hc.NOT_SERVING), ("load", hc.SERVING),
                                       ("unload", hc.NOT_SERVING), ("load", hc.SERVING)):
                    with self.subTest(action=action):
                        r = requests.post(server.url + "/v2/repository/models/good/" + action,
                                          timeout=30)
                        self.assertEqual(r.status_code, 200, r.text)
                        self.assertEqual(watch.next(2), status)
                        self.assertEqual(
                            gc.stub(ch).ServerReady(pb.ServerReadyRequest()).ready,
                            status == hc.SERVING)
                watch.cancel()
                ch.close()
        finally:
            repo.cleanup()


class Shutdown(RpcCase):
    def test_sigterm_with_a_health_watch_open(self):
        # A Watch never ends by itself: the server sends NOT_SERVING, ends it at the end of the
        # drain, and exits 0 within the drain timeout.
        with Server(EXAMPLE_REPOSITORY, "--drain-timeout", "3") as server:
            ch = gc.channel(server.grpc_target)
            hc = gc.health_pb2.HealthCheckResponse
            watch = gc.health_stub(ch).Watch(gc.health_pb2.HealthCheckRequest(service=""),
                                             timeout=30)
            self.assertEqual(next(watch).status, hc.SERVING)
            start = time.monotonic()
            server.signal(signal.SIGTERM)
            self.assertEqual(next(watch).status, hc.NOT_SERVING)
            self.assertEqual(server.wait(15), 0)
            self.assertLess(time.monotonic() - start, 3)
            with self.assertRaises(grpc.RpcError) as e:
                next(watch)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE,
                             e.exception.details())
            ch.close()

    def test_idle_channel_does_not_hold_the_exit(self):
        # A client that keeps its channel open after a call: the server does not wait for it to
        # let go (gRPC's Shutdown would, ~5 s for Python's client).
        with Server(EXAMPLE_REPOSITORY, "--drain-timeout", "1") as server:
            ch = gc.channel(server.grpc_target)
            self.assertTrue(gc.stub(ch).ServerLive(pb.ServerLiveRequest(), timeout=10).live)
            start = time.monotonic()
            server.signal(signal.SIGTERM)
            self.assertEqual(server.wait(15), 0)
            self.assertLess(time.monotonic() - start, 1.5)
            line = server.wait_line(r"stopped after \d+ ms")
            self.assertLess(int(re.search(r"stopped after (\d+) ms", line).group(1)), 1000, line)
            ch.close()

    def test_sigterm_answers_accepted_requests_and_ends_streams(self):
        with Server(EXAMPLE_REPOSITORY, "--drain-timeout", "10") as server:
            ch = gc.channel(server.grpc_target)
            stub = gc.stub(ch)
            unary = stub.ModelInfer.future(gc.slow_request(400_000, "unary"), timeout=30)
            hold = threading.Event()

            def one_then_hold():
                yield gc.slow_request(300_000, "streamed")
                hold.wait(30)

            def idle():
                hold.wait(30)
                return
                yield

            busy_stream = stub.ModelStreamInfer(one_then_hold(), timeout=30)
            idle_stream = stub.ModelStreamInfer(idle(), timeout=30)
            time.sleep(0.2)
            server.signal(signal.SIGTERM)
            start = time.monotonic()
            self.assertEqual(unary.result().id, "unary")
            r = next(busy_stream)
            self.assertEqual((r.error_message, r.infer_response.id), ("", "streamed"))
            for stream in (busy_stream, idle_stream):
                with self.assertRaises(grpc.RpcError) as e:
                    next(stream)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                self.assertIn("server is shutting down", e.exception.details())
            hold.set()
            self.assertEqual(server.wait(15), 0)
            self.assertLess(time.monotonic() - start, 10)
            # The port is closed: a new call fails.
            with self.assertRaises(grpc.RpcError) as e:
                gc.stub(gc.channel(server.grpc_target)).ServerLive(pb.ServerLiveRequest(),
                                                                   timeout=2)
            self.assertIn(e.exception.code(), (grpc.StatusCode.UNAVAILABLE,
                                               grpc.StatusCode.DEADLINE_EXCEEDED))
            ch.close()
            self.assertIn("drained", server.log())

    def test_second_signal_cancels_streams_in_flight(self):
        with Server(EXAMPLE_REPOSITORY, "--drain-timeout", "30") as server:
            ch = gc.channel(server.grpc_target)
            stub = gc.stub(ch)
            long_call = stub.ModelInfer.future(gc.slow_request(20_000_000), timeout=60)
            stream = stub.ModelStreamInfer(iter([gc.slow_request(20_000_000, "queued")]),
                                           timeout=60)
            # A health Watch open too does not hold the exit.
            watch = gc.health_stub(ch).Watch(gc.health_pb2.HealthCheckRequest(service=""),
                                             timeout=60)
            next(watch)
            time.sleep(0.3)
            start = time.monotonic()
            server.signal(signal.SIGTERM)
            time.sleep(0.2)
            server.signal(signal.SIGINT)
            self.assertEqual(server.wait(15), 0)
            self.assertLess(time.monotonic() - start, 5)
            with self.assertRaises(grpc.RpcError) as e:
                long_call.result()
            self.assertNotEqual(e.exception.code(), grpc.StatusCode.OK)
            # The stream's request was answered (shut down) or the stream ended: nothing hangs.
            try:
                for r in stream:
                    self.assertTrue(r.error_message)
            except grpc.RpcError:
                pass
            ch.close()


if __name__ == "__main__":
    harness.unittest.main(verbosity=2)
