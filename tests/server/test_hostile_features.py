"""Hostile clients, part 2 (issue 45): what system shared memory, repository control and the
response cache opened to a client with the API port and /dev/shm, each attack reproduced on
loopback and bounded in time, with what the server must do instead.

- A load request's config override cannot name a file outside the model's version folder
  (default_model_filename "/tmp/x.py", "../../x") nor a host program (python_interpreter).
- The response cache and the model see the same bytes of a shared-memory input: a client that
  rewrites its region while its request waits cannot store its answer under another input's key.
- A client that shrinks its shared-memory object after registering it gets an error for its own
  request; the server (and every other client) goes on.
- Registrations are capped (--max-shm-regions), a shared-memory input counts against
  --max-inflight-bytes as a body does, and a window of a sparse 4 GiB object costs nothing.
- A load cannot ask for millions of warm-up runs, a 16 GiB warm-up tensor or 1,000 instances.

Only Debian's python3-requests and the standard library: shared memory objects are made with
os.open on /dev/shm, which is where shm_open puts them."""

import json
import os
import threading
import time
import unittest

import requests

import harness
from harness import Repository, Server, builtin_config, metric, rss_mb, wait_for

FP32 = "FP32"


def shm_object(name, size):
    """A POSIX shared memory object /<name> of `size` bytes (sparse); returns its descriptor."""
    fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    os.ftruncate(fd, size)
    return fd


def floats(values):
    import struct
    return struct.pack("<%df" % len(values), *values)


class Shm:
    """The objects a test made, removed at the end."""

    def __init__(self, test):
        self.names = []
        self.fds = []
        test.addCleanup(self.cleanup)

    def make(self, size):
        name = "asyncinfer-test-%d-%d" % (os.getpid(), len(self.names))
        fd = shm_object(name, size)
        self.names.append(name)
        self.fds.append(fd)
        return "/" + name, fd

    def cleanup(self):
        for fd in self.fds:
            os.close(fd)
        for n in self.names:
            try:
                os.unlink("/dev/shm/" + n)
            except FileNotFoundError:
                pass


def register(server, region, key, byte_size, offset=0):
    return requests.post(server.url + "/v2/systemsharedmemory/region/%s/register" % region,
                         json={"key": key, "offset": offset, "byte_size": byte_size}, timeout=10)


def identity_body(values, shape=(1, 16)):
    return {"inputs": [{"name": "input0", "shape": list(shape), "datatype": FP32,
                        "data": list(values)}]}


def shm_input(region, byte_size, shape=(1, 16), datatype=FP32, offset=0):
    params = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset:
        params["shared_memory_offset"] = offset
    return {"inputs": [{"name": "input0", "shape": list(shape), "datatype": datatype,
                        "parameters": params}]}


IDENTITY = builtin_config("identity", "builtin:identity?shape=16&max_batch=8",
                          [("input0", "TYPE_FP32", [16])], [("output0", "TYPE_FP32", [16])])
# Any length of bytes, not batched: one request may name a large window.
BLOB = builtin_config("blob", "builtin:identity?dtype=u8&max_batch=0", [("input0", "TYPE_UINT8", [-1])],
                      [("output0", "TYPE_UINT8", [-1])], max_batch_size=0)
# Element 0 of a row is the time (us) the row holds the only worker; the row comes back as it
# went in. Its responses are cached.
SLOW_CACHED = builtin_config(
    "slow_cached", "builtin:fixed_cost?cost_from_input=true&shape=2&max_batch=1",
    [("input0", "TYPE_FP32", [2])], [("output0", "TYPE_FP32", [2])], max_batch_size=1,
    extra='instance_group [ { kind: KIND_CPU, count: 1 } ]\n'
          'response_cache { enable: true }\n'
          'parameters { key: "device" value { string_value: "sim" } }\n'
          'parameters { key: "max_inflight_per_worker" value { string_value: "1" } }\n')


def infer(server, model, body, timeout=30):
    return requests.post(server.url + "/v2/models/%s/infer" % model, json=body, timeout=timeout)


