"""The digits TorchScript model served by KServe's Python model server (kserve.ModelServer), set
up as KServe documents for speed on CPU: several uvicorn worker processes (--workers, one per core)
and one torch thread in each, so that the workers do not fight over the cores. KServe's batcher
lives in the agent that Kubernetes injects beside the pod and does not run here: each request is
one forward pass.

  .venv/kserve/bin/python bench/peers/kserve_digits.py --model digits.pt --http_port P
      --grpc_port G --workers 2

Speaks the Open Inference Protocol v2 over HTTP (/v2/models/digits/infer, JSON) and gRPC
(inference.GRPCInferenceService/ModelInfer, typed or raw contents), as KServe does.
Input INPUT__0 FP32 [N,1,32,32]; output OUTPUT__0 FP32 [N,10] (models/make_digits.py).
Used by bench/compare_servers.py.
"""

import argparse
import logging

import kserve
import numpy as np
import torch
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.utils import generate_uuid


class Digits(Model):
    def __init__(self, name, path, threads):
        super().__init__(name)
        self.path = path
        self.threads = threads
        self.module = None
        self.load()

    def load(self):
        # No access log line per request (asyncinfer serve and nginx write none either); the
        # workers are spawned processes, so each sets it here.
        logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
        torch.set_num_threads(self.threads)
        self.module = torch.jit.load(self.path, map_location="cpu").eval()
        with torch.inference_mode():
            self.module(torch.zeros(1, 1, 32, 32))
        self.ready = True
        return self.ready

    # With --workers > 1 the server spawns its worker processes and pickles the model into each:
    # a TorchScript module cannot be pickled, so each worker loads the file again.
    def __getstate__(self):
        state = dict(self.__dict__)
        state["module"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.load()

    # The v2 metadata (GET /v2/models/digits): load generators build their request from it.
    def get_input_types(self):
        return [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, 1, 32, 32]}]

    def get_output_types(self):
        return [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 10]}]

    def predict(self, payload: InferRequest, headers=None, response_headers=None):
        x = payload.inputs[0].as_numpy()
        if x.dtype != np.float32 or x.ndim != 4 or tuple(x.shape[1:]) != (1, 32, 32):
            raise kserve.errors.InvalidInput("INPUT__0: expected FP32 [N,1,32,32], got %s %s"
                                             % (x.dtype, list(x.shape)))
        with torch.inference_mode():
            y = self.module(torch.from_numpy(x)).numpy()
        out = InferOutput(name="OUTPUT__0", shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[out],
                             response_id=payload.id or generate_uuid())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model", required=True, help="the digits TorchScript file")
    parser.add_argument("--torch_threads", type=int, default=1)
    args, _ = parser.parse_known_args()
    ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=args.workers,
                enable_latency_logging=False).start(
        [Digits("digits", args.model, args.torch_threads)])
