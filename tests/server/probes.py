"""Clients the hostile-client tests run in processes of their own, so that an attacker in the test's
process (Python, with its GIL) cannot slow them down: what they measure is the server.

    python3 probes.py health PORT SECONDS            GET /v2/health/live on one keep-alive
                                                     connection, every 5 ms
    python3 probes.py grpc PORT SECONDS STUBS_DIR    ModelInfer of builtin identity, every 5 ms

Each prints one JSON line: {"n": ..., "failures": ..., "p50_ms": ..., "p99_ms": ...,
"max_ms": ...}."""

import json
import socket
import sys
import time


def summary(latencies, failures):
    latencies.sort()
    n = len(latencies)

    def at(q):
        return round(latencies[min(n - 1, int(n * q))] * 1e3, 3) if n else None

    return {"n": n, "failures": failures, "p50_ms": at(0.5), "p99_ms": at(0.99),
            "max_ms": round(latencies[-1] * 1e3, 3) if n else None}


def health(port, seconds):
    latencies, failures = [], 0
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: probe\r\n\r\n")
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError("closed")
                reply += chunk
            if not reply.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(reply[:40])
            latencies.append(time.perf_counter() - start)
        except (OSError, ConnectionError):
            failures += 1
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
        time.sleep(0.005)
    return summary(latencies, failures)


def grpc_client(port, seconds, stubs):
    sys.path.insert(0, stubs)
    import grpc
    import grpc_service_pb2 as pb
    import grpc_service_pb2_grpc as pb_grpc
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    stub = pb_grpc.GRPCInferenceServiceStub(ch)
    req = pb.ModelInferRequest(model_name="identity")
    t = req.inputs.add()
    t.name, t.datatype = "input0", "FP32"
    t.shape.extend([1, 16])
    t.contents.fp32_contents.extend([1.0] * 16)
    stub.ModelInfer(req, timeout=10)  # connected before the clock starts
    latencies, failures = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            stub.ModelInfer(req, timeout=10)
            latencies.append(time.perf_counter() - start)
        except grpc.RpcError:
            failures += 1
        time.sleep(0.005)
    ch.close()
    return summary(latencies, failures)


if __name__ == "__main__":
    kind, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    result = health(port, seconds) if kind == "health" else grpc_client(port, seconds, sys.argv[4])
    print(json.dumps(result), flush=True)
