#pragma once
/// \file RoutingTrace: recorded (or synthesised) router decisions, laid out for fast replay.
///
/// A trace holds, per sequence, per token, per MoE layer, one *record*: the top-k expert ids with
/// their weights (normalised to sum to 1, descending), and optionally the full router logits
/// [n_experts] and the gate-input hidden state [hidden]. Each token also carries its phase
/// (prefill or decode); the prefill tokens of a sequence come first and form one forward.
///
/// Layout: flat arrays indexed by record = global_token · n_layers + layer, so replaying millions
/// of accesses walks memory linearly and never allocates. Accessors return spans into them.
///
/// Missing records: a record may be absent (the shared Mixtral traces drop records whose two
/// weights were exactly 0.5). A missing record has every id equal to `missing_expert`
/// (0xFFFFFFFF) and every weight 0 (and NaN logits / hidden when present); `valid()` tells.
/// Replay code must check `valid()` before using a record.

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/error.hpp"
#include "moekit/io/output_file.hpp"

namespace moekit::sim {

/// Expert id stored in every slot of a missing record.
inline constexpr std::uint32_t missing_expert = std::numeric_limits<std::uint32_t>::max();

/// Model dimensions a trace is recorded for.
struct TraceDims {
  std::uint32_t n_layers = 0;   ///< MoE layers
  std::uint32_t n_experts = 0;  ///< routed experts per layer
  std::uint32_t top_k = 0;      ///< experts per record
  std::uint32_t hidden = 0;     ///< width of the stored gate-input hidden state; 0 = not stored
  bool has_logits = false;      ///< full router logits [n_experts] are stored per record

  /// Throws `moekit::Error` naming the first field that cannot describe a trace.
  void validate() const {
    MOEKIT_EXPECTS(n_layers > 0, "TraceDims.n_layers must be > 0");
    MOEKIT_EXPECTS(n_experts > 0 && n_experts != missing_expert,
                   "TraceDims.n_experts must be in [1, 2^32-2]");
    MOEKIT_EXPECTS(top_k > 0 && top_k <= n_experts, "TraceDims.top_k must be in [1, n_experts]");
  }
  friend constexpr bool operator==(const TraceDims&, const TraceDims&) = default;
};

/// Tolerance on |Σ weights − 1| of a record (the shared traces are within 1e-7; f32 sums of 6–8
/// terms stay well within 1e-4).
inline constexpr double weight_sum_tolerance = 1e-3;

namespace detail {

/// Returns an empty string when (ids, weights) is a valid record for `dims`, else what is wrong.
inline std::string check_route(const TraceDims& dims, std::span<const std::uint32_t> ids,
                               std::span<const float> weights) {
  if (ids.size() != dims.top_k || weights.size() != dims.top_k)
    return "record must hold top_k = " + std::to_string(dims.top_k) + " ids and weights";
  double sum = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= dims.n_experts)
      return "expert id " + std::to_string(ids[i]) + " out of range [0, " +
             std::to_string(dims.n_experts) + ")";
    for (std::size_t j = 0; j < i; ++j)
      if (ids[j] == ids[i]) return "expert id " + std::to_string(ids[i]) + " repeated";
    if (!std::isfinite(weights[i]) || weights[i] < 0)
      return "weight " + std::to_string(i) + " is negative or not finite";
    if (i > 0 && weights[i] > weights[i - 1]) return "weights are not in descending order";
    sum += weights[i];
  }
  if (std::abs(sum - 1.0) > weight_sum_tolerance)
    return "weights sum to " + std::to_string(sum) + ", not 1";
  return {};
}

/// Checked a·b for sizes read from untrusted files.
inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}

/// Whole file as bytes; throws `Error(io)` naming the path, `Error(invalid_argument)` when it is
/// not a regular file (a device such as /dev/zero or a pipe would be read without end).
inline std::vector<std::byte> read_file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    ::moekit::detail::fail(ErrorKind::invalid_argument,
                           "'" + path + "' is not a regular file (a directory, device or pipe)");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) ::moekit::detail::fail(ErrorKind::io, "cannot open '" + path + "' for reading");
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) ::moekit::detail::fail(ErrorKind::io, "read error on '" + path + "'");
  return out;
}

