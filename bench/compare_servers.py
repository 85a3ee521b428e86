#!/usr/bin/python3
"""asyncinfer serve against the servers its users would pick instead, on the same model, the same
inputs and the same load generators, on this machine, in one run (docs/performance.md, "Against
KServe's model server and Ray Serve"):

  asyncinfer        asyncinfer serve, examples/model_repository_digits/digits/config.pbtxt
                    (TorchScript through libtorch, 2 instances, dynamic batching up to 64, 200 us)
  asyncinfer-onnx   the same model's ONNX twin (digits.onnx) through OpenVINO, when built with it
  kserve            KServe's Python model server, bench/peers/kserve_digits.py (2 uvicorn worker
                    processes, one torch thread each; torch is Debian's, as asyncinfer's libtorch)
  ray               Ray Serve, bench/peers/ray_digits.py (2 replicas, @serve.batch 64 / 0.2 ms,
                    a FastAPI ingress taking the v2 JSON body)

Each server runs alone on the machine while it is measured (the others are stopped), twice:

  1. throughput: h2load (HTTP/1.1, the v2 JSON body of one 1x1x32x32 FP32 image) at 1, 8 and 64
     connections, ROUNDS runs of SECS seconds each, medians; gRPC ModelInfer (raw contents, 4
     connections x 16 streams) where the server speaks the v2 gRPC protocol; the server's CPU
     seconds per 1,000 requests (its whole process tree, from /proc, over the 64-connection runs)
     and its memory (PSS and RSS of the tree) after them;
  2. latency: `asyncinfer bench --url ... --mode rate --arrivals poisson` (64 connections, open
     loop, latency from each request's intended send time) at one rate for every server: half of
     the slowest server's 64-connection peak, or RATE.

Every response is checked once before the runs (the top-1 class of a fixed image equal across
servers); h2load counts only HTTP 2xx, and the gRPC runs are checked by a call before and after.

  /usr/bin/python3 bench/compare_servers.py [build-dir]     (default build/release)
  env: ROUNDS=3 SECS=5 SERVERS=asyncinfer,asyncinfer-onnx,kserve,ray RATE=<req/s>

Needs h2load (scripts/setup.sh), the digits model (<build>/models/digits.pt, made by the tests'
fixture, or models/data/digits.pt from models/make_digits.py), and the peers' virtual
environments: `scripts/setup.sh --peers` makes .venv/kserve and .venv/ray (pinned in
scripts/requirements-kserve.txt and scripts/requirements-ray.txt). A server whose environment
is missing is skipped, saying so.
"""

import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build",
                                                                            "release"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECS = float(os.environ.get("SECS", "5"))
CONCURRENCY = (1, 8, 64)
CLI = os.path.join(BUILD, "apps", "asyncinfer", "asyncinfer")
STUBS = os.path.join(BUILD, "tests", "server", "grpc_stubs")
VENV = os.path.join(ROOT, ".venv")

sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, STUBS)
import cluster  # noqa: E402  (h2load and the gRPC wire format)
import grpc  # noqa: E402
import grpc_client as gc  # noqa: E402

# One fixed image (the same values as bench_grpc's), sent as the v2 JSON body and as a gRPC
# message.
IMAGE = [((i * 7) % 17) / 16.0 for i in range(1024)]


def json_body(input_name):
    return json.dumps({"inputs": [{"name": input_name, "shape": [1, 1, 32, 32],
                                   "datatype": "FP32", "data": IMAGE}]},
                      separators=(",", ":")).encode()


