// The TorchScript backend: results equal libtorch's own on the same file, load-time and
// enqueue-time errors are Statuses with clear messages, signatures from sidecar files and from
// command-line specs, per-instance intra-op threads, and the digits test set through the
// documented C++ preprocessing (stb_image + stb_image_resize) at the accuracy Python measured.
//
// The digits model comes from the CTest fixture TorchDigitsModel (models/make_digits.py --out
// ASYNCINFER_TEST_MODELS_DIR). Small modules for edge cases are written by the tests themselves
// with torch::jit::Module::define.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/script.h>
#include <nlohmann/json.hpp>
#if defined(ASYNCINFER_TEST_HAVE_STB)
#include <stb_image.h>
#include <stb_image_resize.h>
#endif

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"

#ifndef ASYNCINFER_TEST_MODELS_DIR
#error "ASYNCINFER_TEST_MODELS_DIR must name the directory make_digits.py writes"
#endif

namespace asyncinfer {
namespace {

namespace fs = std::filesystem;

const std::string kModelsDir = ASYNCINFER_TEST_MODELS_DIR;
const std::string kDigits = kModelsDir + "/digits.pt";

/// A fresh directory for one test's files.
fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() /
                 ("asyncinfer_test_torch_" + std::to_string(::getpid())) /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Saves a TorchScript module whose methods are `source`.
void save_module(const fs::path& path, const std::string& source) {
  torch::jit::Module m("TestModule");
  m.define(source);
  m.save(path.string());
}

void require_digits() {
  ASSERT_TRUE(fs::exists(kDigits) && fs::exists(kDigits + ".json"))
      << kDigits << " is missing: run the tests through ctest (fixture TorchDigitsModel) or run "
      << "/usr/bin/python3 models/make_digits.py --out " << kModelsDir;
}

/// Deterministic pseudo-random f32 values in [-2, 2).
Tensor random_tensor(Shape shape, unsigned seed) {
  Tensor t = *Tensor::empty(DType::f32, std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  float* p = t.data_as<float>();
  for (std::size_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

std::shared_ptr<BatchIO> batch_of(std::vector<Tensor> inputs) {
  auto io = std::make_shared<BatchIO>();
  io->batch_size = inputs.empty() || inputs[0].rank() == 0 ? 1 : inputs[0].dim(0);
  io->host_inputs = inputs;
  io->inputs = std::move(inputs);
  return io;
}

/// libtorch called directly on `file`, as the reference.
at::Tensor reference_forward(const std::string& file, const Tensor& input) {
  torch::jit::Module m = torch::jit::load(file);
  m.eval();
  torch::NoGradGuard no_grad;
  at::Tensor x = torch::from_blob(input.data(), input.shape(), at::kFloat).clone();
  return m.forward({x}).toTensor().contiguous();
}

float max_abs_diff(const Tensor& ours, const at::Tensor& ref) {
  EXPECT_EQ(ours.numel(), static_cast<std::size_t>(ref.numel()));
  const float* a = ours.data_as<float>();
  const float* b = ref.data_ptr<float>();
  float worst = 0;
  for (std::size_t i = 0; i < ours.numel(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

struct Worker {
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<ModelInstance> instance;
};

Result<Worker> make_worker(const std::shared_ptr<Model>& model, const std::string& device_name,
                           int threads = 1) {
  Worker w;
  ASYNCINFER_ASSIGN_OR_RETURN(w.device, open_device(device_name));
  ASYNCINFER_ASSIGN_OR_RETURN(w.stream, w.device->create_stream());
  InstanceOptions o;
  o.intra_op_threads = threads;
  ASYNCINFER_ASSIGN_OR_RETURN(w.instance, model->create_instance(*w.device, *w.stream, o));
  return w;
}

/// Runs one batch through `w` and waits for it.
Status run(Worker& w, const std::shared_ptr<BatchIO>& io) {
  ASYNCINFER_RETURN_IF_ERROR(w.instance->enqueue(*w.stream, io));
  return w.stream->synchronize();
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// ---- the digits model ---------------------------------------------------------------------

TEST(TorchDigits, SignatureComesFromTheSidecar) {
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelSignature& sig = (*model)->signature();
  ASSERT_EQ(sig.inputs.size(), 1u);
  EXPECT_EQ(sig.inputs[0].name, "input");
  EXPECT_EQ(sig.inputs[0].dtype, DType::f32);
  EXPECT_EQ(sig.inputs[0].shape, (Shape{-1, 1, 32, 32}));
  ASSERT_EQ(sig.outputs.size(), 1u);
  EXPECT_EQ(sig.outputs[0].name, "logits");
  EXPECT_EQ(sig.outputs[0].shape, (Shape{-1, 10}));
  EXPECT_TRUE(sig.batched);
  EXPECT_EQ(sig.batch_limit, 64);
  EXPECT_FALSE((*model)->cancellable());
  EXPECT_EQ((*model)->name(), kDigits);
  // "torch:" prefix too.
  EXPECT_TRUE(load_model("torch:" + kDigits).ok());
}

TEST(TorchDigits, CpuStreamMatchesLibtorchDirectly) {
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();
  for (std::int64_t batch : {1, 7, 32}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Tensor x = random_tensor({batch, 1, 32, 32}, static_cast<unsigned>(batch));
    auto io = batch_of({x});
    ASSERT_TRUE(run(*w, io).ok());
    ASSERT_EQ(io->outputs.size(), 1u);
    const Tensor& y = io->outputs[0];
    EXPECT_EQ(y.dtype(), DType::f32);
    EXPECT_EQ(y.shape(), (Shape{batch, 10}));
    EXPECT_TRUE(y.is_host_accessible());
    EXPECT_LE(max_abs_diff(y, reference_forward(kDigits, x)), 1e-5f);
    // Per-request slices (what the engine hands back) are views of the same result.
    auto first = y.slice(0, 1);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(first->data(), y.data());
  }
}

TEST(TorchDigits, SimStreamFillsOutputsAllocatedAtEnqueue) {
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = make_worker(*model, "sim");
  ASSERT_TRUE(w.ok()) << w.status();
  Tensor x = random_tensor({7, 1, 32, 32}, 11);
  auto io = batch_of({x});
  ASSERT_TRUE(w->instance->enqueue(*w->stream, io).ok());
  // Defined before the stream runs, so the engine can enqueue the copies back.
  ASSERT_EQ(io->outputs.size(), 1u);
  EXPECT_EQ(io->outputs[0].shape(), (Shape{7, 10}));
  EXPECT_EQ(io->outputs[0].placement().kind, MemoryKind::device);
  auto host = Tensor::empty(DType::f32, {7, 10});
  ASSERT_TRUE(host.ok());
  ASSERT_TRUE(w->stream->copy(*host, io->outputs[0]).ok());
  ASSERT_TRUE(w->stream->synchronize().ok());
  EXPECT_LE(max_abs_diff(*host, reference_forward(kDigits, x)), 1e-5f);
}

TEST(TorchDigits, ConcurrentInstancesAgreeWithTheReference) {
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor x = random_tensor({5, 1, 32, 32}, 5);
  const at::Tensor ref = reference_forward(kDigits, x);
  std::vector<Worker> workers;
  for (int i = 0; i < 2; ++i) {
    auto w = make_worker(*model, "cpu");
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(std::move(*w));
  }
  std::vector<std::shared_ptr<BatchIO>> ios;
  for (int round = 0; round < 20; ++round) {
    for (Worker& w : workers) {
      ios.push_back(batch_of({x}));
      ASSERT_TRUE(w.instance->enqueue(*w.stream, ios.back()).ok());
    }
  }
  for (Worker& w : workers) ASSERT_TRUE(w.stream->synchronize().ok());
  for (const auto& io : ios) {
    ASSERT_EQ(io->outputs.size(), 1u);
    EXPECT_LE(max_abs_diff(io->outputs[0], ref), 1e-5f);
  }
}

TEST(TorchDigits, OutputsOutliveTheInstanceAndTheModel) {
  require_digits();
  Tensor x = random_tensor({3, 1, 32, 32}, 3);
  std::shared_ptr<BatchIO> io = batch_of({x});
  {
    auto model = load_model(kDigits);
    ASSERT_TRUE(model.ok()) << model.status();
    auto w = make_worker(*model, "cpu");
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(run(*w, io).ok());
  }
  ASSERT_EQ(io->outputs.size(), 1u);
  EXPECT_LE(max_abs_diff(io->outputs[0], reference_forward(kDigits, x)), 1e-5f);
}

TEST(TorchDigits, WrongInputsFailAtEnqueueWithClearErrors) {
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();

  auto wrong_dtype = batch_of({*Tensor::zeros(DType::f64, {2, 1, 32, 32})});
  Status st = w->instance->enqueue(*w->stream, wrong_dtype);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;
  EXPECT_TRUE(contains(st.message(), "'input'")) << st;
  EXPECT_TRUE(contains(st.message(), "f64")) << st;

  auto wrong_shape = batch_of({*Tensor::zeros(DType::f32, {2, 1, 28, 28})});
  st = w->instance->enqueue(*w->stream, wrong_shape);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;
  EXPECT_TRUE(contains(st.message(), "28")) << st;
  EXPECT_TRUE(contains(st.message(), "32")) << st;

  auto wrong_rank = batch_of({*Tensor::zeros(DType::f32, {2, 32, 32})});
  st = w->instance->enqueue(*w->stream, wrong_rank);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;

  auto too_many = batch_of({*Tensor::zeros(DType::f32, {65, 1, 32, 32})});
  st = w->instance->enqueue(*w->stream, too_many);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;
  EXPECT_TRUE(contains(st.message(), "64")) << st;

  auto two_inputs = batch_of(
      {*Tensor::zeros(DType::f32, {1, 1, 32, 32}), *Tensor::zeros(DType::f32, {1, 1, 32, 32})});
  st = w->instance->enqueue(*w->stream, two_inputs);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;

  auto bad_batch = batch_of({*Tensor::zeros(DType::f32, {4, 1, 32, 32})});
  bad_batch->batch_size = 3;
  st = w->instance->enqueue(*w->stream, bad_batch);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;

  // Nothing was enqueued, and the instance still works.
  EXPECT_TRUE(w->stream->synchronize().ok());
  auto good = batch_of({random_tensor({2, 1, 32, 32}, 2)});
  EXPECT_TRUE(run(*w, good).ok());
  EXPECT_EQ(good->outputs.size(), 1u);
}

// ---- loading errors -----------------------------------------------------------------------

TEST(TorchLoad, MissingFileIsNotFound) {
  const std::string file = (temp_dir() / "nope.pt").string();
  auto model = load_model(file);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::not_found) << model.status();
  EXPECT_TRUE(contains(model.status().message(), file)) << model.status();
}

TEST(TorchLoad, TextFileRenamedPtIsInvalidArgument) {
  const fs::path file = temp_dir() / "notes.pt";
  write_file(file, "this is not a TorchScript archive\n");
  auto model = load_model(file.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), file.string())) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "PytorchStreamReader")) << model.status();
}

TEST(TorchLoad, TruncatedFileIsInvalidArgument) {
  require_digits();
  const fs::path dir = temp_dir();
  const std::string bytes = read_file(kDigits);
  ASSERT_GT(bytes.size(), 1000u);
  write_file(dir / "half.pt", bytes.substr(0, bytes.size() / 2));
  fs::copy_file(kDigits + ".json", dir / "half.pt.json");
  auto model = load_model((dir / "half.pt").string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "half.pt")) << model.status();
}

TEST(TorchLoad, DirectoryIsInvalidArgument) {
  const fs::path dir = temp_dir() / "model.pt";
  fs::create_directories(dir);
  auto model = load_model(dir.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
}

TEST(TorchLoad, NoSignatureExplainsBothWays) {
  require_digits();
  const fs::path file = temp_dir() / "digits.pt";
  fs::copy_file(kDigits, file);
  auto model = load_model(file.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), file.string() + ".json")) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "command-line")) << model.status();
}

