"""Deadlines, cancellation, limits and shutdown of `asyncinfer serve`: a request timeout behind
long work answers 504 on time; a client that disconnects frees its slot; SIGTERM under load
answers every accepted request and exits 0 within the drain timeout; a second signal cancels the
drain; connection limit and idle timeout; memory and file descriptors flat over 100,000
requests.

The `slow` model of examples/model_repository runs one request at a time on the simulated
device, each occupying it for as many microseconds as its first element says."""

import json
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import EXAMPLE_REPOSITORY, Repository, Server, builtin_config, http_status

SLOW = "/v2/models/slow/infer"


def slow_body(cost_us, timeout_us=None, rid=None):
    body = {"inputs": [{"name": "input0", "shape": [1, 1], "datatype": "FP32",
                        "data": [float(cost_us)]}]}
    if timeout_us is not None:
        body["parameters"] = {"timeout": timeout_us}
    if rid is not None:
        body["id"] = rid
    return json.dumps(body)


def slow_request_bytes(cost_us):
    body = slow_body(cost_us)
    return ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (SLOW, len(body), body)).encode()


def metric(server, family, **labels):
    text = requests.get(server.metrics_url, timeout=10).text
    for f in text_string_to_metric_families(text):
        if f.name == family:
            for s in f.samples:
                if all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
    return 0.0


def post_in_thread(url, body, results, key, timeout=30):
    def run():
        start = time.monotonic()
        try:
            r = requests.post(url, data=body, timeout=timeout)
            results[key] = (r.status_code, r.text, time.monotonic() - start)
        except requests.RequestException as e:  # recorded, asserted by the test
            results[key] = (None, repr(e), time.monotonic() - start)
    t = threading.Thread(target=run)
    t.start()
    return t


def proc_usage(pid):
    with open("/proc/%d/status" % pid) as f:
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))
    fds = len(os.listdir("/proc/%d/fd" % pid))
    return rss, fds


class Deadlines(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(EXAMPLE_REPOSITORY).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_timeout_behind_long_work_answers_504_on_time(self):
        results = {}
        busy = post_in_thread(self.server.url + SLOW, slow_body(1_500_000), results, "busy")
        time.sleep(0.2)  # the long request occupies the only worker
        start = time.monotonic()
        r = requests.post(self.server.url + SLOW, data=slow_body(1000, timeout_us=100_000),
                          timeout=30)
        took = time.monotonic() - start
        self.assertEqual(r.status_code, 504, r.text)
        self.assertIn("timed out", r.json()["error"])
        self.assertGreaterEqual(took, 0.09)
        self.assertLess(took, 1.0)  # on time: long before the 1.5 s of work ahead of it ends
        busy.join()
        self.assertEqual(results["busy"][0], 200, results["busy"])

    def test_priority_orders_queued_requests(self):
        # Behind 2 s of work: a priority-3 request queued first, a priority-1 one after it (the
        # margins are for a loaded machine, where a client thread may start late).
        results = {}
        busy = post_in_thread(self.server.url + SLOW, slow_body(2_000_000), results, "busy")
        time.sleep(0.4)
        done = []

        def send(name, priority):
            body = json.loads(slow_body(200_000, rid=name))  # 0.2 s apart at the end
            body["parameters"] = {"priority": priority}
            r = requests.post(self.server.url + SLOW, data=json.dumps(body), timeout=30)
            done.append((name, r.status_code))

        low = threading.Thread(target=send, args=("low", 3))
        low.start()
        time.sleep(0.4)
        high = threading.Thread(target=send, args=("high", 1))
        high.start()
        for t in (busy, low, high):
            t.join(30)
        self.assertEqual(done, [("high", 200), ("low", 200)])

    def test_disconnect_cancels_and_frees_the_slot(self):
        before = metric(self.server, "asyncinfer_inference_request_cancelled", model="slow")
        s = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10)
        s.sendall(slow_request_bytes(5_000_000))  # 5 s of work
        time.sleep(0.3)
        s.close()  # the client goes away
        start = time.monotonic()
        r = requests.post(self.server.url + SLOW, data=slow_body(1000), timeout=30)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertLess(time.monotonic() - start, 2.0)  # the 5 s request no longer holds the device
        deadline = time.monotonic() + 5
        while metric(self.server, "asyncinfer_inference_request_cancelled", model="slow") <= before:
            self.assertLess(time.monotonic(), deadline, "the engine request was not cancelled")
            time.sleep(0.05)


