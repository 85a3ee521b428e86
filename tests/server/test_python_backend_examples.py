"""Triton's own python_backend examples, model.py files and clients unchanged, against
`asyncinfer serve`: add_sub, pytorch, bls (sync and async), bls_decoupled (sync and async, over
decoupled/square_model.py) and custom_metrics.

The examples are those of github.com/triton-inference-server/python_backend, never copied into
this project: TRITON_PYTHON_BACKEND_DIR (or --python-backend DIR) names a checkout; without one the
test clones it (git, depth 1) into a temporary folder, and exits 77 (ctest: skipped) when that
fails too. Their clients talk to localhost:8000 and read localhost:8002/metrics, Triton's default
ports, so the server and the clients run in a network namespace of their own (unshare -n, as
root), where those ports are free and nothing outside can be reached; without one the test is
skipped (77). Each client passes when it exits 0 and prints its PASS line.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from netns import loopback_up, require, run_inside, skip, stop

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY_URL = "https://github.com/triton-inference-server/python_backend"

# model folder -> (model.py, config.pbtxt) under examples/
MODELS = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
}
CLIENTS = ["add_sub/client.py", "pytorch/client.py", "bls/sync_client.py", "bls/async_client.py",
           "bls_decoupled/sync_client.py", "bls_decoupled/async_client.py",
           "custom_metrics/client.py"]


def checkout(given, workdir):
    if given:
        return given
    dest = os.path.join(workdir, "python_backend")
    try:
        subprocess.run(["git", "clone", "-q", "--depth", "1", REPOSITORY_URL, dest],
                       check=True, timeout=120, capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        skip("no python_backend checkout (TRITON_PYTHON_BACKEND_DIR) and cloning %s failed: %s"
             % (REPOSITORY_URL, e))
    return dest


def make_repository(examples, path):
    for model, (source, config) in MODELS.items():
        os.makedirs(os.path.join(path, model, "1"))
        shutil.copy(os.path.join(examples, source), os.path.join(path, model, "1", "model.py"))
        shutil.copy(os.path.join(examples, config), os.path.join(path, model, "config.pbtxt"))


def inside(args):
    """In the network namespace: the server on Triton's ports, then each client."""
    loopback_up()
    examples = os.path.join(args.python_backend, "examples")
    work = tempfile.mkdtemp(prefix="asyncinfer-pb-examples-")
    repo = os.path.join(work, "models")
    make_repository(examples, repo)
    log = open(os.path.join(work, "server.log"), "w+")
    server = subprocess.Popen([args.cli, "serve", "--model-repository", repo,
                               "--host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT)
    failures = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    print(log.read())
                    print("FAIL: the server did not become ready")
                    return 1
                time.sleep(0.2)
        for client in CLIENTS:
            d = os.path.join(examples, os.path.dirname(client))
            try:
                out = subprocess.run([sys.executable, os.path.basename(client)], cwd=d,
                                     capture_output=True, text=True, timeout=120)
                text = out.stdout + out.stderr
                ok = out.returncode == 0 and any(l.startswith("PASS") for l in
                                                 out.stdout.splitlines())
            except subprocess.TimeoutExpired as e:
                text, ok = "timed out after 120 s: %s" % (e.stdout,), False
            print("%s %s" % ("ok  " if ok else "FAIL", client))
            if not ok:
                failures.append(client)
                print(text[-3000:])
    finally:
        stop(server)
        log.seek(0)
        if failures:
            print("---- server log ----\n" + log.read()[-8000:])
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    print("%d of %d examples passed" % (len(CLIENTS) - len(failures), len(CLIENTS)))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--python-backend", default=os.environ.get("TRITON_PYTHON_BACKEND_DIR", ""))
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        return inside(args)
    require()
    with tempfile.TemporaryDirectory(prefix="asyncinfer-pb-") as work:
        args.python_backend = checkout(args.python_backend, work)
        return run_inside(__file__, ["--cli", os.path.abspath(args.cli),
                                     "--python-backend", args.python_backend], 900,
                          "the examples")


if __name__ == "__main__":
    sys.exit(main())
