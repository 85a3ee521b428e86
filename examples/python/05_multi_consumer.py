#!/usr/bin/python3
"""Article §3.2 — multiple consumers, each with its own stream.

The article runs four consumer threads over one queue and one model object, each polling a
result dict. Here `workers=4` gives four workers, each with its own stream and its own model
instance (Ascend cannot run one loaded model on two streams at once); results are fetched by id
with blocking waits.
"""
import numpy as np

import asyncinfer

with asyncinfer.Engine("builtin:fixed_cost?base_us=4000&shape=4", "sim:compute_engines=4",
                       workers=4, max_batch_size=1) as engine:
    for i in range(100):
        engine.submit_id(f"req_{i}", np.full((1, 4), i, np.float32))
    statuses = {}
    for i in range(100):
        output, = engine.result(f"req_{i}", timeout=30.0)
        assert output[0, 0] == i
        statuses[engine.status(f"req_{i}").name] = statuses.get(engine.status(f"req_{i}").name,
                                                                0) + 1
    per_worker = [w["batches"] for w in engine.metrics()["workers"]]
    print(f"100 requests: {statuses}; batches per worker {per_worker}")
    assert sum(per_worker) == 100 and all(n > 0 for n in per_worker)
