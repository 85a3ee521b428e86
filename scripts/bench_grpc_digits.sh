#!/bin/bash
# The digits model served over gRPC against the same engine in process, with the load
# generator's CPU measured apart (docs/performance.md, "gRPC: no executor hop at the end of a
# call"). Per concurrency and round, alternating the two sides:
#
#   in process  asyncinfer bench on the engine configuration of examples/model_repository_digits
#               (2 instances, max batch 64, 200 µs queue delay): req/s, cores busy, CPU a request
#   over gRPC   asyncinfer serve on that repository, bench/bench_grpc_stream as the client (unary
#               ModelInfer on 4 connections): req/s, the server's CPU a request (/proc/<pid>/stat
#               over the measured window) and the client's (getrusage), each apart
#
# and two ratios: "per CPU" = in-process CPU a request / the server's CPU a request (the
# requests the server serves per CPU second against the engine in process; where the in-process
# run keeps both cores busy, this is the server's throughput with the cores to itself against
# the in-process throughput), and "raw" = req/s over gRPC / req/s in process (the client's CPU
# taken from the same 2 cores). The last lines give the medians per concurrency.
#
#   scripts/bench_grpc_digits.sh [build-dir]     (default build/release; ROUNDS=6 SECS=5
#                                                 CONCURRENCY="64 128")
#
# Needs models/data/digits.pt and its sidecar digits.pt.json (/usr/bin/python3
# models/make_digits.py --out models/data), the file that the example repository links to.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
ROUNDS=${ROUNDS:-6}
SECS=${SECS:-5}
CONCURRENCY=${CONCURRENCY:-64 128}
CLI=$BUILD/apps/asyncinfer/asyncinfer
BENCH=$BUILD/bench/bench_grpc_stream
MODEL=models/data/digits.pt
[ -x "$CLI" ] && [ -x "$BENCH" ] ||
  { echo "bench_grpc_digits: no $CLI or $BENCH (build with the gRPC frontend first)" >&2; exit 1; }
[ -f "$MODEL" ] && [ -f "$MODEL.json" ] ||
  { echo "bench_grpc_digits: no $MODEL or its sidecar (run /usr/bin/python3 models/make_digits.py --out models/data)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/asyncinfer-bench-grpc-digits.XXXXXX)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# in_process C: prints "req/s cores us_per_request"
in_process() {
  "$CLI" bench --model "$MODEL" --device cpu --workers 2 --max-batch 64 --max-queue-delay-us 200 \
    --concurrency "$1" --duration-s "$SECS" 2>&1 |
    awk '/^  throughput/ {r=$2} /^  cpu / {c=$2} END {printf "%.0f %.2f %.1f\n", r, c, c / r * 1e6}'
}

# over_grpc C: prints "req/s server_us_per_request client_us_per_request errors"
over_grpc() {
  "$CLI" serve --model-repository examples/model_repository_digits --host 127.0.0.1 \
    --http-port 0 --metrics-port -1 --grpc-port 0 2> "$WORK/serve.log" &
  SERVER_PID=$!
  for _ in $(seq 300); do grep -q ": ready$" "$WORK/serve.log" && break; sleep 0.1; done
  local port
  port=$(sed -n 's/.*grpc: listening on [^ ]*:\([0-9]*\).*/\1/p' "$WORK/serve.log")
  [ -n "$port" ] || { cat "$WORK/serve.log" >&2; exit 1; }
  "$BENCH" --address "127.0.0.1:$port" --model digits --mode unary -c "$1" --connections 4 \
    --duration-s "$SECS" --warmup-s 1 --server-pid "$SERVER_PID" 2>&1 |
    awk '/^throughput/ {r=$2} /^client cpu/ {c=substr($5,2)} /^server cpu/ {s=substr($5,2)}
         /^errors/ {e=$2} END {printf "%.0f %.1f %.1f %s\n", r, s, c, e}'
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

echo "bench_grpc_digits: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of $SECS s"
for c in $CONCURRENCY; do
  echo "concurrency $c"
  printf '  %-5s %-32s %-44s %-8s %s\n' round "in process: req/s cores us/req" \
    "over gRPC: req/s server-us/req client-us/req" "per CPU" raw
  : > "$WORK/ratios"
  for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      ip=$(in_process "$c"); gr=$(over_grpc "$c")
    else
      gr=$(over_grpc "$c"); ip=$(in_process "$c")
    fi
    set -- $ip $gr
    [ "$7" = 0 ] || echo "  round $r: $7 errors over gRPC" >&2
    awk -v r="$r" -v ip="$1 $2 $3" -v gr="$4 $5 $6" -v pc="$(awk -v a="$3" -v b="$5" 'BEGIN {print a / b}')" \
        -v raw="$(awk -v a="$4" -v b="$1" 'BEGIN {print a / b}')" \
        'BEGIN {printf "  %-5s %-32s %-44s %-8.2f %.2f\n", r, ip, gr, pc, raw}'
    awk -v a="$3" -v b="$5" -v x="$4" -v y="$1" 'BEGIN {print a / b, x / y}' >> "$WORK/ratios"
  done
  sort -n -k1 "$WORK/ratios" | awk '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
    printf "  median per CPU %.2f (lowest %.2f, highest %.2f)", m, a[1], a[NR]}'
  sort -n -k2 "$WORK/ratios" | awk '{a[NR]=$2} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
    printf "; median raw %.2f\n", m}'
done
