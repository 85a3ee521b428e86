#!/usr/bin/python3
"""Article §4.1 — a three-stage pipeline: pre-process, infer, post-process.

The article records one event object for every item (a race as soon as two items are in
flight) and its infer_batch runs the items one after another. Here the Python stages run on
their own threads (holding the GIL), the engine stage runs without it, a window bounds the items
in flight, and results come back in submit order. With the digits model (made by
scripts/demo.sh) it classifies real images; otherwise a built-in model stands in.
"""
import os
import sys
import time

import numpy as np

import asyncinfer

HERE = os.path.dirname(os.path.abspath(__file__))
models = os.environ.get("ASYNCINFER_TEST_MODELS_DIR") or os.path.join(HERE, "..", "..",
                                                                      "models", "data")
digits = os.path.join(models, "digits.pt")



def have_digits():
    try:
        return os.path.exists(digits) and asyncinfer.load_model(
            digits, backend_parameters={"warmup_runs": 0}) is not None
    except asyncinfer.Unavailable:  # built without the torch backend
        return False


if have_digits():
    sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))
    import json

    import make_digits as md

    with open(digits + ".json") as f:
        pre_cfg = json.load(f)["preprocessing"]
    files = sorted(os.listdir(os.path.join(models, "test")))
    images = [os.path.join(models, "test", f) for f in files if f.endswith(".png")][:16]

    def preprocess(path):
        image = md.read_png_gray8(np, path)[None]
        small = md.stb_resize_triangle(np, image, pre_cfg["input_size"])
        return md.normalise(np, small, pre_cfg["mean"], pre_cfg["std"])

    def postprocess(outputs):
        return int(outputs[0].argmax())

    model, items = digits, images
else:
    def preprocess(i):
        time.sleep(0.002)
        return np.full((1, 4), i, np.float32)

    def postprocess(outputs):
        return int(outputs[0][0, 0])

    model, items = "builtin:fixed_cost?base_us=2000&shape=4", list(range(16))

with asyncinfer.Engine(model, "cpu") as engine:
    with asyncinfer.Pipeline([preprocess, engine, postprocess], window=8) as pipeline:
        t0 = time.perf_counter()
        results = pipeline.run(items)  # the article's infer_batch, overlapped
        elapsed = time.perf_counter() - t0
        m = pipeline.metrics()
    print(f"{len(results)} items in {elapsed * 1e3:.0f} ms; first results {results[:8]}")
    for s in m["stages"]:
        print(f"  stage {s['name']:12} {s['kind']:6} {s['items']} items, mean service "
              f"{s['service_us']['mean'] / 1e3:.2f} ms")
    print(f"bottleneck: {m['bottleneck']}; max in flight {m['max_in_flight']} of window 8")
    assert len(results) == len(items) and m["max_in_flight"] <= 8
