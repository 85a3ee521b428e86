"""Model repositories served by `asyncinfer serve`: a bad model fails alone (clear log line, not
ready, the others serve), config fields that would change behaviour are errors naming the field
and ignorable ones warnings, version policies, and the digits TorchScript model over HTTP
compared with libtorch in-process (when --digits gives the model)."""

import json
import os
import shutil
import struct
import subprocess
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
import oip_client
from harness import ARGS, DIGITS_CONFIG, EXAMPLE_REPOSITORY, Repository, Server, builtin_config

AMBIGUOUS_STEP = ("There are 2 identifiers of model 'step' in global map, model namespace must "
                  "be provided to resolve ambiguity.")
IDENTITY = open(os.path.join(EXAMPLE_REPOSITORY, "identity", "config.pbtxt")).read()


def identity_config(name, extra=""):
    return IDENTITY.replace('name: "identity"', 'name: "%s"' % name) + extra


class BadModelsFailAlone(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        repo = cls.repo = Repository()
        repo.add("good", identity_config("good"), versions=[1])
        repo.add("syntax", 'name: "syntax"\nbackend: "builtin"\ninput [ { name: \n')
        repo.add("unknown_field", identity_config("unknown_field", "foo_bar: 3\n"))
        repo.add("sequence", identity_config("sequence").replace(
            "dynamic_batching { max_queue_delay_microseconds: 0 }",
            "sequence_batching { max_sequence_idle_microseconds: 5000000 "
            "iterative_sequence: true }"))
        repo.add("no_config", None)
        repo.add("bad_uri", identity_config("bad_uri").replace("builtin:identity?", "builtin:nope?"))
        repo.add("wrong_name", identity_config("someone_else"))
        repo.add("mismatch", identity_config("mismatch").replace("dims: [ 16 ] } ]\noutput",
                                                                 "dims: [ 15 ] } ]\noutput"))
        repo.add("tensorrt", 'name: "tensorrt"\nplatform: "tensorrt_plan"\nmax_batch_size: 1\n')
        repo.add("ignorable", identity_config("ignorable", """
optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
model_warmup [ { name: "w", batch_size: 1, inputs { key: "input0" value: { data_type: TYPE_FP32, dims: [ 16 ], zero_data: true } } } ]
metric_tags { key: "team" value: "a" }
parameters { key: "INFERENCE_MODE" value { string_value: "true" } }
"""))
        repo.add("no_version", identity_config("no_version"), versions=[])
        cls.server = Server(repo.path).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.repo.cleanup()

    def test_log_names_each_failure(self):
        expect = {
            "syntax": r"syntax': UNAVAILABLE: .*config.pbtxt:4:\d+: ",
            "unknown_field": r"unknown_field': UNAVAILABLE: .*config.pbtxt:12:\d+: Message type "
                             r"\"inference.ModelConfig\" has no field named \"foo_bar\"",
            "sequence": r"sequence': UNAVAILABLE: .*iterative_sequence is not supported",
            "no_config": r"no_config': UNAVAILABLE: no config.pbtxt",
            "bad_uri": r"bad_uri' version 1: UNAVAILABLE: .*unknown builtin model 'nope'",
            "wrong_name": r"wrong_name': UNAVAILABLE: .*name \"someone_else\" differs",
            "mismatch": r"mismatch' version 1: UNAVAILABLE: .*input 0 is listed as 'input0' "
                        r"FP32\[-1,15\], the model has 'input0' FP32\[-1,16\]",
            "tensorrt": r"tensorrt': UNAVAILABLE: .*platform \"tensorrt_plan\" .* is not supported",
            "no_version": r"no_version': UNAVAILABLE: no version folder",
        }
        for model, pattern in expect.items():
            with self.subTest(model=model):
                self.server.wait_line(pattern, timeout=1)

    def test_ignorable_fields_are_warnings(self):
        for field in ("optimization is ignored", "metric_tags is ignored", 'parameters "INFERENCE_MODE" is not an asyncinfer '
                                                "option"):
            self.server.wait_line("model 'ignorable': warning: .*" + field, timeout=1)
        self.server.wait_line("model 'ignorable' version 1: READY", timeout=1)
        # model_warmup is honoured now (issue 24), before the version turns ready.
        self.server.wait_line("model 'ignorable' version 1: model_warmup 'w': 1 run in", timeout=1)

    def test_the_others_serve(self):
        url = self.server.url
        body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                                       "data": [3] * 16}]})
        for model in ("good", "ignorable"):
            r = requests.post(url + "/v2/models/%s/infer" % model, data=body, timeout=10)
            self.assertEqual(r.status_code, 200, r.text)
        r = requests.post(url + "/v2/models/unknown_field/infer", data=body, timeout=10)
        self.assertEqual(r.status_code, 503)
        self.assertIn("foo_bar", r.json()["error"])
        r = requests.get(url + "/v2/models/sequence/ready", timeout=10)
        self.assertEqual(r.status_code, 400)
        self.assertIn("iterative_sequence is not supported", r.json()["error"])
        # Strict readiness (Triton's default): the server is not ready while a model failed.
        r = requests.get(url + "/v2/health/ready", timeout=10)
        self.assertEqual(r.status_code, 503)
        self.assertIn("a model version failed to load", r.json()["error"])
        index = requests.post(url + "/v2/repository/index", timeout=10).json()
        states = {(e["name"], e.get("version")): (e["state"], e.get("reason", "")) for e in index}
        self.assertEqual(states[("good", "1")][0], "READY")
        self.assertEqual(states[("bad_uri", "1")][0], "UNAVAILABLE")
        self.assertIn("nope", states[("bad_uri", "1")][1])
        self.assertEqual(states[("no_config", None)][0], "UNAVAILABLE")

    def test_without_strict_readiness(self):
        with Server(self.repo.path, "--strict-readiness", "false") as server:
            self.assertEqual(requests.get(server.url + "/v2/health/ready").status_code, 200)


