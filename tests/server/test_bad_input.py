"""Bad input to `asyncinfer serve` (issue 16, "Bad input"): each case gets a clear 4xx with
{"error": ...}; after each one a connection opened before it still serves, and at the end the
counters show that every accepted request ended (nothing accepted was lost)."""

import json
import resource
import socket
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import EXAMPLE_REPOSITORY, Server, http_status, raw_request

GOOD = {"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16}]}
INFER = "/v2/models/identity/infer"


def infer_bytes(body, extra_headers="", content_length=None):
    if isinstance(body, str):
        body = body.encode()
    n = len(body) if content_length is None else content_length
    return ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n"
            % (INFER, n, extra_headers)).encode() + body


def counter(metrics_text, family, **labels):
    for f in text_string_to_metric_families(metrics_text):
        if f.name != family:
            continue
        for s in f.samples:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


class BadInput(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        cls.server = Server(EXAMPLE_REPOSITORY, "--header-timeout", "1", "--body-timeout", "1",
                            "--idle-timeout", "60").start()
        cls.url = cls.server.url
        # The connection that must stay unaffected by every bad request.
        cls.sentinel = requests.Session()
        cls.good_requests = 0
        cls.check_sentinel()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    @classmethod
    def check_sentinel(cls):
        r = cls.sentinel.post(cls.url + INFER, data=json.dumps(GOOD), timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [1] * 16
        cls.good_requests += 1

    def bad(self, status, contains, body=None, path=INFER, headers=None, method="POST"):
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        r = requests.request(method, self.url + path, data=data, headers=headers or {}, timeout=10)
        self.assertEqual(r.status_code, status, r.text)
        j = r.json()
        self.assertEqual(list(j), ["error"], r.text)
        self.assertIn(contains, j["error"])
        self.check_sentinel()
        return j["error"]

    def with_input(self, **fields):
        inp = dict(GOOD["inputs"][0], **fields)
        return {"inputs": [inp]}

    # ---- JSON --------------------------------------------------------------------------------

    def test_malformed_json(self):
        self.bad(400, "malformed JSON", '{"inputs": [ {"name": "input0", ')
        self.bad(400, "malformed JSON", '{"inputs": []} trailing')

    def test_not_json(self):
        self.bad(400, "malformed JSON", b"\x00\x01binary garbage")
        self.bad(400, "empty request body", b"")
        self.bad(400, "must be a JSON object", "[1, 2, 3]")
        self.bad(400, "\"inputs\" is missing", "{}")

    def test_nested_1000_deep(self):
        self.bad(400, "nested deeper than 64", "[" * 1000 + "]" * 1000)
        deep = {"inputs": [dict(GOOD["inputs"][0], data=json.loads("[" * 500 + "1" + "]" * 500))]}
        self.bad(400, "nested deeper than 64", deep)

    # ---- shapes ------------------------------------------------------------------------------

    def test_negative_dims(self):
        self.bad(400, "negative dim", self.with_input(shape=[-1, 16]))

    def test_zero_length_shape(self):
        self.bad(400, "has 0 dims, the model expects 2", self.with_input(shape=[], data=[1]))

    def test_zero_batch(self):
        self.bad(400, "batch dim (dim 0) is 0", self.with_input(shape=[0, 16], data=[]))

    def test_shape_overflows_64_bits(self):
        body = self.with_input(shape=[2 ** 62, 16])
        self.bad(400, "too large", body)
        self.bad(400, "too large", self.with_input(shape=[2 ** 64 + 5, 16]))

    def test_shape_over_max_batch(self):
        self.bad(400, "exceeds the model's max_batch_size 8", self.with_input(
            shape=[9, 16], data=[0] * 144))

    def test_fixed_dim_mismatch(self):
        self.bad(400, "does not match the model's [-1,16]", self.with_input(shape=[1, 15],
                                                                            data=[0] * 15))

    # ---- data --------------------------------------------------------------------------------

    def test_data_wrong_length(self):
        self.bad(400, "\"data\" has 15 elements, shape [1,16] needs 16",
                 self.with_input(data=[1] * 15))
        # The parse stops at the first element past the declared count (issue 23).
        self.bad(400, "\"data\" has more than 16 elements, shape [1,16] needs 16",
                 self.with_input(data=[[1] * 16, [2]]))

    def test_data_wrong_types(self):
        self.bad(400, "data element 3 is a string; FP32 needs a number",
                 self.with_input(data=[1, 2, 3, "four"] + [0] * 12))
        self.bad(400, "data element 0 is null", self.with_input(data=[None] + [0] * 15))
        self.bad(400, "data element 1 is an object", self.with_input(data=[0, {}] + [0] * 14))

    def test_floats_in_int32_and_out_of_range(self):
        # The types_* models live in the conformance repository; here the mismatch is enough.
        self.bad(400, "datatype INT32 does not match the model's FP32",
                 self.with_input(datatype="INT32", data=[1.5] * 16))
        self.bad(400, "out of range for FP32", self.with_input(data=[1e39] + [0] * 15))

    # ---- names -------------------------------------------------------------------------------

    def test_unknown_model_version_input_output(self):
        self.bad(404, "Request for unknown model: 'nope' is not found", GOOD, path="/v2/models/nope/infer")
        self.bad(404, "version 5 is not found", GOOD, path="/v2/models/identity/versions/5/infer")
        self.bad(400, "unexpected inference input 'x' for model 'identity' (inputs: input0)",
                 self.with_input(name="x"))
        self.bad(400, "has no output 'y' (outputs: output0)",
                 dict(GOOD, outputs=[{"name": "y"}]))

    def test_missing_and_repeated_input(self):
        self.bad(400, "expected 1 inputs but got 0 inputs for model 'identity'. Got input(s) [], but "
                 "missing required input(s) ['input0']. Please provide all required input(s).",
                 {"inputs": []})
        self.bad(400, "input 'input0' is given twice",
                 {"inputs": [GOOD["inputs"][0], GOOD["inputs"][0]]})
        self.bad(400, "output 'output0' is requested twice",
                 dict(GOOD, outputs=[{"name": "output0"}, {"name": "output0"}]))

    def test_datatype_mismatch(self):
        self.bad(400, "datatype FP64 does not match the model's FP32",
                 self.with_input(datatype="FP64"))
        self.bad(400, "unknown datatype 'FLOAT'", self.with_input(datatype="FLOAT"))

    # ---- binary extension --------------------------------------------------------------------

    def test_header_length_larger_than_body(self):
        body = json.dumps(GOOD).encode()
        self.bad(400, "Inference-Header-Content-Length %d is larger than the body" % (len(body) + 1),
                 body, headers={"Inference-Header-Content-Length": str(len(body) + 1)})
        self.bad(400, "is not a non-negative integer", body,
                 headers={"Inference-Header-Content-Length": "-3"})

    def test_binary_size_larger_than_what_follows(self):
        header = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 64}}]}).encode()
        self.bad(400, "binary_data_size 64 is larger than the 10 bytes of binary data left",
                 header + b"x" * 10, headers={"Inference-Header-Content-Length": str(len(header))})
        self.bad(400, "does not match shape [1,16] of FP32 (64 bytes)",
                 header.replace(b"64", b"60") + b"x" * 60,
                 headers={"Inference-Header-Content-Length": str(len(header))})
        self.bad(400, "bytes of binary data follow the JSON", header + b"x" * 70,
                 headers={"Inference-Header-Content-Length": str(len(header))})

    # ---- HTTP framing and limits -------------------------------------------------------------

    def test_body_over_the_limit(self):
        # Refused from Content-Length alone, before any body byte is read (the 64 MB default).
        raw = raw_request(self.server.http_port, infer_bytes(b"", content_length=64 * 2 ** 20 + 1))
        self.assertEqual(http_status(raw), 413, raw)
        self.assertIn(b'{"error":"request body exceeds the maximum allowed value of 67108864 bytes"}',
                      raw)
        # A client that sends it anyway reads the answer, not a reset.
        r = requests.post(self.url + INFER, data=b"[" * (64 * 2 ** 20 + 10), timeout=30)
        self.assertEqual(r.status_code, 413)
        self.assertIn("maximum allowed value", r.json()["error"])
        self.check_sentinel()

    def test_header_over_the_limit(self):
        r = requests.post(self.url + INFER, data=json.dumps(GOOD), headers={"X-Big": "a" * 20000},
                          timeout=10)
        self.assertEqual(r.status_code, 431)
        self.assertIn("request header exceeds", r.json()["error"])
        self.check_sentinel()

    def test_content_length_lies(self):
        body = json.dumps(GOOD).encode()
        # Says less than is sent: the body is cut short (malformed JSON), then the rest is not
        # a request.
        raw = raw_request(self.server.http_port, infer_bytes(body, content_length=40))
        self.assertEqual(http_status(raw), 400, raw)
        self.assertIn(b'{"error":"malformed JSON', raw)
        # Says more than is sent: the body never completes; 408 once body_timeout (1 s) passes.
        start = time.monotonic()
        raw = raw_request(self.server.http_port, infer_bytes(body, content_length=len(body) + 50))
        self.assertEqual(http_status(raw), 408, raw)
        self.assertIn(b"request body not received within 1000 ms", raw)
        self.assertLess(time.monotonic() - start, 5)
        self.check_sentinel()

    def test_half_a_request_then_stall(self):
        start = time.monotonic()
        raw = raw_request(self.server.http_port, b"POST /v2/models/identity/infer HTTP/1.1\r\nHo")
        self.assertEqual(http_status(raw), 408, raw)
        self.assertIn(b"request header not received within 1000 ms", raw)
        self.assertLess(time.monotonic() - start, 5)
        self.check_sentinel()

    def test_transfer_encoding_other_than_chunked(self):
        # RFC 9112 §6.3: refused and the connection closed, never a body taken for the next
        # request (the smuggled GET below must not be answered).
        smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        raw = raw_request(self.server.http_port,
                          b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: gzip\r\n\r\n" + smuggled)
        self.assertEqual(http_status(raw), 400, raw)
        self.assertIn(b"Transfer-Encoding 'gzip' is not supported", raw)
        self.assertEqual(raw.count(b"HTTP/1.1 "), 1, raw)
        self.check_sentinel()

    def test_transfer_coding_before_chunked(self):
        # RFC 9112 §6.1: a transfer coding the server does not implement is 501 (gzip would
        # otherwise reach the decoder as the body).
        raw = raw_request(self.server.http_port,
                          b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        self.assertEqual(http_status(raw), 501, raw)
        self.assertIn(b"the transfer coding 'gzip' is not implemented", raw)
        self.check_sentinel()

    def test_host_header(self):
        # RFC 9112 §3.2: HTTP/1.1 needs exactly one Host; HTTP/1.0 may leave it out.
        raw = raw_request(self.server.http_port, b"GET /v2/health/ready HTTP/1.1\r\n\r\n")
        self.assertEqual(http_status(raw), 400, raw)
        self.assertIn(b"needs a Host header field", raw)
        raw = raw_request(self.server.http_port,
                          b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        self.assertEqual(http_status(raw), 400, raw)
        self.assertIn(b"more than one Host", raw)
        raw = raw_request(self.server.http_port, b"GET /v2/health/ready HTTP/1.0\r\n\r\n")
        self.assertEqual(http_status(raw), 200, raw)
        self.check_sentinel()

    def test_absolute_form_target_and_head(self):
        # RFC 9112 §3.2.2: a server accepts the absolute form (what a proxy sends).
        raw = raw_request(self.server.http_port,
                          b"GET http://127.0.0.1:%d/v2/models/identity?x=1 HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\n\r\n" % self.server.http_port)
        self.assertEqual(http_status(raw), 200, raw)
        self.assertIn(b'"name":"identity"', raw)
        # HEAD: GET's status and Content-Length, no body (RFC 9110 §9.3.2).
        get = requests.get(self.url + "/v2/models/identity", timeout=10)
        raw = raw_request(self.server.http_port, b"HEAD /v2/models/identity HTTP/1.1\r\n"
                          b"Host: x\r\nConnection: close\r\n\r\n")
        self.assertEqual(http_status(raw), 200, raw)
        self.assertIn(b"Content-Length: %d\r\n" % len(get.content), raw)
        self.assertTrue(raw.endswith(b"\r\n\r\n"), raw)
        raw = raw_request(self.server.http_port, b"HEAD /v2/models/identity/infer HTTP/1.1\r\n"
                          b"Host: x\r\nConnection: close\r\n\r\n")
        self.assertEqual(http_status(raw), 405, raw)
        self.check_sentinel()

    def test_inference_header_content_length_twice(self):
        body = json.dumps(GOOD).encode()
        raw = raw_request(self.server.http_port,
                          b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                          b"Inference-Header-Content-Length: %d\r\n"
                          b"Inference-Header-Content-Length: 3\r\n\r\n"
                          % (INFER.encode(), len(body), len(body)) + body)
        self.assertEqual(http_status(raw), 400, raw)
        self.assertIn(b"Inference-Header-Content-Length is given more than once", raw)
        self.check_sentinel()

    def test_malformed_http(self):
        raw = raw_request(self.server.http_port, b"NOT-HTTP\r\n\r\n")
        self.assertEqual(http_status(raw), 400, raw)
        self.assertIn(b"malformed HTTP request", raw)
        self.check_sentinel()

    def test_idle_connections_do_not_block_others(self):
        conns = []
        try:
            for _ in range(1000):
                conns.append(socket.create_connection(("127.0.0.1", self.server.http_port),
                                                      timeout=10))
            # Every one of them is open and the server goes on serving.
            deadline = time.monotonic() + 10
            while True:
                active = counter(requests.get(self.server.metrics_url, timeout=10).text,
                                 "asyncinfer_http_active_connections")
                if active >= 1000 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            self.assertGreaterEqual(active, 1000)
            start = time.monotonic()
            r = requests.post(self.url + INFER, data=json.dumps(GOOD), timeout=10)
            self.assertEqual(r.status_code, 200)
            type(self).good_requests += 1
            self.assertLess(time.monotonic() - start, 2)
            self.check_sentinel()
        finally:
            for c in conns:
                c.close()

    def test_zz_nothing_accepted_was_lost(self):
        # Runs last (unittest sorts by name). Every request the engine accepted ended, and
        # successfully: exactly the good requests this module sent.
        time.sleep(0.2)
        text = requests.get(self.server.metrics_url, timeout=10).text
        good = type(self).good_requests
        accepted = sum(counter(text, "asyncinfer_inference_request_accepted", model="identity",
                               version=v) for v in ("1", "2"))
        success = sum(counter(text, "asyncinfer_inference_request_success", model="identity",
                              version=v) for v in ("1", "2"))
        pending = sum(counter(text, "asyncinfer_inference_pending_request_count", model="identity",
                              version=v) for v in ("1", "2"))
        self.assertEqual(accepted, good)
        self.assertEqual(success, good)
        self.assertEqual(pending, 0)
        self.assertGreaterEqual(counter(text, "asyncinfer_http_requests", status_class="4xx"), 30)


if __name__ == "__main__":
    harness.main()
