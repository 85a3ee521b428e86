"""The process that runs one instance of a Triton model.py for asyncinfer's python backend.

Started by the server (src/model/python/python_process.cpp) as
    <interpreter> -c <bootstrap> asyncinfer-python-stub <model.py> <instance name>
with a SOCK_SEQPACKET socket on fd 3, and on fd 4 the read end of a pipe whose write end only the
server holds: when it reaches EOF the server is gone, and a watcher thread kills this process
group. The bootstrap receives this file's text as the first
message and runs it; this stub then receives the text of triton_python_backend_utils and installs
it as that module. Each later message is one JSON object; file descriptors ride along as
SCM_RIGHTS. The protocol (each request gets exactly one reply, in order):

  server -> stub                         stub -> server
  init {args, model_py, parent}          ready | error {message, traceback}
  execute {requests[{inputs[]}],         (during execute, from any thread of the model)
           arena?} + input arena fd?       send {request, final, outputs[]?, error?, code?,
                                                 arena?} + output arena fd?  -> sent {cancelled,
                                                                                 error?}
                                           is_cancelled {request}            -> cancelled {value}
                                         done {responses[{outputs[]} | {error, code}], arena?}
                                           + output arena fd? | done {error, traceback}
  finalize                               finalized (then the stub exits)

A tensor is {name, datatype (the protocol's FP32, BYTES, ...), shape, offset, size}: its bytes
lie at `offset` in the input arena (server -> stub) or the output arena (stub -> server), two
memfd regions mapped by both processes; BYTES tensors in Triton's length-prefixed form. The
server copies a response's tensors out before it answers `sent` or reads the next message, so
each message may reuse the output arena from offset 0.
"""

import importlib.util
import json
import linecache
import fcntl
import mmap
import os
import signal
import socket
import sys
import threading
import traceback
import types

SOCK = globals().get("_asyncinfer_sock")
MAX_MESSAGE = 1 << 20
MAX_REPLY = 160 * 1024  # the server's receive buffer (kMaxMessage in python_process.cpp)
ALIGN = 64

_NUMPY_OF = None  # filled in once numpy is imported (main)


def _register_source(name, text):
    # So that tracebacks through this stub and the utils module show their lines.
    linecache.cache[name] = (len(text), None, text.splitlines(True), name)


def recv():
    data, fds, _flags, _addr = socket.recv_fds(SOCK, MAX_MESSAGE, 4)
    if not data:  # the server closed its end: it is gone, or it is replacing this instance
        os._exit(0)
    return json.loads(data), fds


class MessageTooLong(Exception):
    """A reply that the server could not receive whole: it is refused here, with the reason,
    instead of breaking the channel (the server would have to end the process)."""


def send(obj, fds=()):
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_REPLY:
        raise MessageTooLong(
            "the response's description is %d bytes, over the %d bytes of the control channel "
            "(%d output tensors)" % (len(data), MAX_REPLY, len(obj.get("outputs") or [])
                                     + sum(len(r.get("outputs") or [])
                                           for r in obj.get("responses") or [])))
    if fds:
        socket.send_fds(SOCK, [data], list(fds))
    else:
        SOCK.send(data)


def _clip(text, limit=16000):
    return text if len(text) <= limit else text[:limit // 2] + "\n...\n" + text[-limit // 2:]


def _error_fields(exc):
    """message (the traceback's last line, as Triton reports) and the whole traceback."""
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename == "asyncinfer_python_stub.py":
        frames = frames.tb_next  # the stub's own frames say nothing about model.py
    tb = "".join(traceback.format_exception(type(exc), exc, frames)).rstrip("\n")
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"message": _clip(last, 4000), "traceback": _clip(tb, 60000)}


def _error_code(err):
    code = err.code()
    return code if isinstance(code, int) and not isinstance(code, bool) else 1


class OutputArena:
    """The stub's side of the output arena: a memfd region it grows, whose new fd it passes."""

    def __init__(self):
        self.mm = None
        self.size = 0

    def layout(self, tensors):
        """tensors: [(name, datatype, shape, payload ndarray)] -> specs, fds, arena size."""
        specs = []
        offset = 0
        for name, datatype, shape, payload in tensors:
            specs.append({"name": name, "datatype": datatype, "shape": shape,
                          "offset": offset, "size": int(payload.nbytes)})
            offset += (int(payload.nbytes) + ALIGN - 1) // ALIGN * ALIGN
        fds = []
        extra = {}
        if offset > self.size:
            size = max(offset, 2 * self.size, 1 << 20)
            fd = os.memfd_create("asyncinfer-python-output",
                                 os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, size)
            # The server maps it only sealed against resizing (a shrink would SIGBUS it).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.mm = mmap.mmap(fd, size)  # the old one is unmapped when nothing views it
            self.size = size
            fds = [fd]
            extra["arena"] = size
        np = _np
        for spec, (_n, _d, _s, payload) in zip(specs, tensors):
            if spec["size"]:
                dst = np.ndarray((spec["size"],), np.uint8, buffer=self.mm, offset=spec["offset"])
                dst[...] = payload.reshape(-1).view(np.uint8)
        return specs, fds, extra


