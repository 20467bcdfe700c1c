// cuda::expert_ffn on the device against the float64 reference FFN on the same bytes: every format
// × activation type on Mixtral's expert shape and on odd shapes (byte-wise fallback). The up/gate
// result h (the kernel's workspace) and the output are checked against bounds derived from the
// GEMV bound (device_support.hpp rel_tol) propagated through SiLU and w2.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <vector>

#include "gpu/device_support.hpp"
#include "precision/test_support.hpp"

using namespace moekit;
using namespace moekit::gpu_test;

namespace {

double silu(double a) { return a / (1.0 + std::exp(-a)); }

struct FfnShape {
  std::size_t hidden, ffn;
  const char* what;
};
// Mixtral-8x7B (4096 → 14336 → 4096); 203 → 77: odd strides everywhere (byte-wise loads, tails);
// 1024 → 520: w1/w3 rows take the 128-bit path, w2's 520 columns a tail after the last chunk.
constexpr FfnShape ffn_shapes[] = {
    {4096, 14336, "Mixtral"}, {203, 77, "203->77"}, {1024, 520, "1024->520"}};

/// The float weights of one expert (generated once per shape, encoded per format).
struct ExpertFloats {
  std::vector<float> w1, w3, w2;
};
ExpertFloats random_expert(const FfnShape& sh) {
  const auto salt = sh.hidden * 7 + sh.ffn;
  return {test::random_normal(sh.ffn * sh.hidden, salt + 1, 0.05f),
          test::random_normal(sh.ffn * sh.hidden, salt + 3, 0.05f),
          test::random_normal(sh.hidden * sh.ffn, salt + 2, 0.05f)};
}

struct HostExpert {
  std::vector<std::byte> w1, w3, w2;
  MatrixView v1, v3, v2;
};

HostExpert encode_expert(const FfnShape& sh, const ExpertFloats& f, Precision p, QuantScheme s) {
  HostExpert e;
  e.w1 = encode_parallel(f.w1, sh.ffn, sh.hidden, p, s);
  e.w3 = encode_parallel(f.w3, sh.ffn, sh.hidden, p, s);
  e.w2 = encode_parallel(f.w2, sh.hidden, sh.ffn, p, s);
  e.v1 = make_matrix_view(e.w1, sh.ffn, sh.hidden, p, s);
  e.v3 = make_matrix_view(e.w3, sh.ffn, sh.hidden, p, s);
  e.v2 = make_matrix_view(e.w2, sh.hidden, sh.ffn, p, s);
  return e;
}

/// Reference h = silu(w1·x)·(w3·x) and its bound per row: the GEMV bounds ε1, ε3 of g and u,
/// through |silu'| <= 1.1, plus the device's SiLU (__expf: (2 + 1.16|g|) ulp, then a division and a
/// product: a few more ulp of |h|).
struct UpGateReference {
  std::vector<float> h;
  std::vector<double> bound;
};
UpGateReference up_gate_reference(const HostExpert& e, const std::vector<float>& x) {
  const RowReference g = reference_rows(e.v1, x.data()), u = reference_rows(e.v3, x.data());
  UpGateReference ref{std::vector<float>(g.dot.size()), std::vector<double>(g.dot.size())};
  for (std::size_t j = 0; j < g.dot.size(); ++j) {
    const double h = silu(g.dot[j]) * u.dot[j];
    const double e1 = rel_tol * g.magnitude[j] + 1e-6, e3 = rel_tol * u.magnitude[j] + 1e-6;
    ref.h[j] = static_cast<float>(h);
    ref.bound[j] = 1.1 * e1 * (std::fabs(u.dot[j]) + e3) +
                   (std::fabs(silu(g.dot[j])) + 1.1 * e1) * e3 +
                   std::fabs(h) * (6 + 1.2 * std::fabs(g.dot[j])) * 0x1p-23;
  }
  return ref;
}

template <class T>
std::string first_outside(const std::vector<float>& got, const std::vector<T>& want,
                          const std::vector<double>& tol) {
  std::ostringstream bad;
  std::size_t n_bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - static_cast<double>(want[i])) <= tol[i]) && n_bad++ < 3)
      bad << " [" << i << "] " << got[i] << " want " << want[i] << " tol " << tol[i] << ";";
  if (n_bad) bad << " (" << n_bad << " outside)";
  return bad.str();
}

