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
#
# Stages overlap where they are independent: while one preset's tests run, the next preset
# builds at the lowest CPU priority (SCHED_IDLE, `chrt --idle 0`), so it takes only the CPU
# time the tests leave idle (servers waiting on sockets, timers, sleeps) and never slows a test
# that wants a core. The tests labelled "timing" (they bound latencies or CPU time) run after the
# others, with the background build stopped. The tests of each preset still run alone with respect
# to each other (ctest's RUN_SERIAL and -j as before). Each build's log goes to build/<preset>.log and is
# printed when its tests start.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh

step() { printf '\n==== %s ==== (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

# A build started in the background: its pid, and the file its output goes to.
bg_pid=""
bg_log=""
cleanup() {
  if [ -n "$bg_pid" ] && kill -0 "$bg_pid" 2>/dev/null; then
    kill -- "-$bg_pid" 2>/dev/null || kill "$bg_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# configure_sanitizer PRESET: the sanitizer presets' configure step (quick, in the foreground).
configure_sanitizer() {
  # The Python module is built under the sanitizer too and its tests run with the sanitizer
  # runtime preloaded into Debian's (uninstrumented) interpreter (tests/python/CMakeLists.txt).
  cmake --preset "$1" -DASYNCINFER_PYTHON_WITH_SANITIZERS=ON >"build/$1.configure.log" 2>&1 ||
    { cat "build/$1.configure.log"; return 1; }
}

# start_idle_build PRESET: builds PRESET in the background at idle priority.
start_idle_build() {
  bg_log="build/$1.log"
  local idle=(chrt --idle 0)
  "${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
  # setsid: its own process group, so that cleanup() stops the compilers with it.
  setsid "${idle[@]}" cmake --build --preset "$1" -j "$jobs" >"$bg_log" 2>&1 &
  bg_pid=$!
}

# run_tests_beside_build PRESET ARGS...: runs PRESET's tests while the background build goes on,
# except those labelled "timing" (they bound latencies or CPU time): for them the build is
# stopped (SIGSTOP to its process group) and resumed after.
run_tests_beside_build() {
  local preset=$1
  shift
  ctest --preset "$preset" -j "$jobs" "$@" -LE timing
  if [ -n "$bg_pid" ]; then kill -STOP -- "-$bg_pid" 2>/dev/null || true; fi
  local rc=0
  ctest --preset "$preset" -j "$jobs" "$@" -L timing --no-tests=ignore || rc=$?
  if [ -n "$bg_pid" ]; then kill -CONT -- "-$bg_pid" 2>/dev/null || true; fi
  return "$rc"
}

# finish_build PRESET: waits for the background build of PRESET (or builds it now), then shows
# the end of its log.
finish_build() {
  if [ -n "$bg_pid" ]; then
    local rc=0
    wait "$bg_pid" || rc=$?
    bg_pid=""
    tail -n 5 "$bg_log"
    if [ "$rc" -ne 0 ]; then
      cat "$bg_log"
      echo "test.sh: the $1 build failed (exit $rc)" >&2
      return "$rc"
    fi
    # Finish at full priority whatever the idle build left (nothing, normally).
  fi
  cmake --build --preset "$1" -j "$jobs"
}

step "release: configure, build"
cmake --preset release
cmake --build --preset release -j "$jobs"

if [ "${1:-}" = "--quick" ]; then
  step "release: test"
  ctest --preset release -j "$jobs"
  exit 0
fi

mkdir -p build
configure_sanitizer asan
configure_sanitizer tsan
start_idle_build asan
step "release: test (asan builds meanwhile at idle priority)"
run_tests_beside_build release

step "asan: finish the build"
finish_build asan
start_idle_build tsan
step "asan: unit + stress + Python tests (tsan builds meanwhile at idle priority)"
run_tests_beside_build asan -L 'unit|stress|python' -LE 'example'

step "tsan: finish the build"
finish_build tsan
step "tsan: unit + stress + Python tests"
ctest --preset tsan -j "$jobs" -L 'unit|stress|python' -LE 'example'
step "all tests passed"
