"""Triton's trace extension on `asyncinfer serve`, through Triton's own Python client
(tritonclient's get_trace_settings / update_trace_settings, HTTP and gRPC): the settings, global
and per model, with Triton's clear-to-global semantics (the sequences of Triton's
qa/L0_trace/trace_endpoint_test.py), errors in Triton's words, the `trace` category of the
restricted APIs, triton mode's trace files (sampling by rate and count, log_frequency rotation,
the timestamps; generate and generate_stream traced as infer is; an ensemble's steps and a
python model's calls made with trace=request.trace() as child traces with parent_id), and
OpenTelemetry mode: spans exported over OTLP/HTTP to a receiver in this test (decoded by hand:
protobuf's wire format is small), under a client's W3C traceparent, children's model spans under
their parent's, and a collector that is down (requests still succeed).
"""

import http.client
import http.server
import json
import os
import queue
import shutil
import tempfile
import textwrap
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import builtin_config, free_port, wait_for
from harness import Repository, Server

X = np.arange(16, dtype=np.float32).reshape(1, 16)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def repository():
    """A repository with a model "simple" (an identity here; Triton's test only names it)."""
    return Repository().add("simple", builtin_config(
        "simple", "builtin:identity?shape=16&max_batch=8", [("input0", "TYPE_FP32", [16])],
        [("output0", "TYPE_FP32", [16])]))


def identity(name):
    return builtin_config(name, "builtin:identity?shape=16&max_batch=8",
                          [("input0", "TYPE_FP32", [16])], [("output0", "TYPE_FP32", [16])])


# Calls the model named by its input `target` with input0 and answers that model's output0:
# under this request's trace (trace=request.trace(), Triton's "Tracing for BLS models"), or, for
# a name that starts with "untraced:", without it.
BLS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "input0")
            target = pb_utils.get_input_tensor_by_name(r, "target").as_numpy().reshape(-1)[0]
            target = target.decode() if isinstance(target, bytes) else str(target)
            kwargs = {"trace": r.trace()}
            if target.startswith("untraced:"):
                target, kwargs = target[len("untraced:"):], {}
            resp = pb_utils.InferenceRequest(model_name=target, inputs=[x],
                                             requested_output_names=["output0"], **kwargs).exec()
            if resp.has_error():
                raise pb_utils.TritonModelException(resp.error().message())
            out.append(pb_utils.InferenceResponse(
                [pb_utils.get_output_tensor_by_name(resp, "output0")]))
        return out
