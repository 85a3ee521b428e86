"""Type stubs of asyncinfer (the native module asyncinfer._asyncinfer, re-exported).

Units: every duration is seconds (int, float or datetime.timedelta), except
max_queue_delay_us (microseconds); deadlines are time.monotonic() values. Blocking calls
release the GIL; callbacks run on the engine's completion threads holding it.
"""
import concurrent.futures
import datetime
from typing import (Any, Callable, Dict, Generator, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Type, Union)

import numpy as np

__version__: str

Seconds = Union[int, float, datetime.timedelta]
#: A numpy.ndarray, a CPU torch.Tensor, an asyncinfer.Tensor, or an object with __dlpack__.
TensorLike = Any
#: One array (one-input models), a sequence in signature order, or a dict by input name.
Inputs = Union[TensorLike, Sequence[TensorLike], Mapping[str, TensorLike]]
#: One numpy array per model output (asyncinfer.Tensor for bfloat16).
Outputs = List[Union[np.ndarray, "Tensor"]]
StatusCodeLike = Union[str, Type["Error"]]

# ---- errors -------------------------------------------------------------------------------------

class Error(Exception):
    """Base of every asyncinfer error. code: the C++ StatusCode name; message: the C++ message."""
    code: Optional[str]
    message: str

class Cancelled(Error, concurrent.futures.CancelledError):
    """The request was cancelled (Future.cancel(), Engine.cancel(id))."""

class InvalidArgument(Error, ValueError):
    """Bad input or option; the message names what was wrong and what was expected."""

class DeadlineExceeded(Error, TimeoutError):
    """The request's timeout or deadline passed (or Engine.result(id, timeout) ran out)."""

class NotFound(Error):
    """Unknown, expired or evicted request id; missing model file."""

class AlreadyExists(Error):
    """A pending or running request already has this id."""

class ResourceExhausted(Error):
    """Queue full, result store full, admission refused, out of memory."""

class FailedPrecondition(Error):
    """The object is not in a state that allows the call."""

class Aborted(Error):
    """Ended by shutdown before it could finish (state shut_down)."""

class Unavailable(Error):
    """Transient: engine stopped or stopping, device busy or absent. Retryable."""

class Internal(Error):
    """A broken invariant, an exception in a model or stage, a broken promise."""

# ---- tensors, models, devices -------------------------------------------------------------------