void check_ffn(const FfnShape& sh, const HostExpert& e, std::size_t offset) {
  const Precision p = e.v1.precision;
  const QuantScheme s = e.v1.scheme;
  const auto x = exact_activations(test::random_normal(sh.hidden, sh.hidden + 5));
  const UpGateReference h = up_gate_reference(e, x);
  // out = 1 + scale·w2·h: the reference h in float (2^-24 relative, inside rel_tol's margin) and
  // the device's error in h propagated through |w2|.
  const RowReference o = reference_rows(e.v2, h.h.data(), h.bound.data());
  const float scale = 0.75f;
  std::vector<double> want(sh.hidden), tol(sh.hidden);
  for (std::size_t i = 0; i < sh.hidden; ++i) {
    want[i] = 1.0 + scale * o.dot[i];
    tol[i] = scale * (o.propagated[i] + rel_tol * o.magnitude[i] + 1e-6) +
             0x1p-23 * std::fabs(want[i]) + 1e-6;
  }
  const DeviceMatrix w1(e.w1, e.v1, offset), w3(e.w3, e.v3, offset), w2(e.w2, e.v2, offset);
  for (cuda::ActivationType act : all_activations) {
    INFO(sh.what << " " << format_name(p, s) << " " << name(act) << " at byte offset " << offset);
    const auto xb = activation_bytes(x, act);
    DeviceBytes dx(xb.size() + offset), dh(sh.ffn * 4), dout(sh.hidden * 4);
    dx.upload(xb, offset);
    dout.upload(std::vector<float>(sh.hidden, 1.f));
    cuda::expert_ffn(w1.view, w3.view, w2.view, dx.data(offset), act,
                     reinterpret_cast<float*>(dh.data()), reinterpret_cast<float*>(dout.data()),
                     scale, nullptr);
    check_cuda(cudaDeviceSynchronize(), "expert_ffn");
    CHECK(first_outside(dh.download<float>(sh.ffn), h.h, h.bound) == "");
    CHECK(first_outside(dout.download<float>(sh.hidden), want, tol) == "");
  }
}

}  // namespace

TEST_CASE("cuda::expert_ffn matches the float64 reference FFN on every format and activation type",
          "[gpu][expert_ffn]") {
  INFO("seed " << test::test_seed());
  for (const FfnShape& sh : ffn_shapes) {
    const ExpertFloats f = random_expert(sh);
    for (auto [p, s] : all_formats()) {
      const HostExpert e = encode_expert(sh, f, p, s);
      for (std::size_t offset : {0u, 4u}) {
        if (sh.hidden == 4096 && offset != 0 && s.group_size != 64)
          continue;  // fallback: small shapes + one format
        check_ffn(sh, e, offset);
      }
    }
  }
}

TEST_CASE("cuda::expert_ffn refuses w1 and w3 of different formats", "[gpu][expert_ffn]") {
  const auto a =
      encode_parallel(std::vector<float>(64 * 32, 0.1f), 64, 32, Precision::q8, {32, false});
  const auto b =
      encode_parallel(std::vector<float>(64 * 32, 0.1f), 64, 32, Precision::q4, {32, false});
  const auto c =
      encode_parallel(std::vector<float>(32 * 64, 0.1f), 32, 64, Precision::q8, {32, false});
  const MatrixView w1 = make_matrix_view(a, 64, 32, Precision::q8, {32, false});
  const MatrixView w3 = make_matrix_view(b, 64, 32, Precision::q4, {32, false});
  const MatrixView w2 = make_matrix_view(c, 32, 64, Precision::q8, {32, false});
  DeviceBytes buf(1024);
  CHECK_THROWS_WITH(cuda::expert_ffn(w1, w3, w2, buf.data(), cuda::ActivationType::f32,
                                     reinterpret_cast<float*>(buf.data()),
                                     reinterpret_cast<float*>(buf.data()), 1.f, nullptr),
                    Catch::Contains("same shape and format"));
}
