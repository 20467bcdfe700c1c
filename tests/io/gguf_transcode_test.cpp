// GGUF Q4_0 / Q8_0 -> moekit q4 / q8 (io/gguf_transcode.hpp): the rows equal a weight-by-weight
// encoding of GGUF's codes and decode to io/dequantize.hpp's values bit for bit (and to gguf-py's:
// committed fixture from scripts/make_gguf_transcode_fixture.py); panels equal pack_panels of the
// rows; in place equals out of place; GEMV on the result matches float64 on GGUF's values; sizes,
// types and overlaps are refused by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/gguf_transcode.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/reference.hpp"
#include "precision/test_support.hpp"

using namespace moekit;
using namespace moekit::io;

// Named rather than anonymous: the io tests compile as one unity translation unit.
namespace gguf_transcode_test {

using Bytes = std::vector<std::byte>;

// f16 bit patterns a byte permutation could get wrong: zeros of either sign, subnormals, the
// smallest normal, the largest finite of either sign, negative values.
constexpr std::uint16_t special_scales[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x0400,
                                            0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x8001};

constexpr MatrixOrder all_orders[] = {MatrixOrder::rows, MatrixOrder::panels4,
                                      MatrixOrder::blocked_panels4};

// A block's codes: random, or one of the extreme patterns (Q4_0: nibbles all 0, all 15, 0 and 15
// in each byte; Q8_0: all -128, all 127, alternating).
void fill_codes(DType t, std::byte* q, std::size_t n, std::mt19937_64& rng) {
  const unsigned pick = rng() % 6;
  for (std::size_t j = 0; j < n; ++j) {
    unsigned v = static_cast<unsigned>(rng());
    if (pick == 0) v = t == DType::q4_0 ? 0x00 : 0x80;
    if (pick == 1) v = t == DType::q4_0 ? 0xFF : 0x7F;
    if (pick == 2) v = t == DType::q4_0 ? 0xF0 : (j % 2 ? 0x7F : 0x80);
    q[j] = static_cast<std::byte>(v);
  }
}

// rows × cols weights of GGUF blocks: random codes and finite f16 scales (any sign and exponent,
// so subnormals too), with the extreme codes and the special scales mixed in.
Bytes random_blocks(DType t, std::size_t rows, std::size_t cols, std::uint64_t salt) {
  std::mt19937_64 rng(test::test_seed() * 1000003u + salt);
  const std::size_t bb = block_bytes(t), n = rows * cols / 32;
  Bytes out(n * bb);
  for (std::size_t i = 0; i < n; ++i) {
    std::byte* b = out.data() + i * bb;
    fill_codes(t, b + 2, bb - 2, rng);
    std::uint16_t s =
        static_cast<std::uint16_t>((rng() & 0x8000) | (rng() % 31) << 10 | (rng() & 0x3FF));
    if (rng() % 4 == 0) s = special_scales[rng() % std::size(special_scales)];
    std::memcpy(b, &s, 2);
  }
  return out;
}

TensorView gguf_view(const Bytes& bytes, DType t, std::size_t rows, std::size_t cols,
                     std::string_view name = "blk.0.ffn_up.weight") {
  TensorView v;
  v.name = name;
  v.file = "memory";
  v.dtype = t;
  v.rank = 2;
  v.dims = {rows, cols, 0, 0};
  v.bytes = bytes;
  return v;
}

// The moekit rows of GGUF blocks written weight by weight from the GGUF definition (weight j of a
// Q4_0 block: low nibble of qs[j] for j < 16, high nibble of qs[j-16] after; Q8_0: q + 128)
// and packed as format.hpp defines (weight c at bit c·bits): an independent way to the bytes
// transcode must give.
Bytes encode_by_weight(DType t, const Bytes& src, std::size_t rows, std::size_t cols) {
  const Precision p = *exact_moekit_precision(t);
  const RowLayout l = RowLayout::of(cols, p, gguf_exact_scheme);
  const std::size_t bb = block_bytes(t);
  Bytes out(rows * l.bytes);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < cols / 32; ++i) {
      const std::byte* b = src.data() + (r * cols / 32 + i) * bb;
      std::byte* row = out.data() + r * l.bytes;
      for (unsigned j = 0; j < 32; ++j) {
        const auto q = std::to_integer<unsigned>(b[2 + (t == DType::q4_0 ? j % 16 : j)]);
        const unsigned code = t == DType::q8_0 ? (q + 128) % 256 : j < 16 ? q & 15 : q >> 4;
        const std::size_t bit = (32 * i + j) * l.bits;
        row[bit / 8] |= static_cast<std::byte>(code << (bit % 8));
      }
      std::memcpy(row + l.scales_offset + 2 * i, b, 2);
    }
  return out;
}

