// The python backend through the engine: model.py files (Triton's interface) written to a
// temporary model repository folder and loaded as "python:<path>", each instance its own process
// of /usr/bin/python3 (Debian's, with numpy). Covers the values, requests handed to execute one
// by one under dynamic batching, errors of load, execute and responses, a process that exits (the
// next batch restarts it), a hang ended by the request's deadline (the process is stopped after
// the grace period), and decoupled sends from a thread of the model. Every wait is bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <asyncinfer/asyncinfer.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

namespace asyncinfer {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class PythonModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    root_ = fs::temp_directory_path() /
            ("asyncinfer-test-python-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    std::error_code ec;
    if (!root_.empty()) fs::remove_all(root_, ec);
  }

  // <root>/<name>/1/model.py
  std::string write_model(const std::string& name, const std::string& source) {
    const fs::path dir = root_ / name / "1";
    fs::create_directories(dir);
    std::ofstream(dir / "model.py") << source;
    return "python:" + (dir / "model.py").string();
  }

  static ModelOptions fp32_options(bool decoupled = false) {
    ModelOptions mo;
    mo.inputs = {TensorSpec{"x", DType::f32, Shape{-1, 2}}};
    mo.outputs = {TensorSpec{"y", DType::f32, Shape{-1, 2}}};
    mo.batch_limit = 8;
    if (decoupled) {
      // Decoupled is the config's model_transaction_policy (what the server passes).
      mo.model_config_json = R"({"name": "repeat", "backend": "python", "max_batch_size": 8,)"
                             R"( "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],)"
                             R"( "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],)"
                             R"( "model_transaction_policy": {"decoupled": true}})";
    }
    return mo;
  }

  static std::unique_ptr<Engine> engine(const std::shared_ptr<Model>& model,
                                        EngineOptions options = {}) {
    auto device = open_device("cpu");
    EXPECT_TRUE(device.ok());
    if (options.workers == 0) options.workers = 1;
    auto e = Engine::create(model, *device, options);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static Tensor row(float a, float b) {
    return *Tensor::from_values(Shape{1, 2}, std::vector<float>{a, b});
  }

  fs::path root_;
};

constexpr const char* kScale = R"(
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            if x[0, 0] == 13:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "13 is unlucky", pb_utils.TritonError.INVALID_ARG)))
                continue
            if x[0, 0] == 99:
                os._exit(3)
            if x[0, 0] == 77:
                raise KeyError("seventy-seven")
            # y = x * len(requests): the test sees how many requests one execute got.
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * len(requests))]))
        return out
)";

TEST_F(PythonModelTest, ComputesAndHandsExecuteEachRequest) {
  auto model = load_model(write_model("scale", kScale), fp32_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_TRUE((*model)->signature().batched);
  EngineOptions o;
  o.batching.max_queue_delay = 200ms;  // the requests below meet in one batch
  auto e = engine(*model, o);
  ASSERT_TRUE(e);
  std::vector<Future<Outputs>> futures;
  for (int i = 0; i < 4; ++i) {
    futures.push_back(e->submit({row(static_cast<float>(i), 0.5F)}));
  }
  int batched = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(futures[static_cast<std::size_t>(i)].wait_for(30s));
    auto r = futures[static_cast<std::size_t>(i)].get();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const float* y = static_cast<const float*>((*r)[0].data());
    const float n = y[1] / 0.5F;  // len(requests) of that execute
    EXPECT_FLOAT_EQ(y[0], static_cast<float>(i) * n);
    if (n > 1) ++batched;
  }
  EXPECT_GT(batched, 0) << "dynamic batching handed execute several requests";
}

// An output in the other byte order (numpy's ">f4" on this host) arrives with its values: the
// stub converts it to the host's order before it copies its bytes out.
TEST_F(PythonModelTest, AnOutputInTheOtherByteOrderKeepsItsValues) {
  auto model = load_model(write_model("swapped", R"(
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy().astype(">f4"))])
            for r in requests]
)"),
                          fp32_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto e = engine(*model);
  ASSERT_TRUE(e);
  auto f = e->submit({row(1.5F, -2.25F)});
  ASSERT_TRUE(f.wait_for(30s));
  auto r = f.get();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const float* y = static_cast<const float*>((*r)[0].data());
  EXPECT_FLOAT_EQ(y[0], 1.5F);
  EXPECT_FLOAT_EQ(y[1], -2.25F);
}

