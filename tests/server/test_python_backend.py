"""Python models (backend: "python", <version>/model.py) through `asyncinfer serve`, checked with
Triton's own client (tritonclient, pinned in scripts/requirements-tritonclient.txt).

Each model.py below is written as for Triton's Python backend: `import triton_python_backend_utils
as pb_utils`, class TritonPythonModel with initialize / execute / finalize. What is checked: the
answers over HTTP and gRPC, one process per instance, several requests per execute under dynamic
batching, BYTES tensors, args and the config's parameters, errors from initialize and execute and
from an InferenceResponse, a process that exits or segfaults (restarted), one that hangs (the
watchdog replaces it), outputs of the wrong dtype or shape or too few responses, decoupled models
through get_response_sender(), a client that cancels its stream, allow_ragged_batch, and
finalize() on unload."""

import json
import os
import textwrap
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository, Server
from triton_fixture import Collector, serve


def tensors(ts):
    return ", ".join('{ name: "%s", data_type: %s, dims: [ %s ] }'
                     % (n, t, ", ".join(str(d) for d in dims)) for n, t, dims in ts)


def python_config(name, inputs, outputs, max_batch_size=8, extra=""):
    return ('name: "%s"\nbackend: "python"\nmax_batch_size: %d\ninput [ %s ]\noutput [ %s ]\n'
            % (name, max_batch_size, tensors(inputs), tensors(outputs))) + extra


def add_python(repo, name, config, source):
    repo.add(name, config)
    with open(os.path.join(repo.path, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(source))


FP32x4 = [("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])]
OUT_FP32x4 = [("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])]

# Triton's python_backend examples/add_sub/model.py, as its users write it.
ADD_SUB = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (in_0.as_numpy() + in_1.as_numpy(),
                            in_0.as_numpy() - in_1.as_numpy())
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub finalize called")
'''

# Reports what it was given: its pid, len(requests) of the execute, args and a parameter.
WHOAMI = '''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.greeting = json.loads(args["model_config"])["parameters"]["greeting"]["string_value"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            rows = x.shape[0]
            info = json.dumps({"pid": os.getpid(), "batch": len(requests),
                               "name": self.args["model_name"],
                               "version": self.args["model_version"],
                               "instance": self.args["model_instance_name"],
                               "repository": self.args["model_repository"],
                               "greeting": self.greeting})
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("info", np.array([[info]] * rows, dtype=np.object_)),
                pb_utils.Tensor("y", x * 2)]))
        return out
'''

STRINGS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            s = pb_utils.get_input_tensor_by_name(r, "text").as_numpy()
            upper = np.array([[v.decode("utf-8").upper() for v in row] for row in s],
                             dtype=np.object_)
            lengths = np.array([[len(v) for v in row] for row in s], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("upper", upper),
                                                   pb_utils.Tensor("length", lengths)]))
        return out
'''

# x[0] selects a fault: 1 raise, 2 TritonError response, 3 os._exit(1), 4 segfault, 5 sleep for
# ever, 6 wrong dtype, 7 wrong shape, 8 too few responses, 9 missing output; else identity.
FAULTY = '''
import ctypes, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            mode = int(x[0, 0])
            if mode == 1:
                raise RuntimeError("mode 1 asked me to raise")
            if mode == 3:
                os._exit(1)
            if mode == 4:
                ctypes.string_at(0)
            if mode == 5:
                time.sleep(10 ** 6)
            if mode == 8:
                return []
            if mode == 10:
                time.sleep(0.3)  # the requests sent meanwhile queue up behind it
            if mode == 11:  # how many requests this execute got
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "y", np.array([[11, len(requests)]], np.float32))]))
                continue
            if mode == 2:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "mode 2 is a bad row", pb_utils.TritonError.INVALID_ARG)))
            elif mode == 6:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.astype(np.float64))]))
            elif mode == 7:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", np.zeros((x.shape[0], 3), np.float32))]))
            elif mode == 9:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("other", x)]))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.copy())]))
        return out
'''

# What a hostile or careless model.py does (from an adversarial review), by x[0]: 20 truncates
# the server's input arena, 21 forks a child that keeps the control socket and exits, 23 answers
# with a 300 KB error message, 24 with an error whose code is not a number. Every call keeps a
# view of its input and reads the previous one (arrays kept past their execute).
HOSTILE = '''
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = None

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        previous = float(self.kept.sum()) if self.kept is not None else 0.0
        self.kept = x
        mode = int(x[0, 0])
        if mode == 20:
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if "asyncinfer-python-input" in os.readlink("/proc/self/fd/" + fd):
                        os.ftruncate(int(fd), 0)
                except OSError:
                    pass
        if mode == 21:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            os._exit(1)
        if mode == 23:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("x" * 300000))]
        if mode == 24:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("no code", None))]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x + previous * 0)])]
'''

# Decoupled, sends every 50 ms and never looks at is_cancelled().
DEAF = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        n = int(pb_utils.get_input_tensor_by_name(requests[0], "n").as_numpy()[0])
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("out", np.array([i], np.int32))]))
            time.sleep(0.05)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

