// moe-run on a GGUF file: config from the metadata, dense weights from the GGUF (llama.cpp's Q/K
// row permutation undone), experts through the expert store built from the same file. The
// fixtures tests/data/mixtral/model-{f32,q8_0}.gguf (llama architecture),
// tests/data/qwen2_moe/model-f32.gguf (qwen2moe) and tests/data/olmoe/model-f32.gguf (olmoe)
// (scripts/make_fixtures.py, PyPI gguf; the last two with --gguf-only) hold the weights of the
// model.safetensors next to them.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/io/expert_store.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "io/gguf_builder.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
namespace fs = std::filesystem;

namespace {

const fs::path mixtral = engine_test::data_dir() / "mixtral";

// The GGUF architecture name llama.cpp gives each transformers fixture.
std::string gguf_arch_name(const std::string& fixture) {
  if (fixture == "mixtral") return "llama";
  if (fixture == "qwen2_moe") return "qwen2moe";
  return "olmoe";
}

bool gguf_same_linear(const Linear& a, const Linear& b) {
  return a.rows == b.rows && a.cols == b.cols && a.w == b.w && a.bias == b.bias;
}

// Baseline pipeline at f32 over `backing`, greedy run of the reference prompt for 31 decode steps
// (the 51 reference positions and 32 tokens).
engine_test::GreedyRun run_reference(const ModelConfig& cfg, const DenseWeights& dense,
                                     const ExpertBacking& backing,
                                     const engine_test::Reference& ref, moekit::ThreadPool* pool) {
  const moekit::ModelShape s = cfg.shape();
  const OffloadSettings o{all_resident_budget(s, Precision::f32) / 2, Precision::f32};
  return with_pipeline<moekit::presets::BaselineSpec>(
      s, o, backing.make_loader(), PresetInputs{}, [&](auto& p) {
        return engine_test::greedy(cfg, dense, p, ref.prompt_ids,
                                   static_cast<int>(ref.generated_ids.size()) - 1, pool);
      });
}

// A copy of `from` with the first occurrence of `a` replaced by `b` (same length).
fs::path patched_copy(const fs::path& from, const fs::path& to, const std::string& a,
                      const std::string& b) {
  REQUIRE(a.size() == b.size());
  std::ifstream in(from, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = bytes.find(a);
  REQUIRE(at != std::string::npos);
  bytes.replace(at, a.size(), b);
  std::ofstream(to, std::ios::binary) << bytes;
  return to;
}

// Every dense weight of a GGUF-loaded model against the safetensors checkpoint's.
void gguf_check_same_dense(const DenseWeights& a, const DenseWeights& b) {
  CHECK(gguf_same_linear(a.embed, b.embed));
  CHECK(gguf_same_linear(a.lm_head, b.lm_head));
  CHECK(a.final_norm == b.final_norm);
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    INFO("layer " << l);
    const LayerWeights &x = a.layers[l], &y = b.layers[l];
    CHECK(x.attn_norm == y.attn_norm);
    CHECK(x.ffn_norm == y.ffn_norm);
    CHECK(gguf_same_linear(x.q, y.q));  // for llama, the Q/K permutation undone
    CHECK(gguf_same_linear(x.k, y.k));
    CHECK(gguf_same_linear(x.v, y.v));
    CHECK(gguf_same_linear(x.o, y.o));
    CHECK(x.q_norm == y.q_norm);
    CHECK(x.k_norm == y.k_norm);
    CHECK(gguf_same_linear(x.router, y.router));
    CHECK(gguf_same_linear(x.shared.gate, y.shared.gate));
    CHECK(gguf_same_linear(x.shared.up, y.shared.up));
    CHECK(gguf_same_linear(x.shared.down, y.shared.down));
    CHECK(gguf_same_linear(x.shared_gate, y.shared_gate));
  }
  CHECK(a.bytes() == b.bytes());
}

// Every field of a GGUF-read config against the checkpoint's config.json.
void gguf_check_same_config(const ModelConfig& c, const ModelConfig& want) {
  CHECK(c.arch == want.arch);
  CHECK(c.vocab_size == want.vocab_size);
  CHECK(c.hidden == want.hidden);
  CHECK(c.n_layers == want.n_layers);
  CHECK(c.n_heads == want.n_heads);
  CHECK(c.n_kv_heads == want.n_kv_heads);
  CHECK(c.head_dim == want.head_dim);
  CHECK(c.rope_theta == want.rope_theta);
  CHECK(c.rms_norm_eps == want.rms_norm_eps);
  CHECK(c.window == want.window);
  CHECK(c.n_experts == want.n_experts);
  CHECK(c.top_k == want.top_k);
  CHECK(c.expert_ffn == want.expert_ffn);
  CHECK(c.norm_topk_prob == want.norm_topk_prob);
  CHECK(c.shared_ffn == want.shared_ffn);
  CHECK(c.moe_index == want.moe_index);
  CHECK(c.tie_word_embeddings == want.tie_word_embeddings);
  CHECK(c.qkv_bias == want.qkv_bias);
  CHECK(c.o_bias == want.o_bias);
  CHECK(c.qk_norm == want.qk_norm);
  CHECK(c.clip_qkv == want.clip_qkv);
  CHECK(c.bos_token_id == want.bos_token_id);
  CHECK(c.eos_token_ids == want.eos_token_ids);
  CHECK(c.shape() == want.shape());
}

}  // namespace

