"""Deployment files (issue 17): what can be checked without a Docker engine or a cluster.

  - deploy/kserve/*.yaml parse (python3-yaml) and say what KServe needs: a ServingRuntime with
    protocolVersions v2 and grpc-v2, HTTP on 8080, gRPC on 8081 named h2c, probes on
    /v2/health/*, the Prometheus annotations; an InferenceService for the digits model on it.
  - The container's entry command (the Dockerfile's ENTRYPOINT + CMD, which are the
    ServingRuntime's args) is run here as it is, with only the repository path (/mnt/models) and
    the ports made local: every port, path and probe that the manifests name is served.
  - The Dockerfile builds on debian:bookworm from packages scripts/setup.sh also installs, and its
    runtime stage installs the package of every shared library that the built binary needs.
  - deploy/nginx/*.conf pass `nginx -t` (test_scaleout.py runs them).
"""

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import requests
import yaml

import harness
from harness import EXAMPLE_REPOSITORY, ROOT

harness.parse_args()
import cluster  # noqa: E402
import grpc_client as gc  # noqa: E402

KSERVE = os.path.join(ROOT, "deploy", "kserve")


def dockerfile():
    """[(instruction, argument text)] with continuation lines joined."""
    with open(os.path.join(KSERVE, "Dockerfile")) as f:
        text = re.sub(r"\\\n", " ", f.read())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages():
    """The Dockerfile's stages: [[(instruction, argument)]], split at FROM."""
    result = []
    for ins, arg in dockerfile():
        if ins == "FROM":
            result.append([])
        result[-1].append((ins, arg))
    return result


def apt_packages(stage):
    pkgs = []
    for ins, arg in stage:
        if ins == "RUN" and "apt-get install" in arg:
            part = arg.split("apt-get install", 1)[1].split("&&")[0]
            pkgs += [w for w in part.split() if not w.startswith("-")]
    return pkgs


def setup_packages():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        text = f.read()
    body = re.search(r"packages=\((.*?)\)", text, re.S).group(1)
    return set(body.split())


def load_yaml(name):
    with open(os.path.join(KSERVE, name)) as f:
        return yaml.safe_load(f)


def flag(args, name):
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    raise KeyError(name)


