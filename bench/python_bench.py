#!/usr/bin/python3
"""asyncinfer from Python against the article's own Python designs, side by side in one run.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_bench.py \\
        --model models/data/digits.pt [--rounds 3] [--requests 3200] [--json out.json]

Designs (bench/article_baseline.py keeps the article's code paths as written):
  article-future     §2.2 FutureInferenceEngine: ThreadPoolExecutor(4), one forward per request
  article-consumers  §3.2 MultiConsumerInference: 4 consumer threads, get_result polls every 10 ms
  asyncinfer-future  Engine.submit -> asyncinfer.Future.result (workers=2, dynamic batching)
  asyncinfer-id      Engine.submit_id -> Engine.result(id): the article's id-based API shape
Same model file, same input (a float32 [1, 1, 32, 32] torch tensor), same driver per load:
  closed   the baseline's own pattern: submit 32, then wait for each of them, repeated
  open     constant arrivals at a fixed rate from one sender thread; a collector thread waits for
           each result in submit order; the rates are fractions of the best article design's
           closed-loop throughput, so every design sees the same offered load
Latency is submit -> result returned to the caller (µs, nearest-rank percentiles). Each design
runs in its own interpreter (one process per design and round, alternating), and the medians
over the rounds are reported.

The no-op section (builtin:identity against the article designs with an identity function as
the model) measures the binding's own cost from one Python thread, and where it goes.
"""
import argparse
import concurrent.futures
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BURST = 32
NOOP = "builtin:identity?shape=1x32x32"  # the no-op model: outputs a copy of the input


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values) - 1e-9)))
    return sorted_values[rank - 1]


def summary(latencies_s, wall_s):
    lat = sorted(v * 1e6 for v in latencies_s)
    return {"requests": len(lat), "rps": len(lat) / wall_s, "p50_us": percentile(lat, 0.5),
            "p99_us": percentile(lat, 0.99)}


# ---- designs ----------------------------------------------------------------------------------

class ArticleFuture:
    def __init__(self, model):
        import article_baseline as ab
        self.engine = ab.FutureInferenceEngine(model)

    def submit(self, x):
        return self.engine.infer(x)

    def wait(self, h):
        return h.result(timeout=10.0)

    def close(self):
        self.engine.executor.shutdown()


class ArticleConsumers:
    def __init__(self, model):
        import article_baseline as ab
        self.mc = ab.MultiConsumerInference(model, num_consumers=4)
        self.mc.start()
        self.n = 0

    def submit(self, x):
        self.n += 1
        return self.mc.submit(f"req_{self.n}", x)

    def wait(self, h):
        r = self.mc.get_result(h, timeout=10.0)
        with self.mc.lock:
            del self.mc.result_store[h]  # the article never forgets; do not let it grow here
        return r

    def close(self):
        self.mc.running = False


class AsyncinferFuture:
    def __init__(self, model, **options):
        import asyncinfer
        self.engine = asyncinfer.Engine(model, "cpu", **options)

    def submit(self, x):
        return self.engine.submit(x)

    def wait(self, h):
        return h.result(10.0)

    def close(self):
        self.engine.shutdown()


class AsyncinferId(AsyncinferFuture):
    n = 0

    def submit(self, x):
        self.n += 1
        rid = str(self.n)
        self.engine.submit_id(rid, x)
        return rid

    def wait(self, h):
        out = self.engine.result(h, 10.0)
        self.engine.release(h)
        return out


# ---- drivers ----------------------------------------------------------------------------------

