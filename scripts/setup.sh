#!/usr/bin/env bash
# Installs the Debian 12 packages asyncinfer needs (build tools, GoogleTest, Google Benchmark,
# CLI11, nlohmann_json, stb, gperftools' tcmalloc for the programs, libtorch, and PyTorch +
# scikit-learn for the demo model; for
# `asyncinfer serve`: Boost.Beast, protobuf, prometheus-cpp, gRPC C++ with its code generators, and
# curl, requests, prometheus_client, grpcio, PyYAML, h2 (raw HTTP/2 frames for the hostile-client
# tests), h2load, wrk and nginx (with its stream module) for its tests and benchmarks; for the Python module: pybind11, the Python headers, numpy, dlpack,
# pip/setuptools/venv for `pip install .`, pytest + pytest-asyncio for its tests); zlib for HTTP
# compression; python3-onnx (the openvino backend's test models) and python3-torchvision (ResNet-50
# for bench/bench_openvino.py); python3-psutil (bench/compare_servers.py); python3-pil (the PNG
# decoder of examples/model_repository_ensemble's Python pre-processing model). Then Triton's own Python client from PyPI (scripts/requirements-tritonclient.txt,
# every version pinned) in its own virtual environment, .venv/tritonclient, made from Debian's
# interpreter without its packages (tritonclient's grpcio and protobuf are newer than Debian's,
# which the build and the other tests use), and OpenVINO's runtime from PyPI
# (scripts/requirements-openvino.txt) in .venv/openvino: its wheel carries the C++ headers, CMake
# config and libraries that the openvino model backend builds against, and benchmark_app. Idempotent: skips apt when every package is there, and
# pip when the environment already holds the pinned set. Needs root (or sudo) for apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev libgoogle-perftools-dev
  libcli11-dev nlohmann-json3-dev libstb-dev
  libtorch-dev python3-torch python3-sklearn
  libboost-dev libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  curl python3-requests python3-prometheus-client nghttp2-client wrk nginx-light
  pybind11-dev python3-pybind11 python3-dev python3-numpy libdlpack-dev
  python3-pip python3-setuptools python3-wheel python3-venv
  python3-pytest python3-pytest-asyncio
  libgrpc++-dev protobuf-compiler-grpc python3-grpcio python3-protobuf python3-yaml libre2-dev
  libnginx-mod-stream python3-h2 zlib1g-dev python3-onnx python3-torchvision python3-psutil
  python3-pil libssl-dev
)

# pinned_venv NAME REQUIREMENTS [--system-site-packages]: .venv/NAME, made from Debian's
# interpreter, without its packages unless asked, holding exactly the pinned set (installed with
# --no-deps, so nothing unpinned comes along).
pinned_venv() {
  local root venv req
  root="$(cd "$(dirname "$0")/.." && pwd)"
  venv="$root/.venv/$1"
  req="$root/scripts/$2"
  if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/requirements.txt"; then
    echo "setup: $venv has the pinned set of $2"
    return
  fi
  echo "setup: making $venv ($2 from PyPI)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv ${3:-} "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
  cp "$req" "$venv/requirements.txt"
}
# Triton's client (tests/server/test_tritonclient*.py run on it) and OpenVINO's runtime (the
# openvino model backend builds against its C++ files; benchmark_app for bench/).
# With --peers, also the servers bench/compare_servers.py measures asyncinfer against: KServe's
# model server and Ray Serve (about 850 MB together), perf_analyzer 2.51 (260 MB), Triton Model
# Analyzer (610 MB) and Triton 2.51 itself (370 MB); no test needs them (server.perf_analyzer and server.model_analyzer are
# skipped without the last two). Their venvs see Debian's
# packages, so that they serve the model through Debian's torch, asyncinfer's libtorch version.
python_venvs() {
  pinned_venv tritonclient requirements-tritonclient.txt
  pinned_venv openvino requirements-openvino.txt
  if [ "$peers" = 1 ]; then
    pinned_venv kserve requirements-kserve.txt --system-site-packages
    pinned_venv ray requirements-ray.txt --system-site-packages
    # perf_analyzer 2.51, Triton's benchmark tool (scripts/perf_analyzer runs it; it also needs
    # Debian's libb64-0d, in the package list with --peers).
    pinned_venv perf_analyzer requirements-perf-analyzer.txt
    # Triton Model Analyzer (server.model_analyzer runs it against the tritonserver link).
    pinned_venv model_analyzer requirements-model-analyzer.txt
    # The real Triton 2.51 (bench/compare_triton_sequences.py): its python backend needs the
    # stub built for this interpreter (3.11) beside it.
    pinned_venv triton requirements-triton.txt
    local ts
    ts="$(cd "$(dirname "$0")/.." && pwd)/.venv/triton/lib/python3.11/site-packages/pytriton/tritonserver"
    cp -n "$ts/python_backend_stubs/3.11/triton_python_backend_stub" \
      "$ts/backends/python/triton_python_backend_stub"
  fi
}
peers=0
for arg in "$@"; do
  case "$arg" in
    --peers) peers=1 ;;
    *) echo "setup: unknown argument '$arg' (expected --peers)" >&2; exit 2 ;;
  esac
done
if [ "$peers" = 1 ]; then packages+=(libb64-0d); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
  python_venvs
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -q
# --force-unsafe-io (this install only): dpkg skips its fsync() after each of the tens of
# thousands of files that python3-torch, libtorch-dev and the rest unpack (a crash mid-install
# means running this script again, as for any interrupted install). man-db/auto-update false:
# the man page index is not rebuilt after every package (a debconf setting that stays; `dpkg-
# reconfigure man-db` turns it back on).
echo "man-db man-db/auto-update boolean false" | $SUDO debconf-set-selections 2>/dev/null || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-unsafe-io "${missing[@]}"
python_venvs
