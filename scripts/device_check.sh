#!/usr/bin/env bash
# scripts/device_check.sh — the GPU check. On a machine with an NVIDIA GPU: builds with CUDA (and
# torch-CUDA where PyTorch is installed: its libtorch is found through
# torch.utils.cmake_prefix_path), runs the tests (the CUDA ones included), then the benchmarks —
# sync vs async on cuBLAS work, the engine with 1, 2 and 4 workers, host<->device copies
# overlapped, a pipeline of host and GPU stages, the digits model on the GPU — and prints a short
# report. Meant to finish in well under 8 minutes on an H200.
#
#   scripts/device_check.sh [--vendor DIR] [--out DIR]
#   scripts/device_check.sh --pack DIR
#
# Such a machine may have none of Debian's packages (no GoogleTest, CLI11, nlohmann_json, stb).
# `--pack DIR`, run on a Debian machine that has them (scripts/setup.sh), copies the header-only
# ones, libstb.a and the GoogleTest sources into DIR; pass that folder with --vendor and the
# build uses it where the system has nothing (CMake option ASYNCINFER_VENDOR_DIR).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack" ]; then
  dir=${2:?usage: scripts/device_check.sh --pack DIR}
  rm -rf "$dir" && mkdir -p "$dir/include" "$dir/stb" "$dir/lib"
  cp -r /usr/include/CLI /usr/include/nlohmann "$dir/include/"
  # stb apart from include/: only the image code may see it, never CLI11 or nlohmann from here
  # (two CLI11 versions in one program would break it).
  cp /usr/include/stb/stb_image.h /usr/include/stb/stb_image_resize.h "$dir/stb/"
  cp /usr/lib/x86_64-linux-gnu/libstb.a "$dir/lib/"
  cp -r /usr/src/googletest "$dir/googletest"
  # prometheus-cpp's core (the library's exporter), with a config of its own: Debian's would look
  # for civetweb, curl and zlib, which the library does not use.
  mkdir -p "$dir/prometheus-cpp/include" "$dir/prometheus-cpp/lib"
  cp -r /usr/include/prometheus "$dir/prometheus-cpp/include/"
  cp /usr/lib/x86_64-linux-gnu/libprometheus-cpp-core.so.1.0* "$dir/prometheus-cpp/lib/"
  cat >"$dir/prometheus-cpp/prometheus-cpp-config.cmake" <<'CONFIG'
add_library(prometheus-cpp::core SHARED IMPORTED)
set_target_properties(prometheus-cpp::core PROPERTIES
  IMPORTED_LOCATION "${CMAKE_CURRENT_LIST_DIR}/lib/libprometheus-cpp-core.so.1.0.1"
  IMPORTED_SONAME "libprometheus-cpp-core.so.1.0"
  INTERFACE_INCLUDE_DIRECTORIES "${CMAKE_CURRENT_LIST_DIR}/include")
set(prometheus-cpp_FOUND TRUE)
CONFIG
  du -sh "$dir"
  exit 0
fi

vendor=""
out=${OUT:-build/device_check}
while [ $# -gt 0 ]; do
  case "$1" in
    --vendor) vendor=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "device_check: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
report="$out/report.txt"
: >"$report"
say() { echo "$*" | tee -a "$report"; }
t_start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t_start )) s"; }

say "== asyncinfer device check, $(date -u '+%Y-%m-%d %H:%M UTC')"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU or driver here: nothing to check (the CUDA tests skip on such machines)"
  exit 0
fi
say "gpu:    $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "nvcc:   $(nvcc --version 2>/dev/null | tail -1)"
say "cores:  $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
if [ -n "$torch_prefix" ]; then
  say "torch:  $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
fi

# ---- build ------------------------------------------------------------------------------------
# Without the server: it is checked on the CPU machines, and the GPU machine's protobuf headers
# and library disagree (its link fails).
build=build/gpu
configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DASYNCINFER_WERROR=OFF \
    -DASYNCINFER_BUILD_BENCH=OFF -DASYNCINFER_WITH_CUDA=ON -DASYNCINFER_WITH_SERVER=OFF \
    -DASYNCINFER_TORCH_PYTHON="$(command -v python3)" \
    -UASYNCINFER_STB_INCLUDE_DIR -UASYNCINFER_STB_LIBRARY \
    ${vendor:+-DASYNCINFER_VENDOR_DIR=$vendor} \
    ${vendor:+-Dprometheus-cpp_DIR=$vendor/prometheus-cpp} "$@" >>"$out/build.log" 2>&1
}
torch_built=0
if [ -n "$torch_prefix" ] && configure -DASYNCINFER_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$torch_prefix"; then
  grep -q "torch backend ON" "$out/build.log" && torch_built=1
