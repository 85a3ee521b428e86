"""AsyncInferQueue (after OpenVINO's) and Pipeline with Python stages."""
import concurrent.futures as cf
import threading
import time

import numpy as np
import pytest

import asyncinfer
from conftest import WAIT, slow_model, x


def test_async_infer_queue_runs_every_job_with_its_userdata():
    with asyncinfer.Engine(slow_model(5), "cpu", workers=2) as e:
        q = asyncinfer.AsyncInferQueue(e, jobs=4)
        assert len(q) == 4 and q.jobs == 4 and q.is_ready()
        results = {}
        main = threading.get_ident()
        q.set_callback(lambda out, data: results.__setitem__(data, (out[0][0, 0],
                                                                    threading.get_ident())))
        max_busy = 0
        for i in range(40):
            q.start_async(x(value=i), userdata=i)
            max_busy = max(max_busy, q.busy)
        assert max_busy <= 4
        q.wait_all()
        assert q.busy == 0 and q.is_ready()
        assert {k: v[0] for k, v in results.items()} == {i: i for i in range(40)}
        assert all(v[1] != main for v in results.values())


def test_async_infer_queue_default_jobs_and_errors():
    with asyncinfer.Engine("builtin:identity", "cpu", workers=2) as e:
        assert asyncinfer.AsyncInferQueue(e).jobs == 2 * 2 * 64  # workers × in flight × batch
    with asyncinfer.Engine("builtin:faulty?mode=error&code=internal&every=2", "cpu",
                           max_batch_size=1) as e:
        q = asyncinfer.AsyncInferQueue(e, 2)
        got = []
        q.set_callback(lambda out, data: got.append(type(out)))
        for i in range(6):
            q.start_async(x(), i)
        q.wait_all()  # failures reach the callback; they are not raised here
        assert got.count(asyncinfer.Internal) == 3 and got.count(list) == 3
        q.set_callback(None)
        for i in range(4):
            q.start_async(x(), i)
        with pytest.raises(asyncinfer.Internal):  # nobody was called back for them
            q.wait_all()
        q.wait_all()  # raised once, then cleared


def test_async_infer_queue_callback_exception_raised_by_wait_all():
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        q = asyncinfer.AsyncInferQueue(e, 3)

        def cb(out, data):
            if data == 5:
                raise RuntimeError("bad item 5")

        q.set_callback(cb)
        for i in range(10):
            q.start_async(x(), userdata=i)
        with pytest.raises(RuntimeError, match="bad item 5"):
            q.wait_all()
        assert e.metrics()["callback_exceptions"] == 1
        for i in range(10):
            q.start_async(x(), userdata=i + 100)
        q.wait_all()  # the queue goes on


def test_async_infer_queue_refusals_and_start_from_a_callback():
    with asyncinfer.Engine(slow_model(50), "cpu") as e:
        q = asyncinfer.AsyncInferQueue(e, 1)
        with pytest.raises(asyncinfer.InvalidArgument):
            q.start_async(np.zeros((1, 2), np.float64))
        assert q.busy == 0
        err = cf.Future()

        def cb(out, data):
            if data == 0:
                try:
                    q.start_async(x(), 1)  # the only job is this one: would wait for itself
                except asyncinfer.ResourceExhausted as ex:
                    err.set_result(ex)

        q.set_callback(cb)
        q.start_async(x(), 0)
        assert "from a callback" in str(err.result(WAIT))
        q.wait_all()
    with pytest.raises(ValueError):
        asyncinfer.AsyncInferQueue(asyncinfer.Engine("builtin:identity"), -1)


def pre(raw):
    """Pre-processing: a Python int becomes the model's input."""
    return np.full((1, 4), float(raw), np.float32)


def post(outputs):
    """Post-processing: the model's output back to a Python value."""
    return int(outputs[0][0, 0]) * 10


def test_three_stage_pipeline_python_engine_python():
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        with asyncinfer.Pipeline([pre, e, post], window=4) as p:
            futures = [p.submit(i) for i in range(50)]
            assert [f.result(WAIT) for f in futures] == [i * 10 for i in range(50)]
            assert p.run(range(10)) == [i * 10 for i in range(10)]
            m = p.metrics()
            assert m["completed"] == 60 and m["max_in_flight"] <= 4
            assert [s["name"] for s in m["stages"]] == ["pre", "engine1", "post"]
            assert [s["kind"] for s in m["stages"]] == ["host", "engine", "host"]
            assert "asyncinfer_" in p.prometheus()


def test_pipeline_stages_run_on_their_threads_and_overlap():
    """pre 20 ms (Python, sleeping: it releases the GIL) → engine 20 ms → post: overlapped,
    40 items take well under the 40 × 40 ms of a sync loop."""
    with asyncinfer.Engine(slow_model(20), "cpu", max_batch_size=1) as e:
        stage_threads = set()

        def slow_pre(i):
            stage_threads.add(threading.get_ident())
            time.sleep(0.02)
            return pre(i)

        stages = [asyncinfer.Stage.host("pre", slow_pre), asyncinfer.Stage.engine("infer", e),
                  asyncinfer.Stage.host("post", post)]
        with asyncinfer.Pipeline(stages, window=8) as p:
            t0 = time.monotonic()
            assert p.run(range(40)) == [i * 10 for i in range(40)]
            elapsed = time.monotonic() - t0
        assert threading.get_ident() not in stage_threads
        assert elapsed < 40 * 0.04 * 0.8, elapsed  # a hang guard more than a speed claim


