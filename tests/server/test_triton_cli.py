"""Triton's command line (issue 47): `tritonserver`, the link installed beside `asyncinfer`, is
`asyncinfer serve` taking Triton's flags. A Triton launch line starts it unchanged; a flag that
only tunes Triton's internals is accepted with one warning; one that would change behaviour
asyncinfer does not have is refused at start, saying so (exit 2)."""

import os
import re
import shutil
import subprocess
import tempfile

import requests

import harness
from harness import ARGS, EXAMPLE_REPOSITORY


def tritonserver():
    return os.path.join(os.path.dirname(ARGS.cli), "tritonserver")


class TritonCommandLine(harness.unittest.TestCase):
    def run_tritonserver(self, *flags, timeout=60):
        return subprocess.run([tritonserver()] + list(flags), capture_output=True, text=True,
                              timeout=timeout)

    def test_kserve_servingruntime_arguments(self):
        """KServe's Triton ServingRuntime (kserve-tritonserver) starts the server with
        --model-store, --grpc-port, --http-port, --allow-grpc and --allow-http."""
        proc = subprocess.Popen(
            [tritonserver(), "--model-store=" + EXAMPLE_REPOSITORY, "--grpc-port=0",
             "--http-port=0", "--allow-grpc=true", "--allow-http=true", "--metrics-port=0",
             "--backend-directory=/opt/tritonserver/backends", "--log-verbose=1",
             "--exit-timeout-secs=5"],
            stderr=subprocess.PIPE, text=True)
        try:
            lines, http, grpc_port = [], None, None
            for line in proc.stderr:
                lines.append(line)
                m = re.search(r"(http|grpc): listening on [^ ]+:(\d+)", line)
                if m and m.group(1) == "http":
                    http = int(m.group(2))
                elif m:
                    grpc_port = int(m.group(2))
                if line.strip().endswith("serve: ready"):
                    break
            self.assertIsNotNone(http, "".join(lines))
            self.assertEqual(requests.get("http://127.0.0.1:%d/v2/health/ready" % http,
                                          timeout=10).status_code, 200)
            self.assertEqual(requests.get("http://127.0.0.1:%d/v2/logging" % http, timeout=10)
                             .json()["log_verbose_level"], 1)
            self.assertIsNotNone(grpc_port, "".join(lines))
            warnings = [l for l in lines if "--backend-directory" in l]
            self.assertEqual(len(warnings), 1, lines)
            self.assertIn("tunes Triton's internals; asyncinfer ignores it", warnings[0])
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stderr.close()

    def test_flags_that_turn_things_off(self):
        out = subprocess.Popen(
            [tritonserver(), "--model-repository", EXAMPLE_REPOSITORY, "--http-port=0",
             "--allow-grpc=false", "--allow-metrics=false", "--http-address=127.0.0.1",
             "--grpc-address=127.0.0.1"], stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in out.stderr:
                lines.append(line)
                if line.strip().endswith("serve: ready"):
                    break
            text = "".join(lines)
            self.assertIn("http: listening on 127.0.0.1:", text)
            self.assertNotIn("grpc: listening", text)
            self.assertNotIn("metrics: listening", text)
        finally:
            out.terminate()
            out.wait(30)
            out.stderr.close()

    def test_what_cannot_be_honoured_is_refused(self):
        for flags, fragment in (
                (["--rate-limit=sometimes"], "execution_count and off"),
                (["--trace-config", "level=TIMESTAMPS"], "needs a file"),
                (["--trace-config", "rate=often"], "rate"),
                (["--log-file=/tmp/triton.log"], "standard error"),
                (["--allow-http=false"], "always serves HTTP"),
                (["--grpc-use-ssl=true"], "TLS"),
                (["--http-address=0.0.0.0", "--grpc-address=127.0.0.1"], "one address"),
                (["--log-format=json"], "--log-format")):
            out = self.run_tritonserver("--model-repository", EXAMPLE_REPOSITORY,
                                        "--http-port=0", "--grpc-port=0", *flags)
            self.assertEqual(out.returncode, 2, (flags, out.stderr))
            self.assertIn(fragment, out.stderr, flags)

    def test_model_namespacing_is_served(self):
        """--model-namespacing=true (a name space per repository) starts the server, and Triton's
        upper-case --model-control-mode spellings are taken."""
        copy = tempfile.mkdtemp(prefix="asyncinfer-ns-")
        self.addCleanup(shutil.rmtree, copy, True)
        shutil.copytree(EXAMPLE_REPOSITORY, os.path.join(copy, "models"))
        proc = subprocess.Popen(
            [tritonserver(), "--model-repository", EXAMPLE_REPOSITORY, "--model-repository",
             os.path.join(copy, "models"), "--model-namespacing=true", "--model-control-mode=POLL",
             "--http-port=0", "--grpc-port=0", "--metrics-port=0"],
            stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in proc.stderr:
                lines.append(line)
                if line.strip().endswith("serve: ready"):
                    break
            text = "".join(lines)
            self.assertIn("serve: ready", text)
            self.assertNotIn("not unique across all model repositories", text)
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stderr.close()

    def test_exit_on_error(self):
        repo = harness.Repository()
        try:
            repo.add("broken", 'name: "broken"\nbackend: "nothing_here"\n')
            out = self.run_tritonserver("--model-repository", repo.path, "--http-port=0",
                                        "--grpc-port=0", "--metrics-port=0",
                                        "--exit-on-error=true")
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn("--exit-on-error is true: exiting", out.stderr)
        finally:
            repo.cleanup()


if __name__ == "__main__":
    harness.main()
