#pragma once
// The words moe-run's --expert-layout and moe-convert's --layout take for where the rows of the
// quantized experts go (moekit::MatrixOrder; the store's manifest names them as panels.hpp does).
#include <optional>
#include <string_view>

#include "moekit/precision/format.hpp"

namespace moekit::engine {

/// "rows", "panels" (MatrixOrder::panels4) or "blocked-panels" (MatrixOrder::blocked_panels4).
constexpr const char* layout_word(moekit::MatrixOrder o) noexcept {
  switch (o) {
    case moekit::MatrixOrder::panels4:
      return "panels";
    case moekit::MatrixOrder::blocked_panels4:
      return "blocked-panels";
    case moekit::MatrixOrder::rows:
      break;
  }
  return "rows";
}

/// The order a layout word names; nullopt for any other word.
constexpr std::optional<moekit::MatrixOrder> parse_layout_word(std::string_view w) noexcept {
  for (auto o : {moekit::MatrixOrder::rows, moekit::MatrixOrder::panels4,
                 moekit::MatrixOrder::blocked_panels4})
    if (w == layout_word(o)) return o;
  return std::nullopt;
}

/// The words, for error messages and help texts.
inline constexpr const char* layout_words = "rows, panels, blocked-panels";

}  // namespace moekit::engine
