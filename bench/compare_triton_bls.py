#!/usr/bin/python3
"""compare_triton_bls.py — business logic scripting side by side with the real Triton 2.51.

Triton's own python_backend examples (a checkout: --python-backend, or TRITON_PYTHON_BACKEND_DIR;
never copied into this project): examples/add_sub and examples/bls/sync_model.py, each with its
own config.pbtxt, served by `asyncinfer serve` and by tritonserver 2.51 (nvidia-pytriton's binary,
python backend: ../shared/peers.md), one server at a time on this machine. The same perf_analyzer
2.51 command drives each: gRPC, --concurrency-range 64, the bls model asked to call add_sub
(its MODEL_NAME input). Two rows per server:

  add_sub   the model called directly by the client;
  bls_sync  the BLS model, which calls add_sub once per request.

Each row: requests/s and p99 as perf_analyzer measured them, and the server-side time of one
request (the statistics extension: success time / success count over the run). The BLS hop's cost
is bls_sync's server-side time less add_sub's called directly.

  bench/compare_triton_bls.py --cli build/release/apps/asyncinfer/asyncinfer \\
      --python-backend <python_backend checkout>
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import peer_servers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = {"add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
          "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt")}


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read() or b"{}")


def success(http_port, model):
    s = get("http://127.0.0.1:%d/v2/models/%s/stats" % (http_port, model))
    st = s["model_stats"][0]["inference_stats"]["success"]
    return int(st["count"]), int(st["ns"])


def perf(args, http_port, grpc_port, model, data):
    out = tempfile.mktemp(suffix=".csv")
    cmd = [args.perf_analyzer, "-m", model, "-i", "grpc", "-u", "127.0.0.1:%d" % grpc_port,
           "--concurrency-range", str(args.concurrency), "--measurement-interval",
           str(args.interval_ms), "--stability-percentage", "50", "--percentile", "99",
           "--input-data", data]
    shown = " ".join([os.path.basename(cmd[0])] + cmd[1:-1] + ["<data.json>"])
    c0, n0 = success(http_port, model)
    r = subprocess.run(cmd + ["-f", out], capture_output=True, text=True, timeout=900)
    c1, n1 = success(http_port, model)
    if r.returncode != 0:
        raise RuntimeError("perf_analyzer failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    with open(out) as f:
        row = next(csv.DictReader(f))
    os.unlink(out)
    server_us = (n1 - n0) / max(1, c1 - c0) / 1000.0
    return float(row["Inferences/Second"]), int(row["p99 latency"]), server_us, shown


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tritonserver", help="pytriton's tritonserver folder",
                   default=peer_servers.DEFAULT_TRITONSERVER)
    p.add_argument("--cli", required=True, help="the asyncinfer program")
    p.add_argument("--python-backend", default=os.environ.get("TRITON_PYTHON_BACKEND_DIR"),
                   help="a checkout of github.com/triton-inference-server/python_backend")
    p.add_argument("--perf-analyzer", default=os.path.join(ROOT, "scripts", "perf_analyzer"))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--interval-ms", type=int, default=5000)
    p.add_argument("--servers", default="asyncinfer,triton")
    args = p.parse_args()
    if not args.python_backend:
        p.error("--python-backend (or TRITON_PYTHON_BACKEND_DIR) is needed")
    examples = os.path.join(args.python_backend, "examples")

    work = tempfile.mkdtemp(prefix="asyncinfer-blsbench-")
    repo = os.path.join(work, "models")
    for name, (source, cfg) in MODELS.items():
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(os.path.join(examples, source), os.path.join(repo, name, "1", "model.py"))
        shutil.copy(os.path.join(examples, cfg), os.path.join(repo, name, "config.pbtxt"))
    data = {}
    for name, extra in (("add_sub", {}), ("bls_sync", {"MODEL_NAME": ["add_sub"]})):
        path = os.path.join(work, name + ".json")
        sample = {"INPUT0": [0.5, 1.5, 2.5, 3.5], "INPUT1": [1.0, 1.0, 1.0, 1.0]}
        sample.update(extra)
        with open(path, "w") as f:
            json.dump({"data": [sample]}, f)
        data[name] = path
    rows = []
    try:
        for server in args.servers.split(","):
            with peer_servers.serve(server, repo, list(MODELS), args.cli,
                                    args.tritonserver) as (http, grpc):
                for model in ("add_sub", "bls_sync"):
                    rows.append((server, model) + perf(args, http, grpc, model, data[model]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| server | model | requests/s | p99 us | server-side us/request |")
    print("|---|---|---|---|---|")
    for server, model, rps, p99, server_us, _ in rows:
        print("| %s | %s | %.0f | %d | %.0f |" % (server, model, rps, p99, server_us))
    print()
    by = {(s, m): us for s, m, _, _, us, _ in rows}
    for server in args.servers.split(","):
        if (server, "bls_sync") in by and (server, "add_sub") in by:
            print("%s: the BLS hop adds %.0f us per request (server-side)"
                  % (server, by[(server, "bls_sync")] - by[(server, "add_sub")]))
    print()
    for server, model, _, _, _, cmd in rows:
        print("%s, %s: %s" % (server, model, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
