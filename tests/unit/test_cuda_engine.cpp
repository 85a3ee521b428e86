// The engine and the pipeline on cuda:0: the same behaviour as on cpu and sim, with inputs and
// outputs copied through device memory. Every test skips, with CUDA's reason, without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "asyncinfer/asyncinfer.hpp"
#include "engine_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::first_value;
using testing::get_within;
using testing::one;
using testing::rows_tensor;

class CudaEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = open_device("cuda:0");
    if (!d.ok()) GTEST_SKIP() << d.status();
    device_ = *d;
  }
  std::unique_ptr<Engine> engine(const std::string& uri, EngineOptions o = {}) {
    auto e = Engine::create(*load_model(uri), device_, std::move(o));
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  std::shared_ptr<Device> device_;
};

TEST_F(CudaEngine, IdentityThroughDeviceMemoryWithBatching) {
  EngineOptions o;
  o.workers = 2;
  o.batching.max_batch_size = 16;
  auto e = engine("builtin:identity?shape=8", o);
  std::vector<Future<Outputs>> fs;
  for (int i = 0; i < 200; ++i) fs.push_back(e->submit({rows_tensor(1, 8, static_cast<float>(i))}));
  for (int i = 0; i < 200; ++i) {
    auto r = get_within(fs[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE((*r)[0].is_host_accessible());
    EXPECT_EQ(first_value(*r), static_cast<float>(i));
    EXPECT_EQ((*r)[0].data_as<float>()[3], 1.5f);
  }
  EXPECT_GT(e->metrics().batch_size.mean(), 1.0);
}

TEST_F(CudaEngine, DeadlineCancelsASpinningKernel) {
  EngineOptions o;
  o.max_inflight_per_worker = 1;
  auto e = engine("builtin:fixed_cost?base_us=5000000&shape=4", o);  // 5 s of device time
  RequestOptions ro;
  ro.timeout = 50ms;
  const auto t0 = Clock::now();
  auto r = get_within(e->submit(one(1), ro), 10'000ms);
  EXPECT_EQ(r.status().code(), StatusCode::deadline_exceeded) << r.status();
  EXPECT_LT(Clock::now() - t0, 1s);
  // The spin kernel was stopped (when the backend can): the worker takes the next request soon.
  EXPECT_TRUE(testing::eventually([&] { return e->metrics().workers.at(0).inflight_batches == 0; },
                                  6000ms));
}

TEST_F(CudaEngine, GemmModelRunsBatchedAndMatchesTheCpuReference) {
  EngineOptions o;
  o.batching.max_batch_size = 8;
  auto e = engine("builtin:gemm?m=16&n=8&k=32&dtype=f32", o);
  ASSERT_TRUE(e);
  std::vector<float> a(16 * 32);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7) % 13) / 13.0f;
  auto out = e->infer({*Tensor::from_values<float>({1, 16, 32}, a)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].shape(), (Shape{1, 16, 8}));
  for (std::size_t i = 0; i < (*out)[0].numel(); ++i) {
    ASSERT_TRUE(std::isfinite((*out)[0].data_as<float>()[i]));
  }
}

TEST_F(CudaEngine, RetriesAndSplitsWorkOnCudaToo) {
  EngineOptions o;
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = 1ms;
  auto flaky = engine("builtin:faulty?code=unavailable&first=2&shape=4", o);
  EXPECT_TRUE(flaky->infer(one(1)).ok());
  EXPECT_EQ(flaky->metrics().attempts, 3u);
  EngineOptions b;
  b.batching.max_batch_size = 4;
  b.batching.max_queue_delay = 100ms;
  auto poisoned = engine("builtin:faulty?poison=13&code=invalid_argument&shape=4", b);
  std::vector<Future<Outputs>> fs;
  for (float v : {1.0f, 13.0f, 3.0f, 4.0f}) fs.push_back(poisoned->submit(one(v)));
  int ok = 0;
  for (auto& f : fs) ok += get_within(f).ok() ? 1 : 0;
  EXPECT_EQ(ok, 3);
}

TEST_F(CudaEngine, PipelineOfDeviceStagesLinkedByEvents) {
  auto copy_kernel = [](PipelineItem&, Stream& s) {
    Kernel k;
    k.name = "spin";
    k.duration = 200us;
    return s.enqueue(std::move(k));
  };
  auto p = Pipeline::create(
      {StageSpec::on_device("a", device_, copy_kernel),
       StageSpec::on_device("b", device_, copy_kernel),
       StageSpec::run_model("model", device_, *load_model("builtin:identity?shape=4"))},
      PipelineOptions{.window = 4});
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<PipelineItem> items;
  for (int i = 0; i < 100; ++i) {
    PipelineItem it;
    it.tensors = {rows_tensor(1, 4, static_cast<float>(i))};
    items.push_back(std::move(it));
  }
  auto results = (*p)->run(std::move(items));
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(results[static_cast<std::size_t>(i)].ok())
        << results[static_cast<std::size_t>(i)].status();
    EXPECT_EQ(results[static_cast<std::size_t>(i)]->tensors[0].data_as<float>()[0],
              static_cast<float>(i));
  }
}

}  // namespace
}  // namespace asyncinfer
