"""Step 1 of the digits ensemble: each request's PNG bytes -> the digits model's input.

The same three operations as `asyncinfer run` (models/README.md, "The preprocessing, exactly"),
so that the ensemble's predictions equal the CLI's:
  1. decode the PNG to 8-bit gray values, unchanged (PIL, Debian's python3-pil);
  2. resize to 32x32 as stb_image_resize v0.97's stbir_resize_uint8_generic with the triangle
     filter and clamped edges does, bit for bit (float32, stb's order of operations);
  3. normalise: (v / 255 - mean) / std in float32, mean and std from the model's sidecar
     (digits.pt.json, linked beside this file).
Only downsampling is emulated: an image smaller than 32x32 is refused (INVALID_ARG)."""

import io
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

F32 = np.float32


def triangle_taps(n_in, n_out):
    """For each output pixel of a triangle-filter downsample from n_in to n_out pixels: the input
    indices (clamped to the edge) and float32 weights, in the order stb accumulates them."""
    scale = F32(n_out) / F32(n_in)
    radius = int(np.ceil(1.0 / scale))
    taps = [[] for _ in range(n_out)]
    for n in range(-radius - 1, n_in + radius + 1):
        center = F32(n + 0.5) * scale
        for j in range(n_out):
            x = abs(F32(j + 0.5) - center)
            w = (F32(1) - x) * scale if x <= 1 else F32(0)
            if w != 0:
                taps[j].append((min(max(n, 0), n_in - 1), F32(w)))
    width = max(len(t) for t in taps)
    idx = np.zeros((n_out, width), dtype=np.int64)
    wts = np.zeros((n_out, width), dtype=np.float32)
    for j, t in enumerate(taps):
        total = F32(0)
        for _, w in t:
            total = F32(total + w)
        norm = F32(1) / total
        for k, (n, w) in enumerate(t):
            idx[j, k] = n
            wts[j, k] = F32(w * norm)
    return idx, wts


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(__file__), "digits.pt.json")) as f:
            pre = json.load(f)["preprocessing"]
        self.size = int(pre["input_size"])
        self.mean = F32(pre["mean"])
        self.std = F32(pre["std"])
        self.taps = {}

    def resize(self, gray):
        h, w = gray.shape
        if h not in self.taps:
            self.taps[h] = triangle_taps(h, self.size)
        if w not in self.taps:
            self.taps[w] = triangle_taps(w, self.size)
        rows_idx, rows_w = self.taps[h]
        cols_idx, cols_w = self.taps[w]
        dec = gray.astype(np.float32) / F32(255)
        horiz = np.zeros((h, self.size), dtype=np.float32)
        for k in range(cols_idx.shape[1]):
            horiz = horiz + dec[:, cols_idx[:, k]] * cols_w[:, k]
        out = np.zeros((self.size, self.size), dtype=np.float32)
        for k in range(rows_idx.shape[1]):
            out = out + horiz[rows_idx[:, k], :] * rows_w[:, k][:, None]
        scaled = np.clip(out, F32(0), F32(1)) * F32(255)
        return np.floor(scaled.astype(np.float64) + 0.5).astype(np.uint8)

    def image(self, data):
        with Image.open(io.BytesIO(data)) as im:
            gray = np.asarray(im.convert("L") if im.mode != "L" else im, dtype=np.uint8)
        if gray.shape[0] < self.size or gray.shape[1] < self.size:
            raise ValueError("image of %dx%d is smaller than %dx%d"
                             % (gray.shape[1], gray.shape[0], self.size, self.size))
        small = self.resize(gray)
        return ((small.astype(np.float32) / F32(255) - self.mean) / self.std).astype(np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            try:
                batch = np.stack([self.image(row[0]) for row in images])[:, None, :, :]
            except Exception as e:  # a file that is not an image, or too small: this request only
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "IMAGE: %s" % e, pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INPUT__0", batch)]))
        return responses
