#include "header_forward.hpp"

#include <re2/re2.h>

namespace asyncinfer::server {

Result<std::shared_ptr<const HeaderForward>> HeaderForward::create(std::string_view pattern,
                                                                   std::string_view option) {
  // Triton prefixes "(?i)" to the pattern given on its command line (its command_line_parser.cc).
  auto regex = std::make_unique<re2::RE2>("(?i)" + std::string(pattern), re2::RE2::Quiet);
  if (!regex->ok()) {
    return invalid_argument_error(std::string(option) + " '" + std::string(pattern) +
                                  "' is not a regular expression (RE2 syntax): " + regex->error());
  }
  return std::shared_ptr<const HeaderForward>(new HeaderForward(std::move(regex)));
}

HeaderForward::HeaderForward(std::unique_ptr<re2::RE2> regex) : regex_(std::move(regex)) {}
HeaderForward::~HeaderForward() = default;

bool HeaderForward::matches(std::string_view name) const {
  return re2::RE2::PartialMatch(re2::StringPiece(name.data(), name.size()), *regex_);
}

void HeaderForward::forward(std::string_view name, std::string_view value,
                            Parameters& parameters) const {
  if (!matches(name) || parameters.find(name) != parameters.end()) return;
  parameters.emplace(std::string(name), std::string(value));
}

}  // namespace asyncinfer::server
