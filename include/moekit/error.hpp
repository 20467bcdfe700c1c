#pragma once
/// \file moekit's exception type and the precondition macro.
///
/// Bad input (files, shapes, flags, budgets) is reported by throwing `moekit::Error`, whose message
/// names what was wrong and where; hot paths are `noexcept` and report through return values.

#include <stdexcept>
#include <string>
#include <string_view>
#include <version>
#if defined(__cpp_lib_source_location)
#include <source_location>
#endif

namespace moekit {

#if defined(__cpp_lib_source_location)
using source_location = std::source_location;
#else
/// Stand-in for std::source_location where the library lacks it (clang 14 with libstdc++ 12,
/// which the fuzz targets use): file and line from the compiler builtins.
class source_location {
 public:
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           unsigned line = __builtin_LINE()) noexcept {
    source_location l;
    l.file_ = file;
    l.line_ = line;
    return l;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr unsigned line() const noexcept { return line_; }

 private:
  const char* file_ = "";
  unsigned line_ = 0;
};
#endif

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
        source_location where = source_location::current())
      : std::runtime_error(message + " [" + where.file_name() + ":" + std::to_string(where.line()) +
                           "]"),
        kind_(kind),
        message_(message),
        where_(where) {}

  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }
  /// The message without the source location.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  [[nodiscard]] const source_location& where() const noexcept { return where_; }

 private:
  ErrorKind kind_;
  std::string message_;
  source_location where_;
};

namespace detail {
[[noreturn]] inline void fail(ErrorKind kind, std::string_view message,
                              source_location where = source_location::current()) {
  throw Error(kind, std::string(message), where);
}
}  // namespace detail

}  // namespace moekit

/// Throws `moekit::Error(invalid_argument, msg)` when `cond` is false. For preconditions on
/// caller-supplied values; never used on hot paths.
#define MOEKIT_EXPECTS(cond, msg)                                                      \
  do {                                                                                 \
    if (!(cond)) ::moekit::detail::fail(::moekit::ErrorKind::invalid_argument, (msg)); \
  } while (false)
