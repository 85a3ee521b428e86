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
once; RSS would count the interpreter's shared pages once per process.

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

import peer_servers

MODELS = {"add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
          "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt")}


def pss_kib(pid):
    """PSS of one process in KiB; 0 when it is gone."""
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid):
    """Every process below `pid` (children, their children, ...)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def server_pss(server, repo, cli, tritonserver, settle_s):
    with peer_servers.serve(server, repo, list(MODELS), cli, tritonserver,
                            with_process=True) as (_, __, proc):
        time.sleep(settle_s)  # let the model processes finish importing
        alone = pss_kib(proc.pid)
        tree = alone + sum(pss_kib(p) for p in descendants(proc.pid))
        return alone, tree, len(descendants(proc.pid))


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
                  % (server, alone / 1024, n, tree / 1024))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
