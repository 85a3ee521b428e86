#!/usr/bin/python3
"""Article §2.1 — an engine with completion callbacks.

The article starts a new threading.Thread per request to wait on an event and call back; a
burst of requests is a burst of threads. Here every callback runs on the engine's fixed
completion executor (one thread by default), holding the GIL only while it runs.
"""
import threading

import numpy as np

import asyncinfer

with asyncinfer.Engine("builtin:fixed_cost?base_us=2000&shape=8", "sim", workers=2) as engine:
    done = threading.Semaphore(0)
    threads_before = threading.active_count()

    def on_complete(outputs, i):
        if isinstance(outputs, BaseException):
            print(f"on_complete({i}): {outputs!r}")
        else:
            print(f"on_complete({i}): output[0] = {outputs[0][0, 0]:.0f}, shape {outputs[0].shape}")
        done.release()

    for i in range(8):
        x = np.zeros((1, 8), np.float32)
        x[0, 0] = i
        engine.submit(x, callback=lambda out, i=i: on_complete(out, i))
    print("8 requests submitted; doing other work...")
    for _ in range(8):
        assert done.acquire(timeout=30)
    assert threading.active_count() == threads_before  # no thread per callback
    print("8 of 8 completed")
