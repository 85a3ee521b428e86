// The cuda backend beyond the device conformance suite (test_device.cpp runs that on cuda:0 too):
// the same work on cpu and cuda compared, builtin:gemm against a float64 reference, spin kernels'
// duration and cancellation, host functions (exactly once, never on CUDA's callback thread),
// stream destruction with pending work, memory.
//
// Without a usable GPU every test that needs one skips, printing CUDA's error (e.g.
// "cudaErrorInsufficientDriver: CUDA driver version is insufficient..."). The three tests at the
// end need no GPU: they check what a machine without one must do (open_device fails as
// unavailable with CUDA's text) and builtin:gemm's parameter checks.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/model.hpp"
#include "model/cuda/gemm_weights.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;

// ---- helpers --------------------------------------------------------------------------------

std::uint16_t float_to_half(float f) {
  std::uint32_t x = 0;
  std::memcpy(&x, &f, sizeof x);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const int exp = static_cast<int>((x >> 23) & 0xffu) - 127 + 15;
  const std::uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xffu) == 0 || exp <= 0) return sign;  // zero (test values have no subnormals)
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // round to nearest even
  return static_cast<std::uint16_t>(h);
}

float half_to_float(std::uint16_t h) {
  const float sign = (h & 0x8000u) != 0 ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t x = 0;
  std::memcpy(&x, &f, sizeof x);
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(x >> 16);
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t x = static_cast<std::uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

/// Writes `values` into a host tensor of `dtype` (f32, f16 or bf16).
Tensor host_tensor(DType dtype, Shape shape, const std::vector<float>& values) {
  Tensor t = *Tensor::empty(dtype, std::move(shape));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::f32) {
      t.data_as<float>()[i] = values[i];
    } else if (dtype == DType::f16) {
      t.data_as<Float16>()[i] = Float16{float_to_half(values[i])};
    } else {
      t.data_as<BFloat16>()[i] = BFloat16{float_to_bf16(values[i])};
    }
  }
  return t;
}

float element(const Tensor& t, std::size_t i) {
  if (t.dtype() == DType::f16) return half_to_float(t.data_as<Float16>()[i].bits);
  if (t.dtype() == DType::bf16) return bf16_to_float(t.data_as<BFloat16>()[i].bits);
  return t.data_as<float>()[i];
}

/// What a host function received (a Future cannot hold a bare Status).
struct Reported {
  Status status;
  StatusCode code() const { return status.code(); }
  std::string_view message() const { return status.message(); }
  bool ok() const { return status.ok(); }
};
std::ostream& operator<<(std::ostream& os, const Reported& r) { return os << r.status; }

/// A future of the status the next host function on `s` receives.
Future<Reported> host_func_status(Stream& s) {
  auto p = std::make_shared<Promise<Reported>>();
  Future<Reported> f = p->get_future();
  Status launched = s.launch_host_func([p](Status st) { p->set_value(Reported{std::move(st)}); });
  EXPECT_TRUE(launched.ok()) << launched;
  return f;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = open_device("cuda:0");
    if (!d.ok()) {
      ASSERT_EQ(d.status().code(), StatusCode::unavailable) << d.status();
      GTEST_SKIP() << "no usable CUDA GPU: " << d.status();
    }
    cuda_ = *d;
  }
  std::unique_ptr<Stream> stream(Device& d, int priority = 0) {
    StreamOptions o;
    o.priority = priority;
    auto s = d.create_stream(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  std::shared_ptr<Device> cuda_;
};

// ---- the device ---------------------------------------------------------------------------------

TEST_F(CudaTest, InfoDescribesTheGpu) {
  const DeviceInfo& info = cuda_->info();
  EXPECT_EQ(info.name, "cuda:0");
  EXPECT_EQ(info.kind, DeviceKind::cuda);
  EXPECT_FALSE(info.unified_memory);
  EXPECT_TRUE(info.async);
  EXPECT_FALSE(info.simulated);
  EXPECT_TRUE(info.cancellable_work);
  EXPECT_NE(info.description.find("SMs"), std::string::npos) << info.description;
  EXPECT_GE(info.copy_engines, 0);
}

TEST_F(CudaTest, StreamPrioritiesAreClampedToTheDeviceRange) {
  int least = 0;
  int greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  auto high = stream(*cuda_, -1000);
  auto low = stream(*cuda_, 1000);
  EXPECT_EQ(high->priority(), greatest);
  EXPECT_EQ(low->priority(), least);
  int native = 0;
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(high->native_handle()), &native),
            cudaSuccess);
  EXPECT_EQ(native, greatest);
}

