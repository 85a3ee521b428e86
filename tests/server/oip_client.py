"""A small Open Inference Protocol (KServe v2) HTTP client, written from the protocol documents
(kserve/open-inference-protocol inference_rest.md; Triton's extension_binary_data.md), not from
asyncinfer's server code. Like Triton's Python client (tritonclient.http) it sends every input
as binary tensor data by default and asks for every output in binary:

  body    = JSON header, then each binary input's bytes in the order of "inputs"
  header  Inference-Header-Content-Length: <bytes of the JSON header>
  input   "parameters": {"binary_data_size": <bytes>}, no "data"
  output  "parameters": {"binary_data": true}; without "outputs", the request parameter
          "binary_data_output": true asks for all of them in binary

Data is little-endian, row-major, unpadded; BOOL is one byte. Responses in the same layout are
split with the response's Inference-Header-Content-Length.
"""

import json
import struct
import urllib.parse

import requests

# OIP datatype → (struct format char, bytes per element).
DATATYPES = {
    "BOOL": ("?", 1), "UINT8": ("B", 1), "UINT16": ("H", 2), "UINT32": ("I", 4),
    "UINT64": ("Q", 8), "INT8": ("b", 1), "INT16": ("h", 2), "INT32": ("i", 4),
    "INT64": ("q", 8), "FP16": ("e", 2), "FP32": ("f", 4), "FP64": ("d", 8),
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def pack(datatype, values):
    fmt, _ = DATATYPES[datatype]
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def unpack(datatype, raw):
    fmt, size = DATATYPES[datatype]
    return list(struct.unpack("<%d%s" % (len(raw) // size, fmt), raw))


class InferInput:
    def __init__(self, name, shape, datatype, values=None, raw=None):
        self.name, self.shape, self.datatype = name, list(shape), datatype
        self.raw = raw if raw is not None else pack(datatype, values)


class InferResult:
    def __init__(self, header, buffers):
        self.header = header
        self._buffers = buffers

    def output(self, name):
        for o in self.header["outputs"]:
            if o["name"] == name:
                return o
        raise KeyError(name)

    def as_list(self, name):
        o = self.output(name)
        if name in self._buffers:
            return unpack(o["datatype"], self._buffers[name])
        return o["data"]

    def raw(self, name):
        return self._buffers[name]


class ServerError(Exception):
    def __init__(self, status, message):
        super().__init__("%d: %s" % (status, message))
        self.status = status
        self.message = message


class Client:
    def __init__(self, url, session=None):
        self.url = url.rstrip("/")
        self.http = session or requests.Session()

    def _get(self, path):
        r = self.http.get(self.url + path, timeout=30)
        return r

    def is_server_live(self):
        return self._get("/v2/health/live").status_code == 200

    def is_server_ready(self):
        return self._get("/v2/health/ready").status_code == 200

    def is_model_ready(self, model, version=""):
        return self._get(self._model_path(model, version) + "/ready").status_code == 200

    def server_metadata(self):
        return self._checked(self._get("/v2")).json()

    def model_metadata(self, model, version=""):
        return self._checked(self._get(self._model_path(model, version))).json()

    @staticmethod
    def _model_path(model, version):
        p = "/v2/models/" + urllib.parse.quote(model, safe="")
        if version:
            p += "/versions/" + urllib.parse.quote(str(version), safe="")
        return p

    @staticmethod
    def _checked(r):
        if r.status_code != 200:
            try:
                message = r.json()["error"]
            except Exception:  # noqa: BLE001 - any body that is not the protocol's error
                message = r.text
            raise ServerError(r.status_code, message)
        return r

    def infer(self, model, inputs, outputs=None, version="", request_id="", parameters=None,
              binary_output=True, timeout=30):
        """inputs: [InferInput]; outputs: names to return (None = all)."""
        request = {}
        if request_id:
            request["id"] = request_id
        params = dict(parameters or {})
        request["inputs"] = [{"name": i.name, "shape": i.shape, "datatype": i.datatype,
                              "parameters": {"binary_data_size": len(i.raw)}} for i in inputs]
        if outputs is not None:
            request["outputs"] = [{"name": n, "parameters": {"binary_data": binary_output}}
                                  for n in outputs]
        else:
            params["binary_data_output"] = binary_output
        if params:
            request["parameters"] = params
        header = json.dumps(request).encode()
        body = header + b"".join(i.raw for i in inputs)
        r = self.http.post(self.url + self._model_path(model, version) + "/infer", data=body,
                           headers={"Inference-Header-Content-Length": str(len(header))},
                           timeout=timeout)
        self._checked(r)
        return self.parse_response(r.headers, r.content)

    @staticmethod
    def parse_response(headers, content):
        length = headers.get("Inference-Header-Content-Length")
        if length is None:
            return InferResult(json.loads(content), {})
        n = int(length)
        header = json.loads(content[:n])
        buffers, offset = {}, n
        for o in header["outputs"]:
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                buffers[o["name"]] = content[offset:offset + size]
                offset += size
        if offset != len(content):
            raise ValueError("response has %d bytes after its JSON, the outputs claim %d"
                             % (len(content) - n, offset - n))
        return InferResult(header, buffers)
