"""Hostile clients (issue 23): each attack that once knocked `asyncinfer serve` over, reproduced on
loopback and bounded in time, with what the server must do instead.

- File descriptors: connections past the process's limit on either port (and accept() failing
  with EMFILE) make the server not ready, with the reason, on HTTP, gRPC ServerReady and
  grpc.health.v1; once they close both ports serve again within a second.
- Memory: trailers count against --max-header-bytes (431, never a dropped connection); a JSON body
  with far more numbers than its shape stops at the first one too many, so four 64 MB bodies cost
  their own bytes and no more, while health probes keep answering within 50 ms; requests in
  flight share --max-inflight-bytes (503 / RESOURCE_EXHAUSTED past it).
- HTTP/2: SETTINGS carry MAX_CONCURRENT_STREAMS; a client that opens 100,000 streams on a
  zero-window connection is cut off; SIGTERM ends within the drain timeout + 1 s however many
  streams are stuck; rapid reset (CVE-2023-44487) leaves memory flat and other clients served.

The probes that measure latency run in processes of their own (probes.py), so that the attacker's
Python in this process does not slow them down."""

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import requests

import harness
from harness import EXAMPLE_REPOSITORY, Repository, Server, builtin_config, http_status, rss_mb

HERE = os.path.dirname(os.path.abspath(__file__))
INFER = "/v2/models/identity/infer"
GOOD_BODY = json.dumps({"inputs": [{"name": "input0", "shape": [1, 16], "datatype": "FP32",
                                    "data": list(range(16))}]}).encode()


