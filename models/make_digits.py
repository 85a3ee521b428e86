#!/usr/bin/python3
"""make_digits.py — trains the small digits CNN used by the torch backend's tests and examples.

Data: scikit-learn's bundled handwritten digits (load_digits: 1,797 real 8×8 scans, values
0..16, classes 0..9). A stratified 25 % test split is held out.

What it writes to --out (default: models/data next to this script):
  digits.pt         TorchScript (torch.jit.script) CNN: input  "input"  f32[N,1,32,32]
                                                      output "logits" f32[N,10]
  digits.pt.json    sidecar signature (names, dtypes, shapes with -1 for the batch dim, max batch
                    size) plus the preprocessing (input size, mean, std), class labels and the
                    measured test accuracy
  digits.onnx       the same trained network exported to ONNX (torch.onnx.export, opset 13, dim 0
                    dynamic): input "input" f32[N,1,32,32], output "logits" f32[N,10]; the
                    openvino backend runs it
  digits.onnx.json  the same sidecar, for `asyncinfer run --model digits.onnx`
  test/NNNN.png     the test split as 128×128 8-bit grayscale PNG files
  test/labels.csv   columns file,label (file names relative to test/)

Preprocessing (the C++ side must reproduce it exactly; models/README.md documents it):
  1. render: the 8×8 scan (0..16) is scaled to 0..1 and upscaled to 128×128 with bilinear
     interpolation (half-pixel centres, edges clamped), then mapped to 0..255 and rounded to
     uint8. This is the PNG as saved.
  2. resize: 128×128 uint8 -> 32×32 uint8 exactly as stb_image_resize v0.97 does it with
     stbir_resize_uint8_generic(..., STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE,
     STBIR_COLORSPACE_LINEAR), emulated below in float32 in stb's own order of operations.
  3. normalise: x = (v / 255 - mean) / std in float32, mean/std from the sidecar.
Training sees images made by this same path, so a C++ pipeline (stb_image decode ->
stb_image_resize triangle -> normalise) reproduces the training distribution.

Deterministic: fixed seeds, torch.use_deterministic_algorithms(True), one intra-op thread, and
PYTHONHASHSEED=0 (the script re-executes itself with it) so that even the TorchScript archive is
byte-identical from run to run.
Skips all work when the outputs exist and are newer than this script, unless --force.
Exits 1 when the test accuracy is below 95 %.

Run with Debian's interpreter (it needs python3-torch and python3-sklearn):
  /usr/bin/python3 models/make_digits.py [--out DIR] [--force]
"""

import argparse
import json
import os
import shutil
import struct
import sys
import time
import zlib

SEED = 20240601
SCAN_SIZE = 8          # sklearn digits are 8×8
SCAN_MAX = 16.0        # sklearn digits take values 0..16
IMAGE_SIZE = 128       # PNG side
INPUT_SIZE = 32        # model input side
TEST_FRACTION = 0.25
MAX_BATCH = 64
EPOCHS = 15
BATCH = 32
LEARNING_RATE = 5e-3  # peak of the one-cycle schedule
MIN_ACCURACY = 0.95

MODEL_FILE = "digits.pt"
SIDECAR_FILE = "digits.pt.json"
ONNX_FILE = "digits.onnx"
ONNX_OPSET = 13
TEST_DIR = "test"
LABELS_FILE = "labels.csv"


# ---- images --------------------------------------------------------------------------------


def bilinear_upscale_matrix(np, n_in, n_out):
    """[n_out, n_in] float64 weights of bilinear upscaling with half-pixel centres, edges clamped
    (what torch's interpolate(mode='bilinear', align_corners=False) does for upscaling)."""
    w = np.zeros((n_out, n_in), dtype=np.float64)
    for o in range(n_out):
        src = (o + 0.5) * n_in / n_out - 0.5
        src = min(max(src, 0.0), n_in - 1.0)
        i0 = int(np.floor(src))
        i1 = min(i0 + 1, n_in - 1)
        frac = src - i0
        w[o, i0] += 1.0 - frac
        w[o, i1] += frac
    return w