TEST_F(CudaTest, MemoryKindsAndPinnedReuse) {
  auto dev = cuda_->allocate(4096, MemoryKind::device);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ((*dev)->placement(), (Placement{MemoryKind::device, 0}));
  EXPECT_FALSE((*dev)->host_accessible());
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, (*dev)->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);

  void* first = nullptr;
  {
    auto pinned = cuda_->allocate(10000, MemoryKind::pinned_host);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    EXPECT_TRUE((*pinned)->host_accessible());
    ASSERT_EQ(cudaPointerGetAttributes(&attr, (*pinned)->data()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost);  // page-locked
    first = (*pinned)->data();
  }
  auto again = cuda_->allocate(9000, MemoryKind::pinned_host);  // same size class
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data(), first);

  auto huge = cuda_->allocate(std::size_t{1} << 50, MemoryKind::device);  // 1 PiB
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::resource_exhausted) << huge.status();
}

// ---- the same work on cpu and cuda
// ----------------------------------------------------------------

struct PipelineResult {
  std::vector<float> out;
  int host_func_calls = 0;
  Status host_func_status;
};

/// host -> device copy, the model, device -> host copy, an event and a host function.
PipelineResult run_pipeline(Device& device, Model& model, const std::vector<float>& values,
                            Shape shape) {
  PipelineResult r;
  auto s = *device.create_stream();
  auto inst = model.create_instance(device, *s, {});
  EXPECT_TRUE(inst.ok()) << inst.status();
  if (!inst.ok()) return r;
  Tensor host_in = *Tensor::from_values<float>(shape, values);
  Tensor dev_in = *device.empty(DType::f32, shape, MemoryKind::device);
  EXPECT_TRUE(s->copy(dev_in, host_in).ok());
  auto io = std::make_shared<BatchIO>();
  io->inputs = {dev_in};
  io->host_inputs = {host_in};
  io->batch_size = shape[0];
  Status st = (*inst)->enqueue(*s, io);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok()) return r;
  Tensor host_out = *device.empty(DType::f32, shape, MemoryKind::pinned_host);
  EXPECT_TRUE(s->copy(host_out, io->outputs.at(0)).ok());
  auto e = *device.create_event();
  EXPECT_TRUE(s->record(*e).ok());
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto p = std::make_shared<Promise<Reported>>();
  auto f = p->get_future();
  EXPECT_TRUE(s->launch_host_func([calls, p](Status hs) {
                 calls->fetch_add(1);
                 p->set_value(Reported{std::move(hs)});
               }).ok());
  auto got = get_within(f);
  EXPECT_TRUE(e->synchronize().ok());
  EXPECT_TRUE(s->synchronize().ok());
  r.host_func_calls = calls->load();
  r.host_func_status = got.ok() ? got->status : got.status();
  r.out.assign(host_out.data_as<float>(), host_out.data_as<float>() + host_out.numel());
  inst->reset();
  return r;
}

TEST_F(CudaTest, SameWorkOnCpuAndCudaGivesTheSameResult) {
  auto cpu = *open_device("cpu");
  const Shape shape = {4, 256};
  std::vector<float> values(4 * 256);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 3.0f;
  for (const char* uri :
       {"builtin:identity?shape=256", "builtin:fixed_cost?base_us=300&shape=256"}) {
    SCOPED_TRACE(uri);
    auto model = load_model(uri);
    ASSERT_TRUE(model.ok()) << model.status();
    PipelineResult on_cpu = run_pipeline(*cpu, **model, values, shape);
    PipelineResult on_cuda = run_pipeline(*cuda_, **model, values, shape);
    EXPECT_EQ(on_cpu.out, values);
    EXPECT_EQ(on_cuda.out, on_cpu.out);
    EXPECT_EQ(on_cpu.host_func_calls, 1);
    EXPECT_EQ(on_cuda.host_func_calls, 1);
    EXPECT_TRUE(on_cuda.host_func_status.ok()) << on_cuda.host_func_status;
  }
}

