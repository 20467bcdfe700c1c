#pragma once
/// \file Perplexity and KL divergence over a text file (`moe-run --perplexity FILE`).
///
/// Protocol: the file's text ('\r' removed) is encoded as one string without BOS, cut into chunks
/// of `ctx` tokens (the last may be shorter), and every token of a chunk is scored after a BOS:
/// the model sees BOS, c0 … c(n−2) and position i predicts c(i). So a chunk of n tokens uses n
/// positions of context and scores n tokens. Perplexity = exp(mean NLL) over all scored tokens.
/// `prefill` mode runs each chunk as one forward (Phase::prefill); `decode` mode prefills the BOS
/// and then feeds the chunk token by token (Phase::decode, teacher forcing), the path on which
/// token policies (MoBiLE's fallback) and decode-time prefetching act.
///
/// KL divergence against a reference run: the reference run saves, per scored position, its
/// log-probabilities of the K most likely tokens (`--save-logits`, the .mklogp file below); a
/// later run compares its own distribution Q with the reference P coarsened to the same K tokens
/// plus one "rest" bucket: KL = Σ_top-K p_i (log p_i − log q_i) + p_rest (log p_rest − log q_rest).
/// By the data-processing inequality this is a lower bound of the full KL; with K = vocab it is
/// the full KL. A run compared with its own saved file gives exactly 0.
///
/// The .mklogp file format is described in logprob_file.hpp.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/finite_check.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/pipeline.hpp"  // WeightView, used by moe_layer.hpp

#include "moekit/engine/logprob_file.hpp"
#include "moekit/engine/model.hpp"

namespace moekit::engine {

/// The text of `path` with every '\r' removed; throws `Error(io)` naming `flag` and the path.
inline std::string read_text_stripped(const std::filesystem::path& path,
                                      std::string_view flag = "--perplexity") {
  require_regular_file(path, flag);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    moekit::detail::fail(moekit::ErrorKind::io,
                         std::string(flag) + ": cannot open '" + path.string() + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad())
    moekit::detail::fail(moekit::ErrorKind::io,
                         std::string(flag) + ": read error on '" + path.string() + "'");
  std::erase(text, '\r');
  return text;
}

/// Totals of a perplexity run.
struct PerplexityResult {
  std::size_t tokens = 0;  ///< scored tokens
  std::size_t chunks = 0;
  double nll_sum = 0;   ///< Σ −log p(target), nats
  bool has_kl = false;  ///< compared with a reference
  double kl_sum = 0, kl_max = 0;
  std::size_t top1_same = 0;  ///< positions whose most likely token equals the reference's

  [[nodiscard]] double mean_nll() const noexcept { return tokens ? nll_sum / double(tokens) : 0; }
  [[nodiscard]] double perplexity() const noexcept { return std::exp(mean_nll()); }
  [[nodiscard]] double mean_kl() const noexcept { return tokens ? kl_sum / double(tokens) : 0; }
  [[nodiscard]] double top1_agreement() const noexcept {
    return tokens ? double(top1_same) / double(tokens) : 0;
  }
};

/// Scores positions one at a time: NLL of the target, optionally the top-K log-probs into `save`
/// and the KL divergence against `reference` (whose position i must score the same target).
class PerplexityMeter {
 public:
  PerplexityMeter(std::uint32_t vocab, LogProbFile* save = nullptr,
                  const LogProbFile* reference = nullptr)
      : vocab_(vocab), save_(save), ref_(reference) {
    if (save_)
      MOEKIT_EXPECTS(save_->vocab() == vocab, "--save-logits: the file's vocabulary differs");
    if (ref_ && ref_->vocab() != vocab)
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "--kl-reference: the reference has a vocabulary of " +
                               std::to_string(ref_->vocab()) + " tokens, this model " +
                               std::to_string(vocab));
    r_.has_kl = ref_ != nullptr;
    lp_.resize(vocab);
  }

  /// Scores the next position: `logits` (vocab) predict `target`.
  void add(std::span<const float> logits, std::uint32_t target) {
    MOEKIT_EXPECTS(
        logits.size() == vocab_ && target < vocab_,
        "PerplexityMeter::add: logits are not one vocabulary row, or target out of range");
    const std::size_t i = r_.tokens;
    if (const auto bad = moekit::io::first_non_finite(logits))  // else perplexity nan, rc 0
      moekit::detail::fail(moekit::ErrorKind::invalid_format,
                           "--perplexity: the model's logit of token " + std::to_string(*bad) +
                               " at scored position " + std::to_string(i) + " is " +
                               std::to_string(logits[*bad]) +
                               " (not finite): the weights or experts hold NaN/Inf, or an "
                               "activation overflowed");
    double mx = -std::numeric_limits<double>::infinity();
    for (float v : logits) mx = std::max(mx, double(v));
    double s = 0;
    for (float v : logits) s += std::exp(double(v) - mx);
    const double lse = mx + std::log(s);
    // Rounded to f32 as stored in .mklogp, so a run compared with its own file gives KL = 0.
    for (std::size_t v = 0; v < vocab_; ++v) lp_[v] = static_cast<float>(double(logits[v]) - lse);
    r_.nll_sum += -double(lp_[target]);
    if (save_) {
      const std::uint32_t K = save_->top_k();
      best_.resize(vocab_);
      std::iota(best_.begin(), best_.end(), 0u);
      std::partial_sort(best_.begin(), best_.begin() + K, best_.end(),
                        [&](std::uint32_t a, std::uint32_t b) {
                          return lp_[a] > lp_[b] || (lp_[a] == lp_[b] && a < b);
                        });
      top_lp_.resize(K);
      for (std::uint32_t j = 0; j < K; ++j) top_lp_[j] = lp_[best_[j]];
      save_->add(target, lp_[target], std::span(best_).first(K), top_lp_);
    }
    if (ref_) compare(i, target);
    ++r_.tokens;
  }