class Manifests(harness.unittest.TestCase):
    def test_serving_runtime(self):
        sr = load_yaml("servingruntime.yaml")
        self.assertEqual((sr["apiVersion"], sr["kind"]),
                         ("serving.kserve.io/v1alpha1", "ServingRuntime"))
        spec = sr["spec"]
        self.assertEqual(spec["protocolVersions"], ["v2", "grpc-v2"])
        self.assertIn("triton", [f["name"] for f in spec["supportedModelFormats"]])
        (c,) = spec["containers"]
        self.assertEqual(c["name"], "kserve-container")
        args = c["args"]
        self.assertEqual(args[0], "serve")
        self.assertEqual(flag(args, "--model-repository"), "/mnt/models")
        self.assertEqual(flag(args, "--host"), "0.0.0.0")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports["h2c"], 8081)
        self.assertEqual(ports["http1"], 8080)
        self.assertEqual(int(flag(args, "--grpc-port")), ports["h2c"])
        self.assertEqual(int(flag(args, "--http-port")), ports["http1"])
        ann = spec["annotations"]
        self.assertEqual(int(ann["prometheus.kserve.io/port"]), int(flag(args, "--metrics-port")))
        self.assertEqual(ann["prometheus.kserve.io/path"], "/metrics")
        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/v2/health/ready")
        self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/v2/health/live")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            self.assertEqual(c[probe]["httpGet"]["port"], ports["http1"])
        # The drain fits in Kubernetes' default grace period (30 s) before SIGKILL.
        self.assertLess(float(flag(args, "--drain-timeout")), 30)

    def test_inference_service(self):
        isvc = load_yaml("inferenceservice.yaml")
        self.assertEqual((isvc["apiVersion"], isvc["kind"]),
                         ("serving.kserve.io/v1beta1", "InferenceService"))
        self.assertEqual(isvc["metadata"]["name"], "digits")
        model = isvc["spec"]["predictor"]["model"]
        sr = load_yaml("servingruntime.yaml")
        self.assertEqual(model["runtime"], sr["metadata"]["name"])
        self.assertIn(model["modelFormat"]["name"],
                      [f["name"] for f in sr["spec"]["supportedModelFormats"]])
        self.assertIn(model["protocolVersion"], sr["spec"]["protocolVersions"])
        self.assertTrue(model["storageUri"])

    def test_dockerfile_matches_the_runtime(self):
        build, run = stages()
        self.assertEqual(build[0], ("FROM", "debian:bookworm AS build"))
        self.assertEqual(run[0], ("FROM", "debian:bookworm"))
        entry = json.loads(dict(run)["ENTRYPOINT"])
        cmd = json.loads(dict(run)["CMD"])
        self.assertEqual(entry, ["/opt/asyncinfer/bin/asyncinfer"])
        sr = load_yaml("servingruntime.yaml")
        (c,) = sr["spec"]["containers"]
        self.assertNotIn("command", c)  # the image's ENTRYPOINT runs
        self.assertEqual(cmd, c["args"])
        exposed = {int(p) for p in dict(run)["EXPOSE"].split()}
        self.assertEqual(exposed, {p["containerPort"] for p in c["ports"]})
        # Built from Debian's packages, each one scripts/setup.sh also installs (and CI builds
        # with); the image builds the same CMake targets as the tests.
        self.assertLessEqual(set(apt_packages(build)), setup_packages())
        self.assertIn("--target asyncinfer_cli", " ".join(a for i, a in build if i == "RUN"))

    def test_runtime_stage_has_every_library_the_binary_needs(self):
        _, run = stages()
        runtime = set(apt_packages(run))
        # The program, its library and the backend modules beside it (docs/backends.md), which
        # the image installs with them and which link the toolkits.
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(harness.ARGS.cli))),
                           "src")
        binaries = ([harness.ARGS.cli] + glob.glob(os.path.join(src, "libasyncinfer.so*")) +
                    glob.glob(os.path.join(src, "asyncinfer", "backends", "*.so")))
        needed = set()
        for b in binaries:
            out = subprocess.run(["readelf", "-d", b], capture_output=True, text=True).stdout
            needed |= set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out))
        self.assertIn("libc.so.6", needed, "readelf found no libraries in %s" % binaries)
        base = {"libc6", "libgcc-s1", "libstdc++6"}  # in debian:bookworm itself
        missing = []
        for lib in sorted(needed):
            if lib.startswith("libasyncinfer") or lib.startswith("ld-linux"):
                continue
            owners = subprocess.run(["dpkg", "-S", "*/" + lib], capture_output=True,
                                    text=True).stdout
            pkgs = {l.split(":")[0] for l in owners.splitlines() if l}
            pkgs = {p for p in pkgs if not p.endswith("-dev")}
            if not pkgs:
                # Not from a Debian package: the CUDA toolkit and OpenVINO (PyPI), which the
                # image leaves out (-DASYNCINFER_WITH_CUDA=OFF -DASYNCINFER_WITH_OPENVINO=OFF).
                self.assertRegex(lib, r"^lib(cudart|cublas|cublasLt|cuda|openvino)\.", lib)
                flag = "-DASYNCINFER_WITH_%s=OFF" % ("OPENVINO" if "openvino" in lib else "CUDA")
                self.assertTrue(any(flag in arg for _, arg in dockerfile()), flag)
                continue
            if not pkgs & (runtime | base):
                missing.append("%s (%s)" % (lib, ", ".join(sorted(pkgs))))
        self.assertEqual(missing, [], "the runtime stage lacks these libraries' packages")

    def test_nginx_configurations_parse(self):
        for name in ("nginx.conf", "grpc-l4.conf"):
            with self.subTest(conf=name):
                ng = cluster.Nginx(name, {"asyncinfer_http": [8000], "asyncinfer_grpc": [8001]}
                                   if name == "nginx.conf" else
                                   {"asyncinfer_grpc_l4": [8001]},
                                   {8000: harness.free_port(), 8001: harness.free_port()})
                try:
                    r = subprocess.run(["nginx", "-t", "-p", ng.prefix + "/", "-e",
                                        os.path.join(ng.prefix, "error.log"), "-c", ng.conf],
                                       capture_output=True, text=True, timeout=30)
                    self.assertEqual(r.returncode, 0, r.stderr)
                finally:
                    ng.stop()


