"""`asyncinfer serve` through Triton's own Python client (`tritonclient[http,grpc]` from PyPI,
pinned in scripts/requirements-tritonclient.txt, run from .venv/tritonclient): no client code of
ours. Covers the extensions the server lists (issue 24): model configuration and statistics (HTTP
and gRPC; sync and aio; the statistics against /metrics) and HTTP compression (request and response, gzip and deflate; sync, gevent async
and aio), gRPC transport compression, what bad compressed bodies get, and the response cache
(hits byte-identical to computed answers, LRU eviction by bytes, identical requests in flight
computed once, the statistics and /metrics), and model repository control (load, reload with a
config override, unload, the index's states, poll mode, and a reload under load that no request
notices).
"""

import asyncio
import gzip
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import zlib

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

import harness
from harness import metric, wait_for
from harness import ARGS, EXAMPLE_REPOSITORY, Repository, Server
from triton_fixture import Collector, serve

X = np.arange(32, dtype=np.float32).reshape(2, 16)


def http_input(x, binary):
    i = httpclient.InferInput("input0", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    return i


def grpc_input(x):
    i = grpcclient.InferInput("input0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def raw_post(port, path, body, headers):
    """(status, headers dict with lower-case names, body) of one POST."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def infer_body():
    return json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [2, 16],
                                   "data": X.flatten().tolist()}]}).encode()


class TritonClient(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        serve(cls, EXAMPLE_REPOSITORY)

    # ---- extensions ------------------------------------------------------------------------------

    def test_extensions_list_what_is_served(self):
        expected = ["classification", "sequence", "sequence(string_id)", "model_repository",
                    "model_configuration",
                    "system_shared_memory", "binary_tensor_data", "statistics", "trace",
                    "logging"]
        self.assertEqual(self.http.get_server_metadata()["extensions"], expected)
        self.assertEqual(list(self.grpc.get_server_metadata().extensions), expected)

    # ---- model configuration ---------------------------------------------------------------------

    def check_identity_config(self, c):
        self.assertEqual(c["name"], "identity")
        self.assertEqual(c["platform"], "asyncinfer_builtin")
        self.assertEqual(c["backend"], "builtin")
        self.assertEqual(c["max_batch_size"], 8)
        self.assertEqual(c["input"][0]["name"], "input0")
        self.assertEqual(c["input"][0]["data_type"], "TYPE_FP32")
        self.assertEqual(c["output"][0]["name"], "output0")
        self.assertEqual(c["instance_group"][0]["kind"], "KIND_CPU")
        self.assertEqual(c["instance_group"][0]["count"], 1)
        self.assertEqual(c["instance_group"][0]["name"], "identity_0")
        # (The gRPC client's own JSON printer leaves defaults out: .get.)
        self.assertFalse(c["model_transaction_policy"].get("decoupled", False))
        self.assertFalse(c["response_cache"].get("enable", False))
        self.assertIn("all", c["version_policy"])
        self.assertIn("dynamic_batching", c)

    def test_http_model_config(self):
        c = self.http.get_model_config("identity")
        self.check_identity_config(c)
        # Triton prints the 64-bit fields as JSON numbers, not as proto3's strings.
        self.assertEqual(c["input"][0]["dims"], [16])
        # Every scalar is printed: perf_analyzer reads response_cache.enable unguarded.
        self.assertIs(c["response_cache"]["enable"], False)
        self.assertIs(c["model_transaction_policy"]["decoupled"], False)
        self.assertEqual(c["dynamic_batching"]["max_queue_delay_microseconds"], 0)
        self.check_identity_config(self.http.get_model_config("identity", "1"))
        slow = self.http.get_model_config("slow", "1")
        self.assertEqual(slow["instance_group"][0]["kind"], "KIND_MODEL")  # the sim device
        self.assertEqual(slow["parameters"]["device"]["string_value"], "sim")
        self.assertEqual(slow["version_policy"], {"latest": {"num_versions": 1}})

    def test_grpc_model_config(self):
        r = self.grpc.get_model_config("identity")
        self.assertEqual(r.config.name, "identity")
        self.assertEqual(list(r.config.input[0].dims), [16])
        self.assertEqual(r.config.max_batch_size, 8)
        c = self.grpc.get_model_config("identity", "2", as_json=True)["config"]
        self.check_identity_config(c)

    def test_model_config_errors(self):
        with self.assertRaises(InferenceServerException) as e:
            self.http.get_model_config("nope")
        self.assertEqual(e.exception.status(), "404")
        self.assertIn("Request for unknown model: 'nope' is not found", e.exception.message())
        with self.assertRaises(InferenceServerException) as e:
            self.http.get_model_config("identity", "7")
        self.assertEqual(e.exception.status(), "404")
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.get_model_config("nope")
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.get_model_config("identity", "x")
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")

    def test_aio_model_config(self):
        async def run():
            h = httpaio.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            g = grpcaio.InferenceServerClient(self.server.grpc_target)
            try:
                self.check_identity_config(await h.get_model_config("identity"))
                r = await g.get_model_config("identity", as_json=True)
                self.check_identity_config(r["config"])
            finally:
                await h.close()
                await g.close()
        asyncio.run(asyncio.wait_for(run(), 30))

    # ---- statistics ------------------------------------------------------------------------------

    def test_statistics(self):
        # A server of its own: its counters start at zero.
        with Server(EXAMPLE_REPOSITORY) as server:
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
            g = grpcclient.InferenceServerClient(server.grpc_target)
            start_ms = time.time() * 1000
            for k in range(10):
                h.infer("identity", [http_input(X + k, True)])  # version 2, 2 rows each
            for k in range(3):
                h.infer("identity", [http_input(X, True)], model_version="1")
            # The slow model: each row's value is its time on the device (µs). Three of 20 ms,
            # then one that times out (10 ms deadline, 200 ms of work).
            def slow(cost):
                i = httpclient.InferInput("input0", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[cost]], dtype=np.float32))
                return i
            for _ in range(3):
                h.infer("slow", [slow(20000)])
            with self.assertRaises(InferenceServerException):
                h.infer("slow", [slow(200000)], timeout=10000)
            time.sleep(0.4)  # its batch runs to its end (a late completion)

            s = h.get_inference_statistics("identity", "2")["model_stats"]
            self.assertEqual(len(s), 1)
            s = s[0]
            self.assertEqual((s["name"], s["version"]), ("identity", "2"))
            self.assertEqual(s["inference_count"], 20)  # rows, not requests
            self.assertEqual(s["execution_count"], 10)
            self.assertGreaterEqual(s["last_inference"], start_ms - 1000)
            self.assertLessEqual(s["last_inference"], time.time() * 1000 + 1000)
            st = s["inference_stats"]
            for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
                self.assertEqual(st[key]["count"], 10, key)
                self.assertGreater(st[key]["ns"], 0, key)
            self.assertEqual(st["fail"], {"count": 0, "ns": 0})
            self.assertEqual(st["cache_hit"], {"count": 0, "ns": 0})
            self.assertEqual(st["cache_miss"], {"count": 0, "ns": 0})
            # The parts of a request are within its time in the server.
            parts = sum(st[k]["ns"] for k in ("queue", "compute_input", "compute_infer",
                                              "compute_output"))
            self.assertLessEqual(parts, st["success"]["ns"])
            self.assertEqual(s["batch_stats"][0]["batch_size"], 2)
            self.assertEqual(sum(b["compute_infer"]["count"] for b in s["batch_stats"]), 10)

            slow_stats = h.get_inference_statistics("slow")["model_stats"][0]["inference_stats"]
            self.assertEqual(slow_stats["success"]["count"], 3)
            self.assertEqual(slow_stats["fail"]["count"], 1)
            # compute_infer is the model's time: at least the 20 ms each of the three asked for.
            self.assertGreaterEqual(slow_stats["compute_infer"]["ns"], 3 * 20_000_000)
            self.assertLess(slow_stats["compute_input"]["ns"], 3 * 5_000_000)

            everything = h.get_inference_statistics()["model_stats"]
            self.assertEqual(sorted((m["name"], m["version"]) for m in everything),
                             [("identity", "1"), ("identity", "2"), ("slow", "1")])
            both = h.get_inference_statistics("identity")["model_stats"]
            self.assertEqual({m["version"]: m["inference_count"] for m in both},
                             {"1": 6, "2": 20})

            # gRPC: the same numbers, as Triton's messages.
            r = g.get_inference_statistics("identity", "2")
            m = r.model_stats[0]
            self.assertEqual((m.name, m.version, m.inference_count, m.execution_count),
                             ("identity", "2", 20, 10))
            self.assertEqual(m.inference_stats.success.count, 10)
            self.assertEqual(m.inference_stats.success.ns, st["success"]["ns"])
            self.assertEqual(len(g.get_inference_statistics().model_stats), 3)
            j = g.get_inference_statistics("slow", as_json=True)
            self.assertEqual(j["model_stats"][0]["inference_stats"]["fail"]["count"], "1")

            # /metrics agrees (the server is idle: nothing changes between the two reads).
            text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
            for statistic in ("success", "queue", "compute_input", "compute_infer",
                              "compute_output", "fail"):
                for family, what in (("requests", "count"), ("duration_ns", "ns")):
                    pattern = (r'asyncinfer_inference_statistics_%s\{model="identity",'
                               r'version="2",statistic="%s"\} (\S+)' % (family, statistic))
                    found = re.search(pattern, text)
                    self.assertIsNotNone(found, pattern)
                    self.assertEqual(int(float(found.group(1))), st[statistic][what], pattern)
            found = re.search(r'asyncinfer_inference_statistics_inferences\{model="identity",'
                              r'version="2"\} (\S+)', text)
            self.assertEqual(int(float(found.group(1))), 20)
            found = re.search(r'asyncinfer_inference_statistics_executions\{model="identity",'
                              r'version="2"\} (\S+)', text)
            self.assertEqual(int(float(found.group(1))), 10)
            # Triton's families, labelled as Triton's (its dashboards and qa tests read them).
            v2 = {"model": "identity", "version": "2"}
            self.assertEqual(metric(text, "nv_inference_request_success", **v2), 10)
            self.assertEqual(metric(text, "nv_inference_count", **v2), 20)
            self.assertEqual(metric(text, "nv_inference_exec_count", **v2), 10)
            for family, statistic in (("request", "success"), ("queue", "queue"),
                                      ("compute_input", "compute_input"),
                                      ("compute_infer", "compute_infer"),
                                      ("compute_output", "compute_output")):
                self.assertEqual(metric(text, "nv_inference_%s_duration_us" % family, **v2),
                                 st[statistic]["ns"] // 1000, family)
            self.assertEqual(metric(text, "nv_inference_pending_request_count", **v2), 0)
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                self.assertEqual(metric(text, "nv_inference_request_failure", reason=reason,
                                        **v2), 0, reason)
            # The slow model's request that timed out.
            self.assertEqual(metric(text, "nv_inference_request_failure", model="slow",
                                    version="1", reason="OTHER"), 1)
            self.assertIn("# TYPE nv_inference_request_success counter", text)

            # Errors: Triton's 400 / INVALID_ARGUMENT.
            with self.assertRaises(InferenceServerException) as e:
                h.get_inference_statistics("nope")
            self.assertEqual(e.exception.status(), "400")
            self.assertIn("Request for unknown model: 'nope' is not found", e.exception.message())
            with self.assertRaises(InferenceServerException) as e:
                h.get_inference_statistics("identity", "9")
            self.assertEqual(e.exception.status(), "400")
            with self.assertRaises(InferenceServerException) as e:
                g.get_inference_statistics("nope")
            self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")

            async def aio():
                ha = httpaio.InferenceServerClient("127.0.0.1:%d" % server.http_port)
                ga = grpcaio.InferenceServerClient(server.grpc_target)
                try:
                    a = await ha.get_inference_statistics("identity", "1")
                    b = await ga.get_inference_statistics("identity", "1", as_json=True)
                    return a["model_stats"][0], b["model_stats"][0]
                finally:
                    await ha.close()
                    await ga.close()
            a, b = asyncio.run(asyncio.wait_for(aio(), 30))
            self.assertEqual(a["inference_count"], 6)
            self.assertEqual(b["inference_count"], "6")  # the gRPC client prints uint64 as text
            h.close()
            g.close()

    # ---- compression -----------------------------------------------------------------------------

    def test_http_compression_every_combination(self):
        for request in (None, "gzip", "deflate"):
            for response in (None, "gzip", "deflate"):
                for binary in (True, False):
                    r = self.http.infer(
                        "identity", [http_input(X, binary)],
                        outputs=[httpclient.InferRequestedOutput("output0", binary_data=binary)],
                        request_compression_algorithm=request,
                        response_compression_algorithm=response)
                    np.testing.assert_array_equal(r.as_numpy("output0"), X)

    def test_http_async_infer_compressed(self):
        futures = [self.http.async_infer("identity", [http_input(X + k, True)],
                                         request_compression_algorithm="gzip",
                                         response_compression_algorithm="deflate")
                   for k in range(8)]
        for k, f in enumerate(futures):
            np.testing.assert_array_equal(f.get_result(timeout=30).as_numpy("output0"), X + k)

    def test_aio_infer_compressed(self):
        async def run():
            h = httpaio.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            try:
                rs = await asyncio.gather(*[
                    h.infer("identity", [http_input(X * k, True)],
                            request_compression_algorithm="deflate",
                            response_compression_algorithm="gzip") for k in range(8)])
                for k, r in enumerate(rs):
                    np.testing.assert_array_equal(r.as_numpy("output0"), X * k)
            finally:
                await h.close()
        asyncio.run(asyncio.wait_for(run(), 30))

    def test_response_coding_follows_accept_encoding(self):
        port = self.server.http_port
        path = "/v2/models/identity/infer"
        for accept, coding in (("gzip", "gzip"), ("deflate", "deflate"),
                               ("gzip;q=0.5, deflate", "deflate"), ("identity", None),
                               ("br", None), ("*", "gzip"), ("", None)):
            status, headers, body = raw_post(port, path, infer_body(),
                                             {"Accept-Encoding": accept})
            self.assertEqual(status, 200, body)
            self.assertEqual(headers.get("content-encoding"), coding, accept)
            if coding == "gzip":
                body = gzip.decompress(body)
            elif coding == "deflate":
                body = zlib.decompress(body)
            out = json.loads(body)["outputs"][0]["data"]
            self.assertEqual(out, X.flatten().tolist())

    def test_bad_compressed_bodies(self):
        port = self.server.http_port
        path = "/v2/models/identity/infer"
        status, headers, body = raw_post(port, path, infer_body(), {"Content-Encoding": "br"})
        self.assertEqual(status, 501, body)
        self.assertEqual(headers.get("accept-encoding"), "gzip, deflate")
        self.assertIn("Content-Encoding 'br' is not supported", json.loads(body)["error"])
        # Not gzip at all, and gzip cut short.
        status, _, body = raw_post(port, path, infer_body(), {"Content-Encoding": "gzip"})
        self.assertEqual(status, 400, body)
        self.assertIn("not valid gzip data", json.loads(body)["error"])
        status, _, body = raw_post(port, path, gzip.compress(infer_body())[:-12],
                                   {"Content-Encoding": "gzip"})
        self.assertEqual(status, 400, body)
        self.assertIn("ends early", json.loads(body)["error"])
        # After a zlib stream nothing may follow; a gzip body may hold several members (RFC 1952
        # §2.2), read one after another (found by a review: the second was dropped).
        status, _, body = raw_post(port, path, zlib.compress(infer_body()) + b"GARBAGE",
                                   {"Content-Encoding": "deflate"})
        self.assertEqual(status, 400, body)
        self.assertIn("data follows the end of the deflate stream", json.loads(body)["error"])
        whole = infer_body()
        status, _, body = raw_post(port, path, gzip.compress(whole[:40]) + gzip.compress(whole[40:]),
                                   {"Content-Encoding": "gzip"})
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["outputs"][0]["data"], X.flatten().tolist())
        # Two Content-Encoding lines: two codings one after another, not supported.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            c.putrequest("POST", path)
            c.putheader("Content-Encoding", "gzip")
            c.putheader("Content-Encoding", "gzip")
            data = gzip.compress(gzip.compress(whole))
            c.putheader("Content-Length", str(len(data)))
            c.endheaders(data)
            r = c.getresponse()
            self.assertEqual(r.status, 501)
            self.assertIn("several header lines", json.loads(r.read())["error"])
        finally:
            c.close()
        # The server goes on serving.
        r = self.http.infer("identity", [http_input(X, True)])
        np.testing.assert_array_equal(r.as_numpy("output0"), X)

    def test_zip_bomb(self):
        # 512 MB of zeros in about 500 KB, against a body limit of 16 MB: the limit is on the
        # inflated size, and inflating stops there (the server's memory grows by about the
        # limit, not by the bomb).
        bomb = zlib.compress(bytes(512 << 20), 9)
        with Server(EXAMPLE_REPOSITORY, "--max-body-bytes", str(16 << 20)) as server:
            rss0 = self.rss_mb(server)
            status, _, body = raw_post(server.http_port, "/v2/models/identity/infer", bomb,
                                       {"Content-Encoding": "deflate"})
            self.assertEqual(status, 413, body)
            self.assertIn("maximum allowed value of 16777216 bytes once inflated",
                          json.loads(body)["error"])
            grown = self.rss_mb(server) - rss0
            self.assertLess(grown, 100, "the server's RSS grew by %.0f MB" % grown)
            status, _, body = raw_post(server.http_port, "/v2/models/identity/infer",
                                       gzip.compress(infer_body()), {"Content-Encoding": "gzip"})
            self.assertEqual(status, 200, body)

    def test_inflated_tensors_count_against_the_memory_budget(self):
        # 1.2 MB of FP32 tensors from a 2 KB gzip body, against a 1 MB budget: refused (found by
        # a review: the inflated body's tensors were held without asking the budget).
        repo = harness.Repository()
        try:
            repo.add("wide", harness.builtin_config(
                "wide", "builtin:identity?shape=300000&max_batch=1",
                [("input0", "TYPE_FP32", [300000])], [("output0", "TYPE_FP32", [300000])],
                max_batch_size=1))
            repo.add("mid", harness.builtin_config(
                "mid", "builtin:identity?shape=4000&max_batch=1",
                [("input0", "TYPE_FP32", [4000])], [("output0", "TYPE_FP32", [4000])],
                max_batch_size=1))
            with Server(repo.path, "--max-inflight-bytes", "1000000") as server:
                # 16 KB of tensors, ~50 KB of JSON: compressed on the codec pool, same values.
                client = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
                x = np.random.default_rng(1).random((1, 4000), dtype=np.float32) * 1e6
                for response in ("gzip", "deflate"):
                    r = client.infer("mid", [http_input(x, False)],
                                     outputs=[httpclient.InferRequestedOutput(
                                         "output0", binary_data=False)],
                                     response_compression_algorithm=response)
                    np.testing.assert_array_equal(r.as_numpy("output0"), x)
                client.close()
                body = gzip.compress(json.dumps({"inputs": [{
                    "name": "input0", "datatype": "FP32", "shape": [1, 300000],
                    "data": [0] * 300000}]}).encode())
                self.assertLess(len(body), 10000)
                status, _, answer = raw_post(server.http_port, "/v2/models/wide/infer", body,
                                             {"Content-Encoding": "gzip"})
                self.assertEqual(status, 503, answer)
                self.assertIn("--max-inflight-bytes", json.loads(answer)["error"])
        finally:
            repo.cleanup()

    @staticmethod
    def rss_mb(server):
        with open("/proc/%d/status" % server.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0

    def test_grpc_compression(self):
        for algorithm in ("gzip", "deflate"):
            r = self.grpc.infer("identity", [grpc_input(X)], compression_algorithm=algorithm)
            np.testing.assert_array_equal(r.as_numpy("output0"), X)


def example_config(name, extra="", rename=True):
    with open(os.path.join(EXAMPLE_REPOSITORY, name, "config.pbtxt")) as f:
        text = f.read()
    if rename:
        text = text.replace('name: "%s"' % name, 'name: "%s_cached"' % name)
    return text + extra


class ResponseCache(harness.unittest.TestCase):
    """Triton's response cache: --cache-config local,size=BYTES and response_cache { enable }."""

    CACHE_BYTES = 8192  # a few entries of [2,16] FP32: the LRU evicts

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("identity_cached", example_config("identity",
                                                       "response_cache { enable: true }\n"),
                     versions=(1, 2))
        cls.repo.add("slow_cached", example_config("slow", "response_cache { enable: true }\n"))
        cls.repo.add("identity", example_config("identity", rename=False))
        serve(cls, cls.repo.path, "--cache-config", "local,size=%d" % cls.CACHE_BYTES,
              repo=cls.repo, concurrency=16)

    def stats(self, model):
        return self.http.get_inference_statistics(model, "1")["model_stats"][0]

    def cache_counts(self, model):
        st = self.stats(model)["inference_stats"]
        return st["cache_hit"]["count"], st["cache_miss"]["count"]

    def test_a_hit_is_byte_identical_to_the_computed_answer(self):
        x = np.full((2, 16), 7.25, dtype=np.float32)
        for binary in (False, True):
            i = httpclient.InferInput("input0", [2, 16], "FP32")
            i.set_data_from_numpy(x + binary, binary_data=binary)
            body, json_size = httpclient.InferenceServerClient.generate_request_body(
                [i], outputs=[httpclient.InferRequestedOutput("output0", binary_data=binary)],
                request_id="same")
            headers = {"Content-Type": "application/octet-stream"}
            if json_size is not None:
                headers["Inference-Header-Content-Length"] = str(json_size)
            path = "/v2/models/identity_cached/versions/1/infer"
            hits0, misses0 = self.cache_counts("identity_cached")
            computed = raw_post(self.server.http_port, path, body, headers)
            cached = raw_post(self.server.http_port, path, body, headers)
            self.assertEqual(computed[0], 200, computed[2])
            self.assertEqual(cached[2], computed[2])  # byte for byte
            self.assertEqual(self.cache_counts("identity_cached"), (hits0 + 1, misses0 + 1))
            # The same input through gRPC hits the same entry (the key is the tensors', not the
            # protocol's) and decodes to the same values.
            g = grpcclient.InferInput("input0", [2, 16], "FP32")
            g.set_data_from_numpy(x + binary)
            r = self.grpc.infer("identity_cached", [g], model_version="1")
            np.testing.assert_array_equal(r.as_numpy("output0"), x + binary)
            self.assertEqual(self.cache_counts("identity_cached"), (hits0 + 2, misses0 + 1))

    def test_statistics_and_metrics_count_hits_and_misses(self):
        x = np.full((1, 16), -3.5, dtype=np.float32)
        before = self.stats("identity_cached")
        for _ in range(5):
            self.http.infer("identity_cached", [http_input(x, True)], model_version="1")
        after = self.stats("identity_cached")
        st0, st1 = before["inference_stats"], after["inference_stats"]
        self.assertEqual(st1["cache_miss"]["count"] - st0["cache_miss"]["count"], 1)
        self.assertEqual(st1["cache_hit"]["count"] - st0["cache_hit"]["count"], 4)
        self.assertGreater(st1["cache_hit"]["ns"], st0["cache_hit"]["ns"])
        # Triton's accounting: a hit is a success, not an inference or an execution.
        self.assertEqual(st1["success"]["count"] - st0["success"]["count"], 5)
        self.assertEqual(st1["queue"]["count"] - st0["queue"]["count"], 5)
        self.assertEqual(after["inference_count"] - before["inference_count"], 1)
        self.assertEqual(after["execution_count"] - before["execution_count"], 1)
        g = self.grpc.get_inference_statistics("identity_cached", "1").model_stats[0]
        self.assertEqual(g.inference_stats.cache_hit.count, st1["cache_hit"]["count"])
        self.assertEqual(g.inference_stats.cache_miss.count, st1["cache_miss"]["count"])
        page = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        for statistic in ("cache_hit", "cache_miss"):
            self.assertEqual(metric(page, "asyncinfer_inference_statistics_requests",
                                    model="identity_cached", version="1", statistic=statistic),
                             st1[statistic]["count"], statistic)
            # Triton's names for the same counts.
            self.assertEqual(metric(page, "nv_cache_num_hits_per_model" if statistic ==
                                    "cache_hit" else "nv_cache_num_misses_per_model",
                                    model="identity_cached", version="1"),
                             st1[statistic]["count"], statistic)
        self.assertEqual(metric(page, "nv_inference_request_success", model="identity_cached",
                                version="1"), st1["success"]["count"])
        self.assertEqual(metric(page, "nv_inference_count", model="identity_cached",
                                version="1"), after["inference_count"])
        # A model without response_cache never looks.
        self.assertIsNone(metric(page, "nv_cache_num_hits_per_model", model="identity",
                                 version="1"))
        self.http.infer("identity", [http_input(x, True)], model_version="1")
        self.http.infer("identity", [http_input(x, True)], model_version="1")
        self.assertEqual(self.cache_counts("identity"), (0, 0))
        config = self.http.get_model_config("identity_cached")
        self.assertEqual(config["response_cache"], {"enable": True})
        self.assertEqual(self.http.get_model_config("identity")["response_cache"],
                         {"enable": False})

    def test_least_recently_used_entries_make_room(self):
        def infer(k):
            x = np.full((2, 16), 1000.0 + k, dtype=np.float32)
            r = self.http.infer("identity_cached", [http_input(x, True)], model_version="2")
            np.testing.assert_array_equal(r.as_numpy("output0"), x)
        # Entries of 2x16 FP32 take a few hundred bytes: 64 distinct inputs overflow 8 KiB.
        hits0, misses0 = self.cache_counts_v2()
        for k in range(64):
            infer(k)
        infer(63)  # the most recent: still there
        self.assertEqual(self.cache_counts_v2(), (hits0 + 1, misses0 + 64))
        infer(0)  # the oldest: evicted
        self.assertEqual(self.cache_counts_v2(), (hits0 + 1, misses0 + 65))
        page = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        self.assertGreater(metric(page, "asyncinfer_response_cache_evictions_total"), 0)
        self.assertLessEqual(metric(page, "asyncinfer_response_cache_bytes"), self.CACHE_BYTES)

    def cache_counts_v2(self):
        st = self.http.get_inference_statistics("identity_cached", "2")["model_stats"][0]
        return st["inference_stats"]["cache_hit"]["count"], \
            st["inference_stats"]["cache_miss"]["count"]

    def test_identical_requests_in_flight_compute_once(self):
        # slow_cached: each row's value is its time on the device (µs); 16 identical requests of
        # 300 ms each arrive together: one runs, the others wait for its answer.
        x = np.array([[300000.0 + 1]], dtype=np.float32)
        before = self.stats("slow_cached")
        results, errors = [], []

        def one():
            try:
                i = httpclient.InferInput("input0", [1, 1], "FP32")
                i.set_data_from_numpy(x)
                with httpclient.InferenceServerClient(
                        "127.0.0.1:%d" % self.server.http_port) as c:
                    results.append(c.infer("slow_cached", [i]).as_numpy("output0"))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=one) for _ in range(16)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        took = time.monotonic() - start
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 16)
        for r in results:
            np.testing.assert_array_equal(r, results[0])
        after = self.stats("slow_cached")
        self.assertEqual(after["execution_count"] - before["execution_count"], 1)
        st0, st1 = before["inference_stats"], after["inference_stats"]
        self.assertEqual(st1["cache_miss"]["count"] - st0["cache_miss"]["count"], 1)
        self.assertEqual(st1["cache_hit"]["count"] - st0["cache_hit"]["count"], 15)
        self.assertLess(took, 16 * 0.3)  # not one after another

    def test_a_cancelled_leader_leaves_its_followers_to_compute(self):
        x = np.array([[400000.0 + 2]], dtype=np.float32)
        body = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 1],
                                       "data": [float(x[0][0])]}]}).encode()
        leader = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10)
        leader.sendall(b"POST /v2/models/slow_cached/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.1)  # it leads
        before = self.stats("slow_cached")
        out = {}

        def follower():
            i = httpclient.InferInput("input0", [1, 1], "FP32")
            i.set_data_from_numpy(x)
            with httpclient.InferenceServerClient("127.0.0.1:%d" % self.server.http_port,
                                                  network_timeout=30) as c:
                out["r"] = c.infer("slow_cached", [i]).as_numpy("output0")
        t = threading.Thread(target=follower)
        t.start()
        time.sleep(0.1)  # it follows
        leader.close()   # the leader's client goes away: its request is cancelled
        t.join(30)
        self.assertIn("r", out, "the follower got no answer")
        after = self.stats("slow_cached")
        # The follower ran the model itself (its own execution), and its answer is the model's
        # for its input (fixed_cost answers each row's time). Misses: the leader's (counted
        # when it ended) and the follower's own.
        self.assertGreaterEqual(after["execution_count"] - before["execution_count"], 1)
        self.assertEqual(after["inference_stats"]["cache_miss"]["count"]
                         - before["inference_stats"]["cache_miss"]["count"], 2)
        self.assertGreater(out["r"][0][0], 0)

    def test_bad_cache_config_is_refused(self):
        for value, expected in (("redis,host=x", "cache 'redis' is not built in"),
                                ("local,size=0", "size must be a positive number of bytes"),
                                ("local,size=12k", "size must be a positive number of bytes"),
                                ("local,bytes=10", "the local cache takes size=BYTES"),
                                ("local", "expected local,size=BYTES")):
            p = subprocess.run([ARGS.cli, "serve", "--model-repository", self.repo.path,
                                "--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1",
                                "--cache-config", value], capture_output=True, text=True,
                               timeout=60)
            self.assertNotEqual(p.returncode, 0, value)
            self.assertIn(expected, p.stderr, value)


def identity_config(delay_us=0, count=1, policy="all { }"):
    """The example identity model's config with the fields a reload test changes."""
    return ('name: "identity"\nbackend: "builtin"\nmax_batch_size: 8\n'
            'input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
            'output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
            "instance_group [ { kind: KIND_CPU, count: %d } ]\n"
            "dynamic_batching { max_queue_delay_microseconds: %d }\n"
            "version_policy: { %s }\n"
            'parameters { key: "uri" value { string_value: "builtin:identity?shape=16&max_batch=8" '
            "} }\n" % (count, delay_us, policy))


def identity_config_json(delay_us, count=1):
    """The same as Triton's `config` parameter of a load: a ModelConfig in JSON."""
    return json.dumps({
        "name": "identity", "backend": "builtin", "max_batch_size": 8,
        "input": [{"name": "input0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "output0", "data_type": "TYPE_FP32", "dims": [16]}],
        "instance_group": [{"kind": "KIND_CPU", "count": count}],
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
        "version_policy": {"all": {}},
        "parameters": {"uri": {"string_value": "builtin:identity?shape=16&max_batch=8"}}})


def index_of(client, name):
    """{version: (state, reason)} of one model in the repository index (HTTP client)."""
    return {e.get("version", ""): (e.get("state", ""), e.get("reason", ""))
            for e in client.get_model_repository_index() if e["name"] == name}


class RepositoryControl(harness.unittest.TestCase):
    """Triton's model repository extension with --model-control-mode explicit: load (a reload
    with a config override), unload, the index; a reload under load; errors with Triton's codes."""

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("identity", identity_config(), versions=(1, 2))
        cls.repo.add("spare", example_config("identity", rename=False).replace(
            'name: "identity"', 'name: "spare"'))
        cls.repo.add("slow", example_config("slow", rename=False))
        cls.repo.add("never", example_config("identity", rename=False).replace(
            'name: "identity"', 'name: "never"'))
        serve(cls, cls.repo.path, "--model-control-mode", "explicit", "--load-model", "identity",
              "--load-model", "slow", "--drain-timeout", "20", repo=cls.repo, concurrency=4,
              network_timeout=60)

    def infer_identity(self, x=X, version=""):
        r = self.http.infer("identity", [http_input(x, True)], model_version=version)
        np.testing.assert_array_equal(r.as_numpy("output0"), x)
        return r.get_response()["model_version"]

    def test_index_shows_each_state_with_its_reason(self):
        idx = index_of(self.http, "identity")
        self.assertEqual(idx["1"][0], "READY")
        self.assertEqual(idx["2"][0], "READY")
        state, reason = index_of(self.http, "never")[""]
        self.assertEqual(state, "UNAVAILABLE")
        self.assertIn("not loaded", reason)
        g = {(m.name, m.version): (m.state, m.reason)
             for m in self.grpc.get_model_repository_index().models}
        self.assertEqual(g[("identity", "2")], ("READY", ""))
        self.assertEqual(g[("never", "")][0], "UNAVAILABLE")
        # A model explicit mode did not load is not found, not ready, and does not hold the
        # server's readiness back.
        self.assertTrue(self.http.is_server_ready())
        self.assertFalse(self.grpc.is_model_ready("never"))
        self.assertFalse(self.http.is_model_ready("never"))
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("never", [http_input(X, True)])
        self.assertEqual(e.exception.status(), "404")
        self.assertIn("Request for unknown model: 'never' has no available versions "
                      "(it is not loaded", e.exception.message())

    def test_load_and_unload_over_http_and_grpc(self):
        self.http.load_model("spare")
        self.assertTrue(self.http.is_model_ready("spare"))
        r = self.grpc.infer("spare", [grpc_input(X)])
        np.testing.assert_array_equal(r.as_numpy("output0"), X)
        self.grpc.unload_model("spare")
        # Refused at once: 404 / NOT_FOUND, as for a model that does not exist.
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("spare", [http_input(X, True)])
        self.assertEqual(e.exception.status(), "404")
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("spare", [grpc_input(X)])
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        self.assertFalse(self.grpc.is_model_ready("spare"))
        wait_for(lambda: index_of(self.http, "spare").get("1") == ("UNAVAILABLE", "unloaded"),
                 what="spare to show UNAVAILABLE, unloaded")
        # Unloading what is not loaded succeeds (Triton's rule).
        self.http.unload_model("spare")
        self.grpc.load_model("spare")
        r = self.http.infer("spare", [http_input(X, False)])
        np.testing.assert_array_equal(r.as_numpy("output0"), X)
        self.http.unload_model("spare", unload_dependents=True)

    def test_aio_clients_load_and_unload(self):
        async def run():
            h = httpaio.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            g = grpcaio.InferenceServerClient(self.server.grpc_target)
            try:
                await h.load_model("spare")
                self.assertTrue(await g.is_model_ready("spare"))
                await g.unload_model("spare")
                self.assertFalse(await h.is_model_ready("spare"))
                index = await g.get_model_repository_index(as_json=True)
                self.assertTrue(any(m["name"] == "spare" for m in index["models"]))
            finally:
                await h.close()
                await g.close()
        asyncio.run(asyncio.wait_for(run(), 60))

    def test_a_config_override_reloads_and_a_bad_one_leaves_the_old_serving(self):
        self.http.load_model("identity", config=identity_config_json(250, count=2))
        c = self.http.get_model_config("identity")
        self.assertEqual(c["dynamic_batching"]["max_queue_delay_microseconds"], 250)
        self.assertEqual(c["instance_group"][0]["count"], 2)
        self.infer_identity()
        for bad, expected in (('{"max_batch_size": 8, "frobnicate": 1}', "frobnicate"),
                              ("{not json", "not a ModelConfig in JSON"),
                              (identity_config_json(0).replace('"identity"', '"other"', 1),
                               "differs from the model's folder")):
            with self.assertRaises(InferenceServerException) as e:
                self.http.load_model("identity", config=bad)
            self.assertEqual(e.exception.status(), "400", e.exception.message())
            self.assertIn(expected, e.exception.message())
            # The old configuration goes on serving; the index says why the new one is not.
            self.assertEqual(self.http.get_model_config("identity")["instance_group"][0]["count"], 2)
            self.infer_identity()
            state, reason = index_of(self.http, "identity")["2"]
            self.assertEqual(state, "READY")
            self.assertIn("the last load failed", reason)
            self.assertIn(expected, reason)
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.load_model("identity", config="[1, 2]")
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertIn("failed", self.server.log())
        # Back to the folder's config.pbtxt.
        self.http.load_model("identity")
        c = self.http.get_model_config("identity")
        self.assertEqual(c["dynamic_batching"]["max_queue_delay_microseconds"], 0)
        self.assertEqual(index_of(self.http, "identity")["2"], ("READY", ""))

    def test_errors_have_tritons_codes(self):
        with self.assertRaises(InferenceServerException) as e:
            self.http.load_model("nope")
        self.assertEqual(e.exception.status(), "500")
        self.assertIn("no folder", e.exception.message())
        self.assertNotIn("nope", [m["name"] for m in self.http.get_model_repository_index()])
        self.assertTrue(self.http.is_server_ready())
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.load_model("nope")
        self.assertEqual(e.exception.status(), "StatusCode.INTERNAL")
        # A model file in the load makes the model's folder: "{}" names no backend, model.pt
        # makes it a pytorch model, which needs its tensors listed.
        with self.assertRaises(InferenceServerException) as e:
            self.http.load_model("spare", files={"file:1/model.pt": b"x"}, config="{}")
        self.assertEqual(e.exception.status(), "400")
        self.assertIn("needs input and output lists", e.exception.message())
        self.http.load_model("spare")  # back to its folder: the failed load left it unready
        self.http.unload_model("spare")
        status, _, body = raw_post(self.server.http_port, "/v2/repository/models/spare/load",
                                   b'{"parameters": {"config": 7}}', {})
        self.assertEqual(status, 400)
        self.assertIn(b"must be a string", body)
        status, _, body = raw_post(self.server.http_port, "/v2/repository/models/spare/load",
                                   b"{", {})
        self.assertEqual(status, 400)
        # Outside explicit mode the calls are refused with 503 / UNAVAILABLE.
        with Server(EXAMPLE_REPOSITORY) as none:
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % none.http_port)
            g = grpcclient.InferenceServerClient(none.grpc_target)
            try:
                with self.assertRaises(InferenceServerException) as e:
                    h.unload_model("identity")
                self.assertEqual(e.exception.status(), "503")
                self.assertIn("--model-control-mode none", e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    g.load_model("identity")
                self.assertEqual(e.exception.status(), "StatusCode.UNAVAILABLE")
                self.assertTrue(h.is_model_ready("identity"))
            finally:
                h.close()
                g.close()

    def test_unload_lets_the_requests_in_flight_finish(self):
        self.http.load_model("slow")
        x = np.array([[600000.0]], dtype=np.float32)  # 0.6 s on the device
        i = httpclient.InferInput("input0", [1, 1], "FP32")
        i.set_data_from_numpy(x)
        running = self.http.async_infer("slow", [i])
        pending = lambda: metric(urllib.request.urlopen(self.server.metrics_url, timeout=10)
                                 .read().decode(), "asyncinfer_inference_pending_request_count",
                                 model="slow", version="1")
        wait_for(lambda: pending() == 1, what="the request to reach the engine")
        self.http.unload_model("slow")
        self.assertEqual(index_of(self.http, "slow")["1"][0], "UNLOADING")
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("slow", [i])
        self.assertEqual(e.exception.status(), "404")
        r = running.get_result(timeout=30)
        np.testing.assert_array_equal(r.as_numpy("output0"), x)
        wait_for(lambda: index_of(self.http, "slow")["1"] == ("UNAVAILABLE", "unloaded"),
                 what="slow to finish unloading")
        self.http.load_model("slow")

    def test_a_reload_under_load_fails_no_request(self):
        """16 clients in a closed loop for 10 s while the config changes and reloads 5 times,
        a bad config is pushed once and a version is added: no request fails, and every answer
        is right and comes from a version that was ready."""
        stop = threading.Event()
        failures = []
        answers = []  # (time answered, version)
        lock = threading.Lock()

        def client(k):
            if k % 2:
                c = grpcclient.InferenceServerClient(self.server.grpc_target)
                make = grpc_input
            else:
                c = httpclient.InferenceServerClient("127.0.0.1:%d" % self.server.http_port,
                                                     network_timeout=30)
                make = lambda x: http_input(x, k % 4 == 0)
            x = np.full((1, 16), float(k), dtype=np.float32)
            try:
                while not stop.is_set():
                    try:
                        r = c.infer("identity", [make(x)])
                        got = r.as_numpy("output0")
                        version = (r.get_response().model_version if k % 2
                                   else r.get_response()["model_version"])
                        if not np.array_equal(got, x):
                            raise AssertionError("wrong answer %r" % got)
                        with lock:
                            answers.append((time.monotonic(), version))
                    except Exception as e:  # noqa: BLE001 - every failure counts
                        with lock:
                            failures.append(repr(e))
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        added_at = None
        try:
            time.sleep(1.5)
            for n in range(5):
                if n % 2:
                    self.http.load_model("identity", config=identity_config_json(100 * n, 1 + n % 2))
                else:
                    with open(os.path.join(self.repo.path, "identity", "config.pbtxt"), "w") as f:
                        f.write(identity_config(delay_us=50 * n, count=1 + n % 2))
                    self.grpc.load_model("identity")
                time.sleep(1.2)
                if n == 2:
                    with self.assertRaises(InferenceServerException):
                        self.http.load_model("identity", config='{"max_batch_size": "many"}')
                    time.sleep(0.5)
            os.makedirs(os.path.join(self.repo.path, "identity", "3"))
            added_at = time.monotonic()
            self.http.load_model("identity")
            self.assertEqual(index_of(self.http, "identity")["3"][0], "READY")
            time.sleep(1.5)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        self.assertEqual(failures, [], "%d failed of %d" % (len(failures),
                                                           len(failures) + len(answers)))
        self.assertGreater(len(answers), 200)
        versions = {v for _, v in answers}
        self.assertLessEqual(versions, {"2", "3"})  # the default version, then the added one
        self.assertIn("3", versions)
        early = [t for t, v in answers if v == "3" and t < added_at]
        self.assertEqual(early, [], "answers from version 3 before its load began")
        self.infer_identity(version="1")
        # Leave the model as the other tests expect it.
        os.rmdir(os.path.join(self.repo.path, "identity", "3"))
        with open(os.path.join(self.repo.path, "identity", "config.pbtxt"), "w") as f:
            f.write(identity_config())
        self.http.load_model("identity")
        self.assertNotIn("3", index_of(self.http, "identity"))


# A python model sent as files in a load request (ModelFileOverride).
SCALE_PY = b"""import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (
            pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * %d).astype(np.float32))])
            for r in requests]
"""
SCALE_CONFIG = json.dumps({
    "backend": "python", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]})


class ModelFileOverride(harness.unittest.TestCase):
    """Triton's model file override: a load's `file:<path>` parameters (base64 over HTTP, bytes
    over gRPC) with its `config` make the model's folder, in a temporary folder of its own that
    goes with the last version loaded from it; files that cannot make a folder fail the load with
    Triton's INTERNAL "failed to poll from model repository" and the server goes on."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="asyncinfer-override-test-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        cls.repo = Repository()
        cls.addClassCleanup(cls.repo.cleanup)
        cls.repo.add("identity", identity_config())
        before = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = cls.tmp  # where the server makes the override folders
        try:
            cls.server = Server(cls.repo.path, "--model-control-mode", "explicit").start()
        finally:
            if before is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = before
        cls.addClassCleanup(cls.server.stop)
        cls.http = httpclient.InferenceServerClient("127.0.0.1:%d" % cls.server.http_port)
        cls.grpc = grpcclient.InferenceServerClient(cls.server.grpc_target)

    def folders(self):
        return sorted(f for f in os.listdir(self.tmp) if f.startswith("asyncinfer-override-"))

    def scale(self, client):
        """What "uploaded" makes of X's first row, through `client`."""
        lib = httpclient if client is self.http else grpcclient
        i = lib.InferInput("INPUT0", [1, 16], "FP32")
        i.set_data_from_numpy(X[:1, :])
        return client.infer("uploaded", [i]).as_numpy("OUTPUT0")

    def test_a_model_sent_as_files_serves_until_it_is_replaced_or_unloaded(self):
        self.http.load_model("uploaded", config=SCALE_CONFIG,
                             files={"file:1/model.py": SCALE_PY % 2})
        self.addCleanup(self.http.unload_model, "uploaded")
        np.testing.assert_array_equal(self.scale(self.http), X[:1, :] * 2)
        self.assertEqual(len(self.folders()), 1)
        first = self.folders()[0]
        with open(os.path.join(self.tmp, first, "uploaded", "1", "model.py"), "rb") as f:
            self.assertEqual(f.read(), SCALE_PY % 2)
        self.assertEqual(self.http.get_model_config("uploaded")["backend"], "python")
        # Loaded again over gRPC with other files: they serve, and the first folder goes once
        # the version loaded from it has drained.
        self.grpc.load_model("uploaded", config=SCALE_CONFIG,
                             files={"file:1/model.py": SCALE_PY % 3})
        np.testing.assert_array_equal(self.scale(self.grpc), X[:1, :] * 3)
        wait_for(lambda: first not in self.folders() and len(self.folders()) == 1,
                 what="the first load's folder to go")
        self.http.unload_model("uploaded")
        wait_for(lambda: self.folders() == [], what="the override folder to go with the model")
        self.assertFalse(self.http.is_model_ready("uploaded"))

    def test_files_that_cannot_make_a_folder_fail_the_load_alone(self):
        cases = [({"file:1/model.py": SCALE_PY % 2}, None, "needs the 'config' parameter"),
                 ({"file:../escaped.py": b"x"}, SCALE_CONFIG, "inside the model's folder"),
                 ({"file:/etc/escaped.py": b"x"}, SCALE_CONFIG, "inside the model's folder"),
                 ({"file:1/" + "A" * 300: b"x"}, SCALE_CONFIG, "File name too long"),
                 # Whichever comes first (a gRPC map has no order), the other cannot be.
                 ({"file:1": b"x", "file:1/model.py": b"y"}, SCALE_CONFIG,
                  "(file:1/model.py': cannot make its folder|file:1': cannot write it)")]
        for files, config, why in cases:
            for client, code in ((self.http, "500"), (self.grpc, "StatusCode.INTERNAL")):
                with self.assertRaises(InferenceServerException, msg=str(files)) as e:
                    client.load_model("uploaded", config=config, files=files)
                self.assertEqual(e.exception.status(), code, e.exception.message())
                self.assertIn("failed to load 'uploaded': failed to poll from model repository",
                              e.exception.message())
                self.assertRegex(e.exception.message(), why)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "escaped.py")))
        self.assertEqual(self.folders(), [])  # what a failed load made is gone
        # Not base64 over HTTP: 400, naming the parameter.
        status, _, body = raw_post(self.server.http_port, "/v2/repository/models/uploaded/load",
                                   json.dumps({"parameters": {"config": SCALE_CONFIG,
                                                              "file:1/model.py": "not base64!"}})
                                   .encode(), {})
        self.assertEqual(status, 400)
        self.assertIn(b"'file:1/model.py' must be a string holding the file's contents in base64",
                      body)
        self.assertTrue(self.http.is_server_ready())
        self.http.load_model("identity")
        self.assertTrue(self.grpc.is_model_ready("identity"))


