"""One load driver, three clients, for bench/bench_openvino.py: OpenVINO's own Python AsyncInferQueue,
asyncinfer's Python AsyncInferQueue (the same interface, after OpenVINO's), and Triton's gRPC
client against `asyncinfer serve`. Each imports only what it needs, so each runs in the
interpreter that has it:

  .venv/openvino/bin/python bench/openvino_queue.py --client openvino --model m.onnx ...
  PYTHONPATH=build/release/python /usr/bin/python3 bench/openvino_queue.py --client asyncinfer ...
  .venv/tritonclient/bin/python bench/openvino_queue.py --client grpc --url 127.0.0.1:8001 ...

Two modes, the same for every client:
  --jobs N             closed loop: N requests in flight, each completion starts the next;
  --rate R             open loop: Poisson arrivals at R/s (seeded, so every client gets the same
                       schedule); latency counts from the scheduled arrival, so a client that
                       falls behind pays for it.
Inputs: one request of shape [1, ...] of the model's first input, random values, made once.
Prints one JSON line: completed, seconds, throughput, p50_ms, p99_ms.
"""

import argparse
import json
import random
import threading
import time

import numpy as np


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[k]


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.latencies = []
        self.errors = 0

    def done(self, start, ok=True):
        t = time.perf_counter()
        with self.lock:
            if ok:
                self.latencies.append(t - start)
            else:
                self.errors += 1


def openvino_client(a, shape):
    import openvino as ov
    core = ov.Core()
    config = {"PERFORMANCE_HINT": "THROUGHPUT"}
    compiled = core.compile_model(core.read_model(a.model), "CPU", config)
    jobs = a.jobs or a.queue_jobs or compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    queue = ov.AsyncInferQueue(compiled, jobs)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    rec = Recorder()
    queue.set_callback(lambda request, start: rec.done(start))

    def submit(start):
        queue.start_async({0: x}, start)

    return submit, queue.wait_all, rec, jobs


def asyncinfer_client(a, shape):
    import asyncinfer
    # No dynamic batching by default: one request per inference, as OpenVINO's queue runs them.
    engine = asyncinfer.Engine(a.model, "cpu", max_batch_size=a.max_batch_size)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    jobs = a.jobs or a.queue_jobs or 64
    queue = asyncinfer.AsyncInferQueue(engine, jobs)
    rec = Recorder()

    def callback(result, start):
        rec.done(start, not isinstance(result, BaseException))

    queue.set_callback(callback)

    def submit(start):
        queue.start_async([x], start, share_inputs=True)

    def wait():
        queue.wait_all()

    submit.engine = engine  # kept alive with the queue
    return submit, wait, rec, jobs


def grpc_client(a, shape):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(a.url)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    inp = grpcclient.InferInput(a.input_name, list(shape), "FP32")
    inp.set_data_from_numpy(x)
    rec = Recorder()
    jobs = a.jobs or a.queue_jobs or 64
    slots = threading.Semaphore(jobs)

    def submit(start):
        slots.acquire()

        def cb(result, error):
            rec.done(start, error is None)
            slots.release()

        client.async_infer(a.grpc_model, [inp], cb)

    def wait():
        for _ in range(jobs):
            slots.acquire()
        for _ in range(jobs):
            slots.release()

    submit.client = client
    return submit, wait, rec, jobs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=["openvino", "asyncinfer", "grpc"], required=True)
    ap.add_argument("--model", help="model file (openvino, asyncinfer)")
    ap.add_argument("--url", help="host:port of the gRPC server (grpc)")
    ap.add_argument("--grpc-model", default="resnet50")
    ap.add_argument("--input-name", default="input")
    ap.add_argument("--shape", default="1,3,224,224")
    ap.add_argument("--jobs", type=int, default=0, help="closed loop with N in flight")
    ap.add_argument("--rate", type=float, default=0.0, help="open loop, Poisson arrivals per s")
    ap.add_argument("--queue-jobs", type=int, default=0,
                    help="requests in flight allowed in rate mode (default: the client's)")
    ap.add_argument("--max-batch-size", type=int, default=1,
                    help="asyncinfer: the engine's largest batch (1 = no batching)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    a = ap.parse_args()
    shape = tuple(int(d) for d in a.shape.split(","))
    submit, wait, rec, jobs = {"openvino": openvino_client, "asyncinfer": asyncinfer_client,
                               "grpc": grpc_client}[a.client](a, shape)

    # Warm-up, not counted.
    t_end = time.perf_counter() + a.warmup
    while time.perf_counter() < t_end:
        submit(time.perf_counter())
    wait()
    rec.latencies.clear()

    t0 = time.perf_counter()
    if a.rate > 0:
        rng = random.Random(12345)
        arrival = t0
        while True:
            arrival += rng.expovariate(a.rate)
            if arrival > t0 + a.seconds:
                break
            delay = arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            submit(arrival)
    else:
        # Closed loop: `jobs` in flight (the queue's start_async blocks while all are busy).
        while time.perf_counter() < t0 + a.seconds:
            submit(time.perf_counter())
    wait()
    elapsed = time.perf_counter() - t0
    lat = sorted(rec.latencies)
    print(json.dumps({"client": a.client, "jobs": jobs, "rate": a.rate, "completed": len(lat),
                      "errors": rec.errors, "seconds": round(elapsed, 3),
                      "throughput": round(len(lat) / elapsed, 2),
                      "p50_ms": round(percentile(lat, 50) * 1e3, 3) if lat else None,
                      "p99_ms": round(percentile(lat, 99) * 1e3, 3) if lat else None}))


if __name__ == "__main__":
    main()