TEST(TorchLoad, SignatureFromCommandLineSpecs) {
  require_digits();
  const fs::path file = temp_dir() / "digits.pt";
  fs::copy_file(kDigits, file);
  ModelOptions o;
  o.inputs.push_back(*parse_tensor_spec("input:f32:1x32x32", true));
  o.outputs.push_back(*parse_tensor_spec("logits:f32:10", true));
  o.batch_limit = 16;
  auto model = load_model(file.string(), o);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelSignature& sig = (*model)->signature();
  EXPECT_TRUE(sig.batched);
  EXPECT_EQ(sig.batch_limit, 16);
  EXPECT_EQ(sig.inputs[0].shape, (Shape{-1, 1, 32, 32}));
  EXPECT_EQ(sig.outputs[0].shape, (Shape{-1, 10}));
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();
  Tensor x = random_tensor({4, 1, 32, 32}, 4);
  auto io = batch_of({x});
  ASSERT_TRUE(run(*w, io).ok());
  EXPECT_LE(max_abs_diff(io->outputs[0], reference_forward(kDigits, x)), 1e-5f);

  // Specs win over an implicit sidecar; batch_limit also overrides a sidecar's.
  ModelOptions limit;
  limit.batch_limit = 8;
  auto limited = load_model(kDigits, limit);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ((*limited)->signature().batch_limit, 8);
}

