"""BYTES tensors (Triton's TYPE_STRING) through `asyncinfer serve`, checked with Triton's own
Python client (`tritonclient[http,grpc]`, pinned in scripts/requirements-tritonclient.txt) and
its generated gRPC messages: JSON strings, the binary form (a 4-byte little-endian length before
each element), gRPC raw contents and `bytes_contents`, dynamic batching of requests whose
elements differ in length, warm-up samples, the response cache, and the 400s for bad input.
"""

import asyncio
import json
import os
import struct

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository, Server
from triton_fixture import serve

STRINGS = """name: "strings"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "output0", data_type: TYPE_STRING, dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
response_cache { enable: %s }
parameters { key: "uri" value { string_value: "builtin:identity?dtype=bytes&shape=-1&max_batch=8" } }
%s
"""

NUMBERS = """name: "numbers"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 2 ] } ]
parameters { key: "uri" value { string_value: "builtin:identity?shape=2&max_batch=8" } }
"""

WARMUP = """model_warmup [
  { name: "from_file" batch_size: 1
    inputs { key: "input0" value { data_type: TYPE_STRING dims: [ 3 ] input_data_file: "%s" } } },
  { name: "random" batch_size: 2 count: 2
    inputs { key: "input0" value { data_type: TYPE_STRING dims: [ 4 ] random_data: true } } },
  { name: "zeros" batch_size: 1
    inputs { key: "input0" value { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } }
]"""

# Text, the empty string, UTF-8 beyond ASCII, and (binary forms only) bytes that are not UTF-8.
TEXT = np.array([[b"hello", b"", "h\u00e9llo \u4e16\u754c".encode()],
                 [b"a", b"bb", b"ccc"]], dtype=np.object_)
RAW = np.array([[b"\xff\x00\xfe", b"\x00", b"x" * 1000]], dtype=np.object_)


def bytes_input(module, x, **kw):
    i = module.InferInput("input0", list(x.shape), "BYTES")
    i.set_data_from_numpy(x, **kw)
    return i


