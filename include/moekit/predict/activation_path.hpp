#pragma once
/// \file ActivationPathProfile and ActivationPathPredictor: EdgeMoE's statistical preloading.
///
/// Algorithm (Yi et al., "EdgeMoE: Empowering Sparse Large Language Models on Mobile Devices",
/// §III-C1, Fig. 4/8): per-token activation paths are highly skewed (20 % of paths cover > 99 % of
/// tokens), so the experts of the two previous MoE layers predict the next one sharply, e.g.
/// P(E3 = 5 | E1 = 3, E2 = 1) = 87.1 %. Offline, a profile counts, per target layer n, how often
/// each expert is selected given the (sorted) expert sets of layers n−2 and n−1 (`path2`), given
/// the set of layer n−1 only (`path1`, backoff), and overall (`marginal`); probabilities are
/// count / total, so they sum to k per key. At run time, once layer l's router has chosen, the
/// predictor ranks layer l+1's experts from the deepest table whose key has at least
/// `min_support` tokens (path2 → path1 → marginal) and preloads the top `max_preload` (1–3 in
/// the paper) in probability order (ties → smaller id). Single-token decode only: prefill and
/// batches load on demand (EdgeMoE targets decoding).
///
/// Profile file (text; `#` comments; sets are comma-separated sorted expert ids):
///
///     moekit-activation-path 1
///     layers <L> experts <E> top_k <k>
///     marginal <layer> <total> <count_0> ... <count_{E-1}>
///     path1 <layer> <set of layer-1> <total> <expert>:<count> ...
///     path2 <layer> <set of layer-2>/<set of layer-1> <total> <expert>:<count> ...
///
/// Counts are kept (not probabilities) so that profiles from several corpora merge by addition.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Offline activation-path counts of a model (see the file comment).
class ActivationPathProfile {
 public:
  /// Selection counts of the next layer's experts under one key.
  struct Counts {
    std::uint64_t total = 0;
    std::vector<std::uint64_t> hits;  ///< [n_experts]
    friend bool operator==(const Counts&, const Counts&) = default;
  };
  /// A key: sorted expert ids of the conditioning layers, one set after the other, separated by a
  /// `separator` entry for path2 keys.
  using Key = std::vector<std::uint32_t>;
  static constexpr std::uint32_t separator = 0xFFFFFFFFu;

  /// Which table answered a `rank` query.
  enum class Source : std::uint8_t { path2, path1, marginal, none };

