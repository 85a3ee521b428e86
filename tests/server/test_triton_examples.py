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
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import Server

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "triton_models")
ENSEMBLE_EXAMPLE = os.path.join(harness.ROOT, "examples", "model_repository_ensemble")
# Which model.py each model folder of triton_models/ gets.
SOURCES = {"simple": "add_sub.py", "simple_int8": "add_sub.py", "simple_string": "add_sub.py",
           "simple_identity": "identity.py", "repeat_int32": "repeat.py",
           "simple_sequence": "sequence.py", "simple_dyna_sequence": "sequence.py",
           "simple_string_dyna_sequence": "sequence.py", "densenet_onnx": "densenet.py"}
# The label files the models' outputs name (label_filename), written with the repository: the
# stand-in's 1000 classes.
LABELS = {"densenet_onnx": ("densenet_labels.txt", ["class_%d" % k for k in range(1000)])}

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

# The image classification examples (the classification extension: class_count on the requested
# output, the labels of the output's label_filename), on the digits classifier of
# models/make_digits.py: digits_image takes gray pixels as image_client.py sends them with
# "-s NONE", digits_png an encoded image as ensemble_image_client.py sends it (triton_models/).
# Each classifies IMAGES test images, and its top class for each must be the image's label.
CLASSIFY = [("image_client", "http", ["-m", "digits_image", "-s", "NONE", "-c", "3"]),
            ("image_client", "http", ["-m", "digits_image", "-s", "NONE", "-c", "3", "-a",
                                      "-b", "4"]),
            ("image_client", "grpc", ["-i", "grpc", "-m", "digits_image", "-s", "NONE", "-c",
                                      "3", "-b", "8"]),
            ("image_client", "grpc", ["-i", "grpc", "-m", "digits_image", "-s", "NONE", "-c",
                                      "3", "-a"]),
            ("image_client", "grpc", ["-i", "grpc", "-m", "digits_image", "-s", "NONE", "-c",
                                      "3", "--streaming", "-b", "2"]),
            ("grpc_image_client", "grpc", ["-m", "digits_image", "-s", "NONE", "-c", "3"]),
            ("grpc_image_client", "grpc", ["-m", "digits_image", "-s", "NONE", "-c", "3",
                                           "-b", "4", "-a"]),
            ("grpc_image_client", "grpc", ["-m", "digits_image", "-s", "NONE", "-c", "3",
                                           "--streaming"]),
            ("ensemble_image_client", "http", ["-m", "digits_png", "-c", "3"]),
            ("ensemble_image_client", "grpc", ["-i", "grpc", "-m", "digits_png", "-c", "3"])]
# The model control examples, each on a server of its own in explicit mode, whose repository has
# as many models as the script counts (Triton's qa gives them one of 7 and one of 8): they load
# "simple", then again with an override config of max_batch_size alone (the config's backend then
# comes from the model file, its tensors from add_sub.py's auto_complete_config), unload it, and
# the gRPC one loads with a model file whose name is too long for the file system.
MODEL_CONTROL = [("simple_http_model_control", "http", 7),
                 ("simple_grpc_model_control", "grpc", 8)]

# The first test images of models/make_digits.py's split (the network gets 98.7 % of the split
# right, and 7 of these 8).
IMAGES = 8

# grpc_client.py, on the stand-in for Triton's densenet_onnx (triton_models/densenet.py): it sends
# data_0, [3, 224, 224] FP32, as raw bytes, all ASCII 'a'; every element is the FP32 of the bytes
# 61 61 61 61, so each channel's mean is that value and fc6_1[k] = value * (k + 1) / 1000.
DENSENET = ("grpc_client", "grpc", [])
A_FP32 = struct.unpack("<f", b"aaaa")[0]
DENSENET_FC6 = struct.pack("<1000f", *(A_FP32 * (k + 1) / 1000 for k in range(1000)))

