// The KV cache's element type (--kv-type, kv_cache.hpp, kv_rows.hpp): an f32 cache gives the
// attention outputs of the former f32-only attention bit for bit; an f16 cache stays within a
// bound derived from f16's rounding, against a float64 reference (attention) and against the f32
// cache and transformers (the engine's logits on every fixture); bad flag values are refused.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/precision/half.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/attention.hpp"
#include "moekit/engine/cli.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/kv_cache.hpp"
#include "moekit/engine/kv_rows.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/ops.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;

namespace {

// The attention of moekit before the KV type existed (its f32 cache, token-major, and its job
// loop), kept here as the reference an f32 cache must equal bit for bit.
class LegacyAttention {
 public:
  explicit LegacyAttention(const ModelConfig& cfg, std::uint32_t capacity)
      : cfg_(cfg), rope_(cfg.head_dim, cfg.rope_theta), slots_(cfg.n_layers, capacity) {
    for (std::uint32_t l = 0; l < cfg.n_layers; ++l) {
      if (cfg.window[l] > 0) slots_[l] = std::min(cfg.window[l], capacity);
      kc_.emplace_back(std::size_t{slots_[l]} * cfg.kv_dim(), 0.f);
      vc_.emplace_back(std::size_t{slots_[l]} * cfg.kv_dim(), 0.f);
    }
  }

  void forward(std::uint32_t layer, const LayerWeights& w, std::span<const float> x,
               std::uint32_t n, std::span<float> out, const moekit::KernelOptions& opts) {
    const std::uint32_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), D = cfg_.head_dim;
    q_.resize(std::size_t{n} * qd);
    k_.resize(std::size_t{n} * kvd);
    v_.resize(std::size_t{n} * kvd);
    linear(w.q, x, n, q_, opts);
    linear(w.k, x, n, k_, opts);
    linear(w.v, x, n, v_, opts);
    for (std::uint32_t t = 0; t < n; ++t) {
      rope_.apply(q_.data() + std::size_t{t} * qd, cfg_.n_heads, start_ + t);
      rope_.apply(k_.data() + std::size_t{t} * kvd, cfg_.n_kv_heads, start_ + t);
    }
    ctx_.assign(std::size_t{n} * qd, 0.f);
    const std::uint32_t group = cfg_.n_heads / cfg_.n_kv_heads, window = cfg_.window[layer];
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    auto cached = [&](std::vector<std::vector<float>>& c, std::uint32_t j) {
      return c[layer].data() + std::size_t{j % slots_[layer]} * kvd;
    };
    auto key = [&](std::uint32_t j) {
      return j >= start_ ? k_.data() + std::size_t{j - start_} * kvd : cached(kc_, j);
    };
    auto value = [&](std::uint32_t j) {
      return j >= start_ ? v_.data() + std::size_t{j - start_} * kvd : cached(vc_, j);
    };
    std::vector<float> scores;
    for (std::size_t job = 0; job < std::size_t{n} * cfg_.n_kv_heads; ++job) {
      const auto t = static_cast<std::uint32_t>(job / cfg_.n_kv_heads);
      const auto kvh = static_cast<std::uint32_t>(job % cfg_.n_kv_heads);
      const std::uint32_t pos = start_ + t;
      const std::uint32_t first = window && pos + 1 > window ? pos + 1 - window : 0;
      const std::size_t len = pos + 1 - first;
      const float* q = q_.data() + std::size_t{t} * qd + std::size_t{kvh} * group * D;
      float* o = ctx_.data() + std::size_t{t} * qd + std::size_t{kvh} * group * D;
      scores.resize(group * len);
      for (std::uint32_t j = first; j <= pos; ++j)
        for (std::uint32_t g = 0; g < group; ++g)
          scores[g * len + (j - first)] = dot(q + std::size_t{g} * D, key(j) + kvh * D, D) * scale;
      for (std::uint32_t g = 0; g < group; ++g)
        softmax(std::span<float>(scores).subspan(g * len, len));
      for (std::uint32_t j = first; j <= pos; ++j)
        for (std::uint32_t g = 0; g < group; ++g) {
          const float p = scores[g * len + (j - first)];
          float* og = o + std::size_t{g} * D;
          for (std::uint32_t i = 0; i < D; ++i) og[i] += p * (value(j) + kvh * D)[i];
        }
    }
    const std::uint32_t keep = std::min(n, slots_[layer]);
    for (std::uint32_t t = n - keep; t < n; ++t) {
      std::copy_n(k_.data() + std::size_t{t} * kvd, kvd, cached(kc_, start_ + t));
      std::copy_n(v_.data() + std::size_t{t} * kvd, kvd, cached(vc_, start_ + t));
    }
    linear(w.o, ctx_, n, out, opts);
  }
  void advance(std::uint32_t n) { start_ += n; }