class PollMode(harness.unittest.TestCase):
    """--model-control-mode poll: the repository is rescanned; what changed is loaded, reloaded
    or unloaded without a call."""

    def test_poll_loads_reloads_and_unloads(self):
        repo = Repository()
        repo.add("identity", identity_config(), versions=(1,))
        try:
            with Server(repo.path, "--model-control-mode", "poll",
                        "--repository-poll-secs", "0.2") as server:
                h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
                try:
                    with self.assertRaises(InferenceServerException) as e:
                        h.load_model("identity")
                    self.assertEqual(e.exception.status(), "503")
                    repo.add("spare", identity_config().replace('name: "identity"',
                                                                'name: "spare"'))
                    wait_for(lambda: h.is_model_ready("spare"), what="spare to load")
                    with open(os.path.join(repo.path, "identity", "config.pbtxt"), "w") as f:
                        f.write(identity_config(delay_us=777))
                    wait_for(lambda: h.get_model_config("identity")["dynamic_batching"]
                             ["max_queue_delay_microseconds"] == 777, what="the reload")
                    r = h.infer("identity", [http_input(X, True)])
                    np.testing.assert_array_equal(r.as_numpy("output0"), X)
                    # A bad config leaves the old one serving, with the reason in the index.
                    with open(os.path.join(repo.path, "identity", "config.pbtxt"), "w") as f:
                        f.write("max_batch_size: [")
                    wait_for(lambda: "the last load failed" in index_of(h, "identity")["1"][1],
                             what="the failed reload in the index")
                    self.assertTrue(h.is_model_ready("identity"))
                    shutil.rmtree(os.path.join(repo.path, "spare"))
                    wait_for(lambda: not h.is_model_ready("spare"), what="spare to unload")
                    with self.assertRaises(InferenceServerException) as e:
                        h.infer("spare", [http_input(X, True)])
                    self.assertEqual(e.exception.status(), "404")
                finally:
                    h.close()
        finally:
            repo.cleanup()


