// server_log.hpp — the server's log and Triton's logging extension (GET/POST /v2/logging, gRPC
// LogSettings; Triton's docs/protocol/extension_logging.md).
//
// Every line the server writes goes through one ServerLog: the serve command's own lines, the
// model repository's, and the library's messages (asyncinfer::log, installed as its hook). A line
// has a level: info, warning, error, or verbose (the library's debug messages, verbose level 1).
// The settings say which levels are written and how:
//   log_info, log_warning, log_error  (bool, default true)   write lines of that level;
//   log_verbose_level                 (integer >= 0, 0)      write verbose lines up to it;
//   log_format   "default": "<prefix>: <message>", as asyncinfer always wrote; "ISO8601":
//                "<YYYY-MM-DDThh:mm:ssZ> <I|W|E|V> <prefix>: <message>" (UTC), as Triton's
//                ISO8601 format dates its lines;
//   log_file     (read only) "": the lines go to standard error.
// A client changes them while the server runs; a change applies to the next line written.
//
// Thread safety: every member may be called from any thread; write() may run concurrently with
// update() (the settings are atomics; a line is written with one fwrite, under a lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include "asyncinfer/log.hpp"
#include "asyncinfer/status.hpp"
#include "inference_server.hpp"

namespace asyncinfer::server {

class ServerLog {
 public:
  enum class Format : std::uint8_t { default_format, iso8601 };

  /// A snapshot of the settings.
  struct Settings {
    std::string log_file;  ///< "" = standard error
    bool log_info = true;
    bool log_warning = true;
    bool log_error = true;
    std::uint32_t log_verbose_level = 0;
    Format log_format = Format::default_format;
  };

  /// Lines start with `prefix` ("asyncinfer serve") and go to `out` (standard error).
  explicit ServerLog(std::string prefix, std::FILE* out = stderr);

  /// Writes `message` at `level` if the settings let it through (LogLevel::debug is verbose
  /// level 1). Never throws.
  void write(LogLevel level, std::string_view message) noexcept;
  /// write() at the level a repository or serve line says it has: "error" for a line that
  /// reports a model UNAVAILABLE or a failed load, "warning" for one with "warning: ", info
  /// otherwise (those components write plain lines; the words they use mark the level).
  void write_line(std::string_view message) noexcept;

  Settings settings() const;
  /// Applies the settings named in `changes` (the others stay) and returns them all.
  /// invalid_argument naming the setting, and nothing changed, for an unknown name, a value of
  /// the wrong type, a negative log_verbose_level, a log_format other than "default" and
  /// "ISO8601", or any change of log_file (it is read only here).
  Result<Settings> update(const Parameters& changes);

 private:
  const std::string prefix_;
  std::FILE* const out_;
  std::atomic<bool> info_{true};
  std::atomic<bool> warning_{true};
  std::atomic<bool> error_{true};
  std::atomic<std::uint32_t> verbose_{0};
  std::atomic<Format> format_{Format::default_format};
  std::mutex update_mu_;  // one update at a time (all of it or nothing)
  std::mutex write_mu_;   // whole lines
};

/// The settings as Triton's JSON object (every field, Triton's names).
std::string log_settings_json(const ServerLog::Settings& settings);
/// A log_format's name: "default" or "ISO8601".
std::string_view to_string(ServerLog::Format format) noexcept;

}  // namespace asyncinfer::server
