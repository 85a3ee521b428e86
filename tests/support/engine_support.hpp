// Helpers for engine tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/engine.hpp"
#include "test_support.hpp"

namespace asyncinfer::testing {

inline std::unique_ptr<Engine> make_engine(const std::string& model_uri,
                                           const std::string& device_spec = "cpu",
                                           EngineOptions options = {}) {
  auto model = load_model(model_uri);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  auto device = open_device(device_spec);
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return nullptr;
  auto engine = Engine::create(*model, *device, std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  return std::move(*engine);
}

/// A [rows, cols] f32 tensor whose first element of row r is `first + r`, the rest 0.5 × index.
inline Tensor rows_tensor(std::int64_t rows, std::int64_t cols, float first) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i);
  for (std::int64_t r = 0; r < rows; ++r)
    v[static_cast<std::size_t>(r * cols)] = first + static_cast<float>(r);
  return *Tensor::from_values<float>({rows, cols}, v);
}

/// One-input f32 [1, cols] request whose first element is `value`.
inline Inputs one(float value, std::int64_t cols = 4) { return {rows_tensor(1, cols, value)}; }

inline float first_value(const Outputs& out) { return out.at(0).data_as<float>()[0]; }

/// Requests that ended, by any terminal state.
inline std::uint64_t ended_requests(const EngineMetrics& m) {
  return m.completed + m.failed + m.timed_out + m.cancelled + m.shut_down;
}

/// Every accepted request ended exactly once and nothing is left anywhere.
inline void expect_all_ended_once(const EngineMetrics& m, const std::string& what = "") {
  EXPECT_EQ(ended_requests(m), m.submitted)
      << what << ": submitted " << m.submitted << " completed " << m.completed << " failed "
      << m.failed << " timed_out " << m.timed_out << " cancelled " << m.cancelled << " shut_down "
      << m.shut_down;
  EXPECT_EQ(m.inflight_requests, 0) << what;
  EXPECT_EQ(m.queue_depth, 0) << what;
  EXPECT_EQ(m.retry_waiting, 0) << what;
  EXPECT_EQ(m.ordered_backlog_total, 0) << what;
}

/// Runs `fn` and returns the milliseconds it took; when it has not returned within `limit` the
/// test cannot go on (the call hangs): it reports the failure and ends the process, so ctest
/// sees a failure instead of a hang.
inline double must_return_within(std::chrono::milliseconds limit, const std::string& what,
                                 std::function<void()> fn) {
  const auto t0 = std::chrono::steady_clock::now();
  std::packaged_task<void()> task(std::move(fn));
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not return within " << limit.count() << " ms";
    std::fprintf(stderr, "FATAL: %s hangs; ending the test process\n", what.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  runner.join();
  done.get();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace asyncinfer::testing