TEST_F(PythonModelTest, ErrorsOfResponsesAndExecuteReachTheirRequests) {
  auto model = load_model(write_model("scale", kScale), fp32_options());
  ASSERT_TRUE(model.ok());
  auto e = engine(*model);
  ASSERT_TRUE(e);
  auto bad = e->infer({row(13, 0)});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("13 is unlucky"), std::string_view::npos);
  auto raised = e->infer({row(77, 0)});
  ASSERT_FALSE(raised.ok());
  EXPECT_NE(raised.status().message().find("KeyError: 'seventy-seven'"), std::string_view::npos)
      << raised.status().to_string();
  auto good = e->infer({row(2, 3)});
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_FLOAT_EQ(static_cast<const float*>((*good)[0].data())[1], 3.0F);
}

TEST_F(PythonModelTest, AProcessThatExitsIsRestartedForTheNextBatch) {
  auto model = load_model(write_model("scale", kScale), fp32_options());
  ASSERT_TRUE(model.ok());
  auto e = engine(*model);
  ASSERT_TRUE(e);
  auto crashed = e->infer({row(99, 0)});
  ASSERT_FALSE(crashed.ok());
  EXPECT_NE(crashed.status().message().find("exited with status 3"), std::string_view::npos)
      << crashed.status().to_string();
  auto good = e->infer({row(1, 1)});
  ASSERT_TRUE(good.ok()) << good.status().to_string();
}

TEST_F(PythonModelTest, LoadErrorsNameWhatIsWrong) {
  ModelOptions none;
  auto no_signature = load_model(write_model("scale", kScale), none);
  ASSERT_FALSE(no_signature.ok());
  EXPECT_NE(no_signature.status().message().find("inputs and outputs must be given"),
            std::string_view::npos);
  EXPECT_EQ(load_model("python:/nonexistent/model.py", fp32_options()).status().code(),
            StatusCode::not_found);

  auto raises = load_model(write_model("raises", R"(
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot find weights for " + args["model_name"])
)"),
                           fp32_options());
  ASSERT_TRUE(raises.ok());  // initialize runs per instance, when the engine starts it
  auto device = open_device("cpu");
  auto e = Engine::create(*raises, *device, EngineOptions{});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("RuntimeError: cannot find weights for raises"),
            std::string_view::npos)
      << e.status().to_string();

  ModelOptions other = fp32_options();
  other.backend_parameters = {{"python_interpreter", "/nonexistent/python3"}};
  auto missing = load_model(write_model("scale", kScale), other);
  ASSERT_TRUE(missing.ok());
  auto e2 = Engine::create(*missing, *device, EngineOptions{});
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("/nonexistent/python3"), std::string_view::npos);
}

TEST_F(PythonModelTest, AHangIsStoppedOnceItsRequestsHaveEnded) {
  auto model = load_model(write_model("sleeper", R"(
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        if x[0, 0] == 1:
            time.sleep(3600)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]) for _ in requests]
)"),
                          fp32_options());
  ASSERT_TRUE(model.ok());
  auto e = engine(*model);
  ASSERT_TRUE(e);
  RequestOptions ro;
  ro.timeout = 200ms;
  const auto start = std::chrono::steady_clock::now();
  auto hung = e->infer({row(1, 0)}, ro);
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), StatusCode::deadline_exceeded);
  // The worker is free again after the 2 s grace: the process was killed and is restarted.
  auto good = e->infer({row(2, 0)});
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

TEST_F(PythonModelTest, DecoupledSendsFromAThreadOfTheModel) {
  auto model = load_model(write_model("repeat", R"(
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            threading.Thread(target=self.run, args=(x, r.get_response_sender())).start()
        return None

    def run(self, x, sender):
        for i in range(int(x[0, 1])):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + i)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
)"),
                          fp32_options(/*decoupled=*/true));
  ASSERT_TRUE(model.ok());
  EXPECT_TRUE((*model)->signature().decoupled);
  auto e = engine(*model);
  ASSERT_TRUE(e);
  std::mutex mu;
  std::vector<float> got;
  RequestOptions ro;
  ro.on_response = [&](Outputs outs, std::stop_token) {
    std::lock_guard lock(mu);
    got.push_back(static_cast<const float*>(outs[0].data())[0]);
    return Status();
  };
  auto final_result = e->infer({row(10, 4)}, ro);
  ASSERT_TRUE(final_result.ok()) << final_result.status().to_string();
  EXPECT_TRUE(final_result->empty());
  std::lock_guard lock(mu);
  EXPECT_EQ(got, (std::vector<float>{10, 11, 12, 13}));
}

