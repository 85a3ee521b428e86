// Backends by capability and backends that register themselves: the engine chooses its inline path
// and where completion points run from DeviceCapabilities (never the device's kind), the
// registries list what this build has (src/backends.cpp), and an application can add a device
// backend at run time (register_device_backend).
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "device/backend.hpp"
#include "device/host_stream.hpp"
#include "model/backend.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::get_within;
using testing::this_thread_name;

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// A device of no built-in kind (it says npu, which no backend here is) that reports the given
/// capabilities and does its work on a cpu device. Offers caller-run streams (the cpu device's)
/// only when it reports them.
class CapsDevice final : public Device, public detail::CallerRunStreams {
 public:
  CapsDevice(std::shared_ptr<Device> inner, DeviceCapabilities caps) : inner_(std::move(inner)) {
    info_ = inner_->info();
    info_.name = "caps";
    info_.kind = DeviceKind::npu;
    info_.capabilities = caps;
  }
  const DeviceInfo& info() const noexcept override { return info_; }
  Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options) override {
    return inner_->create_stream(options);
  }
  Result<std::unique_ptr<Event>> create_event(const EventOptions& options) override {
    return inner_->create_event(options);
  }
  Result<std::shared_ptr<Storage>> allocate(std::size_t bytes, MemoryKind kind) override {
    return inner_->allocate(bytes, kind);
  }
  Executor& host_func_executor() noexcept override { return inner_->host_func_executor(); }
  std::unique_ptr<detail::HostStream> create_caller_run_stream(
      const StreamOptions& options) override {
    return detail::create_caller_run_stream(*inner_, options);
  }

 private:
  std::shared_ptr<Device> inner_;
  DeviceInfo info_;
};

std::shared_ptr<Device> caps_device(bool caller_run, bool host_funcs_may_call_device) {
  auto cpu = open_device("cpu");
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return nullptr;
  DeviceCapabilities caps;
  caps.caller_run_streams = caller_run;
  caps.host_funcs_may_call_device = host_funcs_may_call_device;
  caps.host_addressable_memory = true;
  return std::make_shared<CapsDevice>(*cpu, caps);
}

/// Where the kernels of 10 requests to a probe model and their inline callbacks (which run where
/// the completion point runs) ran on `device` with `options` (1 worker).
struct Threads {
  std::vector<std::string> kernels;
  std::vector<std::string> callbacks;
};