 private:
  const ModelConfig& cfg_;
  RopeTable rope_;
  std::vector<std::uint32_t> slots_;
  std::vector<std::vector<float>> kc_, vc_;
  std::vector<float> q_, k_, v_, ctx_;
  std::uint32_t start_ = 0;
};

Linear random_linear(std::size_t rows, std::size_t cols, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f / std::sqrt(static_cast<float>(cols)));
  Linear l;
  l.rows = rows;
  l.cols = cols;
  l.w.resize(rows * cols);
  for (float& f : l.w) f = d(rng);
  return l;
}

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

}  // namespace

TEST_CASE("an f32 KV cache gives the former f32 attention bit for bit", "[engine][kv]") {
  std::mt19937 rng(7);
  moekit::ThreadPool pool(2);
  // GQA (4 query heads per KV head), head_dim 72 (a 16-wide tail of 8), one full and one
  // sliding-window layer that wraps; a 13-token prefill in chunks of 5, then decode steps.
  ModelConfig cfg;
  cfg.hidden = 96;
  cfg.n_layers = 2;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 72;
  cfg.window = {0, 6};
  std::vector<LayerWeights> layers(2);
  for (auto& w : layers) {
    w.q = random_linear(cfg.q_dim(), cfg.hidden, rng);
    w.k = random_linear(cfg.kv_dim(), cfg.hidden, rng);
    w.v = random_linear(cfg.kv_dim(), cfg.hidden, rng);
    w.o = random_linear(cfg.hidden, cfg.q_dim(), rng);
  }
  const std::uint32_t capacity = 40;
  KvCache kv(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, capacity, cfg.window, KvType::f32);
  Attention attention(cfg);
  LegacyAttention legacy(cfg, capacity);
  moekit::KernelOptions opts{};
  opts.pool = &pool;
  std::uint32_t pos = 0;
  for (std::uint32_t n : {5u, 5u, 3u, 1u, 1u, 1u, 1u, 1u, 1u, 1u, 1u, 1u}) {
    const auto x = random_vector(std::size_t{n} * cfg.hidden, rng);
    for (std::uint32_t l = 0; l < cfg.n_layers; ++l) {
      INFO("position " << pos << ", " << n << " tokens, layer " << l);
      std::vector<float> now(x.size()), before(x.size());
      attention.forward(l, layers[l], kv, x, n, now, opts);
      legacy.forward(l, layers[l], x, n, before, opts);
      CHECK(std::memcmp(now.data(), before.data(), now.size() * sizeof(float)) == 0);
    }
    kv.advance(n);
    legacy.advance(n);
    pos += n;
  }
}