def still_serves(test, server):
    r = infer(server, "identity", identity_body(range(16)))
    test.assertEqual(r.status_code, 200, r.text)
    test.assertEqual(r.json()["outputs"][0]["data"], [float(x) for x in range(16)])
    test.assertEqual(requests.get(server.url + "/v2/health/live", timeout=5).status_code, 200)


class SharedMemory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("identity", IDENTITY).add("blob", BLOB).add("slow_cached", SLOW_CACHED)
        cls.server = Server(cls.repo.path, "--cache-config", "local,size=1048576",
                            "--max-inflight-bytes", str(64 << 20), "--max-shm-regions", "8")
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.repo.cleanup()

    def setUp(self):
        self.shm = Shm(self)
        self.addCleanup(lambda: requests.post(
            self.server.url + "/v2/systemsharedmemory/unregister", timeout=10))

    def test_a_shrunk_object_fails_its_own_request_and_the_server_goes_on(self):
        key, fd = self.shm.make(4096)
        os.pwrite(fd, floats(range(16)), 0)
        self.assertEqual(register(self.server, "in", key, 64).status_code, 200)
        out_key, out_fd = self.shm.make(4096)
        self.assertEqual(register(self.server, "out", out_key, 64).status_code, 200)
        r = infer(self.server, "identity", shm_input("in", 64))
        self.assertEqual(r.status_code, 200, r.text)
        os.ftruncate(fd, 0)
        os.ftruncate(out_fd, 0)
        # The input: a mapped read would be SIGBUS and take the whole server down.
        r = infer(self.server, "identity", shm_input("in", 64))
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("shrunk", r.json()["error"])
        self.assertIn("'in'", r.json()["error"])
        # The output, written after the model ran.
        body = identity_body(range(16))
        body["outputs"] = [{"name": "output0", "parameters": {
            "shared_memory_region": "out", "shared_memory_byte_size": 64}}]
        r = infer(self.server, "identity", body)
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("shrunk", r.json()["error"])
        # The shrunk object was not grown back by the server.
        self.assertEqual(os.fstat(out_fd).st_size, 0)
        still_serves(self, self.server)
        # Grown again by its owner, the same registration serves again.
        os.ftruncate(fd, 4096)
        os.pwrite(fd, floats(range(16, 32)), 0)
        r = infer(self.server, "identity", shm_input("in", 64))
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["outputs"][0]["data"], [float(x) for x in range(16, 32)])

    def test_the_cache_key_and_the_model_see_the_same_bytes(self):
        key, fd = self.shm.make(8)
        os.pwrite(fd, floats([1000, 7]), 0)
        self.assertEqual(register(self.server, "victim_key", key, 8).status_code, 200)
        results = {}

        def send(name, body):
            results[name] = infer(self.server, "slow_cached", body)

        # The only worker is busy for 1.5 s; the shared-memory request waits behind it.
        busy = threading.Thread(target=send, args=("busy", {"inputs": [
            {"name": "input0", "shape": [1, 2], "datatype": FP32, "data": [1500000, 1]}]}))
        busy.start()
        wait_for(lambda: self.pending("slow_cached") == 1, what="the busy request to run")
        attacker = threading.Thread(target=send, args=("attacker", shm_input(
            "victim_key", 8, shape=(1, 2))))
        attacker.start()
        wait_for(lambda: self.pending("slow_cached") == 2, what="the shared-memory request to wait")
        # While it waits, its client writes another input into the region.
        os.pwrite(fd, floats([1000, 666]), 0)
        busy.join(30)
        attacker.join(30)
        self.assertEqual(results["busy"].status_code, 200, results["busy"].text)
        self.assertEqual(results["attacker"].status_code, 200, results["attacker"].text)
        # The model computed on the bytes the key was made of ...
        self.assertEqual(results["attacker"].json()["outputs"][0]["data"], [1000.0, 7.0])
        # ... so a later client sending [1000, 7] as plain JSON gets its own answer.
        r = infer(self.server, "slow_cached", {"inputs": [
            {"name": "input0", "shape": [1, 2], "datatype": FP32, "data": [1000, 7]}]})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["outputs"][0]["data"], [1000.0, 7.0])

    def pending(self, model):
        page = requests.get(self.server.metrics_url, timeout=10).text
        return metric(page, "asyncinfer_inference_pending_request_count", model=model)

    def test_registrations_are_capped(self):
        key, _ = self.shm.make(4096)
        for i in range(8):
            r = register(self.server, "r%d" % i, key, 1, offset=i)
            self.assertEqual(r.status_code, 200, r.text)
        r = register(self.server, "r8", key, 1, offset=8)
        self.assertEqual(r.status_code, 503, r.text)
        self.assertIn("--max-shm-regions 8", r.json()["error"])
        requests.post(self.server.url + "/v2/systemsharedmemory/region/r0/unregister", timeout=10)
        self.assertEqual(register(self.server, "r8", key, 1, offset=8).status_code, 200)
        still_serves(self, self.server)

    def test_a_large_window_costs_nothing_until_read_and_counts_against_the_budget(self):
        before, _ = rss_mb(self.server.proc.pid)
        key, fd = self.shm.make(4 << 30)  # sparse: no page is touched
        self.assertEqual(register(self.server, "huge", key, 4 << 30).status_code, 200)
        # 200 bytes of request naming 2 GiB: refused by the in-flight budget (64 MiB here),
        # never held.
        n = 2 << 30
        r = infer(self.server, "blob", shm_input("huge", n, shape=(n,), datatype="UINT8"))
        self.assertEqual(r.status_code, 503, r.text)
        self.assertIn("--max-inflight-bytes", r.json()["error"])
        # Within the budget, served.
        os.pwrite(fd, b"\x01\x02\x03", 100)
        r = infer(self.server, "blob", shm_input("huge", 3, shape=(3,), datatype="UINT8",
                                                 offset=100))
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["outputs"][0]["data"], [1, 2, 3])
        after, _ = rss_mb(self.server.proc.pid)
        self.assertLess(after - before, 64, "RSS grew from %.0f to %.0f MiB" % (before, after))
        still_serves(self, self.server)