# The examples not run, each with why. Keep docs/serving.md's list the same.
NOT_RUN = {
    "simple_http_health_metadata": "checks that the server's name is \"triton\"",
    "simple_grpc_health_metadata": "checks that the server's name is \"triton\"",
    "simple_http_cudashm_client": "CUDA shared memory (a GPU and CUDA IPC)",
    "simple_grpc_cudashm_client": "CUDA shared memory (a GPU and CUDA IPC)",
    "memory_growth_test": "connects to localhost:8000/8001 only (tests use free ports)",
}


def examples_dir():
    root = ARGS.triton_client or os.environ.get("TRITON_CLIENT_DIR", "")
    d = os.path.join(root, "src", "python", "examples")
    return d if root and os.path.isdir(d) else None


def make_repository(count=None):
    """The models of SOURCES (the first `count` of them), and the digits models with --digits."""
    path = tempfile.mkdtemp(prefix="asyncinfer-triton-examples-")
    for model, source in list(SOURCES.items())[:count]:
        os.makedirs(os.path.join(path, model, "1"))
        shutil.copy(os.path.join(MODELS, model, "config.pbtxt"), os.path.join(path, model))
        shutil.copy(os.path.join(MODELS, source), os.path.join(path, model, "1", "model.py"))
        if model in LABELS:
            name, labels = LABELS[model]
            with open(os.path.join(path, model, name), "w") as f:
                f.write("".join(label + "\n" for label in labels))
    if harness.ARGS.digits and count is None:
        add_digits_models(path, harness.ARGS.digits)
    return path


def add_digits_models(path, model):
    """The image classifiers of CLASSIFY (triton_models/README.md): the digits network, its
    labels (the sidecar's), the normalising and PNG-decoding steps and the two ensembles."""
    with open(model + ".json") as f:
        labels = json.load(f)["labels"]
    folders = {"digits": MODELS, "digits_normalise": MODELS, "digits_image": MODELS,
               "digits_png": MODELS, "preprocess": ENSEMBLE_EXAMPLE}
    for name, source in folders.items():
        os.makedirs(os.path.join(path, name, "1"))
        shutil.copy(os.path.join(source, name, "config.pbtxt"), os.path.join(path, name))
        if name in ("digits", "digits_image", "digits_png"):
            with open(os.path.join(path, name, "labels.txt"), "w") as f:
                f.write("".join(label + "\n" for label in labels))
    shutil.copy(model, os.path.join(path, "digits", "1", "model.pt"))
    shutil.copy(os.path.join(MODELS, "normalise.py"),
                os.path.join(path, "digits_normalise", "1", "model.py"))
    shutil.copy(os.path.join(ENSEMBLE_EXAMPLE, "preprocess", "1", "model.py"),
                os.path.join(path, "preprocess", "1", "model.py"))
    for name in ("digits_normalise", "preprocess"):
        shutil.copy(model + ".json", os.path.join(path, name, "1", "digits.pt.json"))