// Index of the first float whose bits differ (a.size() when none; -1 on a size mismatch).
std::ptrdiff_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<std::ptrdiff_t>(i);
  return static_cast<std::ptrdiff_t>(a.size());
}

#define REQUIRE_SAME_BITS(got, want)                                            \
  do {                                                                          \
    const auto& g_ = (got);                                                     \
    const auto& w_ = (want);                                                    \
    const std::ptrdiff_t at_ = first_bit_difference(g_, w_);                    \
    INFO("first difference at " << at_ << " of " << w_.size() << ": "           \
                                << (at_ >= 0 && at_ < std::ptrdiff_t(w_.size()) \
                                        ? std::to_string(g_[at_]) + " vs " +    \
                                              std::to_string(w_[at_])           \
                                        : std::string("-")));                   \
    REQUIRE(at_ == std::ptrdiff_t(w_.size()));                                  \
  } while (false)

struct Shape {
  std::size_t rows, cols;
};
// One block; a step and a half; whole panels; a tail and rows after the last panel; two groups
// of blocked panels with a tail (more than eight steps, 17 panels, 3 more rows); several column
// blocks and no tail.
constexpr Shape shapes[] = {{1, 32}, {3, 96}, {4, 512}, {7, 544}, {9, 1056}, {71, 4640}, {5, 8192}};

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

}  // namespace gguf_transcode_test

using namespace gguf_transcode_test;
using moekit::test::require_error;

TEST_CASE("gguf_transcode: Q4_0 and Q8_0 are the exact ones, by DType and by ggml number",
          "[io][gguf_transcode]") {
  CHECK(exact_moekit_precision(DType::q4_0) == Precision::q4);
  CHECK(exact_moekit_precision(DType::q8_0) == Precision::q8);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q4_k, DType::q2_k})
    CHECK_FALSE(exact_moekit_precision(t));
  CHECK(exact_moekit_precision(ggml_type::q4_0) == Precision::q4);
  CHECK(exact_moekit_precision(ggml_type::q8_0) == Precision::q8);
  // Q4_1, Q5_0, Q8_1, Q4_K, IQ4_NL (same block size as Q4_0, non-linear codes), F16, BF16
  for (std::uint32_t t : {3u, 6u, 9u, 12u, 20u, 1u, 30u}) CHECK_FALSE(exact_moekit_precision(t));
  static_assert(exact_moekit_precision(DType::q4_0) == Precision::q4);
  CHECK(gguf_exact_scheme == QuantScheme{32, false});
}

TEST_CASE("gguf_transcode: Q4_0 rows are transcoded as defined for every byte pair",
          "[io][gguf_transcode]") {
  // Each output byte depends on one pair of input bytes (the SSE2 shuffle where the build has it,
  // the byte loop elsewhere): every pair value, in every pair position, one block each.
  const std::size_t blocks = 8 * 65536, bb = block_bytes(DType::q4_0), cols = 32 * blocks;
  Bytes src(blocks * bb);
  for (std::size_t b = 0; b < blocks; ++b) {
    const auto pos = static_cast<unsigned>(b / 65536), v = static_cast<unsigned>(b % 65536);
    std::byte* qs = src.data() + b * bb + 2;
    src[b * bb] = std::byte{0x00};
    src[b * bb + 1] = std::byte{0x3c};  // scale 1.0 (f16)
    for (unsigned i = 0; i < 16; ++i) qs[i] = static_cast<std::byte>(i * 37 + pos);
    qs[2 * pos] = static_cast<std::byte>(v & 0xFF);
    qs[2 * pos + 1] = static_cast<std::byte>(v >> 8);
  }
  Bytes got(src.size());
  transcode_row(DType::q4_0, cols, src, got);
  const Bytes want = encode_by_weight(DType::q4_0, src, 1, cols);
  REQUIRE(got.size() == want.size());
  const auto at = std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin();
  if (at != static_cast<std::ptrdiff_t>(got.size())) FAIL("first difference at byte " << at);
}