'''


def composed_repository():
    """repository() and: "second" (an identity), "ens" (an ensemble: input0 -> simple -> second
    -> output0), "bls" (a python model that calls the model its input `target` names: BLS)."""
    repo = repository().add("second", identity("second"))
    repo.add("ens", 'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 8\n'
             'input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
             'output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
             'ensemble_scheduling { step [ '
             '{ model_name: "simple" model_version: -1 input_map { key: "input0" value: "input0" }'
             ' output_map { key: "output0" value: "mid" } }, '
             '{ model_name: "second" model_version: -1 input_map { key: "input0" value: "mid" }'
             ' output_map { key: "output0" value: "output0" } } ] }\n')
    repo.add("bls", 'name: "bls"\nbackend: "python"\nmax_batch_size: 8\n'
             'input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] }, '
             '{ name: "target", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
             'output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n')
    with open(os.path.join(repo.path, "bls", "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(BLS))
    return repo


def infer_model(client, model, target=None, headers=None):
    """An HTTP infer of X on `model` (with input `target` for "bls"); checks the answer."""
    i = httpclient.InferInput("input0", [1, 16], "FP32")
    i.set_data_from_numpy(X)
    inputs = [i]
    if target is not None:
        t = httpclient.InferInput("target", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[target]], dtype=np.object_))
        inputs.append(t)
    r = client.infer(model, inputs, headers=headers)
    np.testing.assert_array_equal(r.as_numpy("output0"), X)


def http_infer(client, headers=None):
    i = httpclient.InferInput("input0", [1, 16], "FP32")
    i.set_data_from_numpy(X)
    r = client.infer("simple", [i], headers=headers)
    np.testing.assert_array_equal(r.as_numpy("output0"), X)


def grpc_infer(client, headers=None):
    i = grpcclient.InferInput("input0", [1, 16], "FP32")
    i.set_data_from_numpy(X)
    r = client.infer("simple", [i], headers=headers)
    np.testing.assert_array_equal(r.as_numpy("output0"), X)


def grpc_settings(d):
    """A gRPC TraceSettingResponse as the dict HTTP answers (one value: a string)."""
    out = {}
    for k, v in d.settings.items():
        out[k] = list(v.value) if k == "trace_level" else (v.value[0] if v.value else "")
    return out


# ---- protobuf's wire format, enough for OTLP's ExportTraceServiceRequest ----------------------

def fields(buf):
    """(field number, value) of each field of a message: an int (varint, fixed64, fixed32) or
    bytes (length-delimited)."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wire == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % wire)
        yield num, v


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def key_value(buf):
    key, value = "", None
    for num, v in fields(buf):
        if num == 1:
            key = v.decode()
        elif num == 2:
            for n, x in fields(v):
                value = x.decode() if n == 1 else x
    return key, value


def decode_export(buf):
    """[(resource attributes dict, [span dict])] of an ExportTraceServiceRequest."""
    out = []
    for num, rs in fields(buf):
        if num != 1:
            continue
        resource, spans = {}, []
        for n, v in fields(rs):
            if n == 1:
                resource.update(key_value(a) for k, a in fields(v) if k == 1)
            elif n == 2:
                for k, s in fields(v):
                    if k == 2:
                        spans.append(decode_span(s))
        out.append((resource, spans))
    return out


def decode_span(buf):
    span = {"attributes": {}, "events": [], "parent_span_id": b""}
    names = {1: "trace_id", 2: "span_id", 4: "parent_span_id", 5: "name", 6: "kind",
             7: "start", 8: "end"}
    for num, v in fields(buf):
        if num == 9:
            k, x = key_value(v)
            span["attributes"][k] = x
        elif num == 11:
            e = dict(fields(v))
            span["events"].append((e[2].decode(), e[1]))
        elif num in names:
            span[names[num]] = v.decode() if num == 5 else v
    return span


class Receiver:
    """An OTLP/HTTP collector on a free loopback port: keeps each POST's body."""

    def __init__(self):
        self.posts = []
        self.content_types = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.content_types.append(self.headers["Content-Type"])
                owner.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self):
        out = []
        for _, body in list(self.posts):
            for resource, spans in decode_export(body):
                out += [dict(s, resource=resource) for s in spans]
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class TraceSettings(harness.unittest.TestCase):
    """Triton's trace_endpoint_test.py sequences (its server: --trace-config
    triton,file=global_unittest.log --trace-config level=TIMESTAMPS --trace-config rate=1)."""

    @classmethod
    def setUpClass(cls):
        cls.repo = repository()
        cls.addClassCleanup(cls.repo.cleanup)
        cls.dir = tempfile.mkdtemp(prefix="asyncinfer-trace-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.file = os.path.join(cls.dir, "global_unittest.log")
        cls.server = Server(cls.repo.path, "--trace-config", "triton,file=" + cls.file,
                            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1").start()
        cls.addClassCleanup(cls.server.stop)
        cls.http = httpclient.InferenceServerClient("127.0.0.1:%d" % cls.server.http_port)
        cls.addClassCleanup(cls.http.close)
        cls.grpc = grpcclient.InferenceServerClient(cls.server.grpc_target)
        cls.addClassCleanup(cls.grpc.close)

    def initial(self):
        return {"trace_file": self.file, "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}

    def tearDown(self):
        clear = {"trace_level": None, "trace_rate": None, "trace_count": None,
                 "log_frequency": None}
        self.http.update_trace_settings(model_name="simple", settings=clear)
        self.http.update_trace_settings(model_name=None, settings=clear)

    def test_get_settings(self):
        self.assertEqual(self.http.get_trace_settings(model_name="simple"), self.initial())
        self.assertEqual(self.http.get_trace_settings(), self.initial())
        self.assertEqual(grpc_settings(self.grpc.get_trace_settings(model_name="simple")),
                         self.initial())
        self.assertEqual(grpc_settings(self.grpc.get_trace_settings()), self.initial())
        for client in (self.http, self.grpc):
            with self.assertRaisesRegex(InferenceServerException,
                                        "Request for unknown model : does-not-exist"):
                client.get_trace_settings(model_name="does-not-exist")
            with self.assertRaisesRegex(InferenceServerException,
                                        "Request for unknown model : does-not-exist"):
                client.update_trace_settings(model_name="does-not-exist",
                                             settings={"trace_rate": "2"})

    def test_update_settings(self):
        for client, as_dict in ((self.http, dict), (self.grpc, grpc_settings)):
            with self.assertRaisesRegex(InferenceServerException,
                                        "trace file location can not be updated through "
                                        "network protocol"):
                client.update_trace_settings(model_name="simple",
                                             settings={"trace_file": "model.log"})
            self.assertEqual(as_dict(client.get_trace_settings(model_name="simple")),
                             self.initial())
            expected = dict(self.initial(), trace_level=["TIMESTAMPS", "TENSORS"])
            self.assertEqual(as_dict(client.update_trace_settings(
                settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})), expected)
            self.assertEqual(as_dict(client.get_trace_settings(model_name="simple")), expected)
            self.tearDown()

    def test_clear_settings(self):
        for client, as_dict in ((self.http, dict), (self.grpc, grpc_settings)):
            client.update_trace_settings(model_name="simple",
                                         settings={"trace_rate": "12", "log_frequency": "34"})
            client.update_trace_settings(
                settings={"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]})
            expected_global = dict(self.initial(), trace_level=["OFF"])
            self.assertEqual(as_dict(client.update_trace_settings(
                settings={"trace_rate": None, "trace_count": None})), expected_global)
            self.assertEqual(as_dict(client.get_trace_settings(model_name="simple")),
                             dict(expected_global, trace_rate="12", log_frequency="34"))
            self.assertEqual(as_dict(client.update_trace_settings(
                model_name="simple", settings={"trace_rate": None, "trace_level": None})),
                dict(expected_global, log_frequency="34"))
            self.assertEqual(as_dict(client.get_trace_settings()), expected_global)
            self.tearDown()

    def test_bad_values(self):
        cases = [({"trace_rate": "fast"}, "Unable to parse 'trace_rate', got: fast"),
                 ({"trace_count": "-3"}, "Expecting value >= -1"),
                 ({"log_frequency": "4294967296"}, "out of range"),
                 ({"trace_level": ["OFF", "TIMESTAMPS"]},
                  "Expect only one trace level 'OFF' is specified"),
                 ({"trace_level": ["LOUD"]}, "Unable to parse 'trace_level'"),
                 ({"trace_rate": "0"}, "Attempting to set invalid trace setting")]
        for settings, message in cases:
            for client in (self.http, self.grpc):
                with self.assertRaisesRegex(InferenceServerException, message):
                    client.update_trace_settings(settings=settings)
        # Nothing changed.
        self.assertEqual(self.http.get_trace_settings(), self.initial())
        # HTTP: a value of the wrong JSON type is refused (400).
        import urllib.request
        req = urllib.request.Request(self.server.url + "/v2/trace/setting", method="POST",
                                     data=json.dumps({"trace_rate": 5}).encode())
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        self.assertEqual(e.exception.code, 400)

    def test_restricted_category(self):
        with Server(self.repo.path, "--http-restricted-api", "trace:admin-key=admin-value",
                    "--grpc-restricted-protocol", "trace:admin-key=admin-value") as s:
            h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
            g = grpcclient.InferenceServerClient(s.grpc_target)
            try:
                for call in (lambda c, **k: c.get_trace_settings(**k),
                             lambda c, **k: c.get_trace_settings(model_name="simple", **k),
                             lambda c, **k: c.update_trace_settings(
                                 settings={"trace_rate": "5"}, **k)):
                    with self.assertRaisesRegex(InferenceServerException, "admin-key"):
                        call(h)
                    with self.assertRaises(InferenceServerException):
                        call(g)
                    call(h, headers={"admin-key": "admin-value"})
                    call(g, headers={"triton-grpc-protocol-admin-key": "admin-value"})
                # Inference stays open.
                http_infer(h)
                grpc_infer(g)
            finally:
                h.close()
                g.close()


class TritonMode(harness.unittest.TestCase):
    def setUp(self):
        self.repo = repository()
        self.addCleanup(lambda: self.repo.cleanup())  # the one a test put in its place too
        self.dir = tempfile.mkdtemp(prefix="asyncinfer-trace-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.file = os.path.join(self.dir, "trace.json")

    def serve(self, *config):
        args = []
        for c in ("triton,file=" + self.file, "level=TIMESTAMPS") + config:
            args += ["--trace-config", c]
        s = Server(self.repo.path, *args).start()
        self.addCleanup(s.stop)
        return s

    def records(self, path):
        with open(path) as f:
            return json.load(f)

    def traces(self, records):
        """{id: (model record, [(name, ns)])} of a trace file's records."""
        out = {}
        for r in records:
            model, stamps = out.setdefault(r["id"], ({}, []))
            if "model_name" in r:
                model.update(r)
            for t in r.get("timestamps", []):
                stamps.append((t["name"], t["ns"]))
        return out

    def test_every_request_to_the_file_at_shutdown(self):
        s = self.serve("rate=1")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        g = grpcclient.InferenceServerClient(s.grpc_target)
        http_infer(h, headers={"traceparent": TRACEPARENT})  # ignored in triton mode
        grpc_infer(g)
        h.close()
        g.close()
        s.stop()
        traces = self.traces(self.records(self.file))
        self.assertEqual(len(traces), 2)
        engine = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                  "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
        seen = set()
        for model, stamps in traces.values():
            self.assertEqual(model["model_name"], "simple")
            self.assertEqual(model["model_version"], 1)
            names = [n for n, _ in stamps]
            ns = [t for _, t in stamps]
            self.assertEqual(ns, sorted(ns), stamps)
            protocol = "HTTP" if names[0].startswith("HTTP") else "GRPC"
            seen.add(protocol)
            frontend = (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]) \
                if protocol == "HTTP" else \
                (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], ["GRPC_SEND_START", "GRPC_SEND_END"])
            self.assertEqual(names, frontend[0] + engine + frontend[1])
        self.assertEqual(seen, {"HTTP", "GRPC"})

    def test_each_request_of_a_grpc_stream_is_a_trace(self):
        s = self.serve("rate=1")
        g = grpcclient.InferenceServerClient(s.grpc_target)
        results = queue.Queue()
        g.start_stream(callback=lambda result, error: results.put((result, error)))
        for _ in range(3):
            i = grpcclient.InferInput("input0", [1, 16], "FP32")
            i.set_data_from_numpy(X)
            g.async_stream_infer("simple", [i])
        for _ in range(3):
            result, error = results.get(timeout=10)
            self.assertIsNone(error)
            np.testing.assert_array_equal(result.as_numpy("output0"), X)
        g.stop_stream()
        g.close()
        s.stop()
        traces = self.traces(self.records(self.file))
        self.assertEqual(len(traces), 3)
        for model, stamps in traces.values():
            self.assertEqual(model["model_name"], "simple")
            self.assertEqual([n for n, _ in stamps],
                             ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START",
                              "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                              "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
                              "GRPC_SEND_START", "GRPC_SEND_END"])

    def test_tensors_level_writes_the_tensors_as_triton_does(self):
        # Triton's TENSORS level (its tracer.cc's records): each input queued and run, each
        # output, as text; with TIMESTAMPS too, the timestamps as before.
        s = self.serve("level=TENSORS", "rate=1")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        http_infer(h)
        h.close()
        s.stop()
        records = self.records(self.file)
        tensors = [r for r in records if "activity" in r]
        self.assertEqual([r["activity"] for r in tensors],
                         ["TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_INPUT", "TENSOR_BACKEND_OUTPUT"])
        data = ",".join("%g" % v for v in X.reshape(-1))
        for r, name in zip(tensors, ["input0", "input0", "output0"]):
            self.assertEqual(r["tensor"], {"name": name, "data": data, "shape": "1,16",
                                           "dtype": "FP32"})
        ids = {r["id"] for r in records}
        self.assertEqual(len(ids), 1)  # one request, one trace
        self.assertIn("REQUEST_START", [t["name"] for r in records for t in r.get("timestamps", [])])

    ENGINE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
              "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]

    def test_generate_and_generate_stream_are_traced(self):
        s = self.serve("rate=1")
        for path in ("/v2/models/simple/generate", "/v2/models/simple/generate_stream"):
            c = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=30)
            c.request("POST", path, body=json.dumps({"input0": X.reshape(-1).tolist(), "id": path}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            body = r.read().decode()
            self.assertEqual(r.status, 200, body)
            if path.endswith("_stream"):
                self.assertTrue(body.startswith("data: "), body)
                body = body[len("data: "):]
            self.assertEqual(json.loads(body)["output0"], X.reshape(-1).tolist())
            c.close()
        s.stop()
        traces = self.traces(self.records(self.file))
        self.assertEqual(sorted(m["request_id"] for m, _ in traces.values()),
                         ["/v2/models/simple/generate", "/v2/models/simple/generate_stream"])
        for model, stamps in traces.values():
            self.assertEqual(model["model_name"], "simple")
            self.assertNotIn("parent_id", model)
            self.assertEqual([n for n, _ in stamps],
                             ["HTTP_RECV_START", "HTTP_RECV_END"] + self.ENGINE +
                             ["HTTP_SEND_START", "HTTP_SEND_END"])

    def children(self, traces, parent):
        """{model name: (id, model record, names of its timestamps)} of the children of trace
        `parent`."""
        out = {}
        for i, (model, stamps) in traces.items():
            if model.get("parent_id") == parent:
                self.assertNotIn(model["model_name"], out)
                out[model["model_name"]] = (i, model, [n for n, _ in stamps])
        return out

    def test_an_ensembles_steps_are_child_traces(self):
        self.repo.cleanup()
        self.repo = composed_repository()
        s = self.serve("rate=1", "level=TENSORS")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        infer_model(h, "ens")
        h.close()
        s.stop()
        records = self.records(self.file)
        traces = self.traces(records)
        self.assertEqual(len(traces), 3, traces)  # the ensemble's, and one per step
        (parent, (model, stamps)), = [(i, t) for i, t in traces.items()
                                      if "parent_id" not in t[0]]
        self.assertEqual(model["model_name"], "ens")
        self.assertEqual(model["model_version"], 1)
        # The ensemble computes nothing itself: its own queue, then its steps.
        self.assertEqual([n for n, _ in stamps],
                         ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
                          "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"])
        start, end = dict(stamps)["REQUEST_START"], dict(stamps)["REQUEST_END"]
        steps = self.children(traces, parent)
        self.assertEqual(sorted(steps), ["second", "simple"])
        for name, (i, m, names) in steps.items():
            self.assertNotEqual(i, parent)
            self.assertEqual(m["model_version"], 1)
            self.assertEqual(names, self.ENGINE)  # no frontend of their own
            for _, ns in traces[i][1]:
                self.assertTrue(start <= ns <= end, (name, ns, start, end))
        # simple ran before second (second reads simple's output).
        self.assertLess(dict(traces[steps["simple"][0]][1])["REQUEST_END"],
                        dict(traces[steps["second"][0]][1])["REQUEST_START"])
        # TENSORS: each trace's own tensors (the ensemble's input and output, each step's).
        tensors = {}
        for r in records:
            if "activity" in r:
                tensors.setdefault(r["id"], []).append((r["activity"], r["tensor"]["name"]))
        queued_and_run = [("TENSOR_QUEUE_INPUT", "input0"), ("TENSOR_BACKEND_INPUT", "input0"),
                          ("TENSOR_BACKEND_OUTPUT", "output0")]
        self.assertEqual(tensors, {parent: queued_and_run, steps["simple"][0]: queued_and_run,
                                   steps["second"][0]: queued_and_run})

    def test_a_python_models_calls_with_its_trace_are_child_traces(self):
        self.repo.cleanup()
        self.repo = composed_repository()
        s = self.serve("rate=1")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        infer_model(h, "bls", "simple")
        infer_model(h, "bls", "ens")  # bls -> ens -> (simple, second): a chain of parents
        infer_model(h, "bls", "untraced:simple")  # no trace=: the call is not traced
        h.close()
        s.stop()
        traces = self.traces(self.records(self.file))
        roots = sorted(i for i, (m, _) in traces.items() if "parent_id" not in m)
        self.assertEqual(len(roots), 3)
        self.assertEqual(len(traces), 3 + 1 + 3, traces)
        for i in roots:
            self.assertEqual(traces[i][0]["model_name"], "bls")
            self.assertEqual([n for n, _ in traces[i][1]],
                             ["HTTP_RECV_START", "HTTP_RECV_END"] + self.ENGINE +
                             ["HTTP_SEND_START", "HTTP_SEND_END"])
        by_children = sorted((sorted(self.children(traces, i)), i) for i in roots)
        self.assertEqual([c for c, _ in by_children], [[], ["ens"], ["simple"]])
        one = self.children(traces, by_children[2][1])["simple"]
        self.assertEqual(one[2], self.ENGINE)
        # The call ran inside the caller's compute.
        caller = dict(traces[by_children[2][1]][1])
        for _, ns in traces[one[0]][1]:
            self.assertTrue(caller["COMPUTE_START"] <= ns <= caller["COMPUTE_END"])
        ens = self.children(traces, by_children[1][1])["ens"]
        self.assertEqual(ens[2], ["REQUEST_START", "QUEUE_START", "REQUEST_END"])
        steps = self.children(traces, ens[0])
        self.assertEqual(sorted(steps), ["second", "simple"])
        for _, _, names in steps.values():
            self.assertEqual(names, self.ENGINE)

    def test_rate_count_and_log_frequency(self):
        s = self.serve("rate=2", "count=3", "triton,log-frequency=2")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        for _ in range(10):
            http_infer(h)
        # Requests 2, 4 and 6 were sampled; the count is spent.
        self.assertEqual(h.get_trace_settings()["trace_count"], "0")
        # log_frequency 2: two traces in trace.json.0; the third, which spent the count, in .1.
        wait_for(lambda: os.path.exists(self.file + ".1"), what="trace.json.1")
        first = self.traces(self.records(self.file + ".0"))
        second = self.traces(self.records(self.file + ".1"))
        self.assertEqual(len(first), 2)
        self.assertEqual(len(second), 1)
        self.assertFalse(os.path.exists(self.file + ".2"))
        # A new count starts sampling again.
        h.update_trace_settings(settings={"trace_count": "1", "trace_rate": "1"})
        http_infer(h)
        wait_for(lambda: os.path.exists(self.file + ".2"), what="trace.json.2")
        h.close()

    def test_model_setting_turns_one_model_on(self):
        self.repo.add("other", builtin_config(
            "other", "builtin:identity?shape=16&max_batch=8", [("input0", "TYPE_FP32", [16])],
            [("output0", "TYPE_FP32", [16])]))
        s = self.serve("rate=1")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        h.update_trace_settings(settings={"trace_level": ["OFF"]})
        h.update_trace_settings(model_name="simple", settings={"trace_level": ["TIMESTAMPS"]})
        i = httpclient.InferInput("input0", [1, 16], "FP32")
        i.set_data_from_numpy(X)
        h.infer("other", [i])
        http_infer(h)
        h.close()
        s.stop()
        traces = self.traces(self.records(self.file))
        self.assertEqual([m["model_name"] for m, _ in traces.values()], ["simple"])

    def test_bad_trace_config_is_refused_at_start(self):
        for config, message in ((["level=TIMESTAMPS"], "needs a file"),
                                (["rate=often"], "rate"),
                                (["jaeger,url=x"], "invalid value for trace mode"),
                                (["opentelemetry,url=https://collector"], "http://")):
            args = []
            for c in config:
                args += ["--trace-config", c]
            s = Server(self.repo.path, *args)
            with self.assertRaises(RuntimeError) as e:
                s.start()
            self.assertEqual(s.proc.returncode, 2)
            self.assertIn(message, str(e.exception))


class OpenTelemetryMode(harness.unittest.TestCase):
    def setUp(self):
        self.repo = repository()
        self.addCleanup(lambda: self.repo.cleanup())  # the one a test put in its place too

    def serve(self, url, *extra):
        args = []
        for c in ("mode=opentelemetry", "level=TIMESTAMPS", "rate=1",
                  "opentelemetry,url=" + url,
                  "opentelemetry,resource=service.name=asyncinfer-test",
                  "opentelemetry,bsp_schedule_delay=50") + extra:
            args += ["--trace-config", c]
        s = Server(self.repo.path, *args).start()
        self.addCleanup(s.stop)
        return s

    def test_spans_under_the_clients_traceparent(self):
        receiver = Receiver()
        self.addCleanup(receiver.close)
        s = self.serve("http://127.0.0.1:%d/v1/traces" % receiver.port)
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        g = grpcclient.InferenceServerClient(s.grpc_target)
        http_infer(h, headers={"traceparent": TRACEPARENT})
        grpc_infer(g, headers={"traceparent": TRACEPARENT})
        http_infer(h)  # no parent: a trace of its own
        settings = h.get_trace_settings()
        h.close()
        g.close()
        self.assertEqual(settings["trace_mode"], "opentelemetry")
        self.assertEqual(settings["url"], "http://127.0.0.1:%d/v1/traces" % receiver.port)
        self.assertNotIn("trace_file", settings)
        wait_for(lambda: len([x for x in receiver.spans() if x["name"] == "InferRequest"]) >= 3,
                 what="3 InferRequest spans")
        self.assertEqual({p for p, _ in receiver.posts}, {"/v1/traces"})
        self.assertEqual(set(receiver.content_types), {"application/x-protobuf"})
        spans = receiver.spans()
        by_id = {x["span_id"]: x for x in spans}
        parent_trace = bytes.fromhex(TRACEPARENT.split("-")[1])
        parent_span = bytes.fromhex(TRACEPARENT.split("-")[2])
        roots = [x for x in spans if x["name"] == "InferRequest"]
        under = [x for x in roots if x["parent_span_id"] == parent_span]
        self.assertEqual(len(under), 2)
        for root in under:
            self.assertEqual(root["trace_id"], parent_trace)
        alone = [x for x in roots if x["parent_span_id"] == b""]
        self.assertEqual(len(alone), 1)
        self.assertNotEqual(alone[0]["trace_id"], parent_trace)
        events = set()
        for root in roots:
            self.assertEqual(root["resource"]["service.name"], "asyncinfer-test")
            self.assertEqual(root["kind"], 2)  # SPAN_KIND_SERVER
            model = [x for x in spans if x["parent_span_id"] == root["span_id"]]
            self.assertEqual([m["name"] for m in model], ["simple"])
            m = model[0]
            self.assertEqual(m["trace_id"], root["trace_id"])
            self.assertEqual(m["attributes"]["triton.model_name"], "simple")
            self.assertEqual(m["attributes"]["triton.model_version"], 1)
            compute = [x for x in spans if x["parent_span_id"] == m["span_id"]]
            self.assertEqual([c["name"] for c in compute], ["compute"])
            self.assertLessEqual(root["start"], m["start"])
            self.assertLessEqual(m["start"], compute[0]["start"])
            self.assertLessEqual(compute[0]["end"], m["end"])
            self.assertLessEqual(m["end"], root["end"])
            # Unix time, nanoseconds: within the last hour.
            self.assertLess(abs(root["start"] / 1e9 - time.time()), 3600)
            for x in (root, m, compute[0]):
                events |= {e for e, _ in x["events"]}
            self.assertIn("COMPUTE_START", {e for e, _ in compute[0]["events"]})
            self.assertIn("REQUEST_START", {e for e, _ in m["events"]})
        self.assertTrue({"HTTP_RECV_START", "HTTP_SEND_END", "GRPC_WAITREAD_START",
                         "GRPC_SEND_END", "QUEUE_START", "COMPUTE_END", "REQUEST_END"} <= events,
                        events)
        self.assertEqual(len(by_id), len(spans))

    def test_children_hang_under_their_parents_model_span(self):
        # Triton's qa/L0_trace opentelemetry_unittest.py _test_bls_trace nesting: a BLS model
        # that calls an ensemble gives InferRequest -> bls -> (compute, ens); ens -> its steps;
        # each step -> compute. One OpenTelemetry trace, the client's.
        self.repo.cleanup()
        self.repo = composed_repository()
        receiver = Receiver()
        self.addCleanup(receiver.close)
        s = self.serve("http://127.0.0.1:%d/v1/traces" % receiver.port)
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        infer_model(h, "bls", "ens", headers={"traceparent": TRACEPARENT})
        h.close()
        wait_for(lambda: len(receiver.spans()) >= 8, what="8 spans")
        time.sleep(0.2)  # nothing more comes
        spans = receiver.spans()
        self.assertEqual(len(spans), 8, [x["name"] for x in spans])
        by_id = {x["span_id"]: x for x in spans}
        nesting = {}
        for x in spans:
            if x["parent_span_id"] in by_id:
                nesting.setdefault(by_id[x["parent_span_id"]]["name"], []).append(x["name"])
        self.assertEqual({k: sorted(v) for k, v in nesting.items()},
                         {"InferRequest": ["bls"], "bls": ["compute", "ens"],
                          "ens": ["second", "simple"], "simple": ["compute"],
                          "second": ["compute"]})
        parent_trace = bytes.fromhex(TRACEPARENT.split("-")[1])
        self.assertEqual({x["trace_id"] for x in spans}, {parent_trace})
        root, = [x for x in spans if x["name"] == "InferRequest"]
        self.assertEqual(root["parent_span_id"], bytes.fromhex(TRACEPARENT.split("-")[2]))
        models = {x["name"]: x for x in spans if "triton.model_name" in x["attributes"]}
        ids = {n: m["attributes"]["triton.trace_id"] for n, m in models.items()}
        parents = {n: m["attributes"]["triton.trace_parent_id"] for n, m in models.items()}
        self.assertEqual(parents, {"bls": 0, "ens": ids["bls"], "simple": ids["ens"],
                                   "second": ids["ens"]})
        self.assertEqual(len(set(ids.values())), 4)
        bls, ens = models["bls"], models["ens"]
        self.assertLessEqual(bls["start"], ens["start"])
        self.assertLessEqual(ens["end"], bls["end"])
        self.assertEqual(ens["parent_span_id"], bls["span_id"])

    def test_collector_down(self):
        s = self.serve("http://127.0.0.1:%d/v1/traces" % free_port(),
                       "opentelemetry,bsp_max_queue_size=4")
        h = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        g = grpcclient.InferenceServerClient(s.grpc_target)
        for _ in range(20):
            http_infer(h, headers={"traceparent": TRACEPARENT})
            grpc_infer(g)
        s.wait_line(r"warning: trace export to .*: ", timeout=20)
        http_infer(h)
        self.assertTrue(h.is_server_live())
        h.close()
        g.close()
        self.assertIsNone(s.proc.poll())


if __name__ == "__main__":
    harness.main()
