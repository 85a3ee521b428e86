"""Decoupled models (model_transaction_policy { decoupled: true }: many responses per request)
through `asyncinfer serve`, checked with Triton's own Python client (tritonclient[grpc], pinned in
scripts/requirements-tritonclient.txt) and its generated gRPC messages: ModelStreamInfer with
triton_final_response and triton_enable_empty_final_response, errors in the middle of a stream,
the one-response calls refused as Triton refuses them, the client cancelling, back-pressure on a
client that does not read, and HTTP generate / generate_stream (Server-Sent Events).
The model is builtin:stream (n responses per request, interval_us apart)."""

import http.client
import json
import threading
import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository
from triton_fixture import Collector, serve

DECOUPLED = 'model_transaction_policy { decoupled: true }\n'


def stream_config(name, uri, dims=(4,), max_batch_size=8, extra=""):
    return harness.builtin_config(
        name, uri, [("input0", "TYPE_FP32", list(dims))],
        [("output0", "TYPE_FP32", list(dims)), ("index", "TYPE_INT32", [1])],
        max_batch_size=max_batch_size, extra=DECOUPLED + extra)


def fp32_input(x):
    i = grpcclient.InferInput("input0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def final_flag(result):
    return result.get_response().parameters["triton_final_response"].bool_param


class Decoupled(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("stream", stream_config("stream", "builtin:stream?n=5&shape=4&max_batch=8"))
        cls.repo.add("slow", stream_config(
            "slow", "builtin:stream?n=100000&interval_us=1000&shape=4&max_batch=8"))
        cls.repo.add("failing", stream_config(
            "failing", "builtin:stream?n=5&fail_after=2&shape=4&max_batch=8"))
        cls.repo.add("big", stream_config(
            "big", "builtin:stream?n=3000&shape=16384&max_batch=8", dims=(16384,)))
        cls.repo.add("silent", stream_config("silent", "builtin:stream?n=0&shape=4&max_batch=8"))
        serve(cls, cls.repo.path, repo=cls.repo)

    def stream(self):
        c = grpcclient.InferenceServerClient(self.server.grpc_target)
        self.addCleanup(c.close)
        got = Collector()
        c.start_stream(callback=got)
        self.addCleanup(c.stop_stream, cancel_requests=True)
        return c, got

    def test_config_says_decoupled(self):
        c = self.http.get_model_config("stream")
        self.assertIs(c["model_transaction_policy"]["decoupled"], True)
        g = self.grpc.get_model_config("stream", as_json=True)
        self.assertIs(g["config"]["model_transaction_policy"]["decoupled"], True)

    def test_n_responses_then_the_final_flag(self):
        x = np.array([[1.5, -2, 3, 4]], dtype=np.float32)
        for empty_final in (False, True):
            c, got = self.stream()
            c.async_stream_infer("stream", [fp32_input(x)], request_id="r%d" % empty_final,
                                 enable_empty_final_response=empty_final)
            items = got.take(6 if empty_final else 5)
            for k, (result, error) in enumerate(items[:5]):
                self.assertIsNone(error)
                self.assertEqual(result.get_response().id, "r%d" % empty_final)
                np.testing.assert_array_equal(result.as_numpy("output0"), x)
                self.assertEqual(result.as_numpy("index").tolist(), [[k]])
                self.assertFalse(final_flag(result))
            if empty_final:
                last, error = items[5]
                self.assertIsNone(error)
                self.assertEqual(len(last.get_response().outputs), 0)
                self.assertTrue(final_flag(last))
            self.assertTrue(got.none_within(0.2), "nothing after the final response")

    def test_requests_of_one_stream_each_get_their_own(self):
        c, got = self.stream()
        for i in range(4):
            x = np.full((1, 4), i, dtype=np.float32)
            c.async_stream_infer("stream", [fp32_input(x)], request_id=str(i),
                                 enable_empty_final_response=True)
        by_id = {}
        for result, error in got.take(4 * 6):
            self.assertIsNone(error)
            by_id.setdefault(result.get_response().id, []).append(result)
        self.assertEqual(sorted(by_id), ["0", "1", "2", "3"])
        for rid, results in by_id.items():
            self.assertEqual([final_flag(r) for r in results], [False] * 5 + [True])
            self.assertEqual([r.as_numpy("index")[0][0] for r in results[:5]], list(range(5)))
            for r in results[:5]:
                self.assertEqual(r.as_numpy("output0").tolist(), [[float(rid)] * 4])

    def test_zero_responses(self):
        c, got = self.stream()
        x = np.zeros((1, 4), dtype=np.float32)
        c.async_stream_infer("silent", [fp32_input(x)], request_id="a",
                             enable_empty_final_response=True)
        (result, error), = got.take(1)
        self.assertIsNone(error)
        self.assertTrue(final_flag(result))
        c.async_stream_infer("silent", [fp32_input(x)], request_id="b")
        self.assertTrue(got.none_within(0.3), "without empty final responses nothing is sent")

    def test_an_error_mid_stream_keeps_the_stream_open(self):
        c, got = self.stream()
        x = np.ones((1, 4), dtype=np.float32)
        c.async_stream_infer("failing", [fp32_input(x)], request_id="f")
        items = got.take(3)
        self.assertEqual([r.as_numpy("index")[0][0] for r, e in items[:2]], [0, 1])
        result, error = items[2]
        self.assertIsNotNone(error)
        self.assertIn("fail_after", error.message())
        self.assertIn("not run again", error.message())
        # The same stream serves the next request.
        c.async_stream_infer("stream", [fp32_input(x)], request_id="next")
        self.assertEqual([r.get_response().id for r, e in got.take(5)], ["next"] * 5)

    def test_fast_failing_requests_keep_their_responses_on_a_stream(self):
        # Many requests in flight at once, batched together: each sends two responses and then
        # fails. A request can end before its submit call has returned; it was accepted all the
        # same, and its responses and its error all reach the client.
        c, got = self.stream()
        x = np.ones((1, 4), dtype=np.float32)
        n = 200
        for i in range(n):
            c.async_stream_infer("failing", [fp32_input(x)], request_id=f"f{i}")
        items = got.take(3 * n)
        errors = [e for r, e in items if e is not None]
        self.assertEqual(len(errors), n)
        for e in errors:
            self.assertIn("fail_after", e.message())
        indices = {}
        for r, e in items:
            if e is None:
                resp = r.get_response()
                indices.setdefault(resp.id, []).append(int(r.as_numpy("index")[0][0]))
        self.assertEqual(indices, {f"f{i}": [0, 1] for i in range(n)})

    def test_one_response_calls_are_refused_as_triton_does(self):
        x = np.ones((1, 4), dtype=np.float32)
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("stream", [fp32_input(x)])
        self.assertEqual(e.exception.status(), "StatusCode.UNIMPLEMENTED")
        self.assertIn("decoupled", e.exception.message())
        hi = httpclient.InferInput("input0", [1, 4], "FP32")
        hi.set_data_from_numpy(x)
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("stream", [hi])
        self.assertEqual(e.exception.status(), "501")
        self.assertIn("generate_stream", e.exception.message())

    def test_cancelling_the_stream_stops_the_model(self):
        # One worker, 100,000 responses 1 ms apart: unless the cancel stops the model, the next
        # request waits 100 s for the worker.
        c, got = self.stream()
        x = np.ones((1, 4), dtype=np.float32)
        c.async_stream_infer("slow", [fp32_input(x)], request_id="long")
        got.take(5)
        c.stop_stream(cancel_requests=True)
        c2, got2 = self.stream()
        start = time.monotonic()
        c2.async_stream_infer("slow", [fp32_input(x)], request_id="after")
        first, error = got2.take(1, timeout=10)[0]
        self.assertIsNone(error)
        self.assertEqual(first.get_response().id, "after")
        self.assertLess(time.monotonic() - start, 5)

    def test_a_client_that_does_not_read_holds_the_model_back(self):
        # 3,000 responses of 64 KiB (190 MiB in all) to a client that reads none for 2 s: the
        # server buffers a bounded number, the model waits, and memory stays flat; then the
        # client reads them all, in order.
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="big", id="slow-reader")
        t = request.inputs.add(name="input0", datatype="FP32", shape=[1, 16384])
        request.raw_input_contents.append(np.arange(16384, dtype=np.float32).tobytes())
        del t
        done = threading.Event()

        def requests():
            yield request
            done.wait(60)

        responses = stub.ModelStreamInfer(requests(), timeout=60)
        rss_before = harness.rss_mb(self.server.proc.pid)[0]
        time.sleep(2)
        rss_held = harness.rss_mb(self.server.proc.pid)[0]
        stats = self.grpc.get_inference_statistics("big").model_stats[0]
        self.assertEqual(stats.inference_stats.success.count, 0,
                         "the model finished although its client read nothing")
        self.assertLess(rss_held - rss_before, 120, "the server buffered the responses")
        n = 0
        for r in responses:
            self.assertEqual(r.error_message, "")
            self.assertEqual(np.frombuffer(r.infer_response.raw_output_contents[1],
                                           dtype=np.int32)[0], n)
            n += 1
            if n == 3000:
                break
        done.set()
        self.assertEqual(n, 3000)

    def test_shutdown_with_a_client_that_does_not_read(self):
        # A model waiting for room on a stream whose client reads nothing must not hold the
        # server's shutdown: SIGTERM ends the process within its drain bounds.
        server = harness.Server(self.repo.path).start()
        self.addCleanup(server.stop)
        channel = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(channel.close)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="big", id="stuck")
        request.inputs.add(name="input0", datatype="FP32", shape=[1, 16384])
        request.raw_input_contents.append(np.zeros(16384, dtype=np.float32).tobytes())
        done = threading.Event()
        self.addCleanup(done.set)

        def requests():
            yield request
            done.wait(60)

        responses = stub.ModelStreamInfer(requests(), timeout=60)
        self.assertEqual(responses.initial_metadata() is not None, True)
        time.sleep(1)  # the model is blocked on the full stream by now
        server.signal()
        self.assertIsNotNone(server.wait(timeout=40), "the server did not exit")

    # ---- HTTP: generate and generate_stream (Triton's generate extension) ----------------------

    def post(self, path, body, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=timeout)
        self.addCleanup(c.close)
        c.request("POST", path, body=json.dumps(body) if not isinstance(body, str) else body,
                  headers={"Content-Type": "application/json"})
        return c.getresponse()

    def events(self, response):
        """The Server-Sent Events of a generate_stream response, parsed."""
        self.assertEqual(response.getheader("Content-Type"), "text/event-stream; charset=utf-8")
        text = response.read().decode()
        self.assertTrue(text.endswith("\n\n"), text)
        out = []
        for block in text.split("\n\n")[:-1]:
            self.assertTrue(block.startswith("data: "), block)
            out.append(json.loads(block[len("data: "):]))
        return out

    def test_generate_stream_sends_one_event_per_response(self):
        r = self.post("/v2/models/stream/generate_stream",
                      {"input0": [1, 2.5, -3, 4], "id": "g1", "parameters": {"note": "x"}})
        self.assertEqual(r.status, 200)
        events = self.events(r)
        self.assertEqual([e["index"] for e in events], [0, 1, 2, 3, 4])
        for e in events:
            self.assertEqual(e["output0"], [1, 2.5, -3, 4])
            self.assertEqual(e["model_name"], "stream")
            self.assertEqual(e["model_version"], "1")
            self.assertEqual(e["id"], "g1")

    def test_generate_stream_reports_a_later_error_as_an_event(self):
        r = self.post("/v2/models/failing/generate_stream", {"input0": [1, 1, 1, 1]})
        self.assertEqual(r.status, 200, r.read() if r.status != 200 else b"")
        events = self.events(r)
        self.assertEqual([e.get("index") for e in events[:2]], [0, 1])
        self.assertIn("fail_after", events[2]["error"])
        self.assertEqual(len(events), 3)

    def test_generate_stream_errors_of_fast_requests_are_events_too(self):
        # 8 clients at once, so that requests batch and some end before their submit returns:
        # such a request was accepted, and its client gets 200 with its two events and the error
        # (it once got a plain 503, its events dropped).
        failures = []

        def client():
            for _ in range(40):
                c = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
                try:
                    c.request("POST", "/v2/models/failing/generate_stream",
                              body=json.dumps({"input0": [1, 1, 1, 1]}),
                              headers={"Content-Type": "application/json"})
                    r = c.getresponse()
                    text = r.read().decode()
                    if r.status != 200:
                        failures.append(f"{r.status}: {text}")
                        continue
                    events = [json.loads(b[len("data: "):]) for b in text.split("\n\n")[:-1]]
                    if [e.get("index") for e in events[:2]] != [0, 1] or len(events) != 3 \
                            or "fail_after" not in events[2].get("error", ""):
                        failures.append(text)
                finally:
                    c.close()

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertFalse(any(t.is_alive() for t in threads), "a client did not finish")
        self.assertEqual(failures, [], f"{len(failures)} of 320 requests: {failures[:2]}")

    def test_generate_needs_exactly_one_response(self):
        r = self.post("/v2/models/stream/generate", {"input0": [1, 2, 3, 4]})
        self.assertEqual(r.status, 400)
        self.assertIn("sent 5", json.loads(r.read())["error"])
        r = self.post("/v2/models/silent/generate", {"input0": [1, 2, 3, 4]})
        self.assertEqual(r.status, 400)
        self.assertIn("sent 0", json.loads(r.read())["error"])

    def test_generate_bad_requests_name_what_was_wrong(self):
        cases = [
            ([1, 2], "JSON object"),
            ({"input0": [1, 2, 3]}, "can not convert input 'input0' to tensor with proper shape"),
            ({"input0": [[1, 2], [3, 4], [5, 6], [7, 8]]}, "non-number as number"),
            ({"input0": ["a", "b", "c", "d"]}, "give numbers"),
            ({"input0": [1, 2, 3, 4], "extra": [1]}, "'extra'"),
            ({}, "input0"),
        ]
        for body, want in cases:
            for path in ("generate", "generate_stream"):
                r = self.post("/v2/models/stream/" + path, body)
                self.assertEqual(r.status, 400, (body, path))
                self.assertIn(want, json.loads(r.read())["error"], (body, path))
        r = self.post("/v2/models/stream/generate_stream", "{not json")
        self.assertEqual(r.status, 400)

    def test_a_generate_stream_client_that_leaves_stops_the_model(self):
        # 100,000 events 1 ms apart; the client reads two and disconnects. Unless that stops the
        # model, the next request waits 100 s for the only worker.
        import socket
        body = json.dumps({"input0": [1, 2, 3, 4]}).encode()
        s = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10)
        s.sendall(b"POST /v2/models/slow/generate_stream HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        got = b""
        while got.count(b"data: ") < 2:
            got += s.recv(65536)
        s.close()
        start = time.monotonic()
        r = self.post("/v2/models/stream/generate_stream", {"input0": [0, 0, 0, 0]})
        self.assertEqual(len(self.events(r)), 5)
        c, got2 = self.stream()
        c.async_stream_infer("slow", [fp32_input(np.ones((1, 4), dtype=np.float32))])
        self.assertIsNone(got2.take(1, timeout=10)[0][1])
        self.assertLess(time.monotonic() - start, 5)


if __name__ == "__main__":
    harness.main()
