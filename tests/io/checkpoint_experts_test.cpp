// CheckpointExperts / CheckpointExpertSource: experts read in place from a GGUF file give the
// blob that transcoding (or copying) the tensor's slice gives, in rows and in both panel orders,
// through O_DIRECT and buffered reads, chunked or not, directly and through an AsyncLoader.

#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "io/gguf_builder.hpp"
#include "io/io_test_util.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/fault_injecting_source.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/gguf_transcode.hpp"
#include "moekit/precision/half.hpp"

namespace checkpoint_experts_test {

using namespace moekit;
using namespace moekit::io;
using Bytes = std::vector<std::byte>;

// Blocks of type `t` with random codes and small finite f16 scales (or random f16 weights).
Bytes random_tensor(DType t, std::uint64_t elements, std::uint64_t salt) {
  std::mt19937_64 rng(salt);
  const std::uint64_t be = block_elements(t), bb = block_bytes(t);
  Bytes out(elements / be * bb);
  for (std::uint64_t i = 0; i < out.size(); ++i) out[i] = std::byte(rng() & 0xFF);
  if (t == DType::q4_0 || t == DType::q8_0) {
    for (std::uint64_t b = 0; b < elements / be; ++b) {
      const std::uint16_t s = float_to_half_bits(0.001f * static_cast<float>(1 + rng() % 100));
      std::memcpy(out.data() + b * bb, &s, 2);
    }
  } else if (t == DType::f16) {
    for (std::uint64_t i = 0; i < elements; ++i) {
      const std::uint16_t h = float_to_half_bits(static_cast<float>(rng() % 2001) / 1000.f - 1.f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::uint32_t ggml_of(DType t) {
  return t == DType::q4_0 ? ggml_type::q4_0 : t == DType::q8_0 ? ggml_type::q8_0 : ggml_type::f16;
}

struct ExpertFile {
  ModelShape shape;
  DType dtype;
  std::vector<Bytes> stacked;  // gate, up, down: every expert of layer 0
  std::string path;
};

// A GGUF with one MoE layer of `shape.n_experts` stacked experts, after a small tensor so that
// the experts start at an offset that is not a multiple of 4096.
ExpertFile write_fixture(const test::TempDir& dir, DType t, const ModelShape& s) {
  ExpertFile f{s, t, {}, dir.file("experts.gguf")};
  test::GgufBuilder b;
  b.tensor("token_embd.weight", {32, 3}, ggml_type::f32, Bytes(32 * 3 * 4));
  const char* names[] = {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                         "blk.0.ffn_down_exps.weight"};
  for (int m = 0; m < 3; ++m) {
    const std::uint64_t rows = m < 2 ? s.ffn : s.hidden, cols = m < 2 ? s.hidden : s.ffn;
    f.stacked.push_back(random_tensor(t, rows * cols * s.n_experts, 17 + m));
    b.tensor(names[m], {cols, rows, s.n_experts}, ggml_of(t), f.stacked.back());
  }
  test::write_file(f.path, b.bytes());
  return f;
}

// What the blob of expert `e` must be: each matrix's slice transcoded (or copied) in `order`.
Bytes expected_blob(const ExpertFile& f, std::uint32_t e, Precision p, MatrixOrder order) {
  const ModelShape& s = f.shape;
  Bytes out(s.expert_bytes(p));
  std::size_t at = 0;
  for (int m = 0; m < 3; ++m) {
    const std::uint64_t rows = m < 2 ? s.ffn : s.hidden, cols = m < 2 ? s.hidden : s.ffn;
    const std::uint64_t per = f.stacked[m].size() / s.n_experts;
    const std::span<const std::byte> src(f.stacked[m].data() + e * per, per);
    const std::size_t n = matrix_bytes(rows, cols, p, s.quant);
    if (is_quantized(p))
      transcode_matrix(f.dtype, src, rows, cols, std::span(out).subspan(at, n), order);
    else
      std::memcpy(out.data() + at, src.data(), n);
    at += n;
  }
  return out;
}

std::shared_ptr<const CheckpointExperts> locate(const ExpertFile& f, const GgufFile& g) {
  const std::uint32_t layers[] = {0};
  return std::make_shared<const CheckpointExperts>(
      CheckpointExperts::locate(g, Architecture::mixtral, TensorFormat::gguf, f.shape, layers));
}

}  // namespace checkpoint_experts_test

using namespace checkpoint_experts_test;

TEST_CASE("checkpoint experts: blobs read in place equal the transcoded slices",
          "[io][checkpoint_experts]") {
  test::TempDir dir;
  // Rows (224, 1056): not whole panel groups of 64; hidden: two panel steps and a tail.
  const ModelShape s{.n_layers = 1, .n_experts = 3, .top_k = 1, .hidden = 1056, .ffn = 224};
  for (DType t : {DType::q4_0, DType::q8_0, DType::f16}) {
    const ExpertFile f = write_fixture(dir, t, s);
    const GgufFile g(f.path);
    const auto experts = locate(f, g);
    const Precision p = experts->precision();
    CHECK(p == *in_place_precision(t, s.quant));
    const bool direct = GENERATE(false, true);
    const std::uint64_t staging = GENERATE(std::uint64_t{8} << 20, std::uint64_t{12} << 10);
    for (MatrixOrder order :
         {MatrixOrder::rows, MatrixOrder::panels4, MatrixOrder::blocked_panels4}) {
      INFO(name(t) << " direct " << direct << " staging " << staging << " order "
                   << static_cast<int>(order));
      std::vector<PreadSource> files;
      files.emplace_back(f.path, PreadSource::Config{.direct = direct});
      CheckpointExpertSource<PreadSource> src(experts, std::move(files), {order, staging});
      const MatrixOrder held = is_quantized(p) ? order : MatrixOrder::rows;
      for (std::uint32_t e = 0; e < s.n_experts; ++e) {
        const StoreBlob b = src.blob({0, e}, p);
        AlignedBuffer dest(b.bytes);
        src.read({b.offset, b.bytes}, dest.span().first(b.bytes));
        const Bytes want = expected_blob(f, e, p, held);
        CHECK(std::memcmp(dest.data(), want.data(), want.size()) == 0);
      }
    }
  }
}

TEST_CASE(
    "checkpoint experts: a read that fails ahead of the conversion fails the blob, not later ones",
    "[io][checkpoint_experts]") {
  test::TempDir dir;
  const ModelShape s{.n_layers = 1, .n_experts = 2, .top_k = 1, .hidden = 1056, .ffn = 224};
  const ExpertFile f = write_fixture(dir, DType::q4_0, s);
  const GgufFile g(f.path);
  const auto experts = locate(f, g);
  const Precision p = experts->precision();
  // 12 KiB of staging: many chunks per blob, each read on the read-ahead thread while the one
  // before it is converted. Call 1 is the first chunk; later calls are read ahead.
  const std::uint64_t failing = GENERATE(1, 2, 5);
  INFO("EIO on read call " << failing);
  std::vector<FaultInjectingSource> files;
  files.emplace_back(f.path, FaultPlan{.eio_on_call = failing});
  CheckpointExpertSource<FaultInjectingSource> src(experts, std::move(files),
                                                   {MatrixOrder::rows, std::uint64_t{12} << 10});
  const StoreBlob b0 = src.blob({0, 0}, p);
  AlignedBuffer dest(b0.bytes);
  CHECK_THROWS_WITH(src.read({b0.offset, b0.bytes}, dest.span().first(b0.bytes)),
                    Catch::Contains("Input/output error") && Catch::Contains(f.path));
  for (std::uint32_t e = 0; e < s.n_experts; ++e) {  // the same thread reads on, exactly
    const StoreBlob b = src.blob({0, e}, p);
    src.read({b.offset, b.bytes}, dest.span().first(b.bytes));
    const Bytes want = expected_blob(f, e, p, MatrixOrder::rows);
    CHECK(std::memcmp(dest.data(), want.data(), want.size()) == 0);
  }
}

TEST_CASE("checkpoint experts: an AsyncLoader serves them; wrong precisions and reads are refused",
          "[io][checkpoint_experts]") {
  test::TempDir dir;
  const ModelShape s{.n_layers = 1, .n_experts = 2, .top_k = 1, .hidden = 64, .ffn = 96};
  const ExpertFile f = write_fixture(dir, DType::q4_0, s);
  const GgufFile g(f.path);
  const auto experts = locate(f, g);
  std::vector<PreadSource> files;
  files.emplace_back(f.path);
  using Source = CheckpointExpertSource<PreadSource>;
  auto src = std::make_shared<Source>(experts, std::move(files));
  test::require_error(
      [&] {
        (void)src->blob({0, 0}, Precision::q8);
      },
      ErrorKind::unsupported, {"in place at q4", "not at q8"});
  AlignedBuffer dest(s.expert_bytes(Precision::q4));
  test::require_error(
      [&] {
        src->read({0, 100}, dest.span());
      },
      ErrorKind::invalid_argument, {"whole expert blobs"});

  AsyncLoader<Source> loader(*src, [src](ExpertKey k, Precision p) { return src->blob(k, p); },
                             {.io_threads = 2, .verify_checksums = false});
  for (std::uint32_t e = 0; e < s.n_experts; ++e) {
    const LoadTicket t =
        loader.submit({{0, e}, Precision::q4, LoadPriority::on_demand, dest.span()});
    loader.wait(t);
    const Bytes want = expected_blob(f, e, Precision::q4, MatrixOrder::rows);
    CHECK(std::memcmp(dest.data(), want.data(), want.size()) == 0);
  }
}

TEST_CASE("checkpoint experts: types without an exact path are refused naming the tensor",
          "[io][checkpoint_experts]") {
  CHECK(in_place_precision(DType::bf16, {}) == Precision::bf16);
  CHECK(in_place_precision(DType::q4_0, {}) == Precision::q4);
  CHECK_FALSE(in_place_precision(DType::q4_0, {64, false}));
  // The K-quants Q2_K..Q6_K are moekit formats as they lie, whatever the scheme.
  CHECK(in_place_precision(DType::q4_k, {}) == Precision::q4_k);
  CHECK(in_place_precision(DType::q6_k, {64, false}) == Precision::q6_k);
  CHECK(in_place_precision(DType::q3_k, {}) == Precision::q3_k);
  CHECK(in_place_precision(DType::q2_k, {64, false}) == Precision::q2_k);
  test::TempDir dir;
  const ModelShape s{
      .n_layers = 1, .n_experts = 2, .top_k = 1, .hidden = 64, .ffn = 96, .quant = {64, false}};
  const ExpertFile f = write_fixture(dir, DType::q4_0, s);
  const GgufFile g(f.path);
  test::require_error([&] { (void)locate(f, g); }, ErrorKind::unsupported,
                      {"blk.0.ffn_gate_exps.weight", "Q4_0", "no exact in-place path"});
}

TEST_CASE(
    "checkpoint experts: read as f32, K-quant and mixed-type experts are their dequantized "
    "slices",
    "[io][checkpoint_experts]") {
  test::TempDir dir;
  const ModelShape s{.n_layers = 1, .n_experts = 3, .top_k = 1, .hidden = 512, .ffn = 256};
  // Gate, up and down in different types, as Q4_K_M files mix Q4_K with Q6_K.
  const std::array<std::array<DType, 3>, 3> mixes = {{{DType::q4_k, DType::q4_k, DType::q6_k},
                                                      {DType::q3_k, DType::q5_k, DType::q2_k},
                                                      {DType::q8_0, DType::f16, DType::q6_k}}};
  const std::map<DType, std::uint32_t> ggml = {
      {DType::q2_k, ggml_type::q2_k}, {DType::q3_k, ggml_type::q3_k},
      {DType::q4_k, ggml_type::q4_k}, {DType::q5_k, ggml_type::q5_k},
      {DType::q6_k, ggml_type::q6_k}, {DType::q8_0, ggml_type::q8_0},
      {DType::f16, ggml_type::f16}};
  const char* names[] = {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                         "blk.0.ffn_down_exps.weight"};
  for (const auto& types : mixes) {
    INFO(name(types[0]) << "/" << name(types[1]) << "/" << name(types[2]));
    const std::string path = dir.file("kquant.gguf");
    test::GgufBuilder b;
    b.tensor("token_embd.weight", {32, 3}, ggml_type::f32, Bytes(32 * 3 * 4));
    std::vector<Bytes> stacked;
    for (int m = 0; m < 3; ++m) {
      const std::uint64_t rows = m < 2 ? s.ffn : s.hidden, cols = m < 2 ? s.hidden : s.ffn;
      stacked.push_back(random_tensor(types[m], rows * cols * s.n_experts, 31 + m));
      b.tensor(names[m], {cols, rows, s.n_experts}, ggml.at(types[m]), stacked.back());
    }
    test::write_file(path, b.bytes());
    const GgufFile g(path);
    const std::uint32_t layers[] = {0};
    auto locate = [&] {
      return CheckpointExperts::locate(g, Architecture::mixtral, TensorFormat::gguf, s, layers);
    };
    if (types[0] == DType::q4_k)  // K-quants mixed among themselves: a K-quant blob in place
      CHECK(locate().shape().kquant ==
            KquantBlob{Precision::q4_k, Precision::q4_k, Precision::q4_k, Precision::q6_k});
    else if (types[0] == DType::q3_k)  // Q3_K and Q2_K too, each matrix at its own type
      CHECK(locate().shape().kquant ==
            KquantBlob{Precision::q3_k, Precision::q3_k, Precision::q5_k, Precision::q2_k});
    else  // a K-quant beside other types: one precision per run
      test::require_error(locate, ErrorKind::unsupported, {"F16", "differs from the Q8_0"});
    auto experts = std::make_shared<const CheckpointExperts>(
        CheckpointExperts::locate_as_f32(g, Architecture::mixtral, TensorFormat::gguf, s, layers));
    CHECK(experts->precision() == Precision::f32);
    CHECK(experts->dequantized());
    std::vector<PreadSource> files;
    files.emplace_back(path, PreadSource::Config{.direct = true});
    // 12 KiB of staging: several chunks per matrix.
    CheckpointExpertSource<PreadSource> src(experts, std::move(files),
                                            {MatrixOrder::rows, 12u << 10});
    for (std::uint32_t e = 0; e < s.n_experts; ++e) {
      const StoreBlob blob = src.blob({0, e}, Precision::f32);
      AlignedBuffer dest(blob.bytes);
      src.read({blob.offset, blob.bytes}, dest.span().first(blob.bytes));
      std::size_t at = 0;
      for (int m = 0; m < 3; ++m) {
        const std::uint64_t rows = m < 2 ? s.ffn : s.hidden, cols = m < 2 ? s.hidden : s.ffn;
        const TensorView slice = slice_outer(g.tensor(names[m]), e);
        const std::vector<float> want = dequantize(slice);
        REQUIRE(want.size() == rows * cols);
        CHECK(std::memcmp(dest.data() + at, want.data(), want.size() * 4) == 0);
        at += want.size() * 4;
      }
      CHECK(at == blob.bytes);
    }
  }
}