BROKEN_INIT = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("no weights in " + args["model_name"])

    def execute(self, requests):
        return []
'''

# Decoupled: for input n, n responses (out = i) from a thread of its own, then the final flag.
REPEAT = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "n").as_numpy()[0])
            sender = r.get_response_sender()
            threading.Thread(target=self.run, args=(n, sender)).start()
        return None

    def run(self, n, sender):
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("out", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

# Decoupled, sends until the request is cancelled.
ENDLESS = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            i = 0
            while not sender.is_cancelled():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("out", np.array([i], np.int32))]))
                i += 1
                time.sleep(0.005)
            pb_utils.Logger.log_info("endless saw is_cancelled after %d responses" % i)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

DECOUPLED = "model_transaction_policy { decoupled: true }\n"


def stub_pids(server_pid):
    """pids of the server's python instance processes, by model name."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server_pid and b"asyncinfer-python-stub" in argv:
            model = argv[argv.index(b"asyncinfer-python-stub") + 1].decode()
            out.setdefault(model.split("/")[-3], []).append(int(entry))
    return out


def wait_for_processes(server, model, count, timeout=15):
    """The pids of `model`'s instance processes once there are `count` of them (a replaced
    instance's process ends within the backend's 2 s grace)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = stub_pids(server.proc.pid).get(model, [])
        if len(pids) == count or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def http_input(name, x, datatype="FP32"):
    i = httpclient.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x)
    return i


def grpc_input(name, x, datatype="FP32"):
    i = grpcclient.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x)
    return i


class PythonModels(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        add_python(cls.repo, "add_sub", python_config(
            "add_sub", FP32x4, OUT_FP32x4,
            extra="instance_group [ { count: 2, kind: KIND_CPU } ]\n"), ADD_SUB)
        add_python(cls.repo, "whoami", python_config(
            "whoami", [("x", "TYPE_FP32", [2])],
            [("info", "TYPE_STRING", [1]), ("y", "TYPE_FP32", [2])],
            extra='dynamic_batching { max_queue_delay_microseconds: 300000 }\n'
                  'parameters { key: "greeting" value { string_value: "hello" } }\n'), WHOAMI)
        add_python(cls.repo, "strings", python_config(
            "strings", [("text", "TYPE_STRING", [-1])],
            [("upper", "TYPE_STRING", [-1]), ("length", "TYPE_INT32", [-1])]), STRINGS)
        add_python(cls.repo, "faulty", python_config(
            "faulty", [("x", "TYPE_FP32", [2])], [("y", "TYPE_FP32", [2])],
            extra='parameters { key: "watchdog_ms" value { string_value: "1500" } }\n'), FAULTY)
        add_python(cls.repo, "repeat", python_config(
            "repeat", [("n", "TYPE_INT32", [1])], [("out", "TYPE_INT32", [1])],
            max_batch_size=0, extra=DECOUPLED), REPEAT)
        add_python(cls.repo, "endless", python_config(
            "endless", [("n", "TYPE_INT32", [1])], [("out", "TYPE_INT32", [1])],
            max_batch_size=0, extra=DECOUPLED), ENDLESS)
        add_python(cls.repo, "hostile", python_config(
            "hostile", [("x", "TYPE_FP32", [-1])], [("y", "TYPE_FP32", [-1])]), HOSTILE)
        add_python(cls.repo, "deaf", python_config(
            "deaf", [("n", "TYPE_INT32", [1])], [("out", "TYPE_INT32", [1])],
            max_batch_size=0, extra=DECOUPLED), DEAF)
        add_python(cls.repo, "broken_init", python_config(
            "broken_init", [("x", "TYPE_FP32", [2])], [("y", "TYPE_FP32", [2])]), BROKEN_INIT)
        serve(cls, cls.repo.path, repo=cls.repo)

    def add_sub_inputs(self, make):
        a = np.array([[1, 2, 3, 4]], dtype=np.float32)
        b = np.array([[0.5, 0.5, 10, -1]], dtype=np.float32)
        return a, b, [make("INPUT0", a), make("INPUT1", b)]

    def test_add_sub_over_http_and_grpc(self):
        a, b, inputs = self.add_sub_inputs(http_input)
        r = self.http.infer("add_sub", inputs)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
        a, b, inputs = self.add_sub_inputs(grpc_input)
        r = self.grpc.infer("add_sub", inputs)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)

    def test_metadata_and_config(self):
        m = self.http.get_model_metadata("add_sub")
        self.assertEqual(m["platform"], "python")
        c = self.http.get_model_config("add_sub")
        self.assertEqual(c["backend"], "python")
        self.assertEqual(c["default_model_filename"], "model.py")

    def test_each_instance_is_a_process_of_its_own(self):
        pids = stub_pids(self.server.proc.pid)
        self.assertEqual(len(pids["add_sub"]), 2, pids)
        self.assertEqual(len(pids["whoami"]), 1, pids)
        self.assertNotIn("broken_init", pids)

    def test_args_parameters_and_batches_of_several_requests(self):
        results = []
        def one(i):
            x = np.array([[i, i + 0.5]], dtype=np.float32)
            r = self.grpc.infer("whoami", [grpc_input("x", x)])
            np.testing.assert_array_equal(r.as_numpy("y"), x * 2)
            results.append(json.loads(r.as_numpy("info")[0][0]))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(len(results), 6)
        first = results[0]
        self.assertEqual(first["name"], "whoami")
        self.assertEqual(first["version"], "1")
        self.assertEqual(first["instance"], "whoami_0_0")
        self.assertEqual(first["greeting"], "hello")
        self.assertEqual(first["repository"], os.path.join(self.repo.path, "whoami"))
        self.assertNotEqual(first["pid"], self.server.proc.pid)
        # max_queue_delay 300 ms: the six requests sent at once meet in few executes.
        self.assertGreater(max(r["batch"] for r in results), 1, results)

    def test_bytes_in_and_out(self):
        text = np.array([["héllo".encode(), b"", b"abc"]], dtype=np.object_)
        r = self.http.infer("strings", [http_input("text", text, "BYTES")])
        self.assertEqual(r.as_numpy("upper").tolist(), [["HÉLLO".encode(), b"", b"ABC"]])
        self.assertEqual(r.as_numpy("length").tolist(), [[6, 0, 3]])  # UTF-8 bytes
        r = self.grpc.infer("strings", [grpc_input("text", text, "BYTES")])
        self.assertEqual(r.as_numpy("upper").tolist(), [["HÉLLO".encode(), b"", b"ABC"]])

    def faulty(self, mode):
        x = np.array([[mode, 7]], dtype=np.float32)
        return self.http.infer("faulty", [http_input("x", x)])

    def assert_faulty_serves(self):
        r = self.faulty(0)
        self.assertEqual(r.as_numpy("y").tolist(), [[0, 7]])

    def test_initialize_raising_leaves_that_model_unavailable(self):
        index = {m["name"]: m for m in self.http.get_model_repository_index()}
        self.assertEqual(index["broken_init"]["state"], "UNAVAILABLE")
        self.assertIn("ValueError: no weights in broken_init", index["broken_init"]["reason"])
        self.assertTrue(self.http.is_model_ready("add_sub"))
        self.server.wait_line(r"Traceback")

    def test_execute_raising_fails_that_request_only(self):
        with self.assertRaises(InferenceServerException) as e:
            self.faulty(1)
        self.assertIn("RuntimeError: mode 1 asked me to raise", str(e.exception))
        self.assert_faulty_serves()
        self.server.wait_line(r"execute raised:")

    def test_requests_queued_together_are_each_an_execute_of_their_own(self):
        # Without dynamic_batching, Triton gives execute() one request at a time. Requests that
        # queue together reach the process in one message (coalesced), and each is still an
        # execute of its own: one that raises, answers with an error or with a wrong shape fails
        # alone.
        before = self.http.get_inference_statistics("faulty")["model_stats"][0]
        # The first 16 answer normally (a launch that fails as a whole runs its requests again,
        # each alone, which would hide an execute that got several); then every way to fail.
        modes = [10] + [11] * 15 + [[11, 0, 1, 2, 7][i % 5] for i in range(40)]
        results = [None] * len(modes)
        done = threading.Event()
        def record(i, result, error):
            results[i] = error if error is not None else result.as_numpy("y").tolist()
            if all(r is not None for r in results):
                done.set()
        for i, mode in enumerate(modes):
            x = np.array([[mode, 1000 + i]], dtype=np.float32)
            self.grpc.async_infer("faulty", [grpc_input("x", x)],
                                  lambda result, error, i=i: record(i, result, error))
            if i == 0:
                time.sleep(0.05)  # the first one is executing when the others come
        self.assertTrue(done.wait(30), results)
        for i, (mode, got) in enumerate(zip(modes, results)):
            if mode == 11:
                self.assertEqual(got, [[11, 1]], i)
            elif mode in (0, 10):
                self.assertEqual(got, [[mode, 1000 + i]], i)
            else:
                self.assertIsInstance(got, InferenceServerException, (i, got))
                want = {1: "mode 1 asked me to raise", 2: "mode 2 is a bad row",
                        7: "output 'y'"}[mode]
                self.assertIn(want, str(got), i)
        after = self.http.get_inference_statistics("faulty")["model_stats"][0]
        ok = sum(1 for m in modes if m in (0, 10, 11))
        self.assertEqual(int(after["inference_count"]) - int(before["inference_count"]), ok)
        # Every successful request was an execution of its own, of one row.
        self.assertGreaterEqual(
            int(after["execution_count"]) - int(before["execution_count"]), ok)
        self.assertEqual([int(b["batch_size"]) for b in after["batch_stats"]], [1])

    def test_error_response_reaches_its_request(self):
        with self.assertRaises(InferenceServerException) as e:
            self.faulty(2)
        self.assertIn("mode 2 is a bad row", str(e.exception))
        self.assertEqual(e.exception.status(), "400")  # TritonError.INVALID_ARG
        self.assert_faulty_serves()

    def test_exit_and_segfault_restart_the_instance(self):
        before = wait_for_processes(self.server, "faulty", 1)
        with self.assertRaises(InferenceServerException) as e:
            self.faulty(3)
        self.assertIn("exited with status 1", str(e.exception))
        self.assert_faulty_serves()
        with self.assertRaises(InferenceServerException) as e:
            self.faulty(4)
        self.assertIn("SIGSEGV", str(e.exception))
        self.assert_faulty_serves()
        after = wait_for_processes(self.server, "faulty", 1)
        self.assertEqual(len(after), 1)
        self.assertNotEqual(before, after)
        self.server.wait_line(r"instance faulty_0_0: restarted")

    def test_a_hung_instance_is_replaced_by_the_watchdog(self):
        start = time.monotonic()
        with self.assertRaises(InferenceServerException):
            self.faulty(5)
        self.assertLess(time.monotonic() - start, 10)
        deadline = time.monotonic() + 30
        while True:  # the worker is replaced in the background: it serves again shortly
            try:
                self.assert_faulty_serves()
                break
            except InferenceServerException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # The hung process is killed (after the 2 s grace), the new one serves.
        self.assertEqual(len(wait_for_processes(self.server, "faulty", 1)), 1)

    def test_wrong_outputs_are_errors_naming_them(self):
        cases = {6: "output 'y' is FP64, the config says FP32",
                 7: "output 'y' has shape [1,3]",
                 8: "execute returned 0 response(s) for 1 request(s)",
                 9: "no output 'y'"}
        for mode, message in cases.items():
            with self.subTest(mode=mode):
                with self.assertRaises(InferenceServerException) as e:
                    self.faulty(mode)
                self.assertIn(message, str(e.exception))
        self.assert_faulty_serves()

    def hostile(self, mode, size=4):
        x = np.zeros((1, size), dtype=np.float32)
        x[0, 0] = mode
        return self.http.infer("hostile", [http_input("x", x)])

    def test_a_model_that_truncates_its_input_arena_does_not_crash_the_server(self):
        self.hostile(20)
        self.hostile(0)
        self.assertIsNone(self.server.proc.poll())

    def test_an_exit_is_seen_while_a_forked_child_holds_the_socket(self):
        start = time.monotonic()
        with self.assertRaises(InferenceServerException) as e:
            self.hostile(21)
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("exited with status 1", str(e.exception))
        self.hostile(0)

    def test_arrays_kept_past_execute_survive_a_larger_arena(self):
        self.hostile(0)
        self.hostile(0, size=600000)  # 2.4 MB: a new input arena
        self.hostile(0)
        self.assertIsNone(self.server.proc.poll())

    def test_long_and_odd_error_responses(self):
        with self.assertRaises(InferenceServerException) as e:
            self.hostile(23)
        self.assertIn("xxxx", str(e.exception))
        with self.assertRaises(InferenceServerException) as e:
            self.hostile(24)
        self.assertIn("no code", str(e.exception))
        self.hostile(0)

    def test_a_process_killed_between_requests_is_restarted_for_the_next(self):
        self.hostile(0)
        pid = wait_for_processes(self.server, "hostile", 1)[0]
        os.kill(pid, 9)
        time.sleep(0.2)
        r = self.hostile(0)
        self.assertEqual(r.as_numpy("y").shape, (1, 4))

    def test_the_grace_period_is_not_renewed_by_sends(self):
        # A decoupled model that ignores is_cancelled(): once its stream is cancelled, it is
        # stopped 2 s later (restarted for the next request), however often it sends.
        c, got = self.stream()
        c.async_stream_infer("deaf", [grpc_input("n", np.array([100000], np.int32), "INT32")])
        got.take(2)
        c.stop_stream(cancel_requests=True)
        c2, got2 = self.stream()
        self.addCleanup(c2.stop_stream)
        start = time.monotonic()
        c2.async_stream_infer("deaf", [grpc_input("n", np.array([1], np.int32), "INT32")])
        result, error = got2.take(1, timeout=15)[0]
        self.assertIsNone(error)
        self.assertLess(time.monotonic() - start, 8)

    def stream(self):
        c = grpcclient.InferenceServerClient(self.server.grpc_target)
        self.addCleanup(c.close)
        got = Collector()
        c.start_stream(callback=got)
        return c, got

    def test_decoupled_responses_from_a_thread_of_the_model(self):
        c, got = self.stream()
        self.addCleanup(c.stop_stream)
        for n in (3, 0):
            c.async_stream_infer("repeat", [grpc_input("n", np.array([n], np.int32), "INT32")],
                                 request_id="n%d" % n, enable_empty_final_response=True)
            items = got.take(n + 1)
            for i, (result, error) in enumerate(items):
                self.assertIsNone(error)
                self.assertEqual(result.get_response().id, "n%d" % n)
                final = result.get_response().parameters["triton_final_response"].bool_param
                self.assertEqual(final, i == n)
                if i < n:
                    self.assertEqual(result.as_numpy("out").tolist(), [i])

    def test_decoupled_is_unimplemented_on_unary_infer(self):
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("repeat", [grpc_input("n", np.array([1], np.int32), "INT32")])
        self.assertIn("decoupled", str(e.exception))

    def test_cancelling_the_stream_is_seen_by_is_cancelled(self):
        for round in range(2):  # the instance is free again after a cancelled stream
            c, got = self.stream()
            c.async_stream_infer("endless", [grpc_input("n", np.array([0], np.int32), "INT32")])
            got.take(3)
            c.stop_stream(cancel_requests=True)
            c.close()
            self.server.wait_line(r"endless saw is_cancelled after \d+ responses", timeout=20)
            with self.server._cond:
                self.server.lines = [l for l in self.server.lines if "endless saw" not in l]


# Echoes x, and how long its request's parameters are (their JSON text).
ECHO_PARAMETERS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            n = np.array([[len(r.parameters())]], np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.copy()),
                                                   pb_utils.Tensor("length", n)]))
        return out
'''