def warmup(name, data, batch_size=2, count=1, dims="16", dtype="TYPE_FP32"):
    return ('model_warmup [ { name: "%s" batch_size: %d count: %d inputs { key: "input0" value: '
            '{ data_type: %s dims: [ %s ] %s } } } ]\n' % (name, batch_size, count, dtype, dims,
                                                          data))


class Warmup(harness.unittest.TestCase):
    """Triton's model_warmup: runs before the version turns ready; a failure leaves it
    UNAVAILABLE with the reason, and the others serve."""

    def test_warmup_runs_before_ready_and_failures_say_why(self):
        repo = Repository()
        try:
            repo.add("zeros", identity_config("zeros", warmup("z", "zero_data: true", count=3)))
            repo.add("random", identity_config("random", warmup("r", "random_data: true")))
            os.makedirs(os.path.join(repo.path, "fromfile", "warmup"))
            repo.add("fromfile", identity_config("fromfile",
                                                 warmup("f", 'input_data_file: "raw"', 1)))
            with open(os.path.join(repo.path, "fromfile", "warmup", "raw"), "wb") as f:
                f.write(struct.pack("<16f", *range(16)))
            os.makedirs(os.path.join(repo.path, "short", "warmup"))
            repo.add("short", identity_config("short", warmup("s", 'input_data_file: "raw"', 1)))
            with open(os.path.join(repo.path, "short", "warmup", "raw"), "wb") as f:
                f.write(b"\0" * 10)
            repo.add("missing", identity_config("missing", warmup("m", 'input_data_file: "nope"')))
            repo.add("wrong_type", identity_config(
                "wrong_type", warmup("t", "zero_data: true", dtype="TYPE_INT32")))
            repo.add("wrong_dims", identity_config("wrong_dims", warmup("d", "zero_data: true",
                                                                         dims="15")))
            repo.add("too_big", identity_config("too_big", warmup("b", "zero_data: true",
                                                                   batch_size=9)))
            repo.add("no_data", identity_config("no_data", warmup("n", "")))
            repo.add("typo", identity_config("typo", warmup("y", "zero_dta: true")))
            with Server(repo.path) as server:
                for model, runs in (("zeros", "3 runs"), ("random", "1 run"),
                                    ("fromfile", "1 run")):
                    line = server.wait_line("model '%s' version 1: model_warmup" % model, 1)
                    self.assertIn(runs + " in", line)
                    # The warm-up comes first: its line precedes READY in the log.
                    log = server.log()
                    self.assertLess(log.index(line), log.index(
                        "model '%s' version 1: READY" % model))
                expect = {
                    "short": "model_warmup 's' failed: input_data_file .*raw has 10 bytes; "
                             r"input 'input0' f32\[1,16\] needs 64",
                    "missing": "model_warmup 'm' failed: input_data_file .*nope cannot be read",
                    "wrong_type": "model_warmup 't' failed: input 'input0' is i32, the model's "
                                  "is f32",
                    "wrong_dims": "model_warmup 'd' failed: .*",
                    "too_big": r"model_warmup 'b': batch_size 9 is outside 1..max_batch_size "
                               r"\(8\)",
                    "no_data": "model_warmup 'n' input 'input0' needs zero_data, random_data or "
                               "input_data_file",
                    "typo": r'has no field named \"zero_dta\"',
                }
                index = requests.post(server.url + "/v2/repository/index", timeout=10).json()
                states = {e["name"]: (e["state"], e.get("reason", "")) for e in index}
                for model, pattern in expect.items():
                    with self.subTest(model=model):
                        self.assertEqual(states[model][0], "UNAVAILABLE")
                        self.assertRegex(states[model][1], pattern)
                        server.wait_line("model '%s'.*UNAVAILABLE: .*%s" % (model, pattern), 1)
                for model in ("zeros", "random", "fromfile"):
                    self.assertEqual(states[model][0], "READY")
                    body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16],
                                                   "datatype": "FP32", "data": [1] * 16}]})
                    r = requests.post(server.url + "/v2/models/%s/infer" % model, data=body,
                                      timeout=10)
                    self.assertEqual(r.status_code, 200, r.text)
        finally:
            repo.cleanup()


