#pragma once
/// \file Sampler: picks the next token from logits — greedy (temperature 0), or softmax at a
/// temperature over the top_k highest logits (0 = all), restricted to the smallest set of top
/// tokens whose probability reaches top_p (nucleus sampling), drawn with a seeded std::mt19937_64
/// so runs are reproducible.
///
/// Without top-k, every seed draws the token that the original implementation draws (`original`:
/// sort the whole vocabulary, weights expf((l - max) / T) summed in that order, cut where the
/// running probability reaches top_p, std::discrete_distribution over the kept weights), but
/// without sorting the vocabulary:
///  1. vector passes find the largest logit (below top-p 1 a pass that finds nothing else, when
///     every logit is finite), then every weight with a fast exp and their sum,
///     collecting on the way the logits above a floor (a rung of distance below the largest) that
///     held the last few samples' nuclei;
///  2. those candidates, or those above a lower floor when they prove not to hold the nucleus,
///     are bucketed by value, so a running sum in descending order is found by adding whole
///     buckets and sorting only the bucket where it crosses the cut (then the draw);
///  3. the original's sums differ from these by order and by expf's rounding, within `margin`: a
///     decision (where the cut is, which kept token the uniform number falls on) is taken only
///     when it holds by more than that. Otherwise the sample is redone with expf weights for the
///     candidates, then for all, then by the original's arithmetic in a radix sort's order
///     (`reference`), and by the original itself when the drawn logit is tied with another (only
///     std::sort defines their order). The draws are recorded: every attempt sees the same
///     numbers, and the generator moves on as the original moves it.
/// At top-p 1 the original keeps every token but a tail that its rounded running probability may
/// cut (at most the margin's share of the mass), so the cut decides nothing but that tail: the
/// uniform number is taken first, and the candidates need only hold the mass up to where it
/// falls.
/// With top-k, the k highest logits (ties: lower token id first) are found by a threshold on the
/// maxima of disjoint sets of logits that the first pass reports, sorted, and the original's
/// arithmetic runs on them.
///
/// With a thread pool (`set_thread_pool`), the two passes over the whole vocabulary (the scan and
/// the weight pass; the lighter pass for the largest logit alone stays on the caller) run as one
/// range per thread. Only the order of the weight sums changes, which
/// the margins already allow for (any order), so every seed still draws the same tokens.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/precision/isa.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "moekit/engine/sampler_passes.hpp"

namespace moekit::engine {

/// Sampling settings.
struct SamplerConfig {
  float temperature = 0.8f;  ///< 0 = greedy (argmax)
  float top_p = 0.95f;       ///< nucleus mass in (0, 1]; 1 = no truncation
  std::uint64_t seed = 0;
  std::uint32_t top_k = 0;  ///< keep the k highest logits first; 0 (or >= the vocabulary) = all
};

namespace detail {

/// Candidate tokens, bucketed by distance to the largest logit: a running sum of their weights in
/// descending order of logit is found by adding whole buckets, and only the bucket where it
/// reaches its target is sorted.
class RankedCandidates {
 public:
  struct Entry {
    float logit;
    std::uint32_t token;
    float weight;
  };
  /// Where a running sum of weights in descending order of logit reaches a target.
  struct Crossing {
    std::size_t rank;     ///< first rank whose running sum reaches the target (or limit - 1)
    double before = 0;    ///< sum over the ranks before it
    double through = 0;   ///< ... and it
    std::uint32_t token;  ///< the token at that rank
    bool tied;            ///< another candidate has the same logit: the rank names no one token
  };

  /// Takes the c candidates token[0..c) of logits l (kept by pointer: they must outlive the
  /// calls) with weights w[token]; logits at `span` or more below `top` share the last bucket.
  void assign(const float* l, const float* w, const std::uint32_t* token, std::size_t c, float top,
              float span) {
    const float scale = span > 0 && std::isfinite(kBuckets / span) ? kBuckets / span : 0.0f;
    scale_ = scale;
    l_ = l;
    token_ = token;
    members_of_ = kBuckets;
    bucket_.resize(c);
    weight_.resize(c);
    std::fill(&count_[0][0], &count_[0][0] + kWays * kBuckets, 0u);
    std::fill(&mass_[0][0], &mass_[0][0] + kWays * kBuckets, 0.0);
    for (std::size_t i = 0; i < c; ++i) {
      const float d = top - l[token[i]];  // falls as the logit rises: buckets keep the order
      const auto b =
          d < span ? std::min<std::uint32_t>(kBuckets - 1, std::uint32_t(d * scale)) : kBuckets - 1;
      bucket_[i] = static_cast<std::uint8_t>(b);
      weight_[i] = w[token[i]];
      // kWays interleaved tallies: a run of one bucket does not wait on its own stores.
      ++count_[i % kWays][b];
      mass_[i % kWays][b] += weight_[i];
    }
  }

