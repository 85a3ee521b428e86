#include "asyncinfer/log.hpp"

#include "asyncinfer/detail/chrono.hpp"
#include "asyncinfer/detail/enum_names.hpp"

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

namespace asyncinfer {
namespace {

/// One installed hook and the calls of it in progress.
struct HookBox {
  LogHook fn;
  int active = 0;  // under g_mu
};

std::mutex g_mu;
std::condition_variable g_idle;
std::shared_ptr<HookBox> g_current;  // null: the default hook; under g_mu

void default_hook(LogLevel level, std::string_view message) {
  std::fprintf(stderr, "asyncinfer: %.*s: %.*s\n", static_cast<int>(to_string(level).size()),
               to_string(level).data(), static_cast<int>(message.size()), message.data());
}

}  // namespace

namespace {
constexpr detail::EnumNames<LogLevel, 4> kLogLevelNames{{"debug", "info", "warning", "error"},
                                                        "log"};
}  // namespace

std::string_view to_string(LogLevel level) noexcept { return kLogLevelNames.name(level); }

void set_log_hook(LogHook hook) {
  std::shared_ptr<HookBox> box;
  if (hook) {
    box = std::make_shared<HookBox>();
    box->fn = std::move(hook);
  }
  std::unique_lock lock(g_mu);
  std::shared_ptr<HookBox> old = std::exchange(g_current, std::move(box));
  if (old) g_idle.wait(lock, [&] { return old->active == 0; });
  // `old` (and what its hook captured) is destroyed here, after its last call returned.
}

void log(LogLevel level, std::string_view message) noexcept {
  std::shared_ptr<HookBox> box;
  {
    std::lock_guard lock(g_mu);
    box = g_current;
    if (box) ++box->active;
  }
  try {
    if (box) {
      box->fn(level, message);
    } else {
      default_hook(level, message);
    }
  } catch (...) {  // a hook must not throw; one that does loses its message, nothing more
  }
  if (box) {
    bool idle = false;
    {
      std::lock_guard lock(g_mu);
      idle = --box->active == 0;
    }
    if (idle) g_idle.notify_all();
  }
}

bool LogLimiter::allow(std::uint64_t* suppressed) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (now - window_start_ >=
      detail::saturating_cast<std::chrono::steady_clock::duration>(period_)) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  if (suppressed != nullptr) *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

void LogLimiter::log(LogLevel level, std::string_view message) {
  std::uint64_t held = 0;
  if (!allow(&held)) return;
  if (held == 0) {
    asyncinfer::log(level, message);
    return;
  }
  std::string text(message);
  text +=
      " (" + std::to_string(held) + " similar message" + (held == 1 ? "" : "s") + " suppressed)";
  asyncinfer::log(level, text);
}

}  // namespace asyncinfer
