"""The response cache of `asyncinfer serve` (--cache-config local,size=BYTES), measured:

1. Server-side latency of an answer computed by builtin:identity and of one answered from the
   cache (the same 1x16 FP32 input every time: all hits after the first), one connection, with
   `asyncinfer bench --url --binary`; the server-side figures are the server's own histogram
   (asyncinfer_http_infer_duration_us, request read → response written), its p50 interpolated in
   the bucket that holds it, and the statistics' cache_hit mean (lookup and answer).
2. The hit ratio of a Zipf-distributed input set: N distinct inputs, drawn with P(k) ∝ 1/k^s,
   through Triton's own client (tritonclient.http, binary tensors), against a cache that holds
   about a tenth of them.

Run from the repository root, after a release build, with the tritonclient venv of
scripts/setup.sh:

    .venv/tritonclient/bin/python bench/response_cache.py [--cli build/release/apps/asyncinfer/asyncinfer]
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
import urllib.request

import numpy as np
import tritonclient.http as httpclient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENTITY = os.path.join(ROOT, "examples", "model_repository", "identity", "config.pbtxt")


def make_repository():
    path = tempfile.mkdtemp(prefix="asyncinfer-cache-bench-")
    with open(IDENTITY) as f:
        text = f.read()
    for name, extra in (("identity", ""), ("identity_cached", "response_cache { enable: true }\n")):
        os.makedirs(os.path.join(path, name, "1"))
        os.makedirs(os.path.join(path, name, "2"))
        with open(os.path.join(path, name, "config.pbtxt"), "w") as f:
            f.write(text.replace('name: "identity"', 'name: "%s"' % name) + extra)
    return path


class Server:
    def __init__(self, cli, repository, cache_bytes):
        self.proc = subprocess.Popen(
            [cli, "serve", "--model-repository", repository, "--http-port", "0", "--grpc-port",
             "-1", "--metrics-port", "0", "--cache-config", "local,size=%d" % cache_bytes],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.http_port = self.metrics_port = None
        self.lines = []
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"(http|metrics): listening on [^ ]+:(\d+)", line)
                if m:
                    setattr(self, m.group(1) + "_port", int(m.group(2)))
                if line.rstrip().endswith(": ready"):
                    ready.set()
        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60):
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.lines))

    def metrics(self):
        return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                      timeout=10).read().decode()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def histogram(text, name):
    """{le: cumulative count} of an unlabelled Prometheus histogram."""
    out = {}
    for m in re.finditer(r'^%s_bucket\{le="([^"]+)"\} (\S+)$' % name, text, re.M):
        out[float(m.group(1))] = float(m.group(2))
    return out


def p50_of(before, after):
    """The median of the observations between two snapshots, interpolated in its bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0) for b in bounds]
    total = counts[-1]
    half = total / 2
    prev_bound, prev_count = 0.0, 0.0
    for b, c in zip(bounds, counts):
        if c >= half:
            if b == float("inf"):
                return prev_bound, (prev_bound, b)
            return prev_bound + (b - prev_bound) * (half - prev_count) / max(c - prev_count, 1), \
                (prev_bound, b)
        prev_bound, prev_count = b, c
    return None, None


def latency(args, server, model):
    before = histogram(server.metrics(), "asyncinfer_http_infer_duration_us")
    url = "http://127.0.0.1:%d/v2/models/%s/versions/1/infer" % (server.http_port, model)
    out = subprocess.run([args.cli, "bench", "--url", url, "--binary", "-c", "1", "-t",
                          str(args.seconds)], capture_output=True, text=True,
                         timeout=args.seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    after = histogram(server.metrics(), "asyncinfer_http_infer_duration_us")
    # The bench's table (HTTP mode writes no JSON): throughput and the latency line.
    client = {"throughput_rps": float(re.search(r"throughput\s+([\d.]+)", out.stdout).group(1)),
              "p50_us": float(re.search(r"p50 ([\d.]+)", out.stdout).group(1)),
              "p99_us": float(re.search(r"p99 ([\d.]+)", out.stdout).group(1))}
    p50, bucket = p50_of(before, after)
    return client, p50, bucket


def stats(port, model):
    with httpclient.InferenceServerClient("127.0.0.1:%d" % port) as c:
        return c.get_inference_statistics(model, "1")["model_stats"][0]["inference_stats"]


def zipf(args, server):
    rng = np.random.default_rng(1)
    weights = 1.0 / np.arange(1, args.distinct + 1) ** args.zipf_s
    draws = rng.choice(args.distinct, size=args.requests, p=weights / weights.sum())
    s0 = stats(server.http_port, "identity_cached")
    with httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port) as c:
        for k in draws:
            x = np.full((1, 16), float(k), dtype=np.float32)
            i = httpclient.InferInput("input0", [1, 16], "FP32")
            i.set_data_from_numpy(x, binary_data=True)
            r = c.infer("identity_cached", [i], model_version="2")
            assert r.as_numpy("output0")[0][0] == k
    with httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port) as c:
        s1 = c.get_inference_statistics("identity_cached", "2")["model_stats"][0][
            "inference_stats"]
    del s0
    return s1["cache_hit"]["count"], s1["cache_miss"]["count"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", default=os.path.join(ROOT, "build/release/apps/asyncinfer/asyncinfer"))
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--distinct", type=int, default=1000)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--entries", type=int, default=100, help="cache size in 1x16 FP32 entries")
    args = p.parse_args()
    repo = make_repository()
    # An entry of one 1x16 FP32 input and output takes about 760 bytes (response_cache.cpp
    # entry_bytes: the key with the input's bytes, twice, the output, the bookkeeping).
    server = Server(args.cli, repo, args.entries * 760)
    try:
        print("server-side latency, one connection, binary 1x16 FP32, %g s each:" % args.seconds)
        for model in ("identity", "identity_cached"):
            client, p50, bucket = latency(args, server, model)
            print("  %-16s client p50 %6.1f us  p99 %6.1f us  %7.0f req/s | server p50 %5.1f us "
                  "(in bucket %g-%g us)" % (model, client.get("p50_us", 0), client.get("p99_us", 0),
                                             client.get("throughput_rps", 0), p50, *bucket))
        st = stats(server.http_port, "identity_cached")
        hit = st["cache_hit"]
        print("  cache_hit: %d hits, mean %.2f us (lookup and answer)"
              % (hit["count"], hit["ns"] / max(hit["count"], 1) / 1000))
        hits, misses = zipf(args, server)
        print("Zipf s=%g over %d inputs, %d requests, cache of ~%d entries: %d hits, %d misses, "
              "hit ratio %.3f" % (args.zipf_s, args.distinct, args.requests, args.entries, hits,
                                  misses, hits / max(hits + misses, 1)))
    finally:
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