TEST(TorchLoad, CommandLineSpecsContradictingTheModelAreRejected) {
  require_digits();
  ModelOptions o;
  o.inputs.push_back(*parse_tensor_spec("input:f32:1x32x32", true));
  o.outputs.push_back(*parse_tensor_spec("logits:f32:12", true));
  auto model = load_model(kDigits, o);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "'logits'")) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "[1,10]")) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "command-line")) << model.status();

  ModelOptions only_inputs;
  only_inputs.inputs = o.inputs;
  EXPECT_EQ(load_model(kDigits, only_inputs).status().code(), StatusCode::invalid_argument);

  ModelOptions both = o;
  both.backend_parameters = {{"signature_path", kDigits + ".json"}};
  auto ambiguous = load_model(kDigits, both);
  EXPECT_EQ(ambiguous.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(ambiguous.status().message(), "give one")) << ambiguous.status();
}

/// Writes a sidecar for digits.pt with `outputs` (and the real input) to `dir`/sig.json.
std::string sidecar_with(const fs::path& dir, const nlohmann::json& inputs,
                         const nlohmann::json& outputs) {
  nlohmann::json j = {{"inputs", inputs}, {"outputs", outputs}, {"max_batch_size", 64}};
  const fs::path file = dir / "sig.json";
  write_file(file, j.dump(2));
  return file.string();
}