class Limits(harness.unittest.TestCase):
    def test_connection_limit(self):
        with Server(EXAMPLE_REPOSITORY, "--max-connections", "4") as server:
            held = [socket.create_connection(("127.0.0.1", server.http_port)) for _ in range(4)]
            try:
                time.sleep(0.2)
                s = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
                raw = b""
                while True:
                    c = s.recv(65536)
                    if not c:
                        break
                    raw += c
                s.close()
                self.assertEqual(http_status(raw), 429, raw)
                self.assertIn(b"too many connections", raw)
                self.assertGreaterEqual(metric(server, "asyncinfer_http_connections_rejected"), 1)
            finally:
                for h in held:
                    h.close()
            time.sleep(0.2)
            self.assertEqual(requests.get(server.url + "/v2/health/ready", timeout=10).status_code,
                             200)

    def test_idle_timeout_closes(self):
        with Server(EXAMPLE_REPOSITORY, "--idle-timeout", "0.3") as server:
            s = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
            start = time.monotonic()
            self.assertEqual(s.recv(1), b"")  # closed by the server
            self.assertLess(time.monotonic() - start, 3)
            s.close()

    def test_slow_steady_reader_gets_the_whole_response(self):
        # The idle timeout applies to a response without progress, not to its whole write: a
        # client reading a 4 MB answer over ~1.5 s gets all of it with --idle-timeout 0.3, and
        # one that stops reading is closed.
        repo = Repository()
        repo.add("big", builtin_config("big", "builtin:identity?shape=-1&max_batch_size=0",
                                       [("input0", "TYPE_FP32", [-1])],
                                       [("output0", "TYPE_FP32", [-1])], max_batch_size=0))
        n = 1 << 21  # zeros: "0," a value, about 4 MB of JSON
        raw_in = b"\0" * (4 * n)
        header = json.dumps({"inputs": [{"name": "input0", "shape": [n], "datatype": "FP32",
                                         "parameters": {"binary_data_size": len(raw_in)}}]})
        request = (b"POST /v2/models/big/infer HTTP/1.1\r\nHost: x\r\n"
                   b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                   % (len(header), len(header) + len(raw_in)) + header.encode() + raw_in)

        def fetch(server, pause_s, per_read_s):
            c = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            c.sendall(request)
            time.sleep(pause_s)
            got = b""
            try:
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    got += d
                    time.sleep(per_read_s)
                    if len(got) > 8 << 20:
                        break
            finally:
                c.close()
            head, _, body = got.partition(b"\r\n\r\n")
            m = re.search(rb"Content-Length: (\d+)", head)
            return int(m.group(1)) if m else -1, len(body)

        try:
            with Server(repo.path, "--idle-timeout", "0.3") as server:
                start = time.monotonic()
                length, read = fetch(server, 0, 0.02)
                self.assertGreater(time.monotonic() - start, 0.6)  # it did outlast the timeout
                self.assertGreater(length, 4_000_000)
                self.assertEqual(read, length)
                length, read = fetch(server, 2.0, 0)  # stops reading: closed after 0.3 s
                self.assertLess(read, length)
        finally:
            repo.cleanup()


class Shutdown(harness.unittest.TestCase):
    def test_sigterm_under_load(self):
        server = Server(EXAMPLE_REPOSITORY, "--drain-timeout", "10").start()
        try:
            outcomes = []
            lock = threading.Lock()
            stop = threading.Event()

            def client():
                session = requests.Session()
                while not stop.is_set():
                    start = time.monotonic()
                    try:
                        r = session.post(server.url + SLOW, data=slow_body(40_000), timeout=30)
                        status = r.status_code
                    except requests.RequestException:
                        status = None  # refused: the server no longer accepts connections
                    with lock:
                        outcomes.append((start, time.monotonic(), status))
                    if status is None:
                        return

            threads = [threading.Thread(target=client) for _ in range(6)]
            for t in threads:
                t.start()
            time.sleep(0.8)
            signalled = time.monotonic()
            server.signal(signal.SIGTERM)
            code = server.wait(15)
            exited = time.monotonic()
            stop.set()
            for t in threads:
                t.join(30)
            self.assertEqual(code, 0, server.log())
            self.assertLess(exited - signalled, 10.0)
            self.assertIn("drained", server.log())
            accepted = [o for o in outcomes if o[0] < signalled - 0.05]
            self.assertGreater(len(accepted), 5)
            # Requests sent (well) before the signal all ended with their answer.
            self.assertTrue(all(o[2] == 200 for o in accepted), accepted)
            # After it: answered (200 while draining, 503 once stopped) or refused; none hung.
            self.assertTrue(all(o[2] in (200, 503, None) for o in outcomes), outcomes)
        finally:
            server.stop()

    def test_readiness_false_at_once(self):
        server = Server(EXAMPLE_REPOSITORY, "--drain-timeout", "10").start()
        try:
            results = {}
            busy = post_in_thread(server.url + SLOW, slow_body(1_000_000), results, "busy")
            # A readiness probe whose header is half sent when the signal comes.
            probe = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
            probe.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHo")
            time.sleep(0.3)
            server.signal(signal.SIGTERM)
            server.wait_line("received SIGTERM")
            probe.sendall(b"st: x\r\n\r\n")
            raw = b""
            while True:
                c = probe.recv(65536)
                if not c:
                    break
                raw += c
            probe.close()
            self.assertEqual(http_status(raw), 503, raw)  # not ready any more
            self.assertIn(b"shutting down", raw)
            self.assertIn(b"Connection: close", raw)
            # New connections are refused.
            with self.assertRaises(OSError):
                socket.create_connection(("127.0.0.1", server.http_port), timeout=2)
            busy.join(10)
            self.assertEqual(results["busy"][0], 200, results)  # the accepted request finishes
            self.assertEqual(server.wait(15), 0)
        finally:
            server.stop()

    def test_second_signal_cancels_the_drain(self):
        server = Server(EXAMPLE_REPOSITORY, "--drain-timeout", "30").start()
        try:
            results = {}
            t = post_in_thread(server.url + SLOW, slow_body(5_000_000), results, "long")
            time.sleep(0.3)
            start = time.monotonic()
            server.signal(signal.SIGTERM)
            time.sleep(0.3)
            server.signal(signal.SIGINT)
            self.assertEqual(server.wait(10), 0)
            t.join(10)
            self.assertLess(time.monotonic() - start, 3.0)  # not the 5 s of work, nor 30 s
            self.assertEqual(results["long"][0], 503, results)
            server.wait_line("cancelling the drain")
        finally:
            server.stop()

    def test_drain_timeout_bounds_shutdown(self):
        server = Server(EXAMPLE_REPOSITORY, "--drain-timeout", "0.5").start()
        try:
            results = {}
            t = post_in_thread(server.url + SLOW, slow_body(5_000_000), results, "long")
            time.sleep(0.3)
            start = time.monotonic()
            server.signal(signal.SIGTERM)
            self.assertEqual(server.wait(10), 0)
            t.join(10)
            self.assertLess(time.monotonic() - start, 2.5)
            self.assertEqual(results["long"][0], 503, results)
        finally:
            server.stop()