  /// Replaces each weight by weight_of(logit).
  template <class WeightOf>
  void reweigh(WeightOf weight_of) {
    std::fill(&mass_[0][0], &mass_[0][0] + kWays * kBuckets, 0.0);
    members_of_ = kBuckets;
    for (std::size_t i = 0; i < bucket_.size(); ++i)
      mass_[i % kWays][bucket_[i]] += weight_[i] = weight_of(l_[token_[i]]);
  }

  /// The sum of all the weights.
  [[nodiscard]] double held() const noexcept {
    double m[4] = {};  // four chains of adds, not one
    for (std::size_t b = 0; b < kBuckets; b += 4)
      for (std::size_t j = 0; j < 4; ++j) m[j] += bucket_mass(std::uint32_t(b + j));
    return (m[0] + m[1]) + (m[2] + m[3]);
  }
  [[nodiscard]] std::size_t size() const noexcept { return bucket_.size(); }
  /// The first of k ascending distances to the largest logit within which the candidates have a
  /// mass of at least `target`, or k: the mass counted is the buckets' wholly nearer (the last
  /// bucket, which holds everything beyond the span, never counts), a lower bound.
  [[nodiscard]] std::size_t first_holding(const float* distance, std::size_t k,
                                          double target) const noexcept {
    double m = 0;
    std::uint32_t b = 0;
    for (std::size_t r = 0; r < k; ++r) {
      const float whole = distance[r] * scale_;
      const auto end = whole >= float(kBuckets - 1) ? kBuckets - 1 : std::uint32_t(whole);
      for (; b < end; ++b) m += bucket_mass(b);
      if (m >= target) return r;
    }
    return k;
  }

  /// The first rank below `limit` (<= the candidates) whose running sum reaches `target`, or
  /// limit - 1 when none does.
  Crossing locate(double target, std::size_t limit) {
    double acc = 0;
    std::size_t rank = 0;
    for (std::uint32_t b = 0; b < kBuckets; ++b) {
      const std::size_t n = bucket_count(b);
      if (n == 0) continue;
      if (rank + n < limit && acc + bucket_mass(b) < target) {
        acc += bucket_mass(b);
        rank += n;
        continue;
      }
      const std::span<const Entry> e = members(b);
      for (std::size_t i = 0; i < e.size() && rank < limit; ++i, ++rank) {
        const double before = acc;
        acc += e[i].weight;
        if (acc >= target || rank + 1 == limit) return {rank, before, acc, e[i].token, tied(e, i)};
      }
    }
    MOEKIT_EXPECTS(false, "RankedCandidates::locate: limit beyond the candidates");
    return {};
  }

 private:
  static constexpr std::uint32_t kBuckets = 256;
  static constexpr std::size_t kWays = 4;

  [[nodiscard]] double bucket_mass(std::uint32_t b) const noexcept {
    return (mass_[0][b] + mass_[1][b]) + (mass_[2][b] + mass_[3][b]);
  }
  [[nodiscard]] std::size_t bucket_count(std::uint32_t b) const noexcept {
    return std::size_t{count_[0][b]} + count_[1][b] + count_[2][b] + count_[3][b];
  }
  /// Bucket b's candidates in descending order of logit (ties: ascending token).
  std::span<const Entry> members(std::uint32_t b) {
    if (members_of_ == b) return members_;  // the draw often lands in the cut's bucket
    members_of_ = b;
    members_.clear();
    const auto take = [&](std::size_t i) {
      if (bucket_[i] == b) members_.push_back({l_[token_[i]], token_[i], weight_[i]});
    };
    // Eight bucket numbers at a time: most words hold none of b's (a word has a zero byte after
    // the xor exactly when it holds b).
    const std::uint64_t ones = 0x0101010101010101u, spread = b * ones;
    std::size_t i = 0;
    for (; i + 8 <= bucket_.size(); i += 8) {
      std::uint64_t word;
      std::memcpy(&word, bucket_.data() + i, 8);
      word ^= spread;
      if (((word - ones) & ~word & (ones << 7)) != 0)
        for (std::size_t j = i; j < i + 8; ++j) take(j);
    }
    for (; i < bucket_.size(); ++i) take(i);
    std::sort(members_.begin(), members_.end(), [](const Entry& x, const Entry& y) {
      return x.logit > y.logit || (x.logit == y.logit && x.token < y.token);
    });
    return members_;
  }
  [[nodiscard]] static bool tied(std::span<const Entry> e, std::size_t i) noexcept {
    return (i > 0 && e[i - 1].logit == e[i].logit) ||
           (i + 1 < e.size() && e[i + 1].logit == e[i].logit);
  }

