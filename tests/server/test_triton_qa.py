"""Triton's own qa tests (github.com/triton-inference-server/server, qa/L0_*), their Python files
unchanged, against `asyncinfer serve`, as their test.sh runs them against tritonserver.

The files are never copied into this project: TRITON_SERVER_DIR (or --server-repo DIR) names a
checkout of Triton's server repository; its qa files are read at the tag of the Triton release
they are compared with (v2.51.0, git archive) when the checkout has it, as they are otherwise.
Without a checkout the test clones the qa folders it needs (sparse, depth 1) into a temporary
folder, and exits 77 (ctest: skipped) when that fails too. Triton's qa scripts talk to
localhost:8000 and 8001, so the server and the tests run in a network namespace of their own
(unshare -n, as root), where those ports are free and nothing outside can be reached.

Each run is one server configuration (the flags test.sh gives tritonserver) and one unittest
invocation of a qa file (the classes or cases test.sh runs); a run passes when it exits 0. The
cases left out are named in SKIPPED with the reason, and the test fails when a qa file has a
case named nowhere, so a new upstream case is looked at, not silently left out.
"""

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from netns import loopback_up, require, run_inside, skip, stop

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY_URL = "https://github.com/triton-inference-server/server"
TAG = "v2.51.0"

# What a model of Triton's qa model zoo (built by its gen_qa_* scripts into /data, not published)
# or a GPU would be needed for.
ZOO = "needs a model of Triton's qa model zoo (made by its gen_qa_model_repository scripts, not " \
      "published)"


class Run:
    """One server configuration and one unittest invocation."""

    def __init__(self, test, args=(), env=None, cases=None, models=None, triton_dir=None,
                 repositories=None, server_env=None):
        self.test = test                  # the qa file
        self.args = list(args)            # asyncinfer serve flags beyond the repository
        # The test's and the server's environment beyond ours; in their values {qa} is Triton's
        # qa folder, {suite} the suite's, {root} the folder `repositories` made its own under.
        self.env = dict(env or {})
        self.server_env = dict(server_env or {})
        self.cases = cases or []          # unittest names (Class or Class.test); [] = all
        self.models = models              # a function(qa_dir, repo) that adds models
        # The repository's path under a stand-in for Triton's install folder, which the server
        # (and so its models) gets as TRITON_DIR, as in Triton's container: e.g.
        # "qa/L0_backend_python/models", where init_args expects its folder.
        self.triton_dir = triton_dir
        # A function(suite_dir, root) that makes the repositories under `root` and returns their
        # paths, each given as --model-repository (in place of the one `models` fills).
        self.repositories = repositories


def pt_identity(qa, repo):
    """qa/L0_input_validation/test.sh's pt_identity: torch.nn.Identity scripted, batched."""
    d = os.path.join(repo, "pt_identity")
    os.makedirs(os.path.join(d, "1"))
    subprocess.run(["/usr/bin/python3", "-c",
                    "import sys, torch; torch.jit.save(torch.jit.script(torch.nn.Identity()), "
                    "sys.argv[1])", os.path.join(d, "1", "model.pt")], check=True, timeout=300)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write('name: "pt_identity"\nbackend: "pytorch"\nmax_batch_size: 8\n'
                'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [8] }]\n'
                'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [8] }]\n'
                'dynamic_batching { max_queue_delay_microseconds: 1000000 }\n')