// The sidecar's max_batch_size has Triton's meaning, as a config.pbtxt's and a builtin URI's:
// N = batched with a batch limit of N, 0 = no batch dim (it meant "no limit" before issue 46).
TEST(TorchLoad, SidecarMaxBatchSizeHasTritonsMeaning) {
  require_digits();
  const fs::path dir = temp_dir();
  const nlohmann::json input = {{{"name", "input"}, {"dtype", "f32"}, {"shape", {-1, 1, 32, 32}}}};
  const nlohmann::json output = {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}}};
  auto load_with = [&](nlohmann::json j) {
    j["inputs"] = input;
    j["outputs"] = output;
    write_file(dir / "sig.json", j.dump(2));
    ModelOptions o;
    o.backend_parameters = {{"signature_path", (dir / "sig.json").string()}};
    return load_model(kDigits, o);
  };
  auto limited = load_with({{"max_batch_size", 16}});
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_TRUE((*limited)->signature().batched);
  EXPECT_EQ((*limited)->signature().batch_limit, std::optional<std::int64_t>(16));
  auto unbatched = load_with({{"max_batch_size", 0}});
  ASSERT_TRUE(unbatched.ok()) << unbatched.status();
  EXPECT_FALSE((*unbatched)->signature().batched);
  auto unlimited = load_with(nlohmann::json::object());
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  EXPECT_TRUE((*unlimited)->signature().batched);
  EXPECT_FALSE((*unlimited)->signature().batch_limit.has_value());
  auto contradicting = load_with({{"max_batch_size", 0}, {"batched", true}});
  EXPECT_EQ(contradicting.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(contradicting.status().message(), "no batch dim")) << contradicting.status();
  fs::remove_all(dir);
}

TEST(TorchLoad, SidecarContradictingTheModelIsRejected) {
  require_digits();
  const fs::path dir = temp_dir();
  const nlohmann::json input = {{{"name", "input"}, {"dtype", "f32"}, {"shape", {-1, 1, 32, 32}}}};
  struct Case {
    const char* what;
    nlohmann::json inputs;
    nlohmann::json outputs;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"wrong output dim",
       input,
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 12}}}},
       {"'logits'", "[1,10]", "[-1,12]"}},
      {"wrong output dtype",
       input,
       {{{"name", "logits"}, {"dtype", "f64"}, {"shape", {-1, 10}}}},
       {"'logits'", "f64"}},
      {"wrong output rank",
       input,
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10, 1}}}},
       {"'logits'"}},
      {"too many outputs",
       input,
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}},
        {{"name", "extra"}, {"dtype", "f32"}, {"shape", {-1, 10}}}},
       {"1 output", "2", "extra"}},
      {"input the model cannot take",
       {{{"name", "input"}, {"dtype", "f32"}, {"shape", {-1, 1, 28, 28}}}},
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}}},
       {"failed", "28"}},
      {"two inputs for a one-argument forward",
       {{{"name", "a"}, {"dtype", "f32"}, {"shape", {-1, 1, 32, 32}}},
        {{"name", "b"}, {"dtype", "f32"}, {"shape", {-1, 1, 32, 32}}}},
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}}},
       {"forward takes 1"}},
      {"batch dim not -1",
       {{{"name", "input"}, {"dtype", "f32"}, {"shape", {1, 1, 32, 32}}}},
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}}},
       {"batch dim"}},
      {"unknown dtype",
       {{{"name", "input"}, {"dtype", "f33"}, {"shape", {-1, 1, 32, 32}}}},
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}}},
       {"f33"}},
      {"a dtype libtorch lacks",
       {{{"name", "input"}, {"dtype", "UINT32"}, {"shape", {-1, 1, 32, 32}}}},
       {{{"name", "logits"}, {"dtype", "f32"}, {"shape", {-1, 10}}}},
       {"libtorch has no u32"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ModelOptions o;
    o.backend_parameters = {{"signature_path", sidecar_with(dir, c.inputs, c.outputs)}};
    auto model = load_model(kDigits, o);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
    EXPECT_TRUE(contains(model.status().message(), kDigits)) << model.status();
    for (const std::string& part : c.expect) {
      EXPECT_TRUE(contains(model.status().message(), part))
          << part << " not in: " << model.status();
    }
  }
}

