#pragma once
/// \file StaticBitwidthScorer and PrecisionTable: EdgeMoE's offline expert-wise bit widths.
///
/// Algorithm (Yi et al., "EdgeMoE: Empowering Sparse Large Language Models on Mobile Devices",
/// §III-B): every expert is stored at a bit width chosen offline (the least important experts at
/// the low width, the rest at the high width, until the accuracy-loss budget is reached; see
/// `tools/bitwidth_search.hpp`). At run time the scorer returns that stored precision for every
/// selected expert and never skips: EdgeMoE chooses no bit width at run time.
///
/// File format of a PrecisionTable (text, UTF-8, `#` starts a comment to the end of the line):
///
///     moekit-precision-table 1
///     layers <n_layers> experts <n_experts>
///     <n_experts precision names for layer 0>      e.g.  q4 q2 q4 q4 q8 q4 q4 q2
///     ...                                          (one line per layer, n_layers lines)
///
/// Precision names are those of `parse_precision` (f32 bf16 f16 q8 q4 q2); `skip` is refused.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// A precision per (layer, expert).
class PrecisionTable {
 public:
  PrecisionTable() = default;
  /// Every expert at `p`.
  PrecisionTable(std::uint32_t n_layers, std::uint32_t n_experts, Precision p = Precision::f16)
      : n_layers_(n_layers), n_experts_(n_experts), p_(std::size_t{n_layers} * n_experts, p) {
    MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0,
                   "PrecisionTable: n_layers and n_experts must be > 0");
    MOEKIT_EXPECTS(p != Precision::skip, "PrecisionTable: 'skip' is not a stored precision");
  }

  [[nodiscard]] std::uint32_t n_layers() const noexcept { return n_layers_; }
  [[nodiscard]] std::uint32_t n_experts() const noexcept { return n_experts_; }
  [[nodiscard]] bool empty() const noexcept { return p_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return p_.size(); }
  [[nodiscard]] bool contains(ExpertKey k) const noexcept {
    return k.layer < n_layers_ && k.expert < n_experts_;
  }
  [[nodiscard]] Precision at(ExpertKey k) const noexcept { return p_[index(k)]; }
  void set(ExpertKey k, Precision p) {
    MOEKIT_EXPECTS(contains(k), "PrecisionTable::set: key outside the table");
    MOEKIT_EXPECTS(p != Precision::skip, "PrecisionTable::set: 'skip' is not a stored precision");
    p_[index(k)] = p;
  }
  /// Number of experts at `p`.
  [[nodiscard]] std::size_t count(Precision p) const noexcept {
    std::size_t n = 0;
    for (Precision q : p_) n += q == p;
    return n;
  }
  [[nodiscard]] std::span<const Precision> all() const noexcept { return p_; }

  /// The table in the documented text format.
  [[nodiscard]] std::string to_text() const {
    std::ostringstream o;
    o << "moekit-precision-table 1\n";
    o << "layers " << n_layers_ << " experts " << n_experts_ << "\n";
    for (std::uint32_t l = 0; l < n_layers_; ++l) {
      for (std::uint32_t e = 0; e < n_experts_; ++e)
        o << (e ? " " : "") << name(p_[std::size_t{l} * n_experts_ + e]);
      o << "\n";
    }
    return o.str();
  }

  /// Parses the documented text format; `source` names the input in errors.
  [[nodiscard]] static PrecisionTable parse(std::string_view text,
                                            std::string_view source = "<memory>") {
    Lines lines(text);
    auto bad = [&](std::size_t line, const std::string& what) {
      detail::fail(ErrorKind::invalid_format,
                   std::string(source) + ":" + std::to_string(line) + ": " + what);
    };
    std::vector<std::string> w;
    std::size_t ln = lines.next(w);
    if (ln == 0) bad(1, "empty file: expected header 'moekit-precision-table 1'");
    if (w.size() != 2 || w[0] != "moekit-precision-table")
      bad(ln, "expected header 'moekit-precision-table 1'");
    if (w[1] != "1") bad(ln, "unsupported version '" + w[1] + "' (this build reads version 1)");
    ln = lines.next(w);
    if (ln == 0) bad(lines.line(), "missing 'layers <n> experts <n>' line");
    std::uint32_t nl = 0, ne = 0;
    if (w.size() != 4 || w[0] != "layers" || w[2] != "experts" || !to_u32(w[1], nl) ||
        !to_u32(w[3], ne) || nl == 0 || ne == 0)
      bad(ln, "expected 'layers <n_layers> experts <n_experts>' with positive counts");
    // Each precision takes at least two bytes of text: a table larger than the text cannot be
    // complete, and is refused before it is allocated (it was an out-of-memory crash of
    // tests/fuzz/fuzz_bitwidth_table).
    if (std::uint64_t{nl} * ne > text.size())
      bad(ln, "'layers " + std::to_string(nl) + " experts " + std::to_string(ne) + "' promises " +
                  std::to_string(std::uint64_t{nl} * ne) + " precisions, more than the " +
                  std::to_string(text.size()) + " bytes of the file can hold");
    PrecisionTable t(nl, ne);
    for (std::uint32_t l = 0; l < nl; ++l) {
      ln = lines.next(w);
      if (ln == 0)
        bad(lines.line(), "field 'layer " + std::to_string(l) + "': missing (the header promises " +
                              std::to_string(nl) + " layers)");
      if (w.size() != ne)
        bad(ln, "field 'layer " + std::to_string(l) + "': " + std::to_string(w.size()) +
                    " precisions, expected " + std::to_string(ne));
      for (std::uint32_t e = 0; e < ne; ++e) {
        const auto p = parse_precision(w[e]);
        if (!p || *p == Precision::skip)
          bad(ln, "field 'layer " + std::to_string(l) + " expert " + std::to_string(e) + "': '" +
                      w[e] + "' is not a stored precision (f32 bf16 f16 q8 q4 q2)");
        t.p_[std::size_t{l} * ne + e] = *p;
      }
    }
    if ((ln = lines.next(w)) != 0) bad(ln, "unexpected content after the last layer");
    return t;
  }

  /// Reads a table file; errors name the file and line.
  [[nodiscard]] static PrecisionTable load(const std::string& path) {
    std::error_code ec;  // a device such as /dev/zero would be read without end
    const auto st = std::filesystem::status(path, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
      detail::fail(ErrorKind::invalid_argument,
                   "PrecisionTable: '" + path + "' is not a regular file (a directory or device)");
    std::ifstream f(path, std::ios::binary);
    if (!f) detail::fail(ErrorKind::io, "PrecisionTable: cannot open '" + path + "'");
    std::ostringstream s;
    s << f.rdbuf();
    return parse(s.str(), path);
  }
  /// Writes the table to `path` (replacing it).
  void save(const std::string& path) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) detail::fail(ErrorKind::io, "PrecisionTable: cannot write '" + path + "'");
    f << to_text();
    if (!f) detail::fail(ErrorKind::io, "PrecisionTable: write to '" + path + "' failed");
  }

  friend bool operator==(const PrecisionTable&, const PrecisionTable&) = default;

 private:
  // Non-blank, comment-stripped lines split into words.
  class Lines {
   public:
    explicit Lines(std::string_view t) : t_(t) {}
    /// Next non-empty line's words; returns its 1-based number, or 0 at the end.
    std::size_t next(std::vector<std::string>& words) {
      while (pos_ < t_.size()) {
        std::size_t end = t_.find('\n', pos_);
        if (end == std::string_view::npos) end = t_.size();
        std::string_view l = t_.substr(pos_, end - pos_);
        pos_ = end + 1;
        ++line_;
        if (auto h = l.find('#'); h != std::string_view::npos) l = l.substr(0, h);
        words.clear();
        std::size_t i = 0;
        while (i < l.size()) {
          while (i < l.size() && is_space(l[i])) ++i;
          std::size_t j = i;
          while (j < l.size() && !is_space(l[j])) ++j;
          if (j > i) words.emplace_back(l.substr(i, j - i));
          i = j;
        }
        if (!words.empty()) return line_;
      }
      return 0;
    }
    [[nodiscard]] std::size_t line() const noexcept { return line_ + 1; }

   private:
    static bool is_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\r'; }
    std::string_view t_;
    std::size_t pos_ = 0;
    std::size_t line_ = 0;
  };
  static bool to_u32(const std::string& s, std::uint32_t& out) noexcept {
    if (s.empty() || s.size() > 9) return false;
    std::uint32_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<std::uint32_t>(c - '0');
    }
    out = v;
    return true;
  }
  [[nodiscard]] std::size_t index(ExpertKey k) const noexcept {
    return std::size_t{k.layer} * n_experts_ + k.expert;
  }

  std::uint32_t n_layers_ = 0;
  std::uint32_t n_experts_ = 0;
  std::vector<Precision> p_;
};

