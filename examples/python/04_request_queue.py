#!/usr/bin/python3
"""Article §3.1 — a request queue with request ids and a result store.

The article's get_result polls its dict every 10 ms (adding up to 10 ms to every request and
burning CPU while it waits), and its result store never forgets. Here result(id, timeout)
blocks on a condition without the GIL, and finished results leave the store by TTL, capacity
or release(id).
"""
import time

import numpy as np

import asyncinfer

with asyncinfer.Engine("builtin:fixed_cost?base_us=2000&shape=4", "sim",
                       result_store_capacity=1000, result_ttl=60.0) as engine:
    engine.submit_id("req_001", np.ones((1, 4), np.float32))
    print("req_001:", engine.status("req_001").name)
    t0 = time.perf_counter()
    output, = engine.result("req_001", timeout=10.0)
    print(f"req_001: {engine.status('req_001').name} after {1e3 * (time.perf_counter() - t0):.1f}"
          f" ms of waiting (no polling), output {output.tolist()}")
    engine.submit_id("req_002", np.ones((1, 4), np.float32))
    try:
        engine.submit_id("req_002", np.ones((1, 4), np.float32))
    except asyncinfer.AlreadyExists as e:  # the article silently overwrites a live entry
        print("duplicate id refused:", e)
    engine.result("req_002", timeout=10.0)
    engine.release("req_002")
    engine.release("req_001")
    print("req_001 after release:", engine.status("req_001").name)
    try:
        engine.result("never_submitted", timeout=0.1)
    except asyncinfer.NotFound as e:
        print("unknown id:", e)
