// status.hpp — the one error model of asyncinfer.
//
// Design: every fallible call returns a `Status` (no value) or a `Result<T>` (a value or a
// non-ok Status). Asynchronous errors travel inside a `Future<T>` as the same `Result<T>`.
// Exceptions are used only at the edges (CLI, config parsing, libtorch), where they are caught
// and turned into a Status. The codes follow gRPC / absl::StatusCode, so users of Triton or
// ONNX Runtime recognise them.
//
// Invariants:
//   - an ok Status carries no message; a non-ok Status always carries one (an empty message is
//     replaced by a generic text naming the code, so nothing reaches a user silently);
//   - a Result<T> holds exactly one of a T or a non-ok Status (constructing one from an ok
//     Status is a programming error and aborts with file:line);
//   - Status is cheap to copy: the message is a reference-counted immutable string.
//
// Thread safety: Status and Result are values; distinct objects may be used from any thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace asyncinfer {

/// Error codes (numbering and meaning follow absl::StatusCode / gRPC where they overlap).
enum class StatusCode : std::uint8_t {
  ok = 0,
  cancelled,            ///< The caller (or a cancel call) gave the operation up.
  invalid_argument,     ///< Bad input: never retried.
  deadline_exceeded,    ///< The deadline or timeout passed first.
  not_found,            ///< Unknown, expired or evicted id; missing file.
  already_exists,       ///< A live request already has this id.
  resource_exhausted,   ///< Queue full, capacity reached, admission refused, device out of memory.
  failed_precondition,  ///< The object is not in a state that allows the call.
  aborted,              ///< Ended by shutdown before it could run.
  unavailable,          ///< Transient: device busy or not present; retryable by default.
  internal,             ///< A broken invariant, an exception, a broken promise.
};

/// Lower-case name of a code, e.g. "deadline_exceeded". Never fails.
std::string_view to_string(StatusCode code) noexcept;

/// Parses a code name as printed by to_string(). Returns false for an unknown name.
bool parse_status_code(std::string_view name, StatusCode* out) noexcept;

/// The outcome of an operation: a code and, when not ok, a message for a person.
class [[nodiscard]] Status {
 public:
  /// An ok status.
  Status() noexcept = default;
  /// A status with `code`; when `code` is not ok, `message` should say what was wrong and what
  /// was expected. An empty message is replaced by "<code> (no detail given)".
  Status(StatusCode code, std::string_view message);

  bool ok() const noexcept { return code_ == StatusCode::ok; }
  StatusCode code() const noexcept { return code_; }
  /// The message; empty for an ok status. Valid while this Status (or a copy) lives.
  std::string_view message() const noexcept {
    return message_ ? std::string_view(*message_) : std::string_view();
  }
  /// "code: message", or "ok".
  std::string to_string() const;
  /// A copy with "context: " put before the message; an ok status is returned unchanged.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) noexcept {
    return a.code_ == b.code_ && a.message() == b.message();
  }

 private:
  StatusCode code_ = StatusCode::ok;
  std::shared_ptr<const std::string> message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);
std::ostream& operator<<(std::ostream& os, StatusCode code);

/// Shorthands for the common codes.
Status invalid_argument_error(std::string_view message);
Status not_found_error(std::string_view message);
Status already_exists_error(std::string_view message);
Status resource_exhausted_error(std::string_view message);
Status deadline_exceeded_error(std::string_view message);
Status cancelled_error(std::string_view message);
Status unavailable_error(std::string_view message);
Status failed_precondition_error(std::string_view message);
Status internal_error(std::string_view message);
Status aborted_error(std::string_view message);

namespace detail {
/// Logs "check failed at file:line: what" (log.hpp; stderr by default) and aborts. Used for broken
/// invariants (programming errors), never for bad input.
[[noreturn]] void check_failed(const char* file, int line, const char* what) noexcept;
/// Returns the ok Status object used by Result<T>::status() when a value is held.
const Status& ok_status() noexcept;
}  // namespace detail

/// Aborts with file:line when `cond` is false. For invariants, never for user input.
#define ASYNCINFER_CHECK(cond)                                                  \
  do {                                                                          \
    if (!(cond)) ::asyncinfer::detail::check_failed(__FILE__, __LINE__, #cond); \
  } while (false)

/// A value of type T or a non-ok Status.
template <class T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>,
                "Result<Status> is ambiguous: return Status, or wrap it in a struct");

 public:
  using value_type = T;

  Result(T value) : v_(std::in_place_index<1>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::in_place_index<0>, std::move(status)) {  // NOLINT: implicit
    if (std::get<0>(v_).ok()) {
      detail::check_failed(__FILE__, __LINE__, "Result constructed from an ok Status");
    }
  }
  template <class... Args>
  explicit Result(std::in_place_t, Args&&... args)
      : v_(std::in_place_index<1>, std::forward<Args>(args)...) {}

  bool ok() const noexcept { return v_.index() == 1; }
  /// The error, or an ok Status when a value is held.
  const Status& status() const noexcept { return ok() ? detail::ok_status() : std::get<0>(v_); }

  /// The value. Calling these on an error is a programming error: aborts with the status.
  T& value() & {
    check_value();
    return std::get<1>(v_);
  }
  const T& value() const& {
    check_value();
    return std::get<1>(v_);
  }
  T&& value() && {
    check_value();
    return std::get<1>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The value, or `fallback` when this holds an error.
  T value_or(T fallback) const& { return ok() ? std::get<1>(v_) : std::move(fallback); }

 private:
  void check_value() const {
    if (!ok()) {
      std::string what = "Result::value() on an error: " + std::get<0>(v_).to_string();
      detail::check_failed(__FILE__, __LINE__, what.c_str());
    }
  }
  std::variant<Status, T> v_;
};

#define ASYNCINFER_CONCAT_INNER_(a, b) a##b
#define ASYNCINFER_CONCAT_(a, b) ASYNCINFER_CONCAT_INNER_(a, b)

/// Returns the Status of `expr` from the enclosing function when it is not ok.
#define ASYNCINFER_RETURN_IF_ERROR(expr)                     \
  do {                                                       \
    ::asyncinfer::Status asyncinfer_status_ = (expr);        \
    if (!asyncinfer_status_.ok()) return asyncinfer_status_; \
  } while (false)

/// `lhs = value of expr` (a Result), or returns its Status from the enclosing function.
#define ASYNCINFER_ASSIGN_OR_RETURN(lhs, expr)                        \
  auto ASYNCINFER_CONCAT_(asyncinfer_result_, __LINE__) = (expr);     \
  if (!ASYNCINFER_CONCAT_(asyncinfer_result_, __LINE__).ok())         \
    return ASYNCINFER_CONCAT_(asyncinfer_result_, __LINE__).status(); \
  lhs = std::move(ASYNCINFER_CONCAT_(asyncinfer_result_, __LINE__)).value()

}  // namespace asyncinfer
