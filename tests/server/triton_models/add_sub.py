"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, in the inputs' dtype (Triton's
examples "simple" and "simple_int8", which wrap around as their TensorFlow graphs do), or for
BYTES inputs holding decimal integers, the results as decimal strings ("simple_string")."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


# Each model's dtype, for auto_complete_config.
DTYPES = {"simple": "TYPE_INT32", "simple_int8": "TYPE_INT8", "simple_string": "TYPE_STRING"}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Triton's auto-complete: a config without the tensors (the override of a load that gives
        only max_batch_size, as Triton's simple_*_model_control.py sends it, replaces the whole
        config.pbtxt) gets the model's inputs and outputs, [16] each in its model's dtype."""
        config = auto_complete_model_config.as_dict()
        dtype = DTYPES.get(config["name"], "TYPE_INT32")
        inputs = {t["name"] for t in config["input"]}
        outputs = {t["name"] for t in config["output"]}
        for name in ("INPUT0", "INPUT1"):
            if name not in inputs:
                auto_complete_model_config.add_input(
                    {"name": name, "data_type": dtype, "dims": [16]})
        for name in ("OUTPUT0", "OUTPUT1"):
            if name not in outputs:
                auto_complete_model_config.add_output(
                    {"name": name, "data_type": dtype, "dims": [16]})
        return auto_complete_model_config

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