class Tensor:
    """An engine tensor numpy cannot view (bfloat16). DLPack-exportable (torch.from_dlpack)."""
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...
    def numpy(self) -> np.ndarray:
        """A view of the bytes (bfloat16 as uint16 bit patterns)."""
    def __dlpack__(self, stream: None = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class TensorSpec:
    """One named model input or output; shape -1 marks a dynamic dim."""
    def __init__(self, name: str, dtype: str, shape: Sequence[int]) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def numpy_dtype(self) -> str: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...

class ModelSignature:
    @property
    def inputs(self) -> List[TensorSpec]: ...
    @property
    def outputs(self) -> List[TensorSpec]: ...
    @property
    def batched(self) -> bool: ...
    @property
    def batch_limit(self) -> Optional[int]: ...

class Model:
    @property
    def signature(self) -> ModelSignature: ...
    @property
    def name(self) -> str: ...
    @property
    def cancellable(self) -> bool: ...

class DeviceCapabilities:
    caller_run_streams: bool
    host_funcs_may_call_device: bool
    host_addressable_memory: bool

class DeviceInfo:
    name: str
    kind: str
    description: str
    is_async: bool
    simulated: bool
    unified_memory: bool
    cancellable_work: bool
    compute_engines: int
    copy_engines: int
    capabilities: DeviceCapabilities

class Device:
    @property
    def info(self) -> DeviceInfo: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...

def load_model(uri: str, *,
               inputs: Optional[Sequence[Union[str, TensorSpec]]] = None,
               outputs: Optional[Sequence[Union[str, TensorSpec]]] = None,
               batch_limit: Optional[int] = None, batched: Optional[bool] = None,
               backend_parameters: Optional[Dict[str, str]] = None) -> Model:
    """Loads 'builtin:...', 'torch:<file>', '<file>.pt', 'openvino:<file>', '<file>.onnx' or
    '<file>.xml'. backend_parameters: the backend's own settings by name (openvino: OpenVINO
    properties; torch: signature_path, warmup_runs; docs/backends.md); a backend refuses a key
    it does not know. Blocks without the GIL. Raises InvalidArgument, NotFound, Unavailable."""

def open_device(spec: str) -> Device:
    """Opens 'cpu', 'sim[:key=value,...]', 'cuda[:N]'. Raises InvalidArgument, Unavailable."""

def device_backends() -> List[str]: ...
def model_backends() -> List[str]: ...

# ---- enums and policies -------------------------------------------------------------------------

class RequestState:
    unknown: "RequestState"
    pending: "RequestState"
    running: "RequestState"
    completed: "RequestState"
    failed: "RequestState"
    timed_out: "RequestState"
    cancelled: "RequestState"
    shut_down: "RequestState"
    @property
    def name(self) -> str: ...
    @property
    def terminal(self) -> bool: ...

class ShutdownMode:
    drain: "ShutdownMode"
    cancel: "ShutdownMode"
    @property
    def name(self) -> str: ...

class QueueFullPolicy:
    reject: "QueueFullPolicy"
    block: "QueueFullPolicy"
    @property
    def name(self) -> str: ...

class RetryPolicy:
    """Bounded attempts, exponential backoff with full jitter, retryable codes only."""
    max_attempts: int
    initial_backoff: float
    multiplier: float
    max_backoff: float
    retryable_codes: List[str]
    budget_ratio: float
    budget_min_retries_per_s: float
    budget_window: float
    def __init__(self, *, max_attempts: int = 1, initial_backoff: Seconds = 0.001,
                 multiplier: float = 2.0, max_backoff: Seconds = 0.2,
                 retryable_codes: Iterable[StatusCodeLike] = ("unavailable",
                                                              "resource_exhausted"),
                 budget_ratio: float = 0.2, budget_min_retries_per_s: float = 10.0,
                 budget_window: Seconds = 10.0) -> None: ...

class CircuitBreakerOptions:
    failure_threshold: int
    cooldown: float
    def __init__(self, *, failure_threshold: int = 0, cooldown: Seconds = 1.0) -> None: ...

class RecoveryOptions:
    max_recycle_attempts: int
    recycle_backoff: float
    max_recycle_backoff: float
    max_abandoned_instances: int
    def __init__(self, *, max_recycle_attempts: int = 5, recycle_backoff: Seconds = 0.1,
                 max_recycle_backoff: Seconds = 5.0, max_abandoned_instances: int = 1) -> None: ...

# ---- futures ------------------------------------------------------------------------------------

class Future:
    """concurrent.futures.Future protocol; awaitable (resolved on the loop's thread)."""
    def result(self, timeout: Optional[Seconds] = None) -> Any:
        """Blocks without the GIL. Raises the request's error, or TimeoutError when the wait
        runs out (the request goes on)."""
    def exception(self, timeout: Optional[Seconds] = None) -> Optional[BaseException]: ...
    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def running(self) -> bool: ...
    def cancel(self) -> bool:
        """Cancels the engine request; True when it was (or will be) cancelled."""
    def add_done_callback(self, fn: Callable[["Future"], Any]) -> None:
        """fn(future) once, on the completion thread with the GIL (at once if done; from
        within another done callback, right after it returns); its
        exceptions are logged and counted."""
    def __await__(self) -> Generator[Any, None, Any]: ...

# ---- engine -------------------------------------------------------------------------------------

class Engine:
    """The inference engine. A context manager (exit: shutdown('drain')); stopped at
    interpreter exit. Every method is thread-safe; shutdown() not from its own callbacks."""
    def __init__(self, model: Union[Model, str], device: Union[Device, str] = "cpu", *,
                 workers: int = 0, max_inflight_per_worker: int = 2,
                 queue_capacity: int = 4096,
                 queue_full_policy: Union[str, QueueFullPolicy] = "reject",
                 submit_timeout: Seconds = 1.0, completion_threads: int = 1,
                 spin_wait_us: int = 10,
                 priority_levels: int = 3, default_priority: int = 2,
                 priority_aging: Seconds = 0.0, max_batch_size: Optional[int] = None,
                 preferred_batch_sizes: Sequence[int] = (), max_queue_delay_us: int = 0,
                 split_failed_batches: bool = True, ordered_delivery: bool = False,
                 default_timeout: Optional[Seconds] = None,
                 allow_timeout_override: bool = False, admission_control: bool = False,
                 retry: Union[RetryPolicy, Dict[str, Any], None] = None,
                 breaker: Union[CircuitBreakerOptions, Dict[str, Any], None] = None,
                 recovery: Union[RecoveryOptions, Dict[str, Any], None] = None,
                 watchdog: Seconds = 0.0, result_store_capacity: int = 65536,
                 result_ttl: Seconds = 60.0, intra_op_threads: int = 0,
                 drain_timeout: Seconds = 30.0,
                 sequence_batching: Optional[Dict[str, Any]] = None) -> None:
        """sequence_batching (stateful models): {"strategy": "direct"|"oldest",
        "slots_per_worker": int, "max_sequence_idle": seconds, "model_name": str,
        "controls": [{"kind": "start"|"end"|"ready"|"corrid", "input": name, "dtype": str,
        "false_true": [f, t]}], "states": [{"input": name, "output": name, "dtype": str,
        "dims": [...]}]} (SequenceBatchingOptions in engine.hpp)."""
    def infer(self, inputs: Inputs, *, timeout: Optional[Seconds] = None, priority: int = 0,
              deadline: Optional[float] = None, sequence_key: Optional[str] = None,
              tag: Optional[str] = None, share_inputs: bool = True,
              sequence_id: Union[int, str, None] = None, sequence_start: bool = False,
              sequence_end: bool = False) -> Outputs:
        """Synchronous; blocks without the GIL. Raises the request's error."""
    def submit(self, inputs: Inputs, *, callback: Optional[Callable[[Any], Any]] = None,
               timeout: Optional[Seconds] = None, priority: int = 0,
               deadline: Optional[float] = None, sequence_key: Optional[str] = None,
               tag: Optional[str] = None, share_inputs: bool = False,
               sequence_id: Union[int, str, None] = None, sequence_start: bool = False,
               sequence_end: bool = False) -> Optional[Future]:
        """A Future, or None with callback= (callback(outputs_or_exception), once, on the
        completion thread). Bad input raises InvalidArgument; inputs are copied unless
        share_inputs=True."""
    def submit_id(self, id: str, inputs: Inputs, *, timeout: Optional[Seconds] = None,
                  priority: int = 0, deadline: Optional[float] = None,
                  sequence_key: Optional[str] = None, tag: Optional[str] = None,
                  share_inputs: bool = False, sequence_id: Union[int, str, None] = None,
                  sequence_start: bool = False, sequence_end: bool = False) -> None:
        """Raises AlreadyExists, ResourceExhausted, InvalidArgument, Unavailable."""
    def result(self, id: str, timeout: Optional[Seconds] = None) -> Outputs:
        """Blocks on a condition without the GIL. Raises DeadlineExceeded, NotFound, or the
        request's error."""
    def status(self, id: str) -> RequestState: ...
    def cancel(self, id: str) -> None:
        """Raises NotFound, FailedPrecondition (already ended)."""
    def release(self, id: str) -> None:
        """Raises FailedPrecondition (still pending or running), NotFound."""
    def shutdown(self, mode: Union[str, ShutdownMode] = "drain",
                 drain_timeout: Optional[Seconds] = None) -> None:
        """Blocks without the GIL; idempotent. Raises FailedPrecondition from a callback."""
    def metrics(self) -> Dict[str, Any]: ...
    def health(self) -> Dict[str, Any]:
        """live, ready, reason, workers (index, health, reason); for a readiness probe."""
    def prometheus(self, prefix: str = "asyncinfer") -> str: ...
    @property
    def signature(self) -> ModelSignature: ...
    @property
    def request_signature(self) -> ModelSignature:
        """signature without the inputs sequence_batching fills and its state outputs."""
    @property
    def options(self) -> Dict[str, Any]: ...
    @property
    def model(self) -> Model: ...
    @property
    def device(self) -> Device: ...
    def __enter__(self) -> "Engine": ...
    def __exit__(self, *exc: Any) -> bool: ...

class AsyncInferQueue:
    """After OpenVINO's AsyncInferQueue: `jobs` requests in flight at most."""
    def __init__(self, engine: Engine, jobs: int = 0) -> None: ...
    def set_callback(self, fn: Optional[Callable[[Any, Any], Any]]) -> None:
        """fn(outputs_or_exception, userdata), on the completion thread with the GIL."""
    def start_async(self, inputs: Inputs, userdata: Any = None, *,
                    timeout: Optional[Seconds] = None, priority: int = 0,
                    deadline: Optional[float] = None, share_inputs: bool = False) -> None:
        """Blocks without the GIL while all jobs are busy."""
    def wait_all(self) -> None:
        """Blocks without the GIL; raises the first exception a callback raised."""
    def is_ready(self) -> bool: ...
    @property
    def jobs(self) -> int: ...
    @property
    def busy(self) -> int: ...
    def __len__(self) -> int: ...

# ---- pipeline -----------------------------------------------------------------------------------

class Stage:
    @staticmethod
    def host(name: str, fn: Callable[[Any], Any], concurrency: int = 1) -> "Stage": ...
    @staticmethod
    def engine(name: str, engine: Engine) -> "Stage": ...
    @staticmethod
    def model(name: str, device: Union[Device, str], model: Model,
              stream_depth: int = 2) -> "Stage": ...
    @property
    def name(self) -> str: ...

class Pipeline:
    """Stages overlapped (article §4.1): Python callables hold the GIL, engine stages do not."""
    def __init__(self, stages: Sequence[Union[Stage, Engine, Callable[[Any], Any]]], *,
                 window: int = 8, ordered: bool = True, priority_levels: int = 3,
                 default_priority: int = 2, completion_threads: int = 1,
                 drain_timeout: Seconds = 30.0) -> None: ...
    def submit(self, value: Any, *, priority: int = 0, timeout: Optional[Seconds] = None,
               deadline: Optional[float] = None) -> Future:
        """Blocks without the GIL while the window is full."""
    def run(self, values: Iterable[Any], *, priority: int = 0,
            timeout: Optional[Seconds] = None, deadline: Optional[float] = None) -> List[Any]:
        """The article's infer_batch; raises the first failure."""
    def shutdown(self, mode: Union[str, ShutdownMode] = "drain") -> None: ...
    def metrics(self) -> Dict[str, Any]: ...
    def prometheus(self, prefix: str = "asyncinfer") -> str: ...
    def __enter__(self) -> "Pipeline": ...
    def __exit__(self, *exc: Any) -> bool: ...
