"""Triton's own example clients, run unchanged against `asyncinfer serve` (issue 47).

The scripts are those of Triton's client repository (github.com/triton-inference-server/client,
`src/python/examples/`), never copied into this project: point the environment variable
TRITON_CLIENT_DIR (or `--triton-client DIR`) at a checkout of it. Without one, the test exits
with 77 and ctest reports it skipped.

The models they expect are those of tests/server/triton_models/ (model.py files written for these
tests, README.md there). Each script runs as Triton's own qa scripts run it (qa/L0_grpc and
qa/L0_http, test.sh): with -v, and it passes when it exits 0 and, if it is one that prints a
PASS line, prints exactly one.

The scripts that cannot pass here are named in NOT_RUN with the reason (docs/serving.md, "Triton's
example clients"); each of them passes against Triton 2.51 on Triton's own qa repository.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import Server

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "triton_models")
# Which model.py each model folder of triton_models/ gets.
SOURCES = {"simple": "add_sub.py", "simple_int8": "add_sub.py", "simple_string": "add_sub.py",
           "simple_identity": "identity.py", "repeat_int32": "repeat.py",
           "simple_sequence": "sequence.py", "simple_dyna_sequence": "sequence.py",
           "simple_string_dyna_sequence": "sequence.py"}

# (script, protocol, extra arguments): every example that runs against a default server.
HTTP = ["simple_http_infer_client", "simple_http_async_infer_client",
        "simple_http_aio_infer_client", "simple_http_string_infer_client",
        "simple_http_shm_client", "simple_http_shm_string_client"]
GRPC = ["simple_grpc_infer_client", "simple_grpc_async_infer_client",
        "simple_grpc_aio_infer_client", "simple_grpc_string_infer_client",
        "simple_grpc_shm_client", "simple_grpc_shm_string_client",
        "simple_grpc_keepalive_client", "simple_grpc_custom_args_client",
        "simple_grpc_custom_repeat", "grpc_explicit_int_content_client",
        "grpc_explicit_int8_content_client", "grpc_explicit_byte_content_client"]
# The sequence examples (stateful models), each also with -d: the dynamic (oldest) sequence
# models, with the CORRID control.
SEQUENCE = [("simple_http_sequence_sync_infer_client", "http"),
            ("simple_grpc_sequence_sync_infer_client", "grpc"),
            ("simple_grpc_sequence_stream_infer_client", "grpc"),
            ("simple_grpc_aio_sequence_stream_infer_client", "grpc")]
RUNS = ([(s, "http", []) for s in HTTP] + [(s, "grpc", []) for s in GRPC] +
        [("reuse_infer_objects_client", "http", ["-i", "http"]),
         ("reuse_infer_objects_client", "grpc", ["-i", "grpc"])] +
        [(s, p, extra) for s, p in SEQUENCE for extra in ([], ["-d"])])

# The examples not run, each with why. Keep docs/serving.md's list the same.
NOT_RUN = {
    "simple_http_health_metadata": "checks that the server's name is \"triton\"",
    "simple_grpc_health_metadata": "checks that the server's name is \"triton\"",
    "simple_http_model_control": "counts the 7 models of Triton's qa repository and loads "
                                 "'simple' with a config override that Triton auto-completes "
                                 "from its TensorFlow graph (auto-complete: issue 47)",
    "simple_grpc_model_control": "counts the 8 models of Triton's qa repository and loads "
                                 "'simple' with a config override that Triton auto-completes",
    "simple_http_cudashm_client": "CUDA shared memory (a GPU and CUDA IPC)",
    "simple_grpc_cudashm_client": "CUDA shared memory (a GPU and CUDA IPC)",
    "image_client": "the classification extension and an image model (issue 47)",
    "grpc_image_client": "the classification extension and an image model (issue 47)",
    "grpc_client": "densenet_onnx and the classification extension (issue 47)",
    "ensemble_image_client": "an image pre-processing ensemble and classification (issue 47)",
    "memory_growth_test": "connects to localhost:8000/8001 only (tests use free ports)",
}


def examples_dir():
    root = ARGS.triton_client or os.environ.get("TRITON_CLIENT_DIR", "")
    d = os.path.join(root, "src", "python", "examples")
    return d if root and os.path.isdir(d) else None


def make_repository():
    path = tempfile.mkdtemp(prefix="asyncinfer-triton-examples-")
    for model, source in SOURCES.items():
        os.makedirs(os.path.join(path, model, "1"))
        shutil.copy(os.path.join(MODELS, model, "config.pbtxt"), os.path.join(path, model))
        shutil.copy(os.path.join(MODELS, source), os.path.join(path, model, "1", "model.py"))
    return path


class TritonExamples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = examples_dir()
        cls.repository = make_repository()
        cls.addClassCleanup(shutil.rmtree, cls.repository, True)
        cls.server = Server(cls.repository).start()
        cls.addClassCleanup(cls.server.stop)

    def run_example(self, script, protocol, extra):
        path = os.path.join(self.dir, script + ".py")
        self.assertTrue(os.path.isfile(path), path + " is not in the checkout")
        port = self.server.http_port if protocol == "http" else self.server.grpc_port
        try:
            out = subprocess.run([sys.executable, path, "-v", "-u", "127.0.0.1:%d" % port]
                                 + extra, capture_output=True, text=True, timeout=120,
                                 cwd=self.dir)
        except subprocess.TimeoutExpired as e:
            self.fail("%s did not end within 120 s:\n%s" % (script, e.stdout))
        text = out.stdout + out.stderr
        self.assertEqual(out.returncode, 0, "%s exited %d:\n%s" % (script, out.returncode,
                                                                  text[-4000:]))
        with open(path) as f:
            prints_pass = '"PASS' in f.read()
        if prints_pass:
            passes = [line for line in out.stdout.splitlines() if "PASS" in line]
            self.assertEqual(len(passes), 1, "%s: PASS lines %r:\n%s" % (script, passes,
                                                                          text[-4000:]))

    def test_every_example_is_run_or_named(self):
        """A new example in the checkout is either run here or named in NOT_RUN."""
        scripts = {f[:-3] for f in os.listdir(self.dir) if f.endswith(".py")}
        known = {s for s, _, _ in RUNS} | set(NOT_RUN)
        self.assertEqual(sorted(scripts - known), [])


def add_runs():
    for script, protocol, extra in RUNS:
        name = "test_" + script + "".join("_" + a.strip("-") for a in extra)

        def run(self, script=script, protocol=protocol, extra=extra):
            self.run_example(script, protocol, extra)
        run.__doc__ = "%s.py %s, unchanged" % (script, " ".join(extra))
        setattr(TritonExamples, name, run)


ARGS = argparse.Namespace(triton_client=None)
add_runs()

if __name__ == "__main__":
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--triton-client", default=None)
    known, rest = p.parse_known_args()
    ARGS.triton_client = known.triton_client
    sys.argv = [sys.argv[0]] + rest
    if examples_dir() is None:
        print("server.triton_examples: skipped: no checkout of Triton's client repository "
              "(github.com/triton-inference-server/client); set TRITON_CLIENT_DIR to one")
        sys.exit(77)
    harness.main()
