"""Business logic scripting and the rest of Triton's Python backend API, through `asyncinfer
serve` and Triton's own client: model.py files that call other models (pb_utils.InferenceRequest
.exec, async_exec, exec(decoupled=True)), the model loading API, custom metrics, pb_utils.Logger,
request parameters, and the faults: an unknown model, a cycle, a crashed or slow called model, an
abandoned decoupled stream, a bad metric. Triton's own python_backend examples run in
test_python_backend_examples.py."""

import os
import shutil
import subprocess
import tarfile
import tempfile
import textwrap
import time
import urllib.request

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository, Server


def tensors(ts):
    return ", ".join('{ name: "%s", data_type: %s, dims: [ %s ] }'
                     % (n, t, ", ".join(str(d) for d in dims)) for n, t, dims in ts)


def config(name, inputs, outputs, extra="", max_batch_size=0):
    return ('name: "%s"\nbackend: "python"\nmax_batch_size: %d\ninput [ %s ]\noutput [ %s ]\n'
            % (name, max_batch_size, tensors(inputs), tensors(outputs))) + extra


def add(repo, name, cfg, source):
    repo.add(name, cfg)
    with open(os.path.join(repo.path, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(source))


X = [("x", "TYPE_FP32", [4])]
Y = [("y", "TYPE_FP32", [4])]
TARGET = [("target", "TYPE_STRING", [1])]
TEXT = [("text", "TYPE_STRING", [1])]

# y = 2x; its request's parameters and id in the log.
DOUBLE = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            pb_utils.Logger.log_info("double got parameters %s" % r.parameters())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]))
        return out
'''

# Calls the model named by `target` with x (and parameters {"hop": "1"}); returns its y, or the
# call's error message as the output of the `error` variant (text).
CALLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x")
            target = pb_utils.get_input_tensor_by_name(r, "target").as_numpy()[0]
            call = pb_utils.InferenceRequest(model_name=target, inputs=[x],
                                             requested_output_names=["y"],
                                             parameters={"hop": "1"})
            resp = call.exec()
            if resp.has_error():
                out.append(pb_utils.InferenceResponse(error=resp.error()))
                continue
            out.append(pb_utils.InferenceResponse(
                [pb_utils.get_output_tensor_by_name(resp, "y")]))
        return out
'''

# Calls `double_any` with a tensor of 200,000 floats (800 KB: the call's inputs and its response
# travel in memfds, not inline) and checks the answer itself; y = x.
BIG = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            big = np.arange(200000, dtype=np.float32)
            resp = pb_utils.InferenceRequest(
                model_name="double_any", inputs=[pb_utils.Tensor("x", big)],
                requested_output_names=["y"]).exec()
            if resp.has_error():
                raise pb_utils.TritonModelException(resp.error().message())
            y = pb_utils.get_output_tensor_by_name(resp, "y").as_numpy()
            ok = y.shape == big.shape and np.array_equal(y, 2 * big)
            y[0] = 1.0  # the response's arrays are the model's to change (copy on write)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", x * (1.0 if ok else -1.0))]))
        return out
'''

# A stateful model (sequence_batching, implicit state): OUTPUT = the sequence's running sum.
ACC_CONFIG = """name: "acc"
backend: "python"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  state [ { input_name: "ACC_IN", output_name: "ACC_OUT", data_type: TYPE_INT32, dims: [ 1 ],
            initial_state: { data_type: TYPE_INT32, dims: [ 1 ], zero_data: true, name: "z" } } ]
}
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
ACC = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            acc = pb_utils.get_input_tensor_by_name(r, "ACC_IN").as_numpy()
            total = (acc + x).astype(np.int32)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return out
'''