def identity_models(qa, repo):
    """The models of Triton's qa identity model repository that qa/L0_http/http_test.py uses,
    written here from their documented behaviour (input i comes back as output i; max_batch_size
    8) and served by Triton's identity backend (asyncinfer's builtin:identity)."""
    def model(name, dtype, dims, count=1, extra=""):
        d = os.path.join(repo, name)
        os.makedirs(os.path.join(d, "1"))
        shape = ", ".join(str(x) for x in dims)
        ins = ", ".join('{ name: "INPUT%d" data_type: %s dims: [ %s ] }' % (i, dtype, shape)
                        for i in range(count))
        outs = ", ".join('{ name: "OUTPUT%d" data_type: %s dims: [ %s ] }' % (i, dtype, shape)
                         for i in range(count))
        with open(os.path.join(d, "config.pbtxt"), "w") as f:
            f.write('name: "%s"\nbackend: "identity"\nmax_batch_size: 8\ninput [ %s ]\n'
                    'output [ %s ]\n%s' % (name, ins, outs, extra))
    model("onnx_zero_1_float32", "TYPE_FP32", [-1])
    model("onnx_zero_1_object", "TYPE_STRING", [-1])
    model("onnx_zero_1_float16", "TYPE_FP16", [-1, -1])
    model("onnx_zero_3_float32", "TYPE_FP32", [-1], count=3)
    # qa/L0_http/test.sh's two copies: one element, and a queue of one.
    model("onnx_zero_1_object_1_element", "TYPE_STRING", [1])
    model("onnx_zero_1_float32_queue", "TYPE_FP32", [-1],
          extra="dynamic_batching { max_queue_delay_microseconds: 1000000 "
                "preferred_batch_size: [ 8 ] default_queue_policy { max_queue_size: 1 } }\n")


def simple(qa, repo):
    """Triton's `simple` (INT32 add and subtract), as tests/server/triton_models writes it."""
    d = os.path.join(repo, "simple")
    os.makedirs(os.path.join(d, "1"))
    models = os.path.join(HERE, "triton_models")
    shutil.copy(os.path.join(models, "simple", "config.pbtxt"), d)
    shutil.copy(os.path.join(models, "add_sub.py"), os.path.join(d, "1", "model.py"))


def copy_models(sub):
    def add(qa, repo):
        src = os.path.join(qa, sub)
        for name in os.listdir(src):
            shutil.copytree(os.path.join(src, name), os.path.join(repo, name))
    return add


def version_folders(*names):
    """test.sh's `mkdir -p <model>/1` for models whose version folder git does not keep."""
    def add(qa, repo):
        for name in names:
            os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    return add


def namespacing_repositories(test_name):
    """qa/L0_model_namespacing/test.sh: <test_name> copied to test_dir (which test.py moves models
    in), `mkdir -p <model>/1` for every model, and its two repositories."""
    def make(suite_dir, root):
        test_dir = os.path.join(root, "test_dir")
        shutil.copytree(os.path.join(suite_dir, test_name), test_dir)
        repos = [os.path.join(test_dir, r) for r in ("addsub_repo", "subadd_repo")]
        for repo in repos:
            for model in os.listdir(repo):
                os.makedirs(os.path.join(repo, model, "1"), exist_ok=True)
        return repos
    return make


# test.sh's runs: each case alone, against a server with both repositories and namespacing on,
# in poll mode and in explicit mode.
NAMESPACING_RUNS = [
    Run("test.py", cases=["%s.%s" % (suite_class, case)],
        args=["--model-namespacing=true", *mode_flags],
        repositories=namespacing_repositories(case),
        env={"TRITON_QA_ROOT_DIR": "{qa}", "NAMESPACE_TESTING_DIRCTORY": "{root}/test_dir"},
        # PYTHONDONTWRITEBYTECODE: no __pycache__ in a model's folder (poll mode would reload it).
        server_env={"TRITON_QA_ROOT_DIR": "{qa}", "TRITON_QA_PYTHON_MODEL_DIR": "{suite}",
                    "PYTHONDONTWRITEBYTECODE": "1"})
    for suite_class, mode_flags in [
        ("ModelNamespacePoll", ["--model-control-mode=POLL", "--repository-poll-secs=2"]),
        ("ModelNamespaceExplicit", ["--model-control-mode=EXPLICIT"])]
    for case in ["test_duplication", "test_dynamic_resolution", "test_ensemble_duplication",
                 "test_no_duplication"]]


def both(*fns):
    def add(qa, repo):
        for fn in fns:
            fn(qa, repo)
    return add


