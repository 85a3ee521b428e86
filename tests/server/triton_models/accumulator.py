"""OUTPUT = ACC_IN + INPUT, and ACC_OUT = OUTPUT: the running sum of a sequence, whose state
the server keeps (sequence_batching state ACC_IN -> ACC_OUT, zeros on START). The model holds
nothing between requests."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            acc = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            total = (acc + x).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