def closed_loop(design, x, n):
    lat = []
    t0 = time.perf_counter()
    for _ in range(n // BURST):
        sent = [(time.perf_counter(), design.submit(x)) for _ in range(BURST)]
        for s, h in sent:
            design.wait(h)
            lat.append(time.perf_counter() - s)
    return summary(lat, time.perf_counter() - t0)


def open_loop(design, x, rate, seconds):
    """Constant arrivals at `rate`/s; the sender sleeps between sends (releasing the GIL)."""
    pending = queue.SimpleQueue()
    lat = []
    n = int(rate * seconds)

    def collect():
        for _ in range(n):
            s, h = pending.get()
            design.wait(h)
            lat.append(time.perf_counter() - s)

    collector = threading.Thread(target=collect)
    collector.start()
    t0 = time.perf_counter()
    lag = 0.0
    for i in range(n):
        due = t0 + i / rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        else:
            lag = max(lag, now - due)
        pending.put((time.perf_counter(), design.submit(x)))
    collector.join()
    wall = time.perf_counter() - t0
    out = summary(lat, wall)
    out["offered_rps"] = rate
    out["max_send_lag_ms"] = lag * 1e3
    return out


ENGINE_OPTIONS = {"workers": 2}


def make_design(name, model_path, noop, engine_options=None):
    if name.startswith("article"):
        if noop:
            model = lambda t: t  # noqa: E731 (the article's model call, doing nothing)
        else:
            import torch
            torch.set_num_threads(max(1, os.cpu_count() or 1))
            model = torch.jit.load(model_path).eval()
        return (ArticleFuture if name == "article-future" else ArticleConsumers)(model)
    options = {"workers": 1} if noop else dict(engine_options or ENGINE_OPTIONS)
    return (AsyncinferFuture if name == "asyncinfer-future" else AsyncinferId)(
        NOOP if noop else model_path, **options)


def run_design(args):
    """One design in this process: warm up, then the closed loop and the open-loop rates."""
    import torch
    noop = args.model == "noop"
    x = torch.randn(1, 1, 32, 32)
    design = make_design(args.design, args.model, noop, json.loads(args.engine_options))
    for _ in range(200):
        design.wait(design.submit(x))
    result = {"design": args.design, "closed": closed_loop(design, x, args.requests)}
    for rate in args.rates:
        result[f"open@{rate:g}"] = open_loop(design, x, rate, args.seconds)
    design.close()
    print(json.dumps(result))


def spawn(design, model, requests, rates, seconds, engine_options):
    cmd = [sys.executable, os.path.abspath(__file__), "--design", design, "--model", model,
           "--requests", str(requests), "--seconds", str(seconds),
           "--engine-options", engine_options]
    if rates:
        cmd += ["--rates", ",".join(f"{r:g}" for r in rates)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [HERE, os.environ.get("PYTHONPATH", "")] if p))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{design}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(runs, key, field):
    return statistics.median(r[key][field] for r in runs)


def compare(model, designs, requests, rounds, seconds, fractions, engine_options):
    runs = {d: [] for d in designs}
    for _ in range(rounds):  # closed loop first, alternating designs
        for d in designs:
            runs[d].append(spawn(d, model, requests, [], seconds, engine_options))
    article = [d for d in designs if d.startswith("article")]
    best = max(article, key=lambda d: median_of(runs[d], "closed", "rps"))
    best_rps = median_of(runs[best], "closed", "rps")
    rates = [round(best_rps * f, -1) for f in fractions]
    open_runs = {d: [] for d in designs}
    for _ in range(rounds):
        for d in designs:
            open_runs[d].append(spawn(d, model, BURST, rates, seconds, engine_options))
    table = {}
    for d in designs:
        row = {"closed": {k: median_of(runs[d], "closed", k) for k in ("rps", "p50_us", "p99_us")}}
        for r in rates:
            key = f"open@{r:g}"
            row[key] = {k: median_of(open_runs[d], key, k)
                        for k in ("rps", "p50_us", "p99_us", "max_send_lag_ms")}
        table[d] = row
    return table, best, rates


def print_table(title, table, best, rates):
    print(f"\n{title}")
    cols = ["closed"] + [f"open@{r:g}" for r in rates]
    print(f"  {'design':20}" + "".join(f"{c:>36}" for c in cols))
    print(f"  {'':20}" + "".join(f"{'req/s   p50 us   p99 us':>36}" for _ in cols))
    for d, row in table.items():
        cells = "".join(f"{row[c]['rps']:>14,.0f}{row[c]['p50_us']:>11,.0f}{row[c]['p99_us']:>11,.0f}"
                        for c in cols)
        print(f"  {d:20}{cells}")
    ours = "asyncinfer-future"
    article = [d for d in table if d.startswith("article")]
    o = table[ours]

    def best_of(column, field, pick):
        return pick((table[d][column][field], d) for d in article)

    rps, by = best_of("closed", "rps", max)
    p50, pby = best_of("closed", "p50_us", min)
    print(f"  capacity of the best article design (closed loop): {best}; the open-loop rates are "
          f"fractions of it")
    print(f"  closed loop (32 in flight): throughput {o['closed']['rps'] / rps:.2f}x the best "
          f"article design's ({by}); p50 {p50 / o['closed']['p50_us']:.2f}x lower than its best "
          f"({pby})")
    for r in rates:
        k = f"open@{r:g}"
        p50, pby = best_of(k, "p50_us", min)
        print(f"  offered {r:,.0f} req/s: p50 {o[k]['p50_us']:,.0f} us vs {p50:,.0f} us ({pby}, the "
              f"best article design at this load) = {p50 / o[k]['p50_us']:.2f}x lower")


