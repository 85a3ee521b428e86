"""Triton's example sequence models, written from what its sequence example clients check
(simple_*_sequence_*_client.py): every request holds one INT32 INPUT.

- simple_sequence: OUTPUT = INPUT, plus 1 on the sequence's first request (START).
- simple_dyna_sequence: the same, plus the correlation ID (the CORRID control) on its last (END).
- simple_string_dyna_sequence (parameter accumulate): OUTPUT = the sum of the sequence's INPUTs
  so far, plus the correlation ID (a decimal string) on END; the sums are kept here, under the
  CORRID each request is given, and dropped at END.
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.controls = {}
        for c in config["sequence_batching"].get("control_input", []):
            self.controls[c["control"][0].get("kind", "CONTROL_SEQUENCE_START")] = c["name"]
        accumulate = config.get("parameters", {}).get("accumulate", {})
        self.accumulate = accumulate.get("string_value") == "true"
        self.sums = {}

    def control(self, request, kind):
        name = self.controls.get(kind)
        if name is None:
            return None
        return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0][0])
            start = self.control(request, "CONTROL_SEQUENCE_START")
            end = self.control(request, "CONTROL_SEQUENCE_END")
            ready = self.control(request, "CONTROL_SEQUENCE_READY")
            corrid = self.control(request, "CONTROL_SEQUENCE_CORRID")
            if ready is not None and ready != 1:
                raise pb_utils.TritonModelException("READY is not 1 on a request")
            if isinstance(corrid, bytes):
                corrid = int(corrid.decode())
            if self.accumulate:
                key = corrid
                total = value if start else self.sums.get(key, 0) + value
                self.sums[key] = total
                out = total
                if end:
                    self.sums.pop(key, None)
            else:
                out = value + (1 if start else 0)
            if end and corrid is not None:
                out += int(corrid)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", np.array([[out]], np.int32))]))
        return responses