def slow_warmup_config(runs):
    """The example slow model with a warm-up of `runs` runs of 1 s each (its input, the float
    1e6, read from warmup/us: the microseconds a run takes)."""
    return example_config("slow", rename=False) + (
        'model_warmup [ { name: "w" batch_size: 1 count: %d inputs { key: "input0" value: '
        '{ data_type: TYPE_FP32 dims: [ 1 ] input_data_file: "us" } } } ]\n' % runs)


class ReloadEdges(harness.unittest.TestCase):
    """What broke the first cut (found by trying): a queue longer than --drain-timeout on a
    replaced version, names that leave the repository, an unload or a SIGTERM while a long load
    runs."""

    def setUp(self):
        self.repo = Repository()
        self.repo.add("slow", example_config("slow", rename=False))
        self.repo.add("warm", slow_warmup_config(30).replace('name: "slow"', 'name: "warm"'))
        os.makedirs(os.path.join(self.repo.path, "warm", "warmup"))
        with open(os.path.join(self.repo.path, "warm", "warmup", "us"), "wb") as f:
            f.write(np.array([1e6], dtype=np.float32).tobytes())

    def tearDown(self):
        self.repo.cleanup()

    def server(self, *extra):
        return Server(self.repo.path, "--model-control-mode", "explicit", "--load-model", "slow",
                      "--drain-timeout", "1", *extra)

    def test_a_replaced_version_finishes_a_queue_longer_than_the_drain_timeout(self):
        with self.server() as server:
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port,
                                                 concurrency=16, network_timeout=60)
            try:
                i = httpclient.InferInput("input0", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[250000.0]], dtype=np.float32))  # 0.25 s each
                running = [h.async_infer("slow", [i]) for _ in range(12)]  # 3 s of queue
                time.sleep(0.3)
                config = json.dumps({
                    "name": "slow", "backend": "builtin", "max_batch_size": 1,
                    "input": [{"name": "input0", "data_type": "TYPE_FP32", "dims": [1]}],
                    "output": [{"name": "output0", "data_type": "TYPE_FP32", "dims": [1]}],
                    "dynamic_batching": {"default_queue_policy": {"max_queue_size": 50}},
                    "parameters": {
                        "uri": {"string_value":
                                "builtin:fixed_cost?cost_from_input=true&shape=1&max_batch=1"},
                        "device": {"string_value": "sim"},
                        "max_inflight_per_worker": {"string_value": "1"}}})
                h.load_model("slow", config=config)
                for r in running:
                    self.assertEqual(r.get_result(timeout=30).as_numpy("output0")[0, 0], 250000.0)
            finally:
                h.close()

    def test_names_that_leave_the_repository_are_refused(self):
        outside = Repository()
        outside.add("m", None)
        try:
            with self.server() as server:
                h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
                g = grpcclient.InferenceServerClient(server.grpc_target)
                try:
                    rel = os.path.relpath(os.path.join(outside.path, "m"), self.repo.path)
                    for name in ("..", ".", rel, os.path.join(outside.path, "m"), ".hidden"):
                        quoted = urllib.request.quote(name, safe="")
                        status, _, body = raw_post(server.http_port,
                                                   "/v2/repository/models/%s/load" % quoted,
                                                   b"", {})
                        self.assertEqual(status, 400, (name, body))
                        self.assertIn(b"is not a model folder's name", body)
                        with self.assertRaises(InferenceServerException) as e:
                            g.load_model(name)
                        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
                    with self.assertRaises(InferenceServerException) as e:
                        h.unload_model(".hidden")
                    self.assertEqual(e.exception.status(), "400")
                    # Longer than any folder name: refused, with a message that fits gRPC's
                    # trailers (it does not repeat the name).
                    with self.assertRaises(InferenceServerException) as e:
                        g.load_model("x" * 5000)
                    self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
                    self.assertIn("at most 255 bytes", e.exception.message())
                    names = {m["name"] for m in h.get_model_repository_index()}
                    self.assertEqual(names, {"slow", "warm"})
                finally:
                    h.close()
                    g.close()
        finally:
            outside.cleanup()

    def test_an_unload_during_a_long_load_answers_at_once_and_wins(self):
        with self.server() as server:
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port,
                                                 network_timeout=120)
            try:
                result = {}

                def load():
                    try:
                        h2 = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port,
                                                              network_timeout=120)
                        h2.load_model("warm")
                        result["ok"] = True
                    except InferenceServerException as e:
                        result["error"] = e
                t = threading.Thread(target=load)
                t.start()
                wait_for(lambda: index_of(h, "warm").get("1", ("",))[0] == "LOADING",
                         what="warm to be LOADING")
                t0 = time.monotonic()
                h.unload_model("warm")
                self.assertLess(time.monotonic() - t0, 2.0)
                self.assertFalse(h.is_model_ready("warm"))
                # The load is dropped, its 30 s warm-up cut short.
                t.join(10)
                self.assertFalse(t.is_alive())
                self.assertNotIn("ok", result)
                self.assertIn("unloaded while it loaded", result["error"].message())
                self.assertLess(time.monotonic() - t0, 10)
                self.assertEqual(index_of(h, "warm")[""][0], "UNAVAILABLE")
                h.load_model("slow")  # the control thread is free again at once
            finally:
                h.close()

    def test_sigterm_cuts_a_replaced_versions_long_queue_to_the_drain_timeout(self):
        with self.server() as server:
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port,
                                                 concurrency=16, network_timeout=60)
            try:
                i = httpclient.InferInput("input0", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[500000.0]], dtype=np.float32))
                running = [h.async_infer("slow", [i]) for _ in range(40)]  # 20 s of queue
                time.sleep(0.3)
                with open(os.path.join(self.repo.path, "slow", "config.pbtxt"), "a") as f:
                    f.write("# changed\n")
                h.load_model("slow")
                t0 = time.monotonic()
                server.signal()
                self.assertEqual(server.wait(15), 0)
                self.assertLess(time.monotonic() - t0, 8)  # --drain-timeout 1, not 20 s
                del running
            finally:
                h.close()

    def test_sigterm_during_a_long_load_exits_within_the_drain_timeout(self):
        with self.server() as server:
            threading.Thread(target=lambda: raw_post(server.http_port,
                                                     "/v2/repository/models/warm/load", b"", {}),
                             daemon=True).start()
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
            try:
                wait_for(lambda: index_of(h, "warm").get("1", ("",))[0] == "LOADING",
                         what="warm to be LOADING")
            finally:
                h.close()
            t0 = time.monotonic()
            server.signal()
            self.assertEqual(server.wait(15), 0)
            self.assertLess(time.monotonic() - t0, 10)



