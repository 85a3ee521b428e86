#!/usr/bin/python3
"""The openvino backend against OpenVINO's own async API on the same model file, side by side in
one run (issue 26); docs/performance.md, "OpenVINO", holds the figures and the command.

  /usr/bin/python3 bench/bench_openvino.py [--build build/release] [--seconds 8] [--rounds 2]

What it measures, each pair alternated --rounds times (medians printed):
  1. ResNet-50 (torchvision, random weights, ONNX; models/make_resnet50.py), closed loop:
     OpenVINO's benchmark_app (-api async -hint throughput: its own number of streams and infer
     requests, nireq) against `asyncinfer bench` on the same file with the same streams
     (the backend's THROUGHPUT default; workers = OpenVINO's optimal number of requests), at nireq
     and 2 x nireq requests in flight, dynamic batching off (--max-batch-size 1) as
     benchmark_app has none; and at 4 x nireq with the engine's dynamic batching.
  2. ResNet-50 latency at half of benchmark_app's throughput, Poisson arrivals: OpenVINO's Python
     AsyncInferQueue and asyncinfer's Python AsyncInferQueue on one seeded schedule
     (bench/openvino_queue.py), and `asyncinfer bench --mode rate` on its own.
  3. The same from Python: OpenVINO's AsyncInferQueue against asyncinfer's AsyncInferQueue (the
     Python module), closed loop at nireq and 2 x nireq jobs.
  4. The digits network three ways: TorchScript through libtorch, ONNX through the openvino
     backend (both `asyncinfer bench`, 64 in flight, dynamic batching), and the bare OpenVINO call
     (benchmark_app); then p50 at half of each one's throughput.
  5. Served: `asyncinfer serve` with ResNet-50 (backend "openvino") over gRPC at 2 x nireq in
     flight, driven by Triton's client (tritonclient.grpc, raw binary contents) and by h2load (one
     prebuilt ModelInfer message; requests counted by the server's own metrics), against the same
     engine in process (`asyncinfer bench`, same workers, same in flight, no batching).
Needs .venv/openvino and .venv/tritonclient (scripts/setup.sh), a release build with the openvino
backend, and <build>/models/digits.{pt,onnx} (the tests' TorchDigitsModel fixture).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OV_BIN = os.path.join(ROOT, ".venv", "openvino", "bin")
TC_PY = os.path.join(ROOT, ".venv", "tritonclient", "bin", "python")


def sh(cmd, env=None, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:],
                                              p.stderr[-3000:]))
    return p.stdout


def benchmark_app(model, seconds, shape, nireq=None):
    cmd = [os.path.join(OV_BIN, "benchmark_app"), "-m", model, "-api", "async", "-hint",
           "throughput", "-t", str(int(seconds)), "-data_shape", shape]
    if nireq:
        cmd += ["-nireq", str(nireq)]
    out = sh(cmd)
    fps = float(re.search(r"Throughput:\s+([0-9.]+) FPS", out).group(1))
    m = re.search(r"Median:\s+([0-9.]+) (ms|us)", out)
    med = float(m.group(1)) / (1e3 if m.group(2) == "us" else 1.0)
    n = re.search(r"nireq:?\s*(\d+)|Number of infer requests.*?(\d+)", out)
    return {"throughput": fps, "p50_ms": med,
            "nireq": int(next(g for g in n.groups() if g)) if n else None}


def asyncinfer_bench(cli, model, seconds, extra):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        sh([cli, "bench", "--model", model, "--duration-s", str(seconds), "--json", path,
            "--quiet"] + extra)
        with open(path) as f:
            r = json.load(f)
    finally:
        os.unlink(path)
    lat = r["latency_us"]
    return {"throughput": r["throughput_rps"], "p50_ms": lat["p50"] / 1e3,
            "p99_ms": lat["p99"] / 1e3, "batch": r.get("batch_size_mean"),
            "failed": r.get("failed")}


def queue_driver(python, args, env=None):
    out = sh([python, os.path.join(HERE, "openvino_queue.py")] + args, env=env)
    return json.loads(out.strip().splitlines()[-1])


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def row(name, runs, keys=("throughput", "p50_ms", "p99_ms")):
    cells = []
    for k in keys:
        vals = [r.get(k) for r in runs if r.get(k) is not None]
        cells.append("%.1f" % statistics.median(vals) if vals else "-")
    print("| %s | %s |" % (name, " | ".join(cells)))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated part numbers to skip")
    a = ap.parse_args()
    skip = set(a.skip.split(",")) if a.skip else set()
    cli = os.path.join(a.build, "apps", "asyncinfer", "asyncinfer")
    resnet = os.path.join(ROOT, "build", "models", "resnet50.onnx")
    sh(["/usr/bin/python3", os.path.join(ROOT, "models", "make_resnet50.py"), "--out", resnet])
    shape = "input[1,3,224,224]"
    secs = a.seconds
    py_env = dict(os.environ, PYTHONPATH=os.path.join(a.build, "python"))

    print("machine: %d cores; %s" % (os.cpu_count(), sh(["uname", "-r"]).strip()))
    print("openvino: %s" % sh([os.path.join(OV_BIN, "python"), "-c",
                               "import openvino; print(openvino.__version__)"]).strip())

    # 1. Throughput against benchmark_app.
    ref = benchmark_app(resnet, secs, shape)
    nireq = ref["nireq"] or 2
    print("\n## 1. ResNet-50, closed loop (benchmark_app's nireq = %d)\n" % nireq)
    print("| | req/s | p50 ms | p99 ms |\n|---|---|---|---|")
    runs = {"ba": [ref], "ai1": [], "ai2": [], "aib": []}
    for r in range(a.rounds):
        if r > 0:
            runs["ba"].append(benchmark_app(resnet, secs, shape))
        runs["ai1"].append(asyncinfer_bench(cli, resnet, secs, ["--mode", "async", "--concurrency",
                                                                 str(nireq), "--max-batch-size", "1"]))
        runs["ai2"].append(asyncinfer_bench(cli, resnet, secs, ["--mode", "async", "--concurrency",
                                                                 str(2 * nireq), "--max-batch-size",
                                                                 "1"]))
        runs["aib"].append(asyncinfer_bench(cli, resnet, secs, ["--mode", "async", "--concurrency",
                                                                 str(4 * nireq)]))
    row("benchmark_app -api async -hint throughput (nireq %d)" % nireq, runs["ba"],
        ("throughput", "p50_ms"))
    row("asyncinfer bench, %d in flight" % nireq, runs["ai1"])
    row("asyncinfer bench, %d in flight" % (2 * nireq), runs["ai2"])
    row("asyncinfer bench, %d in flight, dynamic batching" % (4 * nireq), runs["aib"])
    ba = med(runs["ba"], "throughput")
    print("\nratios to benchmark_app: %.2f (%d in flight), %.2f (%d in flight), %.2f (%d in "
          "flight, batching; mean batch %.2f)"
          % (med(runs["ai1"], "throughput") / ba, nireq, med(runs["ai2"], "throughput") / ba,
             2 * nireq, med(runs["aib"], "throughput") / ba, 4 * nireq, med(runs["aib"], "batch")))

    if "2" not in skip:
        rate = round(ba / 2, 1)
        print("\n## 2. ResNet-50 at %.1f req/s (half of benchmark_app's), Poisson\n" % rate)
        print("| | req/s | p50 ms | p99 ms |\n|---|---|---|---|")
        ov, aq, ai = [], [], []
        for _ in range(a.rounds):
            ov.append(queue_driver(os.path.join(OV_BIN, "python"),
                                   ["--client", "openvino", "--model", resnet, "--rate", str(rate),
                                    "--queue-jobs", "8", "--seconds", str(secs)]))
            aq.append(queue_driver("/usr/bin/python3",
                                   ["--client", "asyncinfer", "--model", resnet, "--rate", str(rate),
                                    "--queue-jobs", "8", "--seconds", str(secs)], env=py_env))
            ai.append(asyncinfer_bench(cli, resnet, secs, ["--mode", "rate", "--request-rate",
                                                            str(rate), "--max-batch-size", "1"]))
        row("OpenVINO AsyncInferQueue (Python, 8 jobs)", ov)
        row("asyncinfer AsyncInferQueue (Python, 8 jobs, the same schedule)", aq)
        row("asyncinfer bench --mode rate (C++, its own Poisson schedule)", ai)

    if "3" not in skip:
        print("\n## 3. From Python: AsyncInferQueue against AsyncInferQueue, closed loop\n")
        print("| | req/s | p50 ms | p99 ms |\n|---|---|---|---|")
        res = {}
        for _ in range(a.rounds):
            for jobs in (nireq, 2 * nireq):
                res.setdefault(("ov", jobs), []).append(queue_driver(
                    os.path.join(OV_BIN, "python"),
                    ["--client", "openvino", "--model", resnet, "--jobs", str(jobs), "--seconds",
                     str(secs)]))
                res.setdefault(("ai", jobs), []).append(queue_driver(
                    "/usr/bin/python3",
                    ["--client", "asyncinfer", "--model", resnet, "--jobs", str(jobs), "--seconds",
                     str(secs)], env=py_env))
        for jobs in (nireq, 2 * nireq):
            row("openvino.AsyncInferQueue, %d jobs" % jobs, res[("ov", jobs)])
            row("asyncinfer.AsyncInferQueue, %d jobs" % jobs, res[("ai", jobs)])

    if "4" not in skip:
        models = os.path.join(a.build, "models")
        print("\n## 4. The digits network three ways\n")
        print("| | req/s | p50 ms at half load |\n|---|---|---|")
        pt, onnx = os.path.join(models, "digits.pt"), os.path.join(models, "digits.onnx")
        load = ["--mode", "async", "--concurrency", "64"]
        t_pt = asyncinfer_bench(cli, pt, secs, load)
        t_ov = asyncinfer_bench(cli, onnx, secs, load)
        t_bare = benchmark_app(onnx, secs, "input[1,1,32,32]")
        h_pt = asyncinfer_bench(cli, pt, secs, ["--mode", "rate", "--request-rate",
                                                str(round(t_pt["throughput"] / 2))])
        h_ov = asyncinfer_bench(cli, onnx, secs, ["--mode", "rate", "--request-rate",
                                                  str(round(t_ov["throughput"] / 2))])
        h_bare = queue_driver(os.path.join(OV_BIN, "python"),
                              ["--client", "openvino", "--model", onnx, "--shape", "1,1,32,32",
                               "--rate", str(round(t_bare["throughput"] / 2)), "--queue-jobs", "64",
                               "--seconds", str(secs)])
        print("| TorchScript (libtorch), asyncinfer bench | %.0f | %.3f |"
              % (t_pt["throughput"], h_pt["p50_ms"]))
        print("| ONNX (openvino backend), asyncinfer bench | %.0f | %.3f |"
              % (t_ov["throughput"], h_ov["p50_ms"]))
        print("| ONNX, bare OpenVINO (benchmark_app; AsyncInferQueue for the p50) | %.0f | %.3f |"
              % (t_bare["throughput"], h_bare["p50_ms"]))

    if "5" not in skip:
        print("\n## 5. Served over gRPC against in process, ResNet-50, %d in flight\n" % (2 * nireq))
        repo = tempfile.mkdtemp(prefix="asyncinfer-ov-bench-")
        try:
            os.makedirs(os.path.join(repo, "resnet50", "1"))
            os.symlink(resnet, os.path.join(repo, "resnet50", "1", "model.onnx"))
            with open(os.path.join(repo, "resnet50", "config.pbtxt"), "w") as f:
                f.write('name: "resnet50"\nbackend: "openvino"\nmax_batch_size: 1\n'
                        'default_model_filename: "model.onnx"\n')
            server = subprocess.Popen([cli, "serve", "--model-repository", repo, "--http-port", "0",
                                       "--grpc-port", "0", "--metrics-port", "0", "--host", "127.0.0.1"],
                                      stderr=subprocess.PIPE, text=True)
            port = metrics = None
            t_end = time.time() + 60
            lines = []
            while time.time() < t_end and port is None:
                line = server.stderr.readline()
                lines.append(line)
                m = re.search(r"metrics: listening on [^ ]+:(\d+)", line)
                if m:
                    metrics = int(m.group(1))
                m = re.search(r"grpc: listening on [^ ]+:(\d+)", line)
                if m:
                    port = int(m.group(1))
            if port is None:
                server.kill()
                sys.exit("server did not start:\n" + "".join(lines))
            threading.Thread(target=server.stderr.read, daemon=True).start()  # drain its log
            # h2load, a C load generator, with one prebuilt ModelInfer message (zeros, raw
            # contents): far less client CPU beside the server than Python's tritonclient.
            sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
            sys.path.insert(0, os.path.join(a.build, "tests", "server", "grpc_stubs"))
            import cluster  # noqa: E402  (the server tests' helpers)
            import grpc_client  # noqa: E402
            body = os.path.join(repo, "infer.grpc")
            with open(body, "wb") as f:
                f.write(cluster.grpc_body(grpc_client.infer_request(
                    "resnet50", [("input", "FP32", [1, 3, 224, 224], b"\0" * (3 * 224 * 224 * 4))])))

            def served_ok():
                text = subprocess.run(["curl", "-s", "http://127.0.0.1:%d/metrics" % metrics],
                                      capture_output=True, text=True).stdout
                m = re.search(r'^asyncinfer_grpc_requests_total\{grpc_code="OK"\} (\S+)', text,
                              re.M)
                return float(m.group(1)) if m else 0.0

            served, h2, inproc = [], [], []
            for _ in range(a.rounds):
                served.append(queue_driver(TC_PY, ["--client", "grpc", "--url",
                                                   "127.0.0.1:%d" % port, "--jobs",
                                                   str(2 * nireq), "--seconds", str(secs)]))
                before = served_ok()
                r = cluster.h2load("http://127.0.0.1:%d/inference.GRPCInferenceService/ModelInfer"
                                   % port, body, clients=1, streams=2 * nireq, duration=secs,
                                   headers=["content-type: application/grpc", "te: trailers"])
                h2.append({"throughput": (served_ok() - before) / r["elapsed"]})
                inproc.append(asyncinfer_bench(cli, resnet, secs, [
                    "--mode", "async", "--concurrency", str(2 * nireq), "--max-batch-size", "1"]))
            server.terminate()
            server.wait(30)
            print("| | req/s | p50 ms | p99 ms |\n|---|---|---|---|")
            row("asyncinfer serve, gRPC, Triton's Python client (tritonclient.grpc)", served)
            row("asyncinfer serve, gRPC, h2load (1 connection, %d streams)" % (2 * nireq), h2)
            row("in process (asyncinfer bench)", inproc)
            print("\nserved / in process: %.2f (tritonclient), %.2f (h2load)"
                  % (med(served, "throughput") / med(inproc, "throughput"),
                     med(h2, "throughput") / med(inproc, "throughput")))
        finally:
            shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
