"""Decoupled responses over gRPC against unary calls, on one `asyncinfer serve`, in one run.

  stream  builtin:stream?n=100 (decoupled: 100 responses per request, then the final flag) on
          --streams ModelStreamInfer streams at once, each sending its next request when the
          previous one's final flag arrives;
  unary   builtin:identity of the same tensor (one response per request) over ModelInfer, with
          --streams calls in flight.

With --stream-model unary, the streams carry the unary model instead (one response a request:
issue 28's ModelStreamInfer at 64 streams against ModelInfer at 64 calls in flight).

Reported: responses/s, and for the streams the time to the first response and the gap between
responses (p50, p99). The client is Triton's (tritonclient.grpc.aio, one event loop); its CPU
time is reported apart, since it shares the cores with the server.

    .venv/tritonclient/bin/python bench/bench_decoupled.py --cli build/release/apps/asyncinfer/asyncinfer
"""

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput

DIMS = 16


def config(name, uri, decoupled):
    return ('name: "%s"\nbackend: "builtin"\nmax_batch_size: 64\n'
            'input [ { name: "input0", data_type: TYPE_FP32, dims: [ %d ] } ]\n'
            'output [ { name: "output0", data_type: TYPE_FP32, dims: [ %d ] }%s ]\n'
            'parameters { key: "uri" value { string_value: "%s" } }\n%s'
            % (name, DIMS, DIMS,
               ', { name: "index", data_type: TYPE_INT32, dims: [ 1 ] }' if decoupled else "",
               uri, "model_transaction_policy { decoupled: true }\n" if decoupled else ""))


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def tensor():
    i = InferInput("input0", [1, DIMS], "FP32")
    i.set_data_from_numpy(np.ones((1, DIMS), np.float32))
    return i


async def streams(target, n_streams, seconds, n, model="stream"):
    firsts, gaps = [], []
    counts = [0]
    stop_at = time.perf_counter() + seconds

    async def one():
        client = grpcaio.InferenceServerClient(target)
        try:
            queue = asyncio.Queue()

            async def requests():
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    yield item

            responses = client.stream_infer(requests())
            while time.perf_counter() < stop_at:
                sent = time.perf_counter()
                await queue.put({"model_name": model, "inputs": [tensor()]})
                last = None
                got = 0
                while got < n:
                    result, error = await responses.__anext__()
                    if error is not None:
                        raise RuntimeError(str(error))
                    now = time.perf_counter()
                    if last is None:
                        firsts.append(now - sent)
                    else:
                        gaps.append(now - last)
                    last = now
                    got += 1
                counts[0] += got
            await queue.put(None)
        finally:
            await client.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n_streams)))
    took = time.perf_counter() - t0
    def us(values):
        return {"p50": pct(values, 0.5) * 1e6, "p99": pct(values, 0.99) * 1e6} if values else None
    return {"responses_per_s": counts[0] / took, "first_response_us": us(firsts),
            "gap_us": us(gaps)}


async def unary(target, in_flight, seconds):
    client = grpcaio.InferenceServerClient(target)
    count = [0]
    stop_at = time.perf_counter() + seconds

    async def one():
        while time.perf_counter() < stop_at:
            await client.infer("unary", [tensor()])
            count[0] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(in_flight)))
    took = time.perf_counter() - t0
    await client.close()
    return {"responses_per_s": count[0] / took}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", required=True)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--responses", type=int, default=100)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--stream-model", choices=("stream", "unary"), default="stream")
    args = p.parse_args()
    repo = tempfile.mkdtemp(prefix="asyncinfer-bench-decoupled-")
    try:
        for name, uri, dec in (
                ("stream", "builtin:stream?n=%d&shape=%d&max_batch=64" % (args.responses, DIMS),
                 True),
                ("unary", "builtin:identity?shape=%d&max_batch=64" % DIMS, False)):
            os.makedirs(os.path.join(repo, name, "1"))
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                f.write(config(name, uri, dec))
        server = subprocess.Popen([args.cli, "serve", "--model-repository", repo, "--http-port",
                                   "0", "--grpc-port", "0", "--metrics-port", "0", "--host",
                                   "127.0.0.1"], stderr=subprocess.PIPE, text=True)
        port = None
        for line in server.stderr:
            m = re.search(r"grpc: listening on [^ ]+:(\d+)", line)
            if m:
                port = int(m.group(1))
            if line.rstrip().endswith(": ready"):
                break
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        target = "127.0.0.1:%d" % port
        try:
            n = args.responses if args.stream_model == "stream" else 1
            for name, run in (("stream", lambda: streams(target, args.streams, args.seconds, n,
                                                          args.stream_model)),
                              ("unary", lambda: unary(target, args.streams, args.seconds))):
                asyncio.run(run() if name == "unary" else streams(
                    target, args.streams, 1, n, args.stream_model))  # warm-up
                c0 = time.process_time()
                result = asyncio.run(run())
                result["client_cpu_s"] = time.process_time() - c0
                result["design"] = name if name == "unary" else "stream of " + args.stream_model
                result["streams_or_calls"] = args.streams
                print(json.dumps(result), flush=True)
        finally:
            server.terminate()
            server.wait(60)
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
