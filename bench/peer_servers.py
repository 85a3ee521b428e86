"""peer_servers.py — starting `asyncinfer serve` and tritonserver 2.51 side by side, for the
bench/compare_triton_*.py scripts: the same repository, free loopback ports, one server at a time.

tritonserver is nvidia-pytriton's binary (../shared/peers.md): `tritonserver` is its folder
(bin/tritonserver, backends/ with the 3.11 python stub copied to
backends/python/triton_python_backend_stub), by default the one scripts/setup.sh --peers installs.
"""
import contextlib
import os
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TRITONSERVER = os.path.join(ROOT, ".venv", "triton", "lib", "python3.11",
                                    "site-packages", "pytriton", "tritonserver")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(http_port, models, timeout=120):
    """Until every model of `models` answers ready over HTTP; RuntimeError after `timeout` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if all(urllib.request.urlopen("http://127.0.0.1:%d/v2/models/%s/ready"
                                          % (http_port, m), timeout=2).status == 200
                   for m in models):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not turn ready")


@contextlib.contextmanager
def serve(server, repo, models, cli, tritonserver=DEFAULT_TRITONSERVER, with_process=False):
    """Runs `server` ("asyncinfer" or "triton") on `repo` until the block ends; yields its
    (http_port, grpc_port), and its subprocess.Popen third when `with_process`, once `models` are
    ready."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    if server == "asyncinfer":
        cmd = [cli, "serve", "--model-repository", repo, "--host", "127.0.0.1",
               "--http-port", str(http), "--grpc-port", str(grpc),
               "--metrics-port", str(metrics)]
        env = dict(os.environ)
    else:
        site = os.path.dirname(os.path.dirname(os.path.abspath(tritonserver)))
        cmd = [os.path.join(tritonserver, "bin", "tritonserver"), "--model-repository=" + repo,
               "--backend-directory=" + os.path.join(tritonserver, "backends"),
               "--http-address=127.0.0.1", "--http-port=%d" % http,
               "--grpc-address=127.0.0.1", "--grpc-port=%d" % grpc,
               "--metrics-address=127.0.0.1", "--metrics-port=%d" % metrics,
               "--log-info=false"]
        env = dict(os.environ, PYTHONPATH=site)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_ready(http, models)
        yield (http, grpc, proc) if with_process else (http, grpc)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