def grpc_request(input_name):
    return gc.infer_request("digits", [(input_name, "FP32", [1, 1, 32, 32],
                                        struct.pack("<1024f", *IMAGE))])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=10):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """A server process (and its descendants) started in a session of its own."""

    grpc = False
    input_name = "INPUT__0"  # the model's names as this server serves it
    starting_codes = (503,)  # HTTP answers that mean "not ready yet" while it starts

    def __init__(self, name, work):
        self.name = name
        self.work = work
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.proc = None
        self.log = os.path.join(work, name + ".log")
        self.body = os.path.join(work, name + ".json")
        self.grpc_body = os.path.join(work, name + ".grpc")

    def write_bodies(self):
        with open(self.body, "wb") as f:
            f.write(json_body(self.input_name))
        with open(self.grpc_body, "wb") as f:
            f.write(cluster.grpc_body(grpc_request(self.input_name)))

    def command(self):
        raise NotImplementedError

    def available(self):
        return None  # or why not

    @property
    def url(self):
        return "http://127.0.0.1:%d/v2/models/digits/infer" % self.http_port

    def start(self, timeout=180):
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %d; its log, %s:\n%s" % (
                    self.name, self.proc.returncode, self.log, self.tail()))
            try:
                return post(self.url, json_body(self.input_name), timeout=5)
            except urllib.error.HTTPError as e:
                if e.code not in self.starting_codes:  # the model is missing or refuses it
                    self.stop()
                    raise RuntimeError("%s answered HTTP %d: %s\n%s" % (
                        self.name, e.code, e.read().decode(errors="replace"), self.tail()))
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("%s not ready after %d s:\n%s" % (self.name, timeout,
                                                                      self.tail()))
            time.sleep(0.5)

    def tail(self):
        with open(self.log, errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def tree(self):
        try:
            p = psutil.Process(self.proc.pid)
            return [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self):
        """{pid: user+system CPU seconds} of every process of the tree."""
        out = {}
        for p in self.tree():
            try:
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return out

    def memory_mib(self):
        pss = rss = 0
        for p in self.tree():
            try:
                m = p.memory_full_info()
                pss += m.pss
                rss += m.rss
            except psutil.NoSuchProcess:
                pass
        return pss / 2**20, rss / 2**20

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        procs = self.tree()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        # Whatever outlived the server (Ray's workers reparent themselves) is killed.
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


class Asyncinfer(Server):
    grpc = True

    def __init__(self, name, work, model, onnx=False):
        super().__init__(name, work)
        self.repo = os.path.join(work, name + "-repo")
        version = os.path.join(self.repo, "digits", "1")
        os.makedirs(version, exist_ok=True)
        with open(os.path.join(ROOT, "examples", "model_repository_digits", "digits",
                               "config.pbtxt")) as f:
            config = f.read()
        if onnx:
            # models/make_digits.py names the ONNX twin's tensors input and logits.
            self.input_name = "input"
            config = (config.replace('platform: "pytorch_libtorch"', 'backend: "openvino"')
                      .replace("INPUT__0", "input").replace("OUTPUT__0", "logits"))
            shutil.copy(model, os.path.join(version, "model.onnx"))
            config += 'default_model_filename: "model.onnx"\n'
        else:
            shutil.copy(model, os.path.join(version, "model.pt"))
        with open(os.path.join(self.repo, "digits", "config.pbtxt"), "w") as f:
            f.write(config)

    def command(self):
        return [CLI, "serve", "--model-repository", self.repo, "--host", "127.0.0.1",
                "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                "--metrics-port", "0"]


class Peer(Server):
    venv = None
    script = None

    def __init__(self, name, work, model):
        super().__init__(name, work)
        self.model = model

    def python(self):
        return os.path.join(VENV, self.venv, "bin", "python")

    def available(self):
        if not os.path.exists(self.python()):
            return "no %s (scripts/setup.sh --peers makes it)" % os.path.dirname(
                os.path.dirname(self.python()))
        return None


class KServe(Peer):
    grpc = True
    venv = "kserve"

    def command(self):
        return [self.python(), os.path.join(ROOT, "bench", "peers", "kserve_digits.py"),
                "--model", self.model, "--http_port", str(self.http_port),
                "--grpc_port", str(self.grpc_port), "--workers", str(os.cpu_count())]


class Ray(Peer):
    venv = "ray"
    # Ray's HTTP proxy answers 404 until the application's route is deployed.
    starting_codes = (404, 503)

    def command(self):
        return [self.python(), os.path.join(ROOT, "bench", "peers", "ray_digits.py"),
                "--model", self.model, "--http-port", str(self.http_port),
                "--replicas", str(os.cpu_count())]


def grpc_call(server):
    """One ModelInfer with raw contents; returns the output as 10 floats."""
    with grpc.insecure_channel("127.0.0.1:%d" % server.grpc_port) as ch:
        r = gc.stub(ch).ModelInfer(grpc_request(server.input_name), timeout=10)
    if r.raw_output_contents:
        return list(struct.unpack("<10f", r.raw_output_contents[0]))
    return list(r.outputs[0].contents.fp32_contents)


def h2load_http(server, clients, secs):
    return cluster.h2load(server.url, server.body, clients=clients, duration=secs, h1=True,
                          headers=["Content-Type: application/json"])


def h2load_grpc(server, secs):
    return cluster.h2load("http://127.0.0.1:%d/inference.GRPCInferenceService/ModelInfer"
                          % server.grpc_port, server.grpc_body, clients=4, streams=16, duration=secs,
                          headers=["content-type: application/grpc", "te: trailers"])


def rate(r):
    return r.get("2xx", 0) / r["elapsed"] if r.get("elapsed") else 0.0


def top1(outputs):
    return max(range(len(outputs)), key=lambda i: outputs[i])


def measure_throughput(server):
    server.write_bodies()
    result = {}
    first = server.start()
    result["top1"] = top1(first["outputs"][0]["data"])
    h2load_http(server, 64, 3)  # warm-up: torch specialises on each batch size it meets
    for c in CONCURRENCY:
        xs, cpu, served = [], 0.0, 0
        for _ in range(ROUNDS):
            before = server.cpu_seconds()
            r = h2load_http(server, c, SECS)
            after = server.cpu_seconds()
            if r.get("4xx", 0) or r.get("5xx", 0) or r.get("errored", 0):
                raise RuntimeError("%s: errors at %d connections:\n%s" % (server.name, c,
                                                                         r["output"]))
            xs.append(rate(r))
            cpu += sum(v - before.get(k, 0.0) for k, v in after.items())
            served += r.get("2xx", 0)
        result[c] = (statistics.median(xs), xs)
        if c == 64:
            result["cpu_per_1000"] = 1000.0 * cpu / served if served else float("nan")
    result["pss"], result["rss"] = server.memory_mib()
    if server.grpc:
        check = grpc_call(server)
        result["grpc_top1"] = top1(check)
        h2load_grpc(server, 2)
        xs = []
        for _ in range(ROUNDS):
            xs.append(rate(h2load_grpc(server, SECS)))
        grpc_call(server)  # still answering correctly after the runs
        result["grpc"] = (statistics.median(xs), xs)
    server.stop()
    return result


def measure_latency(server, req_rate):
    server.start()
    subprocess.run([CLI, "bench", "--url", server.url, "--mode", "rate", "--request-rate",
                    str(req_rate), "--concurrency", "64", "--duration-s", "2", "--quiet"],
                   capture_output=True, timeout=120)  # warm-up
    out = subprocess.run([CLI, "bench", "--url", server.url, "--mode", "rate", "--request-rate",
                          str(req_rate), "--arrivals", "poisson", "--concurrency", "64",
                          "--duration-s", str(max(SECS, 10.0)), "--quiet"],
                         capture_output=True, text=True, timeout=300).stdout
    server.stop()
    m = re.search(r"throughput\s+([\d.]+) req/s \((\d+) ok", out)
    lat = re.search(r"p50 ([\d.]+)\s+p90 ([\d.]+)\s+p99 ([\d.]+)", out)
    if not m or not lat:
        raise RuntimeError("%s: no figures from asyncinfer bench:\n%s" % (server.name, out))
    failed = re.findall(r"^\s+(\S+)\s+(\d+)\s*$", out.split("latency us")[-1], re.M)
    return {"rate": float(m.group(1)), "p50": float(lat.group(1)), "p90": float(lat.group(2)),
            "p99": float(lat.group(3)), "errors": failed}


def main():
    if shutil.which("h2load") is None:
        sys.exit("compare_servers: needs h2load (scripts/setup.sh)")
    if not os.path.exists(CLI) or not os.path.isdir(STUBS):
        sys.exit("compare_servers: build first (no %s or %s)" % (CLI, STUBS))
    model = next((f for f in (os.path.join(BUILD, "models", "digits.pt"),
                              os.path.join(ROOT, "models", "data", "digits.pt"))
                  if os.path.exists(f)), None)
    if model is None:
        sys.exit("compare_servers: no digits.pt (run models/make_digits.py or the tests)")
    onnx = os.path.splitext(model)[0] + ".onnx"
    wanted = os.environ.get("SERVERS", "asyncinfer,asyncinfer-onnx,kserve,ray").split(",")
    work = tempfile.mkdtemp(prefix="asyncinfer-compare-")
    servers = []
    for name in wanted:
        if name == "asyncinfer":
            servers.append(Asyncinfer(name, work, model))
        elif name == "asyncinfer-onnx":
            if not os.path.exists(onnx):
                print("compare_servers: skipping asyncinfer-onnx: no %s" % onnx)
                continue
            servers.append(Asyncinfer(name, work, onnx, onnx=True))
        elif name == "kserve":
            servers.append(KServe(name, work, model))
        elif name == "ray":
            servers.append(Ray(name, work, model))
        else:
            sys.exit("compare_servers: unknown server '%s' (asyncinfer, asyncinfer-onnx, "
                     "kserve, ray)" % name)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print("compare_servers: %d cores, load %s; %d rounds of %g s; model %s"
          % (os.cpu_count(), load, ROUNDS, SECS, os.path.relpath(model, ROOT)), flush=True)
    results = {}
    try:
        for s in servers:
            why = s.available()
            if why:
                print("compare_servers: skipping %s: %s" % (s.name, why), flush=True)
                continue
            started = time.monotonic()
            r = results[s.name] = measure_throughput(s)
            print("%-16s HTTP JSON  c=1 %7.0f  c=8 %7.0f  c=64 %7.0f req/s  (64: %s)%s"
                  % (s.name, r[1][0], r[8][0], r[64][0], " ".join("%.0f" % x for x in r[64][1]),
                     "   gRPC 64 %.0f req/s" % r["grpc"][0] if "grpc" in r else ""), flush=True)
            print("%-16s CPU %.2f s per 1,000 requests at 64; memory PSS %.0f MiB (RSS %.0f); "
                  "top-1 %d; %.0f s" % ("", r["cpu_per_1000"], r["pss"], r["rss"], r["top1"],
                                        time.monotonic() - started), flush=True)
        if not results:
            return
        tops = {r["top1"] for r in results.values()} | {
            r["grpc_top1"] for r in results.values() if "grpc_top1" in r}
        if len(tops) != 1:
            raise RuntimeError("the servers disagree on the image's class: %s" % tops)
        common = float(os.environ.get("RATE", 0)) or round(
            min(r[64][0] for r in results.values()) / 2)
        print("latency at %.0f req/s (Poisson, 64 connections, asyncinfer bench --url)" % common,
              flush=True)
        for s in servers:
            if s.name not in results:
                continue
            lat = results[s.name]["latency"] = measure_latency(s, common)
            print("%-16s p50 %8.0f us  p90 %8.0f  p99 %8.0f  (held %.0f req/s)%s"
                  % (s.name, lat["p50"], lat["p90"], lat["p99"], lat["rate"],
                     "  errors: %s" % lat["errors"] if lat["errors"] else ""), flush=True)
        base = results.get("asyncinfer")
        if base:
            for name, r in results.items():
                if name.startswith("asyncinfer"):
                    continue
                print("asyncinfer / %s: %.1fx at 64 connections (HTTP)%s; p99 %.2fx"
                      % (name, base[64][0] / r[64][0],
                         ", %.1fx gRPC" % (base["grpc"][0] / r["grpc"][0]) if "grpc" in r else "",
                         base["latency"]["p99"] / r["latency"]["p99"]))
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print("compare_servers: %.0f s" % (time.monotonic() - start))