  const float* l_ = nullptr;
  const std::uint32_t* token_ = nullptr;
  float scale_ = 0;
  std::vector<std::uint8_t> bucket_;
  std::vector<float> weight_;
  std::uint32_t count_[kWays][kBuckets] = {};
  double mass_[kWays][kBuckets] = {};
  std::vector<Entry> members_;
  std::uint32_t members_of_ = kBuckets;  ///< the bucket members_ holds (kBuckets: none)
};

/// Sorts `v` by the high 32 bits of each value, ascending and stable (LSD radix sort, three
/// 11-bit digits); `tmp` is scratch.
inline void radix_sort_high(std::vector<std::uint64_t>& v, std::vector<std::uint64_t>& tmp) {
  constexpr std::size_t kDigit = 2048;
  std::vector<std::uint32_t> count(3 * kDigit, 0);
  for (const std::uint64_t x : v)
    for (std::size_t d = 0; d < 3; ++d) ++count[d * kDigit + ((x >> (32 + 11 * d)) & (kDigit - 1))];
  tmp.resize(v.size());
  for (std::size_t d = 0; d < 3; ++d) {
    std::uint32_t* c = count.data() + d * kDigit;
    std::exclusive_scan(c, c + kDigit, c, 0u);
    for (const std::uint64_t x : v) tmp[c[(x >> (32 + 11 * d)) & (kDigit - 1)]++] = x;
    v.swap(tmp);
  }
}

}  // namespace detail

class Sampler {
 public:
  /// How many samples each path decided (the exact ones should be rare; tests and the benchmark
  /// check).
  struct PathCounts {
    std::uint64_t greedy = 0, top_k = 0;
    std::uint64_t approximate = 0;       ///< fast exp weights
    std::uint64_t exact_candidates = 0;  ///< then expf weights for the candidates
    std::uint64_t exact_all = 0;         ///< then expf weights for the whole vocabulary
    std::uint64_t reference = 0;         ///< then the original arithmetic (`reference`)
    std::uint64_t candidates = 0;        ///< logits collected (nuclei, top-k), over all samples
    std::uint64_t split = 0;  ///< samples whose passes over the vocabulary ran on the pool
  };

  /// `isa` picks the version of the vector passes (tests compare them); the CPU must support it.
  explicit Sampler(SamplerConfig c, moekit::Isa isa = moekit::detect_isa())
      : cfg_(c), rng_(c.seed), passes_{isa} {
    MOEKIT_EXPECTS(c.temperature >= 0 && std::isfinite(c.temperature),
                   "--temp must be a finite number >= 0");
    MOEKIT_EXPECTS(c.top_p > 0 && c.top_p <= 1, "--top-p must be in (0, 1]");
    MOEKIT_EXPECTS(moekit::isa_supported(isa), "Sampler: this CPU cannot run the requested ISA");
  }

  /// Index of the largest logit (the first one on ties, as torch.argmax).
  static std::uint32_t argmax(std::span<const float> logits) noexcept {
    return static_cast<std::uint32_t>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
  }

  /// The next token. Throws on empty logits, NaN, +inf, or when every logit is -inf.
  std::uint32_t sample(std::span<const float> logits) {
    split_ = false;
    const std::uint32_t token = pick(logits);
    paths_.split += split_;
    return token;
  }

  /// Runs the passes over the vocabulary on `pool`'s threads (null: on the caller alone), when
  /// the pool's last decode step ran on all of them (ThreadPool::last_step_on_team) and the
  /// vocabulary is large enough to repay a job. The pool must outlive the sampler's use of it.
  void set_thread_pool(moekit::ThreadPool* pool) noexcept { pool_ = pool; }

  [[nodiscard]] const SamplerConfig& config() const noexcept { return cfg_; }
  [[nodiscard]] const PathCounts& paths() const noexcept { return paths_; }

 private:
  std::uint32_t pick(std::span<const float> logits) {
    MOEKIT_EXPECTS(!logits.empty(), "Sampler: empty logits");
    // Nucleus sampling below top-p 1 needs the largest logit alone, which a lighter vector pass
    // finds when every logit is finite; the rest (and any -inf, NaN or +inf) take the full scan,
    // as does the portable path (its compiled lighter pass is no faster than the scan).
    if (cfg_.temperature != 0 && cfg_.top_p < 1 && passes_.isa != moekit::Isa::generic &&
        (cfg_.top_k == 0 || cfg_.top_k >= logits.size()))
      if (const SamplerTop t = passes_.top(logits.data(), logits.size()); t.finite)
        return nucleus(logits, t.top);
    const std::int32_t top_key = check(logits);
    if (cfg_.temperature == 0) {
      ++paths_.greedy;
      return first_with_key(logits, top_key);
    }
    if (cfg_.top_k != 0 && cfg_.top_k < logits.size()) {
      ++paths_.top_k;
      return sample_top_k(logits);
    }
    return nucleus(logits, detail::from_key(top_key));
  }