class Classification(harness.unittest.TestCase):
    """Triton's classification extension: InferRequestedOutput(name, class_count=N) answers the N
    largest values of each batch item as BYTES "value:index[:label]", the labels from the
    output's label_filename (std::to_string formats the values, as Triton's server does)."""

    LABELS = ["cat", "dog", "bird", "fish", "frog", "newt"]

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        labels = os.path.join(cls.repo.path, "labels.txt")
        with open(labels, "w") as f:
            f.write("\n".join(cls.LABELS) + "\n")
        cls.repo.add("scores", (
            'name: "scores"\nbackend: "builtin"\nmax_batch_size: 8\n'
            'input [ { name: "input0", data_type: TYPE_FP32, dims: [ 6 ] } ]\n'
            'output [ { name: "output0", data_type: TYPE_FP32, dims: [ 6 ], '
            'label_filename: "labels.txt" } ]\n'
            'parameters { key: "uri" value { string_value: '
            '"builtin:identity?shape=6&max_batch=8" } }\n'), files={"labels.txt": labels})
        cls.repo.add("counts", harness.builtin_config(
            "counts", "builtin:identity?dtype=i32&shape=5&max_batch=0",
            [("input0", "TYPE_INT32", [5])], [("output0", "TYPE_INT32", [5])], max_batch_size=0))
        cls.repo.add("texts", harness.builtin_config(
            "texts", "builtin:identity?dtype=bytes&shape=-1&max_batch=8",
            [("input0", "TYPE_STRING", [-1])], [("output0", "TYPE_STRING", [-1])]))
        serve(cls, cls.repo.path, "--model-control-mode", "explicit", "--load-model", "scores",
              "--load-model", "counts", "--load-model", "texts", repo=cls.repo)

    X = np.array([[0.1, 0.9, 0.3, 0.7, 0.5, 0.2], [6, 5, 4, 3, 2, 1]], np.float32)
    TOP3 = [[b"0.900000:1:dog", b"0.700000:3:fish", b"0.500000:4:frog"],
            [b"6.000000:0:cat", b"5.000000:1:dog", b"4.000000:2:bird"]]

    def test_http_binary_and_json(self):
        for binary in (True, False):
            i = httpclient.InferInput("input0", [2, 6], "FP32")
            i.set_data_from_numpy(self.X, binary_data=binary)
            o = httpclient.InferRequestedOutput("output0", binary_data=binary, class_count=3)
            r = self.http.infer("scores", [i], outputs=[o])
            self.assertEqual(r.get_output("output0")["datatype"], "BYTES")
            got = r.as_numpy("output0")
            self.assertEqual(got.shape, (2, 3))
            self.assertEqual([[v if isinstance(v, bytes) else v.encode() for v in row]
                              for row in got.tolist()], self.TOP3)

    def test_grpc(self):
        i = grpcclient.InferInput("input0", [2, 6], "FP32")
        i.set_data_from_numpy(self.X)
        r = self.grpc.infer("scores", [i], outputs=[
            grpcclient.InferRequestedOutput("output0", class_count=3)])
        self.assertEqual(r.get_output("output0").datatype, "BYTES")
        self.assertEqual(r.as_numpy("output0").tolist(), self.TOP3)

    def test_more_classes_than_values_unbatched_integers_no_labels(self):
        i = grpcclient.InferInput("input0", [5], "INT32")
        i.set_data_from_numpy(np.array([3, -1, 7, 7, 0], np.int32))
        r = self.grpc.infer("counts", [i], outputs=[
            grpcclient.InferRequestedOutput("output0", class_count=9)])
        # All 5, largest first; equal values by index.
        self.assertEqual(r.as_numpy("output0").tolist(),
                         [b"7:2", b"7:3", b"3:0", b"0:4", b"-1:1"])
        # class_count 0 asks for the values themselves.
        r = self.grpc.infer("counts", [i], outputs=[
            grpcclient.InferRequestedOutput("output0", class_count=0)])
        self.assertEqual(r.as_numpy("output0").tolist(), [3, -1, 7, 7, 0])

    def test_bad_requests(self):
        i = httpclient.InferInput("input0", [1, 1], "BYTES")
        i.set_data_from_numpy(np.array([[b"a"]], np.object_))
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("texts", [i], outputs=[
                httpclient.InferRequestedOutput("output0", class_count=2)])
        self.assertEqual(e.exception.status(), "400")
        self.assertIn("class result not available for output due to unsupported type 'BYTES'",
                      e.exception.message())
        body = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 6],
                                       "data": [0] * 6}],
                           "outputs": [{"name": "output0",
                                        "parameters": {"classification": -1}}]}).encode()
        status, _, reply = raw_post(self.server.http_port, "/v2/models/scores/infer", body, {})
        self.assertEqual(status, 400)
        self.assertIn("classification", json.loads(reply)["error"])
        self.assertIn("classification", self.http.get_server_metadata()["extensions"])

    def test_a_label_file_outside_the_model_folder_is_refused(self):
        config = self.http.get_model_config("scores")
        self.assertEqual(config["output"][0]["label_filename"], "labels.txt")
        with self.assertRaises(InferenceServerException) as e:
            self.http.load_model("scores", config=json.dumps(dict(
                config, output=[dict(config["output"][0], label_filename="../../etc/passwd")])))
        self.assertIn("label_filename '../../etc/passwd' must name a file in the model's folder",
                      e.exception.message())