# Two sequences through `acc`, interleaved, by BLS (correlation_id and START / END flags): x[0]
# and x[1] three times each; y = [sum of the first, sum of the second, 0, 0].
SEQ_CALLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            sums = [0, 0]
            for step in range(3):
                flags = (START if step == 0 else 0) | (END if step == 2 else 0)
                for k, cid in enumerate((7001, "seq-b")):
                    v = np.array([[int(x[k])]], np.int32)
                    resp = pb_utils.InferenceRequest(
                        model_name="acc", inputs=[pb_utils.Tensor("INPUT", v)],
                        requested_output_names=["OUTPUT"], correlation_id=cid,
                        flags=flags).exec()
                    if resp.has_error():
                        raise pb_utils.TritonModelException(resp.error().message())
                    sums[k] = int(pb_utils.get_output_tensor_by_name(resp, "OUTPUT")
                                  .as_numpy()[0][0])
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", np.array(sums + [0, 0], np.float32))]))
        return out
'''

# async execute: 32 concurrent calls to `double`, summed: y = 64x.
FAN_OUT = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x")
            calls = [pb_utils.InferenceRequest(model_name="double", inputs=[x],
                                               requested_output_names=["y"]).async_exec()
                     for _ in range(32)]
            total = np.zeros(4, np.float32)
            for resp in await asyncio.gather(*calls):
                if resp.has_error():
                    raise pb_utils.TritonModelException(resp.error().message())
                total += pb_utils.get_output_tensor_by_name(resp, "y").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", total)]))
        return out
'''

# ping calls pong calls ping: a cycle.
PING = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x")
            resp = pb_utils.InferenceRequest(model_name="%s", inputs=[x],
                                             requested_output_names=["y"]).exec()
            if resp.has_error():
                out.append(pb_utils.InferenceResponse(error=resp.error()))
            else:
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.get_output_tensor_by_name(resp, "y")]))
        return out
'''

# Exits (a crash) when x[0] < 0, sleeps x[0] seconds otherwise, then y = x.
FRAGILE = '''
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            if x[0] < 0:
                os._exit(3)
            time.sleep(float(x[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.copy())]))
        return out
'''

# Decoupled: up to 200 responses, 20 ms apart, while its request lives; writes a marker file
# (path in the model's parameters) once it sees the request cancelled.
STREAM = '''
import json
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.marker = params["marker"]["string_value"]

    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            sender = r.get_response_sender()
            for i in range(200):
                if sender.is_cancelled():
                    open(self.marker, "w").write("cancelled after %d" % i)
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + i)]))
                time.sleep(0.02)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Takes 3 responses of `stream`, then leaves the iterator (cancel()) and returns their sum.
TAKE3 = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x")
            responses = pb_utils.InferenceRequest(
                model_name="stream", inputs=[x],
                requested_output_names=["y"]).exec(decoupled=True)
            total = np.zeros(4, np.float32)
            for k, resp in enumerate(responses):
                if resp.has_error():
                    raise pb_utils.TritonModelException(resp.error().message())
                total += pb_utils.get_output_tensor_by_name(resp, "y").as_numpy()
                if k == 2:
                    responses.cancel()
                    break
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", total)]))
        return out
'''

# Model API and metrics: answers a question named by `text`.
TOOLS = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="bls_tools_calls", description="calls of tools",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.calls = self.family.Metric(labels={"model": "tools", "version": "1"})
        self.hist = pb_utils.MetricFamily(
            name="bls_tools_sizes", description="sizes", kind=pb_utils.MetricFamily.HISTOGRAM
        ).Metric(labels={"model": "tools"}, buckets=[1.0, 10.0])

    def answer(self, q):
        if q == "ready":
            return "%s %s" % (pb_utils.is_model_ready("double"), pb_utils.is_model_ready("nope"))
        if q == "bad_metric":
            try:
                pb_utils.MetricFamily(name="bad name!", description="x",
                                      kind=pb_utils.MetricFamily.GAUGE)
            except pb_utils.TritonModelException as e:
                return "error: " + str(e)
            return "no error"
        if q == "bad_kind":
            try:
                pb_utils.MetricFamily(name="ok_name", description="x", kind=7)
            except pb_utils.TritonModelException as e:
                return "error: " + str(e)
            return "no error"
        if q == "counter_set":
            try:
                self.calls.set(3)
            except pb_utils.TritonModelException as e:
                return "error: " + str(e)
            return "no error"
        if q == "reschedule":
            try:
                self.request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            except pb_utils.TritonModelException as e:
                return "error: " + str(e)
            return "no error"
        if q == "unload_double":
            pb_utils.unload_model("double")
            return "unloaded %s" % pb_utils.is_model_ready("double")
        if q == "load_double":
            pb_utils.load_model("double")
            return "loaded %s" % pb_utils.is_model_ready("double")
        return "?"

    def execute(self, requests):
        out = []
        for r in requests:
            q = pb_utils.get_input_tensor_by_name(r, "text").as_numpy()[0].decode()
            self.request = r
            self.calls.increment(1)
            self.hist.observe(5.0)
            pb_utils.Logger.log_warn("tools asked %s" % q)
            a = np.array([self.answer(q).encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text", a)]))
        return out
'''


