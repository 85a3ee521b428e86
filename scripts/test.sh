#!/usr/bin/env bash
# The test command (README): on a fresh Debian 12 machine, installs what is missing, builds the
# release preset (with the torch and cuda backends and the Python module where their toolkits
# are found) and runs the whole test suite with ctest — the Python tests (pytest, label "python",
# tests/python/) among them, on the module of this build, plus one check that `pip install .`
# works; then builds the asan (address + undefined) and tsan presets (core, devices, engine,
# pipeline, and the Python module) and runs the unit, stress and Python tests under each.
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    release build and tests only
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh

step() { printf '\n==== %s ====\n' "$*"; }

step "release: configure, build, test"
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

if [ "${1:-}" = "--quick" ]; then
  exit 0
fi

for preset in asan tsan; do
  step "$preset: configure, build, unit + stress + Python tests"
  # The Python module is built under the sanitizer too and its tests run with the sanitizer
  # runtime preloaded into Debian's (uninstrumented) interpreter (tests/python/CMakeLists.txt).
  cmake --preset "$preset" -DASYNCINFER_PYTHON_WITH_SANITIZERS=ON
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs" -L 'unit|stress|python' -LE 'example'
done
step "all tests passed"
