"""Hostile clients (issue 45): streams nobody reads, and Python models whose initialize() never
returns. Each finding is reproduced on loopback with a short timeout and bounded in time.

- Streams: two clients each send one request to a decoupled model (builtin:stream, two
  instances) over gRPC ModelStreamInfer (raw HTTP/2 with a zero flow-control window) or HTTP
  generate_stream (a socket with a tiny receive buffer that never reads). With --idle-timeout 1
  the server cancels both streams once their writes make no progress for 1 s, frees the workers,
  serves a third client, and counts them (asyncinfer_{grpc,http}_stalled_streams_total).
- Loads: a model.py whose initialize() sleeps for ever. Its load fails after --model-load-timeout
  naming the model and the timeout, its process killed; another model loads beside it at once
  (--model-load-thread-count); an unload ends its load; SIGTERM exits within the drain timeout,
  also while the models load at start.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import textwrap
import threading
import time

import harness
from harness import Repository, Server

STREAM_CONFIG_EXTRA = ('model_transaction_policy { decoupled: true }\n'
                       'instance_group [ { kind: KIND_CPU, count: 2 } ]\n')
IDLE_TIMEOUT_S = 1.0
# A stalled stream is cut within 2 x --idle-timeout (HTTP extends once while the kernel's send
# queue still moved); the rest is the model noticing and the third client's own round trip.
SERVED_WITHIN_S = 4 * IDLE_TIMEOUT_S + 4


def stream_repository():
    repo = Repository()
    # 100,000 responses 1 ms apart: a client that reads none holds its worker for 100 s.
    repo.add("slow", harness.builtin_config(
        "slow", "builtin:stream?n=100000&interval_us=1000&shape=4&max_batch=8",
        [("input0", "TYPE_FP32", [4])],
        [("output0", "TYPE_FP32", [4]), ("index", "TYPE_INT32", [1])],
        max_batch_size=8, extra=STREAM_CONFIG_EXTRA))
    return repo


def metrics_text(server):
    c = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    try:
        c.request("GET", "/metrics")
        return c.getresponse().read().decode()
    finally:
        c.close()


def stalled(server, protocol):
    return harness.metric(metrics_text(server),
                          "asyncinfer_%s_stalled_streams_total" % protocol) or 0


class StalledStreams(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = stream_repository()
        cls.server = Server(cls.repo.path, "--idle-timeout", str(IDLE_TIMEOUT_S)).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.repo.cleanup()

    def first_grpc_response_s(self, timeout):
        """Seconds until a well-behaved gRPC stream client gets its first response."""
        import grpc_client
        ch = grpc_client.channel("127.0.0.1:%d" % self.server.grpc_port)
        try:
            stub = grpc_client.stub(ch)
            req = grpc_client.infer_request("slow", [("input0", "FP32", [1, 4], [1, 2, 3, 4])],
                                            request_id="third")
            start = time.monotonic()
            call = stub.ModelStreamInfer(iter([req]), timeout=timeout)
            first = next(call)
            took = time.monotonic() - start
            self.assertEqual(first.error_message, "")
            call.cancel()
            return took
        finally:
            ch.close()

    def first_sse_event_s(self, timeout):
        """Seconds until a well-behaved generate_stream client gets its first event."""
        start = time.monotonic()
        s = generate_stream_socket(self.server.http_port)
        s.settimeout(timeout)
        try:
            got = b""
            while b"data: " not in got:
                chunk = s.recv(65536)
                self.assertTrue(chunk, "the server closed the third client's stream")
                got += chunk
            self.assertIn(b" 200 OK", got.split(b"\r\n", 1)[0])
            return time.monotonic() - start
        finally:
            s.close()

    def test_grpc_streams_nobody_reads_are_cancelled(self):
        import h2_attack
        import grpc_client
        before = stalled(self.server, "grpc")
        message = h2_attack.grpc_message(grpc_client.infer_request(
            "slow", [("input0", "FP32", [1, 4], [1, 2, 3, 4])]))
        conns = []
        for _ in range(2):
            c = h2_attack.Connection(self.server.grpc_port, window=0)
            self.addCleanup(c.close)
            self.assertTrue(c.server_settings.wait(5))
            c.open_call(message, path="/inference.GRPCInferenceService/ModelStreamInfer")
            c.send_pending()
            conns.append(c)
        time.sleep(0.5)  # both requests run now; their first writes wait for a window
        took = self.first_grpc_response_s(timeout=20)
        print("gRPC: the third client's first response after %.2f s (--idle-timeout %.1f)"
              % (took, IDLE_TIMEOUT_S))
        self.assertLess(took, SERVED_WITHIN_S)
        harness.wait_for(lambda: stalled(self.server, "grpc") >= before + 2, timeout=5,
                         what="asyncinfer_grpc_stalled_streams_total to count both streams")
        # The workers were freed: the model serves again at once.
        self.assertLess(self.first_grpc_response_s(timeout=10), 2)

    def test_sse_streams_nobody_reads_are_cancelled(self):
        before = stalled(self.server, "http")
        socks = []
        for _ in range(2):
            s = generate_stream_socket(self.server.http_port, rcvbuf=1024)
            self.addCleanup(s.close)
            socks.append(s)
        time.sleep(0.5)
        took = self.first_sse_event_s(timeout=20)
        print("SSE: the third client's first event after %.2f s (--idle-timeout %.1f)"
              % (took, IDLE_TIMEOUT_S))
        self.assertLess(took, SERVED_WITHIN_S)
        harness.wait_for(lambda: stalled(self.server, "http") >= before + 2, timeout=5,
                         what="asyncinfer_http_stalled_streams_total to count both streams")
        self.assertLess(self.first_sse_event_s(timeout=10), 2)


def generate_stream_socket(port, rcvbuf=None):
    """A socket that has sent a generate_stream request to model 'slow'. With `rcvbuf` its
    receive buffer is made that small before it connects (a client that reads nothing)."""
    body = json.dumps({"input0": [1, 2, 3, 4]}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(b"POST /v2/models/slow/generate_stream HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
              % (len(body), body))
    return s


# ---- Python models whose initialize() never returns --------------------------------------------

HANGS = '''
import os, time


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(args["model_repository"], "pid"), "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(3600)

    def execute(self, requests):
        return []
'''

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def python_repository():
    repo = Repository()
    for name, source in (("hang", HANGS), ("quick", IDENTITY)):
        repo.add(name, 'name: "%s"\nbackend: "python"\nmax_batch_size: 8\n'
                 'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
                 'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n' % name)
        with open(os.path.join(repo.path, name, "1", "model.py"), "w") as f:
            f.write(textwrap.dedent(source))
    return repo


def post(server, path, body=b"", timeout=30):
    """(status, parsed JSON body or {}) of a POST."""
    c = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout)
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read()
        return r.status, (json.loads(text) if text else {})
    finally:
        c.close()


class BackgroundLoad:
    """POST /v2/repository/models/NAME/load on a thread; .result: (status, body, seconds)."""

    def __init__(self, server, name, timeout=60):
        self.result = None
        self.start = time.monotonic()

        def run():
            try:
                status, body = post(server, "/v2/repository/models/%s/load" % name,
                                    timeout=timeout)
            except OSError as e:
                status, body = None, {"error": repr(e)}
            self.result = (status, body, time.monotonic() - self.start)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait(self, timeout):
        self.thread.join(timeout)
        return self.result


def wait_pid(repo, name, timeout=30):
    """The pid model.py's initialize() wrote: it is running then."""
    path = os.path.join(repo.path, name, "pid")

    def written():
        try:
            with open(path) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    harness.wait_for(written, timeout=timeout, what="%s's initialize() to start" % name)
    return int(written())


