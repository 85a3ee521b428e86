#!/usr/bin/python3
"""Article §5.2 — retries.

The article retries every exception (bad input included) after a fixed time.sleep(1.0) in the
calling thread. Here RetryPolicy retries only retryable codes, with exponential backoff and full
jitter, never past the request's deadline, within a retry budget; the waits live on the
engine's timer, so no thread sleeps.
"""
import numpy as np

import asyncinfer

retry = asyncinfer.RetryPolicy(max_attempts=3, initial_backoff=0.005, max_backoff=0.1,
                               retryable_codes=[asyncinfer.Unavailable])
# Every other call fails with `unavailable` (a transient device error).
model = "builtin:faulty?mode=error&code=unavailable&every=2&shape=4"
with asyncinfer.Engine(model, "sim", retry=retry, max_batch_size=1) as engine:
    # One at a time, so the failing calls are known: calls 2, 4, 6, ... (each retry is odd).
    outputs = [engine.infer(np.full((1, 4), i, np.float32), timeout=10) for i in range(10)]
    assert [o[0][0, 0] for o in outputs] == list(range(10))
    m = engine.metrics()
    print(f"10 requests completed: {m['completed']}, attempts {m['attempts']}, "
          f"retries {m['retries']}")
    assert m["completed"] == 10 and m["retries"] == 9  # requests 1..9 failed once each
    try:
        engine.infer(np.zeros((1, 4), np.float64))  # bad input: never retried
    except asyncinfer.InvalidArgument as e:
        print("not retried:", e)
