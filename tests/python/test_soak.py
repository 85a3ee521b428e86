"""Memory and thread count stay flat over 1,000,000 no-op requests.

Reference cycles through C++ (a future's callbacks hold the future), futures never released,
tensors kept by capsules and Python objects queued for release are the usual binding leaks:
each path is driven here. RSS is compared between a warm-up and the end, so allocator warm-up
does not count; the bound (16 MiB over 1,000,000 requests, i.e. under 17 bytes a request) is
far below what one leaked future, array or callback per request would cost (~100+ bytes each).
"""
import gc
import threading

import numpy as np

import asyncinfer
from conftest import WAIT, rss_bytes, thread_count

TOTAL = 1_000_000
WINDOW = 256


def drive(engine, n, counter):
    """n requests through every path, WINDOW in flight at a time."""
    x = np.zeros((1, 4), np.float32)
    done = threading.Semaphore(0)

    def cb(outputs):
        counter[0] += 1
        done.release()

    sent = 0
    while sent < n:
        k = min(WINDOW, n - sent)
        futures = []
        callbacks = 0
        for i in range(k):
            path = (sent + i) % 8
            if path < 5:
                futures.append(engine.submit(x))
            elif path == 5:
                f = engine.submit(x)
                f.add_done_callback(lambda f: None)
                futures.append(f)
            else:
                engine.submit(x, callback=cb)
                callbacks += 1
        for f in futures:
            f.result(WAIT)
        for _ in range(callbacks):
            assert done.acquire(timeout=WAIT)
        sent += k


def test_memory_and_threads_flat_over_a_million_requests():
    counter = [0]
    with asyncinfer.Engine("builtin:identity", "cpu", queue_capacity=4096) as e:
        drive(e, 100_000, counter)  # warm-up: allocator pools, numpy, the engine's buffers
        gc.collect()
        rss0, threads0 = rss_bytes(), thread_count()
        drive(e, TOTAL - 100_000, counter)
        gc.collect()
        rss1, threads1 = rss_bytes(), thread_count()
        # A handful of id-based requests and a queue, to see they end flat too.
        q = asyncinfer.AsyncInferQueue(e, 64)
        q.set_callback(lambda out, data: None)
        for i in range(20_000):
            q.start_async(np.zeros((1, 4), np.float32), i)
        q.wait_all()
        for i in range(20_000):
            e.submit_id(str(i % 1000), np.zeros((1, 4), np.float32))
            e.result(str(i % 1000), timeout=WAIT)
            e.release(str(i % 1000))
        gc.collect()
        rss2, threads2 = rss_bytes(), thread_count()
        m = e.metrics()
    assert m["completed"] == TOTAL + 40_000 and m["failed"] == 0
    assert counter[0] == TOTAL // 8 * 2
    assert threads1 == threads0 == threads2, (threads0, threads1, threads2)
    grown = (max(rss1, rss2) - rss0) / 2**20
    assert grown < 16, f"RSS grew by {grown:.1f} MiB over {TOTAL:,} requests"