def gone(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            return any(l.startswith("State:") and "Z" in l.split()[1] for l in f)
    except FileNotFoundError:
        return True


def infer_quick(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4]}]}).encode()
    status, out = post(server, "/v2/models/quick/infer", body, timeout=20)
    return status, out


class HangingInitialize(harness.unittest.TestCase):
    def setUp(self):
        self.repo = python_repository()
        self.addCleanup(self.repo.cleanup)

    def serve(self, *extra):
        server = Server(self.repo.path, "--model-control-mode", "explicit", *extra).start()
        self.addCleanup(server.stop)
        return server

    def test_load_timeout_fails_the_load_and_kills_initialize(self):
        server = self.serve("--model-load-timeout", "2")
        load = BackgroundLoad(server, "hang")
        pid = wait_pid(self.repo, "hang")
        status, body, took = load.wait(20) or (None, {}, None)
        print("load of a hanging initialize() answered %s after %s s (--model-load-timeout 2)"
              % (status, took if took is None else round(took, 2)))
        self.assertIsNotNone(took, "the load did not end within 20 s")
        self.assertLess(took, 2 + 5)
        self.assertGreaterEqual(status, 400)
        error = body.get("error", "")
        self.assertIn("'hang'", error)
        self.assertIn("--model-load-timeout", error)
        harness.wait_for(lambda: gone(pid), timeout=5, what="the stub process to be killed")
        # The index says why; the server serves the other models.
        _, index = post(server, "/v2/repository/index")
        hang = [e for e in index if e["name"] == "hang"]
        self.assertTrue(hang and hang[0]["state"] == "UNAVAILABLE", index)
        self.assertIn("--model-load-timeout", hang[0].get("reason", ""))
        self.assertEqual(post(server, "/v2/repository/models/quick/load")[0], 200)
        self.assertEqual(infer_quick(server)[0], 200)

    def test_other_loads_go_on_and_unload_ends_the_hanging_one(self):
        server = self.serve()  # the default --model-load-timeout (600 s)
        load = BackgroundLoad(server, "hang")
        pid = wait_pid(self.repo, "hang")
        start = time.monotonic()
        status, body = post(server, "/v2/repository/models/quick/load", timeout=30)
        took = time.monotonic() - start
        print("another model loaded in %.2f s beside a hanging initialize()" % took)
        self.assertEqual(status, 200, body)
        self.assertLess(took, 15)
        self.assertEqual(infer_quick(server)[0], 200)
        self.assertIsNone(load.result, "the hanging load ended by itself")
        # An unload cuts the load short: it answers, and the stub process is killed.
        start = time.monotonic()
        self.assertEqual(post(server, "/v2/repository/models/hang/unload")[0], 200)
        result = load.wait(10)
        self.assertIsNotNone(result, "the load went on after the unload")
        print("unload ended the hanging load after %.2f s" % (time.monotonic() - start))
        self.assertGreaterEqual(result[0], 400)
        self.assertIn("hang", result[1].get("error", ""))
        harness.wait_for(lambda: gone(pid), timeout=5, what="the stub process to be killed")
        self.assertEqual(infer_quick(server)[0], 200)

    def test_sigterm_ends_a_hanging_load_within_the_drain_timeout(self):
        server = self.serve("--drain-timeout", "2")
        BackgroundLoad(server, "hang")
        pid = wait_pid(self.repo, "hang")
        start = time.monotonic()
        server.signal()
        code = server.wait(timeout=30)
        took = time.monotonic() - start
        print("SIGTERM with a hanging initialize(): exit %s after %.2f s (--drain-timeout 2)"
              % (code, took))
        self.assertIsNotNone(code, "the server did not exit within 30 s")
        self.assertLess(took, 2 + 4)
        harness.wait_for(lambda: gone(pid), timeout=5, what="the stub process to be gone")

    def test_sigterm_ends_a_hanging_load_at_start(self):
        # Loaded at start (--model-control-mode none), before the server listens: SIGTERM still
        # cuts the loads short and ends the server, not after --model-load-timeout.
        with tempfile.TemporaryFile(mode="w+") as log:
            proc = subprocess.Popen(
                [harness.ARGS.cli, "serve", "--model-repository", self.repo.path, "--host",
                 "127.0.0.1", "--http-port", "0", "--metrics-port", "0", "--grpc-port", "0"],
                stdout=subprocess.DEVNULL, stderr=log)
            try:
                pid = wait_pid(self.repo, "hang")
                start = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=30)
                took = time.monotonic() - start
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            log.seek(0)
            text = log.read()
        print("SIGTERM during the loads at start: exit %s after %.2f s" % (code, took))
        self.assertEqual(code, 0, text)
        self.assertLess(took, 4, text)
        self.assertIn("while the models loaded", text)
        harness.wait_for(lambda: gone(pid), timeout=5, what="the stub process to be gone")


if __name__ == "__main__":
    harness.main()
