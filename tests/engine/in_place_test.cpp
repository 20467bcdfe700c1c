// Experts read in place from the checkpoint (io/checkpoint_experts.hpp through the engine's
// ExpertLoader), moe-run's default: a GGUF's Q8_0 experts, transcoded while they are read, give
// transformers' logits of the dequantized weights and, bit for bit, the logits of the same bytes
// reached another way; safetensors experts at their own float type give the in-memory path's
// logits bit for bit under a budget that evicts; and the moe-run binary reads in place with every
// preset but Fiddler, and refuses `--expert-budget auto` when the memory cannot hold the run.

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/gguf_transcode.hpp"
#include "moekit/io/safetensors.hpp"
#include "moekit/io/tensor_names.hpp"
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
namespace in_place_test {

using namespace moekit::engine;
using moekit::MatrixOrder;
using moekit::Precision;
namespace fs = std::filesystem;
namespace mio = moekit::io;

using Experts = std::shared_ptr<const mio::CheckpointExperts>;

const fs::path mixtral = engine_test::data_dir() / "mixtral";
const fs::path default_model = fs::path(MOEKIT_SOURCE_DIR) / "models" / "moekit-tiny-moe";

// The first element where `a` and `b` differ in their bits, or -1 when they are the same size and
// equal: a check Catch need not print element by element (experts are ~10^5 values).
template <class T>
std::ptrdiff_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

// The checkpoint's experts as moe-run locates them (null would mean no exact in-place path).
Experts locate_gguf(const mio::GgufFile& g, const ModelConfig& cfg) {
  Experts e = locate_checkpoint_experts(cfg, {}, &g);
  REQUIRE(e != nullptr);
  return e;
}

Experts locate_safetensors(const fs::path& dir, const ModelConfig& cfg) {
  Experts e = locate_checkpoint_experts(cfg, dir, nullptr);
  REQUIRE(e != nullptr);
  return e;
}

// Expert `k` of a Q8_0/Q4_0 GGUF as a blob in rows, transcoded from the reader's (mapped) view of
// the tensors: none of the in-place path's aligned reads, chunks, O_DIRECT or loader.
std::vector<std::byte> transcoded_blob(const mio::GgufFile& g, mio::Architecture arch,
                                       const moekit::ModelShape& s, moekit::ExpertKey k) {
  const auto m = mio::find_expert_matrices(g, arch, mio::TensorFormat::gguf, k, s);
  std::vector<std::byte> blob;
  for (mio::ExpertMatrix which : mio::all_expert_matrices) {
    const mio::TensorView& t = m[which];
    std::vector<std::byte> out(t.bytes.size());
    mio::transcode_matrix(t.dtype, t.bytes, t.rows(), t.cols(), out, MatrixOrder::rows, "test");
    blob.insert(blob.end(), out.begin(), out.end());
  }
  return blob;
}

// A store of the transcoded blobs; the writer packs them into `order` itself (expert_blob's
// pack_panels), a route apart from the in-place reader's transcoding straight into panels.
std::shared_ptr<const mio::ExpertStore> transcoded_store(const mio::GgufFile& g,
                                                         const ModelConfig& cfg, MatrixOrder order,
                                                         const fs::path& file) {
  const moekit::ModelShape s = cfg.shape();
  const std::vector<Precision> ps{Precision::q8};
  mio::ExpertStoreWriteOptions wo;
  wo.order = order;
  mio::write_expert_store(
      file.string(), s, ps,
      [&](moekit::ExpertKey k, Precision) {
        return transcoded_blob(g, io_architecture(cfg.arch), s, k);
      },
      wo);
  return std::make_shared<const mio::ExpertStore>(mio::ExpertStore::open(file.string(), s));
}

// The values of every in-place blob, decoded in its order, are the GGUF's dequantized ones.
void check_blob_values(const ExpertBacking& b, const mio::GgufFile& g, mio::Architecture arch,
                       const moekit::ModelShape& s) {
  const Precision p = b.checkpoint->precision();
  for (std::uint32_t l = 0; l < s.n_layers; ++l)
    for (std::uint32_t e = 0; e < s.n_experts; ++e) {
      INFO("layer " << l << " expert " << e);
      const std::vector<std::byte> blob = b.read_expert({l, e}, p);
      const auto v = mio::expert_view(s, blob, p, b.order());
      const ExpertF32 want = read_expert_f32(g, arch, mio::TensorFormat::gguf, l, e, s);
      CHECK(first_difference(moekit::decode_matrix(v.w1), want.w1) == -1);
      CHECK(first_difference(moekit::decode_matrix(v.w3), want.w3) == -1);
      CHECK(first_difference(moekit::decode_matrix(v.w2), want.w2) == -1);
    }
}

// Logits (positions × vocab) of `seq` teacher-forced through baseline over `b` under `o`, and
// the pipeline's counters.
struct Forced {
  std::vector<float> logits;
  moekit::PipelineStats stats;
};

Forced forced(const ModelConfig& cfg, const DenseWeights& dense, const ExpertBacking& b,
              const OffloadSettings& o, std::span<const Token> seq, std::size_t prompt,
              moekit::ThreadPool* pool) {
  return with_pipeline<moekit::presets::BaselineSpec>(
      cfg.shape(), o, b.make_loader(), PresetInputs{}, [&](auto& p) {
        Forced f;
        f.logits = engine_test::teacher_forced(cfg, dense, p, seq, prompt, pool, false);
        f.stats = p.stats();
        return f;
      });
}

// The greedy token of every position from the prompt's last on.
std::vector<Token> greedy_tokens(const std::vector<float>& logits, std::size_t vocab,
                                 std::size_t prompt) {
  std::vector<Token> out;
  for (std::size_t t = prompt - 1; t < logits.size() / vocab; ++t)
    out.push_back(engine_test::argmax(logits.data() + t * vocab, vocab));
  return out;
}

TEST_CASE("GGUF Q8_0 experts read in place match transformers and the same bytes from a store",
          "[engine][in_place]") {
  const mio::GgufFile g((mixtral / "model-q8_0.gguf").string());
  const ModelConfig cfg = gguf_config(g);
  const moekit::ModelShape s = cfg.shape();
  const Experts experts = locate_gguf(g, cfg);
  REQUIRE(experts->dtype() == mio::DType::q8_0);
  REQUIRE(experts->precision() == Precision::q8);
  const ModelWeights w = load_gguf_weights(cfg, g, {});
  REQUIRE(w.experts.total_bytes() == 0);  // the experts come from the file alone

  // The reference's greedy run, teacher-forced: its positions are the sequence minus the last.
  const auto ref = engine_test::load_reference(mixtral, "gguf_reference.json", "q8_0");
  const std::size_t positions = ref.logits.size() / ref.vocab, prompt = ref.prompt_ids.size();
  const std::vector<Token> seq(ref.sequence_ids.begin(), ref.sequence_ids.begin() + positions);
  const std::vector<Token> want_tokens(ref.generated_ids.begin(), ref.generated_ids.end());
  // One token's experts: every layer evicts, so the in-place reads run throughout.
  const OffloadSettings o{minimum_expert_budget(s, Precision::q8), Precision::q8};
  moekit::ThreadPool pool(2);
  const fs::path d = engine_test::scratch("engine-in-place", "gguf");

  std::vector<std::vector<float>> by_order;
  for (MatrixOrder order : {MatrixOrder::rows, MatrixOrder::blocked_panels4}) {
    INFO("order " << moekit::name(order));
    const ExpertBacking in_place{nullptr, nullptr, StoreIo{}, experts, order};
    REQUIRE(in_place.order() == order);
    check_blob_values(in_place, g, io_architecture(cfg.arch), s);
    const fs::path file = d / (std::string(moekit::name(order)) + ".moestore");
    const ExpertBacking stored{nullptr, transcoded_store(g, cfg, order, file), StoreIo{}};
    REQUIRE(stored.order() == order);
    for (std::uint32_t l = 0; l < s.n_layers; ++l)
      for (std::uint32_t e = 0; e < s.n_experts; ++e)
        CHECK(first_difference(in_place.read_expert({l, e}, Precision::q8),
                               stored.read_expert({l, e}, Precision::q8)) == -1);

    const Forced run = forced(cfg, w.dense, in_place, o, seq, prompt, &pool);
    CHECK(run.stats.cache.evictions > 0);
    CHECK(run.stats.bytes_loaded() > 0);
    REQUIRE(run.logits.size() == ref.logits.size());
    const double err = engine_test::worst_relative_error(run.logits, ref.logits, ref.vocab);
    INFO("worst relative error vs the dequantized-weights reference: " << err);
    CHECK(err <= 1e-4);  // gguf_test's bound for the same file through an f32 store
    CHECK(greedy_tokens(run.logits, ref.vocab, prompt) == want_tokens);
    const Forced from_store = forced(cfg, w.dense, stored, o, seq, prompt, &pool);
    CHECK(first_difference(run.logits, from_store.logits) == -1);
    by_order.push_back(run.logits);
  }
  // Rows and panels only move bytes: the kernels compute the same sums. (The fixture's rows are
  // 32 wide, a panel tail each, so its panels lie as rows: the next test covers wide ones.)
  CHECK(first_difference(by_order.at(0), by_order.at(1)) == -1);
}

// `weights` weights as random Q4_0/Q8_0 blocks with small finite f16 scales.
std::vector<std::byte> random_blocks(mio::DType t, std::uint64_t weights, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::uint64_t bb = mio::block_bytes(t);
  std::vector<std::byte> out(weights / 32 * bb);
  for (std::byte& b : out) b = std::byte(rng() & 0xFF);
  for (std::uint64_t i = 0; i < out.size(); i += bb) {
    const std::uint16_t d = moekit::float_to_half_bits(0.001f * float(1 + rng() % 100));
    std::memcpy(out.data() + i, &d, 2);
  }
  return out;
}

// One layer of stacked experts of type `t` (llama.cpp's names), after a tensor that moves them
// off a 4096-byte boundary.
fs::path write_expert_gguf(mio::DType t, const moekit::ModelShape& s, const fs::path& file) {
  moekit::test::GgufBuilder b;
  b.tensor("token_embd.weight", {32, 3}, mio::ggml_type::f32, std::vector<std::byte>(32 * 3 * 4));
  const std::uint32_t type = t == mio::DType::q4_0 ? mio::ggml_type::q4_0 : mio::ggml_type::q8_0;
  const char* names[] = {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                         "blk.0.ffn_down_exps.weight"};
  for (std::uint32_t m = 0; m < 3; ++m) {
    const std::uint64_t rows = m < 2 ? s.ffn : s.hidden, cols = m < 2 ? s.hidden : s.ffn;
    b.tensor(names[m], {cols, rows, s.n_experts}, type,
             random_blocks(t, rows * cols * s.n_experts, 11 + m));
  }
  const auto bytes = b.bytes();
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return file;
}

TEST_CASE("wide GGUF Q4_0/Q8_0 experts read in place lie in the order the run asks for",
          "[engine][in_place]") {
  // w1/w3 rows of 4640 columns: nine 512-column steps and a tail, so blocked panels have two
  // column blocks; 64 rows, one group of 16 panels.
  const moekit::ModelShape s{.n_layers = 1, .n_experts = 2, .top_k = 1, .hidden = 4640, .ffn = 64};
  const fs::path d = engine_test::scratch("engine-in-place", "wide");
  for (mio::DType t : {mio::DType::q4_0, mio::DType::q8_0}) {
    const mio::GgufFile g(
        write_expert_gguf(t, s, d / (std::string(mio::name(t)) + ".gguf")).string());
    const std::uint32_t layers[] = {0};
    const auto experts =
        std::make_shared<const mio::CheckpointExperts>(mio::CheckpointExperts::locate(
            g, mio::Architecture::mixtral, mio::TensorFormat::gguf, s, layers));
    const Precision p = experts->precision();
    for (MatrixOrder order : {MatrixOrder::rows, MatrixOrder::blocked_panels4}) {
      INFO(mio::name(t) << " in " << moekit::name(order));
      const ExpertBacking in_place{nullptr, nullptr, StoreIo{}, experts, order};
      check_blob_values(in_place, g, mio::Architecture::mixtral, s);
      for (std::uint32_t e = 0; e < s.n_experts; ++e) {
        // The store writer's packing of the rows, a route apart from transcoding into panels.
        std::vector<std::byte> want = transcoded_blob(g, mio::Architecture::mixtral, s, {0, e});
        if (order != MatrixOrder::rows) want = mio::expert_blob_in_panels(s, p, want, order);
        CHECK(first_difference(in_place.read_expert({0, e}, p), want) == -1);
      }
    }
    // The test has teeth: wide rows in panels are not the rows.
    const ExpertBacking rows{nullptr, nullptr, StoreIo{}, experts, MatrixOrder::rows};
    const ExpertBacking panels{nullptr, nullptr, StoreIo{}, experts, MatrixOrder::blocked_panels4};
    CHECK(first_difference(rows.read_expert({0, 1}, p), panels.read_expert({0, 1}, p)) != -1);
  }
}

TEST_CASE("safetensors experts read in place at their own type equal the in-memory path",
          "[engine][in_place]") {
  moekit::ThreadPool pool(2);
  std::vector<fs::path> dirs = engine_test::architecture_fixtures();
  if (fs::exists(default_model / "model.safetensors")) dirs.push_back(default_model);  // bf16
  for (const fs::path& dir : dirs) {
    INFO(dir.filename().string());
    const ModelConfig cfg = load_config(dir);
    const moekit::ModelShape s = cfg.shape();
    const Experts experts = locate_safetensors(dir, cfg);
    const Precision p = experts->precision();
    CHECK(p == (dir == default_model ? Precision::bf16 : Precision::f32));  // as config.json says
    const ModelWeights host = load_weights(cfg, dir, {p});
    const ModelWeights dense = load_weights(cfg, dir, {});
    // One token's experts: every layer evicts, so the in-place reads run throughout.
    const OffloadSettings o{minimum_expert_budget(s, p), p};
    // Tokens of the default model's vocabulary, folded into the fixtures' smaller ones.
    std::vector<Token> prompt{1, 415, 2936, 9060, 285, 1142, 28705, 28770};
    for (Token& t : prompt) t %= cfg.vocab_size;
    // Prefill (every logit row) and a few greedy decode steps.
    auto run = [&](const ExpertBacking& b, const DenseWeights& dw, moekit::PipelineStats* stats) {
      return with_pipeline<moekit::presets::BaselineSpec>(
          s, o, b.make_loader(), PresetInputs{}, [&](auto& pipe) {
            auto r = engine_test::greedy(cfg, dw, pipe, prompt, 4, &pool);
            if (stats) *stats = pipe.stats();
            return r;
          });
    };
    const auto want = run(ExpertBacking{&host.experts, nullptr, {}}, host.dense, nullptr);
    for (bool uring : {true, false}) {
      INFO("io_uring " << uring);
      const ExpertBacking in_place{nullptr, nullptr, StoreIo{.direct = true, .uring = uring},
                                   experts, MatrixOrder::rows};
      moekit::PipelineStats stats{};
      const auto got = run(in_place, dense.dense, &stats);
      CHECK(stats.cache.evictions > 0);
      CHECK(stats.bytes_loaded() > 0);
      CHECK(got.tokens == want.tokens);
      CHECK(first_difference(got.logits, want.logits) == -1);
    }
  }
}

const fs::path moe_run = fs::path(MOEKIT_BINARY_DIR) / "examples" / "moe-run" / "moe-run";

using engine_test::Command;

// moe-run on the default model with `args`; stderr through a file of the scratch directory.
Command run_moe_run(const std::string& args, const fs::path& scratch) {
  return engine_test::run_command("'" + moe_run.string() + "' -p 'Once upon a time' " + args,
                                  scratch);
}

nlohmann::json run_json(const std::string& args, const fs::path& scratch) {
  const Command c = run_moe_run("--json -n 4 --temp 0 " + args, scratch);
  INFO("moe-run " << args << "\nstderr: " << c.err);
  REQUIRE(c.status == 0);
  return nlohmann::json::parse(c.out);
}

bool have_moe_run() {
  if (fs::exists(moe_run) && fs::exists(default_model / "model.safetensors")) return true;
  WARN(moe_run.string() << " or the default model is missing (build the moe-run target); "
                           "skipped");
  return false;
}

TEST_CASE("moe-run reads the default model's experts in place with every preset",
          "[engine][in_place][moe_run]") {
  if (!have_moe_run()) return;
  const fs::path d = engine_test::scratch("engine-in-place", "moe-run");
  const ModelConfig cfg = load_config(default_model);
  const std::string file = (default_model / "model.safetensors").string();
  const auto half = static_cast<std::size_t>(
      std::ceil(double(all_resident_budget(cfg.shape(), Precision::bf16)) / 2));
  std::string baseline_text;
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
    CHECK(j.at("precision") == "bf16");  // --precision auto: the checkpoint's own type
    CHECK(j.at("expert_budget_bytes") == half);
    CHECK(j.at("generated_tokens") == 4);
    CHECK_FALSE(j.contains("expert_budget_auto"));
    CHECK(source.starts_with("in place: " + file));
    // A store, when a preset needs one, holds only the precisions the checkpoint lacks.
    CHECK(source.find("bf16.moestore") == std::string::npos);
    if (fiddler) {
      // Its CPU path reads each expert through the loader (no host copy, no mapping), at full
      // precision the same bytes as the baseline's, so the same text.
      CHECK(j.at("host_read_bytes").get<std::uint64_t>() > 0);
      CHECK(j.at("decode_host_read_bytes").get<std::uint64_t>() > 0);
      CHECK(j.at("text") == baseline_text);
    } else {
      CHECK(j.at("host_read_bytes") == 0);
    }
    if (ps::is<ps::BaselineSpec>(*preset)) baseline_text = j.at("text");
  }
  // --expert-budget auto says what it chose.
  const nlohmann::json a = run_json("--expert-budget auto", d);
  CHECK(std::string(a.at("expert_source")).starts_with("in place: " + file));
  REQUIRE(a.contains("expert_budget_auto"));
  CHECK(std::string(a.at("expert_budget_auto")).starts_with("auto: "));
  // Experts held in host memory run at the same type, the checkpoint's own, with the same text.
  const nlohmann::json m = run_json("--in-memory --expert-budget 50%", d);
  CHECK(m.at("expert_source") == "host memory");
  CHECK(m.at("precision") == "bf16");
  CHECK(m.at("text") == baseline_text);
}

TEST_CASE("moe-run refuses --expert-budget auto before loading when the run cannot fit",
          "[engine][in_place][moe_run]") {
  if (!have_moe_run()) return;
  // A context of four billion tokens: its KV cache alone is terabytes, beyond any machine that
  // runs this test; refused from the file sizes, before a weight is read.
  const Command c = run_moe_run("--expert-budget auto -n 1 -c 4000000000",
                                engine_test::scratch("engine-in-place", "refusal"));
  INFO("stderr: " << c.err);
  CHECK(c.status == 1);
  CHECK(c.out.empty());
  CHECK_THAT(c.err, Catch::Contains("--expert-budget auto: ") &&
                        Catch::Contains("of memory missing") && Catch::Contains("KV cache") &&
                        Catch::Contains("shorten the context") &&
                        Catch::Contains("an explicit --expert-budget SIZE skips this check"));
}

}  // namespace in_place_test
