// The python backend's round trip: one request at a time through Engine::infer on an identity
// model.py (one FP32 input of [1,16], copied to the output), against the same request on
// builtin:identity, so that the difference is what the Python process costs: the control
// message each way, the copies through the shared-memory arenas, the stub's numpy views and
// model.py's execute. That is the server-side share of a request; the protocol's decode and encode
// come on top (docs/performance.md).
//
//   bench_python_backend [requests=20000] [interpreter=/usr/bin/python3]
//
// Prints p50, p90, p99 and the mean for both models, in microseconds.
#include <algorithm>
#include <asyncinfer/asyncinfer.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr const char* kIdentity = R"(import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
)";

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

int measure(const char* label, const std::shared_ptr<asyncinfer::Model>& model, int requests) {
  auto device = asyncinfer::open_device("cpu");
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().to_string().c_str());
    return 1;
  }
  asyncinfer::EngineOptions options;
  options.workers = 1;
  auto engine = asyncinfer::Engine::create(model, *device, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::vector<float> values(16);
  std::iota(values.begin(), values.end(), 0.0F);
  auto x = asyncinfer::Tensor::from_values(asyncinfer::Shape{1, 16}, values);
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(requests));
  for (int i = 0; i < requests + requests / 10; ++i) {  // the first tenth warms up
    const Clock::time_point t0 = Clock::now();
    auto out = (*engine)->infer({*x});
    const double took = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!out.ok()) {
      std::fprintf(stderr, "%s: %s\n", label, out.status().to_string().c_str());
      return 1;
    }
    if (i >= requests / 10) us.push_back(took);
  }
  const double mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
  std::printf("%-28s p50 %7.1f us  p90 %7.1f us  p99 %7.1f us  mean %7.1f us  (%d requests)\n",
              label, percentile(us, 50), percentile(us, 90), percentile(us, 99), mean, requests);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 20000;
  const std::string interpreter = argc > 2 ? argv[2] : "/usr/bin/python3";
  if (requests < 10) {
    std::fprintf(stderr, "usage: bench_python_backend [requests>=10] [interpreter]\n");
    return 2;
  }
  // <tmp>/identity/1/model.py, as in a model repository.
  const fs::path dir = fs::temp_directory_path() /
                       ("asyncinfer-bench-python-" + std::to_string(::getpid())) / "identity" / "1";
  fs::create_directories(dir);
  std::ofstream(dir / "model.py") << kIdentity;

  asyncinfer::ModelOptions mo;
  auto spec = [](const char* name) {
    return asyncinfer::TensorSpec{name, asyncinfer::DType::f32, asyncinfer::Shape{-1, 16}};
  };
  mo.inputs = {spec("x")};
  mo.outputs = {spec("y")};
  mo.batch_limit = 8;
  mo.backend_parameters = {{"python_interpreter", interpreter}};
  auto python = asyncinfer::load_model("python:" + (dir / "model.py").string(), mo);
  auto builtin = asyncinfer::load_model("builtin:identity?shape=16&max_batch=8");
  int rc = 0;
  if (!python.ok() || !builtin.ok()) {
    std::fprintf(stderr, "load: %s %s\n", python.status().to_string().c_str(),
                 builtin.status().to_string().c_str());
    rc = 1;
  } else {
    rc = measure("builtin:identity", *builtin, requests);
    if (rc == 0) rc = measure("python identity (model.py)", *python, requests);
  }
  fs::remove_all(dir.parent_path().parent_path());
  return rc;
}
