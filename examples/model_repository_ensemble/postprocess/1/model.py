"""Step 3 of the digits ensemble: logits -> the top 3 labels and their probabilities.

Softmax over the 10 logits in `asyncinfer run`'s order of operations (logit - max in float32,
exp in float64 kept as float32, divided by the float64 sum), the 3 largest in descending order,
and their labels from the model's sidecar (digits.pt.json, linked beside this file) as BYTES."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(__file__), "digits.pt.json")) as f:
            self.labels = np.array([l.encode() for l in json.load(f)["labels"]], dtype=np.object_)

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "OUTPUT__0").as_numpy()
            shifted = (logits - logits.max(axis=1, keepdims=True)).astype(np.float32)
            e = np.exp(shifted.astype(np.float64))
            total = e.sum(axis=1, keepdims=True)
            probs = (e.astype(np.float32).astype(np.float64) / total).astype(np.float32)
            top = np.argsort(-probs, axis=1, kind="stable")[:, :3]
            scores = np.take_along_axis(probs, top, axis=1).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("LABELS", self.labels[top]),
                pb_utils.Tensor("SCORES", scores)]))
        return responses
