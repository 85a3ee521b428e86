"""Shared fixtures of the Python tests (run by ctest: tests/python/CMakeLists.txt).

The tests import the module from the build tree (PYTHONPATH=<build>/python). Every wait has a
timeout, so a failure fails instead of hanging; ctest's TIMEOUT is only the last guard.
"""
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import asyncinfer

MODELS_DIR = os.environ.get("ASYNCINFER_TEST_MODELS_DIR", "")
CLI = os.environ.get("ASYNCINFER_CLI", "")
WAIT = 30.0  # seconds: the longest any single wait in these tests may take


@pytest.fixture
def identity():
    """A no-op engine (builtin:identity on cpu), shut down after the test."""
    engine = asyncinfer.Engine("builtin:identity", "cpu")
    yield engine
    engine.shutdown()


def slow_model(ms):
    """A model that sleeps `ms` milliseconds on the cpu device before copying its input."""
    return f"builtin:fixed_cost?base_us={int(ms * 1000)}"


def x(n=1, cols=4, value=0.0):
    return np.full((n, cols), value, dtype=np.float32)


def digits_model():
    path = os.path.join(MODELS_DIR, "digits.pt")
    if not MODELS_DIR or not os.path.exists(path):
        pytest.skip("the digits model is made by the TorchDigitsModel ctest fixture "
                    "(models/make_digits.py); run through ctest")
    return path


def run_python(code, timeout=120, env=None):
    """Runs `code` in a fresh interpreter that imports the module under test."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def thread_count():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads: line in /proc/self/status")


@pytest.fixture(autouse=True)
def collect():
    yield
    gc.collect()
