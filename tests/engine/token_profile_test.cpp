// TokenProfile (moe-run --profile): the parts of a decode token are each >= 0 and sum to the
// token; profiling and the pool's per-step choice of threads leave the logits bit for bit.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/token_profile.hpp"

using namespace moekit::engine;
using moekit::Precision;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;

namespace {

double fraction_sum(const TokenProfile& p) {
  double sum = 0;
  for (std::size_t i = 0; i < token_part_count; ++i) sum += p.fraction(static_cast<TokenPart>(i));
  return sum;
}

// Greedy decode of `steps` tokens after the fixture's prompt, profiled when `profile` is set;
// returns every decode step's logits.
std::vector<float> decode_logits(const engine_test::LoadedModel& m, moekit::ThreadPool* pool,
                                 TokenProfile* profile, int steps) {
  const auto shape = m.cfg.shape();
  Baseline pipeline(shape, pipeline_config(shape, {0, Precision::f32}),
                    host_loader(m.weights.experts), moekit::UniformScorer({Precision::f32}));
  const auto ref = engine_test::load_reference(engine_test::data_dir() / "mixtral");
  Model<Baseline> model(m.cfg, m.weights.dense, pipeline,
                        static_cast<std::uint32_t>(ref.prompt_ids.size() + steps + 1), pool);
  model.begin_sequence();
  auto lg = model.prefill(ref.prompt_ids);
  model.set_profile(profile);
  std::vector<float> all;
  for (int i = 0; i < steps; ++i) {
    const TokenProfile::Token token(profile);
    const Token next = engine_test::argmax(lg.data(), m.cfg.vocab_size);
    lg = model.decode(next);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  model.set_profile(nullptr);
  return all;
}

}  // namespace

TEST_CASE("TokenProfile: parts are >= 0, sum to 1, and cut thread waits out of their scope",
          "[engine][profile]") {
  TokenProfile p;
  CHECK(fraction_sum(p) == 0);  // no token yet
  moekit::ThreadPool pool(2);
  p.attach(&pool);
  for (int t = 0; t < 3; ++t) {
    const TokenProfile::Token token(&p);
    {
      TokenProfile::Scope s(&p, TokenPart::routing);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      s.move_out(TokenPart::load_wait, 0.001);  // a millisecond of it waited for a load
    }
    const TokenProfile::Scope s(&p, TokenPart::experts);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  p.attach(nullptr);
  CHECK(p.tokens() == 3);
  for (std::size_t i = 0; i < token_part_count; ++i) {
    INFO(name(static_cast<TokenPart>(i)));
    CHECK(p.fraction(static_cast<TokenPart>(i)) >= 0);
  }
  CHECK(fraction_sum(p) == Approx(1).epsilon(1e-9));
  // Exactly the 3 x 1 ms moved out (sleeps overrun on a loaded machine, so only the moved time
  // is exact); the scopes' own time is the rest of what they slept.
  CHECK(p.fraction(TokenPart::load_wait) * p.seconds() == Approx(0.003).margin(1e-6));
  CHECK(p.fraction(TokenPart::routing) * p.seconds() >= 0.0029);
  CHECK(p.fraction(TokenPart::experts) * p.seconds() >= 0.0029);
  CHECK(p.fraction(TokenPart::attention) == 0);
}

TEST_CASE("a profiled decode times every part and gives the unprofiled logits bit for bit",
          "[engine][profile]") {
  const auto m = engine_test::load_model(engine_test::data_dir() / "mixtral");
  if (!m) {
    WARN("fixture tests/data/mixtral is missing (run scripts/make_fixtures.py); skipped");
    return;
  }
  moekit::ThreadPool pool(2);
  TokenProfile profile;
  const auto profiled = decode_logits(*m, &pool, &profile, 24);
  const auto plain = decode_logits(*m, &pool, nullptr, 24);
  CHECK(profiled == plain);
  CHECK(profile.tokens() == 24);
  for (std::size_t i = 0; i < token_part_count; ++i) {
    INFO(name(static_cast<TokenPart>(i)));
    CHECK(profile.fraction(static_cast<TokenPart>(i)) >= 0);
  }
  CHECK(fraction_sum(profile) == Approx(1).epsilon(1e-9));
  for (TokenPart p : {TokenPart::attention, TokenPart::dense, TokenPart::routing,
                      TokenPart::experts, TokenPart::lm_head})
    CHECK(profile.fraction(p) > 0);
  CHECK(profile.fraction(TokenPart::sampling) == 0);  // this loop samples nothing
}

TEST_CASE("decode logits do not depend on the thread count or on the pool's per-step choice",
          "[engine][profile]") {
  const auto m = engine_test::load_model(engine_test::data_dir() / "mixtral");
  if (!m) {
    WARN("fixture tests/data/mixtral is missing (run scripts/make_fixtures.py); skipped");
    return;
  }
  moekit::ThreadPool one(1), two(2);
  // 64 steps on two threads: both modes are measured and the slower one probed at least once.
  const auto a = decode_logits(*m, &one, nullptr, 64);
  const auto b = decode_logits(*m, &two, nullptr, 64);
  CHECK(two.adaptive_steps() == 64);
  CHECK(two.team_steps() >= 1);
  CHECK(two.team_steps() < 64);
  CHECK(a == b);
}
