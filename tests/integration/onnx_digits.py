#!/usr/bin/python3
"""The digits network as TorchScript (libtorch) and as ONNX (OpenVINO) gives the same predictions
on the 450 test images through `asyncinfer run`: the same accuracy and every top-1 label equal
with OpenVINO's default precision (bf16 on CPUs with AMX or AVX512-BF16, f32 elsewhere), and
every top-3 label equal with INFERENCE_PRECISION_HINT=f32, probabilities within 1e-4.

usage: onnx_digits.py --cli <asyncinfer> --models <dir with digits.pt, digits.onnx, test/>
       --work <scratch dir>
"""
import argparse
import csv
import os
import re
import subprocess
import sys


def run(cli, model, models, out, *extra):
    cmd = [cli, "run", "--model", model, "--device", "cpu", "--images",
           os.path.join(models, "test"), "--labels", os.path.join(models, "test", "labels.csv"),
           "--top-k", "3", "--output", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit("%s exited %d:\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    # The summary names the workers the engine chose (0 was asked: its rule), never 0.
    w = re.search(r"on cpu, (\d+) worker\(s\)", p.stdout)
    if not w or int(w.group(1)) < 1:
        sys.exit("the summary does not name the workers the engine started:\n" + p.stdout)
    m = re.search(r"accuracy +([0-9.]+) % \((\d+) of (\d+)\)", p.stdout)
    if not m:
        sys.exit("no accuracy line in:\n" + p.stdout)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    return (int(m.group(2)), int(m.group(3))), rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch_acc, torch_rows = run(a.cli, os.path.join(a.models, "digits.pt"), a.models,
                                os.path.join(a.work, "torch.csv"))
    failures = []
    for name, extra, ranks, tolerance in (
            ("openvino default precision", (), 1, None),
            ("openvino f32", ("--backend-parameter", "INFERENCE_PRECISION_HINT=f32"), 3, 1e-4)):
        acc, rows = run(a.cli, os.path.join(a.models, "digits.onnx"), a.models,
                        os.path.join(a.work, name.replace(" ", "_") + ".csv"), *extra)
        print("%s: %d of %d correct; torch: %d of %d" % (name, acc[0], acc[1], *torch_acc))
        if acc != torch_acc or acc[1] != 450:
            failures.append("%s: accuracy %s differs from torch's %s" % (name, acc, torch_acc))
        if len(rows) != len(torch_rows):
            failures.append("%s: %d rows, torch %d" % (name, len(rows), len(torch_rows)))
            continue
        worst = 0.0
        for t, o in zip(torch_rows, rows):
            if t["file"] != o["file"]:
                failures.append("%s: row order differs at %s" % (name, t["file"]))
                break
            for k in range(1, ranks + 1):
                if t["prediction%d" % k] != o["prediction%d" % k]:
                    failures.append("%s: %s: rank %d is %s, torch says %s"
                                    % (name, t["file"], k, o["prediction%d" % k],
                                       t["prediction%d" % k]))
            worst = max(worst, abs(float(t["probability1"]) - float(o["probability1"])))
        print("%s: largest difference of the top probability: %.3g" % (name, worst))
        if tolerance is not None and worst > tolerance:
            failures.append("%s: top probability differs by %.3g > %g" % (name, worst, tolerance))
    if failures:
        sys.exit("\n".join(failures[:20]))
    print("same predictions")


if __name__ == "__main__":
    main()
