#!/usr/bin/python3
"""make_onnx_models.py — small ONNX and OpenVINO IR files for the openvino backend's tests.

Writes to --out (made if missing), with Debian's python3-onnx (onnx.helper) for the ONNX files
and OpenVINO's own converter (`ovc`, from the wheel in .venv/openvino) for the IR:
  add.onnx             x f32[N,4], y f32[N,4] -> sum = x + y, prod = x * y   (dim 0 dynamic)
  add.xml, add.bin     the same model as OpenVINO IR (ovc add.onnx)
  nobin.xml            add.xml without its .bin
  static2.onnx         x f32[2,3] -> y = relu(x)                          (static, no batch dim)
  static1.onnx         x f32[1,4] -> y = x * 2                            (static dim 0 = 1)
  pool.onnx            x f32[N,3,H,W] -> y = GlobalAveragePool(x) f32[N,3,1,1] (H, W dynamic)
  ranges.onnx          x f32[N,4] -> y = x[:, :k] with k = 2 (a dynamic dim after the batch dim
                       in the output: Slice with a runtime end taken from Shape)
  passthru.onnx        x f32[N,4] -> x itself, and r = relu(x): an output that is an input
  half.onnx            x f32[N,4] -> y = x[0 : (N+1)/2], declared f32[N,4]: fewer rows than the
                       batch, which the declared shape hides
  dupout.onnx          x f32[N,4] -> y = -x, listed twice as an output
  unsupported_op.onnx  x f32[N,4] -> y = NoSuchOp(x), an operator no front end knows
  string_input.onnx    s string[N] -> Identity: a dtype asyncinfer does not have
  truncated.onnx       the first half of add.onnx's bytes
  corrupt.onnx         bytes that are no protobuf
  accumulator.onnx     INPUT i32[N,1], START i32[N,1], ACC_IN i32[N,1] -> OUTPUT = ACC_IN *
                       (1 - START) + INPUT, ACC_OUT = OUTPUT: a stateful model whose running
                       sum is implicit state (sequence_batching state ACC_IN -> ACC_OUT)
Each run rewrites everything; it takes about a second.
"""
import argparse
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 13


def save(model, path, check=True):
    if check:
        onnx.checker.check_model(model)
    onnx.save(model, path)


def value(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def graph_model(name, nodes, inputs, outputs, initializers=(), opsets=None, check=True):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", OPSET)],
                              producer_name="asyncinfer tests")
    model.ir_version = 7
    if check:
        onnx.checker.check_model(model)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--ovc", required=True, help="OpenVINO's converter (.venv/openvino/bin/ovc)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    f32 = TensorProto.FLOAT

    add = graph_model("add", [helper.make_node("Add", ["x", "y"], ["sum"]),
                              helper.make_node("Mul", ["x", "y"], ["prod"])],
                      [value("x", f32, ["N", 4]), value("y", f32, ["N", 4])],
                      [value("sum", f32, ["N", 4]), value("prod", f32, ["N", 4])])
    save(add, os.path.join(out, "add.onnx"))

    save(graph_model("static2", [helper.make_node("Relu", ["x"], ["y"])],
                     [value("x", f32, [2, 3])], [value("y", f32, [2, 3])]),
         os.path.join(out, "static2.onnx"))

    two = helper.make_tensor("two", f32, [], [2.0])
    save(graph_model("static1", [helper.make_node("Mul", ["x", "two"], ["y"])],
                     [value("x", f32, [1, 4])], [value("y", f32, [1, 4])], [two]),
         os.path.join(out, "static1.onnx"))

    save(graph_model("pool", [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
                     [value("x", f32, ["N", 3, "H", "W"])], [value("y", f32, ["N", 3, 1, 1])]),
         os.path.join(out, "pool.onnx"))

    # y = x[:, 0:k] where k = (number of columns of x) / 2: the output's dim 1 is not known
    # until the input's shape is, so OpenVINO allocates the output itself.
    i64 = TensorProto.INT64
    consts = [helper.make_tensor("zero", i64, [1], [0]), helper.make_tensor("one", i64, [1], [1]),
              helper.make_tensor("two_i", i64, [1], [2])]
    save(graph_model("ranges", [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["cols"], axis=0),
        helper.make_node("Div", ["cols", "two_i"], ["half"]),
        helper.make_node("Slice", ["x", "zero", "half", "one"], ["y"]),
    ], [value("x", f32, ["N", "C"])], [value("y", f32, ["N", "K"])], consts),
         os.path.join(out, "ranges.onnx"))

    save(graph_model("passthru", [helper.make_node("Relu", ["x"], ["r"])],
                     [value("x", f32, ["N", 4])],
                     [value("x", f32, ["N", 4]), value("r", f32, ["N", 4])], check=False),
         os.path.join(out, "passthru.onnx"))
    save(graph_model("half", [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
        helper.make_node("Add", ["rows", "one"], ["rows1"]),
        helper.make_node("Div", ["rows1", "two_i"], ["half"]),
        helper.make_node("Slice", ["x", "zero", "half", "zero"], ["y"]),
    ], [value("x", f32, ["N", 4])], [value("y", f32, ["N", 4])], consts, check=False),
         os.path.join(out, "half.onnx"))
    onnx.save(graph_model("dupout", [helper.make_node("Neg", ["x"], ["y"])],
                          [value("x", f32, ["N", 4])],
                          [value("y", f32, ["N", 4]), value("y", f32, ["N", 4])], check=False),
              os.path.join(out, "dupout.onnx"))

    unsupported = graph_model(
        "unsupported", [helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")],
        [value("x", f32, ["N", 4])], [value("y", f32, ["N", 4])],
        opsets=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.example", 1)],
        check=False)
    onnx.save(unsupported, os.path.join(out, "unsupported_op.onnx"))

    save(graph_model("strings", [helper.make_node("Identity", ["s"], ["t"])],
                     [value("s", TensorProto.STRING, ["N"])],
                     [value("t", TensorProto.STRING, ["N"])]),
         os.path.join(out, "string_input.onnx"))

    with open(os.path.join(out, "add.onnx"), "rb") as f:
        data = f.read()
    i32 = TensorProto.INT32
    one_i32 = helper.make_tensor("one_i32", i32, [], [1])
    save(graph_model("accumulator", [
        helper.make_node("Sub", ["one_i32", "START"], ["keep"]),
        helper.make_node("Mul", ["ACC_IN", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
    ], [value("INPUT", i32, ["N", 1]), value("START", i32, ["N", 1]),
        value("ACC_IN", i32, ["N", 1])],
        [value("OUTPUT", i32, ["N", 1]), value("ACC_OUT", i32, ["N", 1])], [one_i32]),
         os.path.join(out, "accumulator.onnx"))

    with open(os.path.join(out, "truncated.onnx"), "wb") as f:
        f.write(data[:len(data) // 2])
    with open(os.path.join(out, "corrupt.onnx"), "wb") as f:
        f.write(b"\xff\xfe this is not an ONNX protobuf \x00\x01\x02" * 8)

    subprocess.run([args.ovc, os.path.join(out, "add.onnx"), "--output_model",
                    os.path.join(out, "add.xml")], check=True, stdout=subprocess.DEVNULL)
    shutil.copyfile(os.path.join(out, "add.xml"), os.path.join(out, "nobin.xml"))
    if os.path.exists(os.path.join(out, "nobin.bin")):
        os.remove(os.path.join(out, "nobin.bin"))
    print(f"wrote the openvino test models to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
