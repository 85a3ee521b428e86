#!/usr/bin/python3
"""compare_triton_sequences.py — stateful models side by side with the real Triton 2.51.

The same model.py (a running sum per sequence, kept by the model under request.correlation_id()
and reset on the START flag: Triton's Python backend API), the same config.pbtxt
(sequence_batching, direct, max_batch_size 32, two instances: 64 slots, so that each of the
64 concurrent sequences holds one) and the same perf_analyzer 2.51
command (gRPC stream, --sequence-length, concurrency = concurrent sequences) against
`asyncinfer serve` and against tritonserver 2.51 (nvidia-pytriton's binary, python backend:
../shared/peers.md), one server at a time on this machine. A third row serves the same model
without sequence_batching on asyncinfer (the cost of sequence routing).

  bench/compare_triton_sequences.py --cli build/release/apps/asyncinfer/asyncinfer

--tritonserver DIR: pytriton's tritonserver folder (bin/tritonserver, backends/ with the 3.11
python stub copied to backends/python/triton_python_backend_stub), by default the one
scripts/setup.sh --peers installs in .venv/triton. Prints one row per server: requests/s,
p50 and p99 latency (us) as perf_analyzer measured them, and the command.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

import peer_servers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        out = []
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)[0])
            cid, flags = r.correlation_id(), r.flags()
            total = (0 if flags & START else self.sums.get(cid, 0)) + x
            if flags & END:
                self.sums.pop(cid, None)
            else:
                self.sums[cid] = total
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32))]))
        return out
'''


def config(name, sequences):
    batching = ("sequence_batching { max_sequence_idle_microseconds: 5000000 direct { } }"
                if sequences else "dynamic_batching { }")
    return """name: "%s"
backend: "python"
max_batch_size: 32
%s
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: 2 } ]
""" % (name, batching)


def perf(pa, grpc_port, model, args, sequences):
    out = tempfile.mktemp(suffix=".csv")
    cmd = [pa, "-m", model, "-i", "grpc", "--streaming", "-u", "127.0.0.1:%d" % grpc_port,
           "--concurrency-range", str(args.concurrency), "--measurement-interval",
           str(args.interval_ms), "--stability-percentage", "50", "--percentile", "99"]
    if sequences:
        cmd += ["--sequence-length", str(args.sequence_length)]
    shown = " ".join([os.path.basename(cmd[0])] + cmd[1:])
    r = subprocess.run(cmd + ["-f", out], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("perf_analyzer failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    with open(out) as f:
        row = next(csv.DictReader(f))
    os.unlink(out)
    return (float(row["Inferences/Second"]), int(row["p50 latency"]), int(row["p99 latency"]),
            shown)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tritonserver", help="pytriton's tritonserver folder",
                   default=peer_servers.DEFAULT_TRITONSERVER)
    p.add_argument("--cli", required=True, help="the asyncinfer program")
    p.add_argument("--perf-analyzer", default=os.path.join(ROOT, "scripts", "perf_analyzer"))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--sequence-length", type=int, default=100)
    p.add_argument("--interval-ms", type=int, default=3000)
    args = p.parse_args()

    repo = tempfile.mkdtemp(prefix="asyncinfer-seqbench-")
    for name, seq in (("seq_acc", True), ("plain_acc", False)):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config(name, seq))
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(MODEL_PY)
    rows = []
    try:
        for server in ("asyncinfer", "triton"):
            with peer_servers.serve(server, repo, ["seq_acc"], args.cli,
                                    args.tritonserver) as (_http, grpc):
                rows.append((server, "sequences") + perf(args.perf_analyzer, grpc, "seq_acc",
                                                         args, True))
                if server == "asyncinfer":
                    rows.append((server, "no sequences") + perf(args.perf_analyzer, grpc,
                                                                "plain_acc", args, False))
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    print("| server | model | requests/s | p50 us | p99 us |")
    print("|---|---|---|---|---|")
    for server, what, rps, p50, p99, _ in rows:
        print("| %s | %s | %.0f | %d | %d |" % (server, what, rps, p50, p99))
    print()
    for server, what, _, _, _, cmd in rows:
        print("%s, %s: %s" % (server, what, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
