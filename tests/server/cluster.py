"""Several `asyncinfer serve` processes behind nginx on loopback, for the scale-out tests and the
benchmarks: nginx runs deploy/nginx/*.conf with only the addresses changed, under its own prefix
in a temporary folder (its own pid, temp and log files, free ports; never the system's nginx),
and h2load or a bounded gRPC client loop puts load on it.

Used by test_scaleout.py and scripts/bench_grpc.py."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import free_port

DEPLOY = os.path.join(harness.ROOT, "deploy", "nginx")

# A model on each server's own simulated accelerator: two workers on two compute engines, each
# request occupying one for 10 ms (no batching): 200 requests/s per server, whatever the host CPU.
SIM_CONFIG = """name: "sim"
backend: "builtin"
max_batch_size: 1
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU, count: 2 } ]
parameters { key: "uri" value { string_value: "builtin:fixed_cost?base_us=%d&shape=16&max_batch=1" } }
parameters { key: "device" value { string_value: "sim:compute_engines=2" } }
parameters { key: "max_inflight_per_worker" value { string_value: "1" } }
"""


def sim_repository(cost_us=10_000):
    repo = harness.Repository()
    repo.add("sim", SIM_CONFIG % cost_us)
    return repo


def render(conf_text, upstreams, listens, prefix):
    """deploy/nginx/*.conf with the addresses changed: the `server` lines of each upstream named
    in `upstreams` ({name: [port, ...]}) become one line per port on 127.0.0.1 (with the first
    line's parameters); `listen <port>` becomes `listen 127.0.0.1:<listens[port]>`; pid, error log
    and temp paths go under `prefix`."""
    out = []
    current = None
    done = set()
    for line in conf_text.splitlines():
        m = re.match(r"\s*upstream\s+(\S+)\s*\{", line)
        if m:
            current = m.group(1)
        elif current and line.strip() == "}":
            current = None
        s = re.match(r"(\s*)server\s+\S+:\d+(.*);", line)
        if current in upstreams and s:
            if current not in done:
                for port in upstreams[current]:
                    out.append("%sserver 127.0.0.1:%d%s;" % (s.group(1), port, s.group(2)))
                done.add(current)
            continue
        lm = re.match(r"(\s*)listen\s+(\d+)(.*);", line)
        if lm and int(lm.group(2)) in listens:
            line = "%slisten 127.0.0.1:%d%s;" % (lm.group(1), listens[int(lm.group(2))],
                                                  lm.group(3))
        out.append(line)
        if re.match(r"\s*worker_processes", line):
            out.append("pid %s/nginx.pid;" % prefix)
            out.append("error_log %s/error.log warn;" % prefix)
        if re.match(r"\s*http\s*\{", line):
            for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
                out.append("  %s_temp_path %s/%s_temp;" % (t, prefix, t))
    missing = set(upstreams) - done
    if missing:
        raise ValueError("no upstream %s in the configuration" % ", ".join(sorted(missing)))
    return "\n".join(out) + "\n"


class Nginx:
    """nginx in the foreground with a rendered configuration; stop() ends it (SIGQUIT, then
    SIGTERM, then SIGKILL)."""

    def __init__(self, conf_name, upstreams, listens):
        self.prefix = tempfile.mkdtemp(prefix="asyncinfer-nginx-")
        os.chmod(self.prefix, 0o755)  # worker processes run as an unprivileged user
        with open(os.path.join(DEPLOY, conf_name)) as f:
            text = render(f.read(), upstreams, listens, self.prefix)
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(text)
        self.listens = listens
        self.proc = None

    def start(self, timeout=10):
        self.proc = subprocess.Popen(
            ["nginx", "-p", self.prefix + "/", "-e", os.path.join(self.prefix, "error.log"),
             "-c", self.conf, "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        for port in self.listens.values():
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError("nginx did not start:\n" + self.proc.stderr.read() +
                                       self.error_log())
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("nginx did not listen on %d" % port)
                    time.sleep(0.02)
        return self

    def error_log(self):
        try:
            with open(os.path.join(self.prefix, "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            for sig, wait in ((signal.SIGQUIT, 5), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.prefix, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Cluster:
    """n servers of `repository` (extra: more serve arguments), each with its own simulated
    device, started in parallel."""

    def __init__(self, repository, n, *extra):
        self.servers = [harness.Server(repository, "--drain-timeout", "20", *extra)
                        for _ in range(n)]

    def start(self):
        threads = [threading.Thread(target=s.start) for s in self.servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in self.servers:
            if s.grpc_port is None:
                raise RuntimeError("server did not start:\n" + s.log())
        return self

    def stop(self):
        for s in self.servers:
            s.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def nginx(self, servers=None, conf="nginx.conf"):
        """nginx.conf over `servers` (default: all); .http_port / .grpc_port are its ports."""
        servers = self.servers if servers is None else servers
        http_port, grpc_port = free_port(), free_port()
        if conf == "grpc-l4.conf":
            n = Nginx(conf, {"asyncinfer_grpc_l4": [s.grpc_port for s in servers]},
                      {8001: grpc_port})
        else:
            n = Nginx(conf, {"asyncinfer_http": [s.http_port for s in servers],
                             "asyncinfer_grpc": [s.grpc_port for s in servers]},
                      {8000: http_port, 8001: grpc_port})
        n.http_port, n.grpc_port = http_port, grpc_port
        return n


def successes(server, model="sim"):
    """Requests the server's engine completed (its own count), or None when it is down."""
    try:
        text = requests.get(server.metrics_url, timeout=5).text
    except requests.RequestException:
        return None
    for f in text_string_to_metric_families(text):
        if f.name == "asyncinfer_inference_request_success":
            return sum(s.value for s in f.samples if s.labels.get("model") == model)
    return 0.0


def grpc_body(request):
    """A gRPC message as it travels in an HTTP/2 DATA frame (for h2load -d): uncompressed flag,
    4-byte big-endian length, the serialized message."""
    data = request.SerializeToString()
    return b"\0" + len(data).to_bytes(4, "big") + data


def h2load(url, body_path, clients, streams=1, duration=None, requests_n=None, h1=False,
           headers=(), timeout=120):
    """Runs h2load; returns its figures: total/succeeded/failed/errored, status classes, req/s,
    elapsed seconds, and the output."""
    cmd = ["h2load", "-c", str(clients), "-m", str(streams), "-d", body_path]
    cmd += ["-D", "%ds" % max(1, round(duration))] if duration else ["-n", str(requests_n)]
    if h1:
        cmd.append("--h1")
    for h in headers:
        cmd += ["-H", h]
    cmd.append(url)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
    r = {"output": out}
    m = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    if m:
        r["elapsed"] = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        r["rps"] = float(m.group(3))
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    if m:
        for k, v in zip(("total", "started", "done", "succeeded", "failed", "errored",
                         "timeout"), m.groups()):
            r[k] = int(v)
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m:
        r["2xx"], r["3xx"], r["4xx"], r["5xx"] = map(int, m.groups())
    return r


def grpc_loop(stub, make_request, n, concurrency, timeout=30, on_sent=None):
    """Sends n ModelInfer calls, at most `concurrency` at once (a bounded client loop); returns
    [(start, end, grpc.StatusCode, details)] in send order. on_sent(i) runs after call i is
    sent."""
    results = [None] * n
    sem = threading.Semaphore(concurrency)
    done = threading.Event()
    left = [n]
    lock = threading.Lock()

    def finished(i, start, fut):
        try:
            fut.result()
            code, details = "OK", ""
        except Exception as e:  # grpc.RpcError; recorded, asserted by the caller
            code = e.code().name if hasattr(e, "code") else "EXCEPTION"
            details = e.details() if hasattr(e, "details") else repr(e)
        results[i] = (start, time.monotonic(), code, details)
        sem.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for i in range(n):
        sem.acquire()
        start = time.monotonic()
        fut = stub.ModelInfer.future(make_request(i), timeout=timeout)
        fut.add_done_callback(lambda f, i=i, start=start: finished(i, start, f))
        if on_sent:
            on_sent(i)
    if not done.wait(timeout + 30):
        raise AssertionError("the client loop did not end")
    return results