def render_scans(np, scans):
    """[N,8,8] scans with values 0..16 -> [N,128,128] uint8 images (step 1 of the transform)."""
    up = bilinear_upscale_matrix(np, SCAN_SIZE, IMAGE_SIZE)
    img = np.matmul(np.matmul(up, scans.astype(np.float64) / SCAN_MAX), up.T)
    return np.clip(np.floor(img * 255.0 + 0.5), 0, 255).astype(np.uint8)


def stb_triangle_taps(np, n_in, n_out):
    """Contributors of stb_image_resize's downsampling with STBIR_FILTER_TRIANGLE and
    STBIR_EDGE_CLAMP: for each output pixel, input indices (clamped) and float32 weights in the
    order stb accumulates them (ascending input index). Returns ([n_out, T] int, [n_out, T] f32),
    padded with zero weights."""
    f32 = np.float32
    scale = f32(n_out) / f32(n_in)
    assert scale < 1, "only downsampling is emulated"
    radius = int(np.ceil(1.0 / scale))  # triangle support is 1 output pixel = 1/scale inputs
    taps = [[] for _ in range(n_out)]
    for n in range(-radius - 1, n_in + radius + 1):
        out_center_of_in = f32(n + 0.5) * scale
        for j in range(n_out):
            x = abs(f32(j + 0.5) - out_center_of_in)
            w = (f32(1) - x) * scale if x <= 1 else f32(0)
            if w != 0:
                taps[j].append((min(max(n, 0), n_in - 1), f32(w)))
    width = max(len(t) for t in taps)
    idx = np.zeros((n_out, width), dtype=np.int64)
    wts = np.zeros((n_out, width), dtype=np.float32)
    for j, t in enumerate(taps):
        total = f32(0)
        for _, w in t:
            total = f32(total + w)
        norm = f32(1) / total  # stbir__normalize_downsample_coefficients
        for k, (n, w) in enumerate(t):
            idx[j, k] = n
            wts[j, k] = f32(w * norm)
    return idx, wts


def stb_resize_triangle(np, images, n_out):
    """[N,H,W] uint8 -> [N,n_out,n_out] uint8, bit-exact with stb_image_resize v0.97's
    stbir_resize_uint8_generic(..., 1 channel, STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE,
    STBIR_COLORSPACE_LINEAR) (step 2 of the transform): decode v/255 in float32, horizontal pass,
    vertical pass, each accumulating products in ascending input order, then
    (int)(saturate(f) * 255 + 0.5)."""
    f32 = np.float32
    n_in = images.shape[-1]
    idx, wts = stb_triangle_taps(np, n_in, n_out)
    dec = images.astype(np.float32) / f32(255)
    horiz = np.zeros(images.shape[:-1] + (n_out,), dtype=np.float32)
    for k in range(idx.shape[1]):
        horiz = horiz + dec[..., idx[:, k]] * wts[:, k]
    out = np.zeros(images.shape[:-2] + (n_out, n_out), dtype=np.float32)
    for k in range(idx.shape[1]):
        out = out + horiz[..., idx[:, k], :] * wts[:, k][:, None]
    scaled = np.clip(out, f32(0), f32(1)) * f32(255)
    return np.floor(scaled.astype(np.float64) + 0.5).astype(np.uint8)


def normalise(np, small, mean, std):
    """[N,32,32] uint8 -> [N,1,32,32] float32: (v / 255 - mean) / std (step 3)."""
    f32 = np.float32
    x = (small.astype(np.float32) / f32(255) - f32(mean)) / f32(std)
    return x[:, None, :, :].astype(np.float32)