class LostDevice(harness.unittest.TestCase):
    """A version whose only worker cannot get a model instance any more (the device is lost for
    good) turns not ready on every readiness surface, naming why; the other models serve."""

    def test_unhealthy_engine_is_not_ready(self):
        repo = Repository()
        try:
            repo.add("good", identity_config("good"))
            # The first call hangs past the watchdog; the replacement instance is refused.
            repo.add("lost", builtin_config(
                "lost", "builtin:faulty?mode=hang&first=1&instances=1&shape=16",
                [("input0", "TYPE_FP32", [16])], [("output0", "TYPE_FP32", [16])], extra="""
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "watchdog_ms" value { string_value: "200" } }
parameters { key: "max_recycle_attempts" value { string_value: "2" } }
parameters { key: "recycle_backoff_ms" value { string_value: "50" } }
"""))
            with Server(repo.path) as server:
                url = server.url
                body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16],
                                               "datatype": "FP32", "data": [1] * 16}]})
                self.assertEqual(requests.get(url + "/v2/models/lost/ready").status_code, 200)
                self.assertEqual(requests.get(url + "/v2/health/ready").status_code, 200)
                r = requests.post(url + "/v2/models/lost/infer", data=body, timeout=20)
                self.assertNotEqual(r.status_code, 200, r.text)  # the watchdog failed it
                # Not ready from the hang on (recovering), for good once the tries run out.
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    r = requests.get(url + "/v2/models/lost/ready", timeout=10)
                    if r.status_code != 200 and "device is lost" in r.text:
                        break
                    time.sleep(0.05)
                self.assertEqual(r.status_code, 400, r.text)
                self.assertIn("device is lost", r.json()["error"])
                r = requests.get(url + "/v2/health/ready", timeout=10)
                self.assertEqual(r.status_code, 503, r.text)
                r = requests.post(url + "/v2/models/lost/infer", data=body, timeout=10)
                self.assertEqual(r.status_code, 503, r.text)
                self.assertIn("not ready", r.json()["error"])
                index = requests.post(url + "/v2/repository/index", timeout=10).json()
                states = {e["name"]: (e["state"], e.get("reason", "")) for e in index}
                self.assertEqual(states["lost"][0], "UNAVAILABLE")
                self.assertIn("device is lost", states["lost"][1])
                self.assertEqual(states["good"], ("READY", ""))
                text = requests.get(server.metrics_url, timeout=10).text
                self.assertIn('asyncinfer_model_ready{model="lost",version="1"} 0', text)
                self.assertIn('asyncinfer_model_ready{model="good",version="1"} 1', text)
                r = requests.post(url + "/v2/models/good/infer", data=body, timeout=10)
                self.assertEqual(r.status_code, 200, r.text)
        finally:
            repo.cleanup()