TEST_CASE(
    "gguf_transcode: rows are GGUF's codes and scales, and decode to GGUF's values bit for "
    "bit",
    "[io][gguf_transcode]") {
  INFO("seed " << test::test_seed());
  for (DType t : {DType::q4_0, DType::q8_0})
    for (const Shape& s : shapes) {
      INFO(name(t) << " " << s.rows << "x" << s.cols);
      const Bytes src = random_blocks(t, s.rows, s.cols, s.cols + s.rows);
      Bytes dst(src.size(), std::byte{0x5A});
      const MatrixView v = transcode_matrix(t, src, s.rows, s.cols, dst);
      CHECK(v.data == dst.data());
      CHECK(v.precision == *exact_moekit_precision(t));
      CHECK(v.scheme == gguf_exact_scheme);
      CHECK(v.order == MatrixOrder::rows);
      CHECK(v.bytes() == src.size());
      REQUIRE(dst == encode_by_weight(t, src, s.rows, s.cols));
      REQUIRE_SAME_BITS(decode_matrix(v), dequantize(gguf_view(src, t, s.rows, s.cols)));
      // Row by row gives the same bytes.
      const std::size_t stride = v.row_stride();
      Bytes by_row(src.size());
      for (std::size_t r = 0; r < s.rows; ++r)
        transcode_row(t, s.cols, std::span(src).subspan(r * stride, stride),
                      std::span(by_row).subspan(r * stride, stride));
      REQUIRE(by_row == dst);
    }
}

TEST_CASE("gguf_transcode: panels equal pack_panels of the rows; in place equals out of place",
          "[io][gguf_transcode]") {
  INFO("seed " << test::test_seed());
  for (DType t : {DType::q4_0, DType::q8_0})
    for (const Shape& s : shapes) {
      const Bytes src = random_blocks(t, s.rows, s.cols, 7 * s.cols + s.rows);
      Bytes rows(src.size());
      const MatrixView rv = transcode_matrix(t, src, s.rows, s.cols, rows);
      const auto values = decode_matrix(rv);
      for (MatrixOrder o : all_orders) {
        INFO(name(t) << " " << s.rows << "x" << s.cols << " " << name(o));
        Bytes want = rows;
        if (in_panels(o)) pack_panels(rv, want, o);
        Bytes direct(src.size());
        const MatrixView dv = transcode_matrix(t, src, s.rows, s.cols, direct, o);
        CHECK(dv.order == o);
        REQUIRE(direct == want);
        Bytes in_place = src;
        const MatrixView iv = transcode_in_place(t, in_place, s.rows, s.cols, o);
        CHECK(iv.data == in_place.data());
        REQUIRE(in_place == want);
        REQUIRE_SAME_BITS(decode_matrix(dv), values);
      }
    }
}

