// The OpenVINO backend: ONNX and OpenVINO IR load with the signature the model declares, results
// are right through the engine (batched across requests, on cpu and sim), a config's dims narrow
// or contradict the model, backend parameters reach OpenVINO, and every bad file is a Status
// naming the file and the reason.
//
// The models come from the CTest fixture OpenVinoTestModels (tests/models/make_onnx_models.py
// --out ASYNCINFER_TEST_ONNX_DIR), the digits model from TorchDigitsModel
// (ASYNCINFER_TEST_MODELS_DIR/digits.onnx).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"

#ifndef ASYNCINFER_TEST_ONNX_DIR
#error "ASYNCINFER_TEST_ONNX_DIR must name the directory make_onnx_models.py writes"
#endif

namespace asyncinfer {
namespace {

namespace fs = std::filesystem;

const std::string kDir = ASYNCINFER_TEST_ONNX_DIR;
std::string model_file(const std::string& name) { return kDir + "/" + name; }

Tensor values(Shape shape, float start, float step) {
  Tensor t = *Tensor::empty(DType::f32, shape);
  float* p = t.data_as<float>();
  for (std::size_t i = 0; i < t.numel(); ++i) p[i] = start + step * static_cast<float>(i);
  return t;
}

std::vector<float> floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

TEST(OpenVino, KindsAreRegistered) {
  const auto kinds = model_backends();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "openvino"), kinds.end());
}