TEST_CASE("GGUF metadata gives the config.json's model", "[engine][gguf]") {
  const ModelConfig want = load_config(mixtral);
  for (const char* file : {"model-f32.gguf", "model-q8_0.gguf"}) {
    INFO(file);
    const moekit::io::GgufFile g((mixtral / file).string());
    const ModelConfig c = gguf_config(g);
    CHECK(c.arch == Architecture::mixtral);
    gguf_check_same_config(c, want);
    CHECK_FALSE(c.qk_norm);
    CHECK(gguf_shape(g) == c.shape());
  }
}

TEST_CASE("unpermute_qk inverts llama.cpp's Q/K row permutation", "[engine][gguf]") {
  // permute (convert_hf_to_gguf.py): rows (head, half, i) -> (head, i, half).
  const std::uint32_t heads = 3, hd = 8, cols = 5;
  std::vector<float> hf(heads * hd * cols);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : hf) v = u(rng);
  std::vector<float> gguf(hf.size());
  for (std::uint32_t h = 0; h < heads; ++h)
    for (std::uint32_t half = 0; half < 2; ++half)
      for (std::uint32_t i = 0; i < hd / 2; ++i)
        std::copy_n(hf.data() + (h * hd + half * hd / 2 + i) * cols, cols,
                    gguf.data() + (h * hd + 2 * i + half) * cols);
  REQUIRE(gguf != hf);
  Linear l;
  l.rows = heads * hd;
  l.cols = cols;
  l.w = gguf;
  unpermute_qk(l, heads, hd);
  CHECK(l.w == hf);
  // Held packed (a quantized GGUF tensor kept as stored): the same rows move.
  Linear packed;
  packed.rows = heads * hd;
  packed.cols = cols;
  packed.w = gguf;
  packed.narrow(moekit::Precision::q8, {0, false});
  unpermute_qk(packed, heads, hd);
  packed.widen();
  Linear hf_packed;
  hf_packed.rows = heads * hd;
  hf_packed.cols = cols;
  hf_packed.w = hf;
  hf_packed.narrow(moekit::Precision::q8, {0, false});
  hf_packed.widen();
  CHECK(packed.w == hf_packed.w);
  Linear wrong;
  wrong.rows = 7;
  wrong.cols = 1;
  wrong.w.resize(7);
  CHECK_THROWS_AS(unpermute_qk(wrong, heads, hd), moekit::Error);
}

TEST_CASE("GGUF f32 dense weights equal the safetensors checkpoint's", "[engine][gguf]") {
  const ModelConfig cfg = load_config(mixtral);
  const moekit::io::GgufFile g((mixtral / "model-f32.gguf").string());
  const ModelWeights a = load_weights(cfg, mixtral, {});
  const ModelWeights b = load_gguf_weights(gguf_config(g), g, {});
  gguf_check_same_dense(a.dense, b.dense);
}

