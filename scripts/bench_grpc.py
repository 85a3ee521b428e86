#!/usr/bin/python3
"""The gRPC and scale-out benchmarks of docs/performance.md, each comparison alternated ROUNDS
times in one run, medians and ratios printed:

  1. gRPC vs HTTP, same server, same load generator (h2load, 64 requests in flight: HTTP/1.1 with
     Triton's binary tensors on 64 connections, gRPC on 4 HTTP/2 connections x 16 streams), for the
     small request (builtin:identity 1x16 FP32) and for a 1x3x224x224 FP32 input;
  2. 1, 2 and 3 servers behind nginx (deploy/nginx/nginx.conf) on the `sim` model (10 ms per
     request on each server's own simulated device, 2 workers: 200 req/s per server), HTTP and
     gRPC through nginx, 24 in flight per server;
  3. the digits model over gRPC (h2load, 64 in flight) vs the same engine configuration in process
     (asyncinfer bench --workers 2 --max-batch 64 --max-queue-delay-us 200 --concurrency 64).

Request counts come from the servers' own metrics (asyncinfer_grpc_requests_total{grpc_code="OK"}
and the engines' success counters), so a gRPC error inside an HTTP 200 cannot count as served.

  /usr/bin/python3 scripts/bench_grpc.py [build-dir]      (default build/release; ROUNDS=3 SECS=4)

Needs h2load and nginx (scripts/setup.sh); the digits comparison needs <build>/models/digits.pt
(made by the tests' TorchDigitsModel fixture) or models/data/digits.pt, and is skipped without.
"""

import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build",
                                                                            "release"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECS = float(os.environ.get("SECS", "4"))
CLI = os.path.join(BUILD, "apps", "asyncinfer", "asyncinfer")
STUBS = os.path.join(BUILD, "tests", "server", "grpc_stubs")

sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, STUBS)
import harness  # noqa: E402

harness.ARGS.cli = CLI
import cluster  # noqa: E402
import grpc_client as gc  # noqa: E402

IMAGE_CONFIG = """name: "image"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 0 }
parameters { key: "uri" value { string_value: "builtin:identity?shape=3x224x224&max_batch=8" } }
"""


def median(xs):
    return statistics.median(xs)


def grpc_ok(server):
    text = subprocess.run(["curl", "-s", server.metrics_url], capture_output=True,
                          text=True).stdout
    m = re.search(r'^asyncinfer_grpc_requests_total\{grpc_code="OK"\} (\S+)', text, re.M)
    return float(m.group(1)) if m else 0.0


def http_body(path, name, shape, raw):
    header = ('{"inputs":[{"name":"%s","shape":%s,"datatype":"FP32",'
              '"parameters":{"binary_data_size":%d}}],'
              '"outputs":[{"name":"output0","parameters":{"binary_data":true}}]}'
              % (name, str(list(shape)).replace(" ", ""), len(raw)))
    with open(path, "wb") as f:
        f.write(header.encode() + raw)
    return len(header)


def grpc_file(path, model, name, shape, raw):
    with open(path, "wb") as f:
        f.write(cluster.grpc_body(gc.infer_request(model, [(name, "FP32", list(shape), raw)])))


def h2load_http(port, model, body, header_len, clients=64, secs=SECS):
    return cluster.h2load("http://127.0.0.1:%d/v2/models/%s/infer" % (port, model), body,
                          clients=clients, duration=secs, h1=True,
                          headers=["Content-Type: application/octet-stream",
                                   "Inference-Header-Content-Length: %d" % header_len])


def h2load_grpc(port, body, clients=4, streams=16, secs=SECS):
    return cluster.h2load("http://127.0.0.1:%d/inference.GRPCInferenceService/ModelInfer" % port,
                          body, clients=clients, streams=streams, duration=secs,
                          headers=["content-type: application/grpc", "te: trailers"])


def rate(r, served=None):
    """Requests/s: served (by the server's count) over h2load's elapsed time."""
    n = served if served is not None else r.get("2xx", 0)
    return n / r["elapsed"] if r.get("elapsed") else 0.0