class Versions(harness.unittest.TestCase):
    def test_policies(self):
        repo = Repository()
        try:
            base = IDENTITY.replace("version_policy: { all { } }\n", "")
            repo.add("latest", base.replace('"identity"', '"latest"', 1), versions=[1, 3, 10])
            repo.add("two_latest", base.replace('"identity"', '"two_latest"', 1) +
                     "version_policy: { latest { num_versions: 2 } }\n", versions=[1, 3, 10])
            repo.add("specific", base.replace('"identity"', '"specific"', 1) +
                     "version_policy: { specific { versions: [ 1, 4 ] } }\n", versions=[1, 3])
            with Server(repo.path) as server:
                c = oip_client.Client(server.url)
                self.assertEqual(c.model_metadata("latest")["versions"], ["10"])  # Triton's default
                self.assertEqual(c.model_metadata("two_latest")["versions"], ["3", "10"])
                self.assertEqual(c.model_metadata("specific")["versions"], ["1"])
                server.wait_line("version_policy names version 4, which has no folder", 1)
                inp = oip_client.InferInput("input0", [1, 16], "FP32", [1.0] * 16)
                self.assertEqual(c.infer("two_latest", [inp]).header["model_version"], "10")
                self.assertEqual(c.infer("two_latest", [inp], version=3).header["model_version"],
                                 "3")
                with self.assertRaises(oip_client.ServerError) as e:
                    c.infer("two_latest", [inp], version=1)
                self.assertEqual(e.exception.status, 404)
        finally:
            repo.cleanup()