# x[0] == -1: an error response of 16,000 characters; x[0] == -2: 2.4 MB of zeros; else x.
ERRORS_OR_ECHO = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            if x[0, 0] == -1:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("E" * 16000)))
            elif x[0, 0] == -2:
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", np.zeros((1, 600000), np.float32))]))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.copy())]))
        return out
'''


class OverTheSocketsLimit(harness.unittest.TestCase):
    """Messages longer than the control socket takes (160 KiB): a batch's requests described
    with large parameters, and a reply refused for its length. Both once left one side reading
    an arena the other had replaced: later requests got earlier requests' data, with no error."""

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        echo_io = ([("x", "TYPE_FP32", [-1])],
                   [("y", "TYPE_FP32", [-1]), ("length", "TYPE_INT64", [1])])
        # Two batches in flight (no dynamic batching) and one at a time (dynamic batching):
        # both describe their batches in write_inputs.
        add_python(cls.repo, "echo_parameters", python_config("echo_parameters", *echo_io),
                   ECHO_PARAMETERS)
        add_python(cls.repo, "echo_parameters_batched", python_config(
            "echo_parameters_batched", *echo_io,
            extra="dynamic_batching { max_queue_delay_microseconds: 1000 }\n"), ECHO_PARAMETERS)
        # Twelve requests make one batch (or two seconds pass).
        add_python(cls.repo, "errors_or_echo", python_config(
            "errors_or_echo", [("x", "TYPE_FP32", [-1])], [("y", "TYPE_FP32", [-1])],
            max_batch_size=16,
            extra="dynamic_batching { preferred_batch_size: [ 12 ] "
                  "max_queue_delay_microseconds: 2000000 }\n"), ERRORS_OR_ECHO)
        serve(cls, cls.repo.path, repo=cls.repo)

    def echo(self, model, x, **kwargs):
        r = self.http.infer(model, [http_input("x", x)], **kwargs)
        np.testing.assert_array_equal(r.as_numpy("y"), x)
        return int(r.as_numpy("length")[0, 0])

    def test_parameters_longer_than_the_socket_takes(self):
        for model in ("echo_parameters", "echo_parameters_batched"):
            with self.subTest(model=model):
                self.echo(model, np.full((1, 4), 1, np.float32))
                big = np.arange(600000, dtype=np.float32).reshape(1, -1)  # a new input arena
                length = self.echo(model, big, parameters={"note": "p" * 200000})
                self.assertGreater(length, 200000)
                for k in range(3):  # each later request gets its own data back
                    self.assertEqual(self.echo(model, np.full((1, 4), 10 + k, np.float32)), 2)  # "{}"

    def batch_of_twelve(self, firsts):
        """Twelve requests at once (one batch): request k sends [firsts[k], k]."""
        results = [None] * len(firsts)

        def one(k):
            client = httpclient.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            x = np.array([[firsts[k], k]], np.float32)
            try:
                results[k] = (x, client.infer("errors_or_echo", [http_input("x", x)]))
            except InferenceServerException as e:
                results[k] = (x, e)
            finally:
                client.close()

        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(firsts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return results

    def test_a_reply_too_long_keeps_the_output_arena_it_grew(self):
        for x, r in self.batch_of_twelve([0] * 12):
            np.testing.assert_array_equal(r.as_numpy("y"), x)
        # 2.4 MB of outputs (the stub grows its output arena) and eleven 16,000-character errors:
        # the reply is too long for the socket, so the batch fails, and the engine runs each of
        # its requests again alone (their own answers then, the errors as errors).
        for x, r in self.batch_of_twelve([-2] + [-1] * 11):
            if x[0, 0] == -2:
                self.assertNotIsInstance(r, InferenceServerException, str(r))
                np.testing.assert_array_equal(r.as_numpy("y"), np.zeros((1, 600000), np.float32))
            else:
                self.assertIsInstance(r, InferenceServerException)
                self.assertIn("E" * 100, str(r))
        for x, r in self.batch_of_twelve([7] * 12):
            self.assertNotIsInstance(r, InferenceServerException, str(r))
            np.testing.assert_array_equal(r.as_numpy("y"), x)


SLOW_INITIALIZE = '''
import os
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(2.5)
        if os.path.exists(os.path.join(args["model_repository"], "fail_initialize")):
            raise RuntimeError("fail_initialize is there")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
            for r in requests]