TEST_CASE("qwen2moe and olmoe GGUF files give the config.json's model and its dense weights",
          "[engine][gguf]") {
  const std::string name = GENERATE(as<std::string>{}, "qwen2_moe", "olmoe");
  INFO(name);
  const fs::path dir = engine_test::data_dir() / name;
  const ModelConfig want = load_config(dir);
  const moekit::io::GgufFile g((dir / "model-f32.gguf").string());
  CHECK(g.architecture() == gguf_arch_name(name));
  const ModelConfig c = gguf_config(g);
  gguf_check_same_config(c, want);
  CHECK(c.max_positions == want.max_positions);
  CHECK_FALSE(c.norm_topk_prob);  // llama.cpp's default for both, as in both fixtures' config
  CHECK(gguf_shape(g) == c.shape());
  if (name == "qwen2_moe") {
    CHECK(c.qkv_bias);
    CHECK(c.shared_ffn == 64);
    CHECK(c.expert_ffn == 32);  // expert_feed_forward_length, not feed_forward_length (128)
  } else {
    CHECK(c.qk_norm);
    CHECK(c.expert_ffn == 32);  // feed_forward_length: llama.cpp's convert writes no expert length
  }

  // Dense weights: the same values as the safetensors checkpoint's (no Q/K permutation to undo).
  const ModelWeights a = load_weights(want, dir, {});
  const ModelWeights b = load_gguf_weights(c, g, {});
  gguf_check_same_dense(a.dense, b.dense);
  for (const LayerWeights& x : a.dense.layers) {
    CHECK(x.q.bias.empty() == (name != "qwen2_moe"));
    CHECK(x.q_norm.empty() == (name != "olmoe"));
    CHECK(x.shared.empty() == (name != "qwen2_moe"));
  }
}

TEST_CASE("GGUF model with experts from its store matches transformers and the safetensors path",
          "[engine][gguf]") {
  // mixtral: llama architecture (f32 and Q8_0); qwen2_moe: qwen2moe; olmoe: olmoe (f32).
  const std::string name = GENERATE(as<std::string>{}, "mixtral", "qwen2_moe", "olmoe");
  INFO(name);
  const fs::path dir = engine_test::data_dir() / name;
  moekit::ThreadPool pool(2);
  const fs::path d = engine_test::scratch("engine-gguf", "forward-" + name);
  const ModelConfig st_cfg = load_config(dir);
  const ModelWeights st = load_weights(st_cfg, dir, {Precision::f32});
  const auto ref = engine_test::load_reference(dir);
  const auto st_run =
      run_reference(st_cfg, st.dense, ExpertBacking{&st.experts, nullptr, {}}, ref, &pool);
  REQUIRE(st_run.tokens == std::vector<Token>(ref.generated_ids.begin(), ref.generated_ids.end()));

  SECTION("f32: same logits as the safetensors path, bit for bit") {
    const moekit::io::GgufFile g((dir / "model-f32.gguf").string());
    REQUIRE(g.architecture() == gguf_arch_name(name));
    const ModelConfig cfg = gguf_config(g);
    build_store_from_gguf(dir / "model-f32.gguf", std::vector<Precision>{Precision::f32},
                          d / "f32.moestore", {});
    auto store = std::make_shared<moekit::io::ExpertStore>(
        moekit::io::ExpertStore::open((d / "f32.moestore").string(), cfg.shape()));
    const ModelWeights w = load_gguf_weights(cfg, g, {});
    CHECK(w.experts.total_bytes() == 0);
    const auto run = run_reference(cfg, w.dense, ExpertBacking{nullptr, store, {}}, ref, &pool);
    CHECK(run.tokens == st_run.tokens);
    CHECK(run.tokens == std::vector<Token>(ref.generated_ids.begin(), ref.generated_ids.end()));
    REQUIRE(run.logits.size() == ref.logits.size());
    CHECK(engine_test::worst_relative_error(run.logits, ref.logits, ref.vocab) <= 1e-4);
    CHECK(std::memcmp(run.logits.data(), st_run.logits.data(), run.logits.size() * 4) == 0);
  }
  if (name == "mixtral") {  // only the Mixtral fixture has a Q8_0 file
    SECTION("Q8_0: transformers' logits of the dequantized weights, same greedy tokens") {
      const auto q8 = engine_test::load_reference(mixtral, "gguf_reference.json", "q8_0");
      const moekit::io::GgufFile g((mixtral / "model-q8_0.gguf").string());
      REQUIRE(g.tensor("blk.0.attn_q.weight").dtype == moekit::io::DType::q8_0);
      const ModelConfig cfg = gguf_config(g);
      // Experts stored at f32 hold the dequantized Q8_0 values exactly.
      const auto cached = cached_gguf_store(mixtral / "model-q8_0.gguf", {Precision::f32}, d, true);
      CHECK(cached.built);
      CHECK_FALSE(cached_gguf_store(mixtral / "model-q8_0.gguf", {Precision::f32}, d, true).built);
      const ModelWeights w = load_gguf_weights(cfg, g, {});
      const auto run =
          run_reference(cfg, w.dense, ExpertBacking{nullptr, cached.store, {}}, q8, &pool);
      CHECK(run.tokens == std::vector<Token>(q8.generated_ids.begin(), q8.generated_ids.end()));
      CHECK(run.tokens == st_run.tokens);
      REQUIRE(run.logits.size() == q8.logits.size());
      const double err = engine_test::worst_relative_error(run.logits, q8.logits, q8.vocab);
      INFO("worst relative error vs the dequantized-weights reference: " << err);
      CHECK(err <= 1e-4);
    }
  }
  SECTION("experts in host memory from the GGUF: the same logits as through the store") {
    const moekit::io::GgufFile g((dir / "model-f32.gguf").string());
    const ModelConfig cfg = gguf_config(g);
    const ModelWeights w = load_gguf_weights(cfg, g, {Precision::f32});
    const auto run =
        run_reference(cfg, w.dense, ExpertBacking{&w.experts, nullptr, {}}, ref, &pool);
    CHECK(run.tokens == std::vector<Token>(ref.generated_ids.begin(), ref.generated_ids.end()));
    CHECK(std::memcmp(run.logits.data(), st_run.logits.data(), run.logits.size() * 4) == 0);
  }
}

