"""The digits model from Python gives the C++ engine's results (and torch's own).

The reference is `asyncinfer run` (the C++ CLI: stb decode and resize, the engine, softmax) on
the same PNG files; the Python side preprocesses them with models/make_digits.py's exact
emulation of that path, then runs infer, submit and the pipeline.
"""
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest

import asyncinfer
from conftest import CLI, MODELS_DIR, WAIT, digits_model

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
N = 64


def make_digits():
    spec = importlib.util.spec_from_file_location(
        "make_digits", os.path.join(HERE, "..", "..", "models", "make_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data():
    model = digits_model()
    md = make_digits()
    with open(model + ".json") as f:
        sidecar = json.load(f)
    pre = sidecar["preprocessing"]
    test_dir = os.path.join(MODELS_DIR, "test")
    files = sorted(f for f in os.listdir(test_dir) if f.endswith(".png"))[:N]
    paths = [os.path.join(test_dir, f) for f in files]
    images = np.stack([md.read_png_gray8(np, p) for p in paths])
    small = md.stb_resize_triangle(np, images, pre["input_size"])
    x = md.normalise(np, small, pre["mean"], pre["std"])
    labels = {}
    with open(os.path.join(test_dir, "labels.csv")) as f:
        for line in f.read().splitlines()[1:]:
            name, label = line.split(",")
            labels[name] = int(label)
    return model, paths, x, [labels[f] for f in files], sidecar["labels"]


def softmax(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z.astype(np.float64))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def cli_probabilities(data, tmp_path_factory):
    if not CLI or not os.path.exists(CLI):
        pytest.skip("ASYNCINFER_CLI (the asyncinfer command) is set by ctest")
    model, paths, _, _, _ = data
    out = tmp_path_factory.mktemp("cli") / "preds.json"
    subprocess.run([CLI, "run", "--model", model, "--images", *paths, "--top-k", "10",
                    "--output", str(out), "--quiet"], check=True, timeout=300,
                   capture_output=True)
    rows = json.loads(out.read_text())
    by_file = {os.path.basename(r["file"]): r for r in rows}
    probs = np.zeros((len(paths), 10))
    for i, p in enumerate(paths):
        for entry in by_file[os.path.basename(p)]["top"]:
            probs[i, int(entry["class"])] = entry["probability"]
    return probs


def test_python_results_equal_the_cpp_engines(data, cli_probabilities):
    model, _, x, labels, _ = data
    with asyncinfer.Engine(model, "cpu", workers=2) as e:
        sync = np.concatenate([e.infer(x[i:i + 1])[0] for i in range(N)])
        futures = [e.submit(x[i:i + 1]) for i in range(N)]
        async_ = np.concatenate([f.result(WAIT)[0] for f in futures])
        batch = e.infer(x)[0]
        assert sync.shape == (N, 10) and sync.dtype == np.float32
    for logits in (sync, async_, batch):
        np.testing.assert_allclose(softmax(logits), cli_probabilities, rtol=1e-4, atol=1e-6)
        assert (logits.argmax(axis=1) == cli_probabilities.argmax(axis=1)).all()
    accuracy = np.mean(sync.argmax(axis=1) == np.array(labels))
    assert accuracy >= 0.95


def test_python_results_equal_torch_itself(data):
    model, _, x, _, _ = data
    module = torch.jit.load(model).eval()
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    with asyncinfer.Engine(model, "cpu") as e:
        got = np.concatenate([f.result(WAIT)[0] for f in [e.submit(torch.from_numpy(x[i:i + 1]))
                                                          for i in range(N)]])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).all()


def test_digits_pipeline_and_queue(data):
    model, paths, x, labels, names = data
    md = make_digits()
    with open(model + ".json") as f:
        pre = json.load(f)["preprocessing"]

    def preprocess(path):
        image = md.read_png_gray8(np, path)[None]
        return md.normalise(np, md.stb_resize_triangle(np, image, pre["input_size"]),
                            pre["mean"], pre["std"])

    def postprocess(outputs):
        return names[int(outputs[0].argmax())]

    with asyncinfer.Engine(model, "cpu") as e:
        with asyncinfer.Pipeline([preprocess, e, postprocess], window=16) as p:
            predicted = p.run(paths)
        q = asyncinfer.AsyncInferQueue(e)
        got = {}
        q.set_callback(lambda out, i: got.__setitem__(i, int(out[0].argmax())))
        for i in range(N):
            q.start_async(x[i:i + 1], i)
        q.wait_all()
    assert np.mean([int(c) == label for c, label in zip(predicted, labels)]) >= 0.95
    assert [got[i] for i in range(N)] == [int(c) for c in predicted]
