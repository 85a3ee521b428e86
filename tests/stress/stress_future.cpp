// 1,000,000 promise/future pairs fulfilled from two threads while a third adds callbacks:
// every callback runs exactly once, whichever side of the race it lands on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "asyncinfer/future.hpp"

namespace asyncinfer {
namespace {

TEST(FutureStress, MillionPairsEveryCallbackExactlyOnce) {
  constexpr std::size_t kPairs = 1'000'000;
  std::vector<Promise<std::uint32_t>> promises(kPairs);
  std::vector<Future<std::uint32_t>> futures;
  futures.reserve(kPairs);
  for (auto& p : promises) futures.push_back(p.get_future());
  std::vector<std::atomic<std::uint8_t>> calls(kPairs);
  std::atomic<std::uint64_t> wrong_values{0};
  std::atomic<bool> go{false};

  auto setter = [&](std::size_t parity) {
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    for (std::size_t i = parity; i < kPairs; i += 2) {
      promises[i].set_value(static_cast<std::uint32_t>(i));
    }
  };
  auto adder = [&] {
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    for (std::size_t i = 0; i < kPairs; ++i) {
      futures[i].on_complete([&, i](const Result<std::uint32_t>& r) {
        if (!r.ok() || *r != i) wrong_values.fetch_add(1, std::memory_order_relaxed);
        calls[i].fetch_add(1, std::memory_order_relaxed);
      });
    }
  };
  {
    std::jthread a(setter, 0), b(setter, 1), c(adder);
    go.store(true, std::memory_order_release);
  }
  std::size_t not_once = 0;
  for (auto& c : calls) not_once += c.load() != 1 ? 1 : 0;
  EXPECT_EQ(not_once, 0u);
  EXPECT_EQ(wrong_values.load(), 0u);
  for (std::size_t i = 0; i < kPairs; i += 99'991) EXPECT_EQ(*futures[i].get(), i);
}

}  // namespace
}  // namespace asyncinfer