TEST_CASE("attention over an f16 KV cache is within the bound of f16 rounding (float64 reference)",
          "[engine][kv]") {
  // softmax(q·kᵀ/√d)·v over `len` positions with keys and values stored at f16, against float64
  // on the exact keys and values. Rounding to f16 moves each element by at most u16 = 2^-11 of
  // itself (normal range), so score j moves by at most δ_j = u16·Σ_i|q_i k_ji|/√d, plus the f32
  // sums' γ = (d + 2)·2^-24 of the same; a perturbation of at most Δ = max δ_j changes each
  // softmax weight p_j by at most (e^{2Δ} − 1)·p_j; each output o_i = Σ p_j v_ji then moves by
  // at most [(e^{2Δ} − 1)(1 + u16) + u16 + γ']·Σ p_j|v_ji|, γ' = (len + 8)·2^-24 for the f32
  // softmax and sum.
  const double u16 = std::ldexp(1.0, -11), u32 = std::ldexp(1.0, -24);
  std::mt19937 rng(11);
  for (std::uint32_t d : {64u, 128u, 72u}) {
    for (std::size_t len : {1u, 37u, 600u}) {
      INFO("head_dim " << d << ", " << len << " positions");
      const auto q = random_vector(d, rng, 1.f);
      const auto k = random_vector(len * d, rng, 1.f);
      const auto v = random_vector(len * d, rng, 1.f);
      std::vector<moekit::Float16> kh(k.size()), vh(v.size());
      kv_rows::to_f16(k.data(), kh.data(), k.size());
      kv_rows::to_f16(v.data(), vh.data(), v.size());
      const float scale = 1.f / std::sqrt(static_cast<float>(d));
      std::vector<float> s(len), o(d, 0.f);
      kv_rows::scores(q.data(), 1, kh.data(), d, len, d, scale, s.data(), len);
      softmax(s);
      kv_rows::accumulate(s.data(), len, 1, vh.data(), d, len, d, o.data());
      // float64 on the exact values
      std::vector<double> sd(len), od(d, 0.0);
      double delta = 0;
      for (std::size_t j = 0; j < len; ++j) {
        double dot = 0, mag = 0;
        for (std::uint32_t i = 0; i < d; ++i) {
          dot += double(q[i]) * k[j * d + i];
          mag += std::abs(double(q[i]) * k[j * d + i]);
        }
        sd[j] = dot / std::sqrt(double(d));
        delta = std::max(delta, (u16 + (d + 2) * u32) * mag / std::sqrt(double(d)));
      }
      const double m = *std::max_element(sd.begin(), sd.end());
      double sum = 0;
      for (double& x : sd) sum += (x = std::exp(x - m));
      for (double& x : sd) x /= sum;
      const double rel = (std::exp(2 * delta) - 1) * (1 + u16) + u16 + (len + 8) * u32;
      double worst_ratio = 0, worst_error = 0;
      for (std::uint32_t i = 0; i < d; ++i) {
        double exact = 0, mass = 0;
        for (std::size_t j = 0; j < len; ++j) {
          exact += sd[j] * v[j * d + i];
          mass += sd[j] * std::abs(double(v[j * d + i]));
        }
        const double err = std::abs(o[i] - exact);
        worst_error = std::max(worst_error, err);
        worst_ratio = std::max(worst_ratio, err / (rel * mass));
      }
      INFO("bound " << rel << " of Σp|v|, worst error " << worst_error << ", at " << worst_ratio
                    << " of its bound");
      CHECK(worst_ratio <= 1.0);
      CHECK(rel < 0.05);                    // the bound says something at these magnitudes
      if (len > 1) CHECK(worst_error > 0);  // rounded values: not the exact result
    }
  }
}

TEST_CASE("kv_rows::to_f16 rounds to nearest even, as the scalar conversion", "[engine][kv]") {
  std::mt19937 rng(3);
  auto x = random_vector(1000, rng, 10.f);
  x.insert(x.end(), {0.f, -0.f, 65504.f, 65520.f, 1e-7f, -3e-5f, 1.f + 1.f / 4096});
  std::vector<moekit::Float16> y(x.size());
  kv_rows::to_f16(x.data(), y.data(), x.size());
  std::vector<float> r = x;
  kv_rows::round_to_f16(r.data(), r.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO(x[i]);
    CHECK(y[i].bits == moekit::float_to_half_bits(x[i]));
    const float back = moekit::to_float(y[i]);
    CHECK(std::memcmp(&r[i], &back, 4) == 0);
  }
}