  /// Marks the end of a chunk.
  void end_chunk() noexcept { ++r_.chunks; }

  [[nodiscard]] const PerplexityResult& result() const noexcept { return r_; }

 private:
  void compare(std::size_t i, std::uint32_t target) {
    if (i >= ref_->positions())
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "--kl-reference: the reference has only " +
                               std::to_string(ref_->positions()) +
                               " positions; run with the same text, --ctx-size and --chunks");
    if (ref_->target(i) != target)
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "--kl-reference: position " + std::to_string(i) + " scores token " +
                               std::to_string(ref_->target(i)) + " in the reference but " +
                               std::to_string(target) +
                               " here; run with the same text, --ctx-size and --chunks");
    const auto ids = ref_->ids(i);
    const auto lps = ref_->logprobs(i);
    double kl = 0, p_top = 0, q_top = 0;
    for (std::size_t j = 0; j < ids.size(); ++j) {
      const double lp = lps[j], lq = lp_[ids[j]];
      const double p = std::exp(lp);
      p_top += p;
      q_top += std::exp(lq);
      kl += p * (lp - lq);
    }
    if (ids.size() < vocab_) {  // the "rest" bucket (tokens outside the reference's top-K)
      const double p_rest = 1.0 - p_top;
      const double q_rest = std::max(1.0 - q_top, 1e-30);
      if (p_rest > 1e-12) kl += p_rest * (std::log(p_rest) - std::log(q_rest));
    }
    kl = std::max(kl, 0.0);  // rounding of a true 0
    r_.kl_sum += kl;
    r_.kl_max = std::max(r_.kl_max, kl);
    const auto argmax = static_cast<std::uint32_t>(
        std::distance(lp_.begin(), std::max_element(lp_.begin(), lp_.end())));
    r_.top1_same += argmax == ids[0];
  }

  std::uint32_t vocab_;
  LogProbFile* save_;
  const LogProbFile* ref_;
  PerplexityResult r_{};
  std::vector<float> lp_, top_lp_;
  std::vector<std::uint32_t> best_;
};

/// How a text is scored.
struct PerplexitySettings {
  std::uint32_t ctx = 512;       ///< tokens per chunk (each scored after a BOS)
  std::uint32_t max_chunks = 0;  ///< 0 = every chunk
  bool decode = false;           ///< token-by-token decode forwards instead of one prefill
};

/// Chunks of `tokens` that `s` scores: [begin, end) token ranges.
inline std::vector<std::pair<std::size_t, std::size_t>> perplexity_chunks(
    std::size_t n_tokens, const PerplexitySettings& s) {
  MOEKIT_EXPECTS(s.ctx >= 1, "--ctx-size: must be >= 1 for --perplexity");
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t b = 0; b < n_tokens; b += s.ctx) {
    if (s.max_chunks && out.size() == s.max_chunks) break;
    out.emplace_back(b, std::min(n_tokens, b + s.ctx));
  }
  return out;
}

/// Scores `tokens` (the text, no BOS) chunk by chunk with `model` (whose context must hold
/// `s.ctx` positions), each chunk a new sequence after `bos`. `on_chunk(index, n_chunks)` is
/// called before each chunk (progress, trace sequence names).
template <class Pipeline, class OnChunk>
PerplexityResult score_text(Model<Pipeline>& model, std::span<const Token> tokens, Token bos,
                            const PerplexitySettings& s, PerplexityMeter& meter,
                            OnChunk&& on_chunk) {
  const auto chunks = perplexity_chunks(tokens.size(), s);
  if (chunks.empty())
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--perplexity: the text encodes to no tokens");
  std::vector<Token> input;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    on_chunk(c, chunks.size());
    const auto [b, e] = chunks[c];
    const std::size_t n = e - b;
    model.begin_sequence();
    if (!s.decode) {
      input.assign(1, bos);
      input.insert(input.end(), tokens.begin() + b, tokens.begin() + e - 1);
      const auto logits = model.prefill(input, /*all_logits=*/true);
      const std::size_t vocab = logits.size() / n;
      for (std::size_t i = 0; i < n; ++i)
        meter.add(logits.subspan(i * vocab, vocab), tokens[b + i]);
    } else {
      meter.add(model.prefill(std::span<const Token>(&bos, 1)), tokens[b]);
      for (std::size_t i = 1; i < n; ++i) meter.add(model.decode(tokens[b + i - 1]), tokens[b + i]);
    }
    meter.end_chunk();
  }
  return meter.result();
}

}  // namespace moekit::engine