def test_images(model, into):
    """Copies the first IMAGES test images into `into`: {file name: (label, the top class that
    `asyncinfer run` gives it on the same model file)}."""
    images = os.path.join(os.path.dirname(model), "test")
    with open(os.path.join(images, "labels.csv")) as f:
        rows = [line.strip().split(",") for line in f.readlines()[1:] if line.strip()]
    labels = dict(sorted(rows)[:IMAGES])
    for name in labels:
        shutil.copy(os.path.join(images, name), into)
    predictions = os.path.join(into + "-run.csv")
    run = subprocess.run([harness.ARGS.cli, "run", "--model", model, "--images", into,
                          "--top-k", "1", "--output", predictions, "--quiet"],
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError("asyncinfer run failed: " + run.stderr)
    with open(predictions) as f:
        top = {os.path.basename(r[0]): r[2] for r in
               (line.strip().split(",") for line in f.readlines()[1:]) if r[0]}
    os.remove(predictions)
    return {name: (label, top[name]) for name, label in labels.items()}


CLASS_LINE = re.compile(r"^ +(-?[0-9.e+-]+) \((\d+)\) = (.*)$")


def top_classes(script, text, files, batch):
    """Each image's top class as `script` prints it: {file name: label}."""
    top = {}
    lines = text.splitlines()
    if script == "image_client":
        # "Request <id>, batch size <b>" then, per image of the batch, its classes; request k
        # holds the images from (k - 1) * b on, in file name order, round the folder.
        for i, line in enumerate(lines):
            m = re.match(r"^Request (\d+), batch size (\d+)$", line)
            if not m:
                continue
            first = (int(m.group(1)) - 1) * batch
            classes = [CLASS_LINE.match(x) for x in lines[i + 1:]]
            heads = []
            for c in classes:
                if not c:
                    break
                heads.append(c)
            per_image = len(heads) // batch
            for j in range(batch):
                top.setdefault(files[(first + j) % len(files)], []).append(
                    heads[j * per_image].group(3))
        return top
    # grpc_image_client.py: "Image '<path>':"; ensemble_image_client.py: '"<path>":' and the
    # output's name; then the classes, best first.
    current = None
    for line in lines:
        m = re.match(r"^Image '(.*)':$", line) or re.match(r'^"(.*)":$', line)
        if m:
            current = os.path.basename(m.group(1))
            continue
        c = CLASS_LINE.match(line)
        if c and current is not None:
            top.setdefault(current, []).append(c.group(3))
            current = None
    return top


class TritonExamples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = examples_dir()
        cls.repository = make_repository()
        cls.addClassCleanup(shutil.rmtree, cls.repository, True)
        cls.server = Server(cls.repository).start()
        cls.addClassCleanup(cls.server.stop)
        if harness.ARGS.digits:
            cls.images = tempfile.mkdtemp(prefix="asyncinfer-triton-images-")
            cls.addClassCleanup(shutil.rmtree, cls.images, True)
            cls.expected = test_images(harness.ARGS.digits, cls.images)

    def run_example(self, script, protocol, extra, server=None):
        """Runs `script` against `server` (the class's by default) and checks its exit and PASS
        line; returns what it printed."""
        path = os.path.join(self.dir, script + ".py")
        self.assertTrue(os.path.isfile(path), path + " is not in the checkout")
        server = server or self.server
        port = server.http_port if protocol == "http" else server.grpc_port
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
        return out.stdout

    def classify(self, script, protocol, extra):
        """Runs an image classification example on the test images: every image's top class,
        each time the script sends it, is the one `asyncinfer run` gives it on the same model
        file, and the label for all but one (0000.png is a 5 that the network takes for a 9)."""
        if not harness.ARGS.digits:
            self.skipTest("needs the digits model (--digits; the TorchDigitsModel fixture)")
        batch = int(extra[extra.index("-b") + 1]) if "-b" in extra else 1
        printed = self.run_example(script, protocol, extra + [self.images])
        top = top_classes(script, printed, sorted(self.expected), batch)
        self.assertEqual(sorted(top), sorted(self.expected), printed[-4000:])
        for name, (_, predicted) in self.expected.items():
            self.assertEqual(set(top[name]), {predicted}, "%s: %s\n%s" % (script, name,
                                                                          printed[-4000:]))
        right = [name for name, (label, _) in self.expected.items() if top[name] == [label]]
        self.assertEqual(len(right), IMAGES - 1, right)

    def model_control(self, script, protocol, models):
        """Runs a model control example on a server of its own, in explicit mode."""
        repository = make_repository(models)
        self.addCleanup(shutil.rmtree, repository, True)
        with Server(repository, "--model-control-mode", "explicit") as server:
            self.run_example(script, protocol, [], server)
            self.assertIsNone(server.proc.poll(), server.log())

    def test_grpc_client(self):
        """grpc_client.py, unchanged, on the densenet_onnx stand-in: what it prints of the model's
        readiness, metadata, config and inference is the stand-in's, to the output's bytes."""
        from google.protobuf import text_format
        from tritonclient.grpc import service_pb2

        script, protocol, extra = DENSENET
        printed = self.run_example(script, protocol, extra)
        # It prints each response after a header line of its own, the last one before "PASS".
        heads = ["model ", "server metadata:\n", "model metadata:\n", "model config:\n",
                 "model infer:\n", "PASS\n"]
        at = [printed.find(h) for h in heads]
        self.assertTrue(all(a >= 0 for a in at) and at == sorted(at), printed[-4000:])
        block = {h: printed[at[i] + len(h):at[i + 1]] for i, h in enumerate(heads[:-1])}

        ready = text_format.Parse(block["model "], service_pb2.ModelReadyResponse())
        self.assertTrue(ready.ready, block["model "])

        metadata = text_format.Parse(block["model metadata:\n"],
                                     service_pb2.ModelMetadataResponse())
        self.assertEqual(metadata.name, "densenet_onnx")
        self.assertEqual(list(metadata.versions), ["1"])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in metadata.inputs],
                         [("data_0", "FP32", [3, 224, 224])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in metadata.outputs],
                         [("fc6_1", "FP32", [1000])])

        config = text_format.Parse(block["model config:\n"],
                                   service_pb2.ModelConfigResponse()).config
        self.assertEqual((config.name, config.max_batch_size), ("densenet_onnx", 0))
        (data,), (fc6,) = config.input, config.output
        self.assertEqual((data.name, list(data.dims), list(data.reshape.shape)),
                         ("data_0", [3, 224, 224], [1, 3, 224, 224]))
        self.assertEqual((fc6.name, list(fc6.dims), list(fc6.reshape.shape), fc6.label_filename),
                         ("fc6_1", [1000], [1, 1000, 1, 1], "densenet_labels.txt"))

        infer = text_format.Parse(block["model infer:\n"], service_pb2.ModelInferResponse())
        self.assertEqual((infer.model_name, infer.model_version, infer.id),
                         ("densenet_onnx", "1", "my request id"))
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in infer.outputs],
                         [("fc6_1", "FP32", [1000])])
        self.assertEqual(len(infer.raw_output_contents), 1)
        self.assertEqual(infer.raw_output_contents[0], DENSENET_FC6)

    def test_every_example_is_run_or_named(self):
        """A new example in the checkout is either run here or named in NOT_RUN."""
        scripts = {f[:-3] for f in os.listdir(self.dir) if f.endswith(".py")}
        known = ({s for s, _, _ in RUNS + CLASSIFY + MODEL_CONTROL + [DENSENET]} | set(NOT_RUN))
        self.assertEqual(sorted(scripts - known), [])


def add_runs():
    for script, protocol, extra in RUNS:
        name = "test_" + script + "".join("_" + a.strip("-") for a in extra)

        def run(self, script=script, protocol=protocol, extra=extra):
            self.run_example(script, protocol, extra)
        run.__doc__ = "%s.py %s, unchanged" % (script, " ".join(extra))
        setattr(TritonExamples, name, run)
    for script, protocol, models in MODEL_CONTROL:
        def control(self, script=script, protocol=protocol, models=models):
            self.model_control(script, protocol, models)
        control.__doc__ = "%s.py, unchanged, on %d models in explicit mode" % (script, models)
        setattr(TritonExamples, "test_" + script, control)
    for script, protocol, extra in CLASSIFY:
        flags = [a.strip("-") for a in extra if a.startswith("-") and a not in ("-m", "-s", "-c")]
        name = "test_classify_" + script + "_" + protocol + "".join("_" + f for f in flags
                                                                    if f != "i")

        def classify(self, script=script, protocol=protocol, extra=extra):
            self.classify(script, protocol, extra)
        classify.__doc__ = "%s.py %s, unchanged: each image's top class" % (script,
                                                                           " ".join(extra))
        setattr(TritonExamples, name, classify)


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
