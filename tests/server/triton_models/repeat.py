"""Triton's example "repeat_int32", decoupled: for each element i of IN, after DELAY[i] ms, a
response with OUT = [IN[i]] and IDX = [i]; then, after WAIT ms, the final flag alone."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            for i, value in enumerate(values.reshape(-1)):
                time.sleep(float(delays.reshape(-1)[i]) / 1000)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
            time.sleep(float(wait.reshape(-1)[0]) / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