#if defined(MOEKIT_GGUF_BLOCKS_X86)
// One vector path's blocks against the one-block loop: every block count from 0 to 13 (whole
// vectors and each tail), destinations aligned for streaming and off by 16 bytes, streamed or
// not, and in place (codes over the source, the scales elsewhere as transcode_row puts them).
template <class Path>
void check_block_path(DType t, Path path) {
  const std::size_t bb = block_bytes(t), cb = bb - 2;
  for (std::size_t blocks = 0; blocks <= 13; ++blocks)
    for (std::size_t offset : {std::size_t{0}, std::size_t{16}})
      for (bool stream : {false, true}) {
        INFO(name(t) << ": " << blocks << " blocks, codes at +" << offset
                     << (stream ? ", streamed" : ""));
        const Bytes src = random_blocks(t, 1, 32 * std::max<std::size_t>(blocks, 1), blocks);
        if (blocks == 0) {
          CHECK(path(src.data(), 0, nullptr, nullptr, stream) == 0);
          continue;
        }
        const Bytes want = encode_by_weight(t, src, 1, 32 * blocks);  // codes, then scales
        AlignedBuffer out(blocks * bb + offset);                      // 4096-aligned
        std::byte* codes = out.data() + offset;
        Bytes scales(2 * blocks, std::byte{0x5A});
        const std::size_t done = path(src.data(), blocks, codes, scales.data(), stream);
        io::detail::transcode_blocks(t, src.data() + done * bb, blocks - done, codes + done * cb,
                                     scales.data() + 2 * done);
        io::detail::stream_fence();
        CHECK(std::equal(codes, codes + blocks * cb, want.begin()));
        CHECK(std::equal(scales.begin(), scales.end(), want.begin() + blocks * cb));
        // In place: the codes over the blocks themselves.
        Bytes same = src;
        same.resize(blocks * bb);
        const std::size_t d2 = path(same.data(), blocks, same.data(), scales.data(), false);
        CHECK(d2 == done);
        CHECK(std::equal(same.begin(), same.begin() + static_cast<std::ptrdiff_t>(d2 * cb),
                         want.begin()));
      }
}

TEST_CASE("gguf_transcode: the AVX-512 and AVX2 block paths equal the one-block loop",
          "[io][gguf_transcode]") {
  INFO("seed " << test::test_seed());
  if (isa_supported(Isa::avx512)) {
    check_block_path(DType::q4_0, io::detail::q4_0_blocks_avx512);
    check_block_path(DType::q8_0, io::detail::q8_0_blocks_avx512);
  }
  if (isa_supported(Isa::avx2)) {
    check_block_path(DType::q4_0, io::detail::q4_0_blocks_avx2);
    check_block_path(DType::q8_0, io::detail::q8_0_blocks_avx2);
  }
  if (!isa_supported(Isa::avx2)) WARN("skipped: this CPU has neither AVX2 nor AVX-512");
}
#endif

TEST_CASE("gguf_transcode: single rows in place, short and longer than the stack buffer",
          "[io][gguf_transcode]") {
  INFO("seed " << test::test_seed());
  for (DType t : {DType::q4_0, DType::q8_0})
    for (std::size_t cols : {32u, 4096u, 32u * 1024u, 32u * 1025u, 32u * 3000u}) {
      INFO(name(t) << " cols " << cols);
      const Bytes src = random_blocks(t, 1, cols, cols);
      Bytes out(src.size()), in_place = src;
      transcode_row(t, cols, src, out);
      transcode_row(t, cols, in_place, in_place);
      REQUIRE(in_place == out);
      REQUIRE(out == encode_by_weight(t, src, 1, cols));
    }
}

