#!/usr/bin/python3
"""The article's own Python designs, run on the same model and inputs as asyncinfer's benchmarks.

The article (shared seed, "CANN 异步推理") sketches its engines on torch.npu. This file keeps its
code paths as written — a ThreadPoolExecutor(max_workers=4) for the Future mode (§2.2), and the
§3.2 queue with 4 consumer threads whose get_result polls every 10 ms — and replaces only
torch.npu.Stream with "no stream" (the CPU has none). The model is the digits TorchScript model;
the inputs are float32 [1, 1, 32, 32] tensors. It prints one JSON line per design:
throughput (requests/s) and latency percentiles (µs, nearest rank), so scripts/bench.sh can put
them next to `asyncinfer bench` on the same model.

    /usr/bin/python3 bench/article_baseline.py models/data/digits.pt [requests]
"""
import concurrent.futures
import json
import math
import queue
import sys
import threading
import time

import torch


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values) - 1e-9)))
    return sorted_values[rank - 1]


def summary(name, latencies_s, wall_s):
    lat = sorted(x * 1e6 for x in latencies_s)
    return {
        "design": name,
        "requests": len(lat),
        "throughput_rps": len(lat) / wall_s if wall_s > 0 else None,
        "latency_us": {"p50": percentile(lat, 0.50), "p99": percentile(lat, 0.99)},
    }


class FutureInferenceEngine:
    """§2.2 as written: a 4-thread pool; every request is one forward of batch 1."""

    def __init__(self, model):
        self.model = model
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=4)

    def infer(self, input_data):
        return self.executor.submit(self._run_inference, input_data)

    def _run_inference(self, input_data):
        with torch.inference_mode():
            return self.model(input_data)


class MultiConsumerInference:
    """§3.2 as written: a bounded queue, N consumer threads, a result dict polled every 10 ms."""

    def __init__(self, model, num_consumers=4):
        self.model = model
        self.request_queue = queue.Queue(maxsize=1000)
        self.result_store = {}
        self.lock = threading.Lock()
        self.num_consumers = num_consumers
        self.running = True

    def start(self):
        for i in range(self.num_consumers):
            threading.Thread(target=self._consumer_worker, args=(i,), daemon=True).start()

    def _consumer_worker(self, consumer_id):
        while self.running:
            try:
                request = self.request_queue.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                with torch.inference_mode():
                    output = self.model(request["input"])
                with self.lock:
                    self.result_store[request["id"]] = {"status": "completed", "output": output}
            except Exception as e:  # noqa: BLE001 (as in the article)
                with self.lock:
                    self.result_store[request["id"]] = {"status": "failed", "error": str(e)}

    def submit(self, request_id, input_data):
        self.request_queue.put({"id": request_id, "input": input_data})
        with self.lock:
            self.result_store[request_id] = {"status": "pending"}
        return request_id

    def get_result(self, request_id, timeout=10.0):
        start_time = time.time()
        while time.time() - start_time < timeout:
            with self.lock:
                result = self.result_store.get(request_id)
                if result and result["status"] in ("completed", "failed"):
                    return result
            time.sleep(0.01)
        raise TimeoutError(request_id)


def main():
    model_path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    model = torch.jit.load(model_path).eval()
    x = torch.randn(1, 1, 32, 32)
    with torch.inference_mode():
        for _ in range(20):
            model(x)

    # §1.1 synchronous loop (the reference the article starts from).
    lat = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _ in range(n):
            s = time.perf_counter()
            model(x)
            lat.append(time.perf_counter() - s)
    print(json.dumps(summary("sync loop (1.1)", lat, time.perf_counter() - t0)))

    # §2.2 Future mode: infer_batch of 32 at a time (submit all, then result() each).
    engine = FutureInferenceEngine(model)
    lat = []
    t0 = time.perf_counter()
    for _ in range(n // 32):
        sent = [(time.perf_counter(), engine.infer(x)) for _ in range(32)]
        for s, f in sent:
            f.result(timeout=5.0)
            lat.append(time.perf_counter() - s)
    print(json.dumps(summary("future mode, ThreadPoolExecutor(4) (2.2)", lat,
                             time.perf_counter() - t0)))
    engine.executor.shutdown()

    # §3.2 multi-consumer queue: submit 32, then get_result each (polling every 10 ms).
    mc = MultiConsumerInference(model, num_consumers=4)
    mc.start()
    lat = []
    t0 = time.perf_counter()
    for b in range(n // 32):
        sent = []
        for i in range(32):
            rid = f"req_{b}_{i}"
            sent.append((time.perf_counter(), mc.submit(rid, x)))
        for s, rid in sent:
            mc.get_result(rid)
            lat.append(time.perf_counter() - s)
    print(json.dumps(summary("4 consumers, get_result polling (3.2)", lat,
                             time.perf_counter() - t0)))
    mc.running = False


if __name__ == "__main__":
    main()
