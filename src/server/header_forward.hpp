// header_forward.hpp — Triton's header forwarding (`--http-header-forward-pattern`,
// `--grpc-header-forward-pattern`; Triton's docs/protocol/extension_parameters.md, "Forwarding
// HTTP/GRPC Headers as Parameters"): the request headers (gRPC metadata) whose name matches a
// pattern reach the model as string request parameters of the same name, beside the request's
// own parameters.
//
// The pattern is an RE2 regular expression matched anywhere in the name (RE2::PartialMatch), case
// insensitive unless it turns that off itself ("(?-i)MY_HEADER.*"), as Triton's command line makes
// it. A forwarded header does not replace a parameter the request gives itself.
//
// Thread safety: immutable once made; forward() may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "asyncinfer/status.hpp"
#include "inference_server.hpp"

namespace re2 {
class RE2;
}

namespace asyncinfer::server {

class HeaderForward {
 public:
  /// The forwarding of `pattern`, given to option `option` ("--http-header-forward-pattern").
  /// invalid_argument naming the option, the pattern and RE2's reason when it does not compile.
  static Result<std::shared_ptr<const HeaderForward>> create(std::string_view pattern,
                                                             std::string_view option);
  ~HeaderForward();
  HeaderForward(const HeaderForward&) = delete;
  HeaderForward& operator=(const HeaderForward&) = delete;

  /// True when a header named `name` is forwarded.
  bool matches(std::string_view name) const;
  /// Adds header `name` with `value` to `parameters` as a string parameter when it matches and
  /// the request has no parameter of that name.
  void forward(std::string_view name, std::string_view value, Parameters& parameters) const;

 private:
  explicit HeaderForward(std::unique_ptr<re2::RE2> regex);
  std::unique_ptr<re2::RE2> regex_;
};

}  // namespace asyncinfer::server