TEST_CASE("gguf_transcode: GEMV on transcoded matrices matches float64 on GGUF's values",
          "[io][gguf_transcode]") {
  INFO("seed " << test::test_seed());
  // As tests/precision/kernels_test.cpp: float accumulation stays far below this fraction of the
  // sum of the magnitudes the kernel adds; one wrong code or scale moves the result by a term.
  constexpr double rel_tol = 1.0 / 65536;
  for (DType t : {DType::q4_0, DType::q8_0})
    for (const Shape& s : {Shape{37, 544}, Shape{71, 4640}}) {
      const Bytes src = random_blocks(t, s.rows, s.cols, 11 * s.cols);
      const auto w = dequantize(gguf_view(src, t, s.rows, s.cols));
      const auto x = test::random_normal(s.cols, s.cols + 3);
      Bytes rows(src.size()), panels(src.size());
      const MatrixView rv = transcode_matrix(t, src, s.rows, s.cols, rows);
      const MatrixView pv =
          transcode_matrix(t, src, s.rows, s.cols, panels, MatrixOrder::blocked_panels4);
      for (Isa isa : isas()) {
        INFO(name(t) << " " << s.rows << "x" << s.cols << " " << name(isa));
        std::vector<float> y(s.rows, 99.f), yp(s.rows, 99.f);
        gemv(rv, x, y, {isa, nullptr});
        gemv(pv, x, yp, {isa, nullptr});
        REQUIRE(yp == y);  // panels compute each row as the rows do
        for (std::size_t r = 0; r < s.rows; ++r) {
          double want = 0;
          for (std::size_t c = 0; c < s.cols; ++c)
            want += static_cast<double>(w[r * s.cols + c]) * x[c];
          const double tol = rel_tol * test::dot_magnitude(rv, r, x.data()) + 1e-6;
          if (std::fabs(y[r] - want) > tol)
            FAIL("row " << r << ": " << y[r] << " want " << want << " tol " << tol);
        }
      }
      // The int8-activation kernels (what panels are packed for) read the panels as they lie.
      KernelOptions o;
      o.int8_activations = true;
      std::vector<float> y8(s.rows), yp8(s.rows);
      gemv(rv, x, y8, o);
      gemv(pv, x, yp8, o);
      INFO(name(t) << " " << s.rows << "x" << s.cols << " int8 activations");
      REQUIRE(yp8 == y8);
      for (std::size_t r = 0; r < s.rows; ++r) {
        // Each activation moves by at most half its 32-block's int8 step.
        double bound = 0, want = 0;
        for (std::size_t c = 0; c < s.cols; ++c) {
          float amax = 0;
          for (std::size_t i = c / 32 * 32; i < c / 32 * 32 + 32; ++i)
            amax = std::max(amax, std::fabs(x[i]));
          bound += std::fabs(w[r * s.cols + c]) * amax / 254.0;
          want += static_cast<double>(w[r * s.cols + c]) * x[c];
        }
        bound = bound * 1.01 + rel_tol * test::dot_magnitude(rv, r, x.data()) + 1e-6;
        if (std::fabs(y8[r] - want) > bound)
          FAIL("row " << r << ": " << y8[r] << " want " << want << " bound " << bound);
      }
    }
}

TEST_CASE("gguf_transcode: values equal gguf-py's dequantization bit for bit (committed fixture)",
          "[io][gguf_transcode]") {
  GgufFile f(MOEKIT_SOURCE_DIR "/tests/io/data/gguf_transcode.gguf");
  for (const char* tensor : {"q4_0", "q8_0"}) {
    const TensorView q = f.tensor(tensor);
    const auto want = dequantize(f.tensor(std::string(tensor) + ".expected"));
    REQUIRE(exact_moekit_precision(f.info(tensor)->ggml_type) == exact_moekit_precision(q.dtype));
    REQUIRE_SAME_BITS(dequantize(q), want);  // io/dequantize.hpp agrees with gguf-py exactly
    for (MatrixOrder o : all_orders) {
      INFO(tensor << " " << name(o));
      Bytes dst(q.bytes.size());
      const MatrixView v = transcode(q, dst, o);
      CHECK(v.rows == q.rows());
      CHECK(v.cols == q.cols());
      REQUIRE_SAME_BITS(decode_matrix(v), want);
    }
  }
}

TEST_CASE("gguf_transcode: stacked expert tensors convert whole in rows, one expert in panels",
          "[io][gguf_transcode]") {
  INFO("seed " << test::test_seed());
  const std::size_t experts = 3, rows = 6, cols = 64;
  const Bytes src = random_blocks(DType::q4_0, experts * rows, cols, 99);
  TensorView stack = gguf_view(src, DType::q4_0, rows, cols, "blk.0.ffn_up_exps.weight");
  stack.rank = 3;
  stack.dims = {experts, rows, cols, 0};
  Bytes all(src.size());
  const MatrixView av = transcode(stack, all);
  CHECK(av.rows == experts * rows);
  const std::size_t per = src.size() / experts;
  for (std::size_t e = 0; e < experts; ++e) {
    const TensorView one = slice_outer(stack, e);
    Bytes rows_e(per), panels_e(per);
    const MatrixView rv = transcode(one, rows_e);
    REQUIRE(rows_e == Bytes(all.begin() + e * per, all.begin() + (e + 1) * per));
    transcode(one, panels_e, MatrixOrder::panels4);
    Bytes want(per);
    pack_panels(rv, want, MatrixOrder::panels4);
    REQUIRE(panels_e == want);
  }
  Bytes dst(src.size());
  require_error([&] { transcode(stack, dst, MatrixOrder::panels4); }, ErrorKind::invalid_argument,
                {"blk.0.ffn_up_exps.weight", "rank 3", "slice_outer"});
}

