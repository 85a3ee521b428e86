"""What a model reload costs the requests around it (`asyncinfer serve --model-control-mode
explicit`, Triton's POST /v2/repository/models/{m}/load).

A closed loop of C connections (`asyncinfer bench --url`, the C++ load generator: the v2 JSON body of
a 1x16 FP32 input to builtin:identity, one request in flight per connection) runs three times, for
the same length each:
  before  no reload;
  during  the model is reloaded R times, evenly spread (each load changes the config through
          Triton's `config` parameter, so that every load builds a new engine beside the serving
          one and moves traffic to it);
  after   no reload.
Per phase: throughput, the client-side p50 / p99 / max latency and the failures, as the load
generator reports them; per load, the time the load call took. The goal (issue 24): p99 during the reloads at most 2x the p99
before, and no failure.

Run from the repository root after a release build (any Python 3; no package needed; the
machine's other load shows in the figures, so run it on a quiet machine):

    /usr/bin/python3 bench/model_reload.py [--cli build/release/apps/asyncinfer/asyncinfer]
        [--clients 8] [--seconds 5] [--reloads 5]
"""

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENTITY = os.path.join(ROOT, "examples", "model_repository", "identity", "config.pbtxt")


def config_json(delay_us):
    return json.dumps({
        "name": "identity", "backend": "builtin", "max_batch_size": 8,
        "input": [{"name": "input0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "output0", "data_type": "TYPE_FP32", "dims": [16]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
        "version_policy": {"all": {}},
        "parameters": {"uri": {"string_value": "builtin:identity?shape=16&max_batch=8"}}})


def start_server(cli, repository):
    proc = subprocess.Popen(
        [cli, "serve", "--model-repository", repository, "--http-port", "0", "--grpc-port", "-1",
         "--metrics-port", "-1", "--model-control-mode", "explicit", "--load-model", "*"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        m = re.search(r"http: listening on [^ ]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if line.rstrip().endswith(": ready"):
            break
    else:
        raise RuntimeError("server did not start:\n" + "".join(lines))
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, port


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/release/apps/asyncinfer/asyncinfer"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    ap.add_argument("--reloads", type=int, default=5)
    a = ap.parse_args()

    repo = tempfile.mkdtemp(prefix="asyncinfer-reload-bench-")
    os.makedirs(os.path.join(repo, "identity", "1"))
    os.makedirs(os.path.join(repo, "identity", "2"))
    shutil.copy(IDENTITY, os.path.join(repo, "identity", "config.pbtxt"))
    proc, port = start_server(a.cli, repo)
    url = "http://127.0.0.1:%d/v2/models/identity/infer" % port

    def bench():
        p = subprocess.run([a.cli, "bench", "--url", url, "-c", str(a.clients), "-t",
                            str(a.seconds)], capture_output=True, text=True, timeout=a.seconds + 60)
        out = p.stdout
        m = re.search(r"throughput\s+([\d.]+) req/s \((\d+) ok", out)
        lat = re.search(r"p50 ([\d.]+)\s+p90 [\d.]+\s+p99 ([\d.]+)\s+p99.9 [\d.]+\s+max ([\d.]+)",
                        out)
        if not m or not lat:
            raise RuntimeError("asyncinfer bench said:\n" + out + p.stderr)
        failed = sum(int(n) for n in re.findall(r"failures\s+.* (\d+)$", out, re.M))
        return {"rate": float(m.group(1)), "ok": int(m.group(2)), "failed": failed,
                "p50": float(lat.group(1)), "p99": float(lat.group(2)),
                "max": float(lat.group(3))}

    phases = {}
    loads = []
    try:
        bench()  # warm up (connections, the engine's first batches)
        phases["before"] = bench()
        result = {}
        runner = threading.Thread(target=lambda: result.update(bench()))
        runner.start()
        start = time.perf_counter()
        gap = a.seconds / (a.reloads + 1)
        for n in range(a.reloads):
            time.sleep(max(0.0, start + gap * (n + 1) - time.perf_counter()))
            t0 = time.perf_counter()
            lc = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            lc.request("POST", "/v2/repository/models/identity/load",
                       body=json.dumps({"parameters": {"config": config_json(10 * (n + 1))}}))
            r = lc.getresponse()
            r.read()
            lc.close()
            loads.append((time.perf_counter() - t0, r.status))
        runner.join()
        phases["during"] = result
        phases["after"] = bench()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(repo, ignore_errors=True)

    print("%d connections, builtin:identity 1x16 FP32 over HTTP/1.1 JSON, %.0f s a phase; "
          "%d reloads during the second" % (a.clients, a.seconds, a.reloads))
    print("%-7s %9s %8s %10s %9s %9s %9s" % ("phase", "ok", "failed", "req/s", "p50 us",
                                             "p99 us", "max us"))
    for name in ("before", "during", "after"):
        ph = phases[name]
        print("%-7s %9d %8d %10.0f %9.0f %9.0f %9.0f"
              % (name, ph["ok"], ph["failed"], ph["rate"], ph["p50"], ph["p99"], ph["max"]))
    print("loads: " + ", ".join("%.0f ms (%d)" % (s * 1e3, code) for s, code in loads))
    print("p99 during / before: %.2f (goal <= 2)" % (phases["during"]["p99"] /
                                                     phases["before"]["p99"]))


if __name__ == "__main__":
    main()
