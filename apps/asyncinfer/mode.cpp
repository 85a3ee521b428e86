// The modes of the tool's commands (mode.hpp).
#include "mode.hpp"

#include <string>

namespace asyncinfer::cli {

std::string_view to_string(Mode mode) noexcept {
  switch (mode) {
    case Mode::sync:
      return "sync";
    case Mode::async:
      return "async";
    case Mode::rate:
      return "rate";
    case Mode::sweep:
      return "sweep";
    case Mode::pipeline:
      return "pipeline";
  }
  return "unknown";
}

Result<Mode> parse_mode(std::string_view text, std::string_view option,
                        std::initializer_list<Mode> allowed) {
  std::string names;
  for (Mode m : allowed) {
    if (to_string(m) == text) return m;
    names += (names.empty() ? "" : ", ") + std::string(to_string(m));
  }
  std::string message(option);
  message += ": unknown mode '";
  message.append(text);
  message += "'; expected one of " + names;
  return invalid_argument_error(message);
}

}  // namespace asyncinfer::cli
