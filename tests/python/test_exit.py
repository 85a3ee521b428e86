"""The interpreter exits with requests in flight: no crash, no hang, callbacks owed still run.

Each case runs in a fresh interpreter (subprocess) that leaves without shutting anything down.
"""
import pytest

from conftest import run_python

# A signal shows in the return code; these are what a crash or an escaped error prints.
BAD_SIGNS = ("terminate called", "Fatal Python error", "Segmentation fault", "core dumped",
             "FATAL", "Traceback")


def check(result, expect_lines=None):
    assert result.returncode == 0, (result.returncode, result.stdout[-2000:], result.stderr[-4000:])
    for sign in BAD_SIGNS:
        assert sign not in result.stderr, result.stderr[-4000:]
    if expect_lines is not None:
        assert result.stdout.count("\n") >= expect_lines, result.stdout[-2000:]


def test_exit_with_futures_and_callbacks_in_flight():
    r = run_python("""
        import sys, numpy as np, asyncinfer
        e = asyncinfer.Engine("builtin:fixed_cost?base_us=2000", "cpu", workers=2,
                              queue_capacity=20000)
        x = np.zeros((1, 4), np.float32)
        futures = [e.submit(x) for _ in range(500)]
        for i in range(500):
            e.submit(x, callback=lambda r, i=i: sys.stdout.write(f"cb {i} {type(r).__name__}\\n"))
        print("leaving", flush=True)
    """, timeout=120)
    check(r)
    # shutdown(drain) at exit: every callback owed ran, with the outputs (a list).
    assert r.stdout.count(" list\n") == 500, r.stdout[-500:]


def test_exit_with_daemon_threads_blocked_in_waits():
    r = run_python("""
        import threading, time, numpy as np, asyncinfer
        e = asyncinfer.Engine("builtin:fixed_cost?base_us=5000000", "cpu", drain_timeout=0.2)
        x = np.zeros((1, 4), np.float32)
        f = e.submit(x)
        e.submit_id("slow", x)
        def quietly(call):
            try:
                call()
            except asyncinfer.Error:   # Aborted: the exit hook drains for 0.2 s, then cancels
                pass
        threading.Thread(target=quietly, args=(f.result,), daemon=True).start()
        threading.Thread(target=quietly, args=(lambda: e.result("slow"),), daemon=True).start()
        threading.Thread(target=quietly, args=(lambda: e.infer(x),), daemon=True).start()
        def spin():
            while True:
                try:
                    e.submit(x)
                except Exception:
                    pass
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.2)
        print("leaving", flush=True)
    """, timeout=120)
    check(r)


def test_exit_with_raising_callbacks_pipelines_queues_and_asyncio():
    r = run_python("""
        import asyncio, numpy as np, asyncinfer, logging
        logging.disable(logging.CRITICAL)   # the raising callbacks are logged; keep stderr clean
        e = asyncinfer.Engine("builtin:fixed_cost?base_us=1000", "cpu")
        x = np.zeros((1, 4), np.float32)
        for _ in range(200):
            e.submit(x, callback=lambda r: 1 / 0)
            e.submit(x).add_done_callback(lambda f: [][1])
        q = asyncinfer.AsyncInferQueue(e, 8)
        q.set_callback(lambda out, data: None)
        for i in range(8):
            q.start_async(x, i)
        p = asyncinfer.Pipeline([lambda i: np.full((1, 4), i, np.float32), e,
                                 lambda out: out[0][0, 0]], window=8)
        for i in range(8):
            p.submit(i)
        async def main():
            # a task left waiting when the loop is closed
            asyncio.ensure_future(e.submit(x))
            await asyncio.sleep(0)
        asyncio.run(main())
        cycle = {"engine": asyncinfer.Engine("builtin:identity", "cpu")}
        cycle["self"] = cycle
        del cycle
        print("leaving", flush=True)
    """, timeout=120)
    check(r)


