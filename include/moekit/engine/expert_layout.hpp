#pragma once
// The words moe-run's --expert-layout and moe-convert's --layout take for where the rows of the
// quantized experts go (moekit::MatrixOrder; the store's manifest names them as panels.hpp does).
#include <optional>
#include <string_view>

#include "moekit/precision/format.hpp"
#include "moekit/precision/row_streaming.hpp"

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

/// Where `--expert-layout auto` puts the rows of quantized experts run with int8 activations, per
/// CPU core: which order the int8 kernels read closer to the streaming bound there, filled from
/// `moekit_bench_row_streaming` runs (its rows and blocked-panels columns, which also print this
/// choice) and `bench/kernels/ggml_peer.sh` (bench/RESULTS.md, "Expert layout per CPU core"):
/// - Zen 5: blocked panels (2-5 points ahead of panels on q4/q2 w2, level on q8; on the AVX2
///   path up to 40 points ahead of rows).
/// - Ice Lake server (Xeon, family 6 model 106): rows, ahead of blocked panels in most cells
///   (q8/q4 at one thread by 7-14 points of the read).
/// - Xeons with AMX (Emerald Rapids, family 6 model 207, and a KVM guest reporting model 167):
///   rows, at four prefetched streams ahead of blocked panels in all 12 cells on both (by 7-52
///   and 16-40 points of the read).
/// - Zen 4 and other cores: not measured in both orders; blocked panels, as before the table
///   (the AVX2 int8 kernels, what CPUs without AVX-512 VNNI run, read them 10-40 points closer
///   to the bound than rows on Zen 5).
/// Float activations read rows only (a float row kernel would gather every panel row), so there
/// auto is always rows.
constexpr moekit::MatrixOrder auto_expert_order(moekit::CpuCore core, bool int8) noexcept {
  if (!int8) return moekit::MatrixOrder::rows;
  switch (core) {
    case moekit::CpuCore::icelake_server:
    case moekit::CpuCore::xeon_amx:
      return moekit::MatrixOrder::rows;
    case moekit::CpuCore::zen4:
    case moekit::CpuCore::zen5:
    case moekit::CpuCore::other:
      break;
  }
  return moekit::MatrixOrder::blocked_panels4;
}

/// The words, for error messages and help texts.
inline constexpr const char* layout_words = "rows, panels, blocked-panels";

}  // namespace moekit::engine