'''


class ARestartLongerThanTheRequests(harness.unittest.TestCase):
    """A process that died is started again for the next batch. Once, the restart was bounded
    by that batch: with an initialize() longer than every request's timeout, each batch started
    a process that its requests' end then killed, and the instance never came back."""

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        add_python(cls.repo, "slow_initialize", python_config(
            "slow_initialize", [("x", "TYPE_FP32", [2])], [("y", "TYPE_FP32", [2])]),
            SLOW_INITIALIZE)
        serve(cls, cls.repo.path, repo=cls.repo)

    def test_requests_with_short_timeouts_see_it_back(self):
        x = np.array([[1, 2]], np.float32)
        self.http.infer("slow_initialize", [http_input("x", x)])
        os.kill(wait_for_processes(self.server, "slow_initialize", 1)[0], 9)
        answered = None
        deadline = time.monotonic() + 15
        while answered is None and time.monotonic() < deadline:
            try:
                # Triton's request timeout (microseconds): 1 s, under initialize()'s 2.5 s.
                answered = self.http.infer("slow_initialize", [http_input("x", x)],
                                           timeout=1000000)
            except InferenceServerException:
                time.sleep(0.1)
        self.assertIsNotNone(answered, "no request answered within 15 s of the process's end")
        np.testing.assert_array_equal(answered.as_numpy("y"), x)

    def kill_and_give_up_on_the_restart(self, x):
        os.kill(wait_for_processes(self.server, "slow_initialize", 1)[0], 9)
        time.sleep(0.2)
        with self.assertRaises(InferenceServerException):  # it starts the restart, then ends
            self.http.infer("slow_initialize", [http_input("x", x)], timeout=500000)
        time.sleep(3)  # the restart has ended, with nobody waiting for it

    def test_what_a_restart_nobody_waited_for_gave_is_checked_first(self):
        x = np.array([[3, 4]], np.float32)
        self.http.infer("slow_initialize", [http_input("x", x)])
        # Its process died before a batch took it: the next batch restarts it again.
        self.kill_and_give_up_on_the_restart(x)
        os.kill(wait_for_processes(self.server, "slow_initialize", 1)[0], 9)
        time.sleep(0.2)  # gone, as the next batch sees
        r = self.http.infer("slow_initialize", [http_input("x", x)])
        np.testing.assert_array_equal(r.as_numpy("y"), x)
        # It failed (initialize raised), and the cause has gone since: tried again, not reported.
        flag = os.path.join(self.repo.path, "slow_initialize", "fail_initialize")
        with open(flag, "w"):
            pass
        try:
            self.kill_and_give_up_on_the_restart(x)
        finally:
            os.remove(flag)
        r = self.http.infer("slow_initialize", [http_input("x", x)])
        np.testing.assert_array_equal(r.as_numpy("y"), x)


# y = x * 2 with x's own length; batch = how many requests this execute() got, shapes = how many
# distinct shapes of x among them.
RAGGED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        batch = np.array([[len(requests)]], np.int32)
        shapes = np.array([[len({x.shape for x in xs})]], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2),
                                            pb_utils.Tensor("batch", batch),
                                            pb_utils.Tensor("shapes", shapes)]) for x in xs]
'''