namespace {

// Teacher-forced logits of a fixture's sequence (prefill of the prompt, then decode) at `type`.
std::vector<float> fixture_logits(const engine_test::LoadedModel& m,
                                  const engine_test::Reference& ref, KvType type,
                                  moekit::ThreadPool* pool) {
  const auto shape = m.cfg.shape();
  const OffloadSettings all{0, Precision::f32};
  return with_pipeline<moekit::presets::BaselineSpec>(shape, all, m.weights.experts, [&](auto& p) {
    using P = std::decay_t<decltype(p)>;
    Model<P> model(m.cfg, m.weights.dense, p,
                   static_cast<std::uint32_t>(ref.sequence_ids.size() + 1), pool, type);
    model.begin_sequence();
    const std::span<const Token> seq(ref.sequence_ids);
    const auto pre = model.prefill(seq.first(ref.prompt_ids.size()), true);
    std::vector<float> rows(pre.begin(), pre.end());
    for (std::size_t t = ref.prompt_ids.size(); t < seq.size(); ++t) {
      const auto lg = model.decode(seq[t]);
      rows.insert(rows.end(), lg.begin(), lg.end());
    }
    return rows;
  });
}

}  // namespace

TEST_CASE(
    "an f16 KV cache: logits within the bound of f16 rounding of the f32 cache's and "
    "transformers'",
    "[engine][kv]") {
  moekit::ThreadPool pool(2);
  for (const auto& dir :
       {engine_test::data_dir() / "mixtral", engine_test::data_dir() / "mixtral_swa",
        engine_test::data_dir() / "qwen2_moe", engine_test::data_dir() / "olmoe",
        std::filesystem::path(MOEKIT_SOURCE_DIR) / "tests/engine/data/qwen2_moe_dense"}) {
    const std::string name = dir.filename().string();
    DYNAMIC_SECTION(name) {
      const auto m = engine_test::load_model(dir);
      if (!m) {
        WARN("fixture " << dir << " is missing (run scripts/make_fixtures.py); skipped");
        continue;
      }
      const auto ref = engine_test::load_reference(dir);
      const std::size_t V = m->cfg.vocab_size;
      const auto f32 = fixture_logits(*m, ref, KvType::f32, &pool);
      const auto f16 = fixture_logits(*m, ref, KvType::f16, &pool);
      REQUIRE(f16.size() == f32.size());
      // Rounding to f16 moves each key and value by at most u16 = 2^-11 of itself; each layer's
      // attention output then moves by at most ≈ 2Δ + u16 of its size (the test above; Δ ≪ 1
      // here), and the residual stream carries that to the logits. How much the layers after
      // amplify it is the network's own: the f32 cache's error against transformers is its
      // response to f32 rounding (≤ 2^-24 of every value), so rounding K and V (a subset of the
      // values) 2^13 times coarser moves the logits by at most 2^13 times that, to first order;
      // a floor of 4·L·u16 (L layers, at most twofold amplification per layer) covers a fixture
      // whose f32 error happens to be small.
      const double u16 = std::ldexp(1.0, -11);
      const double f32_vs_ref = engine_test::worst_relative_error(f32, ref.logits, V);
      const double bound = std::max(4.0 * m->cfg.n_layers * u16, std::ldexp(1.0, 13) * f32_vs_ref);
      const double vs_f32 = engine_test::worst_relative_error(f16, f32, V);
      const double vs_ref = engine_test::worst_relative_error(f16, ref.logits, V);
      INFO(name << ": bound " << bound << " (f32 against transformers " << f32_vs_ref
                << "), f16 against f32 " << vs_f32 << ", against transformers " << vs_ref);
      CHECK(vs_f32 <= bound);
      CHECK(vs_f32 > 0);  // the values were rounded
      CHECK(vs_ref <= bound + f32_vs_ref);
      // Greedy: f16's argmax is transformers' wherever transformers' best logit leads the
      // second by more than the bound allows the two to move (2·bound of the row's largest).
      for (std::size_t t = 0; t < f16.size() / V; ++t) {
        const float* want = ref.logits.data() + t * V;
        const Token best = engine_test::argmax(want, V);
        float second = -INFINITY, top = 0;
        for (std::size_t i = 0; i < V; ++i) {
          top = std::max(top, std::abs(want[i]));
          if (i != best) second = std::max(second, want[i]);
        }
        if (want[best] - second > 2 * bound * top) {
          INFO("position " << t);
          CHECK(engine_test::argmax(f16.data() + t * V, V) == best);
        }
      }
    }
  }
}

