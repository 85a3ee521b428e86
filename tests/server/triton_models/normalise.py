"""digits_normalise: gray values 0..255 (FP32) -> (v / 255 - mean) / std, the digits model's input.

mean and std are the model's own, from its sidecar (digits.pt.json, copied beside this file)."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(__file__), "digits.pt.json")) as f:
            pre = json.load(f)["preprocessing"]
        self.mean = np.float32(pre["mean"])
        self.std = np.float32(pre["std"])

    def execute(self, requests):
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            x = ((pixels / np.float32(255) - self.mean) / self.std).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INPUT__0", x)]))
        return responses
