"""The fixture that the tests of Triton's own client (test_tritonclient*.py, run on
.venv/tritonclient) share: one `asyncinfer serve` per test class, with tritonclient's HTTP and
gRPC clients connected to it."""

import queue
import time

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness import Server


def serve(cls, path, *server_args, repo=None, **http_options):
    """Starts `asyncinfer serve` on the repository `path` (with `server_args`) for the tests of
    the TestCase class `cls`, and sets cls.server, cls.http (tritonclient.http; `http_options`,
    such as concurrency, go to its constructor) and cls.grpc (tritonclient.grpc). After the
    class's last test (unittest's class cleanups, also when setUpClass fails half-way) the
    clients are closed, the server stopped and `repo` (a harness.Repository), if given, removed."""
    if repo is not None:
        cls.addClassCleanup(repo.cleanup)
    cls.server = Server(path, *server_args).start()
    cls.addClassCleanup(cls.server.stop)
    cls.grpc = grpcclient.InferenceServerClient(cls.server.grpc_target)
    cls.addClassCleanup(cls.grpc.close)
    cls.http = httpclient.InferenceServerClient("127.0.0.1:%d" % cls.server.http_port,
                                                **http_options)
    cls.addClassCleanup(cls.http.close)


class Collector:
    """tritonclient's stream callback: every result or error, in arrival order."""

    def __init__(self):
        self.items = queue.Queue()

    def __call__(self, result, error):
        self.items.put((result, error))

    def take(self, n, timeout=20):
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            out.append(self.items.get(timeout=max(0.01, deadline - time.monotonic())))
        return out

    def none_within(self, seconds):
        try:
            item = self.items.get(timeout=seconds)
        except queue.Empty:
            return True
        self.items.put(item)
        return False