class Logging(harness.unittest.TestCase):
    """Triton's logging extension: GET/POST /v2/logging and gRPC LogSettings read and change the
    server's log settings, and the log follows them."""

    DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "default"}

    def setUp(self):
        self.server = Server(EXAMPLE_REPOSITORY, "--model-control-mode", "explicit",
                             "--load-model", "identity").start()
        self.addCleanup(self.server.stop)
        self.http = httpclient.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
        self.addCleanup(self.http.close)
        self.grpc = grpcclient.InferenceServerClient(self.server.grpc_target)
        self.addCleanup(self.grpc.close)

    def grpc_settings(self, **changes):
        r = self.grpc.update_log_settings(changes) if changes else self.grpc.get_log_settings()
        return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in r.settings.items()}

    def test_get_and_update_over_http_and_grpc(self):
        self.assertEqual(self.http.get_log_settings(), self.DEFAULTS)
        self.assertEqual(self.grpc_settings(), self.DEFAULTS)
        got = self.http.update_log_settings({"log_verbose_level": 2, "log_info": False})
        self.assertEqual(got, dict(self.DEFAULTS, log_verbose_level=2, log_info=False))
        # Every field comes back, whichever were changed; gRPC sees the same settings.
        got = self.grpc_settings(log_format="ISO8601", log_info=True)
        self.assertEqual(got, dict(self.DEFAULTS, log_verbose_level=2, log_format="ISO8601"))
        self.assertEqual(self.http.get_log_settings()["log_format"], "ISO8601")

    def test_bad_settings_change_nothing(self):
        for changes, fragment in (({"log_verbose_level": -1}, "log_verbose_level"),
                                  ({"log_format": "json"}, "\"default\" or \"ISO8601\""),
                                  ({"log_info": "yes"}, "log_info"),
                                  ({"log_file": "/tmp/x.log"}, "log_file"),
                                  ({"log_info": False, "log_colour": 1}, "log_colour")):
            with self.assertRaises(InferenceServerException) as e:
                self.http.update_log_settings(changes)
            self.assertEqual(e.exception.status(), "400", changes)
            self.assertIn(fragment, e.exception.message(), changes)
        self.assertEqual(self.http.get_log_settings(), self.DEFAULTS)
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.update_log_settings({"log_format": "json"})
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        status, _, reply = raw_post(self.server.http_port, "/v2/logging", b"[1]", {})
        self.assertEqual(status, 400, reply)

    def test_the_log_follows_the_settings(self):
        # ISO8601: each line dated (UTC) and lettered with its level.
        self.http.update_log_settings({"log_format": "ISO8601"})
        self.http.load_model("slow")
        line = self.server.wait_line(r"model 'slow' version 1: READY")
        self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I asyncinfer serve: model ")
        # Info off: a load's READY line is not written, its warning is (W).
        self.http.update_log_settings({"log_info": False})
        start = len(self.server.lines)
        config = self.http.get_model_config("slow")
        config["metric_tags"] = {"team": "x"}  # ignored: a warning
        self.http.load_model("slow", config=json.dumps(config))
        line = self.server.wait_line(r"W asyncinfer serve: model 'slow': warning: .*metric_tags")
        self.assertEqual([l for l in self.server.lines[start:] if "READY" in l], [])
        # Back on, in the default format: as asyncinfer always wrote its lines.
        self.http.update_log_settings({"log_info": True, "log_format": "default"})
        self.http.unload_model("slow")
        self.server.wait_line(r"^asyncinfer serve: model 'slow': unloaded$")


