#!/bin/bash
# ModelStreamInfer against ModelInfer on one `asyncinfer serve` (docs/performance.md, "gRPC:
# ModelStreamInfer against ModelInfer"), with bench/bench_grpc_stream as the client. Per model
# (builtin:identity 1x16 FP32; the digits model 1x1x32x32 FP32 where digits.pt exists), ROUNDS
# rounds, each side SECS s after a 1 s warm-up, the sides alternating within each round:
#
#   unary  64   64 channels (64 connections), one ModelInfer in flight on each
#   stream 64   64 ModelStreamInfer streams, one per connection, one request in flight on each
#   unary 64/1  64 ModelInfer in flight on one channel (one connection, 64 HTTP/2 streams)
#   stream 64/1 64 streams on one connection
#   unary  1, stream 1
#
# Each line: req/s, client p50/p99 latency (µs), the client's CPU per request (getrusage) and the
# server's (/proc/<pid>/stat over the same window), and the errors (all of them, warm-up and
# drain included; the figures of a run with errors count only its successful requests).
#
#   scripts/bench_grpc_stream.sh [build-dir]        (default build/release; ROUNDS=3 SECS=4)
#
# The digits model needs <build-dir>/models/digits.pt (the tests' TorchDigitsModel fixture) or
# models/data/digits.pt (models/make_digits.py); without it, only identity is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}
CLI=$BUILD/apps/asyncinfer/asyncinfer
BENCH=$BUILD/bench/bench_grpc_stream
[ -x "$CLI" ] && [ -x "$BENCH" ] ||
  { echo "bench_grpc_stream: no $CLI or $BENCH (build with the gRPC frontend first)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/asyncinfer-bench-grpc-stream.XXXXXX)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

DIGITS=""
for f in "$BUILD/models/digits.pt" models/data/digits.pt; do
  [ -f "$f" ] && { DIGITS=$(realpath "$f"); break; }
done

REPO=$WORK/repo
mkdir -p "$REPO/identity/1"
sed 's/version_policy: { all { } }//' examples/model_repository/identity/config.pbtxt \
  > "$REPO/identity/config.pbtxt"
if [ -n "$DIGITS" ]; then
  mkdir -p "$REPO/digits/1"
  cp examples/model_repository_digits/digits/config.pbtxt "$REPO/digits/"
  cp "$DIGITS" "$REPO/digits/1/model.pt"
fi

"$CLI" serve --model-repository "$REPO" --host 127.0.0.1 --http-port 0 --metrics-port 0 \
  --grpc-port 0 2> "$WORK/serve.log" &
SERVER_PID=$!
for _ in $(seq 300); do grep -q ": ready$" "$WORK/serve.log" && break; sleep 0.1; done
GPORT=$(sed -n 's/.*grpc: listening on [^ ]*:\([0-9]*\).*/\1/p' "$WORK/serve.log")
[ -n "$GPORT" ] || { cat "$WORK/serve.log"; exit 1; }

echo "bench_grpc_stream: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of $SECS s"
# One side: prints "rps p50 p99 client_us server_us errors". A run with errors is shown (its
# errors in the last column, its first messages on stderr), not dropped; one without figures stops.
side() {
  local out
  out=$("$BENCH" --address "127.0.0.1:$GPORT" --server-pid "$SERVER_PID" \
          --duration-s "$SECS" --warmup-s 1 "$@") || true
  if ! grep -q '^errors' <<< "$out"; then
    echo "bench_grpc_stream: the run failed: $*" >&2
    echo "$out" >&2
    exit 1
  fi
  if ! grep -q '^errors *0 ' <<< "$out"; then
    echo "  errors in: $*" >&2
    grep -E '^errors|^  error:' <<< "$out" | head -3 >&2
  fi
  awk '
    /^throughput/ {rps=$2} /^latency us/ {p50=$4; p99=$8}
    /^client cpu/ {c=substr($5,2)} /^server cpu/ {s=substr($5,2)} /^errors/ {e=$2}
    END {printf "%.0f %.0f %.0f %.1f %.1f %s\n", rps, p50, p99, c, s, e}' <<< "$out"
}

run_model() {
  local model=$1 input=$2 label
  local -A res=()
  echo "$model ($input)"
  "$BENCH" --address "127.0.0.1:$GPORT" --model "$model" --input "$input" --mode stream -c 64 \
    --duration-s 3 --warmup-s 0 > /dev/null  # warm-up (TorchScript specialises per batch size)
  for r in $(seq "$ROUNDS"); do
    for label in "unary 64" "stream 64" "unary 64/1" "stream 64/1" "unary 1" "stream 1"; do
      set -- $label
      local mode=$1 n=${2%/*} conn=()
      [ "$2" != "$n" ] && conn=(--connections 1)
      res[$label]+="$(side --model "$model" --input "$input" --mode "$mode" -c "$n" "${conn[@]}")|"
    done
    echo "  round $r done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
  printf '  %-12s %-26s %-18s %-18s %-22s %-22s %s\n' side "req/s" "p50 us" "p99 us" \
    "client cpu us/req" "server cpu us/req" errors
  for label in "unary 64" "stream 64" "unary 64/1" "stream 64/1" "unary 1" "stream 1"; do
    echo "${res[$label]}" | tr '|' '\n' | awk -v label="$label" '
      NF {n++; r[n]=$1; p[n]=$2; q[n]=$3; c[n]=$4; s[n]=$5; e+=$6}
      function join(a,  i, t) {t=a[1]; for (i=2;i<=n;i++) t=t "/" a[i]; return t}
      END {printf "  %-12s %-26s %-18s %-18s %-22s %-22s %d\n", label, join(r), join(p), join(q),
           join(c), join(s), e}'
  done
}

run_model identity input0:FP32:1x16
if [ -n "$DIGITS" ]; then
  run_model digits INPUT__0:FP32:1x1x32x32
else
  echo "digits: skipped (no digits.pt; run /usr/bin/python3 models/make_digits.py)"
fi
