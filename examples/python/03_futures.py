#!/usr/bin/python3
"""Article §2.2 — Future mode, with infer_batch.

The article submits every request to a ThreadPoolExecutor(max_workers=4) sharing one stream,
so four Python threads contend for the GIL and the device, and each request is a batch of one.
Here submit returns a concurrent.futures-style Future at once; the engine batches what is queued
(one model call for many requests) and fulfils the futures without the GIL.
"""
import concurrent.futures

import numpy as np

import asyncinfer


def infer_batch(engine, inputs, timeout=5.0):
    """The article's infer_batch: submit everything, then collect in order."""
    futures = [engine.submit(x) for x in inputs]
    return [f.result(timeout)[0] for f in futures]


with asyncinfer.Engine("builtin:fixed_cost?base_us=3000&per_item_us=100&shape=4", "sim",
                       max_queue_delay_us=500) as engine:
    f1, f2, f3 = (engine.submit(np.full((1, 4), i, np.float32)) for i in (1, 2, 3))
    print("3 futures returned at once; doing other work...")
    print("results:", [f.result(timeout=5.0)[0][0, 0] for f in (f1, f2, f3)])

    outputs = infer_batch(engine, [np.full((1, 4), i, np.float32) for i in range(32)])
    assert [o[0, 0] for o in outputs] == list(range(32))
    m = engine.metrics()
    print(f"infer_batch of 32: {m['batches']} model calls in all, mean batch "
          f"{m['batch_size']['mean']:.1f}")
    # They mix with Python's own futures: wait, as_completed, asyncio.
    done, _ = concurrent.futures.wait([engine.submit(np.zeros((1, 4), np.float32))], timeout=5)
    assert len(done) == 1
