#!/usr/bin/python3
"""compare_triton.py — the Python-model path side by side with the real Triton 2.51.

One model repository of model.py files and config.pbtxt, written here (below), served unchanged
by `asyncinfer serve` and by tritonserver 2.51 (nvidia-pytriton's binary, python backend:
../shared/peers.md), one server at a time, alternating which goes first in each round, and one
perf_analyzer 2.51 command for both. The models:

  identity     FP32 [16] in, the same out; max_batch_size 8, one instance, no dynamic batching:
               every request is one execute() in the Python process;
  identity_x2  the same with two instances;
  mlp          a numpy MLP (FP32 [64] -> 256 ReLU -> 10), dynamic batching up to 64;
  ensemble     two model.py steps (scale: x * 2, then shift: x + 1) as an ensemble;
  decoupled    a decoupled model.py that sends RESPONSES (10) responses for each request
               (gRPC stream only);
  digits       the digits network (models/make_digits.py's TorchScript file, --digits) run by
               a model.py with torch (Debian's python3-torch, one intra-op thread a process),
               as examples/model_repository_digits serves it: two instances, dynamic batching up
               to 64 with a 200 us queue delay.

Each row: perf_analyzer's requests/s, p50 and p99 (client side, us), the CPU time of the
server's whole process tree (the server and the Python processes it started) per 1,000
requests, from /proc before and after the measurement, and the tree's PSS after it (MiB).
Medians over the rounds, with the range.

--ceiling adds, in each round, the identity row served by asyncinfer's built-in identity backend
(`backend: "identity"`, the same config and perf_analyzer command, no Python process; Triton's
build here has no identity backend): the rate any server could reach on this machine with
perf_analyzer beside it, against which the Python rows' ratios are read (over HTTP at up to 8
in flight: at 64, perf_analyzer's own HTTP client spins against a server that answers at once).

Both servers run their model.py on the same numpy, Debian's (python3-numpy): tritonserver's stub
embeds Debian's libpython3.11 and runs it isolated (it ignores PYTHONPATH), so it always loads
/usr/lib/python3/dist-packages/numpy, and asyncinfer's python models run on /usr/bin/python3,
which loads the same. Each model records `numpy.__file__` in its initialize(); the script prints
what each server loaded and warns when they differ.

  bench/compare_triton.py --cli build/release/apps/asyncinfer/asyncinfer
  bench/compare_triton.py --cli ... --models identity --protocols grpc --concurrency 1,8,64
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

import peer_servers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESPONSES = 10

# Every model.py begins so: its initialize() records which numpy it loaded (main() prints it).
HEADER = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils
%s

class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(args["model_repository"], "numpy_" + args["model_instance_name"]),
                  "w") as f:
            f.write(np.__file__)
'''


def model_py(rest, imports=""):
    """A model.py: HEADER, then `rest` (more of initialize, and execute)."""
    return HEADER % imports + rest


IDENTITY_PY = model_py('''
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x.as_numpy())]))
        return responses
''')

# A batch's requests run as one: their rows joined, the result split back by request.
BATCHED_EXECUTE = '''
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "%s").as_numpy() for r in requests]
        x = np.concatenate(xs) if len(xs) > 1 else xs[0]
        y = self.forward(x)
        responses = []
        start = 0
        for part in xs:
            n = part.shape[0]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("%s", y[start:start + n])]))
            start += n
        return responses
'''

MLP_PY = model_py('''        rng = np.random.default_rng(7)
        self.w1 = rng.standard_normal((64, 256), dtype=np.float32) * 0.1
        self.b1 = np.zeros(256, np.float32)
        self.w2 = rng.standard_normal((256, 10), dtype=np.float32) * 0.1

    def forward(self, x):
        return np.maximum(x @ self.w1 + self.b1, 0) @ self.w2
''' + BATCHED_EXECUTE % ("INPUT0", "OUTPUT0"))

STEP_PY = model_py('''
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x %s)]))
        return responses
''')

DECOUPLED_PY = model_py('''
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for _ in range(%d):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
''' % RESPONSES)

DIGITS_PY = model_py('''        torch.set_num_threads(1)
        self.net = torch.jit.load(os.path.join(args["model_repository"], "digits.pt"))
        self.net.eval()

    def forward(self, x):
        with torch.inference_mode():
            return self.net(torch.from_numpy(x)).numpy()
''' + BATCHED_EXECUTE % ("input", "logits"), imports="import torch")

DIGITS_CONFIG = '''name: "digits"
backend: "python"
max_batch_size: 64
input [ { name: "input" data_type: TYPE_FP32 dims: [ 1, 32, 32 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 200 }
'''


def io_config(size):
    return ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ %d ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ %d ] } ]\n' % (size, size))


def python_config(name, max_batch, instances, extra=""):
    return ('name: "%s"\nbackend: "python"\nmax_batch_size: %d\n' % (name, max_batch)
            + io_config(16) + 'instance_group [ { count: %d kind: KIND_CPU } ]\n' % instances
            + extra)


def mlp_config():
    return ('name: "mlp"\nbackend: "python"\nmax_batch_size: 64\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
            'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
            'dynamic_batching { }\n')


ENSEMBLE_CONFIG = '''name: "ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "scale" model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      output_map { key: "OUTPUT0" value: "scaled" } },
    { model_name: "shift" model_version: -1
      input_map { key: "INPUT0" value: "scaled" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" } }
  ]
}
'''

# model -> the models its repository folder needs, and whether it is decoupled (gRPC stream).
ROWS = {"identity": (["identity"], False), "identity_x2": (["identity_x2"], False),
        "mlp": (["mlp"], False), "ensemble": (["ensemble", "scale", "shift"], False),
        "decoupled": (["decoupled"], True), "digits": (["digits"], False)}


def write_repository(repo, digits=None):
    def model(name, source, config):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(source)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config)

    model("identity", IDENTITY_PY, python_config("identity", 8, 1))
    model("identity_x2", IDENTITY_PY, python_config("identity_x2", 8, 2))
    model("mlp", MLP_PY, mlp_config())
    model("scale", STEP_PY % "* 2", python_config("scale", 8, 1))
    model("shift", STEP_PY % "+ 1", python_config("shift", 8, 1))
    model("decoupled", DECOUPLED_PY, python_config(
        "decoupled", 8, 1, "model_transaction_policy { decoupled: true }\n"))
    if digits:
        model("digits", DIGITS_PY, DIGITS_CONFIG)
        shutil.copy(digits, os.path.join(repo, "digits", "digits.pt"))
    os.makedirs(os.path.join(repo, "ensemble", "1"))
    with open(os.path.join(repo, "ensemble", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE_CONFIG)


def tree(pid):
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def cpu_seconds(pid):
    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def pss_mib(pid):
    total = 0.0
    for p in tree(pid):
        try:
            total += p.memory_full_info().pss / 2**20
        except psutil.NoSuchProcess:
            pass
    return total


def perf(args, proc, port, model, protocol, concurrency, streaming):
    out = tempfile.mktemp(suffix=".csv")
    cmd = [args.perf_analyzer, "-m", model, "-i", protocol, "-u", "127.0.0.1:%d" % port,
           "--concurrency-range", str(concurrency), "--measurement-interval",
           str(args.interval_ms), "--stability-percentage", "50", "--percentile", "99"]
    if streaming:
        cmd.append("--streaming")
    cpu0 = cpu_seconds(proc.pid)
    t0 = time.monotonic()
    r = subprocess.run(cmd + ["-f", out], capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - t0
    cpu1 = cpu_seconds(proc.pid)
    if r.returncode != 0:
        raise RuntimeError("perf_analyzer failed (%s):\n%s%s"
                           % (" ".join(cmd), r.stdout[-3000:], r.stderr[-3000:]))
    with open(out) as f:
        row = next(csv.DictReader(f))
    os.unlink(out)
    rps = float(row["Inferences/Second"])
    # The CPU time covers the whole perf_analyzer run (its warm-up and every window), so it is
    # divided by the requests of the whole run: the measured rate times the run's length.
    cpu_per_1k = (cpu1 - cpu0) / max(1.0, rps * elapsed) * 1000.0
    return {"rps": rps, "p50": int(row["p50 latency"]), "p99": int(row["p99 latency"]),
            "cpu": cpu_per_1k}


CEILING = "asyncinfer identity backend (no Python)"


def ceiling_round(args, rnd, protocols, concurrencies, results):
    """The identity row on asyncinfer's own identity backend: no Python process on the way."""
    work = tempfile.mkdtemp(prefix="asyncinfer-tritonbench-ceiling-")
    try:
        os.makedirs(os.path.join(work, "identity", "1"))
        with open(os.path.join(work, "identity", "config.pbtxt"), "w") as f:
            f.write(python_config("identity", 8, 1).replace('backend: "python"',
                                                            'backend: "identity"'))
        with peer_servers.serve("asyncinfer", work, ["identity"], args.cli,
                                with_process=True) as (http, grpc, proc):
            for protocol in protocols:
                for c in concurrencies:
                    if protocol == "http" and c > 8:
                        # perf_analyzer's HTTP client at 64 connections to a server that answers
                        # at once spins: one such run took 285 s of its CPU and minutes to settle.
                        continue
                    try:
                        row = perf(args, proc, grpc if protocol == "grpc" else http, "identity",
                                   protocol, c, False)
                    except RuntimeError as e:  # perf_analyzer found no stable window: said, left
                        print("round %d %s identity %s c=%d: %s"
                              % (rnd + 1, CEILING, protocol, c, str(e).splitlines()[-1]))
                        continue
                    results.setdefault((CEILING, "identity", protocol, c), []).append(row)
                    print("round %d %s identity %s c=%d: %.0f req/s p50 %d p99 %d us"
                          % (rnd + 1, CEILING, protocol, c, row["rps"], row["p50"], row["p99"]),
                          flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def med(values):
    return statistics.median(values) if values else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tritonserver", help="pytriton's tritonserver folder",
                   default=peer_servers.DEFAULT_TRITONSERVER)
    p.add_argument("--cli", required=True, help="the asyncinfer program")
    p.add_argument("--perf-analyzer", default=os.path.join(ROOT, "scripts", "perf_analyzer"))
    p.add_argument("--models", default=",".join(ROWS))
    p.add_argument("--protocols", default="grpc,http")
    p.add_argument("--concurrency", default="1,8,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval-ms", type=int, default=3000)
    p.add_argument("--servers", default="asyncinfer,triton",
                   help="the servers to compare, the first against the last: asyncinfer, "
                   "triton, or asyncinfer=PATH (another build's asyncinfer program)")
    p.add_argument("--ceiling", action="store_true",
                   help="also the identity row on asyncinfer's identity backend (no Python)")
    p.add_argument("--digits", default=os.path.join(ROOT, "build", "release", "models",
                                                     "digits.pt"),
                   help="the digits TorchScript file (models/make_digits.py) for the digits row")
    args = p.parse_args()
    models = args.models.split(",")
    if "digits" in models and not os.path.isfile(args.digits):
        print("no %s: the digits row is left out" % args.digits)
        models.remove("digits")
    for m in models:
        if m not in ROWS:
            p.error("unknown model %r (expected one of %s)" % (m, ", ".join(ROWS)))
    servers = args.servers.split(",")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    protocols = args.protocols.split(",")

    work = tempfile.mkdtemp(prefix="asyncinfer-tritonbench-")
    repo = os.path.join(work, "models")
    write_repository(repo, args.digits if "digits" in models else None)
    needed = sorted({n for m in models for n in ROWS[m][0]})
    results = {}  # (server, model, protocol, concurrency) -> [row]
    numpy_of = {}
    pss = {}
    try:
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for server in order:
                # "asyncinfer=PATH": another asyncinfer build (an A/B of two builds).
                kind, _, cli = server.partition("=")
                with peer_servers.serve(kind, repo, needed, cli or args.cli, args.tritonserver,
                                        with_process=True) as (http, grpc, proc):
                    for m in models:
                        decoupled = ROWS[m][1]
                        for protocol in (["grpc"] if decoupled else protocols):
                            port = grpc if protocol == "grpc" else http
                            for c in concurrencies:
                                row = perf(args, proc, port, m, protocol, c, decoupled)
                                results.setdefault((server, m, protocol, c), []).append(row)
                                print("round %d %s %s %s c=%d: %.0f req/s p50 %d p99 %d us, "
                                      "%.2f CPU s / 1k" % (rnd + 1, server, m, protocol, c,
                                                          row["rps"], row["p50"], row["p99"],
                                                          row["cpu"]), flush=True)
                    pss.setdefault(server, []).append(pss_mib(proc.pid))
                if args.ceiling and kind == "asyncinfer" and not cli:
                    ceiling_round(args, rnd, protocols, concurrencies, results)
                for name in os.listdir(os.path.join(repo)):
                    folder = os.path.join(repo, name)
                    for f in os.listdir(folder):
                        if f.startswith("numpy_"):
                            with open(os.path.join(folder, f)) as fh:
                                numpy_of.setdefault(server, set()).add(fh.read())
                            os.unlink(os.path.join(folder, f))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    for server in servers:
        print("%s loaded numpy from: %s" % (server, ", ".join(sorted(numpy_of.get(server, [])))))
        print("%s tree PSS after each round: %s MiB" % (
            server, ", ".join("%.1f" % v for v in pss.get(server, []))))
    if len({frozenset(v) for v in numpy_of.values()}) > 1:
        print("WARNING: the servers loaded different numpy builds")
    print()
    base, peer = servers[0], servers[-1]
    print("| model | protocol | in flight | %s req/s | %s req/s | ratio | p50 us (%s / %s) | "
          "p99 us | CPU s per 1k requests |" % (base, peer, base, peer))
    print("|---|---|---|---|---|---|---|---|---|")
    for m in models:
        for protocol in (["grpc"] if ROWS[m][1] else protocols):
            for c in concurrencies:
                a = results.get((base, m, protocol, c), [])
                b = results.get((peer, m, protocol, c), [])
                if not a or not b:
                    continue
                ra, rb = med([r["rps"] for r in a]), med([r["rps"] for r in b])
                print("| %s | %s | %d | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.2f | %d / %d | "
                      "%d / %d | %.2f / %.2f |" % (
                          m + (" (x%d responses)" % RESPONSES if ROWS[m][1] else ""), protocol,
                          c, ra, min(r["rps"] for r in a), max(r["rps"] for r in a), rb,
                          min(r["rps"] for r in b), max(r["rps"] for r in b), ra / rb,
                          med([r["p50"] for r in a]), med([r["p50"] for r in b]),
                          med([r["p99"] for r in a]), med([r["p99"] for r in b]),
                          med([r["cpu"] for r in a]), med([r["cpu"] for r in b])))
    ceiling = [(k, v) for k, v in results.items() if k[0] == CEILING]
    if ceiling:
        print()
        print("| identity: %s against Triton's model.py | protocol | in flight | req/s | "
              "ratio to Triton | p50 us | p99 us | CPU s per 1k requests |" % CEILING)
        print("|---|---|---|---|---|---|---|---|")
        for (_s, _m, protocol, c), rows in sorted(ceiling):
            t = results.get((peer, "identity", protocol, c), [])
            rate = med([r["rps"] for r in rows])
            print("| | %s | %d | %.0f | %s | %d | %d | %.2f |" % (
                protocol, c, rate, "%.2f" % (rate / med([r["rps"] for r in t])) if t else "-",
                med([r["p50"] for r in rows]), med([r["p99"] for r in rows]),
                med([r["cpu"] for r in rows])))
    print()
    print("perf_analyzer, for each row (M: the model, C: in flight, P: the server's port; "
          "--streaming for the decoupled row):")
    print("  perf_analyzer -m M -i grpc|http -u 127.0.0.1:P --concurrency-range C "
          "--measurement-interval %d --stability-percentage 50 --percentile 99" % args.interval_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
