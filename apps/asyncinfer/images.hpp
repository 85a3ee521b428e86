// images.hpp — image files in, model inputs out: the pre-processing of `asyncinfer run`.
//
// Decoding is stb_image (Debian's libstb-dev); resizing is stb_image_resize with the triangle
// filter, clamped edges and linear colour space — exactly the transform models/make_digits.py
// trains with (models/README.md); normalising is x = (v / 255 − mean) / std in float32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer::cli {

struct Preprocess {
  int size = 32;      ///< output height and width
  int channels = 1;   ///< 1 (gray) or 3 (RGB)
  float mean = 0.0f;  ///< after scaling to [0, 1]
  float std = 1.0f;
};

/// Reads, decodes, resizes and normalises one image into an f32 tensor [1, channels, size, size].
/// invalid_argument naming the file when it cannot be read or is not an image stb can decode.
Result<Tensor> load_image(const std::string& path, const Preprocess& p);

/// Expands files, folders (their image files, recursively, sorted) and glob patterns into a
/// sorted list of files. A path that does not exist, or a pattern matching nothing, is added to
/// `problems` (not fatal). Image files are recognised by extension (png, jpg, jpeg, bmp, gif,
/// tga, pgm, ppm, pnm, psd, hdr, pic) inside folders; files named explicitly are taken as they are
/// (a non-image file then fails at decode, is reported by name and skipped).
std::vector<std::string> expand_images(const std::vector<std::string>& args,
                                       std::vector<std::string>& problems);

/// A labels CSV with a header and two columns, file,label (the format make_digits.py writes).
/// Keys: the file as written, the file resolved against the CSV's folder, and its base name.
/// invalid_argument naming the file and line of a malformed row.
Result<std::map<std::string, int>> read_labels(const std::string& csv_path);

/// The label of `image_path`, or -1 when the map has none for it.
int label_of(const std::map<std::string, int>& labels, const std::string& image_path);

}  // namespace asyncinfer::cli
