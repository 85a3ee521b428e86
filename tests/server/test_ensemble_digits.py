"""The article's service over the wire: examples/model_repository_ensemble (a Python
pre-processing model, the TorchScript digits model, a Python post-processing model, as one
ensemble) served by `asyncinfer serve`, and examples/python/ensemble_client.py (Triton's client)
sending the 450 test images as PNG bytes. Its accuracy must equal `asyncinfer run`'s on the same
model file, with every top-3 prediction the same (the client's --compare).

Run as: test_ensemble_digits.py --cli <asyncinfer> --digits <digits.pt> (the TorchDigitsModel
fixture makes the model, its sidecar and test/ beside it)."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import harness
from harness import ARGS, ROOT, Server

EXAMPLE = os.path.join(ROOT, "examples", "model_repository_ensemble")


def repository(into, model):
    """The example repository with its links to models/data replaced by the built model."""
    for name in ("preprocess", "digits", "postprocess", "digits_ensemble"):
        os.makedirs(os.path.join(into, name, "1"))
        shutil.copy(os.path.join(EXAMPLE, name, "config.pbtxt"), os.path.join(into, name))
    for name in ("preprocess", "postprocess"):
        shutil.copy(os.path.join(EXAMPLE, name, "1", "model.py"), os.path.join(into, name, "1"))
        shutil.copy(model + ".json", os.path.join(into, name, "1", "digits.pt.json"))
    shutil.copy(model, os.path.join(into, "digits", "1", "model.pt"))


class DigitsEnsemble(harness.unittest.TestCase):
    def test_the_ensemble_predicts_what_asyncinfer_run_predicts(self):
        if not ARGS.digits:
            self.skipTest("needs the digits model (--digits; the TorchDigitsModel fixture)")
        work = tempfile.mkdtemp(prefix="asyncinfer-ensemble-digits-")
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        repo = os.path.join(work, "repo")
        repository(repo, ARGS.digits)
        images = os.path.join(os.path.dirname(ARGS.digits), "test")
        labels = os.path.join(images, "labels.csv")
        predictions = os.path.join(work, "run.csv")
        run = subprocess.run([ARGS.cli, "run", "--model", ARGS.digits, "--images", images,
                              "--labels", labels, "--top-k", "3", "--output", predictions,
                              "--quiet"], capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr)
        run_accuracy = re.search(r"accuracy\s+([\d.]+ %)", run.stdout).group(1)
        with Server(repo) as s:
            client = subprocess.run(
                [sys.executable, os.path.join(ROOT, "examples", "python", "ensemble_client.py"),
                 "--url", s.grpc_target, "--images", images, "--labels", labels,
                 "--compare", predictions], capture_output=True, text=True, timeout=300)
        self.assertEqual(client.returncode, 0, client.stdout + client.stderr)
        self.assertIn("images      450 ok, 0 failed", client.stdout)
        self.assertIn("accuracy    %s" % run_accuracy, client.stdout)
        self.assertIn("compared    450 predictions", client.stdout)
        self.assertIn(": 0 differ", client.stdout)


if __name__ == "__main__":
    harness.main()
