"""System shared memory against binary tensors over HTTP, side by side in one run (issue 24).

A 1x3x224x224 FP32 input to builtin:identity, 8 connections in closed loop: each connection is
a thread with its own tritonclient.http client, and in shared memory mode its own input and
output regions (tritonclient.utils.shared_memory). Prints throughput and p50/p99 of each mode.

  .venv/tritonclient/bin/python bench/shared_memory.py --cli build/release/apps/asyncinfer/asyncinfer
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

CONFIG = """name: "identity"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
parameters { key: "uri" value { string_value: "builtin:identity?shape=3x224x224&max_batch=8" } }
"""


def start_server(cli, repo):
    p = subprocess.Popen([cli, "serve", "--model-repository", repo, "--http-port", "0",
                          "--grpc-port", "-1", "--metrics-port", "-1", "--host", "127.0.0.1"],
                         stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"http: listening on [^ ]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if line.rstrip().endswith(": ready"):
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, port


def run(port, mode, connections, seconds, x):
    nbytes = x.nbytes
    latencies = [[] for _ in range(connections)]
    stop = time.monotonic() + seconds
    errors = []

    def worker(k):
        c = httpclient.InferenceServerClient("127.0.0.1:%d" % port, connection_timeout=60,
                                             network_timeout=60)
        handles = []
        try:
            i = httpclient.InferInput("input0", list(x.shape), "FP32")
            o = httpclient.InferRequestedOutput("output0", binary_data=True)
            if mode == "shm":
                for role in ("in", "out"):
                    name = "c%d_%s" % (k, role)
                    key = "/asyncinfer-bench-%s-%s" % (name, uuid.uuid4().hex[:6])
                    handles.append(shm.create_shared_memory_region(name, key, nbytes))
                    c.register_system_shared_memory(name, key, nbytes)
                shm.set_shared_memory_region(handles[0], [x])
                i.set_shared_memory("c%d_in" % k, nbytes)
                o.set_shared_memory("c%d_out" % k, nbytes)
            else:
                i.set_data_from_numpy(x, binary_data=True)
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = c.infer("identity", [i], outputs=[o])
                if mode == "binary":
                    r.as_numpy("output0")
                else:
                    shm.get_contents_as_numpy(handles[1], np.float32, x.shape)
                latencies[k].append(time.perf_counter() - t0)
        except Exception as e:  # reported below
            errors.append(repr(e))
        finally:
            if mode == "shm":
                for h in handles:
                    c.unregister_system_shared_memory(h._triton_shm_name)
                    shm.destroy_shared_memory_region(h)
            c.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    all_l = sorted(l for ls in latencies for l in ls)
    return {"mode": mode, "requests": len(all_l), "rps": len(all_l) / wall,
            "p50_ms": 1e3 * all_l[len(all_l) // 2] if all_l else float("nan"),
            "p99_ms": 1e3 * all_l[int(len(all_l) * 0.99)] if all_l else float("nan"),
            "errors": errors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    repo = tempfile.mkdtemp(prefix="asyncinfer-shm-bench-")
    os.makedirs(os.path.join(repo, "identity", "1"))
    with open(os.path.join(repo, "identity", "config.pbtxt"), "w") as f:
        f.write(CONFIG)
    server, port = start_server(a.cli, repo)
    try:
        x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        for rnd in range(a.rounds):
            for mode in ("binary", "shm"):
                r = run(port, mode, a.connections, a.seconds, x)
                print("round %d %-6s %6d requests  %8.1f req/s  p50 %7.2f ms  p99 %7.2f ms%s"
                      % (rnd, mode, r["requests"], r["rps"], r["p50_ms"], r["p99_ms"],
                         "  errors: %s" % r["errors"][:2] if r["errors"] else ""), flush=True)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
