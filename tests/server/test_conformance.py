"""Protocol conformance of `asyncinfer serve` with curl, Python requests, and a client written
from the protocol documents (oip_client.py): every endpoint, JSON and binary inference, id
echo, output selection, nested and flat data, each datatype, errors with the right status, and
the Prometheus metrics read back by a real parser (python3-prometheus-client)."""

import json
import math
import os
import shutil
import socket
import struct
import subprocess

import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
import oip_client
from harness import EXAMPLE_REPOSITORY, Repository, Server, builtin_config

# OIP datatype → (config type, builtin dtype, values exercising its range).
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
    "FP32": ("TYPE_FP32", "f32", [0.1, -2.5, 3.0e38, 1.0e-30]),
    "FP64": ("TYPE_FP64", "f64", [0.1, -2.5, 1.0e300, 5e-324]),
    "FP16": ("TYPE_FP16", "f16", [0.5, -2.0, 65504.0, 0.0]),
    "BF16": ("TYPE_BF16", "bf16", None),
}


def model_name(dt):
    return "types_" + dt.lower()


def make_repository():
    repo = Repository()
    shutil.copytree(os.path.join(EXAMPLE_REPOSITORY, "identity"), os.path.join(repo.path, "identity"))
    for dt, (ctype, short, _) in TYPES.items():
        repo.add(model_name(dt), builtin_config(
            model_name(dt), "builtin:identity?dtype=%s&shape=4&max_batch=4" % short,
            [("input0", ctype, [4])], [("output0", ctype, [4])], max_batch_size=4))
    repo.add("two", builtin_config(
        "two", "builtin:identity?inputs=2&shape=3&max_batch=4",
        [("input0", "TYPE_FP32", [3]), ("input1", "TYPE_FP32", [3])],
        [("output0", "TYPE_FP32", [3]), ("output1", "TYPE_FP32", [3])], max_batch_size=4))
    repo.add("single", builtin_config(
        "single", "builtin:identity?shape=2x3&max_batch=0", [("input0", "TYPE_FP32", [2, 3])],
        [("output0", "TYPE_FP32", [2, 3])], max_batch_size=0))
    # Raw binary requests with Triton's rules (qa/L0_http/http_test.py's models, as built-ins).
    repo.add("raw_float32", builtin_config(
        "raw_float32", "builtin:identity?shape=-1&max_batch=8", [("input0", "TYPE_FP32", [-1])],
        [("output0", "TYPE_FP32", [-1])], max_batch_size=8))
    repo.add("raw_object_1_element", builtin_config(
        "raw_object_1_element", "builtin:identity?dtype=bytes&shape=1&max_batch=8",
        [("input0", "TYPE_STRING", [1])], [("output0", "TYPE_STRING", [1])], max_batch_size=8))
    repo.add("raw_object", builtin_config(
        "raw_object", "builtin:identity?dtype=bytes&shape=-1&max_batch=8",
        [("input0", "TYPE_STRING", [-1])], [("output0", "TYPE_STRING", [-1])], max_batch_size=8))
    repo.add("raw_float16", builtin_config(
        "raw_float16", "builtin:identity?dtype=f16&shape=-1x-1&max_batch=0",
        [("input0", "TYPE_FP16", [-1, -1])], [("output0", "TYPE_FP16", [-1, -1])],
        max_batch_size=0))
    return repo


def f32(values):
    """Values as FP32 holds them."""
    return list(struct.unpack("<%df" % len(values), struct.pack("<%df" % len(values), *values)))


