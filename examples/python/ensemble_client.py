"""Classifies the digits test images through the digits ensemble (examples/model_repository_ensemble)
with Triton's own client, and prints the accuracy.

    asyncinfer serve --model-repository examples/model_repository_ensemble &
    .venv/tritonclient/bin/python examples/python/ensemble_client.py \
        --images models/data/test --labels models/data/test/labels.csv

Each PNG file's bytes go as a BYTES tensor IMAGE of shape [1, 1]; the answer is the top-3 LABELS
(BYTES) and their SCORES (FP32). Requests are sent over gRPC with async_infer, --concurrency at a
time. With --compare PREDICTIONS.csv (written by `asyncinfer run --top-k 3 --output ...` on the
same model file), every prediction must be the same and every probability equal within 1e-5: the
exit status is 1 otherwise. (The CSV holds 6 decimals, and float32 sums over a batch of another
size may differ in the last bits: a CI run once saw 1.3e-6. A preprocessing difference moves
probabilities by far more than 1e-5.)"""

import argparse
import csv
import os
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="127.0.0.1:8001", help="the server's gRPC address")
    p.add_argument("--model", default="digits_ensemble")
    p.add_argument("--images", required=True, help="folder of the PNG files")
    p.add_argument("--labels", required=True, help="CSV of file,label")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--compare", help="asyncinfer run's predictions CSV (--top-k 3)")
    args = p.parse_args()

    with open(args.labels) as f:
        rows = [(r["file"], int(r["label"])) for r in csv.DictReader(f)]
    client = grpcclient.InferenceServerClient(args.url)
    results = {}
    errors = {}
    slots = threading.Semaphore(args.concurrency)
    lock = threading.Lock()

    def done(name, result, error):
        with lock:
            if error is not None:
                errors[name] = str(error)
            else:
                labels = [int(l) for l in result.as_numpy("LABELS")[0]]
                results[name] = (labels, result.as_numpy("SCORES")[0].tolist())
        slots.release()

    start = time.monotonic()
    for name, _ in rows:
        with open(os.path.join(args.images, name), "rb") as f:
            data = f.read()
        image = grpcclient.InferInput("IMAGE", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[data]], dtype=np.object_))
        slots.acquire()
        # tritonclient calls callback(result=..., error=...) by keyword.
        client.async_infer(args.model, [image],
                           lambda result, error, n=name: done(n, result, error))
    for _ in range(args.concurrency):
        slots.acquire()
    took = time.monotonic() - start
    client.close()

    correct = sum(1 for name, label in rows if name in results and results[name][0][0] == label)
    print("images      %d ok, %d failed" % (len(results), len(errors)))
    print("accuracy    %.2f %% (%d of %d)" % (100.0 * correct / len(rows), correct, len(rows)))
    print("throughput  %.1f images/s (%.3f s)" % (len(rows) / took, took))
    for name, e in sorted(errors.items())[:5]:
        print("error       %s: %s" % (name, e), file=sys.stderr)
    status = 1 if errors else 0

    if args.compare:
        with open(args.compare) as f:
            theirs = {os.path.basename(r["file"]): r for r in csv.DictReader(f)}
        differ = []
        for name, _ in rows:
            t = theirs.get(name)
            mine = results.get(name)
            if t is None or mine is None:
                differ.append("%s: missing" % name)
                continue
            labels = [int(t["prediction%d" % k]) for k in (1, 2, 3)]
            probs = [float(t["probability%d" % k]) for k in (1, 2, 3)]
            if labels != mine[0] or any(abs(a - b) > 1e-5 for a, b in zip(probs, mine[1])):
                differ.append("%s: asyncinfer run %s %s, ensemble %s %s"
                              % (name, labels, probs, mine[0], mine[1]))
        print("compared    %d predictions with %s: %d differ"
              % (len(rows), args.compare, len(differ)))
        for d in differ[:5]:
            print("differs     " + d, file=sys.stderr)
        if differ:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