def backend_python_models(qa, repo):
    """qa/L0_backend_python/test.sh's models for python_test.py: qa/python_models' files, and the
    identity_fp32 copies its sed lines make (another dtype, a batcher, a default_model_filename)."""
    src = os.path.join(os.path.dirname(qa), "python_models")

    def take(name, as_name=None):
        d = os.path.join(repo, as_name or name)
        os.makedirs(os.path.join(d, "1"))
        shutil.copy(os.path.join(src, name, "model.py"), os.path.join(d, "1", "model.py"))
        shutil.copy(os.path.join(src, name, "config.pbtxt"), d)
        return d

    def edit(d, fn):
        path = os.path.join(d, "config.pbtxt")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(fn(text))

    def named(name, dtype=None, batch=None, extra=""):
        d = take("identity_fp32", name)

        def fn(text):
            lines = []
            for line in text.splitlines():
                if line.startswith("name:"):
                    line = 'name: "%s"' % name
                elif line.startswith("max_batch_size:") and batch is not None:
                    line = batch
                lines.append(line.replace("TYPE_FP32", dtype) if dtype else line)
            return "\n".join(lines) + "\n" + extra
        edit(d, fn)
        return d

    for name in ("identity_fp32", "identity_bf16", "pytorch_fp32_fp32", "delayed_model",
                 "init_args", "optional", "non_contiguous", "string", "string_fixed",
                 "dlpack_identity"):
        take(name)
    named("identity_uint8", "TYPE_UINT8", "max_batch_size: 8",
          "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: "
          "12000000 }\n")
    named("identity_uint8_nobatch", "TYPE_UINT8", "")
    named("identity_uint32", "TYPE_UINT32")
    named("identity_bool", "TYPE_BOOL")
    d = named("default_model_name", extra='default_model_filename: "mymodel.py"\n')
    os.rename(os.path.join(d, "1", "model.py"), os.path.join(d, "1", "mymodel.py"))
    edit(os.path.join(repo, "pytorch_fp32_fp32"),
         lambda t: "\n".join('name: "pytorch_fp32_fp32"' if line.startswith("name:") else line
                             for line in t.splitlines()) + "\n")