def test_pipeline_stage_exception_reaches_result_with_its_type():
    def picky(i):
        if i == 3:
            raise KeyError(f"item {i}")
        return pre(i)

    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        with asyncinfer.Pipeline([picky, e, post]) as p:
            fs = [p.submit(i) for i in range(6)]
            for i, f in enumerate(fs):
                if i == 3:
                    with pytest.raises(KeyError, match="item 3"):
                        f.result(WAIT)
                    assert f.exception().__traceback__ is not None
                else:
                    assert f.result(WAIT) == i * 10
            with pytest.raises(KeyError):
                p.run([1, 3])
            m = p.metrics()
            assert m["failed"] == 2 and m["stages"][0]["failures"] == 2


def test_pipeline_bad_tensor_from_a_stage_is_invalid_argument():
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        with asyncinfer.Pipeline([lambda i: np.zeros((1, 4), np.float64), e]) as p:
            with pytest.raises(asyncinfer.InvalidArgument, match="f64"):
                p.submit(0).result(WAIT)


def test_pipeline_priorities_timeouts_and_shutdown():
    gate = threading.Event()

    def wait_gate(i):
        gate.wait(WAIT)
        return i

    with asyncinfer.Pipeline([wait_gate, lambda i: i], window=16, ordered=False) as p:
        first = p.submit(-1)  # holds the first stage
        low = [p.submit(i, priority=3) for i in range(3)]
        high = [p.submit(100 + i, priority=1) for i in range(3)]
        order = []
        for f in low + high:
            f.add_done_callback(lambda f: order.append(f.result()))
        gate.set()
        cf.wait([first] + low + high, timeout=WAIT)
        assert sorted(order[:3]) == [100, 101, 102]


    with asyncinfer.Pipeline([lambda i: time.sleep(0.3) or i]) as p:
        with pytest.raises(asyncinfer.DeadlineExceeded):
            p.submit(0, timeout=0.02).result(WAIT)

    p = asyncinfer.Pipeline([lambda i: time.sleep(0.05) or i], window=4)
    fs = [p.submit(i) for i in range(4)]
    p.shutdown("cancel")
    assert all(f.done() for f in fs)
    with pytest.raises(asyncinfer.Unavailable):
        p.submit(1).result(WAIT)


def test_pipeline_first_stage_engine_and_model_stage():
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        model = asyncinfer.load_model("builtin:identity")
        stages = [e, asyncinfer.Stage.model("again", "cpu", model), post]
        with asyncinfer.Pipeline(stages) as p:
            assert p.submit(x(value=4.0)).result(WAIT) == 40
            with pytest.raises(asyncinfer.InvalidArgument):
                p.submit("not a tensor")


def test_pipeline_awaitable():
    import asyncio

    async def main():
        with asyncinfer.Pipeline([lambda i: i + 1]) as p:
            return await asyncio.gather(*(p.submit(i) for i in range(100)))

    assert asyncio.run(main()) == list(range(1, 101))


def test_pipeline_bad_stages():
    with pytest.raises(ValueError):
        asyncinfer.Pipeline([3])
    with pytest.raises(asyncinfer.InvalidArgument):
        asyncinfer.Pipeline([])


def test_pipeline_collected_on_its_own_stage_thread():
    """The last reference to a pipeline dies inside one of its stages: it is destroyed on
    another thread (its destructor waits for its stages), after finishing the item."""
    import gc
    import weakref
    holder = {}

    def stage(i):
        holder.clear()  # drops the last reference here, on the stage's thread
        return pre(i)

    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        p = asyncinfer.Pipeline([stage, e, post])
        ref = weakref.ref(p)
        holder["p"] = p
        f = p.submit(4)
        del p
        assert f.result(WAIT) == 40
        deadline = time.monotonic() + WAIT
        while ref() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert ref() is None
        assert e.infer(x())[0].shape == (1, 4)  # the engine it used is fine


def test_pipeline_dropped_or_shut_down_from_a_callback_of_its_engine():
    """A pipeline waits for its engine stages' requests, whose completions run on the engine's
    threads: destroying it there goes to another thread, and shutdown() there is refused."""
    import gc
    import weakref
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        p = asyncinfer.Pipeline([pre, e, post])
        assert p.submit(1).result(WAIT) == 10
        refused = cf.Future()

        def try_shutdown(_):
            try:
                p.shutdown()
            except asyncinfer.FailedPrecondition as err:
                refused.set_result(err)

        e.submit(x(), callback=try_shutdown)
        assert "engine it uses" in str(refused.result(WAIT))

        ref = weakref.ref(p)
        holder = {"p": p}
        del p, try_shutdown
        dropped = threading.Event()
        f = holder["p"].submit(2)

        def drop(_):
            holder.clear()  # the pipeline's last reference dies on the engine's thread
            dropped.set()

        e.submit(x(), callback=drop)
        assert dropped.wait(WAIT)
        assert f.result(WAIT) == 20
        deadline = time.monotonic() + WAIT
        while ref() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert ref() is None
        assert e.infer(x())[0].shape == (1, 4)
