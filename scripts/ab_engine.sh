#!/usr/bin/env bash
# A/B of the no-op engine between two builds, alternating A and B in one run so that load from
# other processes falls on both (the way docs/performance.md's fast-path figures were taken).
# Each round runs, for A then B, `asyncinfer bench` at one concurrency under `perf stat` and
# prints throughput, p50, the process's task-clock and its context switches; read the medians.
#
#   scripts/ab_engine.sh A_DIR B_DIR [ROUNDS=5] [CONCURRENCY=1024]
#
# A_DIR and B_DIR are release build folders (build/release of two worktrees), or copies holding
# `asyncinfer` and `libasyncinfer.so*` side by side (cp build/release/src/libasyncinfer.so*
# build/release/apps/asyncinfer/asyncinfer DIR/). Needs perf (linux-perf).
set -euo pipefail
a=$1
b=$2
rounds=${3:-5}
conc=${4:-1024}

# binary DIR, libdir DIR: where a build folder or a flat copy keeps them.
binary() { [ -x "$1/apps/asyncinfer/asyncinfer" ] && echo "$1/apps/asyncinfer/asyncinfer" || echo "$1/asyncinfer"; }
libdir() { [ -d "$1/src" ] && echo "$1/src" || echo "$1"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$rounds"); do
  for v in A B; do
    d=$a
    [ "$v" = B ] && d=$b
    LD_LIBRARY_PATH=$(libdir "$d") perf stat -x, -o "$tmp/stat" -e task-clock,context-switches \
      "$(binary "$d")" bench --model builtin:identity --device cpu --mode sweep \
      --concurrency "$conc" --workers 1 --completion-threads 1 --duration-s 2 --quiet >"$tmp/out" 2>&1
    rps=$(grep -o 'throughput *[0-9.]*' "$tmp/out" | tr -s ' ' | cut -d' ' -f2)
    p50=$(grep -o 'latency *p50 [0-9.]* [mu]s' "$tmp/out" | tr -s ' ' | cut -d' ' -f3-)
    tc=$(grep task-clock "$tmp/stat" | cut -d, -f1)
    cs=$(grep context-switches "$tmp/stat" | cut -d, -f1)
    echo "$v round $i: c=$conc $rps req/s, p50 $p50, task-clock $tc ms, $cs context switches"
  done
done
