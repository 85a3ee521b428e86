#!/usr/bin/python3
"""The digits service three ways, on the same images and the same model file, in one run:

  ensemble   examples/model_repository_ensemble served by `asyncinfer serve`: PNG bytes in over
             gRPC, top-3 labels out (a Python pre-processing model, TorchScript, a Python
             post-processing model), driven by Triton's client (tritonclient.grpc async_infer,
             --concurrency in flight) in a process of its own;
  pipeline   the same three stages in-process through asyncinfer.Pipeline: the example's own
             pre- and post-processing code as Python host stages, the TorchScript model as an
             engine stage (2 workers, max_queue_delay 200 us, as the example's config);
  article    the article's §4.1 InferencePipeline as written, with torch.npu.Stream replaced by
             "no stream" (the CPU has none): infer_batch runs pre-process, the model (torch.jit,
             batch 1) and post-process one image after another (bench/article_baseline.py does
             the same for §2.2 and §3.2).

For each: images/s, and for the ensemble the CPU seconds of the server and of the client apart
(the client shares the 2 cores). The ratio ensemble / pipeline is issue 25's figure (goal >= 0.7).

    /usr/bin/python3 bench/bench_ensemble.py --cli build/release/apps/asyncinfer/asyncinfer \\
        --digits build/release/models/digits.pt [--requests 4000] [--concurrency 64]

PYTHONPATH must reach the asyncinfer module (build/release/python); Triton's client is run from
.venv/tritonclient.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "model_repository_ensemble")


def load_example(name):
    """The example's TritonPythonModel class `name`, with our triton_python_backend_utils."""
    if "triton_python_backend_utils" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "triton_python_backend_utils",
            os.path.join(ROOT, "src", "model", "python", "triton_python_backend_utils.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["triton_python_backend_utils"] = module
    spec = importlib.util.spec_from_file_location(
        "example_" + name, os.path.join(EXAMPLE, name, "1", "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


def stages(digits):
    """The example's pre-processing (its own code) and post-processing (the same arithmetic) as
    plain functions; the sidecar is read from beside the model."""
    pre_cls = load_example("preprocess")
    with open(digits + ".json") as f:
        side = json.load(f)
    import numpy as np
    pre = pre_cls.__new__(pre_cls)
    pre.size = int(side["preprocessing"]["input_size"])
    pre.mean = np.float32(side["preprocessing"]["mean"])
    pre.std = np.float32(side["preprocessing"]["std"])
    pre.taps = {}
    labels = [l.encode() for l in side["labels"]]

    def preprocess(png):
        return pre.image(png)[None, None, :, :]

    def postprocess(logits):
        z = np.asarray(logits, dtype=np.float32)
        shifted = (z - z.max(axis=1, keepdims=True)).astype(np.float32)
        e = np.exp(shifted.astype(np.float64))
        probs = (e.astype(np.float32).astype(np.float64) / e.sum(axis=1, keepdims=True))
        top = np.argsort(-probs, axis=1, kind="stable")[:, :3]
        return [labels[k] for k in top[0]], probs[0, top[0]].astype(np.float32)

    return preprocess, postprocess


def images_of(digits, requests):
    test = os.path.join(os.path.dirname(digits), "test")
    files = sorted(f for f in os.listdir(test) if f.endswith(".png"))
    data = [open(os.path.join(test, f), "rb").read() for f in files]
    return [data[i % len(data)] for i in range(requests)]


def measure(design, run_all, pngs):
    """images/s of `run_all` (a list of PNGs -> a list of results) after 200 images of warm-up."""
    run_all(pngs[:200])
    t0 = time.perf_counter()
    results = run_all(pngs)
    took = time.perf_counter() - t0
    assert len(results) == len(pngs)
    return {"design": design, "images": len(pngs), "images_per_s": len(pngs) / took}


def run_pipeline(digits, pngs):
    import asyncinfer
    preprocess, postprocess = stages(digits)
    with asyncinfer.Engine(digits, "cpu", workers=2, max_queue_delay_us=200) as engine:
        with asyncinfer.Pipeline([preprocess, engine, lambda outs: postprocess(outs[0])],
                                 window=64) as p:
            return measure("pipeline (in-process asyncinfer.Pipeline)", p.run, pngs)


def run_article(digits, pngs):
    import torch
    torch.set_num_threads(1)
    preprocess, postprocess = stages(digits)
    model = torch.jit.load(digits)
    model.eval()

    class InferencePipeline:
        """§4.1 as written; torch.npu streams and events replaced by none (the CPU has none)."""

        def __init__(self, preprocessor, model, postprocessor):
            self.preprocessor, self.model, self.postprocessor = preprocessor, model, postprocessor

        def infer(self, raw_data):
            preprocessed = self.preprocessor(raw_data)
            with torch.inference_mode():
                output = self.model(torch.from_numpy(preprocessed))
            return self.postprocessor(output.numpy())

        def infer_batch(self, raw_data_list):
            return [self.infer(raw) for raw in raw_data_list]

    pipe = InferencePipeline(preprocess, model, postprocess)
    return measure("article §4.1 InferencePipeline (no streams on CPU)", pipe.infer_batch, pngs)


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / ticks


def tree_cpu_seconds(pid):
    """CPU seconds of `pid` and its live children (the python instance processes)."""
    total = cpu_seconds(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    total += cpu_seconds(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return total


def run_ensemble(args, pngs):
    work = tempfile.mkdtemp(prefix="asyncinfer-bench-ensemble-")
    try:
        repo = os.path.join(work, "repo")
        for name in ("preprocess", "digits", "postprocess", "digits_ensemble"):
            os.makedirs(os.path.join(repo, name, "1"))
            shutil.copy(os.path.join(EXAMPLE, name, "config.pbtxt"), os.path.join(repo, name))
        for name in ("preprocess", "postprocess"):
            shutil.copy(os.path.join(EXAMPLE, name, "1", "model.py"),
                        os.path.join(repo, name, "1"))
            shutil.copy(args.digits + ".json", os.path.join(repo, name, "1", "digits.pt.json"))
        shutil.copy(args.digits, os.path.join(repo, "digits", "1", "model.pt"))
        server = subprocess.Popen([args.cli, "serve", "--model-repository", repo, "--http-port",
                                   "0", "--grpc-port", "0", "--metrics-port", "0", "--host",
                                   "127.0.0.1"], stderr=subprocess.PIPE, text=True)
        port = None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = server.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"grpc: listening on [^ ]+:(\d+)", line)
            if m:
                port = int(m.group(1))
            if line.rstrip().endswith(": ready"):
                break
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        if port is None:
            server.kill()
            raise RuntimeError("server did not start:\n" + "".join(lines))
        try:
            images_file = os.path.join(work, "images.json")
            with open(images_file, "w") as f:
                json.dump([p.hex() for p in pngs], f)
            client = [args.client_python, os.path.abspath(__file__), "--client",
                      "127.0.0.1:%d" % port, "--images-file", images_file,
                      "--concurrency", str(args.concurrency)]
            subprocess.run(client + ["--warmup"], check=True, timeout=600)
            cpu0 = tree_cpu_seconds(server.pid)
            out = subprocess.run(client, check=True, timeout=600, capture_output=True, text=True)
            server_cpu = tree_cpu_seconds(server.pid) - cpu0
            result = json.loads(out.stdout.strip().splitlines()[-1])
            result["server_cpu_s_per_1000"] = 1000 * server_cpu / len(pngs)
            return result
        finally:
            server.terminate()
            server.wait(60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def client_main(target, images_file, concurrency, warmup):
    """Runs in .venv/tritonclient: sends every image once, `concurrency` in flight."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    with open(images_file) as f:
        pngs = [bytes.fromhex(h) for h in json.load(f)]
    if warmup:
        pngs = pngs[:300]
    client = grpcclient.InferenceServerClient(target)
    slots = threading.Semaphore(concurrency)
    errors = []

    def done(result, error):
        if error is not None:
            errors.append(str(error))
        slots.release()

    inputs = []
    for png in pngs:
        i = grpcclient.InferInput("IMAGE", [1, 1], "BYTES")
        i.set_data_from_numpy(np.array([[png]], dtype=np.object_))
        inputs.append(i)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for i in inputs:
        slots.acquire()
        client.async_infer("digits_ensemble", [i], done)
    for _ in range(concurrency):
        slots.acquire()
    took = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    client.close()
    if errors:
        raise SystemExit("errors: %d, first: %s" % (len(errors), errors[0]))
    print(json.dumps({"design": "ensemble over gRPC (asyncinfer serve)", "images": len(pngs),
                      "images_per_s": len(pngs) / took, "concurrency": concurrency,
                      "client_cpu_s_per_1000": 1000 * client_cpu / len(pngs)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli")
    p.add_argument("--digits")
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--client-python", default=os.path.join(ROOT, ".venv", "tritonclient", "bin",
                                                           "python"))
    p.add_argument("--only", default="ensemble,pipeline,article")
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--images-file", help=argparse.SUPPRESS)
    p.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        return client_main(args.client, args.images_file, args.concurrency, args.warmup)
    if not args.cli or not args.digits:
        p.error("--cli and --digits are needed")
    pngs = images_of(args.digits, args.requests)
    results = {}
    for which in args.only.split(","):
        run = {"ensemble": lambda: run_ensemble(args, pngs),
               "pipeline": lambda: run_pipeline(args.digits, pngs),
               "article": lambda: run_article(args.digits, pngs)}[which]
        results[which] = run()
        print(json.dumps(results[which]), flush=True)
    if "ensemble" in results and "pipeline" in results:
        print(json.dumps({"ensemble_over_pipeline": results["ensemble"]["images_per_s"] /
                          results["pipeline"]["images_per_s"]}))
    if "ensemble" in results and "article" in results:
        print(json.dumps({"ensemble_over_article": results["ensemble"]["images_per_s"] /
                          results["article"]["images_per_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
