"""Ensembles (platform: "ensemble", ensemble_scheduling) through `asyncinfer serve`, checked with
Triton's own client (tritonclient, pinned in scripts/requirements-tritonclient.txt).

The steps are Python models (model.py, each in its own process) and a built-in one. What is
checked: the values through a chain of steps over HTTP and gRPC, /config and metadata, steps that
do not depend on each other running at once, a failing step failing only its request and being
named, a step that outlives the request's deadline (the request ends at its deadline and the
steps after it never run), statistics per step and for the ensemble, and ensembles that cannot
load (an unknown step model, a dtype mismatch) being UNAVAILABLE with the reason while the
others serve."""

import os
import textwrap
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository
from triton_fixture import serve


def tensors(ts):
    return ", ".join('{ name: "%s", data_type: %s, dims: [ %s ] }'
                     % (n, t, ", ".join(str(d) for d in dims)) for n, t, dims in ts)


def python_model(repo, name, inputs, outputs, source, extra=""):
    repo.add(name, 'name: "%s"\nbackend: "python"\nmax_batch_size: 8\ninput [ %s ]\noutput [ %s ]\n'
             % (name, tensors(inputs), tensors(outputs)) + extra)
    with open(os.path.join(repo.path, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(source))


def step(model, inputs, outputs):
    maps = "".join(' input_map { key: "%s" value: "%s" }' % kv for kv in inputs.items())
    maps += "".join(' output_map { key: "%s" value: "%s" }' % kv for kv in outputs.items())
    return '{ model_name: "%s" model_version: -1%s }' % (model, maps)


def ensemble(repo, name, inputs, outputs, steps):
    repo.add(name, 'name: "%s"\nplatform: "ensemble"\nmax_batch_size: 8\ninput [ %s ]\n'
             'output [ %s ]\nensemble_scheduling { step [ %s ] }\n'
             % (name, tensors(inputs), tensors(outputs), ", ".join(steps)))


# y = x * factor, after sleeping `delay` seconds when x[0, 0] asks for it (x[0, 0] == 99), and
# raising when x[0, 0] == 13.
SCALE = '''
import json, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.factor = float(params["factor"]["string_value"])
        self.delay = float(params["delay"]["string_value"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            if x[0, 0] == 13:
                raise ValueError("13 is not welcome here")
            if x[0, 0] == 99 or self.delay > 0:
                time.sleep(self.delay if self.delay > 0 else 3)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * self.factor)]))
        return out
'''

X4 = [("x", "TYPE_FP32", [4])]
Y4 = [("y", "TYPE_FP32", [4])]


def scale_model(repo, name, factor, delay=0.0):
    python_model(repo, name, X4, Y4, SCALE,
                 'parameters { key: "factor" value { string_value: "%s" } }\n'
                 'parameters { key: "delay" value { string_value: "%s" } }\n' % (factor, delay))


def http_input(name, x):
    i = httpclient.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def grpc_input(name, x):
    i = grpcclient.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


class Ensembles(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = repo = Repository()
        scale_model(repo, "double", 2)
        scale_model(repo, "triple", 3)
        scale_model(repo, "slow_a", 1, delay=0.6)
        scale_model(repo, "slow_b", 10, delay=0.6)
        repo.add("ident", harness.builtin_config(
            "ident", "builtin:identity?shape=4&max_batch=8", [("input0", "TYPE_FP32", [4])],
            [("output0", "TYPE_FP32", [4])]))
        # A -> double -> T -> triple -> (Z, and ident -> COPY): Z = 6 A, COPY = 2 A.
        ensemble(repo, "chain", [("A", "TYPE_FP32", [4])],
                 [("Z", "TYPE_FP32", [4]), ("COPY", "TYPE_FP32", [4])],
                 [step("double", {"x": "A"}, {"y": "T"}),
                  step("triple", {"x": "T"}, {"y": "Z"}),
                  step("ident", {"input0": "T"}, {"output0": "COPY"})])
        # Two independent slow steps (0.6 s each) and one that joins... through two outputs.
        ensemble(repo, "fork", [("A", "TYPE_FP32", [4])],
                 [("P", "TYPE_FP32", [4]), ("Q", "TYPE_FP32", [4])],
                 [step("slow_a", {"x": "A"}, {"y": "P"}), step("slow_b", {"x": "A"}, {"y": "Q"})])
        # Broken at load: an unknown step model; a dtype mismatch between two steps.
        ensemble(repo, "unknown_step", [("A", "TYPE_FP32", [4])], [("Z", "TYPE_FP32", [4])],
                 [step("no_such_model", {"x": "A"}, {"y": "Z"})])
        python_model(repo, "ints", [("x", "TYPE_INT32", [4])], [("y", "TYPE_INT32", [4])],
                     "class TritonPythonModel:\n    def execute(self, requests):\n"
                     "        return []\n")
        ensemble(repo, "mismatch", [("A", "TYPE_FP32", [4])], [("Z", "TYPE_INT32", [4])],
                 [step("double", {"x": "A"}, {"y": "T"}), step("ints", {"x": "T"}, {"y": "Z"})])
        serve(cls, repo.path, "--strict-readiness", "false", repo=repo)

    def test_a_chain_over_http_and_grpc(self):
        a = np.array([[1, -2, 3.5, 0]], dtype=np.float32)
        r = self.http.infer("chain", [http_input("A", a)])
        np.testing.assert_array_equal(r.as_numpy("Z"), a * 6)
        np.testing.assert_array_equal(r.as_numpy("COPY"), a * 2)
        r = self.grpc.infer("chain", [grpc_input("A", a)],
                            outputs=[grpcclient.InferRequestedOutput("COPY")])
        np.testing.assert_array_equal(r.as_numpy("COPY"), a * 2)
        self.assertIsNone(r.as_numpy("Z"))

    def test_many_clients_at_once(self):
        errors = []
        def client(i):
            try:
                a = np.full((1, 4), 100 + i, dtype=np.float32)  # not 13 or 99 (faults)
                r = self.grpc.infer("chain", [grpc_input("A", a)])
                np.testing.assert_array_equal(r.as_numpy("Z"), a * 6)
            except Exception as e:  # noqa: BLE001 — reported below
                errors.append(e)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual([str(e) for e in errors], [])

    def test_metadata_and_config(self):
        m = self.http.get_model_metadata("chain")
        self.assertEqual(m["platform"], "ensemble")
        self.assertEqual([o["name"] for o in m["outputs"]], ["Z", "COPY"])
        c = self.http.get_model_config("chain")
        self.assertEqual(c["platform"], "ensemble")
        steps = c["ensemble_scheduling"]["step"]
        self.assertEqual([s["model_name"] for s in steps], ["double", "triple", "ident"])
        self.assertEqual(steps[1]["input_map"], {"x": "T"})
        self.assertEqual(steps[0]["model_version"], -1)

    def test_independent_steps_run_at_once(self):
        a = np.ones((1, 4), dtype=np.float32)
        start = time.monotonic()
        r = self.http.infer("fork", [http_input("A", a)])
        took = time.monotonic() - start
        np.testing.assert_array_equal(r.as_numpy("P"), a)
        np.testing.assert_array_equal(r.as_numpy("Q"), a * 10)
        self.assertLess(took, 1.1, "two 0.6 s steps one after the other would take 1.2 s")

    def test_a_failing_step_fails_its_request_naming_the_step(self):
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("chain", [http_input("A", np.full((1, 4), 13, np.float32))])
        self.assertIn("ensemble 'chain'", str(e.exception))
        self.assertIn("step 0 (model 'double')", str(e.exception))
        self.assertIn("ValueError: 13 is not welcome here", str(e.exception))
        self.test_a_chain_over_http_and_grpc()

    def test_the_deadline_covers_the_whole_ensemble(self):
        before = self.http.get_inference_statistics("triple")["model_stats"][0]
        # double sleeps 3 s on 99 (0.5 after doubling never reaches triple: 99 * 2 != 99).
        a = np.full((1, 4), 99, np.float32)
        start = time.monotonic()
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("chain", [grpc_input("A", a)], client_timeout=None,
                            timeout=300000)  # µs, Triton's request timeout parameter
        took = time.monotonic() - start
        self.assertLess(took, 2.5)
        self.assertIn("step 0 (model 'double')", str(e.exception))
        after = self.http.get_inference_statistics("triple")["model_stats"][0]
        self.assertEqual(after["inference_count"], before["inference_count"],
                         "no step after the one that timed out ran for the request")

    def test_statistics_per_step_and_for_the_ensemble(self):
        def count(model):
            s = self.http.get_inference_statistics(model)["model_stats"][0]
            return s["inference_stats"]["success"]["count"]
        before = {m: count(m) for m in ("chain", "double", "triple", "ident")}
        for _ in range(3):
            self.http.infer("chain", [http_input("A", np.ones((1, 4), np.float32))])
        after = {m: count(m) for m in ("chain", "double", "triple", "ident")}
        self.assertEqual({m: after[m] - before[m] for m in after},
                         {"chain": 3, "double": 3, "triple": 3, "ident": 3})
        # The ensemble's queue counts its requests, as Triton's: perf_analyzer without -x finds
        # the version it measures from the growth of that count.
        s = self.http.get_inference_statistics("chain")["model_stats"][0]["inference_stats"]
        self.assertEqual(s["queue"]["count"], s["success"]["count"])
        self.assertGreater(s["queue"]["ns"], 0)
        self.assertLess(s["queue"]["ns"], s["success"]["ns"])
        # Triton's metric families have the ensemble's requests too.
        page = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        self.assertEqual(harness.metric(page, "nv_inference_request_success", model="chain",
                                        version="1"), s["success"]["count"])
        self.assertEqual(harness.metric(page, "nv_inference_request_duration_us", model="chain",
                                        version="1"), s["success"]["ns"] // 1000)

    def test_ensembles_that_cannot_load_say_why(self):
        index = {m["name"]: m for m in self.http.get_model_repository_index()}
        self.assertEqual(index["unknown_step"]["state"], "UNAVAILABLE")
        self.assertIn("step 0 (model 'no_such_model')", index["unknown_step"]["reason"])
        self.assertEqual(index["mismatch"]["state"], "UNAVAILABLE")
        self.assertIn("tensor 'T': step 0 (model 'double') output 'y' is FP32[-1,4], but "
                      "step 1 (model 'ints') input 'x' expects INT32[-1,4]",
                      index["mismatch"]["reason"])
        self.assertTrue(self.http.is_model_ready("chain"))


# y = a - b, and y2 = a + b when the config lists y2.
SUB = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.two = len(json.loads(args["model_config"])["output"]) == 2

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "a").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "b").as_numpy()
            ts = [pb_utils.Tensor("y", a - b)]
            if self.two:
                ts.append(pb_utils.Tensor("y2", a + b))
            out.append(pb_utils.InferenceResponse(ts))
        return out
"""


def f4(name):
    return (name, "TYPE_FP32", [4])


def write_config(repo, name, text):
    with open(os.path.join(repo.path, name, "config.pbtxt"), "w") as f:
        f.write(text)


def python_config_text(name, inputs, outputs):
    return ('name: "%s"\nbackend: "python"\nmax_batch_size: 8\ninput [ %s ]\noutput [ %s ]\n'
            % (name, tensors(inputs), tensors(outputs)))


class Changes(harness.unittest.TestCase):
    """Step models and ensembles that change while the server runs (found by an adversarial
    review): reloads, cycles through ensembles, nested ensembles, poll mode, a draining stop."""

    def explicit_server(self, repo):
        s = harness.Server(repo.path, "--model-control-mode", "explicit", "--load-model", "*")
        s.start()
        self.addCleanup(s.stop)
        client = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        self.addCleanup(client.close)
        return s, client

    def test_a_reloaded_step_model_is_matched_by_name(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        python_model(repo, "sub", [f4("a"), f4("b")], [f4("y"), f4("y2")], SUB)
        ensemble(repo, "ens", [f4("X"), f4("W")], [f4("Z"), f4("S")],
                 [step("sub", {"a": "X", "b": "W"}, {"y": "Z", "y2": "S"})])
        _, client = self.explicit_server(repo)
        x, w = np.full((1, 4), 10, np.float32), np.ones((1, 4), np.float32)
        r = client.infer("ens", [http_input("X", x), http_input("W", w)])
        self.assertEqual(r.as_numpy("Z").tolist(), [[9] * 4])
        # The same model with its inputs listed the other way round: the same answers.
        write_config(repo, "sub", python_config_text("sub", [f4("b"), f4("a")],
                                                     [f4("y"), f4("y2")]))
        client.load_model("sub")
        r = client.infer("ens", [http_input("X", x), http_input("W", w)])
        self.assertEqual(r.as_numpy("Z").tolist(), [[9] * 4])
        self.assertEqual(r.as_numpy("S").tolist(), [[11] * 4])
        # Without an output the ensemble reads: an error naming it, not an empty answer.
        write_config(repo, "sub", python_config_text("sub", [f4("a"), f4("b")], [f4("y")]))
        client.load_model("sub")
        with self.assertRaises(InferenceServerException) as e:
            client.infer("ens", [http_input("X", x), http_input("W", w)])
        self.assertIn("model 'sub' was reloaded with no output 'y2'", str(e.exception))

    def test_a_cycle_through_ensembles_is_refused_and_nesting_loads_in_order(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        repo.add("idm", harness.builtin_config(
            "idm", "builtin:identity?shape=4&max_batch=8", [("input0", "TYPE_FP32", [4])],
            [("output0", "TYPE_FP32", [4])]))
        # "ea" runs "eb", which runs idm: "ea" sorts first but must load after "eb".
        ensemble(repo, "ea", [f4("A")], [f4("Z")], [step("eb", {"A": "A"}, {"Z": "Z"})])
        ensemble(repo, "eb", [f4("A")], [f4("Z")],
                 [step("idm", {"input0": "A"}, {"output0": "Z"})])
        s, client = self.explicit_server(repo)
        a = np.ones((1, 4), np.float32)
        self.assertEqual(client.infer("ea", [http_input("A", a)]).as_numpy("Z").tolist(),
                         [[1] * 4])
        ensemble(repo, "eb", [f4("A")], [f4("Z")], [step("ea", {"A": "A"}, {"Z": "Z"})])
        with self.assertRaises(InferenceServerException) as e:
            client.load_model("eb")
        self.assertIn("ensembles may not form a cycle", str(e.exception))
        self.assertEqual(client.infer("ea", [http_input("A", a)]).as_numpy("Z").tolist(),
                         [[1] * 4])
        self.assertIsNone(s.proc.poll())

    def test_poll_mode_loads_an_ensemble_once_its_step_model_comes(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        ensemble(repo, "aens", [f4("A")], [f4("Z")],
                 [step("zstep", {"input0": "A"}, {"output0": "Z"})])
        s = harness.Server(repo.path, "--model-control-mode", "poll",
                           "--repository-poll-secs", "1", "--strict-readiness", "false")
        s.start()
        self.addCleanup(s.stop)
        client = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
        self.addCleanup(client.close)
        self.assertFalse(client.is_model_ready("aens"))
        repo.add("zstep", harness.builtin_config(
            "zstep", "builtin:identity?shape=4&max_batch=8", [("input0", "TYPE_FP32", [4])],
            [("output0", "TYPE_FP32", [4])]))
        deadline = time.monotonic() + 20
        while not client.is_model_ready("aens") and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertTrue(client.is_model_ready("aens"))

    def test_a_draining_stop_lets_ensemble_requests_finish(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        scale_model(repo, "slow_first", 1, delay=1.0)
        scale_model(repo, "then", 2)
        ensemble(repo, "two", [f4("A")], [f4("Z")],
                 [step("slow_first", {"x": "A"}, {"y": "T"}), step("then", {"x": "T"}, {"y": "Z"})])
        s = harness.Server(repo.path)
        s.start()
        self.addCleanup(s.stop)
        client = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port, concurrency=4)
        self.addCleanup(client.close)
        a = np.ones((1, 4), np.float32)
        running = [client.async_infer("two", [http_input("A", a)]) for _ in range(4)]
        time.sleep(0.3)
        s.signal()  # SIGTERM: drain
        for r in running:
            self.assertEqual(r.get_result(timeout=30).as_numpy("Z").tolist(), [[2] * 4])
        s.wait(30)


if __name__ == "__main__":
    harness.main()