class Stub:
    def __init__(self, utils):
        self.utils = utils
        self.model = None
        self.model_config = {}
        self.output_names = set()
        self.decoupled = False
        self.input = None  # mmap of the input arena
        self.output = OutputArena()
        self.rpc = threading.RLock()  # one message and its reply at a time
        self.done_cv = threading.Condition()
        self.pending = 0  # decoupled requests of this batch without their final flag

    # ---- tensors ----------------------------------------------------------------------------
    def input_tensor(self, spec):
        np = _np
        name = spec["name"]
        shape = tuple(spec["shape"])
        if spec["datatype"] == "BYTES":
            raw = self.input[spec["offset"]:spec["offset"] + spec["size"]]
            arr = self.utils.deserialize_bytes_tensor(raw) if raw else np.array([], np.object_)
            arr = arr.reshape(shape)
        else:
            arr = np.ndarray(shape, _NUMPY_OF[spec["datatype"]], buffer=self.input,
                             offset=spec["offset"])
        return self.utils.Tensor(name, arr)

    def encode(self, response):
        """A response's output tensors as (name, datatype, shape, payload) tuples."""
        np = _np
        out = []
        for t in response.output_tensors():
            if t.name() not in self.output_names:
                continue  # not in the config: dropped, as Triton does
            arr = t.as_numpy()
            if arr.dtype.kind in ("O", "S", "U"):
                flat = self.utils.serialize_byte_tensor(arr)
                payload = flat if flat is not None else np.zeros((0,), np.uint8)
                datatype = "BYTES"
            else:
                datatype = _DATATYPE_OF.get(arr.dtype.str.lstrip("<>=|"))
                if datatype is None:
                    raise self.utils.TritonModelException(
                        "output '%s' has numpy dtype %s, which has no protocol datatype"
                        % (t.name(), arr.dtype))
                payload = np.ascontiguousarray(arr)
            out.append((t.name(), datatype, [int(d) for d in arr.shape], payload))
        return out

    # ---- messages ---------------------------------------------------------------------------
    def initialize(self, msg):
        args = msg["args"]
        self.model_config = json.loads(args["model_config"])
        self.output_names = {o["name"] for o in self.model_config.get("output", [])}
        # Implicit state: the model writes each state's output as an ordinary output.
        for st in (self.model_config.get("sequence_batching") or {}).get("state", []):
            self.output_names.add(st.get("output_name", ""))
        policy = self.model_config.get("model_transaction_policy") or {}
        self.decoupled = bool(policy.get("decoupled", False))
        path = msg["model_py"]
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location("model", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        if not hasattr(module, "TritonPythonModel"):
            raise AttributeError("%s defines no class TritonPythonModel" % path)
        self.model = module.TritonPythonModel()
        if hasattr(self.model, "initialize"):
            self.model.initialize(args)

    def execute(self, msg, fds):
        utils = self.utils
        if fds:
            # Not closed: arrays model.py kept from it stay valid (and it is unmapped when the
            # last goes).
            self.input = mmap.mmap(fds[0], msg["arena"])
            for fd in fds:
                os.close(fd)
        requests = []
        senders = []
        for index, r in enumerate(msg["requests"]):
            sender = ResponseSender(self, index)
            senders.append(sender)
            requests.append(utils.InferenceRequest(
                [self.input_tensor(s) for s in r["inputs"]],
                requested_output_names=[o["name"] for o in self.model_config.get("output", [])],
                request_id=r.get("id", ""), correlation_id=r.get("correlation_id", 0),
                flags=r.get("flags", 0), _sender=sender,
                _model_name=self.model_config.get("name", "")))
        self.pending = len(requests) if self.decoupled else 0
        try:
            result = self.model.execute(requests)
        except BaseException as e:  # noqa: B036 — a model's SystemExit fails its requests too
            self.end_senders(senders)
            fields = _error_fields(e)
            send({"op": "done", "error": fields["message"], "traceback": fields["traceback"]})
            return
        if self.decoupled:
            del requests, result
            self.wait_for_finals()
            self.end_senders(senders)
            send({"op": "done", "responses": []})
            return
        self.end_senders(senders)
        try:
            reply, fds = self.responses(result, len(requests))
        except BaseException as e:  # noqa: B036
            fields = _error_fields(e)
            send({"op": "done", "error": fields["message"], "traceback": fields["traceback"]})
            return
        try:
            send(reply, fds)
        except MessageTooLong as e:
            send({"op": "done", "error": str(e), "traceback": ""})
        for fd in fds:
            os.close(fd)

    def responses(self, result, count):
        utils = self.utils
        if not isinstance(result, (list, tuple)):
            raise utils.TritonModelException(
                "execute returned %s; it must return a list of one InferenceResponse per request"
                % type(result).__name__)
        if len(result) != count:
            raise utils.TritonModelException(
                "execute returned %d response(s) for %d request(s); it must return one "
                "InferenceResponse per request" % (len(result), count))
        encoded = []
        for i, response in enumerate(result):
            if not isinstance(response, utils.InferenceResponse):
                raise utils.TritonModelException(
                    "execute's response %d is %s, not an InferenceResponse"
                    % (i, type(response).__name__))
            encoded.append(None if response.has_error() else self.encode(response))
        flat = [t for e in encoded if e is not None for t in e]
        specs, fds, extra = self.output.layout(flat)
        out = []
        k = 0
        for response, e in zip(result, encoded):
            if e is None:
                err = response.error()
                out.append({"error": _clip(str(err.message())), "code": _error_code(err)})
            else:
                out.append({"outputs": specs[k:k + len(e)]})
                k += len(e)
        reply = {"op": "done", "responses": out}
        reply.update(extra)
        return reply, fds

    def wait_for_finals(self):
        # Until every request of the batch has had its final flag, from whichever thread of the
        # model sends it. A request whose final flag never comes holds its instance (as in
        # Triton); the server's watchdog_ms, or the end of every request of the batch, ends it.
        with self.done_cv:
            while self.pending > 0:
                self.done_cv.wait()

    def end_senders(self, senders):
        for s in senders:
            s._closed = True

    def request_final(self):
        with self.done_cv:
            self.pending -= 1
            self.done_cv.notify_all()

    def run(self):
        msg, _ = recv()
        if msg.get("op") != "init":
            send({"op": "error", "message": "expected init, got %r" % msg.get("op"),
                  "traceback": ""})
            return 1
        try:
            self.initialize(msg)
        except BaseException as e:  # noqa: B036 — report any failure, even SystemExit
            fields = _error_fields(e)
            send({"op": "error", "message": fields["message"], "traceback": fields["traceback"]})
            return 1
        send({"op": "ready"})
        while True:
            msg, fds = recv()
            op = msg.get("op")
            if op == "execute":
                self.execute(msg, fds)
            elif op == "finalize":
                try:
                    if hasattr(self.model, "finalize"):
                        self.model.finalize()
                finally:
                    send({"op": "finalized"})
                return 0
            else:
                send({"op": "done", "error": "unknown message %r" % op, "traceback": ""})


class ResponseSender:
    """Triton's InferenceResponseSender for request `index` of the batch being executed."""

    def __init__(self, stub, index):
        self._stub = stub
        self._index = index
        self._decoupled = stub.decoupled
        self._final = False
        self._closed = False
        self._cancelled = False

    def send(self, response=None, flags=0):
        utils = self._stub.utils
        final = bool(flags & utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if flags & ~utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise utils.TritonModelException("send: unknown flags %d" % flags)
        if response is None and not final:
            raise utils.TritonModelException("send: a response, or the final flag, is needed")
        if response is not None and not isinstance(response, utils.InferenceResponse):
            raise utils.TritonModelException(
                "send: expected an InferenceResponse, got %s" % type(response).__name__)
        msg = {"op": "send", "request": self._index, "final": final}
        with self._stub.rpc:  # the check, the message and the final flag together, once
            if self._final or self._closed:
                raise utils.TritonModelException(
                    "send: request %d already ended (its final flag was sent)" % self._index)
            fds = []
            if response is not None:
                if response.has_error():
                    msg["error"] = _clip(str(response.error().message()))
                    msg["code"] = _error_code(response.error())
                else:
                    specs, fds, extra = self._stub.output.layout(self._stub.encode(response))
                    msg["outputs"] = specs
                    msg.update(extra)
            try:
                send(msg, fds)
            except MessageTooLong as e:
                raise utils.TritonModelException("send: " + str(e)) from None
            finally:
                for fd in fds:
                    os.close(fd)
            reply, _ = recv()
            self._cancelled = bool(reply.get("cancelled", False))
            if final:
                self._final = True
                self._stub.request_final()
        if reply.get("error"):
            raise utils.TritonModelException(reply["error"])

    def is_cancelled(self):
        if self._closed or self._final:
            return self._cancelled
        with self._stub.rpc:
            send({"op": "is_cancelled", "request": self._index})
            reply, _ = recv()
        self._cancelled = bool(reply.get("value", False))
        return self._cancelled


_np = None
_DATATYPE_OF = {}


def _watch_server():
    # fd 4 reaches EOF when the server is gone (however it ended): end this process group, what
    # model.py started included.
    try:
        while os.read(4, 1):
            pass
    except OSError:
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main():
    global _np, _NUMPY_OF
    # Leave a terminal's Ctrl-C to the server, which then shuts this instance down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_server, name="asyncinfer-watch-server", daemon=True).start()
    utils_text = SOCK.recv(MAX_MESSAGE).decode()
    utils = types.ModuleType("triton_python_backend_utils")
    utils.__file__ = "triton_python_backend_utils.py"
    _register_source(utils.__file__, utils_text)
    exec(compile(utils_text, utils.__file__, "exec"), utils.__dict__)
    sys.modules["triton_python_backend_utils"] = utils
    import numpy as np
    _np = np
    _NUMPY_OF = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
                 "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
                 "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    for name, t in _NUMPY_OF.items():
        _DATATYPE_OF[np.dtype(t).str.lstrip("<>=|")] = name
    sys.stdout.flush()
    os._exit(Stub(utils).run())


main()
