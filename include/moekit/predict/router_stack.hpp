#pragma once
/// \file RouterStack: the routers of every MoE layer, shared by the gate predictors (HOBBIT's
/// stacked gate, Fate's cross-layer gate) — validation, the gate-input check and the product of
/// the routers of consecutive layers with a gate input.
///
/// The routers are given as one f32 matrix [L·E × d] (row l·E + e = expert e of layer l) and
/// copied once into panels of 8 rows (per layer, padded to a multiple of 8 rows and 16 columns,
/// 64-byte aligned), so the routers of layers l+1..l+p are consecutive panels and the stacked
/// product (HOBBIT §3.3) is one sequential pass over them: the weights are read once and x once
/// per 16-column chunk of a panel. Each panel is computed the same way whichever stack it is part
/// of, so a stacked product equals the p single products bit for bit. Several tokens: per panel,
/// every token (the panel stays in cache between tokens). Nothing allocates per call once the
/// output vector has its size.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/error.hpp"
#include "moekit/precision/isa.hpp"
#include "moekit/predict/detail/router_panels.hpp"

namespace moekit {

/// The routers of all MoE layers, packed for stacked products (see the file comment). Owns its
/// packed copy: the source matrix need not outlive it.
class RouterStack {
 public:
  RouterStack() = default;

  /// Validates and packs `weights` ([n_layers · n_experts · hidden] f32, row-major). `who` names
  /// the component in errors, which name its `Config` field. `isa` forces a kernel path (it must
  /// be supported); default: the best this CPU has.
  RouterStack(std::span<const float> weights, std::uint32_t n_layers, std::uint32_t n_experts,
              std::uint32_t hidden, const char* who, std::optional<Isa> isa = std::nullopt)
      : who_(who), n_layers_(n_layers), n_experts_(n_experts), hidden_(hidden) {
    const std::string w(who);
    MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0 && hidden > 0,
                   w + ": Config.n_layers, n_experts and hidden must be > 0");
    MOEKIT_EXPECTS(weights.size() == std::size_t{n_layers} * n_experts * hidden,
                   w + ": Config.router_weights must hold n_layers x n_experts x hidden = " +
                       std::to_string(std::size_t{n_layers} * n_experts * hidden) +
                       " floats (got " + std::to_string(weights.size()) + ")");
    set_isa(isa.value_or(detect_isa()));
    panels_ = (n_experts + detail::panel_rows - 1) / detail::panel_rows;
    chunks_ = (std::size_t{hidden} + 15) / 16;
    packed_.assign(std::size_t{n_layers} * panels_ * chunks_ * detail::panel_rows,
                   detail::RouterChunk{});
    for (std::uint32_t l = 0; l < n_layers; ++l)
      for (std::uint32_t e = 0; e < n_experts; ++e) {
        const float* src = weights.data() + (std::size_t{l} * n_experts + e) * hidden;
        detail::RouterChunk* panel = panel_at(l, e / detail::panel_rows);
        for (std::size_t c = 0; c < hidden; ++c)
          panel[c / 16 * detail::panel_rows + e % detail::panel_rows].v[c % 16] = src[c];
      }
  }

  [[nodiscard]] std::uint32_t n_layers() const noexcept { return n_layers_; }
  [[nodiscard]] std::uint32_t n_experts() const noexcept { return n_experts_; }
  [[nodiscard]] std::uint32_t hidden() const noexcept { return hidden_; }
  [[nodiscard]] Isa isa() const noexcept { return isa_; }

  /// Uses the kernel path `isa`; throws `moekit::Error` if this CPU cannot run it.
  void set_isa(Isa isa) {
    MOEKIT_EXPECTS(isa_supported(isa), std::string(who_) + ": ISA '" + std::string(name(isa)) +
                                           "' is not supported by this CPU");
    isa_ = isa;
    dot_ = detail::panel_dot_for(isa);
  }

  /// Throws `moekit::Error` unless `gate` carries the gate input (`hidden` floats per token).
  void check_gate_input(const GateView& gate) const {
    MOEKIT_EXPECTS(gate.has_hidden() && gate.hidden_size() == hidden_,
                   std::string(who_) + ": GateView.hidden must hold the gate input (" +
                       std::to_string(hidden_) + " floats per token)");
  }

  /// logits[t·count·E + j·E + e] = router row e of layer `first + j` · x_t, for j < count and the
  /// `n` tokens of `x` (n × hidden). `first + count` must not exceed n_layers.
  void logits(std::uint32_t first, std::uint32_t count, std::span<const float> x, std::size_t n,
              std::vector<float>& out) const {
    MOEKIT_EXPECTS(first <= n_layers_ && count <= n_layers_ - first,
                   std::string(who_) + ": router layers out of range");
    MOEKIT_EXPECTS(x.size() >= n * hidden_,
                   std::string(who_) + ": gate input holds fewer than n_tokens x hidden floats");
    const std::size_t E = n_experts_, rows = std::size_t{count} * E;
    out.resize(n * rows);
    float tmp[detail::panel_rows];
    for (std::uint32_t j = 0; j < count; ++j)
      for (std::uint32_t q = 0; q < panels_; ++q) {
        const detail::RouterChunk* panel = panel_at(first + j, q);
        const std::size_t e0 = std::size_t{q} * detail::panel_rows;
        const std::size_t m = std::min(detail::panel_rows, E - e0);
        for (std::size_t t = 0; t < n; ++t) {
          dot_(panel, chunks_, x.data() + t * hidden_, hidden_, tmp);
          std::copy(tmp, tmp + m, out.data() + t * rows + j * E + e0);
        }
      }
  }

 private:
  [[nodiscard]] const detail::RouterChunk* panel_at(std::uint32_t layer,
                                                    std::uint32_t q) const noexcept {
    return packed_.data() + (std::size_t{layer} * panels_ + q) * chunks_ * detail::panel_rows;
  }
  [[nodiscard]] detail::RouterChunk* panel_at(std::uint32_t layer, std::uint32_t q) noexcept {
    return packed_.data() + (std::size_t{layer} * panels_ + q) * chunks_ * detail::panel_rows;
  }

  const char* who_ = "RouterStack";
  std::uint32_t n_layers_ = 0, n_experts_ = 0, hidden_ = 0;
  std::uint32_t panels_ = 0;  ///< panels of 8 rows per layer
  std::size_t chunks_ = 0;    ///< 16-column chunks per row
  Isa isa_ = Isa::generic;
  detail::PanelDotFn dot_ = &detail::panel_dot_generic;
  std::vector<detail::RouterChunk> packed_;  ///< [layer][panel][chunk][row] lines of 16 floats
};

}  // namespace moekit
