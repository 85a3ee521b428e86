"""The digits TorchScript model served by Ray Serve, set up as Ray's docs advise for speed on CPU:
a deployment with one replica per core (--replicas), one torch thread in each, requests batched
with @serve.batch (max_batch_size 64 and a 0.2 ms wait, asyncinfer's batcher settings for this
model), max_ongoing_requests raised to the batch size so that a replica can fill a batch, no
access log line per request. Ray Serve has no Open Inference Protocol: a FastAPI ingress takes
the same v2 JSON body at the same path (/v2/models/digits/infer), answers the v2 JSON response
and the v2 metadata (GET /v2/models/digits), so that one load generator drives every server.

  .venv/ray/bin/python bench/peers/ray_digits.py --model digits.pt --http-port P --replicas 2

Input INPUT__0 FP32 [N,1,32,32]; output OUTPUT__0 FP32 [N,10] (models/make_digits.py). Runs
until SIGTERM or SIGINT. Used by bench/compare_servers.py.
"""

import argparse
import signal
import threading

import numpy as np
import ray
import torch
from fastapi import FastAPI, HTTPException, Request
from ray import serve

app = FastAPI()


@serve.deployment(max_ongoing_requests=64)
@serve.ingress(app)
class Digits:
    def __init__(self, path, threads):
        torch.set_num_threads(threads)
        self.module = torch.jit.load(path, map_location="cpu").eval()
        with torch.inference_mode():
            self.module(torch.zeros(1, 1, 32, 32))

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.0002)
    async def forward(self, images):
        with torch.inference_mode():
            y = self.module(torch.from_numpy(np.concatenate(images))).numpy()
        out, row = [], 0
        for x in images:
            out.append(y[row:row + x.shape[0]])
            row += x.shape[0]
        return out

    @app.get("/v2/models/digits")
    async def metadata(self):
        """The v2 metadata, from which load generators build their request."""
        return {"name": "digits", "versions": ["1"], "platform": "ray_serve",
                "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, 1, 32, 32]}],
                "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 10]}]}

    @app.post("/v2/models/digits/infer")
    async def infer(self, request: Request):
        body = await request.json()
        try:
            t = body["inputs"][0]
            x = np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise HTTPException(400, "expected a v2 request with INPUT__0 FP32: %s" % e)
        if x.ndim != 4 or tuple(x.shape[1:]) != (1, 32, 32):
            raise HTTPException(400, "INPUT__0: expected FP32 [N,1,32,32], got %s"
                                % list(x.shape))
        y = await self.forward(x)
        return {"model_name": "digits", "id": body.get("id", ""),
                "outputs": [{"name": "OUTPUT__0", "datatype": "FP32",
                             "shape": list(y.shape), "data": y.ravel().tolist()}]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.http_port},
                logging_config={"enable_access_log": False, "log_level": "WARNING"})
    serve.run(Digits.options(num_replicas=args.replicas,
                             ray_actor_options={"num_cpus": 0})
              .bind(args.model, args.torch_threads), name="digits", route_prefix="/")
    print("ray_digits: ready on 127.0.0.1:%d" % args.http_port, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    # ray.shutdown() ends the local cluster that ray.init() started (GCS, raylet, the proxy and
    # the replicas); serve.shutdown() first would wait out each replica's graceful period.
    ray.shutdown()


if __name__ == "__main__":
    main()