def serialized(elements):
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def post(port, path, body, headers=None):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class BytesTensors(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("strings", STRINGS % ("false", ""))
        cls.repo.add("numbers", NUMBERS)
        serve(cls, cls.repo.path, repo=cls.repo, concurrency=8)

    def assertSameBytes(self, got, want):
        # tritonclient gives BYTES read from JSON as str, from binary as bytes.
        self.assertEqual(got.dtype, np.object_)
        self.assertEqual(got.shape, want.shape)
        self.assertEqual([e.encode() if isinstance(e, str) else bytes(e) for e in got.flatten()],
                         [bytes(e) for e in want.flatten()])

    # ---- metadata and configuration --------------------------------------------------------------

    def test_metadata_and_config_name_the_type(self):
        md = self.http.get_model_metadata("strings")
        self.assertEqual(md["inputs"][0]["datatype"], "BYTES")
        self.assertEqual(md["outputs"][0]["datatype"], "BYTES")
        self.assertEqual(self.grpc.get_model_metadata("strings").inputs[0].datatype, "BYTES")
        c = self.http.get_model_config("strings")
        self.assertEqual(c["input"][0]["data_type"], "TYPE_STRING")
        self.assertEqual(c["output"][0]["data_type"], "TYPE_STRING")

    # ---- HTTP ------------------------------------------------------------------------------------

    def test_http_json_strings_round_trip(self):
        for binary_out in (False, True):
            r = self.http.infer("strings", [bytes_input(httpclient, TEXT, binary_data=False)],
                                outputs=[httpclient.InferRequestedOutput(
                                    "output0", binary_data=binary_out)])
            self.assertSameBytes(r.as_numpy("output0"), TEXT)
            self.assertEqual(r.get_output("output0")["datatype"], "BYTES")

    def test_http_binary_keeps_bytes_that_are_not_text(self):
        r = self.http.infer("strings", [bytes_input(httpclient, RAW, binary_data=True)],
                            outputs=[httpclient.InferRequestedOutput("output0", binary_data=True)])
        self.assertSameBytes(r.as_numpy("output0"), RAW)
        # The binary size counts the length prefixes.
        self.assertEqual(r.get_output("output0")["parameters"]["binary_data_size"],
                         len(serialized(RAW.flatten())))

    def test_http_json_output_is_text(self):
        body = json.dumps({"inputs": [{"name": "input0", "datatype": "BYTES", "shape": [1, 2],
                                       "data": ["caf\u00e9", "\"quoted\"\n"]}]})
        status, reply = post(self.server.http_port, "/v2/models/strings/infer", body)
        self.assertEqual(status, 200, reply)
        out = json.loads(reply)["outputs"][0]
        self.assertEqual(out["data"], ["caf\u00e9", "\"quoted\"\n"])
        self.assertEqual(out["shape"], [1, 2])

    def test_http_aio(self):
        async def run():
            c = httpaio.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            try:
                return await c.infer("strings", [bytes_input(httpaio, RAW, binary_data=True)])
            finally:
                await c.close()
        self.assertSameBytes(asyncio.run(run()).as_numpy("output0"), RAW)

    def test_requests_batched_together_each_get_their_own_strings(self):
        # 20 ms of queue delay: requests sent at once form batches, whose rows differ in length.
        rows = [np.array([[("r%d-" % k).encode() * (k % 5), b"#" * k]], dtype=np.object_)
                for k in range(24)]
        pending = [self.http.async_infer("strings", [bytes_input(httpclient, x,
                                                                 binary_data=k % 2 == 0)])
                   for k, x in enumerate(rows)]
        for x, p in zip(rows, pending):
            self.assertSameBytes(p.get_result(timeout=30).as_numpy("output0"), x)
        st = self.http.get_inference_statistics("strings")["model_stats"][0]
        self.assertLess(st["execution_count"], st["inference_count"])  # some ran batched

    # ---- gRPC ------------------------------------------------------------------------------------

    def test_grpc_raw_contents_round_trip(self):
        for x in (TEXT, RAW):
            r = self.grpc.infer("strings", [bytes_input(grpcclient, x)])
            self.assertSameBytes(r.as_numpy("output0"), x)

    def test_grpc_aio(self):
        async def run():
            c = grpcaio.InferenceServerClient(self.server.grpc_target)
            try:
                return await c.infer("strings", [bytes_input(grpcaio, TEXT)])
            finally:
                await c.close()
        self.assertSameBytes(asyncio.run(run()).as_numpy("output0"), TEXT)

    def grpc_stub(self):
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        return pb_grpc.GRPCInferenceServiceStub(channel)

    def test_grpc_bytes_contents(self):
        # Typed contents: one bytes_contents entry per element, no prefixes (Triton's message).
        req = pb.ModelInferRequest(model_name="strings")
        t = req.inputs.add(name="input0", datatype="BYTES", shape=[1, 3])
        t.contents.bytes_contents.extend([b"one", b"", b"\xff"])
        reply = self.grpc_stub().ModelInfer(req, timeout=10)
        self.assertEqual(reply.outputs[0].datatype, "BYTES")
        self.assertEqual(list(reply.outputs[0].shape), [1, 3])
        self.assertEqual(reply.raw_output_contents[0], serialized([b"one", b"", b"\xff"]))

    # ---- bad input -------------------------------------------------------------------------------

    def binary_body(self, data, size=None, shape=(1, 2)):
        header = json.dumps({"inputs": [{"name": "input0", "datatype": "BYTES",
                                         "shape": list(shape),
                                         "parameters": {"binary_data_size":
                                                        len(data) if size is None else size}}]})
        return header.encode() + data, {"Inference-Header-Content-Length": str(len(header))}

    def assertRefused(self, body, headers, *fragments, model="strings"):
        status, reply = post(self.server.http_port, "/v2/models/%s/infer" % model, body, headers)
        self.assertEqual(status, 400, reply)
        message = json.loads(reply)["error"]
        for f in fragments:
            self.assertIn(f, message)

    def test_a_length_prefix_beyond_the_data_is_a_400(self):
        data = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 100) + b"short"
        self.assertRefused(*self.binary_body(data), "input 'input0'", "element 1",
                           "length 100")

    def test_a_truncated_prefix_and_trailing_bytes_are_400s(self):
        self.assertRefused(*self.binary_body(struct.pack("<I", 1) + b"a" + b"\x01\x00\x00"),
                           "element 1", "length prefix runs past")
        self.assertRefused(*self.binary_body(serialized([b"a", b"b"]) + b"extra"),
                           "5 bytes follow")
        self.assertRefused(*self.binary_body(b"\x00\x00\x00"), "too small", "length prefix")

    def test_a_non_string_element_in_json_is_a_400(self):
        for element, what in ((3, "the integer 3"), (None, "null"), (True, "a boolean"),
                              ({"a": 1}, "an object")):
            body = json.dumps({"inputs": [{"name": "input0", "datatype": "BYTES", "shape": [1, 2],
                                           "data": ["ok", element]}]})
            self.assertRefused(body, {}, "data element 1", what, "BYTES needs a string")

    def test_bytes_sent_to_an_fp32_input_is_a_400(self):
        body = json.dumps({"inputs": [{"name": "input0", "datatype": "BYTES", "shape": [1, 2],
                                       "data": ["a", "b"]}]})
        self.assertRefused(body, {}, "datatype BYTES does not match the model's FP32",
                           model="numbers")
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("numbers", [grpcclient.InferInput("input0", [1, 2], "BYTES")
                                        .set_data_from_numpy(np.array([[b"a", b"b"]],
                                                                      dtype=np.object_))])
        self.assertIn("StatusCode.INVALID_ARGUMENT", e.exception.status())

    def test_grpc_malformed_raw_contents_is_invalid_argument(self):
        req = pb.ModelInferRequest(model_name="strings")
        req.inputs.add(name="input0", datatype="BYTES", shape=[1, 2])
        req.raw_input_contents.append(struct.pack("<I", 9) + b"abc")
        with self.assertRaises(grpc.RpcError) as e:
            self.grpc_stub().ModelInfer(req, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("for inference input 'input0' for model 'strings'", e.exception.details())
        self.assertIn("length 9", e.exception.details())
        # Count mismatch in bytes_contents.
        req = pb.ModelInferRequest(model_name="strings")
        t = req.inputs.add(name="input0", datatype="BYTES", shape=[1, 2])
        t.contents.bytes_contents.extend([b"only one"])
        with self.assertRaises(grpc.RpcError) as e:
            self.grpc_stub().ModelInfer(req, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("bytes_contents has 1 values", e.exception.details())

    def test_the_server_goes_on_after_bad_input(self):
        self.test_a_length_prefix_beyond_the_data_is_a_400()
        self.test_a_non_string_element_in_json_is_a_400()
        r = self.http.infer("strings", [bytes_input(httpclient, TEXT, binary_data=True)])
        self.assertSameBytes(r.as_numpy("output0"), TEXT)


class BytesWarmupAndCache(harness.unittest.TestCase):
    """model_warmup samples of TYPE_STRING, and the response cache over BYTES inputs."""

    def test_warmup_from_a_file_random_and_zero_data_then_cached_answers(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        repo.add("strings", STRINGS % ("true", WARMUP % "three.bin"))
        os.makedirs(os.path.join(repo.path, "strings", "warmup"))
        with open(os.path.join(repo.path, "strings", "warmup", "three.bin"), "wb") as f:
            f.write(serialized([b"x", b"yy", b""]))
        with Server(repo.path, "--cache-config", "local,size=65536") as server:
            c = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
            try:
                self.assertTrue(c.is_model_ready("strings"))
                x = np.array([[b"same", b"\x00\x01"]], dtype=np.object_)
                answers = [c.infer("strings", [bytes_input(httpclient, x, binary_data=True)])
                           .as_numpy("output0") for _ in range(3)]
                for a in answers:
                    self.assertEqual([bytes(e) for e in a.flatten()], [b"same", b"\x00\x01"])
                st = c.get_inference_statistics("strings")["model_stats"][0]["inference_stats"]
                self.assertEqual(st["cache_miss"]["count"], 1)
                self.assertEqual(st["cache_hit"]["count"], 2)
            finally:
                c.close()

    def test_a_malformed_warmup_file_makes_the_model_unavailable_with_the_reason(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        repo.add("strings", STRINGS % ("false", WARMUP % "bad.bin"))
        os.makedirs(os.path.join(repo.path, "strings", "warmup"))
        with open(os.path.join(repo.path, "strings", "warmup", "bad.bin"), "wb") as f:
            f.write(struct.pack("<I", 50) + b"not fifty")
        with Server(repo.path) as server:  # started: every model at start has been tried
            c = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
            try:
                index = [m for m in c.get_model_repository_index() if m["name"] == "strings"]
                self.assertEqual(index[0]["state"], "UNAVAILABLE")
                self.assertIn("bad.bin", index[0]["reason"])
                self.assertIn("length 50", index[0]["reason"])
                self.assertFalse(c.is_model_ready("strings"))
            finally:
                c.close()


if __name__ == "__main__":
    harness.parse_args()
    harness.unittest.main(verbosity=2)