TEST_F(CudaTest, PageableCopiesAreStagedInStreamOrder) {
  // A host function writes a pageable buffer after a spin; the copies that follow must see what it
  // wrote (cudaMemcpyAsync alone would read the pageable source when called).
  auto s = stream(*cuda_);
  constexpr std::size_t kN = 1 << 16;
  Tensor produced = *Tensor::zeros(DType::f32, {kN});
  Tensor back = *Tensor::zeros(DType::f32, {kN});
  Tensor dev = *cuda_->empty(DType::f32, {kN}, MemoryKind::device);
  Kernel k;
  k.name = "producer";
  k.duration = 2ms;
  k.host_fn = [produced](std::stop_token) {
    for (std::size_t i = 0; i < kN; ++i) produced.data_as<float>()[i] = static_cast<float>(i);
    return Status();
  };
  ASSERT_TRUE(s->enqueue(std::move(k)).ok());
  ASSERT_TRUE(s->copy(dev, produced).ok());
  ASSERT_TRUE(s->copy(back, dev).ok());
  ASSERT_TRUE(s->synchronize_for(testing::kWatchdog).ok());
  for (std::size_t i = 0; i < kN; i += 997)
    ASSERT_EQ(back.data_as<float>()[i], static_cast<float>(i));
}

// ---- builtin:gemm against float64
// -------------------------------------------------------------------