def load(server, name, config):
    return requests.post(server.url + "/v2/repository/models/%s/load" % name,
                         json={"parameters": {"config": json.dumps(config)}}, timeout=60)


def identity_json(name, **more):
    config = {"name": name, "backend": "builtin", "max_batch_size": 8,
              "input": [{"name": "input0", "data_type": "TYPE_FP32", "dims": [16]}],
              "output": [{"name": "output0", "data_type": "TYPE_FP32", "dims": [16]}],
              "parameters": {"uri": {"string_value": "builtin:identity?shape=16&max_batch=8"}}}
    config.update(more)
    return config


class LoadRequests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("identity", IDENTITY).add("target", IDENTITY.replace('"identity"', '"target"'))
        cls.repo.add("blob", BLOB)
        os.makedirs(os.path.join(cls.repo.path, "pymodel", "1"))
        cls.server = Server(cls.repo.path, "--model-control-mode", "explicit",
                            "--load-model", "identity", "--max-inflight-bytes", str(64 << 20),
                            "--max-model-instances", "16")
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.repo.cleanup()

    def test_a_model_file_outside_the_version_folder_is_refused(self):
        marker = os.path.join(self.repo.path, "imported")
        evil = os.path.join(self.repo.path, "evil.py")
        with open(evil, "w") as f:
            f.write("open(%r, 'w').write('ran')\n" % marker)
        config = {"name": "pymodel", "backend": "python",
                  "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
                  "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]}
        for name in (evil, "../../evil.py", "..", "a/../../evil.py"):
            r = load(self.server, "pymodel", dict(config, default_model_filename=name))
            self.assertEqual(r.status_code, 400, r.text)
            self.assertIn("default_model_filename '%s' must name a file in the model's "
                          "version folder" % name, r.json()["error"])
        # A program named by a parameter is the same attack.
        r = load(self.server, "pymodel", dict(config, parameters={
            "python_interpreter": {"string_value": "/bin/sh"}}))
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("python_interpreter", r.json()["error"])
        self.assertFalse(os.path.exists(marker), "the server imported a file from outside")
        still_serves(self, self.server)

    def test_a_warm_up_of_millions_of_runs_is_refused(self):
        sample = {"name": "w", "batch_size": 1, "count": 4000000000,
                  "inputs": {"input0": {"data_type": "TYPE_FP32", "dims": [16],
                                        "zero_data": True}}}
        r = load(self.server, "target", identity_json("target", model_warmup=[sample]))
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("count 4000000000 is over the limit of 10000 runs", r.json()["error"])
        # Many runs within the limit go in a window: the load's memory stays flat.
        before, _ = rss_mb(self.server.proc.pid)
        sample["count"] = 10000
        r = load(self.server, "target", identity_json("target", model_warmup=[sample]))
        self.assertEqual(r.status_code, 200, r.text)
        after, _ = rss_mb(self.server.proc.pid)
        self.assertLess(after - before, 64, "RSS grew from %.0f to %.0f MiB" % (before, after))

    def test_a_warm_up_tensor_larger_than_a_request_may_be_is_refused(self):
        before, _ = rss_mb(self.server.proc.pid)
        config = {"name": "blob", "backend": "builtin", "max_batch_size": 0,
                  "input": [{"name": "input0", "data_type": "TYPE_UINT8", "dims": [-1]}],
                  "output": [{"name": "output0", "data_type": "TYPE_UINT8", "dims": [-1]}],
                  "parameters": {"uri": {"string_value": "builtin:identity?dtype=u8&max_batch=0"}},
                  "model_warmup": [{"name": "big", "count": 1, "inputs": {"input0": {
                      "data_type": "TYPE_UINT8", "dims": [17179869184], "random_data": True}}}]}
        r = load(self.server, "blob", config)
        self.assertIn(r.status_code, (400, 503), r.text)
        self.assertIn("--max-inflight-bytes", r.json()["error"])
        after, _ = rss_mb(self.server.proc.pid)
        self.assertLess(after - before, 64, "RSS grew from %.0f to %.0f MiB" % (before, after))
        still_serves(self, self.server)

    def test_more_instances_than_the_machine_allows_are_refused(self):
        config = identity_json("target", instance_group=[{"kind": "KIND_CPU", "count": 1000}])
        r = load(self.server, "target", config)
        self.assertIn(r.status_code, (400, 503), r.text)
        self.assertIn("1000 instances, over the limit of 16", r.json()["error"])
        self.assertIn("--max-model-instances", r.json()["error"])
        config = identity_json("target", instance_group=[{"kind": "KIND_CPU", "count": 2147483647},
                                                          {"kind": "KIND_CPU", "count": 2}])
        r = load(self.server, "target", config)
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("at most 4096 instances", r.json()["error"])
        still_serves(self, self.server)


# Fails its first call only, after 0.5 s; each call holds the only worker for 0.5 s. Cached.
FLAKY_CACHED = builtin_config(
    "flaky_cached", "builtin:faulty?mode=error&first=1&base_us=500000&shape=2&max_batch=1",
    [("input0", "TYPE_FP32", [2])], [("output0", "TYPE_FP32", [2])], max_batch_size=1,
    extra='instance_group [ { kind: KIND_CPU, count: 1 } ]\n'
          'response_cache { enable: true }\n'
          'parameters { key: "device" value { string_value: "sim" } }\n')

# Returns its declared output and 5,000 that its config does not declare.
MANY_OUTPUTS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            extra = [pb_utils.Tensor("EXTRA_%d" % i, np.zeros((1, 1), np.float32))
                     for i in range(5000)]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)] + extra))
        return out