class EntryCommand(harness.unittest.TestCase):
    """The image's command, run here: only /mnt/models and the ports are local."""

    def test_entry_command_serves_what_the_manifests_name(self):
        _, run = stages()
        cmd = json.loads(dict(run)["CMD"])
        repo = tempfile.mkdtemp(prefix="asyncinfer-mnt-models-")
        digits = harness.ARGS.digits and os.path.exists(harness.ARGS.digits)
        if digits:  # the InferenceService's model, laid out as KServe's storage puts it
            os.makedirs(os.path.join(repo, "digits", "1"))
            shutil.copy(harness.DIGITS_CONFIG, os.path.join(repo, "digits"))
            shutil.copy(harness.ARGS.digits, os.path.join(repo, "digits", "1", "model.pt"))
        else:
            shutil.copytree(os.path.join(EXAMPLE_REPOSITORY, "identity"),
                            os.path.join(repo, "identity"))
        ports = {"--http-port": harness.free_port(), "--grpc-port": harness.free_port(),
                 "--metrics-port": harness.free_port()}
        args = []
        for a in cmd:
            name = a.split("=", 1)[0]
            if name == "--model-repository":
                a = "--model-repository=" + repo
            elif name == "--host":
                a = "--host=127.0.0.1"  # tests listen on loopback only
            elif name in ports:
                a = "%s=%d" % (name, ports[name])
            args.append(a)
        proc = subprocess.Popen([harness.ARGS.cli] + args, stderr=subprocess.PIPE, text=True)
        try:
            sr = load_yaml("servingruntime.yaml")
            (c,) = sr["spec"]["containers"]
            http = "http://127.0.0.1:%d" % ports["--http-port"]
            deadline = time.monotonic() + 60
            while True:
                try:
                    if requests.get(http + c["readinessProbe"]["httpGet"]["path"],
                                    timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                self.assertIsNone(proc.poll(), "the entry command exited")
                self.assertLess(time.monotonic(), deadline, "never ready")
                time.sleep(0.1)
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                self.assertEqual(requests.get(http + c[probe]["httpGet"]["path"],
                                              timeout=5).status_code, 200, probe)
            ann = sr["spec"]["annotations"]
            m = requests.get("http://127.0.0.1:%d%s" % (ports["--metrics-port"],
                                                        ann["prometheus.kserve.io/path"]),
                             timeout=5)
            self.assertEqual(m.status_code, 200)
            self.assertIn("asyncinfer_server_ready 1", m.text)
            ch = gc.channel("127.0.0.1:%d" % ports["--grpc-port"])
            health = gc.health_stub(ch).Check(gc.health_pb2.HealthCheckRequest(), timeout=10)
            self.assertEqual(health.status, gc.health_pb2.HealthCheckResponse.SERVING)
            model = "digits" if digits else "identity"
            if digits:
                inputs = [("INPUT__0", "FP32", [1, 1, 32, 32], [0.0] * 1024)]
            else:
                inputs = [("input0", "FP32", [1, 16], [1.0] * 16)]
            r = gc.stub(ch).ModelInfer(gc.infer_request(model, inputs), timeout=30)
            self.assertEqual(r.model_name, model)
            self.assertEqual(list(r.outputs[0].shape), [1, 10] if digits else [1, 16])
            ch.close()
            self.assertEqual(requests.get(http + "/v2/models/" + model + "/ready",
                                          timeout=5).status_code, 200)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log = proc.stderr.read()
            proc.stderr.close()
            shutil.rmtree(repo, ignore_errors=True)
        self.assertEqual(proc.returncode, 0, log)
        self.assertIn("drained", log)


if __name__ == "__main__":
    harness.unittest.main(verbosity=2)