TEST(TorchLoad, MalformedSidecarIsRejected) {
  require_digits();
  const fs::path dir = temp_dir();
  write_file(dir / "bad.json", "{\"inputs\": [ {\"name\": \"input\", ");
  ModelOptions o;
  o.backend_parameters = {{"signature_path", (dir / "bad.json").string()}};
  auto model = load_model(kDigits, o);
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "bad.json")) << model.status();

  o.backend_parameters = {{"signature_path", (dir / "absent.json").string()}};
  model = load_model(kDigits, o);
  EXPECT_EQ(model.status().code(), StatusCode::not_found) << model.status();
}

// The torch backend's own settings are backend parameters (signature_path, warmup_runs); it
// refuses a key it does not know, naming it, and a warmup_runs that is not an integer >= 0.
TEST(TorchLoad, BackendParametersAreTheBackendsOwn) {
  require_digits();
  ModelOptions o;
  o.backend_parameters = {{"INFERENCE_MODE", "true"}};
  auto model = load_model(kDigits, o);
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "'INFERENCE_MODE'")) << model.status();
  for (const char* bad : {"-1", "two", "2x", ""}) {
    o.backend_parameters = {{"warmup_runs", bad}};
    model = load_model(kDigits, o);
    EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << bad;
    EXPECT_TRUE(contains(model.status().message(), "warmup_runs")) << model.status();
  }
  o.backend_parameters = {{"warmup_runs", "0"}, {"signature_path", kDigits + ".json"}};
  model = load_model(kDigits, o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->signature().inputs.size(), 1u);
}

// ---- small scripted modules ---------------------------------------------------------------

ModelOptions specs(std::vector<std::string> inputs, std::vector<std::string> outputs) {
  ModelOptions o;
  for (const auto& s : inputs) o.inputs.push_back(*parse_tensor_spec(s, true));
  for (const auto& s : outputs) o.outputs.push_back(*parse_tensor_spec(s, true));
  o.backend_parameters = {{"warmup_runs", "1"}};
  return o;
}

TEST(TorchModules, OutputAliasingTheInputIsCopied) {
  const fs::path file = temp_dir() / "identity.pt";
  save_module(file, "def forward(self, x):\n    return x\n");
  auto model = load_model(file.string(), specs({"x:f32:3"}, {"y:f32:3"}));
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();
  Tensor x = random_tensor({2, 3}, 1);
  auto io = batch_of({x});
  ASSERT_TRUE(run(*w, io).ok());
  ASSERT_EQ(io->outputs.size(), 1u);
  EXPECT_NE(io->outputs[0].data(), x.data());
  EXPECT_EQ(std::memcmp(io->outputs[0].data(), x.data(), x.byte_size()), 0);
}