// A non-final send is posted (model.py does not wait for the server): a failure the server finds
// in it fails the request, and model.py hears of it at its next answered send, the final one.
TEST_F(PythonModelTest, APostedSendsFailureReachesTheRequestAndTheFinalSend) {
  auto model = load_model(write_model("posted", R"(
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.astype(np.float64))]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                heard = "nothing"
            except pb_utils.TritonModelException as e:
                heard = str(e)
            with open(os.path.join(self.folder, "heard.txt"), "w") as f:
                f.write(heard)
        return None
)"),
                          fp32_options(/*decoupled=*/true));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto e = engine(*model);
  ASSERT_TRUE(e);
  std::atomic<int> responses{0};
  RequestOptions ro;
  ro.on_response = [&](Outputs, std::stop_token) {
    ++responses;
    return Status();
  };
  auto result = e->infer({row(3, 4)}, ro);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("is FP64, the config says FP32"), std::string::npos)
      << result.status().to_string();
  EXPECT_EQ(responses.load(), 1);  // the good one still went out
  std::ifstream in(root_ / "posted" / "heard.txt");
  const std::string heard((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(heard.find("an earlier send failed: "), std::string::npos) << heard;
  EXPECT_NE(heard.find("is FP64, the config says FP32"), std::string::npos) << heard;
}

// A response over the 64 KiB that travel inline is written to the output arena, which the next
// response reuses: its send waits for the server's copy, so each response arrives as it was sent.
TEST_F(PythonModelTest, LargeDecoupledResponsesArriveWhole) {
  ModelOptions mo;
  mo.inputs = {TensorSpec{"x", DType::f32, Shape{-1, 2}}};
  mo.outputs = {TensorSpec{"y", DType::f32, Shape{-1, -1}}};
  mo.batch_limit = 8;
  mo.model_config_json = R"({"name": "large", "backend": "python", "max_batch_size": 8,)"
                         R"( "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],)"
                         R"( "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}],)"
                         R"( "model_transaction_policy": {"decoupled": true}})";
  auto model = load_model(write_model("large", R"(
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for i in range(10):  # 80,000 bytes each (the arena), then 400 (inline)
                n = 20000 if i < 8 else 100
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", np.full((1, n), i, np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
)"),
                          mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto e = engine(*model);
  ASSERT_TRUE(e);
  std::mutex mu;
  std::vector<std::pair<std::int64_t, bool>> got;  // (elements, all equal to the index)
  RequestOptions ro;
  ro.on_response = [&](Outputs outs, std::stop_token) {
    std::lock_guard lock(mu);
    const auto* v = static_cast<const float*>(outs[0].data());
    const auto n = static_cast<std::int64_t>(outs[0].numel());
    const float want = static_cast<float>(got.size());
    got.emplace_back(n, std::all_of(v, v + n, [&](float x) { return x == want; }));
    return Status();
  };
  auto result = e->infer({row(1, 2)}, ro);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  std::lock_guard lock(mu);
  ASSERT_EQ(got.size(), 10U);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, i < 8 ? 20000 : 100) << i;
    EXPECT_TRUE(got[i].second) << "response " << i << " holds another response's values";
  }
}

