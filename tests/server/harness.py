"""Test harness for `asyncinfer serve`: starts a real server on free loopback ports, reads the
ports back from its log, and stops it (SIGTERM) when the test is done.

Every test module runs as `python3 <module> --cli <asyncinfer binary> [--digits <model.pt>]`
(ctest does this; see tests/server/CMakeLists.txt). Only Debian's packages are used
(python3-requests, python3-prometheus-client).
"""

import argparse
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE_REPOSITORY = os.path.join(ROOT, "examples", "model_repository")
DIGITS_CONFIG = os.path.join(ROOT, "examples", "model_repository_digits", "digits", "config.pbtxt")

ARGS = argparse.Namespace(cli=None, digits=None, grpc_stubs=None)


def parse_args():
    """Takes --cli/--digits off sys.argv and leaves the rest to unittest."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--cli", required=True)
    p.add_argument("--digits", default=None)
    # Python stubs made from the project's .proto (ctest may give them in ASYNCINFER_GRPC_STUBS)
    p.add_argument("--grpc-stubs", default=os.environ.get("ASYNCINFER_GRPC_STUBS") or None)
    known, rest = p.parse_known_args()
    ARGS.cli = known.cli
    ARGS.digits = known.digits
    ARGS.grpc_stubs = known.grpc_stubs
    if known.grpc_stubs:
        sys.path.insert(0, known.grpc_stubs)
    sys.argv = [sys.argv[0]] + rest


class Server:
    """One `asyncinfer serve` process. Use as a context manager."""

    def __init__(self, repository, *extra, wait_ready=True, timeout=60, nofile=None):
        self.repository = repository
        self.nofile = nofile  # the server's RLIMIT_NOFILE (soft and hard), or inherited
        self.extra = list(extra)
        self.wait_ready = wait_ready
        self.timeout = timeout
        self.proc = None
        self.lines = []
        self.http_port = None
        self.metrics_port = None
        self.grpc_port = None
        self._cond = threading.Condition()
        self._reader = None

    def start(self):
        cmd = [ARGS.cli, "serve", "--model-repository", self.repository,
               "--http-port", "0", "--metrics-port", "0", "--host", "127.0.0.1"] + self.extra
        if "--grpc-port" not in self.extra:
            cmd += ["--grpc-port", "0"]  # never Triton's 8001: tests run side by side
        def limits():
            if self.nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=limits if self.nofile else None)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while not self._started():
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    self._cond.release()
                    try:
                        if self.proc.poll() is not None:
                            # It exited: what it wrote first is read to the end (the reader
                            # may not have caught up yet), so the error says why.
                            self._reader.join(5)
                        text = "\n".join(self.lines)
                        self.stop()
                    finally:
                        self._cond.acquire()
                    raise RuntimeError("server did not start:\n" + text)
                self._cond.wait(min(left, 0.1))
        return self

    def _started(self):
        return any(l.endswith(": ready") or "not ready:" in l for l in self.lines)

    def _read(self):
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            with self._cond:
                self.lines.append(line)
                m = re.search(r"http: listening on [^ ]+:(\d+)", line)
                if m:
                    self.http_port = int(m.group(1))
                m = re.search(r"metrics: listening on [^ ]+:(\d+)", line)
                if m:
                    self.metrics_port = int(m.group(1))
                m = re.search(r"grpc: listening on [^ ]+:(\d+)", line)
                if m:
                    self.grpc_port = int(m.group(1))
                self._cond.notify_all()

    def wait_line(self, pattern, timeout=10):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for l in self.lines:
                    if re.search(pattern, l):
                        return l
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no log line matching %r in:\n%s"
                                         % (pattern, "\n".join(self.lines)))
                self._cond.wait(min(left, 0.1))

    def log(self):
        with self._cond:
            return "\n".join(self.lines)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.http_port

    @property
    def grpc_target(self):
        return "127.0.0.1:%d" % self.grpc_port

    @property
    def metrics_url(self):
        return "http://127.0.0.1:%d/metrics" % self.metrics_port

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout=30):
        """Waits for the process to exit; returns its exit code (kills it on timeout)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("server did not exit within %s s:\n%s" % (timeout, self.log()))

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader:
            self._reader.join(5)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def metric(text, name, **labels):
    """The value of one sample of a Prometheus text page; None when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            got = {}
        elif line.startswith(name + "{"):
            got = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.index("}") + 1]))
        else:
            continue
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(predicate, timeout=10, what="condition", sleep=time.sleep):
    """Polls `predicate` until true; fails after `timeout` s. `sleep`: gevent.sleep while a
    tritonclient.http async_infer is pending (its greenlet runs only when this one yields)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        sleep(0.02)
    raise AssertionError("timed out after %s s waiting for %s" % (timeout, what))


def builtin_config(name, uri, inputs, outputs, max_batch_size=8, extra="", device=None):
    """config.pbtxt text of a built-in model. inputs/outputs: [(name, TYPE_X, [dims])]."""
    def tensors(ts):
        return ", ".join('{ name: "%s", data_type: %s, dims: [ %s ] }'
                         % (n, t, ", ".join(str(d) for d in dims)) for n, t, dims in ts)
    text = ('name: "%s"\nbackend: "builtin"\nmax_batch_size: %d\n'
            "input [ %s ]\noutput [ %s ]\n"
            'parameters { key: "uri" value { string_value: "%s" } }\n'
            % (name, max_batch_size, tensors(inputs), tensors(outputs), uri))
    if device:
        text += 'parameters { key: "device" value { string_value: "%s" } }\n' % device
    return text + extra


class Repository:
    """A temporary model repository: add(name, config_text, versions=[1], files={})."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="asyncinfer-repo-")

    def add(self, name, config, versions=(1,), files=None):
        d = os.path.join(self.path, name)
        os.makedirs(d, exist_ok=True)
        if config is not None:
            with open(os.path.join(d, "config.pbtxt"), "w") as f:
                f.write(config)
        for v in versions:
            os.makedirs(os.path.join(d, str(v)), exist_ok=True)
        for rel, src in (files or {}).items():
            shutil.copy(src, os.path.join(d, rel))
        return self

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process that needs a number
    before it starts; a server of ours takes --http-port 0 instead)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_request(port, data, timeout=10, read=True):
    """Sends bytes on a new connection and returns everything read until the server closes
    (or `timeout`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                c = s.recv(65536)
            except socket.timeout:
                break
            if not c:
                break
            chunks.append(c)
        return b"".join(chunks)
    finally:
        s.close()


def rss_mb(pid):
    """(resident, peak resident) memory of a process, in MiB (/proc/PID/status)."""
    vals = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024.0
    return vals["VmRSS"], vals["VmHWM"]


def http_status(raw):
    """The status code of the first response in raw bytes."""
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


def main():
    parse_args()
    unittest.main(verbosity=2)
