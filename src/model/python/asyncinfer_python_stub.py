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
  auto_complete {config, model_py}       completed {config} | error {message, traceback}
                                         (then the stub exits: Triton's auto-complete)
  execute {requests[{inputs[]}] |        (during execute, from any thread of the model)
           requests_at [offset, size],     send {request, final, outputs[]?, error?, code?,
           slot, arena?} + input arena fd?       arena?} + output arena fd?  -> sent {cancelled,
                                                                                 error?}
                                           send {request, final: false, inline, outputs[]}
                                             + NUL + tensors | send {request, final: false,
                                             error, code}: posted, no tag and no answer (a
                                             failure comes in the next sent {error})
                                           is_cancelled {request}            -> cancelled {value}
                                         done {responses[{outputs[]} | {error, code}], arena?}
                                           + output arena fd? | done {error, traceback}
  finalize                               finalized (then the stub exits)

Every message that waits for an answer carries a "tag" (a number the stub picks) and its answer
carries it back, so that the threads of model.py (and an asyncio loop) share the socket: whichever
thread waits reads the socket and hands each answer to the thread (or asyncio future) whose tag it
bears (Channel). Business logic scripting, the model loading API, custom metrics and logs, in any
phase (infer only during execute):
  infer {tag, model, version, inputs[], outputs[], id, correlation_id, flags, timeout, priority,
         parameters, decoupled, fd?} + NUL + tensors (or a sealed memfd)
                                         -> response {tag, final, outputs[] | error, code, fd?}
                                            (one, or a decoupled model's many) + NUL + tensors
  cancel_infer {tag}                     (no answer)
  model_ready | load_model | unload_model | metric_family | metric | metric_update {tag, ...}
                                         -> reply {tag, value | error, code}
  log {level, message}, metric_delete {metric}   (no answer)

A tensor is {name, datatype (the protocol's FP32, BYTES, ...), shape, offset, size}: its bytes
lie at `offset` in the input arena (server -> stub) or the output arena (stub -> server), memfd
regions mapped by both processes; BYTES tensors in Triton's length-prefixed form. The server
copies a response's tensors out before it answers `sent` or reads the next message, so each
message may reuse the output arena from offset 0.
An execute whose requests' description would pass the socket's limit (their parameters may be
any size) has it in the input arena instead, as JSON text at `requests_at`. An output arena the
stub grew is passed (`arena` and its fd) with every message that uses it until one reaches the
server: a reply refused for its length (MessageTooLong) does not lose it.

Two batches in flight: a model that is neither decoupled, nor stateful, nor dynamically batched may
be sent its next execute while it runs one (it waits among the loose messages until this one is
done), so that it never waits for the server between batches. Each execute names its slot (0 or 1):
the input arena it reads and the output arena its `done` writes, a pair per slot. The server sends
a slot's next batch only after it has copied the outputs of the slot's previous one; an `arena`
(with its fd) in an execute or a `done` replaces that slot's arena only.
"""

import array
import asyncio
import collections
import faulthandler
import importlib.util
import inspect
import itertools
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


_FD_SIZE = array.array("i").itemsize


# recv()'s buffer, reused: recvmsg(MAX_MESSAGE) would allocate (and the allocator map and unmap)
# a 1 MiB object for every message. Only the one thread that reads the socket at a time uses it
# (Channel.reading).
_RECV_BUF = bytearray(MAX_MESSAGE)
_RECV_VIEW = memoryview(_RECV_BUF)
_ANC_SIZE = socket.CMSG_LEN(4 * _FD_SIZE)


def recv(flags=0):
    """The next message: (JSON object, payload after its NUL or b"", fds)."""
    # recvmsg_into itself: Python 3.11's socket.recv_fds drops its flags argument.
    n, ancdata, _flags, _addr = SOCK.recvmsg_into((_RECV_BUF,), _ANC_SIZE, flags)
    data = _RECV_VIEW[:n].tobytes()
    fds = []
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", cdata[:len(cdata) - len(cdata) % _FD_SIZE]))
    if not data:  # the server closed its end: it is gone, or it is replacing this instance
        os._exit(0)
    nul = data.find(b"\0")
    if nul < 0:
        return _DECODE(data.decode()), b"", fds
    return _DECODE(data[:nul].decode()), memoryview(data)[nul + 1:], fds


class MessageTooLong(Exception):
    """A reply that the server could not receive whole: it is refused here, with the reason,
    instead of breaking the channel (the server would have to end the process)."""


# The server's messages are UTF-8 JSON; one decoder and one compact encoder for all of them
# (json.loads and json.dumps with arguments make or look up theirs on every call).
_DECODE = json.JSONDecoder().decode
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_SEND_LOCK = threading.RLock()  # reentrant: a __del__ (gc) may send mid-send


def send(obj, fds=(), payload=None):
    data = _ENCODE(obj).encode()
    if payload is not None:
        data = b"".join((data, b"\0", payload))
    if len(data) > MAX_REPLY:
        raise MessageTooLong(
            "the response's description is %d bytes, over the %d bytes of the control channel "
            "(%d output tensors)" % (len(data), MAX_REPLY, len(obj.get("outputs") or [])
                                     + sum(len(r.get("outputs") or [])
                                           for r in obj.get("responses") or [])))
    with _SEND_LOCK:
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


class Channel:
    """The socket as the threads of model.py share it. Sends are whole messages (send()); an
    answer is found by its tag. No reader thread: a thread that waits for an answer reads the
    socket itself while no other thread does (the others wait on `cv`), and hands each message it
    reads to its addressee; an asyncio loop reads when the socket is readable (attach()). A
    message without a tag (execute, finalize) waits in `loose` for the main loop."""

    def __init__(self):
        self.cv = threading.Condition()
        self.reading = False
        self.tags = itertools.count(1)
        self.waiters = {}  # tag -> callable(msg, payload, fds), under cv
        self.loose = collections.deque()
        self.loops = {}  # asyncio loop -> futures waiting on it
        self.sleeping = 0  # threads in cv.wait(): only they need a notify (a batch's path has none)

    def _notify(self):  # under cv
        if self.sleeping:
            self.cv.notify_all()

    def _sleep(self, timeout=None):  # under cv
        self.sleeping += 1
        try:
            self.cv.wait(timeout)
        finally:
            self.sleeping -= 1

    def _dispatch(self, msg, payload, fds):  # under cv
        tag = msg.get("tag")
        if tag is None:
            self.loose.append((msg, payload, fds))
            return
        waiter = self.waiters.get(tag)
        if waiter is None:  # an answer nobody waits for any more (its call was abandoned)
            for fd in fds:
                os.close(fd)
            return
        waiter(msg, payload, fds)

    def _hand(self, msg, payload, fds):
        with self.cv:
            self._dispatch(msg, payload, fds)
            self._notify()

    def _stop_reading(self):
        with self.cv:
            self.reading = False
            self._notify()

    def wait(self, done):
        """Returns once done() (called under cv) is true, reading the socket meanwhile if no one
        else does."""
        with self.cv:
            while not done():
                if not self.reading:
                    break
                self._sleep()
            else:
                return
            self.reading = True
        try:
            while True:
                msg, payload, fds = recv()
                with self.cv:
                    self._dispatch(msg, payload, fds)
                    self._notify()
                    if done():
                        return
        finally:
            self._stop_reading()

    def call(self, msg, fds=(), payload=None):
        """Sends msg with a new tag; returns its one answer (msg, payload, fds)."""
        box = []
        tag = next(self.tags)
        msg["tag"] = tag
        with self.cv:
            self.waiters[tag] = lambda m, p, f: box.append((m, p, f))
        try:
            send(msg, fds, payload)
            self.wait(lambda: box)
        finally:
            with self.cv:
                self.waiters.pop(tag, None)
        return box[0]

    def next_loose(self):
        """The next message without a tag: wait(), with two lock round trips instead of four on
        the main loop's path (a message read here while `loose` is empty is returned as it is:
        only the reader appends to `loose`, so none can be ahead of it)."""
        with self.cv:
            while not self.loose:
                if not self.reading:
                    break
                self._sleep()
            else:
                return self.loose.popleft()
            self.reading = True
        try:
            while True:
                msg, payload, fds = recv()
                if msg.get("tag") is None:
                    return msg, payload, fds
                self._hand(msg, payload, fds)
        finally:
            self._stop_reading()

    # asyncio: the loop reads the socket when it is readable, while it has futures waiting.
    def attach(self, loop):
        with self.cv:
            n = self.loops.get(loop, 0)
            self.loops[loop] = n + 1
        if n == 0:
            loop.add_reader(SOCK.fileno(), self._readable)

    def detach(self, loop):
        with self.cv:
            n = self.loops.get(loop, 0) - 1
            if n > 0:
                self.loops[loop] = n
                return
            self.loops.pop(loop, None)
        try:
            loop.remove_reader(SOCK.fileno())
        except Exception:  # noqa: BLE001 — a closed loop
            pass

    def _readable(self):
        with self.cv:
            if self.reading:
                # Another thread reads it; wait until it has (a short wait: it is in recv()).
                self._sleep(0.001)
                return
            self.reading = True
        try:
            while True:
                try:
                    msg, payload, fds = recv(socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                self._hand(msg, payload, fds)
        finally:
            self._stop_reading()


CHANNEL = Channel()
# How many batches execute() has been given (one element: changed in place): a request's trace
# names its batch, so that a trace kept past its execute() is not taken for another request's.
STUB_BATCH = [0]
# In a coalesced message, the index of the request whose own execute() runs (its calls go under
# its chain of callers); None otherwise.
EXECUTING = [None]


def _tensor_payload(utils, t):
    """(datatype, shape, uint8 array) of a pb_utils.Tensor, for the wire."""
    np = _np
    if getattr(t, "_bf16", False):  # BF16's bits, as uint16 (pb_utils.Tensor._of_bf16)
        return "BF16", [int(d) for d in t._data.shape], np.ascontiguousarray(
            t._data).reshape(-1).view(np.uint8)
    arr = t.as_numpy()
    if arr.dtype.kind in ("O", "S", "U"):
        flat = utils.serialize_byte_tensor(arr)
        return "BYTES", [int(d) for d in arr.shape], (flat if flat is not None
                                                      else np.zeros((0,), np.uint8))
    datatype = _DATATYPE_OF.get(arr.dtype.str.lstrip("<>=|"))
    if datatype is None:
        raise utils.TritonModelException("tensor '%s' has numpy dtype %s, which has no protocol "
                                         "datatype" % (t.name(), arr.dtype))
    return datatype, [int(d) for d in arr.shape], np.ascontiguousarray(arr).reshape(-1).view(
        np.uint8)


INLINE_TENSOR_BYTES = 64 * 1024  # kInlineTensorBytes in python_process.cpp


def _pack_tensors(utils, tensors):
    """specs, and (payload bytes | None, fds) for a call's inputs: inline up to
    INLINE_TENSOR_BYTES, else in a memfd of their own, sealed against any change."""
    specs = []
    parts = []
    offset = 0
    for t in tensors:
        datatype, shape, data = _tensor_payload(utils, t)
        specs.append({"name": t.name(), "datatype": datatype, "shape": shape, "offset": offset,
                      "size": int(data.nbytes)})
        parts.append((offset, data))
        offset += (int(data.nbytes) + ALIGN - 1) // ALIGN * ALIGN
    if offset <= INLINE_TENSOR_BYTES:
        buf = bytearray(offset)
        for off, data in parts:
            buf[off:off + data.nbytes] = data.tobytes()
        return specs, bytes(buf), []
    fd = os.memfd_create("asyncinfer-python-call", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, offset)
    for off, data in parts:
        view = memoryview(data)
        while view.nbytes:
            n = os.pwrite(fd, view, off)
            view = view[n:]
            off += n
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    return specs, None, [fd]


def _inline_tensors(tensors):
    """specs and payload bytes of (name, datatype, shape, ndarray) tuples laid out at ALIGN
    offsets, or (None, None) when they take more than INLINE_TENSOR_BYTES."""
    specs = []
    offset = 0
    for name, datatype, shape, data in tensors:
        specs.append({"name": name, "datatype": datatype, "shape": shape, "offset": offset,
                      "size": int(data.nbytes)})
        offset += (int(data.nbytes) + ALIGN - 1) // ALIGN * ALIGN
    if offset > INLINE_TENSOR_BYTES:
        return None, None
    buf = bytearray(offset)
    view = memoryview(buf)  # (a bytearray's own slice assignment refuses numpy's buffers)
    for spec, (_n, _d, _s, data) in zip(specs, tensors):
        if spec["size"]:
            view[spec["offset"]:spec["offset"] + spec["size"]] = _np.ascontiguousarray(
                data).reshape(-1).view(_np.uint8)
    return specs, buf


def _unpack_response(utils, msg, payload, fds):
    """A call's response message as a pb_utils.InferenceResponse."""
    np = _np
    if "error" in msg:
        for fd in fds:
            os.close(fd)
        return utils.InferenceResponse(error=utils.TritonError(msg["error"], msg.get("code", 1)))
    if msg.get("fd"):
        fd = fds[0]
        size = os.fstat(fd).st_size
        # Private and writable: the arrays are views of the server's memfd, copied only where the
        # model writes to them.
        buf = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        for f in fds:
            os.close(f)
    else:
        buf = bytearray(payload)
    outputs = []
    for spec in msg.get("outputs", []):
        shape = tuple(spec["shape"])
        if spec["datatype"] == "BYTES":
            raw = buf[spec["offset"]:spec["offset"] + spec["size"]]
            arr = utils.deserialize_bytes_tensor(raw) if raw else np.array([], np.object_)
            arr = arr.reshape(shape)
        elif spec["datatype"] == "BF16":  # no numpy type: its bits as uint16, for DLPack
            outputs.append(utils.Tensor._of_bf16(spec["name"], np.ndarray(
                shape, np.uint16, buffer=buf, offset=spec["offset"])))
            continue
        else:
            arr = np.ndarray(shape, _NUMPY_OF[spec["datatype"]], buffer=buf,
                             offset=spec["offset"])
        outputs.append(utils.Tensor(spec["name"], arr))
    return utils.InferenceResponse(output_tensors=outputs)


class Call:
    """One infer call in flight: its responses as they come (sync iterator or asyncio)."""

    def __init__(self, utils, request, decoupled):
        self.utils = utils
        self.decoupled = decoupled
        self.tag = next(CHANNEL.tags)
        self.items = collections.deque()  # responses not yet taken
        self.finished = False             # the final response (or an error) has come
        self.cancelled = False
        self.future = None                # asyncio: the future the next response resolves
        self.loop = None
        specs, payload, fds = _pack_tensors(utils, request.inputs())
        name = request.model_name()
        if isinstance(name, bytes):
            name = name.decode("utf-8")
        params = request.parameters()
        if isinstance(params, str):
            params = json.loads(params) if params else {}
        msg = {"op": "infer", "tag": self.tag, "model": str(name),
               "version": request.model_version(), "inputs": specs,
               "outputs": list(request.requested_output_names()), "id": request.request_id(),
               "correlation_id": request.correlation_id(), "flags": request.flags(),
               "timeout": int(request.timeout()), "priority": int(getattr(request, "_priority", 0)),
               "parameters": params or {}, "decoupled": bool(decoupled)}
        trace = getattr(request, "_trace", None)
        if trace is not None and trace._request is not None and trace._batch == STUB_BATCH[0]:
            msg["trace"] = trace._request  # under that request's trace, if it is traced
        if EXECUTING[0] is not None:
            msg["caller"] = EXECUTING[0]
        if fds:
            msg["fd"] = True
        with CHANNEL.cv:
            CHANNEL.waiters[self.tag] = self._deliver
        try:
            send(msg, fds, payload)
        except BaseException:
            with CHANNEL.cv:
                CHANNEL.waiters.pop(self.tag, None)
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def _deliver(self, msg, payload, fds):  # under CHANNEL.cv
        response = _unpack_response(self.utils, msg, payload, fds)
        final = bool(msg.get("final", True))
        if final:
            self.finished = True
            CHANNEL.waiters.pop(self.tag, None)
        self.items.append((response, final))
        fut = self.future
        if fut is not None:
            self.future = None
            self.loop.call_soon_threadsafe(_resolve, fut)

    def next(self):
        """The next response, blocking; None after the final one."""
        CHANNEL.wait(lambda: self.items or self.finished)
        with CHANNEL.cv:
            return self.items.popleft() if self.items else None

    async def anext(self):
        loop = asyncio.get_running_loop()
        with CHANNEL.cv:
            if self.items or self.finished:
                return self.items.popleft() if self.items else None
            self.future = loop.create_future()
            self.loop = loop
            fut = self.future
        CHANNEL.attach(loop)
        try:
            await fut
        finally:
            CHANNEL.detach(loop)
        with CHANNEL.cv:
            return self.items.popleft() if self.items else None

    def cancel(self):
        with CHANNEL.cv:
            if self.finished or self.cancelled:
                return
            self.cancelled = True
        send({"op": "cancel_infer", "tag": self.tag})


def _resolve(fut):
    if not fut.done():
        fut.set_result(None)


class ResponseIterator:
    """What exec(decoupled=True) returns: the responses in order, the last one with the final
    flag (it may have no outputs). Abandoned before its end, it cancels the request."""

    def __init__(self, call):
        self._call = call
        self._done = False

    def __iter__(self):
        return self

    def _accept(self, item, stop):
        """The response of `item` (response, final), or raises `stop` after the last one."""
        if item is None:
            self._done = True
            raise stop
        response, final = item
        self._done = final
        return response

    def __next__(self):
        if self._done:
            raise StopIteration
        return self._accept(self._call.next(), StopIteration)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        return self._accept(await self._call.anext(), StopAsyncIteration)

    def cancel(self):
        self._call.cancel()

    def __del__(self):
        if not self._done:
            try:
                self._call.cancel()
            except Exception:  # noqa: BLE001 — at interpreter exit
                pass


class Host:
    """What triton_python_backend_utils calls into (its _host): the server's side of BLS, the
    model loading API, custom metrics and logging."""

    def __init__(self, utils):
        self.utils = utils

    def exec(self, request, decoupled):
        call = Call(self.utils, request, decoupled)
        if decoupled:
            return ResponseIterator(call)
        first = call.next()
        if first is None:
            return self.utils.InferenceResponse(
                error=self.utils.TritonError("the call ended without a response"))
        return first[0]

    async def async_exec(self, request, decoupled):
        call = Call(self.utils, request, decoupled)
        if decoupled:
            return ResponseIterator(call)
        try:
            first = await call.anext()
        except asyncio.CancelledError:
            call.cancel()
            raise
        if first is None:
            return self.utils.InferenceResponse(
                error=self.utils.TritonError("the call ended without a response"))
        return first[0]

    def ask(self, msg):
        reply, _payload, fds = CHANNEL.call(msg)
        for fd in fds:
            os.close(fd)
        if "error" in reply:
            raise self.utils.TritonModelException(reply["error"])
        return reply.get("value")

    def log(self, level, message):
        send({"op": "log", "level": int(level), "message": _clip(str(message), 60000)})

    def tell(self, msg):
        send(msg)


class OutputArena:
    """The stub's side of the output arena: a memfd region it grows, whose new fd it passes."""

    def __init__(self):
        self.mm = None
        self.size = 0
        # The fd of the arena as grown last, until a message carrying it has reached the server
        # (sent()): every layout() passes it, so that a message refused for its length
        # (MessageTooLong) cannot leave the server reading the arena before.
        self.unsent = None

    def sent(self):
        """The message with layout()'s fds was sent: the server has the arena now."""
        if self.unsent is not None:
            os.close(self.unsent)
            self.unsent = None

    def layout(self, tensors):
        """tensors: [(name, datatype, shape, payload ndarray)] -> specs, fds, arena size. The fds
        (and the size, as `arena`) go with the message that carries the specs; sent() once it has
        gone."""
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
            if self.unsent is not None:
                os.close(self.unsent)
            self.unsent = fd
        if self.unsent is not None:
            fds = [self.unsent]
            extra["arena"] = self.size
        mm = self.mm
        for spec, (_n, _d, _s, payload) in zip(specs, tensors):
            n = spec["size"]
            if n:
                start = spec["offset"]
                # payload is C-contiguous (encode): its bytes, copied once by mmap's C code.
                mm[start:start + n] = payload.reshape(-1).view(_np.uint8)
        return specs, fds, extra


def _model_class(path):
    """model.py imported as the module `model` (its folder on sys.path): its TritonPythonModel."""
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise AttributeError("%s defines no class TritonPythonModel" % path)
    return cls


class Stub:
    def __init__(self, utils):
        self.utils = utils
        self.model = None
        self.model_config = {}
        self.output_names = set()
        self.requested_names = []
        self.model_name = ""
        self.output_dtypes = {}
        self.decoupled = False
        # The input and output arenas of each of the two slots: the server may send the next
        # batch (in the other slot) before this one is done, so that this process goes from one
        # execute() to the next without waiting for the server. A decoupled model's sends use
        # slot 0 (its batches are never sent ahead).
        self.inputs = [None, None]  # mmaps
        self.outputs = [OutputArena(), OutputArena()]
        self.input = None  # the batch being executed's input arena
        self.arena_lock = threading.RLock()  # the output arena: one response's tensors at a time
        self.loop = None  # the asyncio loop of an `async def execute`
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
        elif spec["datatype"] == "BF16":  # no numpy type: its bits as uint16, for DLPack
            arr = np.ndarray(shape, np.uint16, buffer=self.input, offset=spec["offset"])
            return self.utils.Tensor._of_bf16(name, arr)
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
            if getattr(t, "_bf16", False):  # BF16's bits, as uint16 (pb_utils.Tensor._of_bf16)
                out.append((t.name(), "BF16", [int(d) for d in t._data.shape],
                            np.ascontiguousarray(t._data)))
                continue
            arr = t.as_numpy()
            if not arr.dtype.isnative:  # ">f4" on this host: its values, in the server's order
                arr = arr.astype(arr.dtype.newbyteorder("="))
            want = self.output_dtypes.get(t.name())
            if (want is not None and arr.dtype != want and arr.dtype.kind in "iu"
                    and want.kind in "iu"):
                # np.array([0]) is INT64 where the config says INT32 (Triton's own examples do
                # it): an integer output is converted to the config's integer type where no value
                # changes; otherwise (and for floats) the server refuses it, naming both types.
                cast = arr.astype(want)
                if np.array_equal(cast, arr):
                    arr = cast
            if want is not None and arr.size == 0 and arr.dtype != want:
                # An empty array has no values to change (np.array([]) is FP64): the config's type.
                arr = np.empty(arr.shape, dtype=want)
            if arr.dtype.kind in ("O", "S", "U"):
                flat = self.utils.serialize_byte_tensor(arr)
                payload = flat if flat is not None else np.zeros((0,), np.uint8)
                datatype = "BYTES"
            else:
                datatype = _DATATYPE_BY_DTYPE.get(arr.dtype)
                if datatype is None:
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
        # Each request's requested_output_names (a list of its own) and model name.
        self.requested_names = [o["name"] for o in self.model_config.get("output", [])]
        self.model_name = self.model_config.get("name", "")
        self.output_dtypes = {}
        for o in self.model_config.get("output", []):
            t = self.utils.triton_string_to_numpy(o.get("data_type", ""))
            if t is not None:
                self.output_dtypes[o["name"]] = _np.dtype(t)  # BYTES: object
        # Implicit state: the model writes each state's output as an ordinary output.
        for st in (self.model_config.get("sequence_batching") or {}).get("state", []):
            self.output_names.add(st.get("output_name", ""))
        policy = self.model_config.get("model_transaction_policy") or {}
        self.decoupled = bool(policy.get("decoupled", False))
        self.model = _model_class(msg["model_py"])()
        if hasattr(self.model, "initialize"):
            self.model.initialize(args)

    def execute(self, msg, fds):
        utils = self.utils
        slot = msg.get("slot", 0)
        if fds:
            # Not closed: arrays model.py kept from it stay valid (and it is unmapped when the
            # last goes).
            self.inputs[slot] = mmap.mmap(fds[0], msg["arena"])
            for fd in fds:
                os.close(fd)
        self.input = self.inputs[slot]
        requests = []
        senders = []
        STUB_BATCH[0] += 1
        batch = STUB_BATCH[0]
        make = utils.InferenceRequest._of_batch
        described = msg.get("requests")
        if described is None:  # too long for the socket: in the input arena, after the tensors
            at, size = msg["requests_at"]
            described = _DECODE(self.input[at:at + size].decode())
        for index, r in enumerate(described):
            sender = ResponseSender(self, index)
            senders.append(sender)
            trace = utils.InferenceTrace()
            trace._request, trace._batch = index, batch
            requests.append(make([self.input_tensor(s) for s in r["inputs"]],
                                 list(self.requested_names), r.get("id", ""),
                                 r.get("correlation_id", 0), r.get("flags", 0),
                                 r.get("parameters", "{}"), sender, self.model_name, trace))
        self.pending = len(requests) if self.decoupled else 0
        if msg.get("alone") and not self.decoupled:
            self.execute_each(requests, senders, slot)
            return
        try:
            result = self.call(requests)
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
            self.check(result, len(requests))
            answers = [self.answer(response) for response in result]
        except BaseException as e:  # noqa: B036
            fields = _error_fields(e)
            send({"op": "done", "error": fields["message"], "traceback": fields["traceback"]})
            return
        self.reply(answers, slot)

    def execute_each(self, requests, senders, slot):
        """A coalesced message (the server's "alone": requests that came together, where Triton
        gives execute() one request at a time): execute() once for each, in order; one that
        raises fails its own request, as a batch of its own would have."""
        # Each request's messages shortened so that all fit in one reply (JSON may escape a
        # character to six bytes); a traceback is logged whole, as the server logs a batch's.
        limit = MAX_REPLY // (8 * len(requests))
        answers = []
        for index, (request, sender) in enumerate(zip(requests, senders)):
            try:
                EXECUTING[0] = index
                try:
                    result = self.call([request])
                finally:
                    EXECUTING[0] = None
                    self.end_senders((sender,))
                self.check(result, 1)
                answers.append(self.answer(result[0], limit))
            except BaseException as e:  # noqa: B036
                fields = _error_fields(e)
                if fields["traceback"]:
                    send({"op": "log", "level": 2,
                          "message": "execute raised:\n" + fields["traceback"]})
                answers.append(("raised", _clip(fields["message"], limit)))
        self.reply(answers, slot)

    def call(self, requests):
        """model.execute(requests); an `async def execute` runs on this process's event loop."""
        result = self.model.execute(requests)
        if result.__class__ is not list and inspect.isawaitable(result):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            result = self.loop.run_until_complete(result)
        return result

    def check(self, result, count):
        utils = self.utils
        if not isinstance(result, (list, tuple)):
            raise utils.TritonModelException(
                "execute returned %s; it must return a list of one InferenceResponse per request"
                % type(result).__name__)
        if len(result) != count:
            raise utils.TritonModelException(
                "execute returned %d response(s) for %d request(s); it must return one "
                "InferenceResponse per request" % (len(result), count))
        for i, response in enumerate(result):
            if not isinstance(response, utils.InferenceResponse):
                raise utils.TritonModelException(
                    "execute's response %d is %s, not an InferenceResponse"
                    % (i, type(response).__name__))

    def answer(self, response, limit=16000):
        """One request's part of the reply: ("outputs", its encoded tensors) or ("error", the
        model's error response's message (up to `limit` characters), code)."""
        if response.has_error():
            err = response.error()
            return ("error", _clip(str(err.message()), limit), _error_code(err))
        return ("outputs", self.encode(response))

    def reply(self, answers, slot):
        """Sends the "done" message of a batch's answers (answer(), or ("raised", message) for a
        coalesced request whose execute raised), its tensors in the slot's output arena."""
        arena = self.outputs[slot]
        flat = [t for a in answers if a[0] == "outputs" for t in a[1]]
        try:
            with self.arena_lock:
                specs, fds, extra = arena.layout(flat)
        except BaseException as e:  # noqa: B036
            fields = _error_fields(e)
            send({"op": "done", "error": fields["message"], "traceback": fields["traceback"]})
            return
        out = []
        k = 0
        for a in answers:
            if a[0] == "outputs":
                out.append({"outputs": specs[k:k + len(a[1])]})
                k += len(a[1])
            elif a[0] == "error":
                out.append({"error": a[1], "code": a[2]})
            else:
                out.append({"raised": a[1]})
        reply = {"op": "done", "responses": out}
        reply.update(extra)
        try:
            with self.arena_lock:
                send(reply, fds)
                if fds:
                    arena.sent()
        except MessageTooLong as e:
            send({"op": "done", "error": str(e), "traceback": ""})

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

    def auto_complete(self, msg):
        """Triton's auto-complete: model.py's auto_complete_config(config) on the config given;
        replies with the config it returns, then this process ends."""
        cls = _model_class(msg["model_py"])
        config = self.utils.ModelConfig(msg["config"])
        fn = getattr(cls, "auto_complete_config", None)
        if fn is not None:
            result = fn(config)
            if not isinstance(result, self.utils.ModelConfig):
                raise self.utils.TritonModelException(
                    "auto_complete_config returned %s; it must return the pb_utils.ModelConfig "
                    "it was given" % type(result).__name__)
            config = result
        return config.as_dict()

    def run(self):
        msg, _payload, _fds = CHANNEL.next_loose()
        if msg.get("op") == "auto_complete":
            try:
                send({"op": "completed", "config": self.auto_complete(msg)})
            except BaseException as e:  # noqa: B036
                fields = _error_fields(e)
                send({"op": "error", "message": fields["message"],
                      "traceback": fields["traceback"]})
            return 0
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
            msg, _payload, fds = CHANNEL.next_loose()
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
        # The check, the message and the final flag together, once; the output arena holds this
        # response's tensors until the server has copied them (its answer).
        with self._stub.arena_lock:
            if self._final or self._closed:
                raise utils.TritonModelException(
                    "send: request %d already ended (its final flag was sent)" % self._index)
            fds = []
            payload = None
            if response is not None:
                if response.has_error():
                    msg["error"] = _clip(str(response.error().message()))
                    msg["code"] = _error_code(response.error())
                else:
                    tensors = self._stub.encode(response)
                    specs, payload = _inline_tensors(tensors)
                    if payload is not None:
                        msg["inline"] = True
                    else:
                        specs, fds, extra = self._stub.outputs[0].layout(tensors)
                        msg.update(extra)
                    msg["outputs"] = specs
            if not final and (payload is not None or "error" in msg):
                # Posted: no answer awaited (its tensors travel in the message, so nothing of
                # this side's is held; tensors in the output arena wait for the server's answer,
                # since the next response reuses the arena). The server reports a failure in the
                # answer to this model's next answered send (the final one at the latest).
                try:
                    send(msg, payload=payload)
                except MessageTooLong as e:
                    raise utils.TritonModelException("send: " + str(e)) from None
                return
            try:
                reply, _payload, _fds = CHANNEL.call(msg, fds, payload)
            except MessageTooLong as e:
                raise utils.TritonModelException("send: " + str(e)) from None
            if fds:
                self._stub.outputs[0].sent()
            self._cancelled = bool(reply.get("cancelled", False))
            if final:
                self._final = True
                self._stub.request_final()
        if reply.get("error"):
            raise utils.TritonModelException(reply["error"])

    def is_cancelled(self):
        if self._closed or self._final:
            return self._cancelled
        reply, _payload, _fds = CHANNEL.call({"op": "is_cancelled", "request": self._index})
        self._cancelled = bool(reply.get("value", False))
        return self._cancelled


_np = None
_DATATYPE_OF = {}
_DATATYPE_BY_DTYPE = {}  # native-order numpy dtype -> the protocol's datatype (main)


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
    # `kill -USR1 <pid>` prints every thread's stack to the server's log: where a model hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    threading.Thread(target=_watch_server, name="asyncinfer-watch-server", daemon=True).start()
    utils_text = SOCK.recv(MAX_MESSAGE).decode()
    utils = types.ModuleType("triton_python_backend_utils")
    utils.__file__ = "triton_python_backend_utils.py"
    _register_source(utils.__file__, utils_text)
    exec(compile(utils_text, utils.__file__, "exec"), utils.__dict__)
    sys.modules["triton_python_backend_utils"] = utils
    utils._host = Host(utils)
    import numpy as np
    _np = np
    _NUMPY_OF = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
                 "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
                 "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    for name, t in _NUMPY_OF.items():
        _DATATYPE_OF[np.dtype(t).str.lstrip("<>=|")] = name
        _DATATYPE_BY_DTYPE[np.dtype(t)] = name
    sys.stdout.flush()
    os._exit(Stub(utils).run())


main()
