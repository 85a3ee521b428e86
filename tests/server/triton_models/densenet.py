"""A stand-in for Triton's "densenet_onnx" (DenseNet-121, an ImageNet classifier of 1000 classes):
its tensors, not its network. It gets data_0 as the config reshapes it, FP32 [1, 3, 224, 224],
and answers fc6_1, FP32 [1, 1000, 1, 1] (the client sees [1000]), where

    fc6_1[k] = mean(channel k % 3) * (k + 1) / 1000

the channel means and the product computed in float64, then rounded to FP32 once."""
import numpy as np
import triton_python_backend_utils as pb_utils

CLASSES = 1000


def scores(data):
    """fc6_1 of `data`, an array [1, 3, H, W]."""
    means = data.astype(np.float64).mean(axis=(0, 2, 3))
    k = np.arange(CLASSES)
    return (means[k % 3] * (k + 1) / 1000).astype(np.float32).reshape(1, CLASSES, 1, 1)


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "fc6_1", scores(pb_utils.get_input_tensor_by_name(r, "data_0").as_numpy()))])
            for r in requests]
