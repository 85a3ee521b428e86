#!/usr/bin/env bash
# The server benchmarks of docs/performance.md ("asyncinfer serve"), side by side in one run,
# alternating the two sides of each comparison ROUNDS times and printing medians and ratios:
#   1. asyncinfer serve vs nginx serving a static file of the same size as the response:
#      builtin:identity, a 1x16 FP32 JSON request, keep-alive, 64 connections (wrk -t 2 -c 64);
#   2. binary tensors vs JSON for a 1x3x224x224 FP32 input (asyncinfer bench --url, 4 connections);
#   3. the server-side p50 at one connection for the small request (the server's own histogram
#      asyncinfer_http_infer_duration_us: request read in full -> response written), with the
#      client-side percentiles of asyncinfer bench --url;
#   4. the digits model over HTTP with binary tensors vs the same engine in process
#      (asyncinfer bench), 64 in flight.
#
#   scripts/bench_server.sh [build-dir]        (default build/release; ROUNDS=3 SECS=4)
#
# Needs wrk and nginx (scripts/setup.sh installs them); the digits comparison needs the digits
# model (<build-dir>/models/digits.pt, made by the tests' TorchDigitsModel fixture, or
# models/data/digits.pt from models/make_digits.py) and is skipped without it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}
CLI=$BUILD/apps/asyncinfer/asyncinfer
PY=/usr/bin/python3
[ -x "$CLI" ] || { echo "bench_server: no $CLI (build first)" >&2; exit 1; }
command -v wrk >/dev/null && command -v nginx >/dev/null ||
  { echo "bench_server: needs wrk and nginx (scripts/setup.sh)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/asyncinfer-bench-server.XXXXXX)
SERVER_PID=""
NGINX_CONF=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  [ -n "$NGINX_CONF" ] && nginx -c "$NGINX_CONF" -p "$WORK/" -s stop 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

DIGITS=""
for f in "$BUILD/models/digits.pt" models/data/digits.pt; do
  [ -f "$f" ] && { DIGITS=$(realpath "$f"); break; }
done

# ---- the repository: identity (1x16), image (1x3x224x224), digits -------------------------------
REPO=$WORK/repo
mkdir -p "$REPO/identity/1" "$REPO/image/1"
sed 's/version_policy: { all { } }//' examples/model_repository/identity/config.pbtxt \
  > "$REPO/identity/config.pbtxt"
cat > "$REPO/image/config.pbtxt" <<'EOF'
name: "image"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 0 }
parameters { key: "uri" value { string_value: "builtin:identity?shape=3x224x224&max_batch=8" } }
EOF
if [ -n "$DIGITS" ]; then
  mkdir -p "$REPO/digits/1"
  cp examples/model_repository_digits/digits/config.pbtxt "$REPO/digits/"
  cp "$DIGITS" "$REPO/digits/1/model.pt"
fi

"$CLI" serve --model-repository "$REPO" --http-port 0 --metrics-port 0 2> "$WORK/serve.log" &
SERVER_PID=$!
for _ in $(seq 100); do grep -q ": ready$" "$WORK/serve.log" && break; sleep 0.1; done
PORT=$(sed -n 's/.*http: listening on [^ ]*:\([0-9]*\).*/\1/p' "$WORK/serve.log")
MPORT=$(sed -n 's/.*metrics: listening on [^ ]*:\([0-9]*\).*/\1/p' "$WORK/serve.log")
[ -n "$PORT" ] || { cat "$WORK/serve.log"; exit 1; }
URL=http://127.0.0.1:$PORT

