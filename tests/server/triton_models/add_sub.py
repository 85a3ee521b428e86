"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, in the inputs' dtype (Triton's
examples "simple" and "simple_int8", which wrap around as their TensorFlow graphs do), or for
BYTES inputs holding decimal integers, the results as decimal strings ("simple_string")."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.strings = config["input"][0]["data_type"] == "TYPE_STRING"

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if self.strings:
                def ints(x):
                    return np.array([int(v) for v in x.reshape(-1)], np.int64).reshape(x.shape)

                def text(x):
                    return np.array([str(v).encode() for v in x.reshape(-1)],
                                    np.object_).reshape(x.shape)
                s, d = text(ints(a) + ints(b)), text(ints(a) - ints(b))
            else:
                s, d = (a + b).astype(a.dtype), (a - b).astype(a.dtype)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", s), pb_utils.Tensor("OUTPUT1", d)]))
        return responses