TEST(TorchModules, TupleAndDictResultsMapToSignatureOutputs) {
  const fs::path dir = temp_dir();
  save_module(dir / "tuple.pt", "def forward(self, x):\n    return x * 2.0, x.sum(dim=1)\n");
  save_module(dir / "dict.pt",
              "def forward(self, x):\n    return {'b': x.sum(dim=1), 'a': x * 2.0}\n");
  for (const char* name : {"tuple.pt", "dict.pt"}) {
    SCOPED_TRACE(name);
    auto model = load_model((dir / name).string(), specs({"x:f32:3"}, {"a:f32:3", "b:f32:"}));
    ASSERT_TRUE(model.ok()) << model.status();
    auto w = make_worker(*model, "cpu");
    ASSERT_TRUE(w.ok()) << w.status();
    auto io = batch_of({*Tensor::from_values<float>({2, 3}, {1, 2, 3, 4, 5, 6})});
    ASSERT_TRUE(run(*w, io).ok());
    ASSERT_EQ(io->outputs.size(), 2u);
    EXPECT_EQ(io->outputs[0].shape(), (Shape{2, 3}));
    EXPECT_EQ(io->outputs[0].data_as<float>()[5], 12.0f);
    EXPECT_EQ(io->outputs[1].shape(), (Shape{2}));
    EXPECT_EQ(io->outputs[1].data_as<float>()[1], 15.0f);
  }
  // A dict without a signature output's name is rejected at load.
  auto wrong = load_model((dir / "dict.pt").string(), specs({"x:f32:3"}, {"a:f32:3", "c:f32:"}));
  EXPECT_EQ(wrong.status().code(), StatusCode::invalid_argument) << wrong.status();
  EXPECT_TRUE(contains(wrong.status().message(), "'c'")) << wrong.status();
}

TEST(TorchModules, NonTensorResultIsRejectedAtLoad) {
  const fs::path file = temp_dir() / "int.pt";
  save_module(file, "def forward(self, x):\n    return 3\n");
  auto model = load_model(file.string(), specs({"x:f32:3"}, {"y:f32:3"}));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument) << model.status();
  EXPECT_TRUE(contains(model.status().message(), "Int")) << model.status();
}

TEST(TorchModules, ForwardFailingAtRunTimeReachesTheStream) {
  const fs::path file = temp_dir() / "picky.pt";
  save_module(file,
              "def forward(self, x):\n"
              "    return x.view(-1, 3)[0:2].view(x.size(0), 3) + 1.0\n");  // fails for batch > 2
  auto model = load_model(file.string(), specs({"x:f32:3"}, {"y:f32:3"}));
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();
  auto big = batch_of({*Tensor::zeros(DType::f32, {3, 3})});
  ASSERT_TRUE(w->instance->enqueue(*w->stream, big).ok());
  std::promise<Status> delivered;
  ASSERT_TRUE(w->stream->launch_host_func([&](Status s) { delivered.set_value(s); }).ok());
  Status st = delivered.get_future().get();
  EXPECT_EQ(st.code(), StatusCode::internal) << st;
  EXPECT_TRUE(contains(st.message(), "is invalid for input of size 6")) << st;
  EXPECT_TRUE(contains(st.message(), file.string())) << st;
  // The stream and the instance carry on.
  auto small = batch_of({*Tensor::zeros(DType::f32, {2, 3})});
  EXPECT_TRUE(run(*w, small).ok());
  ASSERT_EQ(small->outputs.size(), 1u);
  EXPECT_EQ(small->outputs[0].data_as<float>()[0], 1.0f);
}