def test_exit_from_a_non_main_thread_with_work_in_flight():
    r = run_python("""
        import os, threading, numpy as np, asyncinfer
        e = asyncinfer.Engine("builtin:fixed_cost?base_us=1000", "cpu")
        x = np.zeros((1, 4), np.float32)
        def worker():
            for _ in range(100):
                e.submit(x, callback=lambda r: None)
        t = threading.Thread(target=worker)   # a non-daemon thread: joined before atexit
        t.start()
        print("leaving", flush=True)
    """, timeout=120)
    check(r)


@pytest.mark.parametrize("mode", ["sys.exit(3)", "raise SystemExit(3)"])
def test_exit_code_is_kept(mode):
    r = run_python(f"""
        import sys, numpy as np, asyncinfer
        e = asyncinfer.Engine("builtin:fixed_cost?base_us=1000", "cpu")
        for _ in range(100):
            e.submit(np.zeros((1, 4), np.float32))
        {mode}
    """, timeout=120)
    assert r.returncode == 3, r.stderr[-2000:]
    for sign in BAD_SIGNS:
        assert sign not in r.stderr


def test_engines_dropped_in_their_callbacks_share_one_reaper_thread():
    """Engines whose last reference dies on their own completion thread are destroyed by one
    reaper thread for the module; the interpreter exits once the pending ones are gone, with every
    callback they still owed run."""
    r = run_python("""
        import os, sys, time, weakref, numpy as np, asyncinfer

        def reapers():
            n = 0
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/comm") as f:
                        n += f.read().strip() == "asyncinfer-reap"
                except OSError:  # a thread that just ended
                    pass
            return n

        x = np.zeros((1, 4), np.float32)
        refs, most = [], 0
        assert reapers() == 0
        for i in range(20):
            e = asyncinfer.Engine("builtin:fixed_cost?base_us=2000", "cpu")
            holder = {"engine": e}
            refs.append(weakref.ref(e))
            e.submit(x, callback=lambda r, h=holder: h.clear())  # the last reference dies here
            for _ in range(5):  # owed when it goes: run by its drain, on the reaper's watch
                e.submit(x, callback=lambda r, i=i: sys.stdout.write(
                    f"late {i} {type(r).__name__}\\n"))  # one write: threads interleave prints
            del e, holder
            most = max(most, reapers())
        deadline = time.monotonic() + 60
        while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
            most = max(most, reapers())
            time.sleep(0.001)
        assert all(ref() is None for ref in refs)
        # One write: print() writes its pieces one by one, and a late callback's line could
        # land between them.
        sys.stdout.write(f"reapers {most} {reapers()}\\n")
        sys.stdout.flush()
        # Leaves at once: the last destructions may still be pending; the exit hook waits.
    """, timeout=120)
    check(r)
    assert "reapers 1 1\n" in r.stdout, r.stdout[-2000:]
    assert r.stdout.count(" list\n") == 100, r.stdout[-2000:]


def test_ctrl_c_during_the_exit_drain_cancels_what_is_left():
    # 1,000 queued requests of 50 ms on one worker: the exit hook would drain them for its
    # drain_timeout (30 s). The first Ctrl-C cancels what is left; the process ends at once, as an
    # uncaught KeyboardInterrupt ends Python (killed by SIGINT: 130 in a shell).
    import select
    import signal
    import subprocess
    import sys
    import textwrap
    import time
    code = """
        import numpy as np, asyncinfer
        e = asyncinfer.Engine("builtin:fixed_cost?per_item_us=50000", "cpu", workers=1,
                              queue_capacity=20000)
        x = np.zeros((1, 4), np.float32)
        futures = [e.submit(x) for _ in range(1000)]
        print("leaving", flush=True)
    """
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 60)
        assert ready and p.stdout.readline() == "leaving\n"
        time.sleep(1.0)  # the exit drain runs now
        start = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
        took = time.monotonic() - start
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    print("exit %d, %.2f s after the Ctrl-C" % (p.returncode, took))
    assert took < 5, took
    assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (p.returncode, err[-2000:])
    assert "KeyboardInterrupt" in err, err[-2000:]
    for sign in ("terminate called", "Fatal Python error", "Segmentation fault", "core dumped"):
        assert sign not in err, err[-4000:]
