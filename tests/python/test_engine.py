"""Engine: options, callbacks, the id-based API, shutdown, metrics, errors."""
import concurrent.futures as cf
import gc
import logging
import threading
import time
import weakref

import numpy as np
import pytest

import asyncinfer
from conftest import WAIT, slow_model, x


def test_package_surface_and_exception_hierarchy():
    assert asyncinfer.__version__
    assert {"cpu", "sim"} <= set(asyncinfer.device_backends())
    E = asyncinfer
    assert issubclass(E.InvalidArgument, E.Error) and issubclass(E.InvalidArgument, ValueError)
    assert issubclass(E.DeadlineExceeded, E.Error) and issubclass(E.DeadlineExceeded, TimeoutError)
    assert issubclass(E.Cancelled, E.Error) and issubclass(E.Cancelled, cf.CancelledError)
    for cls, code in [(E.ResourceExhausted, "resource_exhausted"), (E.Unavailable, "unavailable"),
                      (E.NotFound, "not_found"), (E.AlreadyExists, "already_exists"),
                      (E.Aborted, "aborted"), (E.Internal, "internal"),
                      (E.FailedPrecondition, "failed_precondition"),
                      (E.InvalidArgument, "invalid_argument"), (E.Cancelled, "cancelled"),
                      (E.DeadlineExceeded, "deadline_exceeded")]:
        assert issubclass(cls, E.Error) and cls.code == code
        assert cls.__doc__ and cls.__module__ == "asyncinfer"
    for obj in (E.Engine, E.Engine.submit, E.Engine.infer, E.Future.result, E.AsyncInferQueue,
                E.Pipeline, E.load_model, E.open_device):
        assert obj.__doc__ and len(obj.__doc__) > 80, obj


def test_model_and_device_objects():
    model = asyncinfer.load_model("builtin:identity?shape=1x32x32&max_batch=16")
    sig = model.signature
    assert sig.batched and sig.batch_limit == 16
    assert asyncinfer.load_model("builtin:identity?max_batch_size=0").signature.batch_limit is None
    with pytest.raises(asyncinfer.InvalidArgument, match="batch_limit 0 must be >= 1"):
        asyncinfer.load_model("builtin:identity", batch_limit=0)
    assert [(s.name, s.dtype, s.shape) for s in sig.inputs] == [("input0", "f32", (-1, 1, 32, 32))]
    assert sig.outputs[0].numpy_dtype == "float32"
    assert "input0 f32[-1,1,32,32]" in str(sig)
    device = asyncinfer.open_device("sim")
    assert device.name == "sim" and device.kind == "sim" and device.info.simulated
    assert asyncinfer.open_device("cpu").info.is_async
    caps = asyncinfer.open_device("cpu").info.capabilities
    assert caps.caller_run_streams and caps.host_funcs_may_call_device
    assert caps.host_addressable_memory
    assert not device.info.capabilities.caller_run_streams  # sim
    with asyncinfer.Engine(model, device, workers=2) as e:
        assert e.model is model and e.device is device
        assert e.infer(np.zeros((2, 1, 32, 32), np.float32))[0].shape == (2, 1, 32, 32)
    with pytest.raises(asyncinfer.InvalidArgument, match="builtin"):
        asyncinfer.load_model("builtin:nonsense")
    assert "builtin:identity" in asyncinfer.model_backends()
    # NotFound; Unavailable where the library was built without the torch backend (sanitizers).
    missing = (asyncinfer.NotFound if "torch" in asyncinfer.model_backends()
               else asyncinfer.Unavailable)
    with pytest.raises(missing, match="/no/such/model.pt"):
        asyncinfer.load_model("/no/such/model.pt")
    with pytest.raises(asyncinfer.InvalidArgument, match="cpu"):
        asyncinfer.open_device("quantum")