// Where the engine does not batch (Triton gives execute() one request at a time), requests that
// queue together go to the process in one launch (Model::coalesced_requests), and the stub calls
// execute() once for each: every execute sees one request, and an error response, an exception
// or a crash fails only its own request (the others of a launch that crashed run again, alone).
// Each request counts as an execution of its own.
TEST_F(PythonModelTest, CoalescedRequestsAreEachAnExecuteOfTheirOwn) {
  auto model = load_model(write_model("scale", kScale), fp32_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->coalesced_requests(), 16);
  EngineOptions o;
  o.batching.max_batch_size = 1;
  auto e = engine(*model, o);
  ASSERT_TRUE(e);
  constexpr int kRequests = 96;
  std::vector<Future<Outputs>> futures;
  for (int i = 0; i < kRequests; ++i) {
    const float x = i == 30   ? 13.0F
                    : i == 50 ? 77.0F
                    : i == 70 ? 99.0F
                              : static_cast<float>(1000 + i);
    futures.push_back(e->submit({row(x, 0.5F)}));
  }
  for (int i = 0; i < kRequests; ++i) {
    auto& f = futures[static_cast<std::size_t>(i)];
    ASSERT_TRUE(f.wait_for(60s)) << "request " << i;
    auto r = f.get();
    if (i == 30 || i == 50 || i == 70) {
      ASSERT_FALSE(r.ok()) << "request " << i;
      const std::string_view want = i == 30   ? "13 is unlucky"
                                    : i == 50 ? "execute raised KeyError: 'seventy-seven'"
                                              : "status 3";
      EXPECT_NE(r.status().message().find(want), std::string_view::npos) << r.status().to_string();
      if (i != 70) {
        EXPECT_EQ(r.status().code(), i == 30 ? StatusCode::invalid_argument : StatusCode::internal);
      }
      continue;
    }
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    const float* y = static_cast<const float*>((*r)[0].data());
    EXPECT_FLOAT_EQ(y[1], 0.5F) << "request " << i << ": execute got several requests";
    EXPECT_FLOAT_EQ(y[0], static_cast<float>(1000 + i));
  }
  const EngineMetrics m = e->metrics();
  EXPECT_LT(m.batches, static_cast<std::uint64_t>(kRequests)) << "no launch was coalesced";
  // Each successful request was an execution of one.
  EXPECT_EQ(m.stats.inference_count, static_cast<std::uint64_t>(kRequests - 3));
  EXPECT_GE(m.stats.execution_count, static_cast<std::uint64_t>(kRequests - 3));
  ASSERT_EQ(m.stats.batch_stats.size(), 1U);
  EXPECT_EQ(m.stats.batch_stats[0].batch_size, 1);
  EXPECT_EQ(m.stats.batch_stats[0].compute_infer.count, m.stats.execution_count);
}

// A model for the coalescing tests below, by x[0, 0]: 1 sleeps 0.4 s (the requests sent meanwhile
// queue up behind it and the two launched after it), 2 waits up to 3 s for its request to be
// cancelled; any value sleeps x[0, 1] ms first. Answers x.
constexpr const char* kPatient = R"(
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            time.sleep(x[0, 1] / 1000)
            if x[0, 0] == 1:
                time.sleep(0.4)
            if x[0, 0] == 2:
                end = time.monotonic() + 3
                while not r.is_cancelled() and time.monotonic() < end:
                    time.sleep(0.005)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
        return out
)";

// Submits the blocker (x = 1) and two quick requests one at a time, so that each is a launch of its
// own and the worker has its three launches in flight; what is submitted next queues together.
std::vector<Future<Outputs>> hold_the_worker(Engine& e) {
  std::vector<Future<Outputs>> held;
  for (float first : {1.0F, 0.0F, 0.0F}) {
    held.push_back(e.submit({*Tensor::from_values(Shape{1, 2}, std::vector<float>{first, 0})}));
    std::this_thread::sleep_for(50ms);
  }
  return held;
}