TEST_F(CudaTest, GemmMatchesAFloat64Reference) {
  constexpr std::int64_t kM = 32, kN = 48, kK = 64, kBatch = 3;
  struct Case {
    const char* dtype;
    DType type;
    double tolerance;  // relative to sum |a|·|b| of each output element
  };
  for (const Case& c : {Case{"f32", DType::f32, 1e-5}, Case{"f16", DType::f16, 1.0 / 1024},
                        Case{"bf16", DType::bf16, 1.0 / 128}}) {
    SCOPED_TRACE(c.dtype);
    auto model =
        load_model("builtin:gemm?m=32&n=48&k=64&max_batch_size=8&dtype=" + std::string(c.dtype));
    ASSERT_TRUE(model.ok()) << model.status();
    auto s = stream(*cuda_);
    auto inst = (*model)->create_instance(*cuda_, *s, {});
    ASSERT_TRUE(inst.ok()) << inst.status();

    // Inputs are multiples of 1/8 in [-1, 1]: exact in every dtype.
    std::vector<float> a(static_cast<std::size_t>(kBatch * kM * kK));
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(static_cast<int>((i * 37 + 11) % 17) - 8) / 8.0f;
    }
    Tensor host_a = host_tensor(c.type, {kBatch, kM, kK}, a);
    Tensor dev_a = *cuda_->empty(c.type, {kBatch, kM, kK}, MemoryKind::device);
    ASSERT_TRUE(s->copy(dev_a, host_a).ok());
    auto io = std::make_shared<BatchIO>();
    io->inputs = {dev_a};
    io->host_inputs = {host_a};
    io->batch_size = kBatch;
    Status st = (*inst)->enqueue(*s, io);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(io->outputs.size(), 1u);
    EXPECT_EQ(io->outputs[0].shape(), (Shape{kBatch, kM, kN}));
    Tensor host_c = *cuda_->empty(c.type, {kBatch, kM, kN}, MemoryKind::pinned_host);
    ASSERT_TRUE(s->copy(host_c, io->outputs[0]).ok());
    ASSERT_TRUE(s->synchronize_for(testing::kWatchdog).ok());

    int bad = 0;
    for (std::int64_t b = 0; b < kBatch; ++b) {
      for (std::int64_t i = 0; i < kM; ++i) {
        for (std::int64_t j = 0; j < kN; ++j) {
          double ref = 0;
          double mag = 0;
          for (std::int64_t p = 0; p < kK; ++p) {
            const double x = a[static_cast<std::size_t>((b * kM + i) * kK + p)];
            const double w = detail::gemm_weight_value(detail::kGemmWeightSeed,
                                                       static_cast<std::uint64_t>(p * kN + j));
            ref += x * w;
            mag += std::fabs(x * w);
          }
          const double got = element(host_c, static_cast<std::size_t>((b * kM + i) * kN + j));
          if (std::fabs(got - ref) > c.tolerance * mag + 1e-6 && ++bad <= 5) {
            ADD_FAILURE() << "c[" << b << "][" << i << "][" << j << "] = " << got << ", expected "
                          << ref << " (tolerance " << c.tolerance * mag << ")";
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);
    inst->reset();
  }
}

TEST_F(CudaTest, GemmRejectsHostInputs) {
  auto model = *load_model("builtin:gemm?m=4&n=4&k=4");
  auto s = stream(*cuda_);
  auto inst = *model->create_instance(*cuda_, *s, {});
  auto io = std::make_shared<BatchIO>();
  io->inputs = {*Tensor::zeros(DType::f32, {1, 4, 4})};
  io->batch_size = 1;
  Status st = inst->enqueue(*s, io);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st;
  EXPECT_NE(st.message().find("memory of cuda:0"), std::string_view::npos) << st;
}

// ---- spin kernels
// ---------------------------------------------------------------------------------

TEST_F(CudaTest, SpinKernelDurationIsHonoured) {
  auto s = stream(*cuda_);
  for (auto duration : {200us, 3000us}) {
    auto start = *cuda_->create_event(EventOptions{true});
    auto end = *cuda_->create_event(EventOptions{true});
    ASSERT_TRUE(s->record(*start).ok());
    Kernel k;
    k.name = "spin";
    k.duration = duration;
    ASSERT_TRUE(s->enqueue(std::move(k)).ok());
    ASSERT_TRUE(s->record(*end).ok());
    ASSERT_TRUE(end->synchronize().ok());
    auto us = elapsed_time_us(*start, *end);
    ASSERT_TRUE(us.ok()) << us.status();
    const double want = static_cast<double>(duration.count());
    EXPECT_GE(*us, want * 0.98) << "spin of " << want << " us";
    EXPECT_LT(*us, want + 50'000.0) << "spin of " << want << " us";
  }
}

TEST_F(CudaTest, SpinKernelEndsWhenItsStopTokenFires) {
  auto s = stream(*cuda_);
  std::stop_source stop;
  Kernel k;
  k.name = "long-spin";
  k.duration = 30s;
  k.stop = stop.get_token();
  const auto t0 = Clock::now();
  ASSERT_TRUE(s->enqueue(std::move(k)).ok());
  auto status = host_func_status(*s);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(s->query());
  stop.request_stop();
  auto r = get_within(status);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code(), StatusCode::cancelled) << *r;
  EXPECT_NE(r->message().find("long-spin"), std::string_view::npos) << *r;
  EXPECT_LT(Clock::now() - t0, 10s);
  // Delivered once: the stream is clean again.
  EXPECT_TRUE(s->synchronize_for(testing::kWatchdog).ok());
  EXPECT_TRUE(get_within(host_func_status(*s))->ok());
}

// ---- host functions
// ---------------------------------------------------------------------------------

struct CallbackThreads {
  std::mutex mu;
  std::set<std::thread::id> ids;
};

void CUDART_CB note_callback_thread(void* data) {  // a raw CUDA host function: no CUDA calls
  auto* t = static_cast<CallbackThreads*>(data);
  std::lock_guard lock(t->mu);
  t->ids.insert(std::this_thread::get_id());
}

TEST_F(CudaTest, HostFunctionsRunOnceAndNeverOnCudasCallbackThread) {
  constexpr int kStreams = 3;
  constexpr int kPerStream = 200;
  CallbackThreads cb;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(stream(*cuda_));
  std::mutex mu;
  std::set<std::thread::id> host_fn_threads;
  std::set<std::thread::id> host_func_threads;
  std::vector<std::atomic<int>> calls(static_cast<std::size_t>(kStreams * kPerStream));
  std::atomic<int> cuda_call_failures{0};
  for (int j = 0; j < kPerStream; ++j) {
    for (int i = 0; i < kStreams; ++i) {
      Stream& s = *streams[static_cast<std::size_t>(i)];
      if (j % 50 == 0) {
        ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(s.native_handle()),
                                     &note_callback_thread, &cb),
                  cudaSuccess);
      }
      Kernel k;
      k.name = "probe";
      k.host_fn = [&](std::stop_token) {
        std::lock_guard lock(mu);
        host_fn_threads.insert(std::this_thread::get_id());
        return Status();
      };
      ASSERT_TRUE(s.enqueue(std::move(k)).ok());
      const std::size_t slot = static_cast<std::size_t>(i * kPerStream + j);
      ASSERT_TRUE(s.launch_host_func([&, slot](Status st) {
                     EXPECT_TRUE(st.ok()) << st;
                     calls[slot]++;
                     int dev = -1;  // allowed here: host functions run on the executor
                     if (cudaGetDevice(&dev) != cudaSuccess) cuda_call_failures++;
                     std::lock_guard lock(mu);
                     host_func_threads.insert(std::this_thread::get_id());
                   }).ok());
    }
  }
  for (auto& s : streams) ASSERT_TRUE(s->synchronize_for(testing::kWatchdog).ok());
  ASSERT_TRUE(testing::eventually([&] {
    for (auto& c : calls) {
      if (c.load() == 0) return false;
    }
    return true;
  }));
  for (auto& c : calls) EXPECT_EQ(c.load(), 1);
  EXPECT_EQ(cuda_call_failures.load(), 0);
  std::lock_guard lock(mu);
  ASSERT_FALSE(cb.ids.empty());
  for (const auto& id : cb.ids) {
    EXPECT_EQ(host_fn_threads.count(id), 0u) << "a kernel host_fn ran on CUDA's callback thread";
    EXPECT_EQ(host_func_threads.count(id), 0u) << "a HostFunc ran on CUDA's callback thread";
  }
}