class RaggedBatches(harness.unittest.TestCase):
    """Triton's allow_ragged_batch on a python model's input: the dynamic batcher puts requests
    of different lengths into one execute(), each request with its own tensor; without it, a
    batch holds one shape only. Backends that would need the requests joined refuse the field,
    naming it (Triton's identity backend takes it: Triton's L0_batcher, server.triton_qa)."""

    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        outputs = [("y", "TYPE_FP32", [-1]), ("batch", "TYPE_INT32", [1]),
                   ("shapes", "TYPE_INT32", [1])]
        batching = "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"
        add_python(cls.repo, "ragged", python_config(
            "ragged", [("x", "TYPE_FP32", [-1])], outputs, extra=batching).replace(
                'dims: [ -1 ] }', 'dims: [ -1 ] allow_ragged_batch: true }', 1), RAGGED)
        add_python(cls.repo, "padded", python_config(
            "padded", [("x", "TYPE_FP32", [-1])], outputs, extra=batching), RAGGED)
        cls.repo.add("ragged_onnx", 'name: "ragged_onnx"\nbackend: "onnxruntime"\n'
                     'max_batch_size: 8\n'
                     'input [ { name: "x", data_type: TYPE_FP32, dims: [ -1 ] '
                     'allow_ragged_batch: true } ]\n'
                     'output [ { name: "x_out", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')
        serve(cls, cls.repo.path, repo=cls.repo)

    def send_lengths(self, model, lengths):
        """One request a length, all at once over gRPC; returns each one's outputs."""
        results = {}
        errors = []

        def one(i, n):
            try:
                c = grpcclient.InferenceServerClient(self.server.grpc_target)
                x = np.arange(n, dtype=np.float32).reshape(1, n) + i
                r = c.infer(model, [grpc_input("x", x)], client_timeout=30)
                np.testing.assert_array_equal(r.as_numpy("y"), x * 2)
                results[i] = (int(r.as_numpy("batch")[0][0]), int(r.as_numpy("shapes")[0][0]))
                c.close()
            except Exception as e:  # noqa: BLE001 — reported below
                errors.append(str(e))

        threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(lengths)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), list(range(len(lengths))))
        return results

    def test_requests_of_different_lengths_share_an_execute(self):
        results = self.send_lengths("ragged", [1, 2, 3, 5, 8, 13])
        # 300 ms of queue delay: the six requests sent at once meet in few executes, whose
        # requests keep their own lengths.
        self.assertGreater(max(shapes for _, shapes in results.values()), 1, results)

    def test_without_it_a_batch_holds_one_shape(self):
        results = self.send_lengths("padded", [1, 2, 3, 1, 2, 3])
        self.assertEqual({shapes for _, shapes in results.values()}, {1}, results)
        # Requests of one length still meet in a batch (the 300 ms of queue delay).
        results = self.send_lengths("padded", [3, 3, 3, 3])
        self.assertGreater(max(batch for batch, _ in results.values()), 1, results)

    def test_other_backends_refuse_it_naming_the_input(self):
        index = {m["name"]: m for m in self.http.get_model_repository_index()}
        self.assertEqual(index["ragged_onnx"]["state"], "UNAVAILABLE")
        self.assertIn("input 'x': allow_ragged_batch is served for python models and the "
                      "identity backend only", index["ragged_onnx"]["reason"])
        self.assertTrue(self.http.is_model_ready("ragged"))