class RestrictedApis(harness.unittest.TestCase):
    """Triton's limited endpoint access: --http-restricted-api and --grpc-restricted-protocol
    groups of API categories that answer only a request with their shared-secret header, in
    Triton's words; the other categories stay open."""

    @classmethod
    def setUpClass(cls):
        serve(cls, EXAMPLE_REPOSITORY,
              "--http-restricted-api", "model-repository,logging:admin-key=admin-value",
              "--http-restricted-api", "inference:infer-key=infer-value",
              "--grpc-restricted-protocol", "inference,health:infer-key=infer-value",
              "--grpc-restricted-protocol", "model-repository:Admin-Key=admin-value")

    def test_http(self):
        with self.assertRaises(InferenceServerException) as e:
            self.http.get_model_repository_index()
        self.assertEqual(e.exception.status(), "403")
        self.assertIn("This API is restricted, expecting header 'admin-key'",
                      e.exception.message())
        for wrong in ({"admin-key": "admin-valuE"}, {"admin-key": ""}, {"infer-key": "admin-value"}):
            with self.assertRaises(InferenceServerException):
                self.http.get_log_settings(headers=wrong)
        self.assertTrue(self.http.get_model_repository_index(headers={"admin-key": "admin-value"}))
        self.assertEqual(self.http.get_log_settings(headers={"admin-key": "admin-value"})[
            "log_format"], "default")
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("identity", [http_input(X, True)])
        self.assertEqual(e.exception.status(), "403")
        r = self.http.infer("identity", [http_input(X, True)],
                            headers={"infer-key": "infer-value"})
        np.testing.assert_array_equal(r.as_numpy("output0"), X)
        # Open categories answer without a header.
        self.assertTrue(self.http.is_server_ready())
        self.assertEqual(self.http.get_model_metadata("identity")["name"], "identity")
        self.http.get_inference_statistics("identity")

    def test_grpc(self):
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("identity", [grpc_input(X)])
        self.assertEqual(e.exception.status(), "StatusCode.UNAVAILABLE")
        self.assertIn("This protocol is restricted, expecting header "
                      "'triton-grpc-protocol-infer-key'", e.exception.message())
        infer = {"triton-grpc-protocol-infer-key": "infer-value"}
        r = self.grpc.infer("identity", [grpc_input(X)], headers=infer)
        np.testing.assert_array_equal(r.as_numpy("output0"), X)
        with self.assertRaises(InferenceServerException):
            self.grpc.is_server_live()
        self.assertTrue(self.grpc.is_server_live(headers=infer))
        # The key is matched lower case (gRPC metadata keys are).
        with self.assertRaises(InferenceServerException):
            self.grpc.get_model_repository_index(headers=infer)
        self.grpc.get_model_repository_index(
            headers={"triton-grpc-protocol-admin-key": "admin-value"})
        self.assertEqual(self.grpc.get_model_metadata("identity").name, "identity")
        # A stream is refused at its start, and runs with the header.
        results = Collector()
        self.grpc.start_stream(callback=results)
        try:  # the stream may have ended already: the client then refuses to send
            self.grpc.async_stream_infer("identity", [grpc_input(X)])
        except InferenceServerException:
            pass
        [(result, error)] = results.take(1)
        self.assertIsNone(result)
        self.assertIn("This protocol is restricted", str(error))
        self.grpc.stop_stream()
        results = Collector()
        self.grpc.start_stream(callback=results, headers=infer)
        self.grpc.async_stream_infer("identity", [grpc_input(X)])
        [(result, error)] = results.take(1)
        self.assertIsNone(error)
        np.testing.assert_array_equal(result.as_numpy("output0"), X)
        self.grpc.stop_stream()

    def test_bad_groups_are_refused_at_start(self):
        for args, fragment in ((["--http-restricted-api", "inference"], "expected <api>"),
                               (["--http-restricted-api", "infer:k=v"], "unknown API 'infer'"),
                               (["--grpc-restricted-protocol", "health:=v"], "the key is empty"),
                               (["--http-restricted-api", "health:a=1",
                                 "--http-restricted-api", "health,trace:b=2"],
                                "'health' is already in another group")):
            out = subprocess.run([ARGS.cli, "serve", "--model-repository", EXAMPLE_REPOSITORY,
                                  "--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1"]
                                 + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn(fragment, out.stderr)

if __name__ == "__main__":
    harness.parse_args()
    harness.unittest.main(verbosity=2)
