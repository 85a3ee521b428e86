"""Each of examples/python/ (the article's seven sections) runs and says what it should."""
import os
import subprocess
import sys

import pytest

EXAMPLES = os.environ.get("ASYNCINFER_EXAMPLES_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")

EXPECT = {
    "02_callbacks.py": "8 of 8 completed",
    "03_futures.py": "infer_batch of 32",
    "04_request_queue.py": "duplicate id refused",
    "05_multi_consumer.py": "{'completed': 100}",
    "06_pipeline.py": "bottleneck:",
    "07_timeout.py": "timed_out 4",
    "08_retry.py": "not retried: bad input",
}


# Clients of `asyncinfer serve`, run by the server tests (they need a server and Triton's client).
SERVER_CLIENTS = {"ensemble_client.py": "tests/server/test_ensemble_digits.py"}


def test_every_example_is_listed():
    assert sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")) == sorted(
        list(EXPECT) + list(SERVER_CLIENTS))


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example(name):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert EXPECT[name] in r.stdout, r.stdout[-2000:]