class Finalize(harness.unittest.TestCase):
    def test_unload_calls_finalize_and_ends_the_processes(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        add_python(repo, "add_sub", python_config(
            "add_sub", FP32x4, OUT_FP32x4,
            extra="instance_group [ { count: 2, kind: KIND_CPU } ]\n"), ADD_SUB)
        with Server(repo.path, "--model-control-mode", "explicit", "--load-model", "add_sub") as s:
            self.assertEqual(len(stub_pids(s.proc.pid)["add_sub"]), 2)
            client = httpclient.InferenceServerClient("127.0.0.1:%d" % s.http_port)
            self.addCleanup(client.close)
            client.unload_model("add_sub")
            deadline = time.monotonic() + 20
            while stub_pids(s.proc.pid).get("add_sub") and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(stub_pids(s.proc.pid), {})
            # The line comes over the process's log channel: it may reach the server's log
            # just after the process has gone.
            harness.wait_for(lambda: s.log().count("add_sub finalize called") >= 2,
                             what="2 finalize lines in the server's log")
            self.assertEqual(s.log().count("add_sub finalize called"), 2)
            client.load_model("add_sub")
            # A restarted process (after a crash) is finalized too: its spawning thread is gone
            # by then, which must not kill it first.
            for pid in stub_pids(s.proc.pid)["add_sub"]:
                os.kill(pid, 9)
            a = np.ones((1, 4), np.float32)
            for _ in range(4):  # both instances restart on their next batch
                try:
                    client.infer("add_sub", [http_input("INPUT0", a), http_input("INPUT1", a)])
                except InferenceServerException:
                    pass
            self.assertEqual(len(wait_for_processes(s, "add_sub", 2)), 2)
            client.unload_model("add_sub")
            deadline = time.monotonic() + 20
            while stub_pids(s.proc.pid).get("add_sub") and time.monotonic() < deadline:
                time.sleep(0.05)
            # The line comes over the process's log channel: it may reach the server's log
            # just after the process has gone.
            harness.wait_for(lambda: s.log().count("add_sub finalize called") >= 4,
                             what="4 finalize lines in the server's log")
            self.assertEqual(s.log().count("add_sub finalize called"), 4)
            client.load_model("add_sub")
            r = client.infer("add_sub", [http_input("INPUT0", a), http_input("INPUT1", a)])
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + a)


if __name__ == "__main__":
    harness.main()