  ActivationPathProfile() = default;
  ActivationPathProfile(std::uint32_t n_layers, std::uint32_t n_experts, std::uint32_t top_k)
      : n_layers_(n_layers),
        n_experts_(n_experts),
        top_k_(top_k),
        marginal_(n_layers),
        path1_(n_layers),
        path2_(n_layers) {
    MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0 && top_k > 0 && top_k <= n_experts,
                   "ActivationPathProfile: need n_layers, n_experts > 0 and top_k in [1, "
                   "n_experts]");
    for (auto& m : marginal_) m = Counts{0, std::vector<std::uint64_t>(n_experts, 0)};
  }

  [[nodiscard]] std::uint32_t n_layers() const noexcept { return n_layers_; }
  [[nodiscard]] std::uint32_t n_experts() const noexcept { return n_experts_; }
  [[nodiscard]] std::uint32_t top_k() const noexcept { return top_k_; }
  [[nodiscard]] bool empty() const noexcept { return n_layers_ == 0; }

  /// Adds one token's path: `sets[l]` = experts selected at layer l (any order); an empty set
  /// marks a missing record, which contributes to no key that involves it.
  void add_path(std::span<const std::span<const std::uint32_t>> sets) {
    MOEKIT_EXPECTS(sets.size() == n_layers_,
                   "ActivationPathProfile::add_path: need one set per layer (" +
                       std::to_string(n_layers_) + ")");
    std::vector<Key> sorted(n_layers_);
    for (std::uint32_t l = 0; l < n_layers_; ++l) {
      sorted[l].assign(sets[l].begin(), sets[l].end());
      for (std::uint32_t e : sorted[l])
        MOEKIT_EXPECTS(e < n_experts_, "ActivationPathProfile::add_path: expert id >= n_experts");
      std::sort(sorted[l].begin(), sorted[l].end());
      MOEKIT_EXPECTS(std::adjacent_find(sorted[l].begin(), sorted[l].end()) == sorted[l].end(),
                     "ActivationPathProfile::add_path: duplicate expert id in one layer's set");
    }
    for (std::uint32_t n = 0; n < n_layers_; ++n) {
      const Key& cur = sorted[n];
      if (cur.empty()) continue;
      count(marginal_[n], cur);
      if (n >= 1 && !sorted[n - 1].empty()) count(slot(path1_[n], sorted[n - 1]), cur);
      if (n >= 2 && !sorted[n - 1].empty() && !sorted[n - 2].empty())
        count(slot(path2_[n], key2(sorted[n - 2], sorted[n - 1])), cur);
    }
  }

  /// Adds every count of `other` (same dimensions).
  void merge(const ActivationPathProfile& other) {
    MOEKIT_EXPECTS(
        other.n_layers_ == n_layers_ && other.n_experts_ == n_experts_ && other.top_k_ == top_k_,
        "ActivationPathProfile::merge: profiles of different model shapes");
    for (std::uint32_t n = 0; n < n_layers_; ++n) {
      add(marginal_[n], other.marginal_[n]);
      for (const auto& [k, c] : other.path1_[n]) add(slot(path1_[n], k), c);
      for (const auto& [k, c] : other.path2_[n]) add(slot(path2_[n], k), c);
    }
  }

  /// The counts of layer `n` under the given history, or nullptr when the key was never seen.
  /// `prev2` empty → the path1 table; both empty → the marginal.
  [[nodiscard]] const Counts* find(std::uint32_t n, std::span<const std::uint32_t> prev2,
                                   std::span<const std::uint32_t> prev1) const {
    if (n >= n_layers_) return nullptr;
    if (prev1.empty()) return &marginal_[n];
    Key k = prev2.empty() ? sorted_key(prev1) : key2(sorted_key(prev2), sorted_key(prev1));
    const auto& table = prev2.empty() ? path1_[n] : path2_[n];
    auto it = table.find(k);
    return it == table.end() ? nullptr : &it->second;
  }

  /// Probability that expert `j` is selected at layer `n` given the sets of layers n−2 and n−1
  /// (exact table lookup, no backoff; 0 when the key was never seen).
  [[nodiscard]] double probability(std::uint32_t n, std::span<const std::uint32_t> prev2,
                                   std::span<const std::uint32_t> prev1, std::uint32_t j) const {
    const Counts* c = find(n, prev2, prev1);
    if (!c || c->total == 0 || j >= n_experts_) return 0.0;
    return double(c->hits[j]) / double(c->total);
  }

  /// Ranks layer `n`'s experts given the (sorted) sets of layers n−2 and n−1 (either may be
  /// empty when unknown), backing off path2 → path1 → marginal when a key has fewer than
  /// `min_support` tokens. Writes (expert, probability) pairs with probability > 0 into `out`,
  /// descending (ties → smaller id), and returns the table used. `key` is scratch storage.
  Source rank(std::uint32_t n, std::span<const std::uint32_t> prev2,
              std::span<const std::uint32_t> prev1, std::uint64_t min_support,
              std::vector<std::pair<std::uint32_t, float>>& out, Key& key) const {
    out.clear();
    if (n >= n_layers_) return Source::none;
    const Counts* c = nullptr;
    Source src = Source::none;
    if (n >= 2 && !prev2.empty() && !prev1.empty()) {
      key.assign(prev2.begin(), prev2.end());
      key.push_back(separator);
      key.insert(key.end(), prev1.begin(), prev1.end());
      auto it = path2_[n].find(key);
      if (it != path2_[n].end() && it->second.total >= min_support)
        c = &it->second, src = Source::path2;
    }
    if (!c && n >= 1 && !prev1.empty()) {
      key.assign(prev1.begin(), prev1.end());
      auto it = path1_[n].find(key);
      if (it != path1_[n].end() && it->second.total >= min_support)
        c = &it->second, src = Source::path1;
    }
    if (!c && marginal_[n].total > 0) c = &marginal_[n], src = Source::marginal;
    if (!c) return Source::none;
    for (std::uint32_t e = 0; e < n_experts_; ++e)
      if (c->hits[e] > 0) out.emplace_back(e, float(double(c->hits[e]) / double(c->total)));
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    return src;
  }

  /// Number of distinct keys in the path1 / path2 tables of layer `n`.
  [[nodiscard]] std::size_t key_count(std::uint32_t n, bool two_layers) const {
    return two_layers ? path2_.at(n).size() : path1_.at(n).size();
  }

  // ---- file format -------------------------------------------------------------------------
  [[nodiscard]] std::string to_text() const {
    std::ostringstream o;
    o << "moekit-activation-path 1\n";
    o << "layers " << n_layers_ << " experts " << n_experts_ << " top_k " << top_k_ << "\n";
    for (std::uint32_t n = 0; n < n_layers_; ++n) {
      o << "marginal " << n << " " << marginal_[n].total;
      for (auto h : marginal_[n].hits) o << " " << h;
      o << "\n";
    }
    auto set_text = [&](auto b, auto e) {
      std::string s;
      for (auto it = b; it != e; ++it) {
        if (it != b) s += ',';
        s += std::to_string(*it);
      }
      return s;
    };
    auto counts_text = [&](const Counts& c) {
      std::string s(1, ' ');
      s += std::to_string(c.total);
      for (std::uint32_t e = 0; e < n_experts_; ++e)
        if (c.hits[e]) {
          s += ' ';
          s += std::to_string(e);
          s += ':';
          s += std::to_string(c.hits[e]);
        }
      return s;
    };
    for (std::uint32_t n = 0; n < n_layers_; ++n)
      for (const auto& [k, c] : path1_[n])
        o << "path1 " << n << " " << set_text(k.begin(), k.end()) << counts_text(c) << "\n";
    for (std::uint32_t n = 0; n < n_layers_; ++n)
      for (const auto& [k, c] : path2_[n]) {
        const auto sep = std::find(k.begin(), k.end(), separator);
        o << "path2 " << n << " " << set_text(k.begin(), sep) << "/" << set_text(sep + 1, k.end())
          << counts_text(c) << "\n";
      }
    return o.str();
  }

  /// Parses the documented format; errors name `source`, the line and the field.
  [[nodiscard]] static ActivationPathProfile parse(std::string_view text,
                                                   std::string_view source = "<memory>") {
    std::size_t line_no = 0;
    auto bad = [&](const std::string& what) {
      detail::fail(ErrorKind::invalid_format,
                   std::string(source) + ":" + std::to_string(line_no) + ": " + what);
    };
    std::istringstream in{std::string(text)};
    std::string line;
    ActivationPathProfile p;
    bool header = false;
    while (std::getline(in, line)) {
      ++line_no;
      const std::vector<std::string> w = words_of(std::move(line));
      if (w.empty()) continue;
      if (!header) {
        if (w.size() != 2 || w[0] != "moekit-activation-path")
          bad("expected header 'moekit-activation-path 1'");
        if (w[1] != "1") bad("unsupported version '" + w[1] + "' (this build reads version 1)");
        header = true;
      } else if (p.empty()) {
        p = parse_dims(w, bad);
      } else {
        p.parse_record(w, bad);
      }
    }
    if (!header) {
      line_no = 1;
      bad("empty file: expected header 'moekit-activation-path 1'");
    }
    if (p.empty()) bad("missing 'layers <L> experts <E> top_k <k>' line");
    return p;
  }

  [[nodiscard]] static ActivationPathProfile load(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) detail::fail(ErrorKind::io, "ActivationPathProfile: cannot open '" + path + "'");
    std::ostringstream s;
    s << f.rdbuf();
    return parse(s.str(), path);
  }
  void save(const std::string& path) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) detail::fail(ErrorKind::io, "ActivationPathProfile: cannot write '" + path + "'");
    f << to_text();
    if (!f) detail::fail(ErrorKind::io, "ActivationPathProfile: write to '" + path + "' failed");
  }

  friend bool operator==(const ActivationPathProfile&, const ActivationPathProfile&) = default;

 private:
  using Table = std::map<Key, Counts>;

  static Key sorted_key(std::span<const std::uint32_t> s) {
    Key k(s.begin(), s.end());
    std::sort(k.begin(), k.end());
    return k;
  }
  static Key key2(const Key& a, const Key& b) {
    Key k = a;
    k.push_back(separator);
    k.insert(k.end(), b.begin(), b.end());
    return k;
  }
  Counts& slot(Table& t, const Key& k) {
    auto [it, fresh] = t.try_emplace(k);
    if (fresh) it->second.hits.assign(n_experts_, 0);
    return it->second;
  }
  static void count(Counts& c, const Key& cur) {
    ++c.total;
    for (std::uint32_t e : cur) ++c.hits[e];
  }
  static void add(Counts& c, const Counts& o) {
    c.total += o.total;
    for (std::size_t e = 0; e < c.hits.size(); ++e) c.hits[e] += o.hits[e];
  }
  template <class Bad>
  static void check_counts(const Counts& c, Bad& bad) {
    for (auto h : c.hits)
      if (h > c.total) bad("field 'count': a count exceeds the key's total");
  }
  /// The words of a line of the text format, without its comment.
  static std::vector<std::string> words_of(std::string line) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ls(line);
    std::vector<std::string> w;
    for (std::string s; ls >> s;) w.push_back(s);
    return w;
  }
  /// "layers <L> experts <E> top_k <k>": an empty profile of that shape.
  template <class Bad>
  static ActivationPathProfile parse_dims(const std::vector<std::string>& w, Bad& bad) {
    std::uint64_t l = 0, e = 0, k = 0;
    if (w.size() != 6 || w[0] != "layers" || w[2] != "experts" || w[4] != "top_k" ||
        !to_u64(w[1], l) || !to_u64(w[3], e) || !to_u64(w[5], k) || l == 0 || e == 0 || k == 0 ||
        k > e || l > 100000 || e > 100000)
      bad("expected 'layers <L> experts <E> top_k <k>' with 0 < k <= E");
    return ActivationPathProfile(std::uint32_t(l), std::uint32_t(e), std::uint32_t(k));
  }
  /// A "marginal", "path1" or "path2" record.
  template <class Bad>
  void parse_record(const std::vector<std::string>& w, Bad& bad) {
    std::uint64_t n = 0;
    if (w.size() < 2 || !to_u64(w[1], n) || n >= n_layers_)
      bad("field 'layer': expected a layer index below " + std::to_string(n_layers_));
    const auto L = std::uint32_t(n);
    if (w[0] == "marginal")
      parse_marginal(L, w, bad);
    else if (w[0] == "path1" || w[0] == "path2")
      parse_path(L, w, bad);
    else
      bad("unknown record '" + w[0] + "' (expected marginal, path1 or path2)");
  }
  /// "marginal <layer> <total> <count>...": one count per expert.
  template <class Bad>
  void parse_marginal(std::uint32_t L, const std::vector<std::string>& w, Bad& bad) {
    if (w.size() != 3 + std::size_t{n_experts_})
      bad("field 'marginal': expected <layer> <total> and " + std::to_string(n_experts_) +
          " counts");
    Counts c{0, std::vector<std::uint64_t>(n_experts_, 0)};
    if (!to_u64(w[2], c.total)) bad("field 'total': not a count");
    for (std::uint32_t e = 0; e < n_experts_; ++e)
      if (!to_u64(w[3 + e], c.hits[e])) bad("field 'count_" + std::to_string(e) + "': not a count");
    check_counts(c, bad);
    marginal_[L] = std::move(c);
  }
  /// "path1 <layer> <set> <total> <expert>:<count>..." or "path2 <layer> <set>/<set> ...".
  template <class Bad>
  void parse_path(std::uint32_t L, const std::vector<std::string>& w, Bad& bad) {
    const bool two = w[0] == "path2";
    if (w.size() < 4) bad("field '" + w[0] + "': expected <layer> <key> <total> pairs");
    if (L < (two ? 2u : 1u))
      bad("field '" + w[0] + "': layer " + std::to_string(L) + " has no such history");
    Key key;
    if (two) {
      const auto slash = w[2].find('/');
      if (slash == std::string::npos) bad("field 'key': expected <set>/<set>");
      key = parse_set(w[2].substr(0, slash), n_experts_, bad);
      key.push_back(separator);
      const Key k1 = parse_set(w[2].substr(slash + 1), n_experts_, bad);
      key.insert(key.end(), k1.begin(), k1.end());
    } else {
      key = parse_set(w[2], n_experts_, bad);
    }
    Counts c{0, std::vector<std::uint64_t>(n_experts_, 0)};
    if (!to_u64(w[3], c.total)) bad("field 'total': not a count");
    for (std::size_t i = 4; i < w.size(); ++i) {
      const auto colon = w[i].find(':');
      std::uint64_t e = 0, cnt = 0;
      if (colon == std::string::npos || !to_u64(w[i].substr(0, colon), e) ||
          !to_u64(w[i].substr(colon + 1), cnt) || e >= n_experts_)
        bad("field 'count': expected <expert>:<count> with expert < " + std::to_string(n_experts_) +
            ", got '" + w[i] + "'");
      c.hits[e] += cnt;
    }
    check_counts(c, bad);
    auto& table = two ? path2_[L] : path1_[L];
    if (!table.emplace(std::move(key), std::move(c)).second) bad("field 'key': duplicate key");
  }
  template <class Bad>
  static Key parse_set(const std::string& s, std::uint32_t n_experts, Bad& bad) {
    Key k;
    std::size_t i = 0;
    while (i <= s.size()) {
      const std::size_t j = std::min(s.find(',', i), s.size());
      std::uint64_t v = 0;
      if (!to_u64(s.substr(i, j - i), v) || v >= n_experts)
        bad("field 'key': '" + s + "' is not a comma-separated set of expert ids < " +
            std::to_string(n_experts));
      k.push_back(std::uint32_t(v));
      i = j + 1;
    }
    if (!std::is_sorted(k.begin(), k.end()) || std::adjacent_find(k.begin(), k.end()) != k.end())
      bad("field 'key': set '" + s + "' must be sorted and without duplicates");
    return k;
  }
  static bool to_u64(const std::string& s, std::uint64_t& out) noexcept {
    if (s.empty() || s.size() > 18) return false;
    std::uint64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + std::uint64_t(c - '0');
    }
    out = v;
    return true;
  }

  std::uint32_t n_layers_ = 0;
  std::uint32_t n_experts_ = 0;
  std::uint32_t top_k_ = 0;
  std::vector<Counts> marginal_;
  std::vector<Table> path1_;
  std::vector<Table> path2_;
};