class CustomConfigurations(harness.unittest.TestCase):
    def test_model_config_name_picks_configs_name_pbtxt_where_there_is_one(self):
        """Triton's --model-config-name: configs/<name>.pbtxt instead of config.pbtxt, where the
        model's folder has one."""
        repo = Repository()
        try:
            repo.add("custom", identity_config("custom"))
            os.makedirs(os.path.join(repo.path, "custom", "configs"))
            with open(os.path.join(repo.path, "custom", "configs", "small.pbtxt"), "w") as f:
                f.write(identity_config("custom").replace("max_batch_size: 8",
                                                          "max_batch_size: 2"))
            repo.add("plain", identity_config("plain"))
            with Server(repo.path, "--model-config-name", "small") as server:
                configs = {m: requests.get(server.url + "/v2/models/%s/config" % m,
                                           timeout=10).json()["max_batch_size"]
                           for m in ("custom", "plain")}
                self.assertEqual(configs, {"custom": 2, "plain": 8})
                server.wait_line(r"model 'custom': configuration .*configs/small\.pbtxt")
            with Server(repo.path) as server:  # without the option: config.pbtxt
                self.assertEqual(requests.get(server.url + "/v2/models/custom/config",
                                              timeout=10).json()["max_batch_size"], 8)
            for bad in ("../x", "a b", ".."):
                out = subprocess.run([ARGS.cli, "serve", "--model-repository", repo.path,
                                      "--model-config-name", bad, "--http-port", "0",
                                      "--grpc-port", "-1", "--metrics-port", "-1"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertIn("--model-config-name", out.stderr)
        finally:
            repo.cleanup()


class SeveralRepositories(harness.unittest.TestCase):
    def test_the_models_of_every_repository_serve_and_a_name_two_hold_does_not(self):
        """Triton's repeated --model-repository, without namespacing: one name space over the
        repositories; a name that two of them hold is not served (UNAVAILABLE with Triton's
        reason), the rest are, and the server is ready."""
        a, b = Repository(), Repository()
        self.addCleanup(a.cleanup)
        self.addCleanup(b.cleanup)
        a.add("first", identity_config("first"))
        a.add("twice", identity_config("twice"))
        b.add("second", identity_config("second"))
        b.add("twice", identity_config("twice"))
        with Server(a.path, "--model-repository", b.path, "--model-control-mode", "poll",
                    "--repository-poll-secs", "1") as server:
            for m in ("first", "second"):
                self.assertEqual(requests.get(server.url + "/v2/models/%s/ready" % m,
                                              timeout=10).status_code, 200, m)
            self.assertEqual(requests.get(server.url + "/v2/health/ready",
                                          timeout=10).status_code, 200)
            index = {m["name"]: m for m in requests.post(
                server.url + "/v2/repository/index", json={}, timeout=10).json()}
            self.assertEqual(index["twice"]["state"], "UNAVAILABLE")
            self.assertEqual(index["twice"]["reason"], "model appears in two or more repositories")
            self.assertNotEqual(requests.get(server.url + "/v2/models/twice/ready",
                                             timeout=10).status_code, 200)
            server.wait_line(r"model 'twice': not loaded: not unique across all model "
                             r"repositories: model appears in two or more repositories")
            # Without --model-namespacing the model labels are model and version only.
            self.assertNotIn("namespace=", requests.get(server.metrics_url, timeout=10).text)
            # Once one repository lets go of it, the next scan serves it.
            shutil.rmtree(os.path.join(b.path, "twice"))
            deadline = time.monotonic() + 30
            while requests.get(server.url + "/v2/models/twice/ready", timeout=10).status_code != 200:
                self.assertLess(time.monotonic(), deadline, "twice was not served")
                time.sleep(0.2)

    def test_with_namespacing_each_repository_is_a_name_space(self):
        """Triton's --model-namespacing=true: two repositories may hold the same name. A request
        by that name fails as ambiguous (Triton's words), an ensemble runs the step model of its
        own repository, and explicit mode's load of an ensemble loads its steps first (Triton's
        cascade), an unload of a name covering every repository. Every lookup by name (metadata,
        config, ready, statistics, trace settings; HTTP and gRPC) gives the ambiguity error as
        inference does, and /metrics labels each model with its namespace (Triton's), one
        series each."""
        a, b = Repository(), Repository()
        self.addCleanup(a.cleanup)
        self.addCleanup(b.cleanup)

        def ensemble(name):
            return ('name: "%s"\nplatform: "ensemble"\nmax_batch_size: 8\n'
                    'input [ { name: "x", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
                    'output [ { name: "y", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
                    'ensemble_scheduling { step [ { model_name: "step" model_version: -1 '
                    'input_map { key: "input0" value: "x" } '
                    'output_map { key: "output0" value: "y" } } ] }\n' % name)
        a.add("step", identity_config("step"))
        b.add("step", identity_config("step").replace("builtin:identity?",
                                                      "builtin:faulty?mode=error&"))
        a.add("pipe_a", ensemble("pipe_a"))
        b.add("pipe_b", ensemble("pipe_b"))
        a.add("only_a", identity_config("only_a"))
        body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                            "data": [float(i) for i in range(16)]}]}
        for mode in ("none", "EXPLICIT"):
            with self.subTest(mode=mode), \
                    Server(a.path, "--model-repository", b.path, "--model-namespacing=true",
                           "--model-control-mode=" + mode) as server:
                if mode == "EXPLICIT":
                    for m in ("pipe_a", "pipe_b", "only_a"):
                        r = requests.post(server.url + "/v2/repository/models/%s/load" % m,
                                          timeout=60)
                        self.assertEqual(r.status_code, 200, (m, r.text))
                self.assertEqual(requests.get(server.url + "/v2/health/ready",
                                              timeout=10).status_code, 200)
                r = requests.post(server.url + "/v2/models/pipe_a/infer", json=body, timeout=10)
                self.assertEqual(r.status_code, 200, r.text)
                self.assertEqual(r.json()["outputs"][0]["data"], body["inputs"][0]["data"])
                r = requests.post(server.url + "/v2/models/pipe_b/infer", json=body, timeout=10)
                self.assertNotEqual(r.status_code, 200, r.text)  # b's step fails every request
                x = dict(body, inputs=[dict(body["inputs"][0], name="input0")])
                r = requests.post(server.url + "/v2/models/only_a/infer", json=x, timeout=10)
                self.assertEqual(r.status_code, 200, r.text)
                r = requests.post(server.url + "/v2/models/step/infer", json=x, timeout=10)
                self.assertEqual(r.status_code, 400, r.text)
                self.assertIn(AMBIGUOUS_STEP, r.text)
                self.check_lookups_are_ambiguous(server)
                self.check_metrics_per_namespace(server, a.path, b.path)
                if mode == "EXPLICIT":
                    # Unloading the name unloads it in both; a's, loaded again, serves alone.
                    r = requests.post(server.url + "/v2/repository/models/step/unload",
                                      timeout=60)
                    self.assertEqual(r.status_code, 200, r.text)
                    shutil.rmtree(os.path.join(b.path, "step"))
                    r = requests.post(server.url + "/v2/repository/models/step/load", timeout=60)
                    self.assertEqual(r.status_code, 200, r.text)
                    r = requests.post(server.url + "/v2/models/step/infer", json=x, timeout=10)
                    self.assertEqual(r.status_code, 200, r.text)
                    # pipe_b's step is now a's, the only one served.
                    r = requests.post(server.url + "/v2/models/pipe_b/infer", json=body,
                                      timeout=10)
                    self.assertEqual(r.status_code, 200, r.text)

    def check_lookups_are_ambiguous(self, server):
        """Each lookup of 'step' by name answers Triton's ambiguity error, with inference's
        status: 400 over HTTP, INVALID_ARGUMENT over gRPC (Triton's core resolves the name
        first, FindModelIdentifier, for metadata, config, readiness and statistics alike; its
        trace setting asks for readiness first)."""
        for path in ("", "/versions/1", "/config", "/ready", "/versions/1/ready", "/stats",
                     "/trace/setting"):
            with self.subTest(http=path):
                r = requests.get(server.url + "/v2/models/step" + path, timeout=10)
                self.assertEqual(r.status_code, 400, r.text)
                self.assertEqual(r.json()["error"], AMBIGUOUS_STEP)
        r = requests.post(server.url + "/v2/models/step/trace/setting",
                          json={"trace_rate": "1"}, timeout=10)
        self.assertEqual(r.status_code, 400, r.text)
        self.assertEqual(r.json()["error"], AMBIGUOUS_STEP)
        if not harness.ARGS.grpc_stubs:
            return  # no gRPC stubs in this build: HTTP only
        import grpc
        import grpc_client as gc
        from grpc_client import pb
        with gc.channel("127.0.0.1:%d" % server.grpc_port) as ch:
            stub = gc.stub(ch)
            calls = {
                "ModelMetadata": pb.ModelMetadataRequest(name="step"),
                "ModelConfig": pb.ModelConfigRequest(name="step"),
                "ModelReady": pb.ModelReadyRequest(name="step"),
                "ModelStatistics": pb.ModelStatisticsRequest(name="step"),
                "TraceSetting": pb.TraceSettingRequest(model_name="step"),
                "ModelInfer": gc.infer_request("step", [("input0", "FP32", [1, 16], [1.0] * 16)]),
            }
            for rpc, request in calls.items():
                for version in ("", "1"):
                    if version and not hasattr(request, "version"):
                        continue
                    with self.subTest(grpc=rpc, version=version):
                        if version:
                            request.version = version
                        with self.assertRaises(grpc.RpcError) as caught:
                            getattr(stub, rpc)(request, timeout=10)
                        self.assertEqual(caught.exception.code(),
                                         grpc.StatusCode.INVALID_ARGUMENT)
                        self.assertEqual(caught.exception.details(), AMBIGUOUS_STEP)

    def check_metrics_per_namespace(self, server, a, b):
        """/metrics: 'step' of each repository is a series of its own, labelled namespace=<its
        repository> (Triton's label); no two samples share a name and labels."""
        text = requests.get(server.metrics_url, timeout=10).text
        seen = set()
        success = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                self.assertNotIn(key, seen, "a series twice")
                seen.add(key)
                # The parser names a counter's sample NAME_total.
                if sample.name == "nv_inference_request_success_total" and \
                        sample.labels.get("model") == "step":
                    success[sample.labels.get("namespace")] = sample.value
        # pipe_a's request ran a's step; pipe_b's failed in b's.
        self.assertEqual(success, {a: 1, b: 0})
        self.assertIn('asyncinfer_model_ready{model="step",namespace="%s",version="1"} 1' % b, text)

    def test_a_missing_repository_is_refused_at_start(self):
        a = Repository()
        self.addCleanup(a.cleanup)
        a.add("first", identity_config("first"))
        out = subprocess.run([ARGS.cli, "serve", "--model-repository", a.path,
                              "--model-repository", a.path + "-missing", "--http-port", "0",
                              "--grpc-port", "-1", "--metrics-port", "-1"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("model repository '%s-missing' is not a folder" % a.path, out.stderr)


class Digits(harness.unittest.TestCase):
    def test_digits_over_http_matches_libtorch(self):
        digits = ARGS.digits or os.environ.get("ASYNCINFER_DIGITS")
        if not digits:
            self.skipTest("needs the digits model (--digits; the TorchDigitsModel fixture makes it)")
        import torch  # Debian's python3-torch
        repo = Repository()
        try:
            repo.add("digits", open(DIGITS_CONFIG).read() + "version_policy: { all { } }\n",
                     versions=[1, 2],
                     files={"1/model.pt": digits})  # version 2 has no model.pt: fails alone
            with Server(repo.path, "--strict-readiness", "false") as server:
                server.wait_line(r"model 'digits' version 2: UNAVAILABLE: no model file", 1)
                server.wait_line(r"model 'digits' version 1: READY \(device cpu, 2 workers, "
                                 r"dynamic batching max 64 delay 200 us\)", 1)
                c = oip_client.Client(server.url)
                meta = c.model_metadata("digits")
                self.assertEqual(meta["platform"], "pytorch_libtorch")
                self.assertEqual(meta["versions"], ["1"])
                self.assertEqual(meta["inputs"], [{"name": "INPUT__0", "datatype": "FP32",
                                                   "shape": [-1, 1, 32, 32]}])
                torch.manual_seed(0)
                x = torch.randn(3, 1, 32, 32)
                module = torch.jit.load(digits)
                with torch.no_grad():
                    expected = module(x).flatten().tolist()
                inp = oip_client.InferInput("INPUT__0", [3, 1, 32, 32], "FP32",
                                            x.flatten().tolist())
                res = c.infer("digits", [inp])  # binary in and out, as tritonclient
                got = res.as_list("OUTPUT__0")
                self.assertEqual(res.output("OUTPUT__0")["shape"], [3, 10])
                for g, e in zip(got, expected):
                    self.assertAlmostEqual(g, e, places=4)
                # The same through JSON.
                body = {"inputs": [{"name": "INPUT__0", "shape": [3, 1, 32, 32], "datatype": "FP32",
                                    "data": x.flatten().tolist()}]}
                r = requests.post(server.url + "/v2/models/digits/infer", data=json.dumps(body))
                for g, e in zip(r.json()["outputs"][0]["data"], expected):
                    self.assertAlmostEqual(g, e, places=4)
        finally:
            repo.cleanup()


if __name__ == "__main__":
    harness.main()