TEST_F(CudaTest, DestroyingAStreamWithPendingWorkRunsEveryHostFunctionOnce) {
  auto s = stream(*cuda_);
  auto e = *cuda_->create_event();
  Kernel spin;
  spin.name = "endless";
  spin.duration = 60s;  // no stop token: only the stream's destruction ends it
  ASSERT_TRUE(s->enqueue(std::move(spin)).ok());
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i) {
    Kernel k;
    k.name = "after";
    k.host_fn = [&ran](std::stop_token) {
      ran++;
      return Status();
    };
    ASSERT_TRUE(s->enqueue(std::move(k)).ok());
  }
  ASSERT_TRUE(s->record(*e).ok());
  constexpr int kFuncs = 20;
  std::vector<Future<Reported>> funcs;
  for (int i = 0; i < kFuncs; ++i) funcs.push_back(host_func_status(*s));
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(e->query());
  const auto t0 = Clock::now();
  s.reset();
  EXPECT_LT(Clock::now() - t0, 10s);
  EXPECT_EQ(ran.load(), 0);
  for (auto& f : funcs) {
    auto r = get_within(f);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->code(), StatusCode::aborted) << *r;
  }
  EXPECT_TRUE(e->query());
  EXPECT_EQ(e->synchronize().code(), StatusCode::aborted);
}