class Conformance(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = make_repository()
        cls.server = Server(cls.repo.path).start()
        cls.url = cls.server.url
        cls.http = requests.Session()
        cls.client = oip_client.Client(cls.url)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.repo.cleanup()

    def post_json(self, path, body, **kw):
        return self.http.post(self.url + path, data=json.dumps(body), timeout=30, **kw)

    def assert_error(self, r, status, contains=""):
        self.assertEqual(r.status_code, status, r.text)
        body = r.json()
        self.assertEqual(list(body.keys()), ["error"])
        self.assertIn(contains, body["error"])

    # ---- endpoints ---------------------------------------------------------------------------

    def test_server_metadata(self):
        r = self.http.get(self.url + "/v2")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.headers["Content-Type"], "application/json")
        j = r.json()
        self.assertEqual(j["name"], "asyncinfer")
        self.assertTrue(j["version"])
        self.assertIn("binary_tensor_data", j["extensions"])

    def test_health(self):
        for path in ("/v2/health/live", "/v2/health/ready"):
            r = self.http.get(self.url + path)
            self.assertEqual(r.status_code, 200, path)
            self.assertEqual(r.content, b"", path)  # Triton sends an empty body
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())

    def test_model_metadata(self):
        j = self.client.model_metadata("identity")
        self.assertEqual(j["name"], "identity")
        self.assertEqual(j["versions"], ["1", "2"])
        self.assertEqual(j["platform"], "asyncinfer_builtin")
        self.assertEqual(j["inputs"], [{"name": "input0", "datatype": "FP32", "shape": [-1, 16]}])
        self.assertEqual(j["outputs"], [{"name": "output0", "datatype": "FP32", "shape": [-1, 16]}])
        self.assertEqual(self.client.model_metadata("identity", 1)["versions"], ["1"])
        self.assertEqual(self.client.model_metadata("single")["inputs"][0]["shape"], [2, 3])
        self.assert_error(self.http.get(self.url + "/v2/models/nope"), 404, "Request for unknown model: 'nope' is not found")
        self.assert_error(self.http.get(self.url + "/v2/models/identity/versions/7"), 404,
                          "version 7 is not found")
        self.assert_error(self.http.get(self.url + "/v2/models/identity/versions/x"), 400,
                          "failed to get model version from specified version string 'x'")

    def test_model_ready(self):
        self.assertTrue(self.client.is_model_ready("identity"))
        self.assertTrue(self.client.is_model_ready("identity", 1))
        r = self.http.get(self.url + "/v2/models/identity/ready")
        self.assertEqual((r.status_code, r.content), (200, b""))
        self.assert_error(self.http.get(self.url + "/v2/models/identity/versions/3/ready"), 404)
        self.assert_error(self.http.get(self.url + "/v2/models/nope/ready"), 404)

    def test_repository_index(self):
        r = self.http.post(self.url + "/v2/repository/index")
        self.assertEqual(r.status_code, 200)
        entries = {(e["name"], e.get("version")): e["state"] for e in r.json()}
        self.assertEqual(entries[("identity", "1")], "READY")
        self.assertEqual(entries[("identity", "2")], "READY")
        self.assertEqual(len(entries), 2 + len(TYPES) + 2 + 4)  # + the 4 raw_* models
        r = self.post_json("/v2/repository/index", {"ready": True})
        self.assertEqual(len(r.json()), 2 + len(TYPES) + 2 + 4)

    def test_unknown_endpoints_and_methods(self):
        self.assert_error(self.http.get(self.url + "/v3"), 404, "unknown endpoint")
        self.assert_error(self.http.get(self.url + "/v2/models/identity/explain"), 404)
        r = self.http.post(self.url + "/v2/health/live")
        self.assert_error(r, 405, "not allowed")
        self.assertEqual(r.headers["Allow"], "GET")
        self.assert_error(self.http.get(self.url + "/v2/models/identity/infer"), 405)

    # ---- JSON inference ----------------------------------------------------------------------

    def test_infer_json_flat_nested_id_versions(self):
        values = [float(i) + 0.25 for i in range(32)]
        flat = {"id": "req-17", "inputs": [
            {"name": "input0", "shape": [2, 16], "datatype": "FP32", "data": values}]}
        nested = {"inputs": [{"name": "input0", "shape": [2, 16], "datatype": "FP32",
                              "data": [values[:16], values[16:]]}]}
        r = self.post_json("/v2/models/identity/infer", flat)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.headers["Content-Type"], "application/json")
        j = r.json()
        self.assertEqual(j["model_name"], "identity")
        self.assertEqual(j["model_version"], "2")  # the highest version is the default
        self.assertEqual(j["id"], "req-17")
        self.assertEqual(j["outputs"], [{"name": "output0", "datatype": "FP32", "shape": [2, 16],
                                         "data": values}])
        r = self.post_json("/v2/models/identity/versions/1/infer", nested)
        j = r.json()
        self.assertEqual(j["model_version"], "1")
        self.assertNotIn("id", j)  # echoed only when given
        self.assertEqual(j["outputs"][0]["data"], values)

    def test_parameters_are_accepted(self):
        body = {"id": "p", "parameters": {"timeout": 5000000, "priority": 1, "custom": "x",
                                          "flag": True, "ratio": 0.5},
                "inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                            "parameters": {"note": "ignored"}, "data": [0] * 16}],
                "outputs": [{"name": "output0", "parameters": {"binary_data": False}}]}
        r = self.post_json("/v2/models/identity/infer", body)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["outputs"][0]["data"], [0] * 16)
        for params, text in (({"timeout": "soon"}, "timeout"), ({"timeout": -1}, "timeout"),
                             ({"priority": 9}, "priority"), ({"priority": 1.5}, "priority"),
                             ({"binary_data_output": "yes"}, "binary_data_output")):
            bad = dict(body, parameters=params)
            self.assert_error(self.post_json("/v2/models/identity/infer", bad), 400, text)

    def test_output_selection(self):
        body = {"inputs": [
            {"name": "input0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "input1", "shape": [1, 3], "datatype": "FP32", "data": [4, 5, 6]}]}
        j = self.post_json("/v2/models/two/infer", body).json()
        self.assertEqual([o["name"] for o in j["outputs"]], ["output0", "output1"])
        one = dict(body, outputs=[{"name": "output1"}])
        j = self.post_json("/v2/models/two/infer", one).json()
        self.assertEqual([(o["name"], o["data"]) for o in j["outputs"]], [("output1", [4, 5, 6])])
        both = dict(body, outputs=[{"name": "output1"}, {"name": "output0"}])
        j = self.post_json("/v2/models/two/infer", both).json()
        self.assertEqual([o["name"] for o in j["outputs"]], ["output1", "output0"])

    def test_each_datatype_json(self):
        for dt, (_, _, values) in TYPES.items():
            if dt in ("FP16", "BF16"):
                continue
            with self.subTest(dt=dt):
                body = {"inputs": [{"name": "input0", "shape": [1, 4], "datatype": dt,
                                    "data": values}]}
                r = self.post_json("/v2/models/%s/infer" % model_name(dt), body)
                self.assertEqual(r.status_code, 200, r.text)
                out = r.json()["outputs"][0]
                self.assertEqual(out["datatype"], dt)
                if dt == "FP32":  # the shortest text of each FP32 value reads back to it
                    self.assertEqual(f32(out["data"]), f32(values))
                    self.assertEqual(out["data"], [0.1, -2.5, 3e38, 1e-30])
                else:
                    self.assertEqual(out["data"], values)

    def test_each_datatype_binary(self):
        for dt, (_, _, values) in TYPES.items():
            with self.subTest(dt=dt):
                if dt == "BF16":
                    raw = bytes([0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40, 0x00, 0x00])  # 1, -2, 3.14, 0
                    inp = oip_client.InferInput("input0", [1, 4], dt, raw=raw)
                else:
                    inp = oip_client.InferInput("input0", [1, 4], dt, values)
                res = self.client.infer(model_name(dt), [inp])
                self.assertEqual(res.output("output0")["datatype"], dt)
                self.assertEqual(res.output("output0")["shape"], [1, 4])
                self.assertEqual(res.raw("output0"), inp.raw)

    def test_half_types_have_no_json_form(self):
        body = {"inputs": [{"name": "input0", "shape": [1, 4], "datatype": "FP16",
                            "data": [1, 2, 3, 4]}]}
        self.assert_error(self.post_json("/v2/models/types_fp16/infer", body), 400,
                          "no JSON form")
        # Binary in, but JSON out asked for: refused before anything runs.
        inp = oip_client.InferInput("input0", [1, 4], "FP16", [1.0, 2.0, 3.0, 4.0])
        with self.assertRaises(oip_client.ServerError) as e:
            self.client.infer("types_fp16", [inp], binary_output=False)
        self.assertEqual(e.exception.status, 400)
        self.assertIn("binary", e.exception.message)

    def test_bytes_to_an_fp32_model_is_refused(self):
        # BYTES itself works (test_tritonclient_bytes.py); an FP32 input does not take it.
        body = {"inputs": [{"name": "input0", "shape": [1, 4], "datatype": "BYTES",
                            "data": ["a", "b", "c", "d"]}]}
        self.assert_error(self.post_json("/v2/models/identity/infer", body), 400,
                          "datatype BYTES does not match the model's FP32")

    # ---- binary extension ----------------------------------------------------------------------

    def test_binary_like_tritonclient(self):
        values = [i / 7.0 for i in range(32)]
        inp = oip_client.InferInput("input0", [2, 16], "FP32", values)
        res = self.client.infer("identity", [inp], request_id="bin-1")
        self.assertEqual(res.header["id"], "bin-1")
        self.assertEqual(res.as_list("output0"), f32(values))
        # Mixed: binary input, JSON output.
        res = self.client.infer("identity", [inp], outputs=["output0"], binary_output=False)
        self.assertEqual(f32(res.header["outputs"][0]["data"]), f32(values))
        # Two binary inputs in tensor order; one output in binary, the other in JSON.
        a = oip_client.InferInput("input0", [1, 3], "FP32", [1, 2, 3])
        b = oip_client.InferInput("input1", [1, 3], "FP32", [4, 5, 6])
        header = json.dumps({"inputs": [
            {"name": "input1", "shape": [1, 3], "datatype": "FP32",
             "parameters": {"binary_data_size": 12}},
            {"name": "input0", "shape": [1, 3], "datatype": "FP32",
             "parameters": {"binary_data_size": 12}}],
            "outputs": [{"name": "output0", "parameters": {"binary_data": True}},
                        {"name": "output1"}]}).encode()
        r = self.http.post(self.url + "/v2/models/two/infer", data=header + b.raw + a.raw,
                           headers={"Inference-Header-Content-Length": str(len(header))})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.headers["Content-Type"], "application/octet-stream")
        res = oip_client.Client.parse_response(r.headers, r.content)
        self.assertEqual(res.as_list("output0"), [1, 2, 3])
        self.assertEqual(res.header["outputs"][1]["data"], [4, 5, 6])

    def test_raw_body_single_input(self):
        # Inference-Header-Content-Length: 0 — the body is the only input's bytes.
        raw = struct.pack("<6f", *range(6))
        r = self.http.post(self.url + "/v2/models/single/infer", data=raw,
                           headers={"Inference-Header-Content-Length": "0"})
        self.assertEqual(r.status_code, 200, r.text)
        res = oip_client.Client.parse_response(r.headers, r.content)
        self.assertEqual(res.output("output0")["shape"], [2, 3])
        self.assertEqual(res.raw("output0"), raw)

    def test_raw_body_with_tritons_rules(self):
        """Triton's raw binary requests (core's InferenceRequest::Normalize, checked by its
        qa/L0_http/http_test.py): a batched model gets a batch of 1 and its one variable dim
        from the size; a BYTES input of shape [1] takes the body as its one element; Triton's
        messages for the requests it refuses."""
        def raw(model, body, extra=None):
            headers = {"Inference-Header-Content-Length": "0"}
            headers.update(extra or {})
            return self.http.post(self.url + "/v2/models/%s/infer" % model, data=body,
                                  headers=headers)

        for n in (8, 32):
            body = struct.pack("<%df" % n, *range(n))
            r = raw("raw_float32", body)
            self.assertEqual(r.status_code, 200, r.text)
            res = oip_client.Client.parse_response(r.headers, r.content)
            self.assertEqual(res.output("output0")["shape"], [1, n])
            self.assertEqual(r.content[int(r.headers["Inference-Header-Content-Length"]):], body)
        # Chunked by the client: the same request.
        body = struct.pack("<8f", *range(8))
        r = raw("raw_float32", iter([body[:10], body[10:]]))
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.content[int(r.headers["Inference-Header-Content-Length"]):], body)
        r = raw("raw_object_1_element", b"427")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.content[int(r.headers["Inference-Header-Content-Length"]) + 4:],
                         b"427")
        self.assert_error(raw("raw_object", b"427"), 400,
                          "For BYTE datatype raw input 'input0', the model must have input "
                          "shape [1]")
        self.assert_error(raw("raw_float16", b"\0" * 8), 400,
                          "The shape of the raw input 'input0' can not be deduced because there "
                          "are more than one variable-sized dimension")
        self.assert_error(raw("two", b"\0" * 24), 400,
                          "Raw request must only have 1 input (found 1) to be deduced but got 2 "
                          "inputs in 'two' model configuration")
        self.assert_error(raw("single", b"\0" * 20), 400,
                          "input byte size mismatch for input 'input0' for model 'single'. "
                          "Expected 24, got 20")
        self.assert_error(raw("raw_float32", b"\0" * 6), 400, "input byte size mismatch")

    # ---- curl and the connection ---------------------------------------------------------------

    def test_curl(self):
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                              self.url + "/v2/health/ready"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.stdout, "200")
        body = json.dumps({"id": "curl", "inputs": [{"name": "input0", "shape": [1, 16],
                                                     "datatype": "FP32", "data": list(range(16))}]})
        out = subprocess.run(["curl", "-s", "-X", "POST", "-H", "Content-Type: application/json",
                              "-d", body, self.url + "/v2/models/identity/infer"],
                             capture_output=True, text=True, timeout=30)
        j = json.loads(out.stdout)
        self.assertEqual(j["id"], "curl")
        self.assertEqual(j["outputs"][0]["data"], list(range(16)))
        # A large body: curl sends Expect: 100-continue and waits for it.
        big = json.dumps({"inputs": [{"name": "input0", "shape": [8, 16], "datatype": "FP32",
                                      "data": [1.5] * 128}]})
        out = subprocess.run(["curl", "-s", "-v", "-X", "POST", "--data-binary", "@-",
                              self.url + "/v2/models/identity/infer"], input=big * 1,
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(json.loads(out.stdout)["outputs"][0]["data"], [1.5] * 128)
        curl_errors = subprocess.run(["curl", "-s", "-w", " %{http_code}",
                                      self.url + "/v2/models/nope"], capture_output=True,
                                     text=True, timeout=30)
        self.assertTrue(curl_errors.stdout.endswith(" 404"), curl_errors.stdout)

    def test_keep_alive_and_pipelining(self):
        def request(i):
            body = json.dumps({"id": "pipe-%d" % i, "inputs": [
                {"name": "input0", "shape": [1, 16], "datatype": "FP32", "data": [i] * 16}]})
            return ("POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                    "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode()
        s = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10)
        f = s.makefile("rb")
        try:
            s.sendall(b"".join(request(i) for i in range(5)))  # all at once: pipelined
            for i in range(5):
                status = f.readline()
                self.assertTrue(status.startswith(b"HTTP/1.1 200"), status)
                length = None
                while True:
                    line = f.readline().strip()
                    if not line:
                        break
                    k, v = line.split(b":", 1)
                    if k.lower() == b"content-length":
                        length = int(v)
                    if k.lower() == b"connection":
                        self.assertNotEqual(v.strip().lower(), b"close")
                self.assertEqual(json.loads(f.read(length))["id"], "pipe-%d" % i)
            s.sendall(request(9))  # the same connection serves on
            self.assertTrue(f.readline().startswith(b"HTTP/1.1 200"))
        finally:
            f.close()
            s.close()

    def test_bench_http_mode(self):
        # `asyncinfer bench --url`: closed loop (JSON) and open loop (binary) against this server.
        url = self.url + "/v2/models/identity/infer"
        for args, mode in ((["--concurrency", "4", "--requests", "300"], "closed loop"),
                           (["--mode", "rate", "--request-rate", "2000", "--requests", "200",
                             "--binary"], "rate")):
            out = subprocess.run([harness.ARGS.cli, "bench", "--url", url, "--warmup-s", "0"] + args,
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("http %s %s" % (mode, url), out.stdout)
            self.assertRegex(out.stdout, r"throughput +[0-9.]+ req/s \((3|2)\d\d ok")
            self.assertRegex(out.stdout, r"latency us +p50 [0-9.]+ +p90")
            self.assertNotIn("failures", out.stdout)
        bad = subprocess.run([harness.ARGS.cli, "bench", "--url", self.url + "/v2/models/nope/infer"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("HTTP 404", bad.stderr)

    # ---- metrics -------------------------------------------------------------------------------

    def test_metrics(self):
        body = {"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                            "data": [1] * 16}]}
        for _ in range(3):
            self.assertEqual(self.post_json("/v2/models/identity/versions/1/infer", body).status_code,
                             200)
        self.post_json("/v2/models/nope/infer", body)
        r = requests.get(self.server.metrics_url, timeout=30)
        self.assertEqual(r.status_code, 200)
        self.assertTrue(r.headers["Content-Type"].startswith("text/plain; version=0.0.4"))
        families = {f.name: f for f in text_string_to_metric_families(r.text)}

        def value(family, suffix="", **labels):
            for s in families[family].samples:
                # The parser names counter samples <family>_total.
                names = (family + suffix,) if suffix else (family, family + "_total")
                if s.name in names and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
            raise KeyError((family, labels))

        self.assertGreaterEqual(value("asyncinfer_inference_request_success", "",
                                      model="identity", version="1"), 3)
        self.assertGreaterEqual(value("asyncinfer_inference_request_duration_us", "_count",
                                      model="identity", version="1"), 3)
        self.assertEqual(families["asyncinfer_inference_queue_duration_us"].type, "histogram")
        self.assertEqual(value("asyncinfer_model_ready", model="types_fp16", version="1"), 1)
        self.assertEqual(value("asyncinfer_server_ready"), 1)
        self.assertGreaterEqual(value("asyncinfer_http_requests", status_class="2xx"), 3)
        self.assertGreaterEqual(value("asyncinfer_http_requests", status_class="4xx"), 1)
        self.assertGreaterEqual(value("asyncinfer_http_active_connections"), 1)
        self.assertGreaterEqual(value("asyncinfer_http_infer_duration_us", "_count"), 3)
        self.assertEqual(requests.get(self.server.metrics_url.replace("/metrics", "/x")).status_code,
                         404)


if __name__ == "__main__":
    harness.main()
