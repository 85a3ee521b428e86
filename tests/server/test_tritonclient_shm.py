"""Triton's system shared memory extension through `asyncinfer serve`, checked with Triton's own
Python client: regions made by `tritonclient.utils.shared_memory`, registered, listed and
unregistered over HTTP and gRPC (sync and aio), inputs read from and outputs written into them,
a region unregistered while a request uses it, and Triton's error codes for bad input.
"""

import asyncio
import json
import urllib.request
import uuid

import gevent
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

import harness
from harness import metric, wait_for
from harness import Repository
from triton_fixture import serve

IDENTITY = """name: "identity"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]
parameters { key: "uri" value { string_value: "builtin:identity?shape=16&max_batch=8" } }
"""
# Occupies the device 1 s a call: a request stays in flight long enough to unregister under it.
SLOW = """name: "slow"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]
parameters { key: "uri" value { string_value: "builtin:fixed_cost?base_us=1000000&shape=16&max_batch=8" } }
"""
STRINGS = """name: "strings"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "output0", data_type: TYPE_STRING, dims: [ -1 ] } ]
parameters { key: "uri" value { string_value: "builtin:identity?dtype=bytes&shape=-1&max_batch=8" } }
"""

X = np.arange(32, dtype=np.float32).reshape(2, 16) / 4
NBYTES = X.nbytes


class Regions:
    """Client-side regions, destroyed at the end of a test."""

    def __init__(self, test):
        self.handles = []
        test.addCleanup(self.destroy)

    def make(self, name, size):
        key = "/asyncinfer-test-%s-%s" % (name, uuid.uuid4().hex[:8])
        h = shm.create_shared_memory_region(name, key, size)
        self.handles.append(h)
        return h, key

    def destroy(self):
        for h in self.handles:
            try:
                shm.destroy_shared_memory_region(h)
            except Exception:
                pass


