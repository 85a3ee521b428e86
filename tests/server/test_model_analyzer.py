"""Triton Model Analyzer, unchanged, against asyncinfer (issue 47): in its `local` launch mode it
starts `tritonserver` (the link beside `asyncinfer`: serve with Triton's command line), makes
model configurations (instance counts, max batch sizes), loads each through the repository API,
measures it with perf_analyzer and writes its tables and reports.

Model Analyzer and perf_analyzer come from `scripts/setup.sh --peers` (.venv/model_analyzer,
.venv/perf_analyzer); without them the test exits with 77 and ctest reports it skipped.
"""

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import ARGS, EXAMPLE_REPOSITORY, free_port

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL_ANALYZER = os.path.join(ROOT, ".venv", "model_analyzer", "bin", "model-analyzer")
PERF_ANALYZER_VENV = os.path.join(ROOT, ".venv", "perf_analyzer", "bin", "perf_analyzer")


class ModelAnalyzer(unittest.TestCase):
    def test_profile_in_local_launch_mode(self):
        work = tempfile.mkdtemp(prefix="asyncinfer-model-analyzer-")
        self.addCleanup(shutil.rmtree, work, True)
        repo = os.path.join(work, "repo")
        shutil.copytree(os.path.join(EXAMPLE_REPOSITORY, "identity"),
                        os.path.join(repo, "identity"))
        # One version: Model Analyzer profiles the model it copies, version folders and all.
        shutil.rmtree(os.path.join(repo, "identity", "2"), ignore_errors=True)
        config = os.path.join(repo, "identity", "config.pbtxt")
        with open(config) as f:
            text = f.read().replace("version_policy: { all { } }\n", "")
        with open(config, "w") as f:
            f.write(text)
        http, grpc, metrics = free_port(), free_port(), free_port()
        export = os.path.join(work, "export")
        os.makedirs(export)
        yaml = os.path.join(work, "profile.yaml")
        with open(yaml, "w") as f:
            f.write("\n".join([
                "model_repository: " + repo,
                "output_model_repository_path: " + os.path.join(work, "out"),
                "export_path: " + export,
                "override_output_model_repository: true",
                "triton_launch_mode: local",
                "triton_server_path: " + os.path.join(os.path.dirname(ARGS.cli), "tritonserver"),
                "triton_output_path: " + os.path.join(work, "server.log"),
                "perf_analyzer_path: " + os.path.join(ROOT, "scripts", "perf_analyzer"),
                "triton_http_endpoint: 127.0.0.1:%d" % http,
                "triton_grpc_endpoint: 127.0.0.1:%d" % grpc,
                "triton_metrics_url: http://127.0.0.1:%d/metrics" % metrics,
                "run_config_search_max_concurrency: 2",
                "run_config_search_max_instance_count: 2",
                "run_config_search_max_model_batch_size: 2",
                "profile_models:",
                "  identity:",
                "    cpu_only: true",
                ""]))
        out = subprocess.run([MODEL_ANALYZER, "profile", "-f", yaml], capture_output=True,
                             text=True, timeout=540, cwd=work)
        log = out.stdout + out.stderr
        server_log = ""
        if os.path.exists(os.path.join(work, "server.log")):
            with open(os.path.join(work, "server.log")) as f:
                server_log = f.read()
        self.assertEqual(out.returncode, 0, log[-4000:] + "\n--- server:\n" + server_log[-3000:])
        self.assertIn("Profile complete", log)
        with open(os.path.join(export, "results", "metrics-model-inference.csv")) as f:
            rows = list(csv.DictReader(f))
        configs = {r["Model Config Path"] for r in rows}
        # The default configuration and the ones it made (1-2 instances, max batch 1-2).
        self.assertIn("identity_config_default", configs)
        self.assertGreaterEqual(len(configs), 3, rows)
        for r in rows:
            self.assertGreater(float(r["Throughput (infer/sec)"]), 0, r)
        self.assertTrue(os.path.exists(os.path.join(
            export, "reports", "summaries", "identity", "result_summary.html")))


if __name__ == "__main__":
    harness.parse_args()
    if not (os.access(MODEL_ANALYZER, os.X_OK) and os.access(PERF_ANALYZER_VENV, os.X_OK)):
        print("server.model_analyzer: skipped: no .venv/model_analyzer or .venv/perf_analyzer "
              "(scripts/setup.sh --peers makes them)")
        sys.exit(77)
    unittest.main(verbosity=2)