TEST(OpenVino, OnnxSignatureFromTheModel) {
  auto model = load_model(model_file("add.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelSignature& sig = (*model)->signature();
  ASSERT_EQ(sig.inputs.size(), 2u);
  ASSERT_EQ(sig.outputs.size(), 2u);
  EXPECT_EQ(sig.inputs[0].name, "x");
  EXPECT_EQ(sig.inputs[1].name, "y");
  EXPECT_EQ(sig.outputs[0].name, "sum");
  EXPECT_EQ(sig.outputs[1].name, "prod");
  EXPECT_EQ(sig.inputs[0].dtype, DType::f32);
  EXPECT_EQ(sig.inputs[0].shape, (Shape{-1, 4}));
  EXPECT_TRUE(sig.batched);
  EXPECT_FALSE(sig.batch_limit);
  EXPECT_TRUE((*model)->cancellable());
}

TEST(OpenVino, OnnxAndIrGiveTheRightAnswersThroughTheEngine) {
  for (const std::string& uri :
       {model_file("add.onnx"), model_file("add.xml"), "openvino:" + model_file("add.onnx")}) {
    SCOPED_TRACE(uri);
    auto model = load_model(uri);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto device = open_device("cpu");
    ASSERT_TRUE(device.ok());
    EngineOptions options;
    options.batching.max_batch_size = 8;
    options.batching.max_queue_delay = std::chrono::microseconds(2000);
    auto engine = Engine::create(*model, *device, options);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    // Several requests at once, so that the batcher joins some: each gets its own rows back.
    std::vector<Future<Outputs>> futures;
    for (int r = 0; r < 12; ++r) {
      const std::int64_t rows = 1 + r % 3;
      futures.push_back((*engine)->submit(
          {values({rows, 4}, static_cast<float>(r), 1.0f), values({rows, 4}, 2.0f, 0.5f)}));
    }
    for (int r = 0; r < 12; ++r) {
      auto out = futures[r].get();
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      const std::int64_t rows = 1 + r % 3;
      ASSERT_EQ(out->size(), 2u);
      EXPECT_EQ((*out)[0].shape(), (Shape{rows, 4}));
      const std::vector<float> sum = floats((*out)[0]);
      const std::vector<float> prod = floats((*out)[1]);
      for (std::size_t i = 0; i < sum.size(); ++i) {
        const float x = static_cast<float>(r) + static_cast<float>(i);
        const float y = 2.0f + 0.5f * static_cast<float>(i);
        EXPECT_FLOAT_EQ(sum[i], x + y) << "request " << r << " element " << i;
        EXPECT_FLOAT_EQ(prod[i], x * y) << "request " << r << " element " << i;
      }
    }
  }
}

TEST(OpenVino, RunsOnTheSimDevice) {
  auto model = load_model(model_file("add.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto device = open_device("sim");
  ASSERT_TRUE(device.ok());
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->infer({values({2, 4}, 1.0f, 1.0f), values({2, 4}, 1.0f, 0.0f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(floats((*out)[0]), (std::vector<float>{2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(OpenVino, WorkersFollowOpenVinosOptimalRequests) {
  ModelOptions mo;
  mo.backend_parameters = {{"NUM_STREAMS", "1"}};
  auto model = load_model(model_file("add.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto device = open_device("cpu");
  ASSERT_TRUE(device.ok());
  EXPECT_EQ((*model)->preferred_instances(**device), 1);
  EXPECT_EQ(Engine::resolve_options(**model, **device, {}).workers, 1);
  EngineOptions two;
  two.workers = 2;  // an explicit count wins
  EXPECT_EQ(Engine::resolve_options(**model, **device, two).workers, 2);
}

TEST(OpenVino, UnknownBackendParameterIsRefusedByName) {
  ModelOptions mo;
  mo.backend_parameters = {{"NO_SUCH_PROPERTY", "1"}};
  auto model = load_model(model_file("add.onnx"), mo);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(model.status().message().find("NO_SUCH_PROPERTY"), std::string::npos)
      << model.status().to_string();
  EXPECT_NE(model.status().message().find("add.onnx"), std::string::npos);
}

TEST(OpenVino, OtherBackendsRefuseBackendParameters) {
  ModelOptions mo;
  mo.backend_parameters = {{"NUM_STREAMS", "2"}};
  auto model = load_model("builtin:identity", mo);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("NUM_STREAMS"), std::string::npos);
}

TEST(OpenVino, StaticModelWithoutABatchDim) {
  auto model = load_model(model_file("static2.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_FALSE((*model)->signature().batched);
  EXPECT_EQ((*model)->signature().inputs[0].shape, (Shape{2, 3}));
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->infer({values({2, 3}, -2.0f, 1.0f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(floats((*out)[0]), (std::vector<float>{0, 0, 0, 1, 2, 3}));
  auto wrong = (*engine)->infer({values({3, 3}, 0.0f, 1.0f)});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::invalid_argument);
}

TEST(OpenVino, StaticBatchOfOneIsReshapedWhenBatchingIsAskedFor) {
  ModelOptions mo;
  mo.batched = true;
  mo.batch_limit = 8;
  auto model = load_model(model_file("static1.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_TRUE((*model)->signature().batched);
  EXPECT_EQ((*model)->signature().batch_limit, 8);
  EXPECT_EQ((*model)->signature().inputs[0].shape, (Shape{-1, 4}));
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->infer({values({3, 4}, 0.0f, 1.0f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{3, 4}));
  EXPECT_FLOAT_EQ(floats((*out)[0])[11], 22.0f);
}

TEST(OpenVino, DynamicModelWithoutBatchingWhenToldSo) {
  ModelOptions mo;
  mo.batched = false;
  auto model = load_model(model_file("add.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_FALSE((*model)->signature().batched);
  EXPECT_EQ((*model)->signature().inputs[0].shape, (Shape{-1, 4}));
}

TEST(OpenVino, GivenDimsFixWhatTheModelLeavesDynamic) {
  ModelOptions mo;
  mo.batched = true;
  mo.inputs = {{"x", DType::f32, {-1, 3, 8, 8}}};
  mo.outputs = {{"y", DType::f32, {-1, 3, 1, 1}}};
  auto model = load_model(model_file("pool.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->signature().inputs[0].shape, (Shape{-1, 3, 8, 8}));
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Tensor x = *Tensor::empty(DType::f32, {1, 3, 8, 8});
  float* p = x.data_as<float>();
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 64; ++i) p[c * 64 + i] = static_cast<float>(c + 1);
  }
  auto out = (*engine)->infer({x});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(floats((*out)[0]), (std::vector<float>{1, 2, 3}));
}

TEST(OpenVino, DimsThatDisagreeWithTheModelAreRefused) {
  ModelOptions mo;
  mo.batched = true;
  mo.inputs = {{"x", DType::f32, {-1, 5}}, {"y", DType::f32, {-1, 4}}};
  auto model = load_model(model_file("add.onnx"), mo);
  ASSERT_FALSE(model.ok());
  const std::string m(model.status().message());
  EXPECT_EQ(model.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(m.find("input 'x'"), std::string::npos) << m;
  EXPECT_NE(m.find("dim 1 is 4 in the model, 5 given"), std::string::npos) << m;
  EXPECT_NE(m.find("add.onnx"), std::string::npos) << m;

  mo.inputs = {{"x", DType::i32, {-1, 4}}, {"y", DType::f32, {-1, 4}}};
  model = load_model(model_file("add.onnx"), mo);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("given as i32, the model's is f32"), std::string::npos)
      << model.status().to_string();

  mo.inputs = {{"z", DType::f32, {-1, 4}}, {"y", DType::f32, {-1, 4}}};
  model = load_model(model_file("add.onnx"), mo);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("no input 'z'"), std::string::npos)
      << model.status().to_string();
}

TEST(OpenVino, ConfigOrderOfInputsIsHonoured) {
  ModelOptions mo;
  mo.batched = true;
  mo.inputs = {{"y", DType::f32, {-1, 4}}, {"x", DType::f32, {-1, 4}}};
  mo.outputs = {{"prod", DType::f32, {-1, 4}}, {"sum", DType::f32, {-1, 4}}};
  auto model = load_model(model_file("add.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->signature().inputs[0].name, "y");
  EXPECT_EQ((*model)->signature().outputs[0].name, "prod");
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // y = 1..4 (first), x = 10 everywhere (second): prod first, then sum.
  auto out = (*engine)->infer({values({1, 4}, 1.0f, 1.0f), values({1, 4}, 10.0f, 0.0f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(floats((*out)[0]), (std::vector<float>{10, 20, 30, 40}));
  EXPECT_EQ(floats((*out)[1]), (std::vector<float>{11, 12, 13, 14}));
}

TEST(OpenVino, OutputWithADynamicDimIsCopiedOut) {
  auto model = load_model(model_file("ranges.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->signature().outputs[0].shape, (Shape{-1, -1}));
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->infer({values({2, 6}, 0.0f, 1.0f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(floats((*out)[0]), (std::vector<float>{0, 1, 2, 6, 7, 8}));
  // On sim outputs exist before the work runs: such a model cannot be placed there.
  auto sim = open_device("sim");
  auto refused = Engine::create(*model, *sim, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("is not written in place"), std::string::npos)
      << refused.status().to_string();
}

TEST(OpenVino, OutputThatIsAnInputIsRightAndSoIsTheOther) {
  auto model = load_model(model_file("passthru.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (const char* spec : {"cpu", "sim"}) {
    SCOPED_TRACE(spec);
    auto device = open_device(spec);
    auto engine = Engine::create(*model, *device, {});
    if (std::string(spec) == "sim") {
      // On sim outputs must exist before the run; this one is the input itself.
      ASSERT_FALSE(engine.ok());
      EXPECT_NE(engine.status().message().find("is not written in place"), std::string::npos);
      continue;
    }
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    auto out = (*engine)->infer({values({2, 4}, -3.0f, 1.0f)});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(floats((*out)[0]), (std::vector<float>{-3, -2, -1, 0, 1, 2, 3, 4}));
    EXPECT_EQ(floats((*out)[1]), (std::vector<float>{0, 0, 0, 0, 1, 2, 3, 4}));
  }
}

TEST(OpenVino, OutputSmallerThanDeclaredIsAnErrorNotUnwrittenRows) {
  auto model = load_model(model_file("half.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto one = (*engine)->infer({values({1, 4}, 1.0f, 1.0f)});  // (1+1)/2 = 1 row: as declared
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  auto four = (*engine)->infer({values({4, 4}, 1.0f, 1.0f)});  // 2 rows of 4
  ASSERT_FALSE(four.ok());
  EXPECT_EQ(four.status().code(), StatusCode::internal);
  EXPECT_NE(four.status().message().find("output 'y' came out as [2,4], [4,4] was expected"),
            std::string::npos)
      << four.status().to_string();
}

TEST(OpenVino, OutputListedTwiceIsRefused) {
  auto model = load_model(model_file("dupout.onnx"));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("lists output 'y' twice"), std::string::npos)
      << model.status().to_string();
}

TEST(OpenVino, ASubsetOfTheOutputsMayBeGiven) {
  ModelOptions mo;
  mo.batched = true;
  mo.outputs = {{"prod", DType::f32, {-1, 4}}};
  auto model = load_model(model_file("add.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_EQ((*model)->signature().outputs.size(), 1u);
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->infer({values({1, 4}, 1.0f, 1.0f), values({1, 4}, 2.0f, 0.0f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ(floats((*out)[0]), (std::vector<float>{2, 4, 6, 8}));
}

TEST(OpenVino, GivenOutputDimsTheModelLeavesDynamicAreCheckedAfterTheRun) {
  ModelOptions mo;
  mo.batched = true;
  mo.outputs = {{"y", DType::f32, {-1, 5}}};
  auto model = load_model(model_file("ranges.onnx"), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto good = (*engine)->infer({values({2, 10}, 0.0f, 1.0f)});  // 10 / 2 = 5 columns
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ((*good)[0].shape(), (Shape{2, 5}));
  auto bad = (*engine)->infer({values({2, 6}, 0.0f, 1.0f)});  // 3 columns
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("output 'y' came out as [2,3], which does not fit"),
            std::string::npos)
      << bad.status().to_string();
}

struct BadFile {
  const char* file;
  StatusCode code;
  const char* says;
};

TEST(OpenVino, BadFilesAreClearErrors) {
  const BadFile cases[] = {
      {"missing.onnx", StatusCode::not_found, "no such file"},
      {"truncated.onnx", StatusCode::invalid_argument, "OpenVINO cannot read it"},
      {"corrupt.onnx", StatusCode::invalid_argument, "OpenVINO cannot read it"},
      {"unsupported_op.onnx", StatusCode::invalid_argument, "com.example.NoSuchOp"},
      {"nobin.xml", StatusCode::invalid_argument, "nobin.bin' does not exist"},
      {"string_input.onnx", StatusCode::invalid_argument, "which asyncinfer has no dtype for"},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.file);
    auto model = load_model(model_file(c.file));
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), c.code) << model.status().to_string();
    const std::string m(model.status().message());
    EXPECT_NE(m.find(c.file), std::string::npos) << m;
    EXPECT_NE(m.find(c.says), std::string::npos) << m;
    EXPECT_EQ(m.find("Exception from src/"), std::string::npos) << m;
  }
}

TEST(OpenVino, CudaIsRefusedWithTheReason) {
  auto model = load_model(model_file("add.onnx"));
  ASSERT_TRUE(model.ok());
  auto device = open_device("cuda:0");
  if (!device.ok()) GTEST_SKIP() << "no cuda device: " << device.status().to_string();
  auto engine = Engine::create(*model, *device, {});
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("whose memory the host can address (cpu, sim)"),
            std::string::npos);
}

TEST(OpenVino, CancelledRequestEndsCancelled) {
  auto model = load_model(model_file("add.onnx"));
  ASSERT_TRUE(model.ok());
  auto device = open_device("cpu");
  auto engine = Engine::create(*model, *device, {});
  ASSERT_TRUE(engine.ok());
  // Many requests, half cancelled at once: each ends exactly once, cancelled or right.
  std::vector<Future<Outputs>> futures;
  for (int r = 0; r < 200; ++r) {
    futures.push_back((*engine)->submit({values({4, 4}, 1.0f, 0.0f), values({4, 4}, 2.0f, 0.0f)}));
    if (r % 2 == 0) futures.back().cancel();
  }
  int ok = 0;
  for (auto& f : futures) {
    auto out = f.get();
    if (out.ok()) {
      ++ok;
      EXPECT_FLOAT_EQ(floats((*out)[0])[0], 3.0f);
    } else {
      EXPECT_EQ(out.status().code(), StatusCode::cancelled) << out.status().to_string();
    }
  }
  EXPECT_GE(ok, 100);
}

TEST(OpenVino, EnginesDestroyedWithRequestsInFlightEndThemAll) {
  auto model = load_model(model_file("add.onnx"));
  ASSERT_TRUE(model.ok());
  auto device = open_device("cpu");
  for (int round = 0; round < 20; ++round) {
    std::vector<Future<Outputs>> futures;
    {
      auto engine = Engine::create(*model, *device, {});
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      for (int r = 0; r < 8; ++r) {
        futures.push_back(
            (*engine)->submit({values({2, 4}, 1.0f, 0.0f), values({2, 4}, 2.0f, 0.0f)}));
      }
      if (round % 2 == 1) (*engine)->shutdown(ShutdownMode::cancel);
    }  // destroyed: drains, or has cancelled
    for (auto& f : futures) {
      auto out = f.wait_for(std::chrono::seconds(30));
      ASSERT_TRUE(out) << "round " << round << ": a request was left pending";
      auto r = f.get();
      if (r.ok()) {
        EXPECT_FLOAT_EQ(floats((*r)[0])[0], 3.0f);
      }
    }
  }
}

}  // namespace
}  // namespace asyncinfer