def test_every_engine_option_as_a_keyword():
    retry = asyncinfer.RetryPolicy(max_attempts=3, initial_backoff=0.002, multiplier=3.0,
                                   max_backoff=0.05, retryable_codes=[asyncinfer.Unavailable],
                                   budget_ratio=0.5, budget_min_retries_per_s=5.0,
                                   budget_window=2.0)
    options = dict(workers=2, max_inflight_per_worker=3, queue_capacity=100,
                   queue_full_policy="block", submit_timeout=0.5, completion_threads=2,
                   spin_wait_us=0, priority_levels=4, default_priority=3, priority_aging=0.25, max_batch_size=8,
                   preferred_batch_sizes=[4, 8], max_queue_delay_us=100,
                   split_failed_batches=False, ordered_delivery=True, default_timeout=5.0,
                   allow_timeout_override=True, admission_control=True, retry=retry,
                   breaker={"failure_threshold": 3, "cooldown": 0.5},
                   recovery=asyncinfer.RecoveryOptions(max_recycle_attempts=2,
                                                       recycle_backoff=0.05),
                   watchdog=2.0,
                   result_store_capacity=50, result_ttl=30.0, intra_op_threads=1,
                   drain_timeout=3.0)
    with asyncinfer.Engine("builtin:identity", "cpu", **options) as e:
        got = e.options
        for key, value in options.items():
            if key == "retry":
                assert got["retry"].max_attempts == 3
                assert got["retry"].initial_backoff == pytest.approx(0.002)
                assert got["retry"].retryable_codes == ["unavailable"]
                assert got["retry"].budget_window == pytest.approx(2.0)
            elif key == "breaker":
                assert got["breaker"].failure_threshold == 3
                assert got["breaker"].cooldown == pytest.approx(0.5)
            elif key == "recovery":
                assert got["recovery"].max_recycle_attempts == 2
                assert got["recovery"].recycle_backoff == pytest.approx(0.05)
                assert got["recovery"].max_abandoned_instances == 1
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value), key
            else:
                assert got[key] == value, key
        assert e.infer(x())[0].shape == (1, 4)
        h = e.health()
        assert h["live"] and h["ready"] and h["reason"] == ""
        assert [w["health"] for w in h["workers"]] == ["healthy", "healthy"]
        m = e.metrics()
        assert m["live_workers"] == 2 and m["result_store_size"] == 0
        assert m["workers"][0]["health"] == "healthy"
    assert e.health()["live"] is False
    auto = asyncinfer.Engine("builtin:identity")
    assert set(auto.options) == set(options)
    assert auto.options["workers"] == 1  # auto: identity does not compute on host cores
    assert auto.options["intra_op_threads"] == 1
    assert auto.options["max_batch_size"] == 64  # unset: identity's batch limit, in effect
    auto.shutdown()


def test_bad_options_raise_invalid_argument_naming_them():
    with pytest.raises(asyncinfer.InvalidArgument, match="workers"):
        asyncinfer.Engine("builtin:identity", workers=-1)
    for bad in (0, -1):
        with pytest.raises(asyncinfer.InvalidArgument, match="max_batch_size %d must be >= 1" % bad):
            asyncinfer.Engine("builtin:identity", max_batch_size=bad)
    with pytest.raises(asyncinfer.InvalidArgument, match="max_batch_size 9 exceeds the model's"):
        asyncinfer.Engine("builtin:identity?max_batch_size=8", max_batch_size=9)
    with pytest.raises(asyncinfer.InvalidArgument, match="recovery"):
        asyncinfer.Engine("builtin:identity", recovery="often")
    with pytest.raises(asyncinfer.InvalidArgument, match="max_recycle_attempts"):
        asyncinfer.Engine("builtin:identity", recovery={"max_recycle_attempts": 0})
    with pytest.raises(asyncinfer.InvalidArgument, match="queue_full_policy"):
        asyncinfer.Engine("builtin:identity", queue_full_policy="sometimes")
    with pytest.raises(asyncinfer.InvalidArgument, match="default_timeout"):
        asyncinfer.Engine("builtin:identity", default_timeout="soon")
    with pytest.raises(asyncinfer.InvalidArgument, match="retryable_codes"):
        asyncinfer.RetryPolicy(retryable_codes=["nope"])
    with pytest.raises(asyncinfer.InvalidArgument):
        asyncinfer.Engine("builtin:identity",
                          retry=asyncinfer.RetryPolicy(retryable_codes=["invalid_argument"]))
    with pytest.raises(TypeError):
        asyncinfer.Engine("builtin:identity", not_an_option=1)


