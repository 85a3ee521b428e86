"""Triton's rate limiter (`--rate-limit=execution_count`, `--rate-limit-resource`, instance_group
`rate_limiter { resources priority }`): instances of different models that need the same
resources run one at a time, waiting instances go by priority, the load-time errors use Triton's
words (its qa test L0_rate_limiter greps them), and an unload or a shutdown while an instance
waits for its resources does not hang.

The models are built-in fixed-cost models (each request takes base_us, asleep), so overlap shows
in the wall-clock time; the bounds are far apart (a serial pair takes >= 750 ms, an overlapped
one <= 650 ms, for two 400 ms requests) so that a loaded 2-core machine cannot flake them."""

import json
import threading
import time

import requests

import harness
from harness import ARGS

BODY = json.dumps({"inputs": [{"name": "input0", "shape": [1, 4], "datatype": "FP32",
                               "data": [0, 0, 0, 0]}]})


def config(name, resources, priority=0, base_us=400000, count=1):
    """A built-in model taking base_us a request whose instances need `resources`:
    [(name, count, global)]."""
    res = ", ".join('{ name: "%s" count: %d global: %s }' % (n, c, "true" if g else "false")
                    for n, c, g in resources)
    return ('name: "%s"\nbackend: "builtin"\nmax_batch_size: 1\n'
            'input [ { name: "input0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
            'output [ { name: "output0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
            "instance_group [ { kind: KIND_CPU, count: %d, "
            "rate_limiter { resources [ %s ] priority: %d } } ]\n"
            'parameters { key: "uri" value { string_value: '
            '"builtin:fixed_cost?base_us=%d&shape=4&max_batch=1" } }\n'
            % (name, count, res, priority, base_us))


def infer(server, model, out, key=None, timeout=30):
    """One request; appends (key or model, status code or the exception, end time) to `out`."""
    try:
        r = requests.post(server.url + "/v2/models/%s/infer" % model, data=BODY, timeout=timeout)
        out.append((key or model, r.status_code, time.monotonic()))
    except requests.RequestException as e:
        out.append((key or model, e, time.monotonic()))


def start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