"""


def ensemble_config(name, step_model):
    return ('name: "%s"\nplatform: "ensemble"\nmax_batch_size: 8\n'
            'input [ { name: "A", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
            'output [ { name: "Z", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
            'ensemble_scheduling { step [ { model_name: "%s" model_version: -1 '
            'input_map { key: "%s" value: "A" } output_map { key: "%s" value: "Z" } } ] }\n'
            % (name, step_model, "input0" if step_model == "identity" else "A",
               "output0" if step_model == "identity" else "Z"))


class CacheEnsemblesAndPython(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("identity", IDENTITY).add("flaky_cached", FLAKY_CACHED)
        # e1 runs identity, e2 runs e1, ... e9 runs e8: e8 is a chain of 8, e9 of 9.
        for k in range(1, 10):
            cls.repo.add("e%d" % k, ensemble_config("e%d" % k, "identity" if k == 1
                                                      else "e%d" % (k - 1)))
        cls.repo.add("many_outputs", 'name: "many_outputs"\nbackend: "python"\n'
                     'max_batch_size: 0\n'
                     'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1, 1 ] } ]\n'
                     'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1, 1 ] } ]\n')
        with open(os.path.join(cls.repo.path, "many_outputs", "1", "model.py"), "w") as f:
            f.write(MANY_OUTPUTS)
        cls.server = Server(cls.repo.path, "--cache-config", "local,size=1048576",
                            "--strict-readiness", "false")
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.repo.cleanup()

    def stats(self, model):
        r = requests.get(self.server.url + "/v2/models/%s/stats" % model, timeout=10)
        return r.json()["model_stats"][0]

    def test_followers_of_a_failed_leader_form_one_new_flight(self):
        body = {"inputs": [{"name": "input0", "shape": [1, 2], "datatype": FP32,
                            "data": [4, 2]}]}
        results = []

        def send():
            results.append(infer(self.server, "flaky_cached", body))

        leader = threading.Thread(target=send)
        leader.start()
        wait_for(lambda: self.pending_requests() >= 1, what="the leader to run")
        followers = [threading.Thread(target=send) for _ in range(10)]
        for t in followers:
            t.start()
        start = time.monotonic()
        for t in [leader] + followers:
            t.join(30)
        took = time.monotonic() - start
        codes = sorted(r.status_code for r in results)
        # The leader's call failed; the ten followers were answered by one more call, not ten.
        self.assertEqual(codes.count(200), 10, [r.text for r in results])
        for r in results:
            if r.status_code == 200:
                self.assertEqual(r.json()["outputs"][0]["data"], [4.0, 2.0])
        stats = self.stats("flaky_cached")["inference_stats"]
        self.assertEqual(stats["fail"]["count"], 1)          # the leader's call
        self.assertEqual(stats["cache_miss"]["count"], 2)    # it, and the one new leader
        self.assertEqual(stats["cache_hit"]["count"], 9)     # the others followed the new one
        self.assertEqual(stats["compute_infer"]["count"], 1)
        self.assertLess(took, 3.0)

    def pending_requests(self):
        page = requests.get(self.server.metrics_url, timeout=10).text
        return metric(page, "asyncinfer_inference_pending_request_count",
                      model="flaky_cached") or 0

    def test_ensembles_nested_past_the_limit_do_not_load(self):
        index = {m["name"]: m for m in requests.post(
            self.server.url + "/v2/repository/index", json={}, timeout=10).json()}
        self.assertEqual(index["e8"]["state"], "READY")
        self.assertEqual(index["e9"]["state"], "UNAVAILABLE")
        self.assertIn("a chain of ensembles may be at most 8 deep", index["e9"]["reason"])
        r = infer(self.server, "e8", {"inputs": [{"name": "A", "shape": [1, 16],
                                                  "datatype": FP32, "data": list(range(16))}]})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["outputs"][0]["data"], [float(x) for x in range(16)])

    def test_outputs_not_in_the_config_are_dropped(self):
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": FP32, "data": [3]}]}
        for _ in range(2):  # the process lives on
            r = infer(self.server, "many_outputs", body)
            self.assertEqual(r.status_code, 200, r.text)
            outputs = r.json()["outputs"]
            self.assertEqual([o["name"] for o in outputs], ["OUTPUT0"])
            self.assertEqual(outputs[0]["data"], [3.0])


if __name__ == "__main__":
    harness.main()