# ---- no-op: the binding's own cost ------------------------------------------------------------

REPEATS = 5


def put(out, key, fn, n):
    """The best of REPEATS runs (the one least disturbed by other processes), as timeit does."""
    best = None
    for _ in range(REPEATS):
        wall = timeit(fn, n)
        if best is None or wall < best[0]:
            best = (wall, timeit.last_cpu)
    out[key], CPU[key] = best
    if os.environ.get("ASYNCINFER_BENCH_VERBOSE"):
        print(f"    ... {key}: {out[key]:.2f} us", file=sys.stderr, flush=True)


CPU = {}  # name -> CPU µs per request of the calling thread, next to the wall-clock figure


def timeit(fn, n):
    """Wall-clock µs per request; the calling thread's CPU µs per request goes to CPU[...] (a
    figure that load from other processes on the machine barely moves)."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    fn(n)
    wall = (time.perf_counter() - t0) / n * 1e6
    timeit.last_cpu = (time.thread_time() - c0) / n * 1e6
    return wall


def noop_costs(n):
    """Per-request figures from one Python thread on builtin:identity (µs)."""
    import numpy as np

    import asyncinfer
    e = asyncinfer.Engine(NOOP, "cpu")
    x = np.zeros((1, 1, 32, 32), np.float32)
    for _ in range(5000):
        e.submit(x).result()
    W = 256
    out = {}

    def windowed(k, submit=e.submit, share=False):
        for _ in range(k // W):
            fs = [submit(x, share_inputs=share) for _ in range(W)]
            for f in fs:
                f.result()

    put(out, "windowed futures (256 in flight)", windowed, n)
    put(out, "windowed futures, share_inputs=True", lambda k: windowed(k, share=True), n)
    tiny_engine = asyncinfer.Engine("builtin:identity", "cpu")
    tiny = np.zeros((1, 4), np.float32)

    def windowed_tiny(k):
        for _ in range(k // W):
            fs = [tiny_engine.submit(tiny) for _ in range(W)]
            for f in fs:
                f.result()

    put(out, "windowed futures, input f32[1,4] (16 bytes)", windowed_tiny, n)
    tiny_engine.shutdown()

    def sequential(k):
        for _ in range(k):
            e.submit(x).result()

    put(out, "sequential submit().result() (1 in flight)", sequential, n // 10)

    def infer(k):
        for _ in range(k):
            e.infer(x)

    put(out, "sequential infer()", infer, n // 10)

    # Split of the windowed loop: submit calls, then result calls on finished futures.
    sub = res = sub_cpu = res_cpu = 0.0
    for _ in range(n // W):  # one pass: the sum over many windows
        c0, t0 = time.thread_time(), time.perf_counter()
        fs = [e.submit(x) for _ in range(W)]
        c1, t1 = time.thread_time(), time.perf_counter()
        concurrent.futures.wait(fs)  # let them finish, untimed
        c2, t2 = time.thread_time(), time.perf_counter()
        for f in fs:
            f.result()
        c3, t3 = time.thread_time(), time.perf_counter()
        sub, sub_cpu = sub + t1 - t0, sub_cpu + c1 - c0
        res, res_cpu = res + t3 - t2, res_cpu + c3 - c2
    key = "  of which submit() (convert + copy + validate + enqueue + Future)"
    out[key], CPU[key] = sub / n * 1e6, sub_cpu / n * 1e6
    key = "  of which result() on a finished future (numpy view)"
    out[key], CPU[key] = res / n * 1e6, res_cpu / n * 1e6
    done = e.submit(x)
    done.result()
    put(out, "pybind11 call floor: Future.done()",
        lambda k: [done.done() for _ in range(k)], n)
    put(out, "pybind11 call floor: Engine.status(id)",
        lambda k: [e.status("none") for _ in range(k)], n)

    # Callbacks: one GIL hand-off per request to the completion thread.
    def callbacks(k):
        sem = threading.Semaphore(0)
        for _ in range(k // W):
            for _ in range(W):
                e.submit(x, callback=lambda r: sem.release())
            for _ in range(W):
                sem.acquire()

    put(out, "windowed submit(callback=) (GIL taken per callback)", callbacks, n)

    # The pure-Python alternative: a concurrent.futures.Future resolved from the callback.
    def python_futures(k):
        for _ in range(k // W):
            fs = []
            for _ in range(W):
                f = concurrent.futures.Future()
                e.submit(x, callback=f.set_result)
                fs.append(f)
            for f in fs:
                f.result()

    put(out, "same with concurrent.futures.Future (pure Python)", python_futures, n)
    put(out, "  concurrent.futures.Future() creation alone",
        lambda k: [concurrent.futures.Future() for _ in range(k)], n)

    import asyncio

    async def gather(k):
        for _ in range(k // W):
            await asyncio.gather(*(e.submit(x) for _ in range(W)))

    put(out, "asyncio.gather over asyncinfer.Future (256 at a time)",
        lambda k: asyncio.run(gather(k)), n // 4)

    q = asyncinfer.AsyncInferQueue(e, W)
    q.set_callback(lambda out_, data: None)

    def aiq(k):
        for _ in range(k):
            q.start_async(x)
        q.wait_all()

    put(out, "AsyncInferQueue.start_async (256 jobs)", aiq, n)
    e.shutdown()
    return out


def noop_article(n):
    """The article's designs with a no-op model, same driver (bursts of 32)."""
    import numpy as np
    x = np.zeros((1, 1, 32, 32), np.float32)
    out = {}
    for name in ("article-future", "article-consumers", "asyncinfer-future"):
        d = make_design(name, "noop", True)
        r = closed_loop(d, x, 3200 if name == "article-consumers" else n // 4)
        d.close()
        out[name] = r
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "data", "digits.pt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3200, help="closed-loop requests per run")
    ap.add_argument("--seconds", type=float, default=3.0, help="open-loop seconds per rate")
    ap.add_argument("--fractions", default="0.5,0.9",
                    help="open-loop rates as fractions of the best article design's throughput")
    ap.add_argument("--noop-requests", type=int, default=100_000,
                    help="requests per measurement of the no-op section (best of 5 runs)")
    ap.add_argument("--engine-options", default=json.dumps(ENGINE_OPTIONS),
                    help="asyncinfer.Engine keyword arguments for the digits model, as JSON")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--only", choices=["digits", "noop"], help="one section")
    ap.add_argument("--design", help=argparse.SUPPRESS)
    ap.add_argument("--rates", type=lambda s: [float(v) for v in s.split(",")], default=[],
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.design:
        return run_design(args)

    report = {}
    designs = ["article-future", "article-consumers", "asyncinfer-future", "asyncinfer-id"]
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.only in (None, "digits"):
        table, best, rates = compare(args.model, designs, args.requests, args.rounds, args.seconds,
                                     fractions, args.engine_options)
        print_table(f"digits model ({os.path.basename(args.model)}), medians of {args.rounds} "
                    f"rounds; asyncinfer.Engine(**{args.engine_options})", table, best, rates)
        report["digits"] = {"table": table, "best_article": best, "rates": rates}
    if args.only in (None, "noop"):
        print("\nno-op model, one Python thread (builtin:identity; the article designs run an "
              "identity function)")
        art = noop_article(args.noop_requests)
        for name, r in art.items():
            print(f"  {name:20} bursts of 32: {r['rps']:>10,.0f} req/s, p50 {r['p50_us']:,.0f} us")
        costs = noop_costs(args.noop_requests)
        print(f"  per request (µs), asyncinfer, best of {REPEATS} runs:")
        print(f"    {'':66} {'wall':>9}  {'(rate)':>12}  {'CPU of this thread':>18}")
        for k, v in costs.items():
            cpu = f"{CPU[k]:7.2f} us" if k in CPU else ""
            print(f"    {k:66} {v:6.2f} us  ({1e6 / v:>10,.0f}/s)  {cpu:>18}")
        report["noop"] = {"article": art, "costs_us": costs, "cpu_us": dict(CPU)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