def test_callback_gets_outputs_or_the_exception_once_on_the_completion_thread():
    main = threading.get_ident()
    got = cf.Future()
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        assert e.submit(x(value=5.0), callback=lambda r: got.set_result(
            (r, threading.get_ident()))) is None
        outputs, thread = got.result(WAIT)
        assert thread != main
        np.testing.assert_array_equal(outputs[0], x(value=5.0))
    with asyncinfer.Engine("builtin:faulty?mode=error&code=unavailable", "cpu") as e:
        failed = cf.Future()
        e.submit(x(), callback=failed.set_result)
        err = failed.result(WAIT)
        assert isinstance(err, asyncinfer.Unavailable) and err.code == "unavailable"
        with pytest.raises(asyncinfer.Unavailable):
            e.submit(x()).result(WAIT)
        with pytest.raises(asyncinfer.Unavailable):
            e.infer(x())


def test_callback_exception_is_logged_counted_and_the_engine_goes_on(caplog):
    caplog.set_level(logging.ERROR, logger="asyncinfer")
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        ok = []
        done = threading.Semaphore(0)

        def bad(_):
            done.release()
            raise KeyError("from a callback")

        def good(r):
            ok.append(r)
            done.release()

        for i in range(20):
            e.submit(x(), callback=bad if i % 2 == 0 else good)
        for _ in range(20):
            assert done.acquire(timeout=WAIT)
        deadline = time.monotonic() + WAIT
        while e.metrics()["callback_exceptions"] < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        m = e.metrics()
        assert m["callback_exceptions"] == 10 and m["completed"] == 20 and len(ok) == 10
        assert "asyncinfer_inference_callback_exceptions" in e.prometheus()
        assert 'asyncinfer_inference_callback_exceptions{model="builtin:identity"} 10' in e.prometheus()
        assert e.infer(x())[0].shape == (1, 4)
    records = [r for r in caplog.records if r.name == "asyncinfer"]
    assert records and records[0].exc_info[0] is KeyError
    assert "callback" in records[0].getMessage()


def test_id_api():
    with asyncinfer.Engine(slow_model(100), "cpu") as e:
        e.submit_id("req_001", x(value=1.0))
        assert e.status("req_001") in (asyncinfer.RequestState.pending,
                                       asyncinfer.RequestState.running)
        with pytest.raises(asyncinfer.AlreadyExists):
            e.submit_id("req_001", x())
        with pytest.raises(asyncinfer.FailedPrecondition):
            e.release("req_001")
        np.testing.assert_array_equal(e.result("req_001", timeout=WAIT)[0], x(value=1.0))
        assert e.status("req_001") == asyncinfer.RequestState.completed
        assert e.status("req_001").terminal
        np.testing.assert_array_equal(e.result("req_001")[0], x(value=1.0))  # idempotent
        e.release("req_001")
        assert e.status("req_001") == asyncinfer.RequestState.unknown
        with pytest.raises(asyncinfer.NotFound):
            e.result("req_001", timeout=0.1)
        with pytest.raises(asyncinfer.NotFound):
            e.cancel("nope")

        e.submit_id("slow", x())
        with pytest.raises(asyncinfer.DeadlineExceeded):
            e.result("slow", timeout=0.01)  # the wait ran out; the request goes on
        e.cancel("slow")
        with pytest.raises(asyncinfer.Cancelled):
            e.result("slow", timeout=WAIT)
        assert e.status("slow") == asyncinfer.RequestState.cancelled
        with pytest.raises(asyncinfer.FailedPrecondition):
            e.cancel("slow")

        e.submit_id("timeout", x(), timeout=0.01)
        with pytest.raises(asyncinfer.DeadlineExceeded):
            e.result("timeout", timeout=WAIT)
        assert e.status("timeout") == asyncinfer.RequestState.timed_out


def test_shutdown_modes_context_manager_and_submits_after():
    e = asyncinfer.Engine(slow_model(100), "cpu")
    fs = [e.submit(x()) for _ in range(5)]
    e.shutdown("cancel")
    assert all(f.done() for f in fs)
    states = {type(f.exception()) for f in fs if f.exception() is not None}
    assert asyncinfer.Aborted in states
    late = e.submit(x())
    with pytest.raises(asyncinfer.Unavailable):
        late.result(WAIT)
    with pytest.raises(asyncinfer.Unavailable):
        e.submit(x(), callback=lambda r: None)
    with pytest.raises(asyncinfer.Unavailable):
        e.infer(x())
    e.shutdown()  # idempotent

    with asyncinfer.Engine(slow_model(20), "cpu") as e2:
        fs = [e2.submit(x()) for _ in range(5)]
    assert all(f.result(0)[0].shape == (1, 4) for f in fs)  # drained by __exit__

    e3 = asyncinfer.Engine(slow_model(200), "cpu")
    f = e3.submit(x())
    t0 = time.monotonic()
    e3.shutdown(asyncinfer.ShutdownMode.drain, drain_timeout=0.01)
    assert time.monotonic() - t0 < 5
    assert f.done()
    with pytest.raises(ValueError, match="drain"):
        e3.shutdown("later")


