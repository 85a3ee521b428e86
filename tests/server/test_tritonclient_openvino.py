"""ONNX and OpenVINO IR models served by `asyncinfer serve` through the openvino backend, checked
with Triton's own Python client: Triton's OpenVINO backend's repository layout (backend
"openvino", model.xml + model.bin, default_model_filename), a repository written for ONNX Runtime
(platform "onnxruntime_onnx", model.onnx), configs that leave the inputs to the model
(auto-complete), OpenVINO's settings as parameters, and models that cannot load (dims that
disagree with the file, an operator OpenVINO lacks) reported UNAVAILABLE while the rest serve.

Run as: python test_tritonclient_openvino.py --cli <asyncinfer> --onnx-dir <dir of
tests/models/make_onnx_models.py's files>
"""

import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository
from triton_fixture import serve

ONNX_DIR = None

ADD_OPENVINO = """name: "add_openvino"
backend: "openvino"
max_batch_size: 8
default_model_filename: "model.onnx"
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

ADD_IR = """name: "add_ir"
backend: "openvino"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] },
        { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "sum", data_type: TYPE_FP32, dims: [ 4 ] },
         { name: "prod", data_type: TYPE_FP32, dims: [ 4 ] } ]
parameters { key: "NUM_STREAMS" value { string_value: "1" } }
"""

ADD_ORT = """name: "add_ort"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] },
        { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "prod", data_type: TYPE_FP32, dims: [ 4 ] },
         { name: "sum", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""

BAD_DIMS = """name: "bad_dims"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 5 ] },
        { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

BAD_OP = """name: "bad_op"
platform: "onnxruntime_onnx"
max_batch_size: 8
"""

BAD_PARAMETER = """name: "bad_parameter"
backend: "openvino"
default_model_filename: "model.onnx"
max_batch_size: 8
parameters { key: "NUM_STREAMZ" value { string_value: "2" } }
"""

PASSTHRU = """name: "passthru"
platform: "onnxruntime_onnx"
max_batch_size: 8
"""

HALF = """name: "half"
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""

STATIC = """name: "static"
platform: "onnxruntime_onnx"
max_batch_size: 0
"""


def model(name):
    return os.path.join(ONNX_DIR, name)


def inputs(module, x, y, names=("x", "y")):
    out = []
    for name, v in zip(names, (x, y)):
        i = module.InferInput(name, list(v.shape), "FP32")
        i.set_data_from_numpy(v)
        out.append(i)
    return out


class OpenVinoModels(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = Repository()
        cls.repo.add("add_openvino", ADD_OPENVINO, files={"1/model.onnx": model("add.onnx")})
        cls.repo.add("add_ir", ADD_IR, files={"1/model.xml": model("add.xml"),
                                              "1/model.bin": model("add.bin")})
        cls.repo.add("add_ort", ADD_ORT, files={"1/model.onnx": model("add.onnx")})
        cls.repo.add("bad_dims", BAD_DIMS, files={"1/model.onnx": model("add.onnx")})
        cls.repo.add("bad_op", BAD_OP, files={"1/model.onnx": model("unsupported_op.onnx")})
        cls.repo.add("bad_parameter", BAD_PARAMETER, files={"1/model.onnx": model("add.onnx")})
        cls.repo.add("static", STATIC, files={"1/model.onnx": model("static2.onnx")})
        cls.repo.add("passthru", PASSTHRU, files={"1/model.onnx": model("passthru.onnx")})
        cls.repo.add("half", HALF, files={"1/model.onnx": model("half.onnx")})
        # No config.pbtxt at all: model.onnx says it all (Triton's auto-complete).
        cls.repo.add("add_bare", None, files={"1/model.onnx": model("add.onnx")})
        serve(cls, cls.repo.path, repo=cls.repo, concurrency=8)

    def check_add(self, result, x, y):
        np.testing.assert_array_equal(result.as_numpy("sum"), x + y)
        np.testing.assert_array_equal(result.as_numpy("prod"), x * y)

    def test_onnx_in_a_triton_openvino_layout_over_http_and_grpc(self):
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        y = np.full((3, 4), 0.5, dtype=np.float32)
        self.check_add(self.http.infer("add_openvino", inputs(httpclient, x, y)), x, y)
        self.check_add(self.grpc.infer("add_openvino", inputs(grpcclient, x, y)), x, y)

    def test_config_auto_completed_from_the_model(self):
        c = self.http.get_model_config("add_openvino")
        self.assertEqual(c["backend"], "openvino")
        self.assertEqual(c["platform"], "openvino")
        self.assertEqual(c["default_model_filename"], "model.onnx")
        self.assertEqual([(i["name"], i["data_type"], [int(d) for d in i["dims"]])
                          for i in c["input"]],
                         [("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [4])])
        self.assertEqual([o["name"] for o in c["output"]], ["sum", "prod"])
        md = self.grpc.get_model_metadata("add_openvino")
        self.assertEqual(md.platform, "openvino")
        self.assertEqual([list(i.shape) for i in md.inputs], [[-1, 4], [-1, 4]])

    def test_a_folder_with_model_onnx_alone_is_completed_as_triton_does(self):
        # As Triton's ONNX Runtime backend: every dim 0 dynamic, so max_batch_size 4 (Triton's
        # default-max-batch-size) and dynamic batching; the tensors from the file.
        # (model.onnx is served by the openvino backend, which the config then names.)
        c = self.http.get_model_config("add_bare")
        self.assertEqual((c["backend"], c["platform"]), ("openvino", "openvino"))
        self.assertEqual(c["default_model_filename"], "model.onnx")
        self.assertEqual(c["max_batch_size"], 4)
        self.assertIn("dynamic_batching", c)
        self.assertEqual([(i["name"], i["data_type"], [int(d) for d in i["dims"]])
                          for i in c["input"]],
                         [("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [4])])
        self.assertEqual([o["name"] for o in c["output"]], ["sum", "prod"])
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        self.check_add(self.grpc.infer("add_bare", inputs(grpcclient, x, x)), x, x)
        # A config that gives max_batch_size 8 and no batcher gets dynamic batching too.
        self.assertIn("dynamic_batching", self.http.get_model_config("passthru"))

    def test_openvino_ir_with_num_streams(self):
        x = np.ones((2, 4), dtype=np.float32)
        y = np.arange(8, dtype=np.float32).reshape(2, 4)
        self.check_add(self.http.infer("add_ir", inputs(httpclient, x, y)), x, y)
        c = self.http.get_model_config("add_ir")
        self.assertEqual(c["default_model_filename"], "model.xml")
        # NUM_STREAMS 1 and no instance_group: one worker, one infer request.
        self.assertEqual(c["instance_group"][0]["count"], 1)

    def test_onnxruntime_repository_served_in_the_configs_order(self):
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        y = np.full((1, 4), 3.0, dtype=np.float32)
        r = self.grpc.infer("add_ort", inputs(grpcclient, y, x, names=("y", "x")))
        self.check_add(r, x, y)
        self.assertIn("is served by the openvino backend", self.server.log())
        c = self.http.get_model_config("add_ort")
        self.assertEqual(c["instance_group"][0]["count"], 2)
        self.assertEqual(c["default_model_filename"], "model.onnx")

    def test_many_concurrent_requests_are_batched_and_right(self):
        rng = np.random.default_rng(7)
        pending = []
        for _ in range(40):
            x = rng.standard_normal((1, 4)).astype(np.float32)
            y = rng.standard_normal((1, 4)).astype(np.float32)
            pending.append((x, y, self.http.async_infer("add_openvino", inputs(httpclient, x, y))))
        for x, y, p in pending:
            self.check_add(p.get_result(), x, y)
        stats = self.http.get_inference_statistics("add_openvino")["model_stats"][0]
        self.assertGreaterEqual(int(stats["inference_count"]), 40)

    def test_static_model_without_a_batch_dim(self):
        x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
        i = httpclient.InferInput("x", [2, 3], "FP32")
        i.set_data_from_numpy(x)
        r = self.http.infer("static", [i])
        np.testing.assert_array_equal(r.as_numpy("y"), np.maximum(x, 0))
        i = httpclient.InferInput("x", [3, 3], "FP32")
        i.set_data_from_numpy(np.zeros((3, 3), np.float32))
        with self.assertRaises(InferenceServerException) as e:
            self.http.infer("static", [i])
        self.assertIn("dim 0", str(e.exception))

    def test_an_output_that_is_an_input_comes_back_right(self):
        x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
        i = grpcclient.InferInput("x", [2, 4], "FP32")
        i.set_data_from_numpy(x)
        r = self.grpc.infer("passthru", [i])
        np.testing.assert_array_equal(r.as_numpy("x"), x)
        np.testing.assert_array_equal(r.as_numpy("r"), np.maximum(x, 0))

    def test_a_model_that_returns_fewer_rows_fails_instead_of_answering_garbage(self):
        # Four one-row requests batched together: the model gives back 2 rows for 4. Each
        # request gets an error (or, where it ran alone, its one right row), never other
        # memory.
        x = [np.full((1, 4), k, dtype=np.float32) for k in range(4)]
        pending = []
        for v in x:
            i = httpclient.InferInput("x", [1, 4], "FP32")
            i.set_data_from_numpy(v)
            pending.append((v, self.http.async_infer("half", [i])))
        errors = 0
        for v, p in pending:
            try:
                np.testing.assert_array_equal(p.get_result().as_numpy("y"), v)
            except InferenceServerException as e:
                errors += 1
                self.assertIn("output 'y' came out as", str(e))
        self.assertTrue(self.http.is_model_ready("half"))

    def index(self):
        return {m["name"]: m for m in self.http.get_model_repository_index()}

    def test_dims_that_disagree_with_the_file_make_the_model_unavailable(self):
        m = self.index()["bad_dims"]
        self.assertEqual(m["state"], "UNAVAILABLE")
        self.assertIn("input 'x'", m["reason"])
        self.assertIn("dim 1 is 4 in the model, 5 given", m["reason"])
        self.assertFalse(self.http.is_model_ready("bad_dims"))

    def test_unsupported_operator_makes_the_model_unavailable(self):
        m = self.index()["bad_op"]
        self.assertEqual(m["state"], "UNAVAILABLE")
        self.assertIn("com.example.NoSuchOp", m["reason"])

    def test_unknown_openvino_parameter_is_named(self):
        m = self.index()["bad_parameter"]
        self.assertEqual(m["state"], "UNAVAILABLE")
        self.assertIn("NUM_STREAMZ", m["reason"])

    def test_the_others_serve_beside_the_failed_ones(self):
        index = self.index()
        for name in ("add_openvino", "add_ir", "add_ort", "static", "passthru", "half"):
            self.assertEqual(index[name]["state"], "READY", index[name])
            self.assertTrue(self.grpc.is_model_ready(name))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--onnx-dir" in argv:
        k = argv.index("--onnx-dir")
        ONNX_DIR = argv[k + 1]
        del sys.argv[k + 1:k + 3]
    if not ONNX_DIR:
        sys.exit("usage: test_tritonclient_openvino.py --cli <asyncinfer> --onnx-dir <dir>")
    harness.parse_args()
    harness.unittest.main(verbosity=2)