# ---- nginx with a static file the size of the inference response -------------------------------
$PY -c "import json; print(json.dumps({'inputs':[{'name':'input0','shape':[1,16],'datatype':'FP32','data':[0.5+i for i in range(16)]}]}), end='')" > "$WORK/small.json"
mkdir -p "$WORK/www"
curl -s -X POST "$URL/v2/models/identity/infer" --data-binary "@$WORK/small.json" -o "$WORK/www/resp.json"
NPORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
NGINX_CONF=$WORK/nginx.conf
cat > "$NGINX_CONF" <<EOF
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx_error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$NPORT;
    root $WORK/www;
    location / { default_type application/json; }
  }
}
EOF
nginx -c "$NGINX_CONF" -p "$WORK/"
cat > "$WORK/post.lua" <<EOF
local f = io.open("$WORK/small.json", "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = "application/json"
EOF
sleep 0.3

wrk_rps() { wrk "$@" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p'; }
bench_rps() { "$CLI" bench "$@" | sed -n 's/^ *throughput *\([0-9.]*\) req\/s.*/\1/p'; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { $PY -c "print('%.2f' % ($1 / $2))"; }

echo "bench_server: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of $SECS s"
resp_size=$(stat -c %s "$WORK/www/resp.json")

# 1. vs nginx.
ng=(); sv=()
for r in $(seq "$ROUNDS"); do
  ng+=("$(wrk_rps -t 2 -c 64 -d "${SECS}s" "http://127.0.0.1:$NPORT/resp.json")")
  sv+=("$(wrk_rps -t 2 -c 64 -d "${SECS}s" -s "$WORK/post.lua" "$URL/v2/models/identity/infer")")
done
NG=$(median "${ng[@]}"); SV=$(median "${sv[@]}")
echo "1. nginx static ${resp_size} B: ${ng[*]} req/s -> median $NG"
echo "   serve identity 1x16 JSON:   ${sv[*]} req/s -> median $SV  ($(ratio "$SV" "$NG")x nginx)"

# 2. binary vs JSON, 1x3x224x224 FP32.
js=(); bi=()
for r in $(seq "$ROUNDS"); do
  js+=("$(bench_rps --url "$URL/v2/models/image/infer" --concurrency 4 --duration-s "$SECS" --warmup-s 0.5)")
  bi+=("$(bench_rps --url "$URL/v2/models/image/infer" --binary --concurrency 4 --duration-s "$SECS" --warmup-s 0.5)")
done
JS=$(median "${js[@]}"); BI=$(median "${bi[@]}")
echo "2. 1x3x224x224 FP32 JSON:   ${js[*]} req/s -> median $JS"
echo "   1x3x224x224 FP32 binary: ${bi[*]} req/s -> median $BI  ($(ratio "$BI" "$JS")x JSON)"

# 3. server-side p50 at one connection.
hist() { curl -s "http://127.0.0.1:$MPORT/metrics" | grep '^asyncinfer_http_infer_duration_us_bucket'; }
hist > "$WORK/h0"
out=$("$CLI" bench --url "$URL/v2/models/identity/infer" --concurrency 1 --duration-s "$SECS" --warmup-s 0.5)
hist > "$WORK/h1"
P50=$($PY - "$WORK/h0" "$WORK/h1" <<'EOF'
import re, sys
def read(p):
    out = []
    for line in open(p):
        m = re.search(r'le="([^"]+)"\} (\S+)', line)
        out.append((float(m.group(1)), float(m.group(2))))
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
cum = [(le, y - x) for (le, x), (_, y) in zip(a, b)]
total = cum[-1][1]
lo, prev = 0.0, 0.0
for le, c in cum:
    if c >= total / 2:  # linear within the bucket holding the median
        print("%.0f" % (lo + (le - lo) * (total / 2 - prev) / max(c - prev, 1)))
        break
    lo, prev = le, c
EOF
)
echo "3. one connection, 1x16 JSON: server-side p50 ~${P50} us (interpolated within the histogram's 20, 50, 100 us buckets); client side: $(echo "$out" | grep 'latency' | sed 's/ *latency us *//')"

# 4. digits: HTTP (binary) vs in process.
if [ -n "$DIGITS" ]; then
  ip=(); ht=()
  for r in $(seq "$ROUNDS"); do
    ip+=("$(bench_rps --model "$DIGITS" --device cpu --workers 2 --max-batch 64 --max-queue-delay-us 200 --mode async --concurrency 64 --duration-s "$SECS" --warmup-s 0.5 --quiet)")
    ht+=("$(bench_rps --url "$URL/v2/models/digits/infer" --binary --concurrency 64 --duration-s "$SECS" --warmup-s 0.5)")
  done
  IP=$(median "${ip[@]}"); HT=$(median "${ht[@]}")
  echo "4. digits in process:      ${ip[*]} req/s -> median $IP"
  echo "   digits over HTTP binary: ${ht[*]} req/s -> median $HT  ($(ratio "$HT" "$IP")x in process)"
else
  echo "4. digits: skipped (no digits.pt; run /usr/bin/python3 models/make_digits.py)"
fi
