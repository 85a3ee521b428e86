#!/usr/bin/env bash
# Installs the Debian 12 packages asyncinfer needs (build tools, GoogleTest, Google Benchmark,
# CLI11, nlohmann_json, stb, gperftools' tcmalloc for the programs, libtorch, and PyTorch +
# scikit-learn for the demo model; for
# `asyncinfer serve`: Boost.Beast, protobuf, prometheus-cpp, gRPC C++ with its code generators, and
# curl, requests, prometheus_client, grpcio, PyYAML, h2 (raw HTTP/2 frames for the hostile-client
# tests), h2load, wrk and nginx (with its stream module) for its tests and benchmarks; for the Python module: pybind11, the Python headers, numpy, dlpack,
# pip/setuptools/venv for `pip install .`, pytest + pytest-asyncio for its tests). Idempotent:
# skips apt entirely when everything is already there. Needs root (or sudo).
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
  libgrpc++-dev protobuf-compiler-grpc python3-grpcio python3-protobuf python3-yaml
  libnginx-mod-stream python3-h2
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
