#include "asyncinfer/future.hpp"

#include "asyncinfer/log.hpp"

#include <atomic>
#include <cstdio>
#include <exception>
#include <stdexcept>

namespace asyncinfer {
namespace {
std::atomic<std::uint64_t> g_callback_exceptions{0};
}  // namespace

std::uint64_t unhandled_callback_exceptions() noexcept {
  return g_callback_exceptions.load(std::memory_order_relaxed);
}

namespace detail {
void report_callback_exception(const char* where, std::exception_ptr e) noexcept {
  const std::uint64_t n = g_callback_exceptions.fetch_add(1, std::memory_order_relaxed) + 1;
  // Report the first few in full, then every 1000th, so a callback that always throws cannot
  // flood stderr; the counter keeps the exact number.
  if (n > 10 && n % 1000 != 0) return;
  const char* what = "unknown exception";
  std::string text;
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    text = ex.what();
    what = text.c_str();
  } catch (...) {
  }
  char buf[1024];
  std::snprintf(buf, sizeof buf, "exception in %s caught and counted (%llu so far): %s", where,
                static_cast<unsigned long long>(n), what);
  log(LogLevel::error, buf);
}
}  // namespace detail
}  // namespace asyncinfer