/// EdgeMoE's preloading predictor over an `ActivationPathProfile`.
class ActivationPathPredictor {
 public:
  static constexpr std::string_view name = "activation-path";
  struct Config {
    std::shared_ptr<const ActivationPathProfile> profile;  ///< required
    std::uint32_t max_preload = 3;                         ///< candidates per layer (paper: 1–3)
    std::uint64_t min_support = 5;        ///< tokens a key needs before its table is trusted
    float min_prob = 0.0f;                ///< candidates below this probability are not preloaded
    Precision precision = Precision::q4;  ///< preload precision when `precisions` is empty
    /// Optional stored precision per expert, index layer·E + expert (EdgeMoE's bit-width table).
    std::vector<Precision> precisions{};
  };

  /// Lookups answered by each table (path2, path1, marginal, none).
  struct Stats {
    std::uint64_t by_source[4] = {};
  };

  explicit ActivationPathPredictor(Config c) : cfg_(std::move(c)) {
    MOEKIT_EXPECTS(cfg_.profile && !cfg_.profile->empty(),
                   "ActivationPathPredictor: Config.profile is required (build it with "
                   "tools::build_activation_profile or ActivationPathProfile::load)");
    const auto& p = *cfg_.profile;
    MOEKIT_EXPECTS(cfg_.precisions.empty() ||
                       cfg_.precisions.size() == std::size_t{p.n_layers()} * p.n_experts(),
                   "ActivationPathPredictor: Config.precisions must be empty or hold n_layers x "
                   "n_experts entries");
    MOEKIT_EXPECTS(cfg_.precision != Precision::skip,
                   "ActivationPathPredictor: Config.precision must be a stored format");
    sets_.assign(p.n_layers(), {});
    token_.assign(p.n_layers(), no_token);
    ranked_.reserve(p.n_experts());
  }