def fp32(x):
    i = httpclient.InferInput("x", [4], "FP32")
    i.set_data_from_numpy(np.asarray(x, np.float32))
    return i


def text(name, value):
    i = httpclient.InferInput(name, [1], "BYTES")
    i.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return i


class Bls(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.addClassCleanup(cls.repo.cleanup)
        cls.marker = os.path.join(cls.repo.path, "stream-cancelled")
        add(cls.repo, "double", config("double", X, Y), DOUBLE)
        add(cls.repo, "caller", config("caller", X + TARGET, Y), CALLER)
        add(cls.repo, "fan_out", config("fan_out", X, Y), FAN_OUT)
        add(cls.repo, "double_any", config("double_any", [("x", "TYPE_FP32", [-1])],
                                           [("y", "TYPE_FP32", [-1])]), DOUBLE)
        add(cls.repo, "big", config("big", X, Y), BIG)
        add(cls.repo, "acc", ACC_CONFIG, ACC)
        add(cls.repo, "seq_caller", config("seq_caller", X, Y), SEQ_CALLER)
        add(cls.repo, "ping", config("ping", X, Y), PING % "pong")
        add(cls.repo, "pong", config("pong", X, Y), PING % "ping")
        add(cls.repo, "self_call", config("self_call", X, Y), PING % "self_call")
        add(cls.repo, "fragile", config("fragile", X, Y), FRAGILE)
        add(cls.repo, "stream", config(
            "stream", X, Y, extra='model_transaction_policy { decoupled: true }\n'
                                  'parameters { key: "marker" value { string_value: "%s" } }\n'
                                  % cls.marker), STREAM)
        add(cls.repo, "take3", config("take3", X, Y), TAKE3)
        add(cls.repo, "tools", config("tools", TEXT, TEXT), TOOLS)
        cls.server = Server(cls.repo.path, "--model-control-mode", "explicit",
                            "--load-model", "*").start()
        cls.addClassCleanup(cls.server.stop)
        cls.client = httpclient.InferenceServerClient("127.0.0.1:%d" % cls.server.http_port,
                                                      network_timeout=60)
        cls.addClassCleanup(cls.client.close)

    def call(self, model, x, target=None, **kw):
        inputs = [fp32(x)] + ([text("target", target)] if target else [])
        return self.client.infer(model, inputs, **kw).as_numpy("y")

    def ask(self, q):
        r = self.client.infer("tools", [text("text", q)])
        return r.as_numpy("text")[0].decode()

    def test_exec_runs_the_called_model_as_a_client_request(self):
        x = [1, 2, 3, 4]
        np.testing.assert_array_equal(self.call("caller", x, "double"), 2 * np.float32(x))
        # The BLS request's parameters reached the called model; its statistics count it.
        harness.wait_for(lambda: 'double got parameters {"hop":"1"}' in self.server.log(),
                         what="the called model's log line with the call's parameters")
        stats = self.client.get_inference_statistics("double")["model_stats"][0]
        self.assertGreaterEqual(int(stats["inference_count"]), 1)

    def test_client_parameters_reach_model_py(self):
        self.client.infer("double", [fp32([1, 1, 1, 1])], parameters={"color": "blue"})
        harness.wait_for(lambda: 'double got parameters {"color":"blue"}' in self.server.log(),
                         what="the model's log line with the request's parameters")

    def test_async_exec_fans_out(self):
        x = np.float32([1, -1, 0.5, 2])
        np.testing.assert_allclose(self.call("fan_out", x), 64 * x)

    def test_bls_drives_sequences_of_a_stateful_model(self):
        np.testing.assert_array_equal(self.call("seq_caller", [2, 5, 0, 0]), [6, 15, 0, 0])
        # Each call started its sequences afresh (START): the same again.
        np.testing.assert_array_equal(self.call("seq_caller", [1, 1, 0, 0]), [3, 3, 0, 0])

    def test_large_tensors_travel_in_memfds(self):
        np.testing.assert_array_equal(self.call("big", [1, 2, 3, 4]), [1, 2, 3, 4])

    def test_unknown_model_is_an_error_in_the_caller_which_goes_on(self):
        with self.assertRaises(InferenceServerException) as e:
            self.call("caller", [1, 2, 3, 4], "no_such_model")
        self.assertIn("no_such_model", str(e.exception))
        np.testing.assert_array_equal(self.call("caller", [1, 1, 1, 1], "double"), [2, 2, 2, 2])

    def test_cycle_is_refused_with_the_chain(self):
        start = time.monotonic()
        with self.assertRaises(InferenceServerException) as e:
            self.call("ping", [1, 2, 3, 4])
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("'ping' -> 'pong' -> 'ping'", str(e.exception))
        self.assertIn("could never run", str(e.exception))
        with self.assertRaises(InferenceServerException) as e:
            self.call("self_call", [1, 2, 3, 4])
        self.assertIn("'self_call' -> 'self_call'", str(e.exception))
        # Both models serve on.
        np.testing.assert_array_equal(self.call("caller", [1, 1, 1, 1], "double"), [2, 2, 2, 2])

    def test_called_model_crash_reaches_the_caller(self):
        with self.assertRaises(InferenceServerException) as e:
            self.call("caller", [-1, 0, 0, 0], "fragile")
        self.assertIn("fragile", str(e.exception))
        # fragile restarts its process; the caller goes on.
        np.testing.assert_array_equal(self.call("caller", [0, 1, 2, 3], "fragile"), [0, 1, 2, 3])

    def test_callers_deadline_ends_the_call(self):
        start = time.monotonic()
        with self.assertRaises(InferenceServerException) as e:
            # fragile sleeps 5 s; the client's request allows 0.5 s.
            self.call("caller", [5, 0, 0, 0], "fragile", timeout=500_000)
        self.assertLess(time.monotonic() - start, 4.5)
        self.assertIn("time", str(e.exception).lower())

    def test_abandoned_decoupled_iterator_cancels_the_stream(self):
        if os.path.exists(self.marker):
            os.unlink(self.marker)
        x = np.float32([0, 0, 0, 0])
        np.testing.assert_array_equal(self.call("take3", x), [3, 3, 3, 3])  # 0 + 1 + 2
        harness.wait_for(lambda: os.path.exists(self.marker), timeout=10,
                         what="the decoupled model to see its request cancelled")
        with open(self.marker) as f:
            sent = int(f.read().split()[-1])
        self.assertLess(sent, 100)

    def test_model_api_metrics_and_logger(self):
        self.assertEqual(self.ask("ready"), "True False")
        self.assertIn("Prometheus name", self.ask("bad_metric"))
        self.assertIn("COUNTER, GAUGE or HISTOGRAM", self.ask("bad_kind"))
        self.assertIn("takes increment()", self.ask("counter_set"))
        self.assertIn("iterative_sequence", self.ask("reschedule"))
        with urllib.request.urlopen(self.server.metrics_url, timeout=10) as r:
            metrics = r.read().decode()
        self.assertRegex(metrics, r'bls_tools_calls\{model="tools",version="1"\} [1-9]')
        self.assertIn('bls_tools_sizes_bucket{model="tools",le="10"}', metrics)
        harness.wait_for(lambda: "python model 'tools' instance tools_0_0: tools asked ready"
                         in self.server.log(), what="the Logger line in the server's log")
        self.assertEqual(self.ask("unload_double"), "unloaded False")
        with self.assertRaises(InferenceServerException):
            self.call("caller", [1, 1, 1, 1], "double")
        self.assertEqual(self.ask("load_double"), "loaded True")
        np.testing.assert_array_equal(self.call("caller", [1, 1, 1, 1], "double"), [2, 2, 2, 2])


# auto_complete_config: the whole signature comes from model.py; y = x + 1.
AUTO = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(%d)
        auto_complete_model_config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() + 1)]) for r in requests]