TEST(TorchModules, DynamicOutputDimsRunOnCpuButNotOnSim) {
  const fs::path file = temp_dir() / "repeat.pt";
  save_module(file, "def forward(self, x):\n    return x.repeat(1, 2)\n");
  auto model = load_model(file.string(), specs({"x:f32:-1"}, {"y:f32:-1"}));
  ASSERT_TRUE(model.ok()) << model.status();
  auto cpu = make_worker(*model, "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto io = batch_of({*Tensor::zeros(DType::f32, {2, 5})});
  ASSERT_TRUE(run(*cpu, io).ok());
  EXPECT_EQ(io->outputs[0].shape(), (Shape{2, 10}));
  auto sim = make_worker(*model, "sim");
  ASSERT_FALSE(sim.ok());
  EXPECT_EQ(sim.status().code(), StatusCode::unavailable) << sim.status();
  EXPECT_TRUE(contains(sim.status().message(), "'y'")) << sim.status();
}

TEST(TorchModules, UnbatchedSignatureFromSpecs) {
  const fs::path file = temp_dir() / "sum.pt";
  save_module(file, "def forward(self, x):\n    return x.sum(dim=0)\n");
  ModelOptions o;
  o.inputs.push_back(*parse_tensor_spec("x:f32:4x3", false));
  o.outputs.push_back(*parse_tensor_spec("y:f32:3", false));
  auto model = load_model(file.string(), o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE((*model)->signature().batched);
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();
  auto io = batch_of({*Tensor::zeros(DType::f32, {4, 3})});
  io->batch_size = 1;
  ASSERT_TRUE(run(*w, io).ok());
  EXPECT_EQ(io->outputs[0].shape(), (Shape{3}));
}

TEST(TorchModules, CudaIsUnavailableWithoutCudaLibtorch) {
  auto device = open_device("cuda");
  if (!device.ok()) GTEST_SKIP() << "no cuda device: " << device.status();
  const fs::path file = temp_dir() / "id.pt";
  save_module(file, "def forward(self, x):\n    return x + 0.0\n");
  auto model = load_model(file.string(), specs({"x:f32:3"}, {"y:f32:3"}));
  ASSERT_TRUE(model.ok()) << model.status();
  auto stream = (*device)->create_stream();
  ASSERT_TRUE(stream.ok());
  auto instance = (*model)->create_instance(**device, **stream, {});
  if (instance.ok()) GTEST_SKIP() << "this build's libtorch has CUDA";
  EXPECT_EQ(instance.status().code(), StatusCode::unavailable) << instance.status();
}

TEST(TorchCuda, DigitsOnTheWorkersStreamMatchLibtorchOnCpu) {
  auto device = open_device("cuda");
  if (!device.ok()) GTEST_SKIP() << "no cuda device: " << device.status();
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto stream = (*device)->create_stream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto instance = (*model)->create_instance(**device, **stream, {});
  if (!instance.ok()) {
    EXPECT_EQ(instance.status().code(), StatusCode::unavailable) << instance.status();
    GTEST_SKIP() << instance.status();
  }
  // cuDNN may use TF32 for convolutions by default; compare against full f32.
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  for (std::int64_t batch : {1, 7, 32}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Tensor x = random_tensor({batch, 1, 32, 32}, static_cast<unsigned>(batch));
    auto dx = (*device)->empty(DType::f32, x.shape(), MemoryKind::device);
    ASSERT_TRUE(dx.ok()) << dx.status();
    ASSERT_TRUE((*stream)->copy(*dx, x).ok());
    auto io = std::make_shared<BatchIO>();
    io->inputs = {*dx};
    io->host_inputs = {x};
    io->batch_size = batch;
    ASSERT_TRUE((*instance)->enqueue(**stream, io).ok());
    ASSERT_EQ(io->outputs.size(), 1u);  // device tensors, defined at enqueue
    EXPECT_EQ(io->outputs[0].placement().kind, MemoryKind::device);
    EXPECT_EQ(io->outputs[0].shape(), (Shape{batch, 10}));
    Tensor host = *Tensor::empty(DType::f32, {batch, 10});
    ASSERT_TRUE((*stream)->copy(host, io->outputs[0]).ok());
    ASSERT_TRUE((*stream)->synchronize().ok());
    const float diff = max_abs_diff(host, reference_forward(kDigits, x));
    EXPECT_LE(diff, 1e-4f);
    std::printf("cuda batch %lld: max abs diff to libtorch on cpu %g\n",
                static_cast<long long>(batch), static_cast<double>(diff));
  }
}

// ---- intra-op threads ---------------------------------------------------------------------

/// at::get_num_threads() and the distinct threads of one at::parallel_for, on `stream`'s thread.
std::pair<int, int> threads_on(Stream& stream) {
  auto seen = std::make_shared<std::pair<int, int>>(0, 0);
  Kernel k;
  k.host_fn = [seen](std::stop_token) -> Status {
    seen->first = at::get_num_threads();
    std::mutex mu;
    std::set<int> ids;
    at::parallel_for(0, 64, 1, [&](std::int64_t, std::int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard lock(mu);
      ids.insert(at::get_thread_num());
    });
    seen->second = static_cast<int>(ids.size());
    return Status();
  };
  EXPECT_TRUE(stream.enqueue(std::move(k)).ok());
  EXPECT_TRUE(stream.synchronize().ok());
  return *seen;
}

TEST(TorchThreads, IntraOpThreadsArePerInstance) {
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  const int caller_before = at::get_num_threads();
  auto one = make_worker(*model, "cpu", 1);
  auto two = make_worker(*model, "cpu", 2);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(two.ok()) << two.status();
  // After the warm-up forwards each stream thread keeps its own setting.
  EXPECT_EQ(threads_on(*one->stream), std::make_pair(1, 1));
  EXPECT_EQ(threads_on(*two->stream), std::make_pair(2, 2));
  // Still so after more forwards on both, and the calling thread is untouched.
  for (Worker* w : {&*one, &*two}) {
    auto io = batch_of({random_tensor({8, 1, 32, 32}, 8)});
    ASSERT_TRUE(run(*w, io).ok());
  }
  EXPECT_EQ(threads_on(*one->stream).first, 1);
  EXPECT_EQ(threads_on(*two->stream).first, 2);
  EXPECT_EQ(at::get_num_threads(), caller_before);
}

TEST(TorchThreads, CreatingAnEngineLeavesTheCallersIntraOpThreadsAlone) {
  // On cpu without a watchdog the engine's streams have no thread (the inline path): the
  // instance's warm-up forwards run on this thread, which must keep its own setting (a program's
  // own OpenMP code after Engine::create).
  require_digits();
  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto device = open_device("cpu");
  ASSERT_TRUE(device.ok()) << device.status();
  at::set_num_threads(3);  // this test runs in its own process: a value no default gives
  const int caller_before = at::get_num_threads();
  EngineOptions o;
  o.workers = 1;
  o.intra_op_threads = 1;
  auto engine = Engine::create(*model, *device, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto out = (*engine)->infer({random_tensor({2, 1, 32, 32}, 2)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(at::get_num_threads(), caller_before);
  (*engine)->shutdown();
}

// ---- the documented C++ preprocessing -----------------------------------------------------

#if defined(ASYNCINFER_TEST_HAVE_STB)
TEST(TorchDigits, StbPipelineReachesTheAccuracyPythonMeasured) {
  require_digits();
  const nlohmann::json sidecar = nlohmann::json::parse(read_file(kDigits + ".json"));
  const auto& pre = sidecar.at("preprocessing");
  const int size = pre.at("input_size").get<int>();
  const float mean = pre.at("mean").get<float>();
  const float stddev = pre.at("std").get<float>();
  const fs::path test_dir =
      fs::path(kModelsDir) / sidecar.at("test_set").at("dir").get<std::string>();
  std::ifstream labels_csv(test_dir / sidecar.at("test_set").at("labels").get<std::string>());
  std::string line;
  std::getline(labels_csv, line);
  ASSERT_EQ(line, "file,label");
  std::vector<std::pair<std::string, int>> items;
  while (std::getline(labels_csv, line)) {
    const auto comma = line.find(',');
    items.emplace_back(line.substr(0, comma), std::stoi(line.substr(comma + 1)));
  }
  ASSERT_EQ(static_cast<int>(items.size()), sidecar.at("test_set").at("count").get<int>());

  auto model = load_model(kDigits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = make_worker(*model, "cpu");
  ASSERT_TRUE(w.ok()) << w.status();
  const std::int64_t max_batch = (*model)->signature().batch_limit.value();
  int correct = 0;
  for (std::size_t begin = 0; begin < items.size(); begin += static_cast<std::size_t>(max_batch)) {
    const std::size_t n = std::min(items.size() - begin, static_cast<std::size_t>(max_batch));
    Tensor x = *Tensor::empty(DType::f32, {static_cast<std::int64_t>(n), 1, size, size});
    for (std::size_t i = 0; i < n; ++i) {
      const std::string png = (test_dir / items[begin + i].first).string();
      int width = 0, height = 0, channels = 0;
      unsigned char* pixels = stbi_load(png.c_str(), &width, &height, &channels, 1);
      ASSERT_NE(pixels, nullptr) << png << ": " << stbi_failure_reason();
      EXPECT_EQ(width, 128);
      std::vector<unsigned char> small(static_cast<std::size_t>(size * size));
      const int ok = stbir_resize_uint8_generic(
          pixels, width, height, 0, small.data(), size, size, 0, 1, -1, 0, STBIR_EDGE_CLAMP,
          STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, nullptr);
      stbi_image_free(pixels);
      ASSERT_EQ(ok, 1);
      float* dst = x.data_as<float>() + i * small.size();
      for (std::size_t p = 0; p < small.size(); ++p) {
        dst[p] = (static_cast<float>(small[p]) / 255.0f - mean) / stddev;
      }
    }
    auto io = batch_of({x});
    ASSERT_TRUE(run(*w, io).ok());
    const float* logits = io->outputs[0].data_as<float>();
    for (std::size_t i = 0; i < n; ++i) {
      const float* row = logits + i * 10;
      const int predicted = static_cast<int>(std::max_element(row, row + 10) - row);
      if (predicted == items[begin + i].second) ++correct;
    }
  }
  EXPECT_EQ(correct, sidecar.at("test_set").at("correct").get<int>());
  EXPECT_GE(static_cast<double>(correct) / static_cast<double>(items.size()), 0.95);
}
#endif

}  // namespace
}  // namespace asyncinfer