TEST_CASE("gguf_transcode: wrong types, shapes, sizes and overlaps are refused by name",
          "[io][gguf_transcode]") {
  const Bytes src = random_blocks(DType::q8_0, 4, 64, 5);
  Bytes dst(src.size());
  const std::string w = "expert 3 w1";
  require_error([&] { transcode_matrix(DType::q4_k, src, 4, 64, dst, MatrixOrder::rows, w); },
                ErrorKind::unsupported, {w, "Q4_K", "no exact moekit format"});
  require_error([&] { transcode_matrix(DType::f16, src, 4, 64, dst, MatrixOrder::rows, w); },
                ErrorKind::unsupported, {w, "F16"});
  require_error([&] { transcode_matrix(DType::q8_0, src, 4, 48, dst, MatrixOrder::rows, w); },
                ErrorKind::invalid_argument, {w, "4x48", "32-weight blocks"});
  require_error([&] { transcode_matrix(DType::q8_0, src, 0, 64, dst, MatrixOrder::rows, w); },
                ErrorKind::invalid_argument, {w, "0x64"});
  // Q4_0 of the same shape takes fewer bytes: the source size no longer matches.
  require_error([&] { transcode_matrix(DType::q4_0, src, 4, 64, dst, MatrixOrder::rows, w); },
                ErrorKind::invalid_argument,
                {w, "source has " + std::to_string(src.size()), "4x64 Q4_0 matrix needs 144"});
  Bytes small(src.size() - 2);
  require_error([&] { transcode_matrix(DType::q8_0, src, 4, 64, small, MatrixOrder::rows, w); },
                ErrorKind::invalid_argument,
                {w, "destination has " + std::to_string(small.size())});
  // volatile: a constant would let the compiler warn about the loop the check never reaches.
  volatile std::size_t huge = std::numeric_limits<std::size_t>::max() / 16;
  require_error([&] { transcode_matrix(DType::q8_0, src, huge, 64, dst, MatrixOrder::rows, w); },
                ErrorKind::invalid_argument, {w, "more than SIZE_MAX"});
  // Overlapping but not the same bytes: neither in place nor apart.
  Bytes buf(src.size() + 34);
  std::memcpy(buf.data(), src.data(), src.size());
  const std::span<const std::byte> from(buf.data(), src.size());
  const std::span<std::byte> to(buf.data() + 34, src.size());
  require_error([&] { transcode_matrix(DType::q8_0, from, 4, 64, to, MatrixOrder::panels4, w); },
                ErrorKind::invalid_argument, {w, "overlap"});
  require_error([&] { transcode_row(DType::q8_0, 64, from.first(68), to.first(68), "row 2"); },
                ErrorKind::invalid_argument, {"row 2", "overlap"});
  require_error([&] { transcode_row(DType::q8_0, 96, src, dst, "row 2"); },
                ErrorKind::invalid_argument, {"row 2", "1x96 Q8_0 matrix needs 102"});
  // A tensor whose bytes do not match its shape is a broken file, named by tensor and file.
  TensorView broken = gguf_view(src, DType::q8_0, 4, 64, "blk.7.ffn_down_exps.weight");
  broken.bytes = broken.bytes.first(src.size() - 34);
  require_error([&] { transcode(broken, dst); }, ErrorKind::invalid_format,
                {"blk.7.ffn_down_exps.weight", "memory", "does not match"});
  TensorView k_quant = gguf_view(src, DType::q4_k, 4, 64, "blk.7.ffn_gate_exps.weight");
  require_error([&] { transcode(k_quant, dst); }, ErrorKind::unsupported,
                {"blk.7.ffn_gate_exps.weight", "Q4_K"});
}