inline std::string read_file_text(const std::string& path) {
  const auto bytes = read_file_bytes(path);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

/// Writes `data` to `path`; refuses to replace an existing file unless `overwrite`.
inline void write_file_bytes(const std::string& path, std::span<const std::byte> data,
                             bool overwrite) {
  // A temporary file renamed over the target: a failed write leaves nothing behind.
  ::moekit::io::write_file_atomically(path, data, overwrite, "", "pass overwrite = true");
}

}  // namespace detail

/// Sorts a record by descending weight (ties: ascending id) and normalises the weights to sum to
/// 1, in place. For importers of data that is not already in trace order. Throws when the weights
/// are negative, not finite, or sum to 0.
inline void normalize_route(std::span<std::uint32_t> ids, std::span<float> weights) {
  MOEKIT_EXPECTS(ids.size() == weights.size(), "normalize_route: ids and weights differ in size");
  double sum = 0;
  for (float w : weights) {
    MOEKIT_EXPECTS(std::isfinite(w) && w >= 0, "normalize_route: weight negative or not finite");
    sum += w;
  }
  MOEKIT_EXPECTS(sum > 0, "normalize_route: weights sum to 0");
  std::vector<std::size_t> order(ids.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return weights[a] != weights[b] ? weights[a] > weights[b] : ids[a] < ids[b];
  });
  std::vector<std::uint32_t> id2(ids.size());
  std::vector<float> w2(ids.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    id2[i] = ids[order[i]];
    w2[i] = static_cast<float>(weights[order[i]] / sum);
  }
  std::copy(id2.begin(), id2.end(), ids.begin());
  std::copy(w2.begin(), w2.end(), weights.begin());
}

/// Router decisions of a set of sequences. See the file comment for layout and missing records.
class RoutingTrace {
 public:
  RoutingTrace() = default;
  /// An empty trace for `dims`; `synthetic` marks generated (not recorded) routing.
  RoutingTrace(TraceDims dims, std::string name, bool synthetic = false)
      : dims_(dims), name_(std::move(name)), synthetic_(synthetic) {
    dims_.validate();
  }

