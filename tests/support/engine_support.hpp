// Helpers for engine tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
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

}  // namespace asyncinfer::testing