TEST_CASE("GGUF files moe-run cannot run are refused naming the file and key", "[engine][gguf]") {
  const fs::path d = engine_test::scratch("engine-gguf", "errors");
  const fs::path dense = patched_copy(mixtral / "model-f32.gguf", d / "dense.gguf",
                                      "llama.expert_count", "llama.expert_cnt__");
  CHECK_THROWS_WITH(gguf_config(moekit::io::GgufFile(dense.string())),
                    Catch::Contains("dense.gguf") && Catch::Contains("llama.expert_count") &&
                        Catch::Contains("not a Mixture-of-Experts"));
  const fs::path arch = patched_copy(mixtral / "model-f32.gguf", d / "arch.gguf",
                                     std::string("\x05\0\0\0\0\0\0\0llama", 13),
                                     std::string("\x05\0\0\0\0\0\0\0gemma", 13));
  CHECK_THROWS_WITH(gguf_config(moekit::io::GgufFile(arch.string())),
                    Catch::Contains("arch.gguf") && Catch::Contains("'gemma'"));
  const fs::path scaled = patched_copy(mixtral / "model-f32.gguf", d / "rope.gguf",
                                       "llama.rope.dimension_count", "llama.rope.dimension_cnt__");
  CHECK_NOTHROW(gguf_config(moekit::io::GgufFile(scaled.string())));  // optional key
  CHECK(is_gguf_file(mixtral / "model-f32.gguf"));
  CHECK_FALSE(is_gguf_file(mixtral / "config.json"));
}

TEST_CASE("a qwen2moe GGUF without expert_feed_forward_length sizes experts as llama.cpp does",
          "[engine][gguf]") {
  // llama.cpp: n_ff_exp = feed_forward_length / expert_used_count for qwen2moe when the key is
  // absent; feed_forward_length itself for the other architectures.
  for (const char* arch : {"qwen2moe", "olmoe"}) {
    const std::string a = arch;
    moekit::test::GgufBuilder b;
    b.kv_string("general.architecture", a)
        .kv_u32(a + ".block_count", 1)
        .kv_u32(a + ".embedding_length", 8)
        .kv_u32(a + ".attention.head_count", 2)
        .kv_u32(a + ".feed_forward_length", 64)
        .kv_u32(a + ".expert_count", 8)
        .kv_u32(a + ".expert_used_count", 4)
        .tensor("token_embd.weight", {8, 5}, 0, std::vector<std::byte>(8 * 5 * 4));
    const fs::path path = engine_test::scratch("engine", "gguf_expert_ffn") / (a + ".gguf");
    const auto bytes = b.bytes();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    const moekit::io::GgufFile g(path.string());
    INFO(a);
    CHECK(gguf_config(g).expert_ffn == (a == "qwen2moe" ? 16u : 64u));
    CHECK(gguf_shape(g).ffn == gguf_config(g).expert_ffn);
  }
}