  /// Distances below the largest logit, in units of the temperature, of the floors above which
  /// candidates are collected: a floor whose candidates hold the nucleus bounds them.
  static constexpr std::array<float, 17> kRungNats = {1, 1.5, 2, 2.5, 3,  3.5, 4,  4.5, 5,
                                                      6, 7,   8, 9,   10, 11,  12, 13};
  static constexpr std::size_t kRungs = kRungNats.size();
  /// The next sample starts at the lowest of the floors that the last kRungMemory samples each
  /// needed: the highest holding p + kRungRoom (1 - p) of their mass. A rung that proves too high
  /// costs a second pass over the logits, one too low only more candidates; consecutive tokens'
  /// nuclei differ much (bench/RESULTS.md, "Sampler cost", has the choice of these two).
  static constexpr double kRungRoom = 0.8;
  static constexpr std::size_t kRungMemory = 4;
  static constexpr std::size_t kNotCollected = std::numeric_limits<std::size_t>::max();
  /// Fewest logits per thread for which a pass is split over the pool. Measured quiet at 2
  /// threads on a Xeon with AMX, a 32 000-logit vocabulary split in two took 23–25 µs a sample
  /// against 18–19 on the caller alone (greedy's scan alone 5.0–5.2 against 2.3–2.6), and on
  /// Emerald Rapids the split gained nothing: a job's hand-off costs more than half of a pass over
  /// 32 000 logits, so vocabularies of that size stay on one thread and the 128 k–152 k ones
  /// (Llama 3, Qwen) split (bench/RESULTS.md, "The sampler's passes stay on one thread").
  static constexpr std::size_t kMinPart = 32768;
  /// Room after each range's collected indices: the vector passes store whole registers.
  static constexpr std::size_t kCollectSlack = 16;

  /// The generator as one sample sees it: draws are recorded, and each attempt, after `rewind`,
  /// gets the same numbers, so the generator ends where the deciding attempt leaves it.
  class Draws {
   public:
    using result_type = std::mt19937_64::result_type;
    explicit Draws(std::mt19937_64& g) noexcept : g_(g) {}
    static constexpr result_type min() { return std::mt19937_64::min(); }
    static constexpr result_type max() { return std::mt19937_64::max(); }
    result_type operator()() {
      if (next_ == taken_) {
        MOEKIT_EXPECTS(taken_ < seen_.size(), "Sampler: more draws than one sample takes");
        seen_[taken_++] = g_();
      }
      return seen_[next_++];
    }
    Draws& rewind() noexcept {
      next_ = 0;
      return *this;
    }

   private:
    std::mt19937_64& g_;
    std::array<result_type, 4> seen_{};
    std::size_t taken_ = 0, next_ = 0;
  };

  enum class Verdict { token, unsure, reference };
  /// The share of the total mass the candidates must hold: top_p, or at top-p 1 the uniform
  /// number of the draw (`whole`), taken before the candidates are gathered.
  struct Need {
    double share;
    bool whole = false;
  };
  struct Pick {
    Verdict verdict;
    std::uint32_t token = 0;
  };

