#include "images.hpp"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <stb_image.h>
#include <stb_image_resize.h>

namespace asyncinfer::cli {
namespace fs = std::filesystem;

namespace {
bool has_image_extension(const fs::path& p) {
  static const std::set<std::string> kExt = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga",
                                             ".pgm", ".ppm", ".pnm",  ".psd", ".hdr", ".pic"};
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return kExt.count(ext) != 0;
}

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}
}  // namespace

Result<Tensor> load_image(const std::string& path, const Preprocess& p) {
  int width = 0;
  int height = 0;
  int file_channels = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels(
      stbi_load(path.c_str(), &width, &height, &file_channels, p.channels), &stbi_image_free);
  if (!pixels) {
    std::error_code ec;
    const std::string why = !fs::exists(path, ec)        ? "no such file"
                            : fs::is_directory(path, ec) ? "it is a folder"
                                                         : stbi_failure_reason();
    return invalid_argument_error("cannot decode image '" + path + "': " + why);
  }
  const auto size = static_cast<std::size_t>(p.size);
  const auto channels = static_cast<std::size_t>(p.channels);
  std::vector<unsigned char> small(size * size * channels);
  const int ok =
      stbir_resize_uint8_generic(pixels.get(), width, height, 0, small.data(), p.size, p.size, 0,
                                 p.channels, STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP,
                                 STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, nullptr);
  if (ok != 1) return internal_error("resizing image '" + path + "' failed");
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(DType::f32, {1, p.channels, p.size, p.size}));
  // stb gives interleaved HWC; the model wants planar CHW.
  float* out = t.data_as<float>();
  const float inv_std = 1.0f / p.std;
  for (std::size_t c = 0; c < channels; ++c) {
    for (std::size_t i = 0; i < size * size; ++i) {
      const float v = static_cast<float>(small[i * channels + c]) / 255.0f;
      out[c * size * size + i] = (v - p.mean) * inv_std;
    }
  }
  return t;
}

std::vector<std::string> expand_images(const std::vector<std::string>& args,
                                       std::vector<std::string>& problems) {
  std::vector<std::string> files;
  for (const std::string& arg : args) {
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(arg, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec) && has_image_extension(it->path())) {
          found.push_back(it->path().string());
        }
      }
      if (found.empty()) problems.push_back("folder '" + arg + "' holds no image files");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(arg, ec)) {
      files.push_back(arg);
    } else if (arg.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      if (glob(arg.c_str(), 0, nullptr, &g) == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
      } else {
        problems.push_back("pattern '" + arg + "' matches no file");
      }
      globfree(&g);
    } else {
      problems.push_back("'" + arg + "' does not exist");
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

Result<std::map<std::string, int>> read_labels(const std::string& csv_path) {
  std::ifstream in(csv_path);
  if (!in) return not_found_error("cannot open labels file '" + csv_path + "'");
  const fs::path dir = fs::path(csv_path).parent_path();
  std::map<std::string, int> labels;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    line = trim(line);
    if (line.empty()) continue;
    const std::size_t comma = line.find(',');
    if (comma == std::string::npos) {
      return invalid_argument_error("labels file '" + csv_path + "' line " +
                                    std::to_string(line_no) +
                                    ": expected two columns file,label, got '" + line + "'");
    }
    const std::string file = trim(line.substr(0, comma));
    const std::string label = trim(line.substr(comma + 1));
    if (line_no == 1 && (file == "file" || file == "filename" || file == "path")) continue;
    char* end = nullptr;
    const long v = std::strtol(label.c_str(), &end, 10);
    if (label.empty() || *end != '\0' || v < 0) {
      return invalid_argument_error("labels file '" + csv_path + "' line " +
                                    std::to_string(line_no) + ": label '" + label +
                                    "' is not a class index >= 0");
    }
    labels[file] = static_cast<int>(v);
    labels[(dir / file).lexically_normal().string()] = static_cast<int>(v);
    labels[fs::path(file).filename().string()] = static_cast<int>(v);
  }
  return labels;
}

int label_of(const std::map<std::string, int>& labels, const std::string& image_path) {
  for (const std::string& key : {image_path, fs::path(image_path).lexically_normal().string(),
                                 fs::path(image_path).filename().string()}) {
    auto it = labels.find(key);
    if (it != labels.end()) return it->second;
  }
  return -1;
}

}  // namespace asyncinfer::cli