TEST_CASE("an f16 KV cache: chunked prefill and a one-forward prefill agree bit for bit",
          "[engine][kv][ubatch]") {
  moekit::ThreadPool pool(2);
  for (const auto& dir :
       {engine_test::data_dir() / "mixtral_swa", engine_test::data_dir() / "olmoe"}) {
    INFO(dir.filename().string());
    const ModelConfig cfg = load_config(dir);
    const ModelWeights w = load_weights(cfg, dir, {Precision::f32});
    const auto ref = engine_test::load_reference(dir);
    const auto s = cfg.shape();
    auto run = [&](std::uint32_t ubatch) {
      return with_pipeline<moekit::presets::BaselineSpec>(
          s, OffloadSettings{0, Precision::f32}, w.experts, [&](auto& p) {
            using P = std::decay_t<decltype(p)>;
            Model<P> model(cfg, w.dense, p, static_cast<std::uint32_t>(ref.prompt_ids.size() + 4),
                           &pool, KvType::f16);
            model.set_ubatch(ubatch);
            model.begin_sequence();
            const auto pre = model.prefill(ref.prompt_ids, true);
            std::vector<float> out(pre.begin(), pre.end());
            Token next =
                engine_test::argmax(pre.data() + pre.size() - cfg.vocab_size, cfg.vocab_size);
            for (int i = 0; i < 4; ++i) {
              const auto lg = model.decode(next);
              out.insert(out.end(), lg.begin(), lg.end());
              next = engine_test::argmax(lg.data(), cfg.vocab_size);
            }
            return out;
          });
    };
    const auto whole = run(0);
    for (std::uint32_t ub : {1u, 3u, 7u, 19u}) {
      INFO("ubatch " << ub);
      const auto chunked = run(ub);
      REQUIRE(chunked.size() == whole.size());
      CHECK(std::memcmp(chunked.data(), whole.data(), whole.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("moe-run --kv-type, --cache-type-k/-v: f32 and f16, refused otherwise naming the flag",
          "[engine][kv][cli]") {
  auto parse = [](std::vector<const char*> args, std::string* err = nullptr) {
    args.insert(args.begin(), "moe-run");
    Cli cli;
    std::ostringstream out, e;
    const int rc = cli.parse(static_cast<int>(args.size()), args.data(), out, e);
    if (err) *err = e.str();
    return std::pair{rc, cli.options().kv_type};
  };
  CHECK(parse({}) == std::pair{0, KvType::f16});  // llama.cpp's default
  CHECK(parse({"--kv-type", "f32"}) == std::pair{0, KvType::f32});
  CHECK(parse({"--cache-type-k", "f32", "--cache-type-v", "f32"}) == std::pair{0, KvType::f32});
  CHECK(parse({"--kv-type", "f32", "--cache-type-k", "f16", "--cache-type-v", "f16"}) ==
        std::pair{0, KvType::f16});
  std::string err;
  CHECK(parse({"--kv-type", "q8_0"}, &err).first != 0);
  CHECK(err.find("--kv-type") != std::string::npos);
  CHECK(err.find("q8_0") != std::string::npos);
  CHECK(parse({"--cache-type-v", "bf16"}, &err).first != 0);
  CHECK(err.find("--cache-type-v") != std::string::npos);
  CHECK(parse({"--cache-type-k", "f32"}, &err).first != 0);  // values stay f16
  CHECK(err.find("--cache-type-k") != std::string::npos);
  CHECK(err.find("one type") != std::string::npos);
}