def write_png_gray8(path, image):
    """Writes a [H,W] uint8 array as an 8-bit grayscale PNG (no filtering, zlib level 9)."""
    h, w = image.shape
    raw = b"".join(b"\x00" + image[r].tobytes() for r in range(h))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
           chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def read_png_gray8(np, path):
    """Reads back a PNG written by write_png_gray8 (8-bit grayscale, filter 0 rows only)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, w, h, idat = 8, 0, 0, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, w + 1)
    assert (raw[:, 0] == 0).all(), "unexpected PNG row filter"
    return raw[:, 1:].copy()


# ---- model ---------------------------------------------------------------------------------


def make_model(nn):
    class DigitsCNN(nn.Module):
        """[N,1,32,32] float32 normalised images -> [N,10] logits."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 8×16×16
                nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16×8×8
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32×4×4
            )
            self.classifier = nn.Sequential(
                nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, x):
            return self.classifier(self.features(x))

    return DigitsCNN()


# ---- main ----------------------------------------------------------------------------------


def outputs_up_to_date(out_dir, script_mtime):
    paths = [os.path.join(out_dir, MODEL_FILE), os.path.join(out_dir, SIDECAR_FILE),
             os.path.join(out_dir, ONNX_FILE), os.path.join(out_dir, ONNX_FILE + ".json"),
             os.path.join(out_dir, TEST_DIR, LABELS_FILE)]
    try:
        return all(os.path.getmtime(p) > script_mtime for p in paths)
    except OSError:
        return False


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "data"),
                        help="output directory (default: models/data)")
    parser.add_argument("--force", action="store_true", help="retrain even when up to date")
    args = parser.parse_args()
    out_dir = os.path.abspath(args.out)

    if not args.force and outputs_up_to_date(out_dir, os.path.getmtime(os.path.abspath(__file__))):
        with open(os.path.join(out_dir, SIDECAR_FILE)) as f:
            acc = json.load(f).get("test_accuracy", float("nan"))
        print(f"{out_dir}: up to date (test accuracy {acc * 100:.2f} %); --force retrains")
        return 0

    # TorchScript writes a module's constants in Python's set order, which depends on string
    # hashing: pin the hash seed so that digits.pt is byte-identical from run to run.
    if os.environ.get("PYTHONHASHSEED") != "0":
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                  dict(os.environ, PYTHONHASHSEED="0"))

    # Imported here so the up-to-date check above stays fast.
    import numpy as np
    import torch
    from torch import nn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    digits = load_digits()
    scans = digits.images.astype(np.float64)  # [1797,8,8], 0..16
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=TEST_FRACTION,
                                           stratify=labels, random_state=SEED)
    test_idx = np.sort(test_idx)

    t0 = time.perf_counter()
    big = render_scans(np, scans)                       # what the PNG files hold
    small = stb_resize_triangle(np, big, INPUT_SIZE)    # what C++ gets after stb_image_resize
    train01 = small[train_idx].astype(np.float32) / np.float32(255)
    mean = round(float(train01.mean()), 4)
    std = round(float(train01.std()), 4)
    x_all = torch.from_numpy(normalise(np, small, mean, std))
    y_all = torch.from_numpy(labels)
    x_train, y_train = x_all[train_idx], y_all[train_idx]
    x_test, y_test = x_all[test_idx], y_all[test_idx]
    t_prep = time.perf_counter() - t0

    model = make_model(nn)
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    steps_per_epoch = (len(train_idx) + BATCH - 1) // BATCH
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LEARNING_RATE,
                                                   total_steps=EPOCHS * steps_per_epoch)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    t0 = time.perf_counter()
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(y_train), generator=gen)
        for b in range(0, len(order), BATCH):
            sel = order[b:b + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(x_train[sel]), y_train[sel])
            loss.backward()
            opt.step()
            schedule.step()
    t_train = time.perf_counter() - t0

    model.eval()
    scripted = torch.jit.script(model)
    with torch.inference_mode():
        pred = scripted(x_test).argmax(dim=1)
    correct = int((pred == y_test).sum())
    accuracy = correct / len(y_test)
    print(f"trained on {len(train_idx)} images in {t_train:.1f} s ({EPOCHS} epochs, "
          f"preprocessing {t_prep:.1f} s); test accuracy {accuracy * 100:.2f} % "
          f"({correct}/{len(y_test)})")
    if accuracy < MIN_ACCURACY:
        print(f"error: test accuracy below {MIN_ACCURACY * 100:.0f} %; nothing written",
              file=sys.stderr)
        return 1

    # Write: test images and labels, the model, and the sidecar last (its presence marks a
    # complete output directory).
    os.makedirs(out_dir, exist_ok=True)
    sidecar_path = os.path.join(out_dir, SIDECAR_FILE)
    if os.path.exists(sidecar_path):
        os.remove(sidecar_path)
    test_dir = os.path.join(out_dir, TEST_DIR)
    if os.path.isdir(test_dir):
        shutil.rmtree(test_dir)
    os.makedirs(test_dir)
    rows = ["file,label"]
    for k, i in enumerate(test_idx):
        name = f"{k:04d}.png"
        write_png_gray8(os.path.join(test_dir, name), big[i])
        rows.append(f"{name},{labels[i]}")
    with open(os.path.join(test_dir, LABELS_FILE), "w") as f:
        f.write("\n".join(rows) + "\n")
    model_path = os.path.join(out_dir, MODEL_FILE)
    scripted.save(model_path)
    # The same weights as ONNX, traced from the eager module; dim 0 (the batch) left dynamic.
    onnx_path = os.path.join(out_dir, ONNX_FILE)
    torch.onnx.export(model, x_test[:1], onnx_path, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=ONNX_OPSET, do_constant_folding=True)

    # Check what was written: PNGs decode to the same pixels, and the saved module read back
    # through the whole path (decode -> resize -> normalise) gives the same accuracy.
    reloaded = torch.jit.load(model_path)
    decoded = np.stack([read_png_gray8(np, os.path.join(test_dir, f"{k:04d}.png"))
                        for k in range(len(test_idx))])
    if not np.array_equal(decoded, big[test_idx]):
        print("error: PNG files do not decode to the rendered pixels", file=sys.stderr)
        return 1
    x_check = torch.from_numpy(normalise(np, stb_resize_triangle(np, decoded, INPUT_SIZE),
                                         mean, std))
    with torch.inference_mode():
        check = int((reloaded(x_check).argmax(dim=1) == y_test).sum())
    if check != correct:
        print(f"error: the saved model reads back with {check} correct, not {correct}",
              file=sys.stderr)
        return 1

    sidecar = {
        "format": "asyncinfer-signature/1",
        "inputs": [{"name": "input", "dtype": "f32", "shape": [-1, 1, INPUT_SIZE, INPUT_SIZE]}],
        "outputs": [{"name": "logits", "dtype": "f32", "shape": [-1, 10]}],
        "batched": True,
        "max_batch_size": MAX_BATCH,
        "preprocessing": {
            "image_size": IMAGE_SIZE,
            "input_size": INPUT_SIZE,
            "channels": 1,
            "resize": "stb_image_resize v0.97 stbir_resize_uint8_generic, STBIR_FILTER_TRIANGLE, "
                      "STBIR_EDGE_CLAMP, STBIR_COLORSPACE_LINEAR, uint8 -> uint8",
            "scale": 1.0 / 255.0,
            "mean": mean,
            "std": std,
            "formula": "x = (v / 255 - mean) / std, float32",
        },
        "labels": [str(c) for c in range(10)],
        "test_set": {"dir": TEST_DIR, "labels": LABELS_FILE, "count": len(test_idx),
                     "correct": correct},
        "test_accuracy": accuracy,
        "seed": SEED,
    }
    for path in (os.path.join(out_dir, ONNX_FILE + ".json"), sidecar_path):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(sidecar, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    print(f"wrote {model_path}, {onnx_path}, {sidecar_path}, {len(test_idx)} test images in {test_dir} "
          f"(mean {mean}, std {std})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