TEST_F(CudaTest, StreamsWithoutKernelsRecordWithoutHostFunctions) {
  // The cheap path: copies and records only. Events complete ok and carry no error.
  auto s = stream(*cuda_);
  auto e = *cuda_->create_event();
  Tensor a = *cuda_->empty(DType::f32, {1024}, MemoryKind::device);
  Tensor b = *cuda_->empty(DType::f32, {1024}, MemoryKind::device);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(s->copy(b, a).ok());
    ASSERT_TRUE(s->record(*e).ok());
  }
  EXPECT_TRUE(e->synchronize_for(testing::kWatchdog).ok());
  EXPECT_TRUE(s->synchronize().ok());
}

TEST_F(CudaTest, TensorsAndStreamsMayOutliveTheDeviceHandle) {
  auto s = stream(*cuda_);
  Tensor t = *cuda_->empty(DType::f32, {256}, MemoryKind::device);
  Tensor p = *cuda_->empty(DType::f32, {256}, MemoryKind::pinned_host);
  std::weak_ptr<Device> weak = cuda_;
  cuda_.reset();
  ASSERT_TRUE(s->copy(p, t).ok());
  EXPECT_TRUE(s->synchronize().ok());
  s.reset();
  EXPECT_TRUE(weak.expired());
  t = Tensor();  // freed after the device object is gone
  p = Tensor();
}

// ---- no GPU needed
// ---------------------------------------------------------------------------------

TEST(CudaWithoutGpu, OpenDeviceFailsAsUnavailableWithCudasWordsOrSucceeds) {
  auto d = open_device("cuda:0");
  if (d.ok()) {
    EXPECT_EQ((*d)->kind(), DeviceKind::cuda);
  } else {
    EXPECT_EQ(d.status().code(), StatusCode::unavailable) << d.status();
    EXPECT_NE(d.status().message().find("cuda"), std::string_view::npos) << d.status();
  }
  auto bad = open_device("cuda:zero");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument) << bad.status();
  EXPECT_EQ(open_device("cuda:4096").status().code(), StatusCode::unavailable);
}

TEST(CudaWithoutGpu, GemmParametersAreCheckedByName) {
  auto ok = load_model("builtin:gemm?m=8&n=16&k=4&dtype=bf16&max_batch_size=5");
  ASSERT_TRUE(ok.ok()) << ok.status();
  const ModelSignature& sig = (*ok)->signature();
  ASSERT_EQ(sig.inputs.size(), 1u);
  EXPECT_EQ(sig.inputs[0].name, "a");
  EXPECT_EQ(sig.inputs[0].dtype, DType::bf16);
  EXPECT_EQ(sig.inputs[0].shape, (Shape{-1, 8, 4}));
  ASSERT_EQ(sig.outputs.size(), 1u);
  EXPECT_EQ(sig.outputs[0].name, "c");
  EXPECT_EQ(sig.outputs[0].shape, (Shape{-1, 8, 16}));
  EXPECT_EQ(sig.batch_limit, 5);
  EXPECT_TRUE(load_model("builtin:gemm").ok());  // defaults

  struct Bad {
    const char* uri;
    const char* mentions;
  };
  for (const Bad& b :
       {Bad{"builtin:gemm?m=0", "m="}, Bad{"builtin:gemm?k=abc", "k="},
        Bad{"builtin:gemm?dtype=i8", "f32, f16, bf16"},
        Bad{"builtin:gemm?max_batch=-1", "max_batch"}, Bad{"builtin:gemm?size=3", "size"}}) {
    auto r = load_model(b.uri);
    ASSERT_FALSE(r.ok()) << b.uri;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << r.status();
    EXPECT_NE(r.status().message().find(b.mentions), std::string_view::npos) << r.status();
  }
}

TEST(CudaWithoutGpu, GemmNeedsACudaDevice) {
  auto model = *load_model("builtin:gemm?m=4&n=4&k=4");
  auto cpu = *open_device("cpu");
  auto s = *cpu->create_stream();
  auto inst = model->create_instance(*cpu, *s, {});
  ASSERT_FALSE(inst.ok());
  EXPECT_EQ(inst.status().code(), StatusCode::unavailable) << inst.status();
  EXPECT_NE(inst.status().message().find("cuda"), std::string_view::npos) << inst.status();
}

}  // namespace
}  // namespace asyncinfer
