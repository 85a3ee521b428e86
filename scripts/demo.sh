#!/usr/bin/env bash
# The main job (README): on a fresh Debian 12 machine, installs what is missing, builds, makes the
# digits model and its test images if absent (a CNN trained on scikit-learn's 1,797 real 8x8
# handwritten-digit scans; the 450 held-out scans as 128x128 PNG files), then classifies the test
# images with `asyncinfer run` — decode + resize + normalise, inference, softmax + top-k — first as
# a synchronous loop, then asynchronously (a three-stage pipeline around the batching engine), and
# prints the two side by side: accuracy (identical), throughput and latency.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target asyncinfer_cli

data=models/data
/usr/bin/python3 models/make_digits.py --out "$data"

out=build/demo
mkdir -p "$out"
bin=build/release/apps/asyncinfer/asyncinfer
echo
echo "== asyncinfer run: ${data}/test — 450 real handwritten digits (held-out scans), each"
echo "   classified 4 times (--repeat 4: 1,800 images, for steadier rates), on the cpu device:"
echo "   sync  = one image at a time: decode, infer (batch 1), top-k, then the next image;"
echo "   async = decode (host threads) -> engine (1 worker, dynamic batching) -> top-k, with up to"
echo "           16 images in flight (--window 16), so the stages overlap and batches form."
echo "   Throughput: higher is better. Latency of an image in async includes waiting in the"
echo "   window and in a batch, so it is higher than sync by design: async trades latency for"
echo "   throughput. Accuracy must be identical: the same model sees the same inputs."
"$bin" run --model "$data/digits.pt" --device cpu \
  --images "$data/test" --labels "$data/test/labels.csv" \
  --compare --workers 1 --window 16 --repeat 4 --top-k 3 \
  --output "$out/predictions.csv" --summary "$out/summary.json"
echo
echo "predictions: $out/predictions.sync.csv, $out/predictions.async.csv; summary: $out/summary.json"

if "$bin" info 2>/dev/null | grep -q "openvino"; then
  echo
  echo "== the same network as ONNX (models/data/digits.onnx), through OpenVINO's runtime: async,"
  echo "   the same preprocessing; every top-1 label equals the TorchScript file's"
  echo "   (tests/integration/onnx_digits.py checks it)."
  "$bin" run --model "$data/digits.onnx" --device cpu \
    --images "$data/test" --labels "$data/test/labels.csv" \
    --mode async --window 16 --repeat 4 --top-k 3 --quiet \
    --output "$out/predictions.onnx.csv"
fi