def section_protocols(work, digits):
    repo = os.path.join(work, "repo")
    shutil.copytree(os.path.join(ROOT, "examples", "model_repository", "identity"),
                    os.path.join(repo, "identity"))
    with open(os.path.join(repo, "identity", "config.pbtxt")) as f:
        cfg = f.read().replace("version_policy: { all { } }", "")
    with open(os.path.join(repo, "identity", "config.pbtxt"), "w") as f:
        f.write(cfg)
    os.makedirs(os.path.join(repo, "image", "1"))
    with open(os.path.join(repo, "image", "config.pbtxt"), "w") as f:
        f.write(IMAGE_CONFIG)
    if digits:
        os.makedirs(os.path.join(repo, "digits", "1"))
        shutil.copy(os.path.join(ROOT, "examples", "model_repository_digits", "digits",
                                 "config.pbtxt"), os.path.join(repo, "digits"))
        shutil.copy(digits, os.path.join(repo, "digits", "1", "model.pt"))
    small = struct.pack("<16f", *[0.5 + i for i in range(16)])
    image = struct.pack("<%df" % (3 * 224 * 224), *([0.25] * (3 * 224 * 224)))
    cases = [("small 1x16 FP32", "identity", "input0", [1, 16], small),
             ("1x3x224x224 FP32", "image", "input0", [1, 3, 224, 224], image)]
    with harness.Server(repo) as server:
        print("1. gRPC vs HTTP (binary tensors), one server, 64 in flight, h2load", flush=True)
        for label, model, name, shape, raw in cases:
            hb, gb = os.path.join(work, model + ".http"), os.path.join(work, model + ".grpc")
            hl = http_body(hb, name, shape, raw)
            grpc_file(gb, model, name, shape, raw)
            http, grpc_ = [], []
            h2load_grpc(server.grpc_port, gb, secs=1)  # warm-up, not counted
            for _ in range(ROUNDS):
                r = h2load_http(server.http_port, model, hb, hl)
                http.append(rate(r))
                before = grpc_ok(server)
                r = h2load_grpc(server.grpc_port, gb)
                grpc_.append(rate(r, grpc_ok(server) - before))
            H, G = median(http), median(grpc_)
            print("   %-17s HTTP %s req/s -> median %.0f" % (label, " ".join("%.0f" % x for x in http), H))
            print("   %-17s gRPC %s req/s -> median %.0f  (%.2fx HTTP)"
                  % ("", " ".join("%.0f" % x for x in grpc_), G, G / H if H else 0))
        if digits:
            print("3. digits over gRPC vs the same engine in process, 64 in flight", flush=True)
            img = struct.pack("<1024f", *[((i * 7) % 17) / 16.0 for i in range(1024)])
            gb = os.path.join(work, "digits.grpc")
            grpc_file(gb, "digits", "INPUT__0", [1, 1, 32, 32], img)
            inproc, over = [], []
            # TorchScript specialises on each batch size it meets: warm the server up first (the
            # in-process runs warm up within --warmup-s).
            h2load_grpc(server.grpc_port, gb, secs=5)
            for _ in range(ROUNDS):
                out = subprocess.run(
                    [CLI, "bench", "--model", digits, "--device", "cpu", "--workers", "2",
                     "--max-batch", "64", "--max-queue-delay-us", "200", "--mode", "async",
                     "--concurrency", "64", "--duration-s", str(SECS), "--warmup-s", "2",
                     "--quiet"], capture_output=True, text=True).stdout
                m = re.search(r"throughput\s+([\d.]+) req/s", out)
                inproc.append(float(m.group(1)) if m else 0.0)
                before = grpc_ok(server)
                r = h2load_grpc(server.grpc_port, gb)
                over.append(rate(r, grpc_ok(server) - before))
            I, O = median(inproc), median(over)
            print("   digits in process: %s req/s -> median %.0f" % (" ".join("%.0f" % x for x in inproc), I))
            print("   digits over gRPC:  %s req/s -> median %.0f  (%.2fx in process)"
                  % (" ".join("%.0f" % x for x in over), O, O / I if I else 0))
        else:
            print("3. digits: skipped (no digits.pt)")


def section_scaleout(work):
    repo = cluster.sim_repository()
    body_h = os.path.join(work, "sim.http")
    hl = http_body(body_h, "input0", [1, 16], struct.pack("<16f", *range(16)))
    body_g = os.path.join(work, "sim.grpc")
    grpc_file(body_g, "sim", "input0", [1, 16], struct.pack("<16f", *range(16)))
    print("2. servers behind nginx (deploy/nginx/nginx.conf), sim model 10 ms, 2 workers each "
          "(200 req/s per server), 24 in flight per server", flush=True)
    try:
        with cluster.Cluster(repo.path, 3) as c:
            results = {}
            for n in (1, 2, 3):
                with c.nginx(c.servers[:n]) as ng:
                    for proto in ("HTTP", "gRPC"):
                        xs = []
                        for _ in range(ROUNDS):
                            before = sum(cluster.successes(s) for s in c.servers)
                            if proto == "HTTP":
                                r = h2load_http(ng.http_port, "sim", body_h, hl, clients=24 * n)
                            else:
                                r = h2load_grpc(ng.grpc_port, body_g, clients=4, streams=6 * n)
                            xs.append(rate(r, sum(cluster.successes(s) for s in c.servers)
                                           - before))
                        results[(proto, n)] = median(xs)
            for proto in ("HTTP", "gRPC"):
                one = results[(proto, 1)]
                print("   %-4s 1 server %.0f req/s; 2 servers %.0f (%.2fx); 3 servers %.0f (%.2fx)"
                      % (proto, one, results[(proto, 2)], results[(proto, 2)] / one,
                         results[(proto, 3)], results[(proto, 3)] / one))
    finally:
        repo.cleanup()


def main():
    for tool in ("h2load", "nginx", "curl"):
        if shutil.which(tool) is None and not os.path.exists("/usr/sbin/" + tool):
            sys.exit("bench_grpc: needs %s (scripts/setup.sh)" % tool)
    if not os.path.exists(CLI) or not os.path.isdir(STUBS):
        sys.exit("bench_grpc: build first (no %s or %s)" % (CLI, STUBS))
    digits = None
    for f in (os.path.join(BUILD, "models", "digits.pt"),
              os.path.join(ROOT, "models", "data", "digits.pt")):
        if os.path.exists(f):
            digits = f
            break
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print("bench_grpc: %d cores, load %s; %d rounds of %g s" % (os.cpu_count(), load, ROUNDS, SECS))
    work = tempfile.mkdtemp(prefix="asyncinfer-bench-grpc-")
    try:
        section_protocols(work, digits)
        section_scaleout(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print("bench_grpc: %.0f s" % (time.monotonic() - start))