Threads run_on(const std::shared_ptr<Device>& device, EngineOptions options = {}) {
  Threads out;
  std::mutex mu;
  auto model = load_model("builtin:identity");
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok() || !device) return out;
  options.workers = 1;
  auto engine = Engine::create(*model, device, std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return out;
  RequestOptions ro;
  ro.inline_callback = true;
  std::vector<Promise<int>> called(10);
  std::vector<Future<int>> done;
  for (int i = 0; i < 10; ++i) {
    auto t = Tensor::zeros(DType::f32, {1, 4});
    EXPECT_TRUE(t.ok());
    done.push_back(called[static_cast<std::size_t>(i)].get_future());
    EXPECT_TRUE((*engine)
                    ->submit(
                        {*t},
                        [&, i](const Result<Outputs>& r) {
                          EXPECT_TRUE(r.ok()) << r.status();
                          {
                            std::lock_guard lock(mu);
                            out.callbacks.push_back(this_thread_name());
                          }
                          called[static_cast<std::size_t>(i)].set_value(i);
                        },
                        ro)
                    .ok());
  }
  for (auto& f : done) EXPECT_TRUE(get_within(f, 10s).ok());
  (*engine)->shutdown();
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

TEST(Capabilities, BuiltInDevicesReportWhatTheEngineAndModelsRelyOn) {
  auto cpu = open_device("cpu");
  auto sim = open_device("sim");
  ASSERT_TRUE(cpu.ok() && sim.ok());
  const DeviceCapabilities& c = (*cpu)->capabilities();
  EXPECT_TRUE(c.caller_run_streams);
  EXPECT_TRUE(c.host_funcs_may_call_device);
  EXPECT_TRUE(c.host_addressable_memory);
  EXPECT_TRUE((*cpu)->info().unified_memory);
  const DeviceCapabilities& s = (*sim)->capabilities();
  EXPECT_FALSE(s.caller_run_streams);
  EXPECT_TRUE(s.host_funcs_may_call_device);
  EXPECT_TRUE(s.host_addressable_memory);
  EXPECT_FALSE((*sim)->info().unified_memory);
  // The defaults are the conservative (cuda-like) answers.
  const DeviceCapabilities none;
  EXPECT_FALSE(none.caller_run_streams || none.host_funcs_may_call_device ||
               none.host_addressable_memory);
}

TEST(Capabilities, CallerRunStreamsOnlyFromADeviceThatReportsThem) {
  StreamOptions so;
  EXPECT_NE(detail::create_caller_run_stream(*caps_device(true, true), so), nullptr);
  // Implements CallerRunStreams but does not report it: none.
  EXPECT_EQ(detail::create_caller_run_stream(*caps_device(false, true), so), nullptr);
}

TEST(Capabilities, TheInlinePathFollowsCallerRunStreamsNotTheKind) {
  // A device of another kind that can run streams on the caller: the worker runs the batch and,
  // since its thread may call the device, the completion point too.
  const Threads inline_path = run_on(caps_device(true, true));
  ASSERT_EQ(inline_path.callbacks.size(), 10u);
  for (const auto& t : inline_path.callbacks) EXPECT_TRUE(starts_with(t, "ai-worker-")) << t;
  // The same device with a hang watchdog: the engine declines the inline path.
  EngineOptions watchdog;
  watchdog.watchdog = 10s;
  const Threads guarded = run_on(caps_device(true, true), watchdog);
  ASSERT_EQ(guarded.callbacks.size(), 10u);
  for (const auto& t : guarded.callbacks) EXPECT_TRUE(starts_with(t, "ai-w0-stream")) << t;
  // No caller-run streams: the stream's own thread.
  const Threads own = run_on(caps_device(false, true));
  ASSERT_EQ(own.callbacks.size(), 10u);
  for (const auto& t : own.callbacks) EXPECT_TRUE(starts_with(t, "ai-w0-stream")) << t;
}

TEST(Capabilities, CompletionPointsLeaveAThreadThatMustNotCallTheDevice) {
  // Host functions may not call the device (cuda's case): the dispatcher runs the completion
  // point, whether the stream has its own thread or runs on the worker.
  for (const bool caller_run : {false, true}) {
    const Threads t = run_on(caps_device(caller_run, false));
    ASSERT_EQ(t.callbacks.size(), 10u) << caller_run;
    for (const auto& name : t.callbacks) {
      EXPECT_TRUE(starts_with(name, "ai-dispatch")) << caller_run << ": " << name;
    }
  }
}

// ---- registries --------------------------------------------------------------------------------

TEST(Registries, ListWhatThisBuildHas) {
  const auto devices = device_backends();
  ASSERT_GE(devices.size(), 2u);
  EXPECT_EQ(devices[0], "cpu");  // the order src/backends.cpp registers them in
  EXPECT_EQ(devices[1], "sim");
  EXPECT_EQ(has(devices, "cuda"), ASYNCINFER_TEST_HAVE_CUDA != 0);
  EXPECT_FALSE(has(devices, "npu"));

  const auto models = model_backends();
  for (const char* k :
       {"builtin:identity", "builtin:fixed_cost", "builtin:faulty", "builtin:stream"}) {
    EXPECT_TRUE(has(models, k)) << k;
  }
  EXPECT_EQ(has(models, "builtin:gemm"), ASYNCINFER_TEST_HAVE_CUDA != 0);
  EXPECT_EQ(has(models, "torch"), ASYNCINFER_TEST_HAVE_TORCH != 0);
  EXPECT_EQ(has(models, "openvino"), ASYNCINFER_TEST_HAVE_OPENVINO != 0);
  EXPECT_EQ(has(models, "python"), ASYNCINFER_TEST_HAVE_PYTHON_BACKEND != 0);
}

TEST(Registries, AnApplicationAddsItsOwnDeviceBackend) {
  std::atomic<int> opened{0};
  std::string args_seen;
  ASSERT_TRUE(
      register_device_backend("appdev", "appdev or appdev:<anything>",
                              [&](std::string_view args) -> Result<std::shared_ptr<Device>> {
                                ++opened;
                                args_seen = std::string(args);
                                if (args == "broken")
                                  return unavailable_error("appdev: broken on purpose");
                                return caps_device(false, true);
                              })
          .ok());
  EXPECT_TRUE(has(device_backends(), "appdev"));
  EXPECT_EQ(device_backends().back(), "appdev");

  auto d = open_device("appdev:unit7");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(args_seen, "unit7");
  EXPECT_EQ((*d)->name(), "caps");
  auto bad = open_device("appdev:broken");
  EXPECT_EQ(bad.status().code(), StatusCode::unavailable);
  EXPECT_NE(bad.status().message().find("open_device(\"appdev:broken\")"), std::string::npos)
      << bad.status();
  EXPECT_EQ(opened.load(), 2);

  // An unknown device's error lists the new backend's usage with the built-in ones.
  auto unknown = open_device("nosuchdev");
  EXPECT_EQ(unknown.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(unknown.status().message().find("appdev or appdev:<anything>"), std::string::npos)
      << unknown.status();

  // The engine drives it by its capabilities.
  const Threads t = run_on(*d);
  EXPECT_EQ(t.callbacks.size(), 10u);
}

TEST(Registries, RegisteringRefusesBadOrTakenNames) {
  auto opener = [](std::string_view) -> Result<std::shared_ptr<Device>> {
    return open_device("cpu");
  };
  EXPECT_EQ(register_device_backend("cpu", "cpu", opener).code(), StatusCode::already_exists);
  EXPECT_EQ(register_device_backend("", "", opener).code(), StatusCode::invalid_argument);
  EXPECT_EQ(register_device_backend("a:b", "", opener).code(), StatusCode::invalid_argument);
  EXPECT_EQ(register_device_backend("nofn", "", nullptr).code(), StatusCode::invalid_argument);
  ASSERT_TRUE(register_device_backend("twice", "twice", opener).ok());
  EXPECT_EQ(register_device_backend("twice", "twice", opener).code(), StatusCode::already_exists);
  EXPECT_FALSE(has(device_backends(), "nofn"));
  // The opener may open another device (it runs without the registry's lock held).
  auto d = open_device("twice");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "cpu");
}

TEST(Registries, ModelBackendsAreUniqueByKind) {
  auto& registry = detail::ModelBackendRegistry::instance();
  auto loader = [](std::string_view, std::string_view,
                   const ModelOptions& o) -> Result<std::shared_ptr<Model>> {
    return load_model("builtin:identity", o);
  };
  const Status taken = registry.add({"builtin:identity", "builtin:identity", loader});
  EXPECT_EQ(taken.code(), StatusCode::already_exists);
  EXPECT_NE(taken.message().find("model backend 'builtin:identity' is already registered"),
            std::string::npos)
      << taken;
  EXPECT_EQ(registry.add({"", "", loader}).code(), StatusCode::invalid_argument);
  EXPECT_EQ(registry.add({"test:nofn", "", nullptr}).code(), StatusCode::invalid_argument);
  ASSERT_TRUE(registry.add({"test:alias", "test:alias", loader}).ok());
  EXPECT_EQ(registry.add({"test:alias", "test:alias", loader}).code(), StatusCode::already_exists);
  const auto kinds = registry.snapshot();
  EXPECT_EQ(std::count_if(kinds.begin(), kinds.end(),
                          [](const detail::ModelBackend& b) { return b.kind == "test:alias"; }),
            1);
}

}  // namespace
}  // namespace asyncinfer