class RateLimiter(harness.unittest.TestCase):
    def setUp(self):
        self.repo = harness.Repository()

    def tearDown(self):
        self.repo.cleanup()

    def pair_seconds(self, *flags):
        """Seconds two 400 ms requests to two models (resource1:4 each) take when sent at once."""
        with harness.Server(self.repo.path, *flags) as server:
            for m in ("a", "b"):  # warm: the first request of a connection pays its set-up
                self.assertEqual(requests.post(server.url + "/v2/models/%s/infer" % m,
                                               data=BODY, timeout=30).status_code, 200)
            out = []
            t0 = time.monotonic()
            threads = [start(infer, server, m, out) for m in ("a", "b")]
            for t in threads:
                t.join(30)
            elapsed = time.monotonic() - t0
            self.assertEqual(sorted(code for _, code, _ in out), [200, 200], out)
            return elapsed

    def test_instances_that_need_the_whole_pool_run_one_at_a_time(self):
        for m in ("a", "b"):
            self.repo.add(m, config(m, [("resource1", 4, False)]))
        # A pool of 4 given, and the default pool (the largest ask: 4): one at a time.
        for flags in (["--rate-limit=execution_count", "--rate-limit-resource=resource1:4"],
                      ["--rate-limit=execution_count"],
                      ["--rate-limit=EXECUTION_COUNT", "--rate-limit-resource=resource1:4:0"]):
            self.assertGreaterEqual(self.pair_seconds(*flags), 0.75, flags)
        # A pool of 8, or no rate limiter (the settings are read, not served): side by side.
        for flags in (["--rate-limit=execution_count", "--rate-limit-resource=resource1:8"],
                      ["--rate-limit=off", "--rate-limit-resource=resource1:1"], []):
            self.assertLessEqual(self.pair_seconds(*flags), 0.65, flags)

    def test_waiting_instances_go_by_priority_then_arrival(self):
        self.repo.add("holder", config("holder", [("resource1", 4, False)], base_us=1000000))
        self.repo.add("low", config("low", [("resource1", 4, False)], priority=2,
                                    base_us=100000))
        self.repo.add("high", config("high", [("resource1", 4, False)], priority=1,
                                     base_us=100000))
        with harness.Server(self.repo.path, "--rate-limit=execution_count") as server:
            out = []
            threads = [start(infer, server, "holder", out)]
            time.sleep(0.3)  # holder runs; low, then high, wait for resource1
            threads.append(start(infer, server, "low", out))
            time.sleep(0.3)
            threads.append(start(infer, server, "high", out))
            for t in threads:
                t.join(30)
            self.assertEqual([code for _, code, _ in out], [200, 200, 200], out)
            self.assertEqual([m for m, _, _ in out], ["holder", "high", "low"], out)

    def assert_load_fails(self, flags, message, models):
        """Starts a server with `flags`; exactly one of `models` fails to load, its reason (and
        the log) holding Triton's `message`."""
        with harness.Server(self.repo.path, "--rate-limit=execution_count", *flags) as server:
            server.wait_line(message.replace("(", r"\(").replace(")", r"\)")
                             .replace(".", r"\."), timeout=30)
            index = requests.post(server.url + "/v2/repository/index", timeout=10).json()
            states = {m["name"]: m for m in index if m["name"] in models}
            failed = [m for m in states.values() if m["state"] == "UNAVAILABLE"]
            self.assertEqual(len(failed), 1, index)
            self.assertIn(message, failed[0]["reason"])
        # tritonserver's --exit-on-error=true (Triton's default) ends the server at start.
        proc = harness.subprocess.run(
            [ARGS.cli, "serve", "--model-repository", self.repo.path, "--http-port=0",
             "--grpc-port=0", "--metrics-port=0", "--host=127.0.0.1",
             "--rate-limit=execution_count", "--exit-on-error=true"] + flags,
            capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(message, proc.stderr)

    def test_too_few_resources_fail_the_model_with_tritons_message(self):
        self.repo.add("custom_zero_1_float32",
                      config("custom_zero_1_float32", [("resource1", 4, False)]))
        for given, limited in (("resource1:1", 1), ("resource1:3", 3), ("resource1:10:10", 0)):
            self.assert_load_fails(
                ["--rate-limit-resource=" + given],
                'Resource count for "resource1" is limited to %d which will prevent scheduling of '
                "one or more model instances, the minimum required count is 4" % limited,
                ["custom_zero_1_float32"])

    def test_a_resource_both_global_and_per_device_fails_with_tritons_message(self):
        self.repo.add("v2", config("v2", [("resource1", 2, False), ("resource2", 2, True)],
                                   priority=2))
        self.repo.add("v3", config("v3", [("resource1", 2, False), ("resource2", 2, False)],
                                   priority=2))
        self.assert_load_fails(
            [], 'Resource "resource2" is present as both global and device-specific resource in '
            "the model configuration.", ["v2", "v3"])

    def test_bad_flags_are_refused_at_start(self):
        for flag, fragment in (("--rate-limit=sometimes", "execution_count and off"),
                               ("--rate-limit-resource=resource1", "option format"),
                               ("--rate-limit-resource=resource1:x", "option format"),
                               ("--rate-limit-resource=resource1:2:0:1", "option format")):
            proc = harness.subprocess.run(
                [ARGS.cli, "serve", "--model-repository", self.repo.path, "--http-port=0",
                 "--grpc-port=0", "--metrics-port=0", flag],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 2, (flag, proc.stderr))
            self.assertIn(fragment, proc.stderr, flag)

    def test_unload_while_an_instance_waits_for_resources_does_not_hang(self):
        self.repo.add("holder", config("holder", [("resource1", 4, False)], base_us=2000000))
        self.repo.add("waiter", config("waiter", [("resource1", 4, False)], base_us=100000))
        with harness.Server(self.repo.path, "--rate-limit=execution_count",
                            "--model-control-mode=explicit", "--load-model=*") as server:
            out = []
            threads = [start(infer, server, "holder", out)]
            time.sleep(0.3)
            threads.append(start(infer, server, "waiter", out))
            time.sleep(0.3)  # waiter's instance waits for resource1
            t0 = time.monotonic()
            r = requests.post(server.url + "/v2/repository/models/waiter/unload", timeout=30)
            self.assertEqual(r.status_code, 200, r.text)
            harness.wait_for(lambda: requests.get(server.url + "/v2/models/waiter/ready",
                                                  timeout=10).status_code != 200,
                             timeout=20, what="waiter unloaded")
            for t in threads:
                t.join(30)
            # Its request was drained: it ran once holder gave resource1 back.
            self.assertLess(time.monotonic() - t0, 20)
            self.assertEqual(sorted(code for _, code, _ in out), [200, 200], out)
            # The pool is whole again: holder runs, and a reloaded waiter too.
            r = requests.post(server.url + "/v2/repository/models/waiter/load", timeout=30)
            self.assertEqual(r.status_code, 200, r.text)
            out = []
            infer(server, "waiter", out)
            self.assertEqual(out[0][1], 200, out)

    def test_shutdown_while_an_instance_waits_for_resources_does_not_hang(self):
        self.repo.add("holder", config("holder", [("resource1", 4, False)], base_us=3000000))
        self.repo.add("waiter", config("waiter", [("resource1", 4, False)], base_us=100000))
        # A drain shorter than holder's request: the waiting instance is woken by the cancel.
        server = harness.Server(self.repo.path, "--rate-limit=execution_count",
                                "--drain-timeout=0.5").start()
        try:
            out = []
            threads = [start(infer, server, "holder", out)]
            time.sleep(0.3)
            threads.append(start(infer, server, "waiter", out))
            time.sleep(0.3)
            t0 = time.monotonic()
            server.signal()
            server.wait(30)  # fails the test if it hangs
            self.assertLess(time.monotonic() - t0, 20)
            for t in threads:
                t.join(30)
            self.assertEqual(len(out), 2, out)
            self.assertNotIn(200, [code for m, code, _ in out if m == "waiter"], out)
        finally:
            server.stop()


if __name__ == "__main__":
    harness.main()
