"""asyncinfer: asynchronous inference from Python on asyncinfer's C++ engine.

    import asyncinfer, numpy as np

    with asyncinfer.Engine("models/data/digits.pt", "cpu", workers=2) as engine:
        x = np.zeros((1, 1, 32, 32), np.float32)
        logits, = engine.infer(x)                    # synchronous; releases the GIL
        future = engine.submit(x)                    # a concurrent.futures-style Future
        logits, = future.result(timeout=5.0)         # ... or `await future` in asyncio
        engine.submit(x, callback=print)             # print(outputs) on the completion thread
        engine.submit_id("req_001", x)               # by id (the article's result store)
        logits, = engine.result("req_001", timeout=5.0)

Every class and function is the C++ API's (include/asyncinfer/*.hpp) through a thin pybind11
layer: Engine, Future, AsyncInferQueue (after OpenVINO's), Pipeline and Stage, Model and
load_model, Device and open_device, RetryPolicy, CircuitBreakerOptions, RecoveryOptions, and one exception class
per status code under asyncinfer.Error. Durations are seconds; see help(asyncinfer.Engine).
"""

from ._asyncinfer import (  # noqa: F401  (re-exported)
    Aborted,
    AlreadyExists,
    AsyncInferQueue,
    Cancelled,
    CircuitBreakerOptions,
    DeadlineExceeded,
    Device,
    DeviceCapabilities,
    DeviceInfo,
    Engine,
    Error,
    FailedPrecondition,
    Future,
    Internal,
    InvalidArgument,
    Model,
    ModelSignature,
    NotFound,
    Pipeline,
    QueueFullPolicy,
    RequestState,
    ResourceExhausted,
    RecoveryOptions,
    RetryPolicy,
    ShutdownMode,
    Stage,
    Tensor,
    TensorSpec,
    Unavailable,
    __version__,
    device_backends,
    load_model,
    model_backends,
    open_device,
)

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncInferQueue",
    "Cancelled",
    "CircuitBreakerOptions",
    "DeadlineExceeded",
    "Device",
    "DeviceCapabilities",
    "DeviceInfo",
    "Engine",
    "Error",
    "FailedPrecondition",
    "Future",
    "Internal",
    "InvalidArgument",
    "Model",
    "ModelSignature",
    "NotFound",
    "Pipeline",
    "QueueFullPolicy",
    "RequestState",
    "ResourceExhausted",
    "RecoveryOptions",
    "RetryPolicy",
    "ShutdownMode",
    "Stage",
    "Tensor",
    "TensorSpec",
    "Unavailable",
    "device_backends",
    "load_model",
    "model_backends",
    "open_device",
]