  /// Throws `moekit::Error` when the layer call does not fit the profile's model.
  void observe(const LayerContext& ctx, const GateView& gate) {
    MOEKIT_EXPECTS(ctx.n_layers == sets_.size() && gate.n_experts == cfg_.profile->n_experts(),
                   "ActivationPathPredictor: the profile describes " +
                       std::to_string(sets_.size()) + " layers x " +
                       std::to_string(cfg_.profile->n_experts()) + " experts, the model " +
                       std::to_string(ctx.n_layers) + " x " + std::to_string(gate.n_experts));
    if (gate.n_tokens != 1) {  // prefill / batches: no history, no prediction (EdgeMoE B15)
      token_[ctx.layer] = no_token;
      return;
    }
    auto& s = sets_[ctx.layer];
    s.assign(gate.experts.begin(), gate.experts.end());
    std::sort(s.begin(), s.end());
    token_[ctx.layer] = ctx.token_index;
  }

  void predict(const LayerContext& ctx, const GateView& gate, const ResidencyView& residency,
               PrefetchList& out) {
    const auto& p = *cfg_.profile;
    const std::uint32_t l = ctx.layer, n = l + 1;
    if (gate.n_tokens != 1 || n >= p.n_layers() || cfg_.max_preload == 0) return;
    const auto known = [&](std::uint32_t layer) { return token_[layer] == ctx.token_index; };
    std::span<const std::uint32_t> prev1, prev2;
    if (known(l)) prev1 = sets_[l];
    if (l >= 1 && known(l - 1) && known(l)) prev2 = sets_[l - 1];
    const auto src = p.rank(n, prev2, prev1, cfg_.min_support, ranked_, key_);
    ++stats_.by_source[static_cast<int>(src)];
    std::uint32_t taken = 0;
    for (const auto& [e, prob] : ranked_) {
      if (taken == cfg_.max_preload || prob < cfg_.min_prob) break;
      const ExpertKey key{n, e};
      const Precision prec = cfg_.precisions.empty()
                                 ? cfg_.precision
                                 : cfg_.precisions[std::size_t{n} * p.n_experts() + e];
      (void)residency;  // resident candidates are pushed too: the pipeline pins them for layer n
      out.push(Prefetch{key, prec, prob, 1});
      ++taken;
    }
  }

  [[nodiscard]] const Stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  static constexpr std::uint64_t no_token = ~std::uint64_t{0};
  Config cfg_;
  std::vector<std::vector<std::uint32_t>> sets_;
  std::vector<std::uint64_t> token_;
  std::vector<std::pair<std::uint32_t, float>> ranked_;
  ActivationPathProfile::Key key_;
  Stats stats_{};
};
static_assert(Predictor<ActivationPathPredictor>);

}  // namespace moekit