/// EdgeMoE's scorer: each selected expert at its offline-assigned precision; never skips.
class StaticBitwidthScorer {
 public:
  static constexpr std::string_view name = "static-bitwidth";
  struct Config {
    PrecisionTable table{};  ///< per-(layer, expert) precision, e.g. `PrecisionTable::load(path)`
  };
  /// Throws when the table is empty (a default-constructed scorer has no table to apply).
  explicit StaticBitwidthScorer(Config c) : cfg_(std::move(c)) {
    MOEKIT_EXPECTS(!cfg_.table.empty(),
                   "StaticBitwidthScorer: Config.table is empty; load the bit-width file written "
                   "by tools::bitwidth_search");
  }

  /// Throws `moekit::Error` when the layer call lies outside the table (a table for another
  /// model); otherwise writes the stored precision of each demand.
  void score(const LayerContext& ctx, const GateView&, std::span<const ExpertDemand> demands,
             std::span<Precision> out) const {
    for (std::size_t i = 0; i < demands.size(); ++i) {
      const ExpertKey k{ctx.layer, demands[i].expert};
      if (!cfg_.table.contains(k))
        detail::fail(ErrorKind::invalid_argument,
                     "StaticBitwidthScorer: expert (" + std::to_string(k.layer) + ", " +
                         std::to_string(k.expert) + ") is outside the precision table (" +
                         std::to_string(cfg_.table.n_layers()) + " layers x " +
                         std::to_string(cfg_.table.n_experts()) + " experts)");
      out[i] = cfg_.table.at(k);
    }
  }
  /// A scorer over the table file at `path` (see the file comment for the format).
  [[nodiscard]] static StaticBitwidthScorer from_file(const std::string& path) {
    return StaticBitwidthScorer(Config{PrecisionTable::load(path)});
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_;
};
static_assert(Scorer<StaticBitwidthScorer>);

}  // namespace moekit
