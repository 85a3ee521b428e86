"""Triton features that its own qa tests check (qa/L0_input_validation, qa/L0_parameters), checked
here with Triton's client so that CI catches a regression without the qa checkout
(test_triton_qa.py runs the qa files themselves):

- optional inputs (`optional: true`) of a python model: left out, given, batched with others;
- the request validation in Triton's words: too few or too many inputs, an unknown one, BYTES
  element counts, raw byte sizes;
- request parameters reaching a model (pb_utils request.parameters()), directly and through an
  ensemble, and the reserved "triton_" prefix refused;
- header forwarding (--http-header-forward-pattern, --grpc-header-forward-pattern): RE2,
  case-insensitive unless the pattern says (?-i), and a bad pattern refused at start;
- Triton's `backend: "identity"`, and a python model with no config.pbtxt completed from its
  model.py (refused with --disable-auto-complete-config);
- `reshape`: the model takes and gives its shapes, clients send and get the config's dims;
- BF16 tensors of a python model, through DLPack (torch), and as_numpy() refusing them."""

import json
import os
import struct
import subprocess
import textwrap

import grpc
import ml_dtypes
import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository, Server
from triton_fixture import serve

# Which inputs came, and how many rows each request had: OUTPUT0 = the names (comma-joined) per
# request, ROWS = the rows of the request's first input (0 when none came).
OPTIONAL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            names = sorted(t.name() for t in r.inputs())
            rows = r.inputs()[0].as_numpy().shape[0] if r.inputs() else 1
            came = np.array([[",".join(names).encode()]] * rows, dtype=object)
            total = np.zeros((rows, 1), dtype=np.float32)
            for t in r.inputs():
                total += t.as_numpy().reshape(rows, -1).sum(axis=1, keepdims=True)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("CAME", came),
                                                   pb_utils.Tensor("SUM", total)]))
        return out
'''

OPTIONAL_CONFIG = '''
name: "optional"
backend: "python"
max_batch_size: 8
input [
  { name: "A", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "B", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "C", data_type: TYPE_FP32, dims: [ 2 ], optional: true }
]
output [
  { name: "CAME", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "SUM", data_type: TYPE_FP32, dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 200000 }
'''

# qa/L0_parameters' parameter model, as its users write one: the parameters as key and value
# outputs. No config.pbtxt: auto_complete_config gives its inputs and outputs.
PARAMETER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]})
        config.add_output({"name": "key", "data_type": "TYPE_STRING", "dims": [-1]})
        config.add_output({"name": "value", "data_type": "TYPE_STRING", "dims": [-1]})
        config.set_max_batch_size(0)
        return config

    def execute(self, requests):
        out = []
        for r in requests:
            p = json.loads(r.parameters())
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("key", np.array(list(p.keys()), dtype=object)),
                pb_utils.Tensor("value", np.array([str(v) for v in p.values()], dtype=object))]))
        return out
'''

IDENTITY_CONFIG = '''
name: "identity"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
'''

ENSEMBLE_CONFIG = '''
name: "ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "key", data_type: TYPE_STRING, dims: [ -1 ] },
         { name: "value", data_type: TYPE_STRING, dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity", model_version: -1,
    input_map { key: "INPUT0", value: "INPUT0" }, output_map { key: "OUTPUT0", value: "mid" } },
  { model_name: "parameter", model_version: -1,
    input_map { key: "INPUT0", value: "mid" },
    output_map { key: "key", value: "key" }, output_map { key: "value", value: "value" } }
] }
'''

STRINGS_CONFIG = '''
name: "strings"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 4 ] } ]
output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 4 ] } ]
'''

STRINGS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy())])
            for r in requests]
'''


# reshape: clients send and get [4] a row; the model takes [2, 2] and gives [2, 2] back, plus
# what it was given (its input's shape and the identity backend, variable dims).
RESHAPE_CONFIG = '''
name: "reshape"
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 2, 2 ] } } ]
output [
  { name: "Y", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 2, 2 ] } },
  { name: "SEEN", data_type: TYPE_INT64, dims: [ 2 ] }
]
'''

RESHAPE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            seen = np.tile(np.array(x.shape[1:], np.int64), (x.shape[0], 1))
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x.transpose(0, 2, 1) * 10).astype(np.float32)),
                pb_utils.Tensor("SEEN", seen)]))
        return out
'''