'''

# Says which Python runs it (sys.prefix).
PREFIX = '''
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        a = np.array([sys.prefix.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("text", a)]) for r in requests]
'''


class PythonBackendApi(harness.unittest.TestCase):
    """auto_complete_config and EXECUTION_ENV_PATH, at load."""

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.addClassCleanup(cls.repo.cleanup)
        add(cls.repo, "auto", 'name: "auto"\nbackend: "python"\n', AUTO % 4)
        add(cls.repo, "auto_contradicted", 'name: "auto_contradicted"\nbackend: "python"\n'
            'max_batch_size: 8\n', AUTO % 2)
        # A Python environment of the model's own (a venv that sees Debian's numpy), as a folder
        # and as a tarball.
        env = os.path.join(cls.repo.path, "envs", "pyenv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip",
                        env], check=True, timeout=120)
        cls.tarball = os.path.join(cls.repo.path, "envs", "pyenv-%d.tar.gz" % os.getpid())
        with tarfile.open(cls.tarball, "w:gz") as t:
            t.add(env, arcname=".")
        cls.env = os.path.realpath(env)
        add(cls.repo, "env_dir", config("env_dir", TEXT, TEXT, extra=
            'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "%s" } }\n' % env),
            PREFIX)
        add(cls.repo, "env_tar", config("env_tar", TEXT, TEXT, extra=
            'parameters { key: "EXECUTION_ENV_PATH" value { string_value: '
            '"$$TRITON_MODEL_DIRECTORY/../envs/%s" } }\n' % os.path.basename(cls.tarball)),
            PREFIX)
        cls.server = Server(cls.repo.path, "--model-control-mode", "explicit",
                            "--load-model", "auto", "--load-model", "env_dir",
                            "--load-model", "env_tar").start()
        cls.addClassCleanup(cls.server.stop)
        cls.client = httpclient.InferenceServerClient("127.0.0.1:%d" % cls.server.http_port,
                                                      network_timeout=60)
        cls.addClassCleanup(cls.client.close)

    @classmethod
    def tearDownClass(cls):
        stem = os.path.basename(cls.tarball).split(".")[0]
        cache = os.path.join(tempfile.gettempdir(), "asyncinfer-python-envs")
        for d in os.listdir(cache) if os.path.isdir(cache) else []:
            if d.startswith(stem + "-"):
                shutil.rmtree(os.path.join(cache, d), ignore_errors=True)

    def test_auto_complete_config_gives_the_signature(self):
        x = httpclient.InferInput("x", [1, 4], "FP32")  # batched: max_batch_size 4
        x.set_data_from_numpy(np.float32([[1, 2, 3, 4]]))
        r = self.client.infer("auto", [x])
        np.testing.assert_array_equal(r.as_numpy("y"), [[2, 3, 4, 5]])
        c = self.client.get_model_config("auto")
        self.assertEqual(c["max_batch_size"], 4)
        self.assertIn("dynamic_batching", c)
        self.assertEqual([i["name"] for i in c["input"]], ["x"])

    def test_auto_complete_config_that_contradicts_the_config_is_refused(self):
        with self.assertRaises(InferenceServerException) as e:
            self.client.load_model("auto_contradicted")
        self.assertIn("max_batch_size 8", str(e.exception))
        self.assertIn("auto_complete_config sets max_batch_size 2", str(e.exception))

    def infer_text(self, model):
        return self.client.infer(model, [text("text", "?")]).as_numpy("text")[0].decode()

    def test_execution_env_path_folder(self):
        self.assertEqual(self.infer_text("env_dir"), self.env)

    def test_execution_env_path_tarball_is_unpacked_once(self):
        prefix = self.infer_text("env_tar")
        self.assertIn("asyncinfer-python-envs", prefix)
        self.assertTrue(os.path.basename(prefix).startswith(
            os.path.basename(self.tarball).split(".")[0] + "-"), prefix)


if __name__ == "__main__":
    harness.main()