def test_shutdown_from_a_callback_is_refused():
    got = cf.Future()
    with asyncinfer.Engine("builtin:identity", "cpu") as e:
        def cb(_):
            try:
                e.shutdown()
            except asyncinfer.FailedPrecondition as err:
                got.set_result(err)
        e.submit(x(), callback=cb)
        assert "callback" in str(got.result(WAIT))


def test_engine_collected_on_its_own_completion_thread():
    """The last reference to an engine dies inside its own callback: no deadlock, no abort."""
    done = threading.Event()
    e = asyncinfer.Engine("builtin:identity", "cpu")
    ref = weakref.ref(e)
    holder = {"engine": e}

    def cb(_):
        holder.clear()  # drops the last reference here, on the completion thread
        done.set()

    e.submit(x(), callback=cb)
    del e
    assert done.wait(WAIT)
    deadline = time.monotonic() + WAIT
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert ref() is None


def test_metrics_and_prometheus():
    with asyncinfer.Engine("builtin:identity", "cpu", workers=2) as e:
        for f in [e.submit(x()) for _ in range(100)]:
            f.result(WAIT)
        m = e.metrics()
        assert m["submitted"] == 100 and m["completed"] == 100 and m["failed"] == 0
        assert len(m["workers"]) == 2 and m["batches"] >= 1
        assert m["request_us"]["count"] == 100 and m["request_us"]["p50"] > 0
        assert m["model"].startswith("builtin:identity")
        text = e.prometheus()
        assert "# TYPE" in text and "asyncinfer_" in text
        assert "myprefix_" in e.prometheus("myprefix")


def test_queue_full_reject_and_block():
    with asyncinfer.Engine(slow_model(200), "cpu", queue_capacity=2, workers=1,
                           max_inflight_per_worker=1, max_batch_size=1) as e:
        fs = [e.submit(x()) for _ in range(6)]
        errors = [f.exception(WAIT) for f in fs]
        assert any(isinstance(err, asyncinfer.ResourceExhausted) for err in errors)
        with pytest.raises(asyncinfer.ResourceExhausted):
            for _ in range(6):
                e.submit(x(), callback=lambda r: None)
    with asyncinfer.Engine(slow_model(50), "cpu", queue_capacity=1, workers=1,
                           max_inflight_per_worker=1, max_batch_size=1,
                           queue_full_policy="block", submit_timeout=10.0) as e:
        ticks = []
        stop = threading.Event()
        t = threading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.001)
                                             for _ in iter(lambda: stop.is_set(), True)])
        t.start()
        fs = [e.submit(x()) for _ in range(6)]  # blocks for space, without the GIL
        stop.set()
        t.join()
        assert all(f.result(WAIT)[0].shape == (1, 4) for f in fs)
        assert len(ticks) > 20


def test_priorities_and_ordered_delivery():
    with asyncinfer.Engine(slow_model(30), "cpu", max_batch_size=1, workers=1,
                           max_inflight_per_worker=1) as e:
        order = []
        lock = threading.Lock()
        blocker = e.submit(x())
        time.sleep(0.01)
        fs = [e.submit(x(value=i), priority=3 if i < 3 else 1,
                       callback=lambda r: (lock.acquire(), order.append(r[0][0, 0]),
                                           lock.release())) for i in range(6)]
        assert all(f is None for f in fs)
        blocker.result(WAIT)
        deadline = time.monotonic() + WAIT
        while len(order) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(order[:3]) == [3, 4, 5]  # priority 1 overtook priority 3
    with asyncinfer.Engine("builtin:fixed_cost?base_us=1000&cost_from_input=true", "cpu",
                           workers=3, max_batch_size=1, ordered_delivery=True) as e:
        order = []
        done = threading.Semaphore(0)
        for cost in [20000, 1000, 10000, 0, 5000]:
            e.submit(np.full((1, 4), cost, np.float32),
                     callback=lambda r: (order.append(r[0][0, 0]), done.release()))
        for _ in range(5):
            assert done.acquire(timeout=WAIT)
        assert order == [20000, 1000, 10000, 0, 5000]


