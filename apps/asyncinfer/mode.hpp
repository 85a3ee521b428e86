// mode.hpp — how a command drives the engine, as an enum: the modes of `asyncinfer bench` and
// `asyncinfer run`. Parsed once from the command line (parse_mode); everything after compares
// enum values, and to_string gives the name back for tables, JSON and CSV.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "asyncinfer/status.hpp"

namespace asyncinfer::cli {

enum class Mode : std::uint8_t {
  sync,      ///< one caller, Engine::infer, one request at a time
  async,     ///< closed loop: a fixed number of requests in flight
  rate,      ///< open loop: requests sent at a given rate
  sweep,     ///< bench: one of the above at several points
  pipeline,  ///< bench --stages: the stages overlapped
};

/// "sync", "async", "rate", "sweep", "pipeline".
std::string_view to_string(Mode mode) noexcept;

/// `text` as one of `allowed`. invalid_argument "<option>: unknown mode '<text>'; expected one of
/// <allowed, in that order>" otherwise.
Result<Mode> parse_mode(std::string_view text, std::string_view option,
                        std::initializer_list<Mode> allowed);

/// The modes of a single bench run (not sweep).
inline constexpr std::initializer_list<Mode> kRunModes = {Mode::sync, Mode::async, Mode::rate,
                                                          Mode::pipeline};
/// Every mode --mode accepts.
inline constexpr std::initializer_list<Mode> kAllModes = {Mode::sync, Mode::async, Mode::rate,
                                                          Mode::sweep, Mode::pipeline};

}  // namespace asyncinfer::cli
