#!/usr/bin/python3
"""Article §5.1 — timeouts.

The article makes a new ThreadPoolExecutor for every call and, on timeout, returns None while
the work keeps running in a thread nobody joins. Here the deadline lives on the engine's timer:
a queued request leaves the queue at once, a running one ends DeadlineExceeded at once and its
result is discarded; no thread is created per call.
"""
import threading
import time

import numpy as np

import asyncinfer

with asyncinfer.Engine("builtin:fixed_cost?base_us=200000&shape=4", "sim") as engine:
    threads = threading.active_count()
    x = np.zeros((1, 4), np.float32)
    for _ in range(3):
        t0 = time.perf_counter()
        try:
            engine.infer(x, timeout=0.05)
        except asyncinfer.DeadlineExceeded as e:  # also a TimeoutError
            print(f"timed out after {1e3 * (time.perf_counter() - t0):.0f} ms: {e}")
    f = engine.submit(x, timeout=0.05)
    print("future:", type(f.exception(timeout=5)).__name__)
    assert threading.active_count() == threads  # no thread per timeout
    m = engine.metrics()
    print(f"timed_out {m['timed_out']}, threads {threading.active_count()} (unchanged)")
    assert m["timed_out"] == 4