# The identity backend with variable dims on both sides: [-1, 6] rows as [-1, 2, 3] (the -1
# taken from the request), and a scalar a row ([1] as []).
RESHAPE_IDENTITY_CONFIG = '''
name: "reshape_identity"
backend: "identity"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ -1, 6 ], reshape: { shape: [ -1, 2, 3 ] } },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 1 ], reshape: { shape: [ ] } }
]
output [
  { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ -1, 6 ], reshape: { shape: [ -1, 2, 3 ] } },
  { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 1 ], reshape: { shape: [ ] } }
]
'''


# BF16 in a python model: numpy has no type for it, so the model goes through DLPack (torch here),
# as Triton's qa identity_bf16 does; the same DLPack road for an FP32 tensor, through numpy.
BF16_CONFIG = '''
name: "bf16"
backend: "python"
max_batch_size: 8
input [
  { name: "X", data_type: TYPE_BF16, dims: [ -1 ] },
  { name: "F", data_type: TYPE_FP32, dims: [ 2 ] }
]
output [
  { name: "DOUBLED", data_type: TYPE_BF16, dims: [ -1 ] },
  { name: "F_OUT", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "AS_NUMPY", data_type: TYPE_STRING, dims: [ 1 ] }
]
'''

BF16 = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            try:
                x.as_numpy()
                refused = b"as_numpy gave an array"
            except pb_utils.TritonModelException as e:
                refused = str(e).encode()
            doubled = torch.utils.dlpack.from_dlpack(x.to_dlpack()) * 2
            assert doubled.dtype == torch.bfloat16
            f = pb_utils.get_input_tensor_by_name(r, "F")
            f_out = pb_utils.Tensor.from_dlpack("F", f.to_dlpack()).as_numpy() + 1
            rows = doubled.shape[0]
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("DOUBLED", torch.utils.dlpack.to_dlpack(doubled)),
                pb_utils.Tensor.from_dlpack("F_OUT", torch.from_numpy(f_out.copy())),
                pb_utils.Tensor("AS_NUMPY", np.array([[refused]] * rows, dtype=np.object_))]))
        return out
