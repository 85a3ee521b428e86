// log.hpp — where the library's messages go: one hook that users can redirect.
//
// Design: the library never writes to stderr itself. Every message (a worker that cannot get a
// model instance, a failure that arrived after its request had ended, an exception caught from
// a user callback, a broken invariant just before the abort) goes through log(), which calls the
// installed LogHook — by default one that writes "asyncinfer: <level>: <message>" to stderr.
// A server sends them to its own logger instead (set_log_hook), a test captures them, and
// set_log_hook(nullptr) restores the default. Messages that can repeat at the rate of requests
// are rate-limited where they are raised (LogLimiter), so a failing model cannot flood a log;
// the counts of what happened live in the metrics, not in the log.
//
// Thread safety: log() and set_log_hook() may be called from any thread at any time. The hook is
// called concurrently from library threads (workers, stream threads, the timer, completion
// threads) with no library lock held; it must be quick and must not throw (an exception is
// swallowed). Replacing the hook waits for calls of the old one in progress to return, so once
// set_log_hook returns the old hook is no longer running; do not call set_log_hook from inside
// the hook.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>

namespace asyncinfer {

enum class LogLevel : std::uint8_t { debug, info, warning, error };
std::string_view to_string(LogLevel level) noexcept;

/// Receives one message (no trailing newline). Called from library threads; see above.
using LogHook = std::function<void(LogLevel level, std::string_view message)>;

/// Installs `hook` for every message of the library (null: the default, stderr). Returns when
/// no call of the previous hook is still running.
void set_log_hook(LogHook hook);

/// Sends `message` to the hook. Never throws.
void log(LogLevel level, std::string_view message) noexcept;

/// Lets through at most `burst` messages per `period`; what it holds back is counted and
/// reported with the next message let through ("... (12 similar messages suppressed)").
///
/// Thread safety: allow() is thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(int burst = 5,
                      std::chrono::milliseconds period = std::chrono::milliseconds(1000))
      : burst_(burst), period_(period) {}

  /// True when a message may be logged now; `suppressed` receives how many were held back
  /// since the last one let through.
  bool allow(std::uint64_t* suppressed);
  /// log(level, message) when allow(), with the count held back appended.
  void log(LogLevel level, std::string_view message);

 private:
  const int burst_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_{};
  int in_window_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace asyncinfer