  [[nodiscard]] const TraceDims& dims() const noexcept { return dims_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// True when the routing was generated rather than recorded from a model.
  [[nodiscard]] bool synthetic() const noexcept { return synthetic_; }
  [[nodiscard]] bool has_logits() const noexcept { return dims_.has_logits; }
  [[nodiscard]] bool has_hidden() const noexcept { return dims_.hidden > 0; }

  [[nodiscard]] std::size_t sequence_count() const noexcept { return seq_names_.size(); }
  /// Tokens over all sequences.
  [[nodiscard]] std::size_t token_count() const noexcept { return phases_.size(); }
  [[nodiscard]] std::size_t record_count() const noexcept {
    return phases_.size() * dims_.n_layers;
  }
  [[nodiscard]] const std::string& sequence_name(std::size_t s) const { return seq_names_.at(s); }
  [[nodiscard]] std::size_t sequence_length(std::size_t s) const {
    check_seq(s);
    return seq_first_[s + 1] - seq_first_[s];
  }
  /// Global index of token `t` of sequence `s` (tokens of all sequences are numbered in order).
  [[nodiscard]] std::size_t global_token(std::size_t s, std::size_t t) const {
    MOEKIT_EXPECTS(t < sequence_length(s), "RoutingTrace: token index out of range");
    return seq_first_[s] + t;
  }
  /// Number of leading prefill tokens of sequence `s`.
  [[nodiscard]] std::size_t prefill_length(std::size_t s) const {
    std::size_t n = 0;
    const std::size_t len = sequence_length(s);
    while (n < len && phases_[seq_first_[s] + n] == Phase::prefill) ++n;
    return n;
  }

  // ---- record access by global token index (hot path: no checks beyond debug) ----------------
  [[nodiscard]] Phase phase(std::size_t token) const noexcept { return phases_[token]; }
  [[nodiscard]] std::span<const std::uint32_t> experts(std::size_t token,
                                                       std::uint32_t layer) const noexcept {
    return {experts_.data() + record(token, layer) * dims_.top_k, dims_.top_k};
  }
  [[nodiscard]] std::span<const float> weights(std::size_t token,
                                               std::uint32_t layer) const noexcept {
    return {weights_.data() + record(token, layer) * dims_.top_k, dims_.top_k};
  }
  /// Router logits [n_experts]; empty when the trace has none.
  [[nodiscard]] std::span<const float> logits(std::size_t token,
                                              std::uint32_t layer) const noexcept {
    if (!dims_.has_logits) return {};
    return {logits_.data() + record(token, layer) * dims_.n_experts, dims_.n_experts};
  }
  /// Gate-input hidden state [hidden]; empty when the trace has none.
  [[nodiscard]] std::span<const float> hidden(std::size_t token,
                                              std::uint32_t layer) const noexcept {
    if (dims_.hidden == 0) return {};
    return {hidden_.data() + record(token, layer) * dims_.hidden, dims_.hidden};
  }
  /// False for a missing record.
  [[nodiscard]] bool valid(std::size_t token, std::uint32_t layer) const noexcept {
    return experts_[record(token, layer) * dims_.top_k] != missing_expert;
  }
  /// The record as the pipeline's `TokenRoute` view.
  [[nodiscard]] TokenRoute route(std::size_t token, std::uint32_t layer) const noexcept {
    return TokenRoute{logits(token, layer), experts(token, layer), weights(token, layer),
                      hidden(token, layer)};
  }

  // ---- whole arrays (for serialisation and vectorised statistics) -----------------------------
  [[nodiscard]] std::span<const Phase> all_phases() const noexcept { return phases_; }
  [[nodiscard]] std::span<const std::uint32_t> all_experts() const noexcept { return experts_; }
  [[nodiscard]] std::span<const float> all_weights() const noexcept { return weights_; }
  [[nodiscard]] std::span<const float> all_logits() const noexcept { return logits_; }
  [[nodiscard]] std::span<const float> all_hidden() const noexcept { return hidden_; }

  // ---- building ------------------------------------------------------------------------------
  /// Starts a new sequence; following `append_token` calls add to it. Returns its index.
  std::size_t begin_sequence(std::string seq_name) {
    MOEKIT_EXPECTS(dims_.n_layers > 0, "RoutingTrace: default-constructed trace has no dims");
    seq_names_.push_back(std::move(seq_name));
    if (seq_first_.empty()) seq_first_.push_back(0);
    seq_first_.push_back(phases_.size());
    return seq_names_.size() - 1;
  }
  /// Appends a token to the current sequence with every layer's record missing; returns its
  /// global index. Prefill tokens must precede the sequence's decode tokens.
  std::size_t append_token(Phase p) {
    MOEKIT_EXPECTS(!seq_names_.empty(), "RoutingTrace: append_token before begin_sequence");
    const std::size_t first = seq_first_[seq_names_.size() - 1];
    MOEKIT_EXPECTS(
        p == Phase::decode || phases_.size() == first || phases_.back() == Phase::prefill,
        "RoutingTrace: a prefill token cannot follow a decode token in a sequence");
    phases_.push_back(p);
    ++seq_first_.back();
    const std::size_t recs = std::size_t{dims_.n_layers};
    experts_.resize(experts_.size() + recs * dims_.top_k, missing_expert);
    weights_.resize(weights_.size() + recs * dims_.top_k, 0.0f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (dims_.has_logits) logits_.resize(logits_.size() + recs * dims_.n_experts, nan);
    if (dims_.hidden) hidden_.resize(hidden_.size() + recs * dims_.hidden, nan);
    return phases_.size() - 1;
  }
  /// Sets the record of (`token`, `layer`). ids must be distinct and in range, weights finite,
  /// non-negative, descending and summing to 1 (see `normalize_route`); `logits` / `hidden` must
  /// be given exactly when the trace stores them. Throws `moekit::Error` otherwise.
  void set_route(std::size_t token, std::uint32_t layer, std::span<const std::uint32_t> ids,
                 std::span<const float> w, std::span<const float> logits = {},
                 std::span<const float> hidden = {}) {
    MOEKIT_EXPECTS(token < phases_.size(), "RoutingTrace::set_route: token out of range");
    MOEKIT_EXPECTS(layer < dims_.n_layers, "RoutingTrace::set_route: layer out of range");
    const std::string why = detail::check_route(dims_, ids, w);
    MOEKIT_EXPECTS(why.empty(), "RoutingTrace::set_route: " + why);
    MOEKIT_EXPECTS(logits.size() == (dims_.has_logits ? dims_.n_experts : 0u),
                   "RoutingTrace::set_route: logits must be given iff the trace stores them");
    MOEKIT_EXPECTS(hidden.size() == dims_.hidden,
                   "RoutingTrace::set_route: hidden must have the trace's hidden width");
    const std::size_t r = record(token, layer);
    std::copy(ids.begin(), ids.end(), experts_.begin() + r * dims_.top_k);
    std::copy(w.begin(), w.end(), weights_.begin() + r * dims_.top_k);
    // Guarded: offsetting an empty vector's null begin() is undefined even by zero elements.
    if (!logits.empty())
      std::copy(logits.begin(), logits.end(), logits_.begin() + r * dims_.n_experts);
    if (!hidden.empty())
      std::copy(hidden.begin(), hidden.end(), hidden_.begin() + r * dims_.hidden);
  }
  /// Marks a record missing again.
  void clear_route(std::size_t token, std::uint32_t layer) {
    MOEKIT_EXPECTS(token < phases_.size() && layer < dims_.n_layers,
                   "RoutingTrace::clear_route: record out of range");
    const std::size_t r = record(token, layer);
    std::fill_n(experts_.begin() + r * dims_.top_k, dims_.top_k, missing_expert);
    std::fill_n(weights_.begin() + r * dims_.top_k, dims_.top_k, 0.0f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (dims_.has_logits) std::fill_n(logits_.begin() + r * dims_.n_experts, dims_.n_experts, nan);
    if (dims_.hidden) std::fill_n(hidden_.begin() + r * dims_.hidden, dims_.hidden, nan);
  }
  /// Reserves room for `tokens` more tokens (avoids regrowth when the size is known).
  void reserve_tokens(std::size_t tokens) {
    const std::size_t t = phases_.size() + tokens, recs = t * dims_.n_layers;
    phases_.reserve(t);
    experts_.reserve(recs * dims_.top_k);
    weights_.reserve(recs * dims_.top_k);
    if (dims_.has_logits) logits_.reserve(recs * dims_.n_experts);
    if (dims_.hidden) hidden_.reserve(recs * dims_.hidden);
  }

  /// Records that are present / missing.
  [[nodiscard]] std::size_t missing_count() const noexcept {
    std::size_t n = 0;
    for (std::size_t r = 0; r < record_count(); ++r)
      n += experts_[r * dims_.top_k] == missing_expert;
    return n;
  }

  friend bool operator==(const RoutingTrace& a, const RoutingTrace& b) {
    auto same_floats = [](const std::vector<float>& x, const std::vector<float>& y) {
      // Bitwise, so that NaN placeholders of missing records compare equal.
      return x.size() == y.size() &&
             std::equal(x.begin(), x.end(), y.begin(), [](float p, float q) {
               return std::bit_cast<std::uint32_t>(p) == std::bit_cast<std::uint32_t>(q);
             });
    };
    return a.dims_ == b.dims_ && a.name_ == b.name_ && a.synthetic_ == b.synthetic_ &&
           a.seq_names_ == b.seq_names_ && a.seq_first_ == b.seq_first_ && a.phases_ == b.phases_ &&
           a.experts_ == b.experts_ && same_floats(a.weights_, b.weights_) &&
           same_floats(a.logits_, b.logits_) && same_floats(a.hidden_, b.hidden_);
  }

 private:
  [[nodiscard]] std::size_t record(std::size_t token, std::uint32_t layer) const noexcept {
    return token * dims_.n_layers + layer;
  }
  void check_seq(std::size_t s) const {
    MOEKIT_EXPECTS(s < seq_names_.size(), "RoutingTrace: sequence index out of range");
  }

  TraceDims dims_{};
  std::string name_;
  bool synthetic_ = false;
  std::vector<std::string> seq_names_;
  std::vector<std::size_t> seq_first_;  ///< [n_seq + 1] first global token of each sequence
  std::vector<Phase> phases_;           ///< [tokens]
  std::vector<std::uint32_t> experts_;  ///< [tokens · n_layers · top_k]
  std::vector<float> weights_;          ///< [tokens · n_layers · top_k]
  std::vector<float> logits_;           ///< [tokens · n_layers · n_experts] or empty
  std::vector<float> hidden_;           ///< [tokens · n_layers · hidden] or empty
};

}  // namespace moekit::sim