def raise_own_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def thread_cpu_s(pid, name):
    """CPU seconds (user + system) of the threads of process `pid` named `name` (their comm)."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() != name:
                    continue
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return total


def start_probe(kind, port, seconds):
    args = [sys.executable, os.path.join(HERE, "probes.py"), kind, str(port), str(seconds)]
    if kind == "grpc":
        args.append(harness.ARGS.grpc_stubs)
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def probe_result(proc, timeout=60):
    out, _ = proc.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


def get(sock, path):
    """One GET on a keep-alive connection: (status, body)."""
    sock.sendall(("GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path).encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection after %r" % reply)
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-body")
        body += chunk
    return http_status(reply), body


def hold_connections(port, n):
    """Opens n TCP connections (those the server closes at once included)."""
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    return socks


def grpc_infer(target, timeout=2):
    import grpc_client
    ch = grpc_client.channel(target)
    try:
        r = grpc_client.stub(ch).ModelInfer(
            grpc_client.infer_request("identity", [("input0", "FP32", [1, 16], [2.0] * 16)]),
            timeout=timeout)
        return grpc_client.unpack("FP32", grpc_client.output(r, "output0")[2]) == [2.0] * 16
    finally:
        ch.close()


def cpu_seconds(pid):
    """User + system CPU seconds of a process (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serves_again_within(check, seconds):
    """Retries `check` until it is true; the seconds it took, or None past `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            if check():
                return time.monotonic() - start
        except (OSError, grpc.RpcError, requests.RequestException):
            pass
        time.sleep(0.02)
    return None


class FileDescriptors(harness.unittest.TestCase):
    """The server under `ulimit -n 400`, and 450 connections to one port."""

    NOFILE = 400

    @classmethod
    def setUpClass(cls):
        raise_own_fd_limit()

    def flood(self, port_name):
        import grpc_client
        # The held connections send nothing: no timeout may close them meanwhile (a slow machine
        # can take seconds to open 450), or the port would rightly accept again mid-test.
        with Server(EXAMPLE_REPOSITORY, "--header-timeout", "600", "--idle-timeout", "600",
                    nofile=self.NOFILE) as server:
            port = server.http_port if port_name == "http" else server.grpc_port
            probe = socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
            ch = grpc_client.channel(server.grpc_target)
            stub, health = grpc_client.stub(ch), grpc_client.health_stub(ch)
            self.assertTrue(stub.ServerReady(grpc_client.pb.ServerReadyRequest(), timeout=5).ready)
            self.assertEqual(get(probe, "/v2/health/ready")[0], 200)

            start = time.monotonic()
            socks = hold_connections(port, 450)
            opened = time.monotonic() - start
            try:
                server.wait_line(r"%s: refusing connections" % port_name)
                # While the port cannot take more, every readiness answer says so.
                status, body = get(probe, "/v2/health/ready")
                self.assertEqual(status, 503, "%r (%.1f s to open the connections)\n%s"
                                 % (body, opened, server.log()))
                self.assertIn(port_name + ": ", json.loads(body)["error"])
                self.assertFalse(
                    stub.ServerReady(grpc_client.pb.ServerReadyRequest(), timeout=5).ready)
                check = health.Check(grpc_client.health_pb2.HealthCheckRequest(service=""),
                                     timeout=5)
                self.assertEqual(check.status,
                                 grpc_client.health_pb2.HealthCheckResponse.NOT_SERVING)
                time.sleep(2)
            finally:
                for s in socks:
                    s.close()
            # Both ports serve again within a second, on new connections.
            took = serves_again_within(lambda: grpc_infer(server.grpc_target), 1.0)
            self.assertIsNotNone(took, "gRPC does not serve 1 s after the connections closed:\n"
                                 + server.log())
            took = serves_again_within(
                lambda: requests.post(server.url + INFER, data=GOOD_BODY, timeout=1)
                .status_code == 200, 1.0)
            self.assertIsNotNone(took, "HTTP does not serve 1 s after the connections closed")
            self.assertIsNotNone(serves_again_within(
                lambda: requests.get(server.url + "/v2/health/ready", timeout=1).status_code
                == 200, 1.0))
            server.wait_line(r"%s: accepting connections again" % port_name)
            probe.close()
            ch.close()

    def test_grpc_port_past_the_descriptor_limit(self):
        self.flood("grpc")

    def test_http_port_past_the_descriptor_limit(self):
        self.flood("http")

    def test_accept_failing_with_emfile(self):
        # The limit lowered under a running server: accept() itself fails (EMFILE), which no
        # connection budget can prevent; the listener drains its backlog instead of spinning or
        # dying, says so, and recovers.
        with Server(EXAMPLE_REPOSITORY) as server:
            probe = socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
            # Answered before the limit drops: a connection still in the backlog at the
            # limit is shed (accepted on the spare descriptor and closed), by design.
            self.assertEqual(get(probe, "/v2/health/ready")[0], 200)
            open_now = len(os.listdir("/proc/%d/fd" % server.proc.pid))
            hard = resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)[1]
            resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (open_now + 20, hard))
            try:
                socks = hold_connections(server.grpc_port, 60) + \
                    hold_connections(server.http_port, 60)
                server.wait_line(r"accept\(\) failed: Too many open files")
                status, body = get(probe, "/v2/health/ready")
                self.assertEqual(status, 503, body)
                self.assertIn("accept() failed", json.loads(body)["error"])
                for s in socks:
                    s.close()
            finally:
                resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (hard, hard))
            self.assertIsNotNone(serves_again_within(lambda: grpc_infer(server.grpc_target), 1.0),
                                 server.log())
            self.assertIsNotNone(serves_again_within(
                lambda: requests.post(server.url + INFER, data=GOOD_BODY, timeout=1)
                .status_code == 200, 1.0))
            self.assertIsNotNone(serves_again_within(
                lambda: get(probe, "/v2/health/ready")[0] == 200, 1.0), server.log())
            probe.close()


    def test_no_spin_at_the_exact_limit(self):
        # At exactly its limit Linux's accept() fails with EMFILE whether or not a connection
        # waits: the listeners must wait for the socket, not spin (found by a hostile review).
        with Server(EXAMPLE_REPOSITORY) as server:
            pid = server.proc.pid
            open_now = len(os.listdir("/proc/%d/fd" % pid))
            hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_now, hard))
            try:
                for port in (server.grpc_port, server.http_port, server.metrics_port):
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
                time.sleep(0.5)
                cpu0 = cpu_seconds(pid)
                time.sleep(1.0)
                used = cpu_seconds(pid) - cpu0
            finally:
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
            self.assertLess(used, 0.3, "the server used %.2f CPU-s in 1 s at its limit" % used)
            self.assertIsNotNone(serves_again_within(lambda: grpc_infer(server.grpc_target), 2.0),
                                 server.log())
            self.assertIsNotNone(serves_again_within(
                lambda: requests.get(server.url + "/v2/health/ready", timeout=1).status_code
                == 200, 2.0), server.log())

    def test_io_threads_open_their_event_loops_at_start(self):
        # Each HTTP I/O thread runs an event loop of its own (an epoll descriptor, an eventfd, a
        # timerfd). Opened with the first connection placed on its thread, at a moment when
        # descriptors had run out, the failure escaped the accept handler and the port never
        # accepted again (found when the loops were split per thread).
        with Server(EXAMPLE_REPOSITORY, "--http-threads", "8") as server:
            pid = server.proc.pid
            open_now = len(os.listdir("/proc/%d/fd" % pid))
            hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
            # Room for the next connection, not for an event loop.
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_now + 2, hard))
            try:
                self.assertEqual(
                    requests.get(server.url + "/v2/health/live", timeout=5).status_code, 200)
            finally:
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
            # Connections placed on every thread in turn are answered.
            for _ in range(8):
                self.assertIsNotNone(serves_again_within(
                    lambda: requests.get(server.url + "/v2/health/live", timeout=1).status_code
                    == 200, 2.0), server.log())

    def test_connect_close_churn_does_not_fill_the_slots(self):
        # One client that connects and closes in a loop, never holding two at once: its closed
        # connections must not pile up in the count (found by a hostile review). A connection
        # still counts until gRPC has torn it down, which lags a tight loop of connects on two
        # busy cores, so the cap may be reached for moments (CI saw 90 to 280 of them in 2,000
        # connects); what must hold is that the count comes back down: every refusal is followed
        # by "accepting again", and the port serves at once after the loop.
        with Server(EXAMPLE_REPOSITORY, "--grpc-max-connections", "50") as server:
            for _ in range(2000):
                socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5).close()
            self.assertIsNotNone(serves_again_within(lambda: grpc_infer(server.grpc_target), 2.0),
                                 server.log())
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                log = server.log()
                if log.count("grpc: refusing connections") == \
                        log.count("grpc: accepting connections again"):
                    break
                time.sleep(0.05)
            self.assertEqual(log.count("grpc: refusing connections"),
                             log.count("grpc: accepting connections again"), log)

    def test_readiness_recovers_without_a_connection_to_the_failed_port(self):
        # accept() on the gRPC port fails once (EMFILE), then the limit is raised again: the
        # HTTP port, asked alone, reports ready again without any gRPC connection to prove it
        # (found by a hostile review: it stayed 503 for good, and a deadlock hid behind it).
        with Server(EXAMPLE_REPOSITORY) as server:
            probe = socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
            # Answered before the limit drops: a connection still in the backlog at the
            # limit is shed (accepted on the spare descriptor and closed), by design.
            self.assertEqual(get(probe, "/v2/health/ready")[0], 200)
            open_now = len(os.listdir("/proc/%d/fd" % server.proc.pid))
            hard = resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)[1]
            resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (open_now, hard))
            try:
                socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5).close()
                server.wait_line(r"grpc: refusing connections: .*Too many open files")
            finally:
                resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (hard, hard))
            self.assertIsNotNone(serves_again_within(
                lambda: get(probe, "/v2/health/ready")[0] == 200, 1.0), server.log())
            self.assertTrue(grpc_infer(server.grpc_target))
            probe.close()

    def test_silent_grpc_connections_are_closed(self):
        # Connections that never send the HTTP/2 preface hold no slot past --idle-timeout.
        with Server(EXAMPLE_REPOSITORY, "--grpc-max-connections", "5", "--idle-timeout",
                    "1") as server:
            silent = hold_connections(server.grpc_port, 6)  # the sixth is refused
            server.wait_line(r"grpc: refusing connections: at its connection limit of 5")
            start = time.monotonic()
            for s in silent:
                s.settimeout(5)
                while s.recv(65536):
                    pass  # the server's SETTINGS and GOAWAY, then its close
            self.assertLess(time.monotonic() - start, 4)
            self.assertIsNotNone(serves_again_within(lambda: grpc_infer(server.grpc_target), 2.0),
                                 server.log())
            for s in silent:
                s.close()


class MemoryBounds(harness.unittest.TestCase):
    def test_trailers_count_against_the_header_limit(self):
        with Server(EXAMPLE_REPOSITORY) as server:
            rss0, _ = rss_mb(server.proc.pid)
            head = (b"POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n"
                    % (INFER.encode(), len(GOOD_BODY))) + GOOD_BODY + b"\r\n0\r\n"
            # 64 MB of trailer fields, sent while the answer is read.
            s = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
            s.sendall(head)
            line = b"X-Trailer: " + b"t" * 1000 + b"\r\n"

            def send():
                try:
                    for _ in range((64 << 20) // (len(line) * 64)):
                        s.sendall(line * 64)
                except OSError:
                    pass  # the server answered and closed

            sender = threading.Thread(target=send)
            sender.start()
            answer = s.recv(4096)
            sender.join(30)
            s.close()
            self.assertEqual(http_status(answer), 431, answer)
            self.assertIn(b"header and trailer fields exceed", answer)
            rss1, _ = rss_mb(server.proc.pid)
            self.assertLess(rss1 - rss0, 32, "trailers grew the server by %.0f MB" % (rss1 - rss0))

            # One trailer field of 100 KB: an answer, not a dropped connection.
            raw = harness.raw_request(server.http_port, head + b"X-Big: " + b"b" * 100_000 +
                                      b"\r\n\r\n")
            self.assertEqual(http_status(raw), 431, raw[:200])
            # A field past Beast's 64 KiB per field, with a header limit that would allow it.
        with Server(EXAMPLE_REPOSITORY, "--max-header-bytes", "1048576") as server:
            raw = harness.raw_request(server.http_port, head + b"X-Big: " + b"b" * 100_000 +
                                      b"\r\n\r\n")
            self.assertEqual(http_status(raw), 431, raw[:200])
            self.assertIn(b"longer than 65535 bytes", raw)
            self.assertEqual(requests.post(server.url + INFER, data=GOOD_BODY,
                                           timeout=10).status_code, 200)

    def test_json_with_too_many_numbers(self):
        # A body of 32M numbers for a [1,16] input, four at once: each answered 400 at the
        # seventeenth number, the server's peak memory growing by at most 1.5x the bodies, and
        # the health probes answered within 50 ms throughout.
        with Server(EXAMPLE_REPOSITORY) as server:
            self.assertEqual(requests.post(server.url + INFER, data=GOOD_BODY,
                                           timeout=10).status_code, 200)
            n = (64 << 20) // 2 - 64
            body = (b'{"inputs":[{"name":"input0","shape":[1,16],"datatype":"FP32","data":[' +
                    b"1," * (n - 1) + b"1]}]}")
            request = (b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                       % (INFER.encode(), len(body))) + body
            rss0, _ = rss_mb(server.proc.pid)
            probe = start_probe("health", server.http_port, 4)
            time.sleep(0.3)
            answers = [None] * 4

            def send(i):
                answers[i] = harness.raw_request(server.http_port, request, timeout=30)

            threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            _, peak = rss_mb(server.proc.pid)
            health = probe_result(probe)
            for a in answers:
                self.assertEqual(http_status(a), 400, a[:200] if a else a)
                self.assertIn(b'has more than 16 elements', a)
            growth = peak - rss0
            budget = 1.5 * 4 * len(body) / (1 << 20)
            print("4 x %.0f MB JSON bodies: peak RSS +%.0f MB (at most %.0f); health probes %s"
                  % (len(body) / 1e6, growth, budget, health))
            self.assertLessEqual(growth, budget)
            self.assertEqual(health["failures"], 0, health)
            self.assertLess(health["max_ms"], 50, health)

    def test_large_bodies_are_decoded_off_the_io_threads(self):
        # Legitimate large JSON requests and responses (300,000 numbers each way) are decoded
        # and encoded off the I/O threads: answered exactly, with the probes unhurt.
        repo = Repository()
        try:
            repo.add("wide", builtin_config("wide", "builtin:identity?shape=300000&max_batch=4",
                                            [("input0", "TYPE_FP32", [300000])],
                                            [("output0", "TYPE_FP32", [300000])], max_batch_size=4))
            with Server(repo.path) as server:
                data = [float(i % 1000) / 8 for i in range(300000)]
                body = json.dumps({"inputs": [{"name": "input0", "shape": [1, 300000],
                                               "datatype": "FP32", "data": data}]})
                probe = start_probe("health", server.http_port, 3)
                time.sleep(0.3)
                results = [None] * 4

                def send(i):
                    results[i] = requests.post(server.url + "/v2/models/wide/infer", data=body,
                                               timeout=60)

                threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                health = probe_result(probe)
                for r in results:
                    self.assertEqual(r.status_code, 200, r.text[:300])
                    self.assertEqual(r.json()["outputs"][0]["data"], data)
                self.assertEqual(health["failures"], 0, health)
                self.assertLess(health["max_ms"], 50, health)
        finally:
            repo.cleanup()

    def test_inflight_bytes_budget(self):
        repo = Repository()
        try:
            repo.add("wide", builtin_config("wide", "builtin:identity?shape=300000&max_batch=4",
                                            [("input0", "TYPE_FP32", [300000])],
                                            [("output0", "TYPE_FP32", [300000])], max_batch_size=4))
            with open(os.path.join(EXAMPLE_REPOSITORY, "identity", "config.pbtxt")) as f:
                repo.add("identity", f.read(), versions=(1, 2))
            with Server(repo.path, "--max-inflight-bytes", "1000000") as server:
                # Headers that announce bodies they never send hold nothing of the budget: it
                # counts the bytes that arrive (found by a hostile review).
                idle = [socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
                        for _ in range(4)]
                for c in idle:
                    c.sendall(b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: t\r\n"
                              b"Content-Length: 900000\r\n\r\n")
                time.sleep(0.3)
                self.assertEqual(requests.post(server.url + INFER, data=GOOD_BODY,
                                               timeout=10).status_code, 200)
                for c in idle:
                    c.close()
                # A body past the budget: refused as its bytes arrive.
                raw = harness.raw_request(server.http_port, (
                    b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000"
                    b"\r\n\r\n") + b" " * 1_500_000)
                self.assertEqual(http_status(raw), 503, raw[:300])
                self.assertIn(b"--max-inflight-bytes", raw)
                # A chunked body, counted as it grows.
                chunk = b" " * 500_000
                raw = harness.raw_request(server.http_port, (
                    b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                    b"chunked\r\n\r\n") + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 3)
                self.assertEqual(http_status(raw), 503, raw[:300])
                # gRPC: the decoded tensors (1.2 MB) are over it.
                import grpc_client
                ch = grpc_client.channel(server.grpc_target)
                with self.assertRaises(grpc.RpcError) as e:
                    grpc_client.stub(ch).ModelInfer(grpc_client.infer_request(
                        "wide", [("input0", "FP32", [1, 300000], [0.5] * 300000)]), timeout=10)
                self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertIn("--max-inflight-bytes", e.exception.details())
                ch.close()
                # Everyone else is served, and nothing stays held.
                self.assertEqual(requests.post(server.url + INFER, data=GOOD_BODY,
                                               timeout=10).status_code, 200)
                self.assertTrue(grpc_infer(server.grpc_target))
        finally:
            repo.cleanup()


class Http2Abuse(harness.unittest.TestCase):
    def test_settings_limit_streams_per_connection(self):
        import h2_attack
        with Server(EXAMPLE_REPOSITORY) as server:
            conn = h2_attack.Connection(server.grpc_port)
            self.assertTrue(conn.server_settings.wait(5))
            self.assertEqual(conn.server_max_streams, 100)
            conn.close()

    def test_100000_streams_on_a_zero_window_connection(self):
        import h2_attack
        with Server(EXAMPLE_REPOSITORY) as server:
            rss0, _ = rss_mb(server.proc.pid)
            for ack in (True, False):
                # With its SETTINGS acknowledged gRPC refuses a stream past the limit by itself;
                # a client that never acknowledges them is cut off by the frontend, once its
                # calls not ended pass twice the limit plus the allowance for gRPC's lag in
                # ending calls (GrpcAcceptor::kEndLag, 256): 456 with the default limit. That
                # bound must stay under what flow control lets this client send: its DATA frames
                # (101 bytes a call) spend the 64 KiB connection window after 648 calls.
                conn = h2_attack.Connection(server.grpc_port, window=0, ack=ack,
                                            ignore_stream_limit=True)
                if ack:
                    self.assertTrue(conn.server_settings.wait(5))
                message = h2_attack.identity_message()
                sent = 0
                try:
                    for i in range(100_000):
                        conn.open_call(message)
                        sent += 1
                        if i % 100 == 99:
                            conn.send_pending()
                            if conn.closed.is_set():
                                break
                except (OSError, h2_attack.h2.exceptions.ProtocolError):
                    pass  # the server closed the connection (GOAWAY read, or the socket)
                self.assertTrue(conn.closed.wait(10), "the connection was not closed")
                self.assertLess(sent, 2000, "sent %d streams before the server closed" % sent)
                conn.close()
                self.assertTrue(grpc_infer(server.grpc_target))
            rss1, _ = rss_mb(server.proc.pid)
            self.assertLess(rss1 - rss0, 64, "grew by %.0f MB" % (rss1 - rss0))
            server.wait_line(r"grpc: closing connection \d+: calls in progress passed")

    def test_zero_window_streams_of_every_method_are_counted(self):
        # Not only ModelInfer: streams of the methods answered without the engine (here
        # ModelMetadata) and health Watch streams (which never end by themselves) opened past the
        # limit on a zero window, SETTINGS never acknowledged, close the connection too. They
        # were not counted: 13,107 Watch streams fit in one connection's 64 KiB window and held
        # about 236 MB until something else closed it.
        import grpc_client
        import h2_attack
        metadata = h2_attack.grpc_message(grpc_client.pb.ModelMetadataRequest(name="identity"))
        watch = h2_attack.grpc_message(grpc_client.health_pb2.HealthCheckRequest(service=""))
        with Server(EXAMPLE_REPOSITORY) as server:
            rss0, _ = rss_mb(server.proc.pid)
            for path, message in (("/inference.GRPCInferenceService/ModelMetadata", metadata),
                                  ("/grpc.health.v1.Health/Watch", watch)):
                conn = h2_attack.Connection(server.grpc_port, window=0, ack=False,
                                            ignore_stream_limit=True)
                sent = 0
                try:
                    for i in range(20_000):
                        conn.open_call(message, path=path)
                        sent += 1
                        if i % 100 == 99:
                            conn.send_pending()
                            if conn.closed.is_set():
                                break
                    conn.send_pending()
                except (OSError, h2_attack.h2.exceptions.ProtocolError):
                    pass  # the server closed the connection
                self.assertTrue(conn.closed.wait(10), "%s: the connection was not closed" % path)
                self.assertLess(sent, 2000, "%s: sent %d streams before the server closed"
                                % (path, sent))
                conn.close()
                self.assertTrue(grpc_infer(server.grpc_target))
            rss1, _ = rss_mb(server.proc.pid)
            self.assertLess(rss1 - rss0, 64, "grew by %.0f MB" % (rss1 - rss0))
            server.wait_line(r"grpc: closing connection \d+: calls in progress passed")

    def test_sigterm_with_streams_stuck_on_zero_windows(self):
        import h2_attack
        with Server(EXAMPLE_REPOSITORY, "--drain-timeout", "2") as server:
            conns = []
            for _ in range(3):
                conn, sent = h2_attack.open_streams(server.grpc_port, 100, window=0,
                                                    ignore_stream_limit=False)
                self.assertEqual(sent, 100)
                conns.append(conn)
            time.sleep(0.5)
            self.assertFalse(any(c.closed.is_set() for c in conns))
            start = time.monotonic()
            server.signal(signal.SIGTERM)
            self.assertEqual(server.wait(10), 0)
            took = time.monotonic() - start
            # The drain's 2 s, then closing the 300 stuck calls and exiting: bounded, with 2 s
            # for the close and the exit on a loaded machine (CI saw 3.07 s while builds ran).
            self.assertLess(took, 4.0, "exit %.2f s after SIGTERM, drain timeout 2 s:\n%s"
                            % (took, server.log()))
            for c in conns:
                c.close()

    def test_rapid_reset(self):
        """At a rate the server keeps up with, the rapid-reset guard leaves memory flat: each
        attacking connection is closed, other clients are served, and the acceptor's thread stays
        idle while gRPC releases the closed connections.

        The attacker is paced at 10,000 calls a second. Unpaced, this process sends what its share
        of the two cores allows (170,000 to 260,000 calls in 10 s), and past the rate at which
        gRPC 1.51 hands calls to the server's reactors (about 20,000 a second here) its transport
        keeps accepting streams ahead of them, about 11 KB of call arena each, with no limit
        until the upstream mitigation of gRPC 1.57 (docs/performance.md, "Rapid reset faster
        than gRPC dispatches"). What that peak measures is the race for the cores, not the
        guard."""
        import h2_attack
        with Server(EXAMPLE_REPOSITORY) as server:
            before = probe_result(start_probe("grpc", server.grpc_port, 2))
            rss0, _ = rss_mb(server.proc.pid)
            accept_cpu0 = thread_cpu_s(server.proc.pid, "ai-grpc-accept")
            during = start_probe("grpc", server.grpc_port, 10)
            calls, connections = h2_attack.rapid_reset(server.grpc_port, 10, rate=10_000)
            during = probe_result(during)
            rss1, peak = rss_mb(server.proc.pid)
            accept_cpu = thread_cpu_s(server.proc.pid, "ai-grpc-accept") - accept_cpu0
            print("rapid reset: %d calls reset on %d connections in 10 s; server RSS %+.0f MB "
                  "(peak %+.0f); acceptor thread CPU %.2f s; another client before: %s, during: %s"
                  % (calls, connections, rss1 - rss0, peak - rss0, accept_cpu, before, during))
            self.assertGreater(calls, 10_000)
            self.assertGreater(connections, 10)  # each closed by the guard, long before 10 s
            self.assertLess(peak - rss0, 128)
            # The acceptor sleeps in epoll_wait between connections: a closed connection's
            # descriptor once stayed on its epoll set and woke it without pause (0.6 to 1.6 s of
            # CPU at this rate, 3 s unpaced; 0.01 s since).
            self.assertLess(accept_cpu, 0.2)
            self.assertEqual(during["failures"], 0, during)
            self.assertGreater(during["n"], 100, during)
            # Served throughout, not starved (the attacker shares the machine's two cores).
            self.assertLess(during["p99_ms"], 100, during)
            server.wait_line(r"grpc: closing connection \d+: ")


if __name__ == "__main__":
    harness.main()
