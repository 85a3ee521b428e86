// Article §5.2 — retries.
//
// The article sleeps a fixed second in the caller's thread and retries every error. Here the
// RetryPolicy retries only retryable codes, with exponential backoff and full jitter, waits on
// the engine's timer (no worker sleeps), never past the deadline, within a retry budget, and the
// final error says how many attempts were made.
#include <cstdio>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

int main() {
  EngineOptions options;
  options.retry.max_attempts = 3;  // max_retries=3
  options.retry.initial_backoff = 2ms;
  options.retry.max_backoff = 50ms;
  auto one = [] { return Inputs{*Tensor::zeros(DType::f32, {1, 4})}; };

  // A device that is busy for its first two calls, then recovers.
  auto flaky = Engine::create(*load_model("builtin:faulty?code=unavailable&first=2&shape=4"),
                              *open_device("sim"), options);
  auto r1 = (*flaky)->infer(one());
  std::printf("busy twice, then fine: %s after %llu attempts\n", r1.ok() ? "ok" : "failed",
              static_cast<unsigned long long>((*flaky)->metrics().attempts));

  // A device that stays busy: exactly max_attempts, and the error says so.
  auto busy = Engine::create(*load_model("builtin:faulty?code=unavailable&shape=4"),
                             *open_device("sim"), options);
  auto r2 = (*busy)->infer(one());
  std::printf("always busy: %s\n", r2.status().to_string().c_str());

  // A bad request is never retried.
  auto bad = Engine::create(*load_model("builtin:faulty?code=invalid_argument&shape=4"),
                            *open_device("sim"), options);
  auto r3 = (*bad)->infer(one());
  std::printf("bad request, attempts made: %llu (never retried): %s\n",
              static_cast<unsigned long long>((*bad)->metrics().attempts),
              r3.status().to_string().c_str());
  return r1.ok() && (*busy)->metrics().attempts == 3 && (*bad)->metrics().attempts == 1 ? 0 : 1;
}