def test_an_ordered_callback_waiting_for_a_later_request_of_its_key_gets_an_error():
    # Ordered delivery: the later request is delivered only after this callback returns, so the
    # wait could never end; it raises FailedPrecondition at once instead (with or without a
    # timeout), and the later request is delivered afterwards as usual.
    with asyncinfer.Engine("builtin:identity", "cpu", ordered_delivery=True,
                           completion_threads=2) as e:
        seen = {}
        done = threading.Event()
        later = []

        def first(r):
            try:
                f = e.submit(x(value=7), sequence_key="k")
                later.append(f)
                t0 = time.monotonic()
                for timeout in (None, 5.0):
                    try:
                        f.result(timeout)
                        seen[timeout] = "returned"
                    except asyncinfer.FailedPrecondition as err:
                        seen[timeout] = str(err)
                seen["took"] = time.monotonic() - t0
            finally:
                done.set()

        e.submit(x(value=1), sequence_key="k", callback=first)
        assert done.wait(WAIT)
        for timeout in (None, 5.0):
            assert "sequence key 'k'" in seen[timeout], seen
        assert seen["took"] < 2.0
        assert later[0].result(WAIT)[0][0, 0] == 7


def test_retry_policy_retries_then_succeeds():
    retry = asyncinfer.RetryPolicy(max_attempts=3, initial_backoff=0.001)
    with asyncinfer.Engine("builtin:faulty?mode=error&code=unavailable&first=2", "cpu",
                           retry=retry, max_batch_size=1) as e:
        assert e.infer(x())[0].shape == (1, 4)
        assert e.metrics()["retries"] == 2


def test_stubs_match_the_module():
    """__init__.pyi declares every public name and method the module has, and nothing else."""
    import ast
    import inspect
    import os
    path = os.path.join(os.path.dirname(asyncinfer.__file__), "__init__.pyi")
    tree = ast.parse(open(path).read())
    aliases = {"Seconds", "TensorLike", "Inputs", "Outputs", "StatusCodeLike"}
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = (
                {n.name for n in node.body if isinstance(n, ast.FunctionDef)} |
                {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)})
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and node.target.id not in aliases:
            stubbed[node.target.id] = set()
    assert set(stubbed) - {"__version__"} == set(asyncinfer.__all__)
    for name, members in stubbed.items():
        obj = getattr(asyncinfer, name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue  # exceptions: code is a class attribute, message an instance one
        for m in members:
            assert hasattr(obj, m), f"{name}.{m} is in the stubs but not in the module"
        if "__entries" in vars(obj):  # enums: their values are the members
            continue
        public = {m for m in vars(obj) if not m.startswith("_")}
        missing = public - members
        assert not missing, f"{name}: {sorted(missing)} are not in the stubs"


def test_bytes_tensors_pass_through_identity_as_object_arrays():
    # BYTES (Triton's TYPE_STRING): numpy object arrays of bytes or str, or dtype S, go in; object
    # arrays of bytes come out (tritonclient's form). Requests batched together keep their rows.
    with asyncinfer.Engine("builtin:identity?dtype=bytes&shape=-1", device="cpu",
                           max_queue_delay_us=20000) as e:
        x = np.array([[b"ab", "h\u00e9", b""]], dtype=object)
        (out,) = e.infer(x)
        assert out.dtype == object and out.shape == (1, 3)
        assert list(out.flatten()) == [b"ab", "h\u00e9".encode(), b""]
        (out,) = e.infer(np.array([[b"abc", b"d"]]))
        assert list(out.flatten()) == [b"abc", b"d"]
        rows = [np.array([[b"r%d" % k * k, b"\x00" * k]], dtype=object) for k in range(8)]
        futures = [e.submit(r) for r in rows]
        for r, f in zip(rows, futures):
            assert list(f.result(timeout=WAIT)[0].flatten()) == list(r.flatten())
        with pytest.raises(asyncinfer.InvalidArgument, match="BYTES element 0 is int"):
            e.infer(np.array([[1, b"x"]], dtype=object))