// A coalesced launch runs its requests one after another: the hang watchdog gives it its time
// once for each of them, so that requests that each take well under it are not failed together.
TEST_F(PythonModelTest, ACoalescedLaunchHasTheWatchdogsTimeForEachRequest) {
  auto model = load_model(write_model("patient", kPatient), fp32_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EngineOptions o;
  o.batching.max_batch_size = 1;
  o.watchdog = 600ms;
  auto e = engine(*model, o);
  ASSERT_TRUE(e);
  std::vector<Future<Outputs>> futures = hold_the_worker(*e);
  for (int i = 0; i < 8; ++i) {  // 8 x 200 ms together: over the watchdog's 600 ms
    futures.push_back(e->submit({row(0, 200)}));
  }
  for (std::size_t i = 0; i < futures.size(); ++i) {
    ASSERT_TRUE(futures[i].wait_for(30s)) << "request " << i;
    auto r = futures[i].get();
    EXPECT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
  }
  EXPECT_LT(e->metrics().batches, futures.size()) << "no launch was coalesced";
}

// is_cancelled() answers for its own request in a coalesced launch, not for the launch as a
// whole: the request that waits for its cancel sees it while the other request is still live.
TEST_F(PythonModelTest, IsCancelledAnswersForItsOwnRequestInACoalescedLaunch) {
  auto model = load_model(write_model("patient", kPatient), fp32_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EngineOptions o;
  o.batching.max_batch_size = 1;
  auto e = engine(*model, o);
  ASSERT_TRUE(e);
  std::vector<Future<Outputs>> held = hold_the_worker(*e);
  const auto start = std::chrono::steady_clock::now();
  Future<Outputs> waiting = e->submit({row(2, 0)});
  Future<Outputs> after = e->submit({row(3, 0)});
  std::this_thread::sleep_for(700ms);  // the blocker is done; `waiting` polls is_cancelled
  EXPECT_TRUE(waiting.cancel());
  ASSERT_TRUE(after.wait_for(30s));
  auto r = after.get();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // `waiting` saw its cancel and returned, long before its 3 s ran out.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2500ms);
  for (auto& f : held) EXPECT_TRUE(f.wait_for(30s));
  EXPECT_LT(e->metrics().batches, 5U) << "the two requests were not coalesced";
}

// A model neither decoupled, nor stateful, nor dynamically batched has two batches in flight: the
// next batch is sent to its process while it runs one (each in a slot of its own, input and output
// arena), so the process finds it waiting on its socket (fd 3). Each request keeps its own values,
// an error response or an exception fails only its request, and a batch sent ahead to a process
// that then exits is sent again to the process that replaces it.
TEST_F(PythonModelTest, TheNextBatchIsSentAheadAndEachRequestKeepsItsValues) {
  ModelOptions mo;
  mo.inputs = {TensorSpec{"x", DType::f32, Shape{-1, -1}}};
  mo.outputs = {TensorSpec{"y", DType::f32, Shape{-1, -1}}};
  mo.batch_limit = 8;
  auto model = load_model(write_model("ahead", R"(
import os
import select
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.004)
        # Is the next batch already here? (the stub's socket is fd 3)
        ahead = 1.0 if select.select([3], [], [], 0)[0] else 0.0
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            if x[0, 0] == 99:
                os._exit(3)
            if x[0, 0] == 13:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("unlucky")))
                continue
            if x[0, 0] == 77:
                raise KeyError("seventy-seven")
            y = x * 2
            y[0, 0] = ahead
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return out
)"),
                          mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EngineOptions o;
  o.batching.max_batch_size = 1;  // a batch a request: every request is an execute of its own
  auto e = engine(*model, o);
  ASSERT_TRUE(e);
  // Two batches at the process and a third ready (Model::pipelined_batches).
  EXPECT_EQ(e->options().max_inflight_per_worker, 3);
  constexpr int kRequests = 160;
  std::vector<Future<Outputs>> futures;
  std::vector<std::int64_t> widths;
  for (int i = 0; i < kRequests; ++i) {
    // Widths from 2 to 20,002 values: the two slots' arenas carry tensors of different sizes.
    const std::int64_t n = 2 + (i * 7919) % 20001;
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k)
      v[static_cast<std::size_t>(k)] = static_cast<float>(1000 * (i + 1) + k);
    if (i == 40) v[0] = 13;
    if (i == 70) v[0] = 77;
    if (i == 100) v[0] = 99;
    widths.push_back(n);
    futures.push_back(e->submit({*Tensor::from_values(Shape{1, n}, v)}));
  }
  int ahead = 0;
  for (int i = 0; i < kRequests; ++i) {
    auto& f = futures[static_cast<std::size_t>(i)];
    ASSERT_TRUE(f.wait_for(60s)) << "request " << i;
    auto r = f.get();
    if (i == 40 || i == 70 || i == 100) {
      ASSERT_FALSE(r.ok()) << "request " << i;
      const std::string_view want = i == 40 ? "unlucky" : i == 70 ? "seventy-seven" : "status 3";
      EXPECT_NE(r.status().message().find(want), std::string_view::npos) << r.status().to_string();
      continue;
    }
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    const std::int64_t n = widths[static_cast<std::size_t>(i)];
    ASSERT_EQ((*r)[0].numel(), n) << "request " << i;
    const auto* y = static_cast<const float*>((*r)[0].data());
    for (std::int64_t k = 1; k < n; ++k) {
      ASSERT_EQ(y[k], 2.0F * static_cast<float>(1000 * (i + 1) + k))
          << "request " << i << ", value " << k;
    }
    if (y[0] == 1.0F) ++ahead;
  }
  // While one runs, the next is already sent.
  EXPECT_GT(ahead, kRequests / 2) << "executes that found the next batch already sent";
}

}  // namespace
}  // namespace asyncinfer
