// GGUF K-quant experts read in place (io/checkpoint_experts.hpp, a K-quant blob: core/
// model_shape.hpp's KquantBlob): each matrix's bytes as they lie in the file, at its own type
// (Q2_K .. Q6_K, mixed per matrix and per layer as Q4_K_M and Q2_K files mix them), with no store
// and no conversion; their values are the file's dequantized ones bit for bit, and a model run over
// them gives the logits of the same model over those values as f32 experts (float activations:
// the same products in the same order, bit for bit; int8 activations: within the bound of
// rounding the activations).

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/tensor_names.hpp"
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/half.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets/registry.hpp"

#include "io/gguf_builder.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

// A namespace of its own: the engine tests are compiled as one unity translation unit.
namespace kquant_in_place_test {

using namespace moekit::engine;
using moekit::Precision;
namespace fs = std::filesystem;
namespace mio = moekit::io;
using Types = std::array<Precision, 3>;  // w1 (gate), w3 (up), w2 (down)

const fs::path kquant_model =
    fs::path(MOEKIT_SOURCE_DIR) / "tests" / "engine" / "data" / "kquant_moe.gguf";
// Two layers, experts as a Q2_K file's small types: gate/up Q2_K and down Q3_K, then gate/up Q3_K
// and down Q4_K (scripts/make_gguf_transcode_fixture.py).
const fs::path kquant_q2_model =
    fs::path(MOEKIT_SOURCE_DIR) / "tests" / "engine" / "data" / "kquant_q2_moe.gguf";

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::uint32_t ggml_type_of(Precision p) {
  switch (p) {
    case Precision::q2_k:
      return mio::ggml_type::q2_k;
    case Precision::q3_k:
      return mio::ggml_type::q3_k;
    case Precision::q4_k:
      return mio::ggml_type::q4_k;
    case Precision::q5_k:
      return mio::ggml_type::q5_k;
    default:
      return mio::ggml_type::q6_k;
  }
}

// `weights` weights of random `p` blocks: random codes, sub-block scales and minimums, and small
// finite f16 super-block scales (d, and dmin for Q2_K/Q4_K/Q5_K).
std::vector<std::byte> random_kquant(Precision p, std::uint64_t weights, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::size_t bb = moekit::kquant_block_bytes(p);
  std::vector<std::byte> out(weights / moekit::kquant_block_weights * bb);
  for (std::byte& b : out) b = std::byte(rng() & 0xFF);
  for (std::size_t i = 0; i < out.size(); i += bb) {
    const std::uint16_t d = moekit::float_to_half_bits(0.0005f * float(1 + rng() % 50));
    const std::uint16_t dmin = moekit::float_to_half_bits(0.0002f * float(1 + rng() % 50));
    if (p == Precision::q6_k || p == Precision::q3_k) {
      std::memcpy(out.data() + i + (p == Precision::q6_k ? 208 : 108), &d, 2);
    } else {
      const std::size_t at = p == Precision::q2_k ? 80 : 0;
      std::memcpy(out.data() + i + at, &d, 2);
      std::memcpy(out.data() + i + at + 2, &dmin, 2);
    }
  }
  return out;
}

// Stacked experts of `shape`, layer l's three matrices at `types[l]` (llama.cpp's names), after
// a tensor that moves them off a 4096-byte boundary.
fs::path write_mixed_gguf(const moekit::ModelShape& s, std::span<const Types> types,
                          const fs::path& file) {
  moekit::test::GgufBuilder b;
  b.tensor("token_embd.weight", {32, 3}, mio::ggml_type::f32, std::vector<std::byte>(32 * 3 * 4));
  const char* names[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
  for (std::uint32_t l = 0; l < s.n_layers; ++l)
    for (std::uint32_t m = 0; m < 3; ++m) {
      const std::uint64_t rows = m < 2 ? s.ffn : s.hidden, cols = m < 2 ? s.hidden : s.ffn;
      b.tensor("blk." + std::to_string(l) + "." + names[m] + ".weight", {cols, rows, s.n_experts},
               ggml_type_of(types[l][m]),
               random_kquant(types[l][m], rows * cols * s.n_experts, 100 * l + m));
    }
  const auto bytes = b.bytes();
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return file;
}

// Every in-place blob of `b` holds each matrix's bytes as the file has them, at the type of the
// file's tensor, and decodes to the file's dequantized values bit for bit.
void check_blobs(const ExpertBacking& b, const mio::GgufFile& g, mio::Architecture arch,
                 const moekit::ModelShape& s) {
  const Precision p = b.checkpoint->precision();
  for (std::uint32_t l = 0; l < s.n_layers; ++l)
    for (std::uint32_t e = 0; e < s.n_experts; ++e) {
      INFO("layer " << l << " expert " << e);
      const std::vector<std::byte> blob = b.read_expert({l, e}, p);
      REQUIRE(blob.size() == s.expert_bytes(p));
      const auto v = mio::expert_view(s, blob, p);
      const auto m = mio::find_expert_matrices(g, arch, mio::TensorFormat::gguf, {l, e}, s);
      const moekit::MatrixView* views[] = {&v.w1, &v.w3, &v.w2};
      for (std::size_t i = 0; i < 3; ++i) {
        const mio::TensorView& t = m[mio::all_expert_matrices[i]];
        CHECK(views[i]->precision == *mio::in_place_moekit_precision(t.dtype));
        REQUIRE(views[i]->bytes() == t.bytes.size());
        CHECK(std::memcmp(views[i]->data, t.bytes.data(), t.bytes.size()) == 0);
      }
      const ExpertF32 want = read_expert_f32(g, arch, mio::TensorFormat::gguf, l, e, s);
      CHECK(same_bits(moekit::decode_matrix(v.w1), want.w1));
      CHECK(same_bits(moekit::decode_matrix(v.w3), want.w3));
      CHECK(same_bits(moekit::decode_matrix(v.w2), want.w2));
    }
}

}  // namespace kquant_in_place_test

TEST_CASE(
    "GGUF K-quant experts mixed per matrix and per layer are read in place into K-quant blobs",
    "[engine][in_place][kquant]") {
  using namespace kquant_in_place_test;
  // Layer 0 as a Q4_K_M file's "more bits" layers, layer 1 as its others, layer 2 a Q5_K mix,
  // layers 3 and 4 as a Q2_K file's.
  const moekit::ModelShape s{.n_layers = 5, .n_experts = 2, .top_k = 1, .hidden = 512, .ffn = 768};
  const Types types[] = {{Precision::q4_k, Precision::q4_k, Precision::q6_k},
                         {Precision::q4_k, Precision::q4_k, Precision::q4_k},
                         {Precision::q5_k, Precision::q4_k, Precision::q5_k},
                         {Precision::q2_k, Precision::q2_k, Precision::q3_k},
                         {Precision::q3_k, Precision::q2_k, Precision::q4_k}};
  const fs::path d = engine_test::scratch("engine-kquant-in-place", "mixed");
  const mio::GgufFile g(write_mixed_gguf(s, types, d / "mixed.gguf").string());
  const std::uint32_t layers[] = {0, 1, 2, 3, 4};
  const auto experts =
      std::make_shared<const mio::CheckpointExperts>(mio::CheckpointExperts::locate(
          g, mio::Architecture::mixtral, mio::TensorFormat::gguf, s, layers));
  // Named for the first gate's type; each slot sized for its matrix's widest type.
  REQUIRE(experts->precision() == Precision::q4_k);
  const moekit::ModelShape ks = experts->shape();
  CHECK(ks.kquant ==
        moekit::KquantBlob{Precision::q4_k, Precision::q5_k, Precision::q4_k, Precision::q6_k});
  CHECK(ks.expert_bytes(Precision::q4_k) == moekit::matrix_bytes(768, 512, Precision::q5_k) +
                                                moekit::matrix_bytes(768, 512, Precision::q4_k) +
                                                moekit::matrix_bytes(512, 768, Precision::q6_k) +
                                                moekit::kquant_tag_bytes);
  CHECK(ks.expert_bytes(Precision::q8) == s.expert_bytes(Precision::q8));  // others unchanged
  for (bool direct : {true, false}) {
    INFO("O_DIRECT " << direct);
    const ExpertBacking in_place{nullptr, nullptr, StoreIo{.direct = direct}, experts,
                                 moekit::MatrixOrder::rows};
    check_blobs(in_place, g, mio::Architecture::mixtral, ks);
  }

  // The fused FFN over a blob's views (f32 activations) is the FFN over its f32 values.
  const ExpertBacking in_place{nullptr, nullptr, StoreIo{}, experts, moekit::MatrixOrder::rows};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(s.hidden);
  for (float& v : x) v = nd(rng);
  moekit::ThreadPool pool(2);
  for (std::uint32_t l = 0; l < s.n_layers; ++l) {
    INFO("layer " << l);
    const std::vector<std::byte> blob = in_place.read_expert({l, 1}, Precision::q4_k);
    const ExpertF32 f =
        read_expert_f32(g, mio::Architecture::mixtral, mio::TensorFormat::gguf, l, 1, s);
    const moekit::ExpertWeights fw{
        moekit::MatrixView{reinterpret_cast<const std::byte*>(f.w1.data()), s.ffn, s.hidden,
                           Precision::f32},
        moekit::MatrixView{reinterpret_cast<const std::byte*>(f.w3.data()), s.ffn, s.hidden,
                           Precision::f32},
        moekit::MatrixView{reinterpret_cast<const std::byte*>(f.w2.data()), s.hidden, s.ffn,
                           Precision::f32}};
    moekit::KernelOptions opts;
    opts.pool = &pool;
    std::vector<float> got(s.hidden, 0.f), want(s.hidden, 0.f);
    moekit::expert_ffn(mio::expert_view(ks, blob, Precision::q4_k), x, 1, got, 1.f, opts);
    moekit::expert_ffn(fw, x, 1, want, 1.f, opts);
    CHECK(same_bits(got, want));
  }

  // A tag that names a type wider than its slot is refused, naming the matrix.
  std::vector<std::byte> blob = in_place.read_expert({1, 0}, Precision::q4_k);
  mio::write_kquant_tag(blob, {Precision::q4_k, Precision::q6_k, Precision::q4_k});
  CHECK_THROWS_WITH(mio::expert_view(ks, blob, Precision::q4_k),
                    Catch::Contains("matrix 1") && Catch::Contains("slot (q4_k)"));
}

namespace kquant_in_place_test {

// Logits (positions × vocab) of `seq` teacher-forced through baseline over `b`, one token's
// experts of budget (every layer evicts), and the pipeline's counters.
struct Forced {
  std::vector<float> logits;
  moekit::PipelineStats stats;
};

Forced forced(const ModelConfig& cfg, const DenseWeights& dense, const ExpertBacking& b,
              Precision p, std::span<const Token> seq, std::size_t prompt, bool int8,
              moekit::ThreadPool* pool) {
  const moekit::ModelShape s = cfg.shape();
  const OffloadSettings o{minimum_expert_budget(s, p), p};
  return with_pipeline<moekit::presets::BaselineSpec>(
      s, o, b.make_loader(), PresetInputs{}, [&](auto& pipe) {
        Forced f;
        f.logits = engine_test::teacher_forced(cfg, dense, pipe, seq, prompt, pool, int8);
        f.stats = pipe.stats();
        return f;
      });
}

}  // namespace kquant_in_place_test

namespace kquant_in_place_test {

// The K-quant MoE GGUF at `model` read in place into blobs `want` (named for precision
// want.precision) gives, teacher-forced with one token's experts of budget, the logits of the
// same experts as f32 rows of gguf-py's values: bit for bit with float activations (each K-quant
// row is decoded to those values and dotted on the same float kernel), within `int8_tolerance`
// (relative, per position) with int8 ones.
void check_in_place_logits(const fs::path& model, const moekit::KquantBlob& want_blob,
                           double int8_tolerance) {
  const mio::GgufFile g(model.string());
  const ModelConfig cfg = gguf_config(g);
  const auto experts = locate_checkpoint_experts(cfg, {}, &g);
  REQUIRE(experts != nullptr);
  const Precision p = want_blob.precision;
  REQUIRE(experts->precision() == p);
  CHECK(experts->shape().kquant == want_blob);
  ModelConfig kcfg = cfg;  // as moe-run sets it
  kcfg.expert_kquant = experts->shape().kquant;
  REQUIRE(kcfg.shape() == experts->shape());
  const ModelWeights w = load_gguf_weights(cfg, g, {});
  REQUIRE(w.experts.total_bytes() == 0);  // the experts come from the file alone
  const ExpertBacking in_place{nullptr, nullptr, StoreIo{}, experts, moekit::MatrixOrder::rows};
  check_blobs(in_place, g, io_architecture(cfg.arch), kcfg.shape());

  // The reference: the same experts as f32 rows of gguf-py's values (the conversion-loss
  // reference), through the same loader, dense part and kernels.
  std::vector<std::uint32_t> layers(cfg.shape().n_layers);
  for (std::uint32_t l = 0; l < layers.size(); ++l) layers[l] = l;
  const auto exact =
      std::make_shared<const mio::CheckpointExperts>(mio::CheckpointExperts::locate_as_f32(
          g, io_architecture(cfg.arch), mio::TensorFormat::gguf, cfg.shape(), layers));
  const ExpertBacking reference{nullptr, nullptr, StoreIo{}, exact, moekit::MatrixOrder::rows};
  std::vector<Token> seq{1, 415, 2936, 9060, 285, 1142, 28705, 28770, 17, 903, 42, 5, 77, 31000};
  for (Token& t : seq) t %= cfg.vocab_size;
  const std::size_t prompt = 9;
  moekit::ThreadPool pool(2);
  const Forced want = forced(cfg, w.dense, reference, Precision::f32, seq, prompt, false, &pool);
  const Forced f32 = forced(kcfg, w.dense, in_place, p, seq, prompt, false, &pool);
  CHECK(f32.stats.cache.evictions > 0);
  CHECK(f32.stats.misses_by_precision[std::size_t(p)] > 0);
  CHECK(same_bits(f32.logits, want.logits));
  // Int8 activations (moe-run's default for K-quants): the K-quant kernels, x rounded to int8.
  const Forced i8 = forced(kcfg, w.dense, in_place, p, seq, prompt, true, &pool);
  REQUIRE(i8.logits.size() == want.logits.size());
  const double err = engine_test::worst_relative_error(i8.logits, want.logits, cfg.vocab_size);
  INFO("int8 activations: worst relative error against the exact values " << err);
  CHECK(err > 0);  // another path: the test has teeth
  CHECK(err <= int8_tolerance);
}

}  // namespace kquant_in_place_test

TEST_CASE(
    "a Q4_K_M-like MoE GGUF runs its K-quant experts in place with the logits of their exact "
    "values",
    "[engine][in_place][kquant]") {
  using namespace kquant_in_place_test;
  // Gate and up Q4_K, down Q6_K: read in place, no longer converted into a store.
  check_in_place_logits(
      kquant_model,
      moekit::KquantBlob{Precision::q4_k, Precision::q4_k, Precision::q4_k, Precision::q6_k}, 4e-2);
}

TEST_CASE(
    "a Q2_K-like MoE GGUF runs its Q2_K/Q3_K/Q4_K experts in place with the logits of their "
    "exact values",
    "[engine][in_place][kquant]") {
  using namespace kquant_in_place_test;
  // Layer 0 gate/up Q2_K, down Q3_K; layer 1 gate/up Q3_K, down Q4_K: each slot sized for its
  // matrix's widest type, the blob named for the first gate's.
  // Int8 activations: two layers, and every expert matrix's activation rounded per 256 values
  // (q6_k's down rows in the Q4_K_M model round per 32), the prompt's tokens too (the K-quant int8
  // GEMM, bit for bit the GEMV on each token: kquant_gemm_test.cpp), so the prompt's KV cache
  // carries the rounding into every later position: 6.7% measured on Zen 5 (3.1% when the prompt
  // ran float activations), 1e-1 allowed; the Q4_K_M model 2.2%, 4e-2 allowed.
  check_in_place_logits(
      kquant_q2_model,
      moekit::KquantBlob{Precision::q2_k, Precision::q3_k, Precision::q3_k, Precision::q4_k}, 1e-1);
}

namespace kquant_in_place_test {

const fs::path moe_run = fs::path(MOEKIT_BINARY_DIR) / "examples" / "moe-run" / "moe-run";

engine_test::Command run_moe(const std::string& args, const fs::path& scratch,
                             const fs::path& model) {
  return engine_test::run_command("'" + moe_run.string() + "' -m '" + model.string() +
                                      "' -p 'Once upon a time' --json -n 4 --temp 0 " + args,
                                  scratch);
}

nlohmann::json run_json(const std::string& args, const fs::path& scratch,
                        const fs::path& model = kquant_model) {
  const engine_test::Command c = run_moe(args, scratch, model);
  INFO("moe-run " << args << "\nstderr: " << c.err);
  REQUIRE(c.status == 0);
  return nlohmann::json::parse(c.out);
}

}  // namespace kquant_in_place_test

TEST_CASE("moe-run reads a Q4_K_M-like GGUF's experts in place with every preset",
          "[engine][in_place][kquant][moe_run]") {
  using namespace kquant_in_place_test;
  if (!fs::exists(moe_run)) {
    WARN(moe_run.string() << " is missing (build the moe-run target); skipped");
    return;
  }
  const fs::path d = engine_test::scratch("engine-kquant-in-place", "moe-run");
  const std::string in_place = "in place: " + kquant_model.string();
  nlohmann::json baseline_tokens;
  namespace ps = moekit::presets;
  for (const ps::PresetEntry* preset :
       {&ps::entry_of<ps::BaselineSpec>, &ps::entry_of<ps::HobbitSpec>, &ps::entry_of<ps::FateSpec>,
        &ps::entry_of<ps::EdgeMoeSpec>, &ps::entry_of<ps::MobileSpec>,
        &ps::entry_of<ps::FiddlerSpec>, &ps::entry_of<ps::NextUseSpec>}) {
    const std::string name(preset->name);
    const bool fiddler = ps::is<ps::FiddlerSpec>(*preset);
    const std::string extra = fiddler ? " --cpu-latency 0.0001 --copy-latency 0.0002" : "";
    const nlohmann::json j = run_json("--preset " + name + " --expert-budget 50%" + extra, d);
    const std::string source = j.at("expert_source");
    INFO(name << ": expert_source " << source);
    CHECK(j.at("generated_tokens") == 4);
    CHECK(source.starts_with(in_place));
    // A store, when a preset needs one, holds only what the file lacks (no q4/q8 conversion of
    // the K-quants the run reads in place).
    CHECK(source.find("-q4") == std::string::npos);
    CHECK(source.find("-q8") == std::string::npos);
    if (ps::is<ps::BaselineSpec>(*preset)) {
      CHECK(j.at("precision") == "q4_k");          // --precision auto: the file's own types
      CHECK(source == in_place);                   // no store at all
      CHECK_FALSE(j.contains("conversion_loss"));  // nothing converted, nothing measured
      baseline_tokens = j.at("token_ids");
    }
    if (ps::is<ps::HobbitSpec>(*preset)) CHECK(source.find("-q2.moestore") != std::string::npos);
    if (fiddler) {  // its CPU path reads the same bytes through the loader: the same tokens
      CHECK(j.at("host_read_bytes").get<std::uint64_t>() > 0);
      CHECK(j.at("token_ids") == baseline_tokens);
    }
  }
  // Held in host memory, K-quants are converted (moekit never encodes into them), as before.
  const nlohmann::json m = run_json("--in-memory --expert-budget 50%", d);
  CHECK(m.at("expert_source") == "host memory");
  CHECK(m.at("precision") == "q4");
}

TEST_CASE("moe-run reads a Q2_K-like GGUF's Q2_K/Q3_K/Q4_K experts in place",
          "[engine][in_place][kquant][moe_run]") {
  using namespace kquant_in_place_test;
  if (!fs::exists(moe_run)) {
    WARN(moe_run.string() << " is missing (build the moe-run target); skipped");
    return;
  }
  const fs::path d = engine_test::scratch("engine-kquant-in-place", "moe-run-q2");
  const std::string in_place = "in place: " + kquant_q2_model.string();
  nlohmann::json baseline_tokens;
  namespace ps = moekit::presets;
  for (const ps::PresetEntry* preset :
       {&ps::entry_of<ps::BaselineSpec>, &ps::entry_of<ps::FateSpec>,
        &ps::entry_of<ps::EdgeMoeSpec>, &ps::entry_of<ps::MobileSpec>,
        &ps::entry_of<ps::FiddlerSpec>, &ps::entry_of<ps::NextUseSpec>}) {
    const std::string name(preset->name);
    const bool fiddler = ps::is<ps::FiddlerSpec>(*preset);
    const std::string extra = fiddler ? " --cpu-latency 0.0001 --copy-latency 0.0002" : "";
    const nlohmann::json j =
        run_json("--preset " + name + " --expert-budget 50%" + extra, d, kquant_q2_model);
    const std::string source = j.at("expert_source");
    INFO(name << ": expert_source " << source);
    CHECK(j.at("generated_tokens") == 4);
    CHECK(j.at("precision") == "q2_k");  // --precision auto: the file's own types, in place
    CHECK(source.starts_with(in_place));
    // A store, when a preset needs one, holds only what the file lacks (q2, Fate's and NextUse's
    // low precision; no conversion of the K-quants the run reads in place).
    CHECK(source.find("-q4") == std::string::npos);
    CHECK(source.find("-q8") == std::string::npos);
    if (ps::is<ps::BaselineSpec>(*preset)) {
      CHECK(source == in_place);                   // no store at all
      CHECK_FALSE(j.contains("conversion_loss"));  // nothing converted, nothing measured
      baseline_tokens = j.at("token_ids");
    }
    if (fiddler) {  // its CPU path reads the same bytes through the loader: the same tokens
      CHECK(j.at("host_read_bytes").get<std::uint64_t>() > 0);
      CHECK(j.at("token_ids") == baseline_tokens);
    }
  }
  // HOBBIT needs a low precision with fewer bits than the base; q2_k has two, so it is refused
  // as `--precision q2` is.
  const engine_test::Command h = run_moe("--preset hobbit --expert-budget 50%", d, kquant_q2_model);
  CHECK(h.status != 0);
  CHECK(h.err.find("fewer bits") != std::string::npos);
  // Held in host memory, K-quants are converted (moekit never encodes into them): Q2_K -> q2.
  const nlohmann::json m = run_json("--in-memory --expert-budget 50%", d, kquant_q2_model);
  CHECK(m.at("expert_source") == "host memory");
  CHECK(m.at("precision") == "q2");
}
