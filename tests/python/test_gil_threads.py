"""The GIL is released while the engine works; many Python threads use one engine at once."""
import threading
import time

import numpy as np
import pytest

import asyncinfer
from conftest import WAIT, slow_model, x


class Counter:
    """A Python thread that counts as fast as it can: it advances only while it has the GIL."""

    def __init__(self):
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.count += 1

    def __enter__(self):
        self._thread.start()
        while self.count == 0:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(WAIT)


def advances_while(call, seconds=0.3):
    """The counter's progress while `call` blocks for about `seconds`."""
    with Counter() as c:
        before = c.count
        t0 = time.monotonic()
        call()
        elapsed = time.monotonic() - t0
        after = c.count
    assert elapsed >= seconds * 0.8, f"call returned after {elapsed:.3f} s; expected it to block"
    return after - before


@pytest.fixture
def slow():
    e = asyncinfer.Engine(slow_model(300), "cpu")
    yield e
    e.shutdown()


def test_gil_is_released_during_infer(slow):
    assert advances_while(lambda: slow.infer(x())) > 10000


def test_gil_is_released_during_future_result(slow):
    f = slow.submit(x())
    assert advances_while(lambda: f.result(WAIT)) > 10000


def test_gil_is_released_during_result_by_id(slow):
    slow.submit_id("a", x())
    assert advances_while(lambda: slow.result("a", timeout=WAIT)) > 10000


def test_gil_is_released_during_shutdown_drain():
    e = asyncinfer.Engine(slow_model(300), "cpu")
    e.submit(x())
    assert advances_while(lambda: e.shutdown("drain")) > 10000


def test_gil_is_released_during_wait_all():
    e = asyncinfer.Engine(slow_model(300), "cpu")
    q = asyncinfer.AsyncInferQueue(e, 2)
    q.start_async(x())
    assert advances_while(q.wait_all) > 10000
    e.shutdown()


def test_callbacks_run_while_the_main_thread_waits_in_result(slow):
    """A callback needs the GIL on the completion thread; a waiting result() must not hold it."""
    got = threading.Event()
    slow.submit(x(), callback=lambda r: got.set())
    f = slow.submit(x())
    f.result(WAIT)
    assert got.wait(WAIT)


def test_eight_threads_submitting_at_once():
    with asyncinfer.Engine("builtin:identity", "cpu", workers=2, queue_capacity=100000) as e:
        per_thread = 2000
        errors = []
        barrier = threading.Barrier(8)

        def client(k):
            try:
                barrier.wait(WAIT)
                mine = []
                for i in range(per_thread):
                    value = k * per_thread + i
                    if i % 3 == 0:
                        out = e.infer(x(value=value))
                        assert out[0][0, 0] == value
                    elif i % 3 == 1:
                        mine.append((value, e.submit(x(value=value))))
                    else:
                        e.submit_id(f"{k}-{i}", x(value=value))
                        assert e.result(f"{k}-{i}", timeout=WAIT)[0][0, 0] == value
                        e.release(f"{k}-{i}")
                for value, f in mine:
                    assert f.result(WAIT)[0][0, 0] == value
            except BaseException as err:  # noqa: BLE001 (reported below)
                errors.append(err)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        m = e.metrics()
        assert m["completed"] == 8 * per_thread and m["failed"] == 0


def test_threads_share_an_async_infer_queue():
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        q = asyncinfer.AsyncInferQueue(e, jobs=16)
        seen = []
        lock = threading.Lock()

        def cb(outputs, userdata):
            with lock:
                seen.append((int(outputs[0][0, 0]), userdata))

        q.set_callback(cb)

        def client(k):
            for i in range(500):
                q.start_async(x(value=k * 1000 + i), userdata=k * 1000 + i)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        q.wait_all()
        assert len(seen) == 4000 and all(a == b for a, b in seen)
        assert sorted(u for _, u in seen) == sorted(k * 1000 + i for k in range(8)
                                                    for i in range(500))
        np.testing.assert_equal(q.busy, 0)
