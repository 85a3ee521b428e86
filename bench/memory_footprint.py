#!/usr/bin/python3
"""memory_footprint.py — what asyncinfer costs in memory before it does any work, against the real
Triton 2.51 on the same repository.

Rows:

  cli --help         peak RSS of `asyncinfer --help` (/usr/bin/time's maximum resident set);
  import asyncinfer  PSS of `/usr/bin/python3 -c 'import asyncinfer'` right after the import;
  serve <server>     PSS of the server process alone, and of the server with every process it
                     started (the python models' own processes), once each model answers ready.

The repository holds Python models only: Triton's own python_backend examples add_sub and
bls/sync_model.py with their config.pbtxt (a checkout: --python-backend, or
TRITON_PYTHON_BACKEND_DIR; never copied into this project). PSS (from /proc/<pid>/smaps_rollup)
splits each shared page between the processes that map it, so the tree's sum counts every page
once; RSS would count the interpreter's shared pages once per process. psutil (Debian's
python3-psutil) reads the servers', as bench/compare_servers.py does.

  bench/memory_footprint.py --cli build/release/apps/asyncinfer/asyncinfer \\
      --python-package build/release/python --python-backend <python_backend checkout>
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

import peer_servers

MODELS = {"add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
          "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt")}


def pss_mib(process):
    """PSS of one psutil.Process in MiB; 0 when it is gone."""
    try:
        return process.memory_full_info().pss / 2**20
    except psutil.NoSuchProcess:
        return 0.0


def server_pss(server, repo, cli, tritonserver, settle_s):
    """(the server's PSS, its and its processes' PSS, how many processes it started), in MiB."""
    with peer_servers.serve(server, repo, list(MODELS), cli, tritonserver,
                            with_process=True) as (_, __, proc):
        time.sleep(settle_s)  # let the model processes finish importing
        root = psutil.Process(proc.pid)
        children = root.children(recursive=True)
        alone = pss_mib(root)
        return alone, alone + sum(pss_mib(c) for c in children), len(children)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", required=True, help="the asyncinfer program")
    p.add_argument("--python-package", help="a folder holding the asyncinfer package "
                   "(build/<preset>/python); without it the import row is left out")
    p.add_argument("--python-backend", default=os.environ.get("TRITON_PYTHON_BACKEND_DIR"),
                   help="a checkout of github.com/triton-inference-server/python_backend")
    p.add_argument("--tritonserver", default=peer_servers.DEFAULT_TRITONSERVER,
                   help="pytriton's tritonserver folder")
    p.add_argument("--servers", default="asyncinfer,triton")
    p.add_argument("--settle-s", type=float, default=3.0)
    args = p.parse_args()

    out = subprocess.run(["/usr/bin/time", "-f", "%M", args.cli, "--help"],
                         capture_output=True, text=True, check=True)
    print("cli --help          peak RSS %6.1f MiB" % (int(out.stderr.split()[-1]) / 1024))

    if args.python_package:
        # Read from /proc in the child itself: importing psutil there would count its pages too.
        code = ("import asyncinfer, sys\n"
                "print(open('/proc/self/smaps_rollup').read().split('Pss:')[1].split()[0])\n"
                "print(','.join(sorted(m for m in ('torch', 'openvino') if m in sys.modules)))")
        out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                             check=True, env=dict(os.environ, PYTHONPATH=args.python_package))
        lines = out.stdout.split("\n")
        print("import asyncinfer   PSS       %6.1f MiB (python modules loaded: %s)"
              % (int(lines[0]) / 1024, lines[1] or "neither torch nor openvino"))

    if not args.python_backend:
        print("serve rows left out: --python-backend (or TRITON_PYTHON_BACKEND_DIR) not given")
        return 0
    examples = os.path.join(args.python_backend, "examples")
    work = tempfile.mkdtemp(prefix="asyncinfer-memory-")
    try:
        repo = os.path.join(work, "models")
        for name, (source, cfg) in MODELS.items():
            os.makedirs(os.path.join(repo, name, "1"))
            shutil.copy(os.path.join(examples, source), os.path.join(repo, name, "1", "model.py"))
            shutil.copy(os.path.join(examples, cfg), os.path.join(repo, name, "config.pbtxt"))
        for server in args.servers.split(","):
            alone, tree, n = server_pss(server, repo, args.cli, args.tritonserver, args.settle_s)
            print("serve %-12s  PSS server %6.1f MiB, with its %d processes %6.1f MiB"
                  % (server, alone, n, tree))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
