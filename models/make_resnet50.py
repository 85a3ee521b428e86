#!/usr/bin/python3
"""make_resnet50.py — torchvision's ResNet-50 with random weights, exported to ONNX, for the
openvino backend's benchmarks (bench/bench_openvino.py). No weights can be downloaded here, and the
speed of a network does not depend on its weights' values.

Writes --out (default: build/models/resnet50.onnx): input "input" f32[N,3,224,224], output
"logits" f32[N,1000], dim 0 dynamic, opset 13, made by torch.onnx.export from Debian's
python3-torch and python3-torchvision. About 100 MB; nothing of it is committed. Skips the work
when the file exists, unless --force. Takes about 30 s.

  /usr/bin/python3 models/make_resnet50.py --out build/models/resnet50.onnx
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join("build", "models", "resnet50.onnx"))
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    if os.path.exists(a.out) and not a.force:
        print(f"{a.out}: exists; --force remakes it")
        return 0
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with torch.inference_mode():
        torch.onnx.export(model, torch.zeros(1, 3, 224, 224), tmp, input_names=["input"],
                          output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=13, do_constant_folding=True)
    os.replace(tmp, a.out)
    print(f"wrote {a.out} ({os.path.getsize(a.out) / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