def batcher_models(variable):
    """qa/L0_batcher/test.sh's models (BACKENDS=python): the config Triton's gen_qa_models.py
    writes for onnx_float32_float32_float32 (run here from qa/common), turned into a python model
    with qa/python_models/add_sub/model.py and given test.sh's batcher by test.sh's own edits;
    the variable-size repository also holds qa/custom_models/custom_zero_1_float32 (Triton's
    identity backend) with a ragged input."""
    def add(suite, repo):
        qa = os.path.dirname(suite)
        onnx_dims = "(-1,)" if variable else "(16,)"
        subprocess.run(
            [sys.executable, "-c",
             "import sys, numpy as np, gen_qa_models as g, test_util\n"
             "g.tu = test_util\n"
             "g.create_onnx_modelconfig(sys.argv[1], 8, 1, %s, %s, %s, np.float32, np.float32, "
             "np.float32, 0, None)" % (onnx_dims, onnx_dims, onnx_dims), repo],
            cwd=os.path.join(qa, "common"), check=True, timeout=120)
        onnx = os.path.join(repo, "onnx_float32_float32_float32")
        python = os.path.join(repo, "python_float32_float32_float32")
        os.makedirs(os.path.join(python, "1"))
        shutil.copy(os.path.join(onnx, "output0_labels.txt"), python)
        shutil.copy(os.path.join(qa, "python_models", "add_sub", "model.py"),
                    os.path.join(python, "1", "model.py"))
        with open(os.path.join(onnx, "config.pbtxt")) as f:
            text = f.read()
        shutil.rmtree(onnx)
        lines = []
        for line in text.replace("onnx", "python").splitlines():
            if line.startswith("platform:"):
                line = 'backend: "python"'
            elif line.startswith("max_batch_size:"):
                line = "max_batch_size: 8"
            elif line.startswith("version_policy:"):
                line = "version_policy: { specific { versions: [1] }}"
            lines.append(line)
        lines.append("dynamic_batching { preferred_batch_size: [ 2, 6 ], "
                     "max_queue_delay_microseconds: 10000000 }")
        with open(os.path.join(python, "config.pbtxt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        if not variable:
            return
        zero = os.path.join(repo, "custom_zero_1_float32")
        shutil.copytree(os.path.join(qa, "custom_models", "custom_zero_1_float32"), zero)
        os.makedirs(os.path.join(zero, "1"))
        with open(os.path.join(zero, "config.pbtxt")) as f:
            text = f.read()
        out = []
        for line in text.splitlines():
            if line.startswith("max_batch_size:"):
                line = "max_batch_size: 8"
            line = re.sub(r"dims:.*\[.*\]", "dims: [ -1 ]", line)
            out.append(line)
            if re.search(r'name:.*"INPUT0"', line):
                out.append("allow_ragged_batch: true")
        # test.sh asks for KIND_GPU (its CI has one); a CPU is what this test may count on.
        out.append("instance_group [ { kind: KIND_CPU count: 1 }]")
        out.append("version_policy: { specific { versions: [1] }}")
        out.append("dynamic_batching { preferred_batch_size: [ 2, 6 ], "
                   "max_queue_delay_microseconds: 10000000 }")
        with open(os.path.join(zero, "config.pbtxt"), "w") as f:
            f.write("\n".join(out) + "\n")
    return add


# qa/L0_batcher/test.sh's groups; each case runs against a server of its own, as test.sh runs
# them (its checks read the model's statistics since the server started).
BATCHER_NO_DELAY = ["test_static_batch_preferred", "test_static_batch_lt_any_preferred",
                    "test_static_batch_not_preferred", "test_static_batch_gt_max_preferred",
                    "test_multi_batch_not_preferred", "test_multi_batch_gt_max_preferred",
                    "test_multi_batch_sum_gt_max_preferred", "test_multi_same_output0",
                    "test_multi_same_output1", "test_multi_different_outputs",
                    "test_multi_different_output_order"]
BATCHER_DIFFERENT_SHAPE = ["test_multi_batch_not_preferred_different_shape",
                           "test_multi_batch_preferred_different_shape",
                           "test_multi_batch_different_shape_allow_ragged",
                           "test_multi_batch_different_shape"]
BATCHER_RUNS = [
    Run("batcher_test.py", cases=["BatcherTest." + case], models=batcher_models(variable),
        env={"BACKENDS": "python", "BATCHER_TYPE": "VARIABLE" if variable else "FIXED"})
    for variable, cases in [(False, BATCHER_NO_DELAY),
                            (True, BATCHER_NO_DELAY + BATCHER_DIFFERENT_SHAPE)]
    for case in cases]
# TRITONSERVER_DELAY_SCHEDULER: a hook of Triton's dynamic batcher for its tests (hold the
# first N requests, then batch them), which these cases set and assert is set.
DELAY_SCHEDULER = "it needs TRITONSERVER_DELAY_SCHEDULER, a test hook of Triton's own scheduler " \
                  "(hold N requests before batching), which asyncinfer does not have"
BATCHER_SKIPPED = {
    "L0_batcher/batcher_test.py::BatcherTest." + case: DELAY_SCHEDULER
    for case in ["test_multi_batch_delayed_sum_gt_max_preferred",
                 "test_multi_batch_delayed_use_max_batch",
                 "test_multi_batch_delayed_preferred_different_shape",
                 "test_multi_batch_use_biggest_preferred", "test_multi_batch_use_best_preferred",
                 "test_preferred_batch_only_aligned", "test_preferred_batch_only_unaligned",
                 "test_preferred_batch_only_use_biggest_preferred",
                 "test_preferred_batch_only_use_no_preferred_size",
                 "test_multi_batch_preserve_ordering"]}
for case in ["test_max_queue_delay_only_default", "test_max_queue_delay_only_non_default"]:
    BATCHER_SKIPPED["L0_batcher/batcher_test.py::BatcherTest." + case] = (
        "it needs Triton's identity backend's execute_delay_ms parameter (a sleep in each "
        "execution) to count the batches that form meanwhile; asyncinfer's identity has none")


# With headers to forward, the HTTP cases are left out: one header value the test sends ends in a
# space, which an HTTP parser drops (RFC 9110 5.5: a field value has no trailing whitespace;
# Boost.Beast drops it, Triton's libevhtp keeps it): test_http_parameter,
# test_async_http_parameter, test_http_async_parameter, test_ensemble_parameter_forwarding. They
# run without headers (test_params), and the gRPC cases, which carry the space, run with them.
HEADER_GRPC_CASES = ["InferenceParametersTest.test_grpc_parameter",
                     "InferenceParametersTest.test_async_grpc_parameter",
                     "InferenceParametersTest.test_grpc_async_parameter",
                     "InferenceParametersTest.test_grpc_stream_parameter"]
PARAMETER_RUNS = []
for header_test, flags in [
        ("test_params", []),
        ("test_headers", ["--grpc-header-forward-pattern", "my_header.*",
                          "--http-header-forward-pattern", "my_header.*"]),
        ("test_header_forward_pattern_case_insensitive",
         ["--grpc-header-forward-pattern", "MY_HEADER.*",
          "--http-header-forward-pattern", "MY_HEADER.*"]),
        ("test_grpc_header_forward_pattern_case_sensitive",
         ["--grpc-header-forward-pattern", "(?-i)MY_HEADER.*"])]:
    with_http_headers = header_test in ("test_headers",
                                        "test_header_forward_pattern_case_insensitive")
    PARAMETER_RUNS.append(Run("parameters_test.py", args=flags, env={"TEST_HEADER": header_test},
                              cases=HEADER_GRPC_CASES if with_http_headers else [],
                              models=both(copy_models("model_repository"),
                                          version_folders("identity", "ensemble"))))

# suite (qa/<suite>) -> runs, as its test.sh makes them
SUITES = {
    "L0_input_validation": [
        Run("input_validation_test.py", cases=["InputValTest"], models=copy_models("models")),
        Run("input_validation_test.py", cases=["InputShapeTest.test_input_shape_validation"],
            models=both(copy_models("models"), pt_identity)),
    ],
    "L0_parameters": PARAMETER_RUNS,
    "L0_trace": [
        Run("trace_endpoint_test.py", models=simple,
            args=["--trace-config", "triton,file=global_unittest.log",
                  "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"]),
    ],
    # test.sh's log_models hold an ONNX model of the zoo; the settings cases need any model.
    "L0_logging": [Run("logging_endpoint_test.py", models=simple)],
    "L0_http": [
        Run("http_test.py", models=identity_models),
        Run("generate_endpoint_test.py", models=copy_models("generate_models")),
        Run("http_restricted_api_test.py", cases=["RestrictedAPITest"], models=simple,
            args=["--http-restricted-api=model-repository:admin-key=admin-value",
                  "--http-restricted-api=inference,metadata:infer-key=infer-value"]),
    ],
    # TEST_JETSON=1: shm_util's leak probe reads Triton's python-backend shared-memory regions
    # through a module of Triton's build (triton_shm_monitor); asyncinfer makes no such regions.
    "L0_backend_python": [
        Run("python_test.py", models=backend_python_models, env={"TEST_JETSON": "1"},
            triton_dir="qa/L0_backend_python/models"),
    ],
    "L0_model_namespacing": NAMESPACING_RUNS,
    "L0_batcher": BATCHER_RUNS,
    "L0_grpc": [
        Run("python_unit_test.py", cases=["RestrictedProtocolTest"], models=simple,
            args=["--grpc-restricted-protocol=model-repository:admin-key=admin-value",
                  "--grpc-restricted-protocol=inference,health:infer-key=infer-value"]),
    ],
}

# "<suite>/<file>::<Class>.<case>" -> why it is not run
SKIPPED = {
    "L0_backend_python/python_test.py::PythonTest.test_growth_error":
        "it grows Triton's python-backend shared-memory pool until it fails with Triton's words "
        "(\"Failed to increase the shared memory pool size\"); asyncinfer has no such pool (a "
        "request's tensors go in a memfd of their own), and a 1 GiB request is refused by the "
        "body limit (413, --max-body-bytes) before any model sees it",
    "L0_backend_python/python_test.py::PythonTest.test_bf16":
        "at v2.51.0 it sends BF16 as np.float32, which the pinned tritonclient (2.73) refuses in "
        "the client before anything is sent; the same qa identity_bf16 model and round trip, "
        "with ml_dtypes.bfloat16, pass in server.triton_features",
    "L0_backend_python/python_test.py::PythonTest.test_init_args":
        "its model answers a request of 2 rows of a batched model with an output of shape [1]; "
        "asyncinfer checks a python model's outputs against its config (dim 0 = the request's "
        "rows) and fails the request, where Triton passes the tensor through; the init args "
        "themselves (the 7 keys, model_repository under TRITON_DIR) are right: the model loads",
    "L0_input_validation/input_validation_test.py::InputShapeTest.test_input_string_shape_validation":
        ZOO + " (graphdef_object_int32_int32, TensorFlow); the BYTES element-count words it "
        "checks are tested by test_conformance.py",
    "L0_input_validation/input_validation_test.py::InputShapeTest.test_wrong_input_shape_tensor_size":
        ZOO + " (TensorRT plan shape-tensor models: a GPU)",
    "L0_http/http_test.py::HttpTest.test_content_encoding_chunked_manually":
        "it sends Transfer-Encoding: chunked and Content-Length together, which asyncinfer refuses "
        "(400) as RFC 9112 6.3 allows, since the pair is the shape of request smuggling; a "
        "chunked body alone is served",
    **BATCHER_SKIPPED,
}


def fetch_qa(given, work):
    """The qa folder of Triton's server repository at TAG where the checkout has it."""
    dest = os.path.join(work, "server")
    paths = ["qa/common", "qa/python_models", "qa/custom_models"] + ["qa/" + s for s in SUITES]
    if given:
        tag = subprocess.run(["git", "-C", given, "rev-parse", "-q", "--verify", TAG + "^{commit}"],
                             capture_output=True, text=True)
        if tag.returncode != 0:
            print("note: %s has no tag %s; its qa files are used as they are" % (given, TAG))
            return os.path.join(given, "qa")
        os.makedirs(dest)
        archive = subprocess.run(["git", "-C", given, "archive", TAG] + paths,
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
        return os.path.join(dest, "qa")
    try:
        subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", TAG, "--filter=blob:none",
                        "--sparse", REPOSITORY_URL, dest], check=True, timeout=300,
                       capture_output=True)
        subprocess.run(["git", "-C", dest, "sparse-checkout", "set"] + paths, check=True,
                       timeout=300, capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        skip("no checkout of Triton's server repository (TRITON_SERVER_DIR) and cloning %s "
             "failed: %s" % (REPOSITORY_URL, e))
    return os.path.join(dest, "qa")


def cases_of(path):
    """Class.test names of the unittest cases a qa file defines."""
    tree = ast.parse(open(path).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        item.name.startswith("test"):
                    out.append("%s.%s" % (node.name, item.name))
    return out


def check_coverage(qa):
    """Every case of the files run is run or named in SKIPPED."""
    unknown = []
    for suite, runs in SUITES.items():
        for test in sorted({r.test for r in runs}):
            run_cases = [c for r in runs if r.test == test for c in (r.cases or [""])]
            for case in cases_of(os.path.join(qa, suite, test)):
                covered = any(c == "" or case == c or case.startswith(c + ".") for c in run_cases)
                key = "%s/%s::%s" % (suite, test, case)
                if not covered and key not in SKIPPED:
                    unknown.append(key)
    return unknown


def wait_ready(server, log, seconds=180):
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=2):
                return True
        except OSError:
            log.seek(0)
            failed = "a model failed to load" in log.read()  # asyncinfer serve's words
            if failed or server.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                print(log.read()[-8000:])
                return False
            time.sleep(0.2)


def run_one(args, qa, suite, run, work):
    server_env = dict(os.environ)
    places = {"qa": qa, "suite": os.path.join(qa, suite), "root": ""}
    if run.repositories:
        places["root"] = tempfile.mkdtemp(prefix="repositories-", dir=work)
        repos = run.repositories(places["suite"], places["root"])
    else:
        if run.triton_dir:
            root = tempfile.mkdtemp(prefix="tritonserver-", dir=work)
            repo = os.path.join(root, run.triton_dir)
            os.makedirs(repo)
            server_env["TRITON_DIR"] = root
        else:
            repo = tempfile.mkdtemp(prefix="models-", dir=work)
        if run.models:
            run.models(places["suite"], repo)
        repos = [repo]
    server_env.update({k: v.format(**places) for k, v in run.server_env.items()})
    repo_flags = [flag for r in repos for flag in ("--model-repository", r)]
    log = open(os.path.join(work, "server.log"), "w+")
    cmd = [args.cli, "serve"] + repo_flags + ["--host", "127.0.0.1"] + run.args
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env)
    try:
        if not wait_ready(server, log):
            print("FAIL: the server did not become ready: %s" % " ".join(cmd))
            return False
        env = dict(os.environ, **{k: v.format(**places) for k, v in run.env.items()})
        cases = run.cases
        if not cases:  # the whole file, less the cases SKIPPED names
            skipped = [c for c in cases_of(os.path.join(qa, suite, run.test))
                       if "%s/%s::%s" % (suite, run.test, c) in SKIPPED]
            if skipped:
                cases = [c for c in cases_of(os.path.join(qa, suite, run.test))
                         if c not in skipped]
        try:
            out = subprocess.run([sys.executable, run.test] + cases,
                                 cwd=os.path.join(qa, suite), env=env, capture_output=True,
                                 text=True, timeout=300)
            ok, text = out.returncode == 0, out.stdout + out.stderr
        except subprocess.TimeoutExpired as e:
            ok, text = False, "timed out after 300 s: %s" % (e.stdout,)
        if not ok:
            print(text[-6000:])
            log.seek(0)
            print("---- server log ----\n" + log.read()[-6000:])
        return ok
    finally:
        stop(server)
        log.close()


def inside(args):
    loopback_up()
    work = tempfile.mkdtemp(prefix="asyncinfer-triton-qa-")
    failures = []
    total = 0
    try:
        for suite, runs in SUITES.items():
            if args.suite and suite not in args.suite:
                continue
            for run in runs:
                total += 1
                name = "%s/%s %s %s %s" % (suite, run.test, " ".join(run.cases),
                                           " ".join("%s=%s" % kv for kv in run.env.items()),
                                           " ".join(run.args))
                ok = run_one(args, args.qa, suite, run, work)
                print("%s %s" % ("ok  " if ok else "FAIL", name), flush=True)
                if not ok:
                    failures.append(name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d of %d runs passed" % (total - len(failures), total))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--server-repo", default=os.environ.get("TRITON_SERVER_DIR", ""))
    p.add_argument("--suite", action="append", help="run only this qa suite (repeatable)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--qa", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        return inside(args)
    require()
    with tempfile.TemporaryDirectory(prefix="asyncinfer-qa-") as work:
        qa = fetch_qa(args.server_repo, work)
        unknown = check_coverage(qa)
        if unknown:
            print("FAIL: qa cases neither run nor named in SKIPPED:\n  " + "\n  ".join(unknown))
            return 1
        inner = ["--cli", os.path.abspath(args.cli), "--qa", qa]
        for s in args.suite or []:
            inner += ["--suite", s]
        return run_inside(__file__, inner, 1500, "the qa tests")


if __name__ == "__main__":
    sys.exit(main())