else
  rm -rf "$build"
  configure -DASYNCINFER_WITH_TORCH=OFF || { say "configure failed; see build.log"; tail -30 "$out/build.log"; exit 1; }
fi
grep -E "asyncinfer: (torch|cuda)|cuda instances" "$out/build.log" | tee -a "$report"
if ! cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1; then
  say "build failed; see build.log"
  grep -E "error|FAILED" "$out/build.log" | head -20
  exit 1
fi
say "built in $(elapsed)"
bin=$build/apps/asyncinfer/asyncinfer

# ---- tests ------------------------------------------------------------------------------------
# DEVICE_CHECK_TESTS=<regex> runs a subset (default: every test).
(cd "$build" && timeout 240 ctest -j "$(nproc)" --timeout 120 ${DEVICE_CHECK_TESTS:+-R "$DEVICE_CHECK_TESTS"} \
  --output-on-failure >"$out/ctest.log" 2>&1)
say "tests: $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
grep -E "\(Failed\)|\(Timeout\)|\*\*\*Failed" "$out/ctest.log" | head -20 | tee -a "$report"
say "cuda tests run (not skipped): $(grep -E '(Cuda|cuda_0|CudaEngine|TorchCuda).*Passed' "$out/ctest.log" | wc -l)," \
    "skipped: $(grep -E '(Cuda|cuda_0|CudaEngine|TorchCuda).*Skipped' "$out/ctest.log" | wc -l)"
say "tests done at $(elapsed)"

# ---- benchmarks -------------------------------------------------------------------------------
bench() { timeout 60 "$bin" bench --quiet "$@" 2>&1 | tee -a "$out/bench.txt"; }
cost='builtin:fixed_cost?base_us=1000&per_item_us=10&shape=64'
say ""
say "== batching: $cost on cuda:0 (a 1 ms + 10 us/item spin kernel), sync vs async"
bench --model "$cost" --device cuda:0 --compare sync,async --concurrency 64 --duration-s 2 \
  | grep -E "^  (sync|async)|x$" | tee -a "$report"
say ""
say "== workers 1, 2, 4: one stream each, batches of 1 (1 ms kernels), 32 in flight"
for w in 1 2 4; do
  line=$(bench --model "$cost" --device cuda:0 --mode async --workers "$w" --max-batch-size 1 \
    --concurrency 32 --duration-s 2 | grep -E "^  (throughput|latency) ")
  say "workers=$w $line"
done
gemm='builtin:gemm?m=1024&n=1024&k=1024&dtype=bf16&max_batch_size=8'
say ""
say "== cuBLAS: $gemm, workers 1, 2, 4, GPU utilisation sampled by nvidia-smi (not events)"
for w in 1 2 4; do
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 >"$out/smi_$w.csv" 2>/dev/null &
  smi=$!
  line=$(bench --model "$gemm" --device cuda:0 --mode async --workers "$w" --concurrency 32 \
    --duration-s 2 | grep -E "^  (throughput|latency) ")
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  util=$(awk '{s+=$1; n++} END {if (n) printf "%.0f", s/n}' "$out/smi_$w.csv")
  say "workers=$w $line  gpu busy ${util}%"
done
rm -f "$out"/smi_*.csv
say ""
say "== host<->device copies overlapped: identity on 4 MiB requests (copy in, copy back)"
bench --model 'builtin:identity?shape=1048576' --device cuda:0 --compare sync,async \
  --concurrency 8 --workers 2 --duration-s 2 | grep -E "^  (sync|async)|x$" | tee -a "$report"
say ""
say "== pipeline: host 1 ms -> GPU 2 ms -> host 1 ms (bound 500 items/s)"
bench --stages host:1ms,cuda:2ms,host:1ms --device cuda:0 --compare sync,pipeline --duration-s 2 \
  | grep -E "^  (sync|pipeline)|x$" | tee -a "$report"
if [ "$torch_built" = 1 ]; then
  say ""
  say "== digits (TorchScript on the GPU), asyncinfer run, sync vs async"
  models=$build/models
  [ -f "$models/digits.pt" ] || python3 models/make_digits.py --out "$models" >>"$out/build.log" 2>&1
  timeout 120 "$bin" run --model "$models/digits.pt" --device cuda:0 --images "$models/test" \
    --labels "$models/test/labels.csv" --compare --window 32 --repeat 4 --quiet 2>&1 \
    | tee -a "$report"
fi
say ""
say "device check done in $(elapsed)"