def assert_microseconds_flag_range(test, flag):
    """`serve` refuses `flag` (a 0..1000 µs option) at -1 and 1001, naming it and its range."""
    for bad in ("-1", "1001"):
        p = subprocess.run([harness.ARGS.cli, "serve", "--model-repository", EXAMPLE_REPOSITORY,
                            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                            flag, bad],
                           capture_output=True, text=True, timeout=30)
        test.assertNotEqual(p.returncode, 0)
        test.assertIn(flag, p.stderr)
        test.assertIn("1000", p.stderr)


class IoSpin(harness.unittest.TestCase):
    """--http-spin-wait-us (HttpOptions::spin_wait): an I/O thread whose one request is in an
    engine spins for the answer before it sleeps. Whatever the spin, every request gets its own
    answer: one at a time, eight at once (the spin off and on as the count moves), answers that
    come later than the spin (the slow model), and an idle server spends no CPU on it."""

    def identity(self, server, values, session):
        body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                                       "data": values}]})
        r = session.post("http://127.0.0.1:%d/v2/models/identity/infer" % server.http_port,
                         data=body, timeout=10)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["outputs"][0]["data"], values)

    def test_every_request_answered_whatever_the_spin(self):
        for spin in ("0", "50", "1000"):
            with self.subTest(spin=spin), Server(EXAMPLE_REPOSITORY, "--http-spin-wait-us",
                                                  spin) as server:
                with requests.Session() as s:
                    for i in range(300):
                        self.identity(server, [float(i * 16 + k) for k in range(16)], s)

                errors = []

                def client(c):
                    try:
                        with requests.Session() as s:
                            for i in range(100):
                                self.identity(server, [float(c * 10_000 + i * 16 + k)
                                                       for k in range(16)], s)
                    except Exception as e:  # recorded, asserted below
                        errors.append(repr(e))

                threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                self.assertFalse(any(t.is_alive() for t in threads), "a client hung")
                self.assertEqual(errors, [])

                # Answers that come after the spin ran out: 2 ms each on the simulated device.
                with requests.Session() as s:
                    for _ in range(20):
                        r = s.post(server.url + SLOW, data=slow_body(2000), timeout=10)
                        self.assertEqual(r.status_code, 200, r.text)
                        self.assertEqual(r.json()["outputs"][0]["data"], [2000.0])

                # Idle: nothing awaited, so nothing spins.
                t0 = cpu_seconds(server.proc.pid)
                time.sleep(1)
                self.assertLess(cpu_seconds(server.proc.pid) - t0, 0.05)

    def test_io_threads_are_one_per_core_the_process_may_use(self):
        # --http-threads 0 counted the machine's cores, so a server under `taskset -c 0` ran two
        # I/O threads on one core.
        cpu = min(os.sched_getaffinity(0))
        p = subprocess.Popen([harness.ARGS.cli, "serve", "--model-repository", EXAMPLE_REPOSITORY,
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        try:
            line = ""
            deadline = time.monotonic() + 30
            while "http: listening" not in line and time.monotonic() < deadline:
                line = p.stderr.readline()
                if not line:
                    break
            self.assertIn("(1 I/O threads)", line)
        finally:
            p.terminate()
            p.communicate(timeout=30)

    def test_out_of_range_is_refused_by_name(self):
        assert_microseconds_flag_range(self, "--http-spin-wait-us")


def worker_wakeups(pid):
    """Voluntary context switches so far of the engine worker threads (ai-worker-N) of process
    `pid`: a worker asleep for work that is woken for a request adds one."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if not f.read().startswith("ai-worker-"):
                    continue
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                total += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", f.read(),
                                       re.M).group(1))
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return total


class CallerRuns(harness.unittest.TestCase):
    """--http-caller-run-us (HttpOptions::caller_run): an I/O thread runs a request itself when an
    engine worker sleeps on an empty queue and the model is fast on the cpu device. The worker is
    then not woken at all; with the option at 0 it is woken once a request."""

    def run_spaced(self, server, n):
        """`n` identity requests, one at a time, 2 ms apart (the worker falls asleep between)."""
        with requests.Session() as s:
            for i in range(n):
                values = [float(i * 16 + k) for k in range(16)]
                body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16],
                                               "datatype": "FP32", "data": values}]})
                r = s.post("http://127.0.0.1:%d/v2/models/identity/infer" % server.http_port,
                           data=body, timeout=10)
                self.assertEqual(r.status_code, 200, r.text)
                self.assertEqual(r.json()["outputs"][0]["data"], values)
                time.sleep(0.002)

    def test_the_io_thread_runs_the_request_and_the_worker_sleeps_on(self):
        for flag, woken in (([], False), (["--http-caller-run-us", "0"], True)):
            with self.subTest(flag=flag), Server(EXAMPLE_REPOSITORY, *flag) as server:
                self.run_spaced(server, 10)  # the engine has measured its batches
                before = worker_wakeups(server.proc.pid)
                self.run_spaced(server, 200)
                wakeups = worker_wakeups(server.proc.pid) - before
                # Measured: 0 with the default, 200 with the option at 0.
                if woken:
                    self.assertGreaterEqual(wakeups, 150, "worker wake-ups for 200 requests")
                else:
                    self.assertLess(wakeups, 40, "worker wake-ups for 200 requests")

    def test_out_of_range_is_refused_by_name(self):
        assert_microseconds_flag_range(self, "--http-caller-run-us")


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Soak(harness.unittest.TestCase):
    def test_memory_and_fds_flat_over_100000_requests(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with Server(EXAMPLE_REPOSITORY) as server:
            body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                                           "data": [0.5] * 16}]})
            one = ("POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                   "\r\n%s" % (len(body), body)).encode()

            def blast(n, window=32):
                """n requests, pipelined `window` at a time, on 2 connections at once."""
                errors = []

                def conn(count):
                    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
                    buf = b""
                    done = 0
                    try:
                        while done < count:
                            k = min(window, count - done)
                            s.sendall(one * k)
                            got = 0
                            while got < k:
                                end = buf.find(b"\r\n\r\n")
                                if end < 0:
                                    c = s.recv(1 << 20)
                                    if not c:
                                        raise RuntimeError("closed")
                                    buf += c
                                    continue
                                head = buf[:end]
                                length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
                                if len(buf) < end + 4 + length:
                                    c = s.recv(1 << 20)
                                    if not c:
                                        raise RuntimeError("closed")
                                    buf += c
                                    continue
                                if not head.startswith(b"HTTP/1.1 200"):
                                    errors.append(head)
                                buf = buf[end + 4 + length:]
                                got += 1
                            done += k
                    finally:
                        s.close()

                threads = [threading.Thread(target=conn, args=(n // 2,)) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                self.assertEqual(errors, [])

            blast(10_000)  # warm-up: allocator pools, buffers, histograms
            time.sleep(0.2)
            rss0, fds0 = proc_usage(server.proc.pid)
            blast(100_000)
            time.sleep(0.2)
            rss1, fds1 = proc_usage(server.proc.pid)
            self.assertEqual(fds1, fds0)
            with open("/proc/%d/maps" % server.proc.pid) as f:
                sanitized = any(lib in f.read() for lib in ("libasan", "libtsan"))
            if not sanitized:  # ASan's quarantine and TSan's shadow memory grow by design
                self.assertLess(rss1 - rss0, 16 * 1024, (rss0, rss1))  # kB
            self.assertGreaterEqual(
                metric(server, "asyncinfer_inference_request_success", model="identity",
                       version="2"), 110_000)


if __name__ == "__main__":
    harness.main()