class SystemSharedMemory(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("identity", IDENTITY)
        cls.repo.add("slow", SLOW)
        cls.repo.add("strings", STRINGS)
        serve(cls, cls.repo.path, repo=cls.repo)

    def setUp(self):
        self.http.unregister_system_shared_memory()
        self.regions = Regions(self)

    def in_and_out(self, tag):
        hin, kin = self.regions.make(tag + "_in", NBYTES)
        hout, kout = self.regions.make(tag + "_out", NBYTES)
        shm.set_shared_memory_region(hin, [X])
        return hin, kin, hout, kout

    def test_extension_is_listed(self):
        self.assertIn("system_shared_memory", self.http.get_server_metadata()["extensions"])
        self.assertIn("system_shared_memory", self.grpc.get_server_metadata().extensions)
        self.assertNotIn("cuda_shared_memory", self.http.get_server_metadata()["extensions"])

    def test_http_register_status_unregister(self):
        h, key = self.regions.make("a", 256)
        self.http.register_system_shared_memory("a", key, 128, offset=64)
        st = self.http.get_system_shared_memory_status()
        self.assertEqual(st, [{"name": "a", "key": key, "offset": 64, "byte_size": 128}])
        self.assertEqual(self.http.get_system_shared_memory_status("a")[0]["byte_size"], 128)
        g = self.grpc.get_system_shared_memory_status()
        self.assertEqual(g.regions["a"].key, key)
        self.assertEqual(g.regions["a"].offset, 64)
        self.http.unregister_system_shared_memory("a")
        self.assertEqual(self.http.get_system_shared_memory_status(), [])
        self.http.unregister_system_shared_memory("never-registered")  # not an error

    def test_http_infer_reads_and_writes_shared_memory(self):
        hin, kin, hout, kout = self.in_and_out("h")
        self.http.register_system_shared_memory("h_in", kin, NBYTES)
        self.http.register_system_shared_memory("h_out", kout, NBYTES)
        i = httpclient.InferInput("input0", [2, 16], "FP32")
        i.set_shared_memory("h_in", NBYTES)
        o = httpclient.InferRequestedOutput("output0", binary_data=False)
        o.set_shared_memory("h_out", NBYTES)
        r = self.http.infer("identity", [i], outputs=[o])
        out = r.get_output("output0")
        # Neither data nor parameters, as Triton's: perf_analyzer's HTTP client reads a
        # "parameters" object on an output as binary data ("binary_data_size") and fails.
        self.assertEqual(out, {"name": "output0", "datatype": "FP32", "shape": [2, 16]})
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [2, 16]), X)

    def test_grpc_infer_reads_and_writes_shared_memory(self):
        hin, kin, hout, kout = self.in_and_out("g")
        self.grpc.register_system_shared_memory("g_in", kin, NBYTES)
        self.grpc.register_system_shared_memory("g_out", kout, NBYTES)
        i = grpcclient.InferInput("input0", [2, 16], "FP32")
        i.set_shared_memory("g_in", NBYTES)
        o = grpcclient.InferRequestedOutput("output0")
        o.set_shared_memory("g_out", NBYTES)
        r = self.grpc.infer("identity", [i], outputs=[o])
        out = r.get_output("output0")
        self.assertEqual(out.parameters["shared_memory_region"].string_param, "g_out")
        self.assertEqual(out.parameters["shared_memory_byte_size"].int64_param, NBYTES)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [2, 16]), X)
        self.grpc.unregister_system_shared_memory()
        self.assertEqual(len(self.grpc.get_system_shared_memory_status().regions), 0)

    def test_offsets_and_mixed_inputs_outputs(self):
        # One region holds the input at 64 and the output at 256 (offsets within the window);
        # a second output is asked for in binary beside it (none here: one output), so the
        # request mixes a JSON-described region input with a binary response.
        h, key = self.regions.make("m", 512)
        shm.set_shared_memory_region(h, [X], offset=64)
        self.http.register_system_shared_memory("m", key, 512)
        i = httpclient.InferInput("input0", [2, 16], "FP32")
        i.set_shared_memory("m", NBYTES, offset=64)
        o = httpclient.InferRequestedOutput("output0")
        o.set_shared_memory("m", NBYTES, offset=256)
        self.http.infer("identity", [i], outputs=[o])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.float32, [2, 16],
                                                                offset=256), X)
        # Input from shared memory, output in the response.
        r = self.http.infer("identity", [i])
        np.testing.assert_array_equal(r.as_numpy("output0"), X)

    def test_aio_clients(self):
        hin, kin, hout, kout = self.in_and_out("aio")

        async def run():
            hc = httpaio.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            gc = grpcaio.InferenceServerClient(self.server.grpc_target)
            try:
                await hc.register_system_shared_memory("aio_in", kin, NBYTES)
                await gc.register_system_shared_memory("aio_out", kout, NBYTES)
                st = await hc.get_system_shared_memory_status()
                i = grpcaio.InferInput("input0", [2, 16], "FP32")
                i.set_shared_memory("aio_in", NBYTES)
                o = grpcaio.InferRequestedOutput("output0")
                o.set_shared_memory("aio_out", NBYTES)
                await gc.infer("identity", [i], outputs=[o])
                await hc.unregister_system_shared_memory("aio_in")
                await gc.unregister_system_shared_memory("aio_out")
                return st
            finally:
                await hc.close()
                await gc.close()
        st = asyncio.run(run())
        self.assertEqual(sorted(r["name"] for r in st), ["aio_in", "aio_out"])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [2, 16]), X)
        self.assertEqual(self.http.get_system_shared_memory_status(), [])

    def test_bytes_tensors_in_shared_memory(self):
        x = np.array([[b"one", b"", b"\xff\x00"]], dtype=np.object_)
        size = sum(4 + len(e) for e in x.flatten())
        hin, kin = self.regions.make("s_in", size)
        hout, kout = self.regions.make("s_out", size)
        shm.set_shared_memory_region(hin, [serialize_byte_tensor(x)])  # tritonclient's recipe
        self.grpc.register_system_shared_memory("s_in", kin, size)
        self.grpc.register_system_shared_memory("s_out", kout, size)
        i = grpcclient.InferInput("input0", [1, 3], "BYTES")
        i.set_shared_memory("s_in", size)
        o = grpcclient.InferRequestedOutput("output0")
        o.set_shared_memory("s_out", size)
        self.grpc.infer("strings", [i], outputs=[o])
        got = shm.get_contents_as_numpy(hout, np.object_, [1, 3])
        self.assertEqual([bytes(e) for e in got.flatten()], [b"one", b"", b"\xff\x00"])

    def pending_requests(self, model):
        page = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        return metric(page, "asyncinfer_inference_pending_request_count", model=model)

    def test_a_region_unregistered_while_in_use_stays_mapped_until_the_request_ends(self):
        hin, kin, hout, kout = self.in_and_out("u")
        self.http.register_system_shared_memory("u_in", kin, NBYTES)
        self.http.register_system_shared_memory("u_out", kout, NBYTES)
        i = httpclient.InferInput("input0", [2, 16], "FP32")
        i.set_shared_memory("u_in", NBYTES)
        o = httpclient.InferRequestedOutput("output0")
        o.set_shared_memory("u_out", NBYTES)
        c = httpclient.InferenceServerClient("127.0.0.1:%d" % self.server.http_port,
                                             concurrency=2)
        try:
            pending = c.async_infer("slow", [i], outputs=[o])
            # Unregister once the engine holds the request (it mapped its regions before), not
            # after a fixed sleep: on a loaded machine the request may not have been read yet.
            # gevent.sleep lets the client's greenlet send it.
            wait_for(lambda: self.pending_requests("slow") == 1,
                     what="the request to reach the engine", sleep=gevent.sleep)
            self.http.unregister_system_shared_memory()
            self.assertEqual(self.http.get_system_shared_memory_status(), [])
            # The name is free again at once; the request in flight keeps its mapping.
            self.http.register_system_shared_memory("u_in", kin, NBYTES)
            pending.get_result(timeout=30)
        finally:
            c.close()
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [2, 16]), X)
        # The unregistered name fails new requests.
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("identity", [i], outputs=[o])
        self.assertIn("no shared memory region 'u_out'", e.exception.message())

    # ---- bad input: Triton's codes -----------------------------------------------------------------

    def status_of(self, path, body=b""):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=10)
        try:
            conn.request("POST", path, body=body)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def test_bad_registrations(self):
        h, key = self.regions.make("dup", 64)
        self.http.register_system_shared_memory("dup", key, 64)
        # Registering a name twice: 400 / ALREADY_EXISTS.
        with self.assertRaises(InferenceServerException) as e:
            self.http.register_system_shared_memory("dup", key, 64)
        self.assertEqual(e.exception.status(), "400")
        self.assertIn("already registered", e.exception.message())
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.register_system_shared_memory("dup", key, 64)
        self.assertIn("ALREADY_EXISTS", e.exception.status())
        # A key that does not exist in /dev/shm: 500 / INTERNAL.
        with self.assertRaises(InferenceServerException) as e:
            self.http.register_system_shared_memory("nokey", "/asyncinfer-no-such-key", 64)
        self.assertEqual(e.exception.status(), "500")
        self.assertIn("/asyncinfer-no-such-key", e.exception.message())
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.register_system_shared_memory("nokey", "/asyncinfer-no-such-key", 64)
        self.assertIn("INTERNAL", e.exception.status())
        # A window beyond the object: 400 / INVALID_ARGUMENT.
        with self.assertRaises(InferenceServerException) as e:
            self.http.register_system_shared_memory("big", key, 64, offset=8)
        self.assertEqual(e.exception.status(), "400")
        self.assertIn("beyond the 64 bytes", e.exception.message())
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.register_system_shared_memory("big", key, 65)
        self.assertIn("INVALID_ARGUMENT", e.exception.status())
        # Malformed bodies.
        for body, fragment in ((b"", "key"), (b"[]", "object"), (b'{"key": 3}', "key"),
                               (b'{"key": "/k"}', "byte_size"),
                               (b'{"key": "/k", "byte_size": -1}', "byte_size")):
            status, reply = self.status_of("/v2/systemsharedmemory/region/x/register", body)
            self.assertEqual(status, 400, reply)
            self.assertIn(fragment, json.loads(reply)["error"])
        # Status of an unknown region.
        with self.assertRaises(InferenceServerException) as e:
            self.http.get_system_shared_memory_status("unknown")
        self.assertEqual(e.exception.status(), "400")
        # CUDA shared memory is not served: nothing to list, registering is 501.
        self.assertEqual(self.http.get_cuda_shared_memory_status(), [])
        self.http.unregister_cuda_shared_memory()
        status, _ = self.status_of("/v2/cudasharedmemory/region/c/register",
                                   b'{"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 4}')
        self.assertEqual(status, 501)
        # The same over gRPC (Triton's simple_grpc_shm_client.py unregisters every CUDA region
        # first, and once failed on UNIMPLEMENTED).
        self.assertEqual(len(self.grpc.get_cuda_shared_memory_status().regions), 0)
        self.grpc.unregister_cuda_shared_memory()
        self.grpc.unregister_cuda_shared_memory("c")
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.get_cuda_shared_memory_status("c")
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.register_cuda_shared_memory("c", b"\0" * 64, 0, 4)
        self.assertEqual(e.exception.status(), "StatusCode.UNIMPLEMENTED")
        self.assertIn("system shared memory", e.exception.message())

    def test_bad_tensors_in_requests_and_the_server_goes_on(self):
        hin, kin, hout, kout = self.in_and_out("b")
        self.http.register_system_shared_memory("b_in", kin, NBYTES)
        self.http.register_system_shared_memory("b_out", kout, NBYTES)

        def infer_http(region, size, offset=0, out=None):
            i = httpclient.InferInput("input0", [2, 16], "FP32")
            i.set_shared_memory(region, size, offset=offset)
            outs = None
            if out:
                o = httpclient.InferRequestedOutput("output0")
                o.set_shared_memory(*out)
                outs = [o]
            return self.http.infer("identity", [i], outputs=outs)

        cases = [
            (("unknown", NBYTES), "no shared memory region 'unknown'"),
            (("b_in", NBYTES, 8), "beyond the %d bytes" % NBYTES),     # offset + size too far
            (("b_in", NBYTES - 4), "does not match shape [2,16]"),     # size disagrees with shape
            (("b_in", NBYTES, 0, ("b_out", NBYTES - 4)), "more than its shared_memory_byte_size"),
            (("b_in", NBYTES, 0, ("b_out", NBYTES, 4)), "beyond the %d bytes" % NBYTES),
        ]
        for args, fragment in cases:
            with self.assertRaises(InferenceServerException) as e:
                infer_http(*args)
            self.assertEqual(e.exception.status(), "400", args)
            self.assertIn(fragment, e.exception.message(), args)
        # gRPC: the same checks give INVALID_ARGUMENT.
        i = grpcclient.InferInput("input0", [2, 16], "FP32")
        i.set_shared_memory("b_in", NBYTES - 4)
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("identity", [i])
        self.assertIn("INVALID_ARGUMENT", e.exception.status())
        # data and shared memory at once.
        body = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [2, 16],
                                       "data": X.flatten().tolist(),
                                       "parameters": {"shared_memory_region": "b_in",
                                                      "shared_memory_byte_size": NBYTES}}]})
        status, reply = self.status_of("/v2/models/identity/infer", body.encode())
        self.assertEqual(status, 400)
        self.assertIn("shared_memory_region", json.loads(reply)["error"])
        # A shared memory output that also asks for binary_data.
        body = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [2, 16],
                                       "data": X.flatten().tolist()}],
                           "outputs": [{"name": "output0",
                                        "parameters": {"binary_data": True,
                                                       "shared_memory_region": "b_out",
                                                       "shared_memory_byte_size": NBYTES}}]})
        status, reply = self.status_of("/v2/models/identity/infer", body.encode())
        self.assertEqual(status, 400)
        self.assertIn("one way only", json.loads(reply)["error"])
        # Still serving.
        r = infer_http("b_in", NBYTES, 0, ("b_out", NBYTES))
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [2, 16]), X)


if __name__ == "__main__":
    harness.parse_args()
    harness.unittest.main(verbosity=2)