'''


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def make_repository():
    repo = Repository()
    repo.add("optional", OPTIONAL_CONFIG)
    write(os.path.join(repo.path, "optional", "1", "model.py"), OPTIONAL)
    repo.add("parameter", None)  # no config.pbtxt
    write(os.path.join(repo.path, "parameter", "1", "model.py"), PARAMETER)
    repo.add("identity", IDENTITY_CONFIG)
    repo.add("ensemble", ENSEMBLE_CONFIG)
    repo.add("strings", STRINGS_CONFIG)
    write(os.path.join(repo.path, "strings", "1", "model.py"), STRINGS)
    repo.add("reshape", RESHAPE_CONFIG)
    write(os.path.join(repo.path, "reshape", "1", "model.py"), RESHAPE)
    repo.add("reshape_identity", RESHAPE_IDENTITY_CONFIG)
    repo.add("bf16", BF16_CONFIG)
    write(os.path.join(repo.path, "bf16", "1", "model.py"), BF16)
    return repo


def f32(client, name, x):
    i = client.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def params_of(result):
    keys = [k.decode() for k in result.as_numpy("key")]
    values = [v.decode() for v in result.as_numpy("value")]
    return dict(zip(keys, values))


class Inputs(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = make_repository()
        serve(cls, cls.repo.path, repo=cls.repo)

    def test_an_optional_input_may_be_left_out_or_given(self):
        a = np.array([[1, 2]], dtype=np.float32)
        c = np.array([[100, 200]], dtype=np.float32)
        for client in (httpclient, grpcclient):
            conn = self.http if client is httpclient else self.grpc
            r = conn.infer("optional", [f32(client, "A", a), f32(client, "B", a)])
            self.assertEqual(r.as_numpy("CAME").tolist(), [[b"A,B"]])
            self.assertEqual(r.as_numpy("SUM").tolist(), [[6.0]])
            r = conn.infer("optional", [f32(client, "C", c), f32(client, "A", a),
                                        f32(client, "B", a)])
            self.assertEqual(r.as_numpy("CAME").tolist(), [[b"A,B,C"]])
            self.assertEqual(r.as_numpy("SUM").tolist(), [[306.0]])

    def test_requests_with_and_without_the_optional_input_batch_apart(self):
        a = np.array([[1, 1]], dtype=np.float32)
        results = []
        for k in range(6):
            inputs = [f32(httpclient, "A", a * k), f32(httpclient, "B", a)]
            if k % 2:
                inputs.append(f32(httpclient, "C", a))
            results.append((k, self.http.async_infer("optional", inputs)))
        for k, pending in results:
            r = pending.get_result(timeout=30)
            self.assertEqual(r.as_numpy("CAME").tolist(), [[b"A,B,C" if k % 2 else b"A,B"]])
            self.assertEqual(r.as_numpy("SUM").tolist(), [[2.0 * k + 2 + (2 if k % 2 else 0)]])

    def test_missing_and_unknown_inputs_in_tritons_words(self):
        a = np.array([[1, 2]], dtype=np.float32)
        cases = [
            ([], "expected number of inputs between 2 and 3 but got 0 inputs for model "
                 "'optional'. Got input(s) [], but missing required input(s) ['A','B']. "
                 "Please provide all required input(s)."),
            (["C"], "expected number of inputs between 2 and 3 but got 1 inputs for model "
                    "'optional'. Got input(s) ['C'], but missing required input(s) ['A','B']."),
            (["A", "C"], "but got 2 inputs for model 'optional'. Got input(s) ['A','C'], but "
                         "missing required input(s) ['B']."),
            (["A", "X"], "unexpected inference input 'X' for model 'optional'"),
        ]
        for names, words in cases:
            for client, conn in ((httpclient, self.http), (grpcclient, self.grpc)):
                with self.assertRaises(InferenceServerException) as e:
                    conn.infer("optional", [f32(client, n, a) for n in names])
                self.assertIn(words, str(e.exception))
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("identity", [])
        self.assertIn("expected 1 inputs but got 0 inputs for model 'identity'. Got input(s) [], "
                      "but missing required input(s) ['INPUT0']. Please provide all required "
                      "input(s).", str(e.exception))

    def grpc_stub(self):
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        return pb_grpc.GRPCInferenceServiceStub(channel)

    def test_bytes_element_counts_and_raw_sizes_in_tritons_words(self):
        stub = self.grpc_stub()
        def strings(n):
            return b"".join(struct.pack("<I", 1) + b"x" for _ in range(n))
        for n, words in [(3, "expected 4 string elements for inference input 'TEXT' for model "
                             "'strings', got 3"),
                         (6, "unexpected number of string elements 5 for inference input 'TEXT' "
                             "for model 'strings', expecting 4")]:
            req = pb.ModelInferRequest(model_name="strings")
            req.inputs.add(name="TEXT", datatype="BYTES", shape=[4])
            req.raw_input_contents.append(strings(n))
            with self.assertRaises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(words, e.exception.details())
        req = pb.ModelInferRequest(model_name="identity")
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        req.raw_input_contents.append(b"\0" * 8)
        with self.assertRaises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=10)
        self.assertIn("input byte size mismatch for input 'INPUT0' for model 'identity'. "
                      "Expected 4, got 8", e.exception.details())
        r = self.grpc.infer("strings", [grpcclient.InferInput("TEXT", [4], "BYTES")
                                        .set_data_from_numpy(np.array([b"a", b"", b"c", b"dd"],
                                                                      dtype=object))])
        self.assertEqual(r.as_numpy("OUT").tolist(), [b"a", b"", b"c", b"dd"])

    def test_identity_backend(self):
        x = np.array([3.5], dtype=np.float32)
        r = self.http.infer("identity", [f32(httpclient, "INPUT0", x)])
        self.assertEqual(r.as_numpy("OUTPUT0").tolist(), [3.5])

    def test_reshape_gives_the_model_its_shapes_and_clients_theirs(self):
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        for client, conn in ((httpclient, self.http), (grpcclient, self.grpc)):
            r = conn.infer("reshape", [f32(client, "X", x)])
            # The model saw [3, 2, 2], transposed each row as 2x2, and it comes back as [3, 4].
            self.assertEqual(r.as_numpy("SEEN").tolist(), [[2, 2]] * 3)
            want = (x.reshape(3, 2, 2).transpose(0, 2, 1) * 10).reshape(3, 4)
            self.assertEqual(r.as_numpy("Y").tolist(), want.tolist())
        meta = self.http.get_model_metadata("reshape")
        self.assertEqual(meta["inputs"][0]["shape"], [-1, 4])
        self.assertEqual(meta["outputs"][0]["shape"], [-1, 4])
        config = self.http.get_model_config("reshape")
        self.assertEqual(config["input"][0]["reshape"], {"shape": [2, 2]})
        self.assertEqual(config["output"][0]["reshape"], {"shape": [2, 2]})
        # A request in the model's shape is refused in the clients' terms.
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("reshape", [f32(httpclient, "X", x.reshape(3, 2, 2))])
        self.assertIn("'X'", str(e.exception))
        # Variable dims: the -1 comes from the request; [1] goes to the model as a scalar.
        a = np.arange(24, dtype=np.int32).reshape(2, 2, 6)
        b = np.array([[7], [8]], dtype=np.int32)
        for client, conn in ((httpclient, self.http), (grpcclient, self.grpc)):
            ins = [client.InferInput("INPUT0", [2, 2, 6], "INT32"),
                   client.InferInput("INPUT1", [2, 1], "INT32")]
            ins[0].set_data_from_numpy(a)
            ins[1].set_data_from_numpy(b)
            r = conn.infer("reshape_identity", ins)
            self.assertEqual(r.as_numpy("OUTPUT0").tolist(), a.tolist())
            self.assertEqual(r.as_numpy("OUTPUT1").tolist(), b.tolist())

    def test_bf16_reaches_a_python_model_through_dlpack(self):
        x = np.array([[1, 1.5, -2], [0.25, 3, 100]], dtype=ml_dtypes.bfloat16)
        f = np.array([[1, 2], [3, 4]], dtype=np.float32)
        for client, conn in ((httpclient, self.http), (grpcclient, self.grpc)):
            ins = [client.InferInput("X", list(x.shape), "BF16"),
                   client.InferInput("F", list(f.shape), "FP32")]
            ins[0].set_data_from_numpy(x)
            ins[1].set_data_from_numpy(f)
            r = conn.infer("bf16", ins)
            out = r.as_numpy("DOUBLED")
            self.assertEqual(out.dtype, ml_dtypes.bfloat16)
            self.assertEqual(out.astype(np.float32).tolist(),
                             [[2, 3, -4], [0.5, 6, 200]])
            self.assertEqual(r.as_numpy("F_OUT").tolist(), [[2, 3], [4, 5]])
            # as_numpy() refuses BF16 in Triton's words (its qa identity_bf16 checks them).
            self.assertIn(b"tensor dtype is bf16 and cannot be converted to numpy",
                          r.as_numpy("AS_NUMPY")[0][0].lower())
        self.assertEqual(self.http.get_model_metadata("bf16")["inputs"][0]["datatype"], "BF16")

    def test_a_python_model_without_a_config_is_completed_from_model_py(self):
        config = self.http.get_model_config("parameter")
        self.assertEqual(config["backend"], "python")
        self.assertEqual([i["name"] for i in config["input"]], ["INPUT0"])
        self.assertEqual(sorted(o["name"] for o in config["output"]), ["key", "value"])


class Parameters(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = make_repository()
        serve(cls, cls.repo.path, "--http-header-forward-pattern", "my_header.*",
              "--grpc-header-forward-pattern", "MY_HEADER.*", repo=cls.repo)

    def test_parameters_reach_the_model_directly_and_through_an_ensemble(self):
        x = np.array([1], dtype=np.float32)
        given = {"key1": "value1", "n": 7, "f": 1.25, "flag": True}
        want = {"key1": "value1", "n": "7", "f": "1.25", "flag": "True"}
        for model in ("parameter", "ensemble"):
            for client, conn in ((httpclient, self.http), (grpcclient, self.grpc)):
                r = conn.infer(model, [f32(client, "INPUT0", x)], parameters=given)
                self.assertEqual(params_of(r), want, (model, client.__name__))

    def test_the_triton_prefix_is_reserved(self):
        # Raw requests: tritonclient refuses such keys itself before sending.
        words = "parameter keys starting with 'triton_' are reserved for Triton usage"
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}],
                "parameters": {"triton_x": 1}}
        r = requests.post(self.server.url + "/v2/models/parameter/infer", data=json.dumps(body),
                          timeout=10)
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn(words, r.json()["error"])
        req = pb.ModelInferRequest(model_name="parameter")
        t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        t.contents.fp32_contents.append(1)
        req.parameters["triton_x"].bool_param = True
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        with self.assertRaises(grpc.RpcError) as e:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(words, e.exception.details())
        # The one a client may send.
        req.parameters.clear()
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        r = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=10)
        self.assertEqual([o.name for o in r.outputs], ["key", "value"])

    def test_headers_matching_the_pattern_become_parameters(self):
        x = np.array([1], dtype=np.float32)
        headers = {"header_1": "value_1", "my_header_1": "my_value_1",
                   "My_Header_2": 'a "quoted" value\\'}
        # HTTP: "my_header.*", case-insensitive as Triton makes it; the name as it came.
        r = self.http.infer("parameter", [f32(httpclient, "INPUT0", x)], headers=dict(headers),
                            parameters={"p": "q"})
        self.assertEqual(params_of(r), {"p": "q", "my_header_1": "my_value_1",
                                        "My_Header_2": 'a "quoted" value\\'})
        r = self.http.infer("ensemble", [f32(httpclient, "INPUT0", x)], headers=dict(headers))
        self.assertEqual(params_of(r), {"my_header_1": "my_value_1",
                                        "My_Header_2": 'a "quoted" value\\'})
        # gRPC: "MY_HEADER.*", case-insensitive; metadata keys are lower case (HTTP/2).
        lower = {k.lower(): v for k, v in headers.items()}
        r = self.grpc.infer("parameter", [f32(grpcclient, "INPUT0", x)], headers=lower)
        self.assertEqual(params_of(r), {"my_header_1": "my_value_1",
                                        "my_header_2": 'a "quoted" value\\'})

    def test_a_header_does_not_replace_a_parameter_of_the_request(self):
        x = np.array([1], dtype=np.float32)
        r = self.http.infer("parameter", [f32(httpclient, "INPUT0", x)],
                            headers={"my_header_1": "from the header"},
                            parameters={"my_header_1": "from the body"})
        self.assertEqual(params_of(r), {"my_header_1": "from the body"})


class CommandLine(harness.unittest.TestCase):
    def test_a_bad_forward_pattern_is_refused_at_start(self):
        repo = Repository()
        self.addCleanup(repo.cleanup)
        out = subprocess.run([harness.ARGS.cli, "serve", "--model-repository", repo.path,
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1",
                              "--grpc-header-forward-pattern", "my_(header"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("--grpc-header-forward-pattern 'my_(header' is not a regular expression",
                      out.stderr)

    def test_a_pattern_may_turn_case_insensitivity_off(self):
        repo = make_repository()
        self.addCleanup(repo.cleanup)
        server = Server(repo.path, "--grpc-header-forward-pattern", "(?-i)MY_HEADER.*").start()
        self.addCleanup(server.stop)
        client = grpcclient.InferenceServerClient(server.grpc_target)
        self.addCleanup(client.close)
        x = np.array([1], dtype=np.float32)
        r = client.infer("parameter", [f32(grpcclient, "INPUT0", x)],
                         headers={"my_header_1": "v"})
        self.assertEqual(params_of(r), {})

    def test_no_config_and_no_auto_complete_is_refused_saying_why(self):
        repo = make_repository()
        self.addCleanup(repo.cleanup)
        server = Server(repo.path, "--disable-auto-complete-config").start()
        self.addCleanup(server.stop)
        http = httpclient.InferenceServerClient("127.0.0.1:%d" % server.http_port)
        self.addCleanup(http.close)
        self.assertFalse(http.is_model_ready("parameter"))
        index = {m["name"]: m for m in http.get_model_repository_index()}
        self.assertIn("auto-complete is off", index["parameter"].get("reason", ""))
        self.assertTrue(http.is_model_ready("optional"))


if __name__ == "__main__":
    harness.main()
