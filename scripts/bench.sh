#!/usr/bin/env bash
# Regenerates every measured table in docs/performance.md: each block between
# "<!-- bench:NAME -->" and "<!-- /bench:NAME -->" is replaced by the output of the commands
# below, stamped with the date, the machine and the exact commands. The prose around the blocks is
# kept. Takes about ten minutes on 2 cores; run it on a quiet machine.
#
#   scripts/bench.sh             all sections
#   scripts/bench.sh micro pipe  only these sections (names below)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" >/dev/null
/usr/bin/python3 models/make_digits.py --out models/data >/dev/null

B=build/release
cli=$B/apps/asyncinfer/asyncinfer
model=models/data/digits.pt
out=$B/bench-out
mkdir -p "$out"
doc=docs/performance.md
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(machine micro engine batching pipeline digits contention baseline server grpc grpc_stream grpc_digits peers python)

# run NAME CMD...: appends "$ CMD" and its output, as a code block, to section NAME.
run() {
  local name=$1
  shift
  {
    echo '```'
    echo "\$ $*"
    "$@" 2>&1 | sed -e 's/\r/\n/g' | grep -v '^\[' || true
    echo '```'
  } >>"$out/$name.md"
}
begin() { : >"$out/$1.md"; }

for s in "${sections[@]}"; do
  case "$s" in
  machine)
    begin machine
    {
      echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores," \
        "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB," \
        "$(uname -sr); g++ $(g++ -dumpversion), release build (-O3)."
    } >>"$out/machine.md"
    ;;
  micro)
    begin micro
    run micro $B/bench/bench_core --benchmark_min_time=0.2 --benchmark_format=console
    run micro $B/bench/bench_device --benchmark_min_time=0.2 --benchmark_format=console
    ;;
  engine)
    begin engine
    run engine $B/bench/bench_engine
    run engine $B/bench/bench_wakeup 5 2000
    for w in 1 2; do
      run engine $cli bench --model builtin:identity --device cpu --mode sweep \
        --concurrency 1,64,1024 --workers $w --completion-threads $w --duration-s 2 --quiet
    done
    ;;
  batching)
    begin batching
    m='builtin:fixed_cost?base_us=2000&per_item_us=50&shape=16'
    # Unbatched capacity: one request per 2.05 ms = 488 requests/s; 50 %, 80 %, 100 % of it.
    for mb in 1 32; do
      run batching $cli bench --model "$m" --device sim --max-batch-size $mb --mode sweep \
        --request-rate 244,390,488 --arrivals poisson --duration-s 4 --quiet
      run batching $cli bench --model "$m" --device sim --max-batch-size $mb --mode async \
        --concurrency 256 --duration-s 4 --quiet
    done
    ;;
  pipeline)
    begin pipeline
    run pipeline $cli bench --stages host:2ms,sim:5ms,host:2ms --device sim \
      --compare sync,pipeline --duration-s 5 --quiet
    run pipeline $B/examples/06_pipeline 300
    ;;
  digits)
    begin digits
    run digits $B/bench/bench_torch $model --benchmark_min_time=0.3
    # One worker with both cores as intra-op threads (the engine's default until issue 13; the
    # default now is a single-thread worker per core, measured in the contention section).
    run digits $cli bench --model $model --device cpu --compare sync,async --concurrency 32 \
      --max-batch-size 1 --workers 1 --intra-op-threads "$(nproc)" --duration-s 3 --quiet
    run digits $cli bench --model $model --device cpu --compare sync,async --concurrency 128 \
      --workers 1 --intra-op-threads "$(nproc)" --duration-s 3 --quiet
    run digits $cli bench --model $model --device cpu --mode async --workers 2 --concurrency 128 \
      --duration-s 3 --quiet
    # Half load: half of the best async throughput measured above, open loop.
    run digits $cli bench --model $model --device cpu --mode rate --workers 2 \
      --request-rate 8000 --duration-s 3 --quiet
    # The floor for that run: the same Poisson load fed to bare libtorch (two threads, no engine).
    run digits $B/bench/bench_torch_floor $model 8000 3
    run digits $cli run --model $model --images models/data/test \
      --labels models/data/test/labels.csv --compare --window 16 --repeat 4 --quiet
    ;;
  contention)
    begin contention
    # Quiet against beside one busy-looping process (`--contention 1`: a bounded busy loop in a
    # child process, alternated with quiet runs, medians compared), with the defaults and with
    # the old defaults (one worker, every core an intra-op thread), twice each, alternating.
    for pass in 1 2; do
      run contention $cli bench --model $model --device cpu --concurrency 32 --duration-s 3 \
        --contention 1 --contention-rounds 3 --quiet
      run contention $cli bench --model $model --device cpu --concurrency 32 --duration-s 3 \
        --workers 1 --intra-op-threads "$(nproc)" --contention 1 --contention-rounds 3 --quiet
    done
    ;;
  baseline)
    begin baseline
    run baseline /usr/bin/python3 bench/article_baseline.py $model 3000
    run baseline $cli bench --model $model --device cpu --mode async --workers 2 \
      --concurrency 32 --duration-s 3 --quiet
    ;;
  server)
    # asyncinfer serve: vs nginx, binary vs JSON, server-side p50, digits over HTTP.
    begin server
    run server scripts/bench_server.sh $B
    ;;
  grpc)
    # gRPC vs HTTP, 1/2/3 servers behind nginx on sim, digits over gRPC vs in process.
    begin grpc
    run grpc /usr/bin/python3 scripts/bench_grpc.py $B
    ;;
  grpc_stream)
    # ModelStreamInfer against ModelInfer, 64 and 1 in flight (bench/bench_grpc_stream).
    begin grpc_stream
    run grpc_stream scripts/bench_grpc_stream.sh $B
    ;;
  grpc_digits)
    # The digits model over gRPC against in process, per CPU second (client CPU apart).
    begin grpc_digits
    run grpc_digits scripts/bench_grpc_digits.sh $B
    ;;
  peers)
    # asyncinfer serve against KServe's model server and Ray Serve on the digits model
    # (bench/compare_servers.py); their pinned environments come from setup.sh --peers.
    begin peers
    scripts/setup.sh --peers >/dev/null
    run peers /usr/bin/python3 bench/compare_servers.py $B
    ;;
  python)
    # The Python module against the article's Python designs, side by side (bench/python_bench.py).
    begin python
    run python env PYTHONPATH=$B/python /usr/bin/python3 bench/python_bench.py --model $model \
      --rounds 3 --fractions 0.5,0.7,0.9
    ;;
  *) echo "bench.sh: unknown section '$s'" >&2; exit 2 ;;
  esac
  # Put the section into the document between its markers.
  awk -v name="$s" -v file="$out/$s.md" '
    $0 == "<!-- bench:" name " -->" { print; while ((getline line < file) > 0) print line; skip = 1; next }
    $0 == "<!-- /bench:" name " -->" { skip = 0 }
    !skip { print }
  ' "$doc" >"$doc.tmp" && mv "$doc.tmp" "$doc"
  echo "bench.sh: section $s done"
done