  /// The largest logit's key, after refusing logits no distribution comes from.
  std::int32_t check(std::span<const float> l) {
    const std::size_t n = l.size();
    const auto s = scan(l);
    constexpr float inf = std::numeric_limits<float>::infinity();
    if (s.min_key < detail::order_key(-inf) || s.max_key > detail::order_key(inf)) {
      const auto bad = std::find_if(l.begin(), l.end(), [](float v) { return std::isnan(v); });
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "Sampler: logit " + std::to_string(bad - l.begin()) + " of " +
                               std::to_string(n) + " is NaN (the model's output is broken)");
    }
    if (s.max_key == detail::order_key(inf)) {
      const auto bad = std::find(l.begin(), l.end(), inf);
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "Sampler: logit " + std::to_string(bad - l.begin()) + " of " +
                               std::to_string(n) + " is +inf");
    }
    MOEKIT_EXPECTS(s.max_key != detail::order_key(-inf), "Sampler: every logit is -inf");
    return s.max_key;
  }

  /// The first index whose logit has `key` (the lane maxima say which group holds it).
  std::uint32_t first_with_key(std::span<const float> l, std::int32_t key) const noexcept {
    const std::size_t groups = l.size() / detail::kGroup;
    std::size_t from = groups * detail::kGroup;
    for (std::size_t g = 0; g < groups; ++g) {
      const auto* m = lane_max_.data() + g * detail::kLanes;
      if (std::find(m, m + detail::kLanes, key) != m + detail::kLanes) {
        from = g * detail::kGroup;
        break;
      }
    }
    while (detail::order_key(l[from]) != key) ++from;
    return static_cast<std::uint32_t>(from);
  }

  /// Nucleus sampling without top-k: attempts in order of cost, each deciding only what it can
  /// prove the reference decides.
  std::uint32_t nucleus(std::span<const float> l, float top) {
    Draws draws(rng_);
#if !defined(__GLIBCXX__)  // the draw's arithmetic below is libstdc++'s
    if (cfg_.top_p >= 1) {
      ++paths_.reference;
      return reference(l, draws);
    }
#else
    if (cfg_.top_p >= 1 && !keeps_second(l, top)) {  // the reference draws nothing: the top
      ++paths_.approximate;
      return first_with_key(l, detail::order_key(top));
    }
#endif
    Pick p = approximate(l, top, draws);
    std::uint64_t* path = &paths_.approximate;
    if (p.verdict == Verdict::unsure) {
      p = exact_candidates(l, top, draws.rewind());
      path = &paths_.exact_candidates;
    }
    if (p.verdict == Verdict::unsure) {
      p = exact_all(l, top, draws.rewind());
      path = &paths_.exact_all;
    }
    if (p.verdict != Verdict::token) {
      p = {Verdict::token, reference(l, draws.rewind())};
      path = &paths_.reference;
    }
    ++*path;
    return p.token;
  }

  /// Bound on the difference between the reference's running probabilities (and its draw's
  /// cumulative ones) and ours, relative to them, when a share of our total comes from weights
  /// within `approx` (relative) of e^x: expf is within one ulp (2^-23) of e^x; sums of up to n + 2
  /// double terms in other orders on each side (gamma), and a share of our total from the weight
  /// pass's float sums; the weights below e^-87 (ours: e^-87) as an absolute n 2^-125 beside a
  /// total >= 1. Doubled, for safety.
  static double margin(double approx_share, std::size_t n, double pass_sum_share = 0) noexcept {
    const double k = approx_share * (sampler_exp_approx_error + 0x1p-23 + 0x1p-45) +
                     pass_sum_share * sampler_exp_sum_error;
    const double u = static_cast<double>(n + 2) * 0x1p-53, gamma = u / (1 - u);
    return 2 * (2 * k / (1 - k) + 9 * gamma + static_cast<double>(n) * 0x1p-125);
  }

  /// First attempt: the fast exp's weights for the whole vocabulary, collecting the logits above
  /// the rung the last sample found enough.
  Pick approximate(std::span<const float> l, float top, Draws& draws) {
    const std::size_t n = l.size();
    const auto floors = rung_floors(top);
    const float floor = first_rung_ < kRungs ? floors[first_rung_] : -inf_;
    const auto sums = exp_weights(l, top, floor);
    const double eps = margin(1, n, 1);  // the draw's sums come from the weights alone
    const Need need = needed(draws);
    if (gather(l, top, floors, sums.total, eps, need, first_rung_, sums.collected) == 0)
      return {Verdict::unsure};
    return decide(n, sums.total, eps, margin(1, n), need, draws);
  }

  /// Second: expf's weights for the candidates of the first; the total is off by at most the
  /// rest's share of the fast exp's error (the first attempt's weights summed again in double:
  /// its total has the float sums' error, sampler_exp_sum_error, of the whole).
  Pick exact_candidates(std::span<const float> l, float top, Draws& draws) {
    const std::size_t n = l.size();
    if (ranked_.size() == 0) return {Verdict::unsure};
    const double approx_total = double_sum(weights_), approx_held = ranked_.held();
    ranked_.reweigh([&](float logit) { return std::exp((logit - top) / cfg_.temperature); });
    const double held = ranked_.held(), rest = std::max(0.0, approx_total - approx_held);
    const double total = held + rest, eps = margin(rest / approx_total, n);
    const Need need = needed(draws);
    if (!holds(held, total, eps, need) && ranked_.size() < n) return {Verdict::unsure};
    return decide(n, total, eps, margin(0, n), need, draws);
  }

  /// Third: expf's weights for the whole vocabulary.
  Pick exact_all(std::span<const float> l, float top, Draws& draws) {
    const std::size_t n = l.size();
    weights_.resize(n);
    double total = 0;
    for (std::size_t i = 0; i < n; ++i)
      total += weights_[i] = std::exp((l[i] - top) / cfg_.temperature);
    const double eps = margin(0, n);
    const Need need = needed(draws);
    if (gather(l, top, rung_floors(top), total, eps, need, first_rung_, kNotCollected) == 0)
      return {Verdict::unsure};
    return decide(n, total, eps, eps, need, draws);
  }

  /// How many ranges of at most `grain` logits a pass over n splits into: one per thread of pool_
  /// (ranges whole groups of `scan`, so that each range's lane maxima are the whole's), or one.
  std::size_t ranges(std::size_t n, std::size_t& grain) const noexcept {
    const bool team = pool_ && pool_->size() > 1 && pool_->last_step_on_team();
    const std::size_t k = team ? std::min<std::size_t>(pool_->size(), n / kMinPart) : 1;
    if (k <= 1) {
      grain = n;
      return 1;
    }
    grain = (n / k + detail::kGroup - 1) / detail::kGroup * detail::kGroup;
    return (n + grain - 1) / grain;
  }

  /// passes_.scan over the logits into lane_max_, by ranges on the pool's threads.
  SamplerScan scan(std::span<const float> l) {
    const std::size_t n = l.size();
    lane_max_.resize(sampler_scan_lanes(n));
    std::size_t grain;
    const std::size_t k = ranges(n, grain);
    if (k == 1) return passes_.scan(l.data(), n, lane_max_.data());
    split_ = true;
    range_scans_.resize(k);
    pool_->parallel_for(0, n, grain, [&](std::size_t b, std::size_t e) {
      const std::size_t lanes = b / detail::kGroup * detail::kLanes;
      range_scans_[b / grain] = passes_.scan(l.data() + b, e - b, lane_max_.data() + lanes);
    });
    SamplerScan s = range_scans_[0];
    for (const SamplerScan& r : range_scans_) {
      s.max_key = std::max(s.max_key, r.max_key);
      s.min_key = std::min(s.min_key, r.min_key);
    }
    return s;
  }

  /// passes_.exp_weights over the logits into weights_ and cand_idx_, by ranges on the pool's
  /// threads: each range collects into its own stretch of cand_idx_ (its indices counted from its
  /// start), then the stretches are moved down into one ascending list.
  SamplerExpSums exp_weights(std::span<const float> l, float top, float floor) {
    const std::size_t n = l.size();
    std::size_t grain;
    const std::size_t k = ranges(n, grain);
    weights_.resize(n);
    cand_idx_.resize(n + kCollectSlack * k);
    const float t = cfg_.temperature;
    if (k == 1)
      return passes_.exp_weights(l.data(), n, top, t, floor, weights_.data(), cand_idx_.data());
    split_ = true;
    range_sums_.resize(k);
    pool_->parallel_for(0, n, grain, [&](std::size_t b, std::size_t e) {
      const std::size_t r = b / grain;
      range_sums_[r] = passes_.exp_weights(l.data() + b, e - b, top, t, floor, weights_.data() + b,
                                           cand_idx_.data() + b + kCollectSlack * r);
    });
    SamplerExpSums s;
    for (std::size_t r = 0; r < k; ++r) {  // in range order: the same total on every run
      const std::size_t b = r * grain;
      const std::uint32_t* from = cand_idx_.data() + b + kCollectSlack * r;
      std::uint32_t* to = cand_idx_.data() + s.collected;  // never above `from`
      for (std::size_t i = 0; i < range_sums_[r].collected; ++i)
        to[i] = from[i] + static_cast<std::uint32_t>(b);
      s.collected += range_sums_[r].collected;
      s.total += range_sums_[r].total;
    }
    return s;
  }

  /// The sum of w in double, in eight interleaved parts (one chain of adds would take longer).
  static double double_sum(std::span<const float> w) noexcept {
    double part[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= w.size(); i += 8)
      for (std::size_t j = 0; j < 8; ++j) part[j] += w[i + j];
    for (; i < w.size(); ++i) part[0] += w[i];
    return ((part[0] + part[1]) + (part[2] + part[3])) +
           ((part[4] + part[5]) + (part[6] + part[7]));
  }

  std::array<float, kRungs> rung_floors(float top) const noexcept {
    std::array<float, kRungs> f;
    for (std::size_t r = 0; r < kRungs; ++r) f[r] = top - kRungNats[r] * cfg_.temperature;
    return f;
  }

  /// Collects the candidates (the logits above the first floor, from rung r down, whose weights
  /// hold the nucleus with room to spare) into `ranked_`; returns how many, 0 when none proves
  /// to hold it. `collected`: cand_idx_ already holds rung r's logits, that many.
  std::size_t gather(std::span<const float> l, float top, const std::array<float, kRungs>& floors,
                     double total, double eps, Need need, std::size_t r, std::size_t collected) {
    const std::size_t n = l.size();
    const double p = need.share;
    cand_idx_.resize(n + 16);
    for (;; ++r) {
      const bool all = r >= kRungs;
      const float floor = all ? -inf_ : floors[r];
      const std::size_t c = collected != kNotCollected
                                ? std::exchange(collected, kNotCollected)
                                : passes_.collect(l.data(), n, floor, cand_idx_.data());
      paths_.candidates += c;
      ranked_.assign(l.data(), weights_.data(), cand_idx_.data(), c, top,
                     all ? 2 * kRungNats.back() * cfg_.temperature : top - floor);
      if (c == n || holds(ranked_.held(), total, eps, need)) {
        learn_first_rung(std::min(r, kRungs), (p + kRungRoom * (1 - p)) * total);
        return c;
      }
      if (all) return 0;
    }
  }

  /// The uniform number std::discrete_distribution draws (libstdc++: one generate_canonical).
  static double canonical(Draws& draws) {
    return std::generate_canonical<double, std::numeric_limits<double>::digits>(draws);
  }

  /// Whether the reference keeps more than the top token at top-p 1 (and so draws): its running
  /// probability starts at 1 / sum, 1 only when the sum stays 1, every other weight at most 2^-53
  /// (a logit more than 36.7 T below the top). The lane maxima of the scan usually show a second
  /// one above e^-36 > 2^-53; else a pass collects those within 37 T and expf decides.
  bool keeps_second(std::span<const float> l, float top) {
    const float t = cfg_.temperature;
    const std::int32_t floor = detail::order_key(top - 36 * t);
    std::size_t above = 0;
    for (const std::int32_t key : lane_max_)
      if (key > floor && ++above == 2) return true;  // the top's lane and another
    cand_idx_.resize(l.size() + kCollectSlack);
    const std::size_t c = passes_.collect(l.data(), l.size(), top - 37 * t, cand_idx_.data());
    const std::uint32_t first = first_with_key(l, detail::order_key(top));
    for (std::size_t i = 0; i < c; ++i)
      if (cand_idx_[i] != first && double(std::exp((l[cand_idx_[i]] - top) / t)) > 0x1p-53)
        return true;
    return false;
  }

  /// What this attempt's candidates must hold: top_p, or at top-p 1 the draw's uniform number.
  Need needed(Draws& draws) const {
    if (cfg_.top_p < 1) return {cfg_.top_p};
    return {canonical(draws), true};
  }

  /// Whether candidates of mass `held` hold what `need` asks of a total within `eps` (at top-p 1
  /// with room for the draw's margin, which is wider: see draw).
  static bool holds(double held, double total, double eps, Need need) noexcept {
    const double share = need.whole ? std::min(1.0, need.share * (1 + 4 * eps)) : need.share;
    return held / total * (1 - eps) >= share;
  }

  /// Records that `ranked_`, collected at rung r, held this sample's nucleus, and which rung
  /// would have held `room`; the next sample starts at the lowest of the last few.
  void learn_first_rung(std::size_t r, double room) {
    std::array<float, kRungs> distance;
    for (std::size_t i = 0; i < r; ++i) distance[i] = kRungNats[i] * cfg_.temperature;
    r = ranked_.first_holding(distance.data(), r, room);
    needed_rungs_[samples_gathered_++ % kRungMemory] = r;
    first_rung_ = *std::max_element(needed_rungs_.begin(), needed_rungs_.end());
  }

  /// Where the reference cuts and which kept token it draws, from the candidates in `ranked_`,
  /// whose running sums over `total` are within `cut_eps` of the reference's probabilities (and
  /// whose kept weights, over their sum, within `draw_eps` of its cumulative ones).
  Pick decide(std::size_t n, double total, double cut_eps, double draw_eps, Need need,
              Draws& draws) {
    const double p = cfg_.top_p;
    // The kept mass lies between the reference's earliest possible cut and its latest: at top-p 1
    // all but a tail of at most cut_eps of the total (margin doubles).
    double kept_low = total * (1 - 2 * cut_eps), kept_high = total;
    if (!need.whole) {
      const auto low = ranked_.locate(p * total / (1 + cut_eps), ranked_.size());
      const auto high = ranked_.locate(p * total / (1 - cut_eps), ranked_.size());
      if (!(high.through / total * (1 - cut_eps) >= p || high.rank + 1 == n))
        return {Verdict::unsure};
      if (low.rank == 0) {  // the reference may keep the top alone, and then draws nothing
        if (high.rank != 0) return {Verdict::unsure};
        return low.tied ? Pick{Verdict::reference} : Pick{Verdict::token, low.token};
      }
      kept_low = low.through;
      kept_high = high.through;
    }
#if defined(__GLIBCXX__)
    return draw(need.whole ? need.share : canonical(draws), total, cut_eps, kept_low, kept_high,
                2 * draw_eps);
#else
    (void)draw_eps, (void)draws;
    return {Verdict::reference};
#endif
  }

  /// The kept token std::discrete_distribution picks: libstdc++'s takes one generate_canonical
  /// number u and returns the first kept index whose cumulative probability (a running sum of the
  /// weights over the kept ones' sum, the last set to 1) reaches it. Decided when u falls on one
  /// token whichever kept mass in [kept_low, kept_high] the reference has and with its sums within
  /// eps of ours, and the token is kept wherever the reference cuts (no earlier rank may be the
  /// cut: it is at most the first possible cut).
  Pick draw(double u, double total, double cut_eps, double kept_low, double kept_high, double eps) {
    const auto at = ranked_.locate(u * kept_low, ranked_.size());
    if (at.tied) return {Verdict::reference};
    if (at.rank > 0 && !(at.before / total * (1 + cut_eps) < cfg_.top_p)) return {Verdict::unsure};
    if (at.rank > 0 && !(at.before * (1 + eps) / (kept_low * (1 - eps)) < u))
      return {Verdict::unsure};
    if (!(u <= at.through * (1 - eps) / (kept_high * (1 + eps)))) return {Verdict::unsure};
    return {Verdict::token, at.token};
  }

  /// The k highest logits (ties: lower token first), then the reference's arithmetic on them.
  std::uint32_t sample_top_k(std::span<const float> l) {
    const std::size_t n = l.size(), k = cfg_.top_k;
    // The sets whose maxima the scan gave are disjoint, so at least k logits reach the k-th
    // highest maximum: of whole groups (few, coarse) when there are k, else of lanes.
    const std::size_t groups = n / detail::kGroup,
                      tail = lane_max_.size() - groups * detail::kLanes;
    keys_.clear();
    if (k <= groups + tail) {
      for (std::size_t g = 0; g < groups; ++g) {
        const auto* m = lane_max_.data() + g * detail::kLanes;
        keys_.push_back(*std::max_element(m, m + detail::kLanes));
      }
      keys_.insert(keys_.end(), lane_max_.end() - static_cast<std::ptrdiff_t>(tail),
                   lane_max_.end());
    } else if (k <= lane_max_.size()) {
      keys_.assign(lane_max_.begin(), lane_max_.end());
    }
    float floor = -std::numeric_limits<float>::infinity();
    if (!keys_.empty()) {
      std::nth_element(keys_.begin(), keys_.begin() + (k - 1), keys_.end(), std::greater<>());
      floor = detail::from_key(keys_[k - 1]);
    }
    cand_idx_.resize(n + 16);
    const std::size_t c = passes_.collect(l.data(), n, floor, cand_idx_.data());
    paths_.candidates += c;
    packed_.resize(c);  // key in the high half, ~token in the low: descending = our order
    for (std::size_t i = 0; i < c; ++i)
      packed_[i] = std::uint64_t(std::uint32_t(detail::order_key(l[cand_idx_[i]])) ^ 0x80000000u)
                       << 32 |
                   (0xffffffffu - cand_idx_[i]);
    const auto kth = packed_.begin() + static_cast<std::ptrdiff_t>(k);
    std::nth_element(packed_.begin(), kth - 1, packed_.end(), std::greater<>());
    std::sort(packed_.begin(), kth, std::greater<>());
    const auto token = [&](std::size_t i) { return 0xffffffffu - std::uint32_t(packed_[i]); };
    probs_.resize(k);
    const float top = l[token(0)];
    double sum = 0;
    for (std::size_t i = 0; i < k; ++i)
      sum += probs_[i] = std::exp((l[token(i)] - top) / cfg_.temperature);
    std::discrete_distribution<std::size_t> pick(probs_.begin(), probs_.begin() + kept(sum, k));
    return token(pick(rng_));
  }

  /// How many of the sorted weights in probs_ the reference keeps: its running probability
  /// reaches top_p there.
  std::size_t kept(double sum, std::size_t n) const noexcept {
    double mass = 0;
    for (std::size_t i = 0; i < n; ++i) {
      mass += probs_[i] / sum;
      if (mass >= cfg_.top_p) return i + 1;
    }
    return n;
  }

  /// The original sampler's draw, by its arithmetic in a radix sort's order: tied logits have
  /// equal weights, so their order matters only when the drawn logit is tied, and then the
  /// original itself decides.
  std::uint32_t reference(std::span<const float> l, Draws& draws) {
    const std::size_t n = l.size();
    packed_.resize(n);  // ascending = descending logit, then ascending token
    for (std::size_t i = 0; i < n; ++i)
      packed_[i] = std::uint64_t(~(std::uint32_t(detail::order_key(l[i])) ^ 0x80000000u)) << 32 | i;
    detail::radix_sort_high(packed_, scratch_);
    const auto token = [&](std::size_t i) { return std::uint32_t(packed_[i]); };
    probs_.resize(n);
    const float top = l[token(0)];
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i)
      sum += probs_[i] = std::exp((l[token(i)] - top) / cfg_.temperature);
    std::discrete_distribution<std::size_t> pick(probs_.begin(), probs_.begin() + kept(sum, n));
    const std::size_t r = pick(draws);
    const auto key = [&](std::size_t i) { return packed_[i] >> 32; };
    if ((r == 0 || key(r - 1) != key(r)) && (r + 1 == n || key(r + 1) != key(r))) return token(r);
    return original(l, draws.rewind());
  }

  /// The original sampler, verbatim: a full sort (std::sort's order on ties).
  std::uint32_t original(std::span<const float> logits, Draws& draws) {
    const std::size_t n = logits.size();
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0u);
    std::sort(order_.begin(), order_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b]; });
    probs_.resize(n);
    const float top = logits[order_[0]];
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i)
      sum += probs_[i] = std::exp((logits[order_[i]] - top) / cfg_.temperature);
    std::discrete_distribution<std::size_t> pick(probs_.begin(), probs_.begin() + kept(sum, n));
    return order_[pick(draws)];
  }

  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  SamplerVectorPasses passes_;
  moekit::ThreadPool* pool_ = nullptr;
  std::vector<SamplerScan> range_scans_;
  std::vector<SamplerExpSums> range_sums_;
  PathCounts paths_;
  bool split_ = false;  ///< whether this sample's passes ran on the pool
  std::vector<std::int32_t> lane_max_, keys_;
  std::vector<float> weights_;
  std::vector<std::uint32_t> cand_idx_, order_;
  std::vector<std::uint64_t> packed_, scratch_;
  std::vector<double> probs_;
  detail::RankedCandidates ranked_;
  std::size_t first_rung_ = 6;  ///< where the next sample's first attempt collects (kRungs: all)
  std::array<std::size_t, kRungMemory> needed_rungs_{};  ///< of the last samples, cyclically
  std::size_t samples_gathered_ = 0;
  static constexpr float inf_ = std::numeric_limits<float>::infinity();
};

}  // namespace moekit::engine
