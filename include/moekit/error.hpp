#pragma once
/// \file moekit's exception type and the precondition macro.
///
/// Bad input (files, shapes, flags, budgets) is reported by throwing `moekit::Error`, whose message
/// names what was wrong and where; hot paths are `noexcept` and report through return values.

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moekit {

/// What kind of failure an `Error` reports, so callers can branch without parsing messages.
enum class ErrorKind {
  invalid_argument,  ///< a parameter, flag or budget that cannot work
  invalid_format,    ///< a file whose bytes do not follow its format
  io,                ///< the operating system failed a read or write
  checksum,          ///< stored bytes do not match their recorded checksum
  unsupported,       ///< a valid request that this build or format does not support
  internal,          ///< a broken invariant inside moekit (a bug)
};

/// The exception moekit throws. `what()` reads "<message> [file:line]".
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message,
        std::source_location where = std::source_location::current())
      : std::runtime_error(message + " [" + where.file_name() + ":" +
                           std::to_string(where.line()) + "]"),
        kind_(kind),
        message_(message),
        where_(where) {}

  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }
  /// The message without the source location.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  [[nodiscard]] const std::source_location& where() const noexcept { return where_; }

 private:
  ErrorKind kind_;
  std::string message_;
  std::source_location where_;
};

namespace detail {
[[noreturn]] inline void fail(ErrorKind kind, std::string_view message,
                              std::source_location where = std::source_location::current()) {
  throw Error(kind, std::string(message), where);
}
}  // namespace detail

}  // namespace moekit

/// Throws `moekit::Error(invalid_argument, msg)` when `cond` is false. For preconditions on
/// caller-supplied values; never used on hot paths.
#define MOEKIT_EXPECTS(cond, msg)                                                  \
  do {                                                                             \
    if (!(cond)) ::moekit::detail::fail(::moekit::ErrorKind::invalid_argument, (msg)); \
  } while (false)
