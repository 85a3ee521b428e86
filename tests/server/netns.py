"""Running a test of Triton's own code in a network namespace of its own: Triton's example
clients and qa tests talk to localhost:8000/8001/8002, Triton's default ports, which other tests
running side by side may hold. In a namespace (unshare -n, as root) those ports are free and
nothing outside can be reached. Used by test_python_backend_examples.py and test_triton_qa.py."""

import os
import shutil
import subprocess
import sys


def skip(why):
    """Ends the test as skipped (ctest: SKIP_RETURN_CODE 77), saying why."""
    print("SKIPPED: " + why)
    sys.exit(77)


def require():
    """Skips the test where no network namespace can be made."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        skip("needs unshare and ip (util-linux, iproute2) for a network namespace")
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        skip("cannot make a network namespace (unshare -n needs root)")


def loopback_up():
    """Inside the namespace: its loopback interface up (it starts down)."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def stop(server):
    """Stops a server started inside the namespace: SIGTERM (its drain), then SIGKILL after 60 s."""
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run_inside(script, args, timeout, what):
    """Runs `script` --inside `args` with this interpreter in a new network namespace; its exit
    status, or 1 (saying so) when it does not end within `timeout` seconds."""
    cmd = ["unshare", "-n", sys.executable, os.path.abspath(script), "--inside"] + list(args)
    try:
        return subprocess.run(cmd, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print("FAIL: %s did not end within %d s" % (what, timeout))
        return 1
