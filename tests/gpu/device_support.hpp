#pragma once
// Shared helpers of the device tests: the device check behind the skip, device buffers, and the
// host references (float64, on the same bytes the device reads) computed on every core so that
// the Mixtral shapes stay inside gpu-check.sh's budget.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "moekit/precision/format.hpp"
#include "moekit/precision/half.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit_cuda.hpp"

namespace moekit::gpu_test {

/// Exit status of a run without a device; ctest's SKIP_RETURN_CODE.
inline constexpr int skip_status = 77;

/// Why the device tests cannot run here, or nothing when a CUDA device is usable.
inline std::optional<std::string> no_device_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return "no CUDA device (cudaGetDeviceCount: " + std::string(cudaGetErrorName(e)) + ": " +
           cudaGetErrorString(e) + ")";
  if (count == 0) return std::string("no CUDA device (cudaGetDeviceCount found 0 devices)");
  return std::nullopt;
}

/// "device 0: NVIDIA H100 (sm_90, 132 SMs, 80 GiB)".
inline std::string device_description() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return "device: properties unavailable";
  return "device " + std::to_string(dev) + ": " + p.name + " (sm_" + std::to_string(p.major) +
         std::to_string(p.minor) + ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB)";
}

inline void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                             ")");
}

/// cudaMalloc'ed bytes (256-byte aligned), freed on destruction.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t n) : n_(n) {
    check_cuda(cudaMalloc(&p_, std::max<std::size_t>(n, 1)), "cudaMalloc");
  }
  ~DeviceBytes() { (void)cudaFree(p_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  [[nodiscard]] std::byte* data(std::size_t offset = 0) const {
    return static_cast<std::byte*>(p_) + offset;
  }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// Copies `src` to bytes [offset, offset + src.size()).
  void upload(std::span<const std::byte> src, std::size_t offset = 0) {
    if (offset + src.size() > n_) throw std::runtime_error("DeviceBytes::upload past the end");
    check_cuda(cudaMemcpy(data(offset), src.data(), src.size(), cudaMemcpyHostToDevice), "upload");
  }
  template <class T>
  void upload(const std::vector<T>& v, std::size_t offset = 0) {
    upload(std::as_bytes(std::span<const T>(v)), offset);
  }
  /// `count` values of T from byte `offset`.
  template <class T>
  [[nodiscard]] std::vector<T> download(std::size_t count, std::size_t offset = 0) const {
    std::vector<T> out(count);
    check_cuda(cudaMemcpy(out.data(), data(offset), count * sizeof(T), cudaMemcpyDeviceToHost),
               "download");
    return out;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Runs f(begin, end) over [0, n) split across the host's cores.
template <class F>
void parallel_for(std::size_t n, F&& f) {
  const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (std::size_t b = 0; b < n; b += chunk)
    pool.emplace_back([&f, b, e = std::min(n, b + chunk)] { f(b, e); });
  for (auto& t : pool) t.join();
}

/// Row-major rows × cols matrix encoded in (p, s), rows encoded in parallel.
inline std::vector<std::byte> encode_parallel(const std::vector<float>& w, std::size_t rows,
                                              std::size_t cols, Precision p, QuantScheme s) {
  const std::size_t stride = row_bytes(cols, p, s);
  std::vector<std::byte> out(rows * stride);
  parallel_for(rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r)
      encode_row(std::span<const float>(w.data() + r * cols, cols), p, s,
                 std::span<std::byte>(out.data() + r * stride, stride), r);
  });
  return out;
}

/// Activations that f32, f16 and bf16 all hold exactly (bf16-rounded normals, none below f16's
/// normal range), so one float64 reference serves every activation type.
inline std::vector<float> exact_activations(const std::vector<float>& normal) {
  std::vector<float> x(normal.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = bf16_bits_to_float(float_to_bf16_bits(normal[i]));
    x[i] = std::fabs(v) < 0x1p-14f ? 0.f : v;
  }
  return x;
}

/// The activation vector as the kernel's element type, as bytes.
inline std::vector<std::byte> activation_bytes(const std::vector<float>& x,
                                               cuda::ActivationType t) {
  std::vector<std::byte> out(x.size() * (t == cuda::ActivationType::f32 ? 4 : 2));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (t == cuda::ActivationType::f32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t b =
          t == cuda::ActivationType::f16 ? float_to_half_bits(x[i]) : float_to_bf16_bits(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

inline const char* name(cuda::ActivationType t) {
  return t == cuda::ActivationType::f16 ? "f16" : t == cuda::ActivationType::bf16 ? "bf16" : "f32";
}
inline constexpr cuda::ActivationType all_activations[] = {
    cuda::ActivationType::f16, cuda::ActivationType::bf16, cuda::ActivationType::f32};

/// The formats of the device tests: q8/q4/q2 × group schemes (32 symmetric, 64 affine, 128
/// symmetric) and channel schemes (one group per row, symmetric and affine).
inline std::vector<std::pair<Precision, QuantScheme>> all_formats() {
  std::vector<std::pair<Precision, QuantScheme>> v;
  for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
    for (QuantScheme s : {QuantScheme{32, false}, QuantScheme{64, true}, QuantScheme{128, false},
                          QuantScheme{0, false}, QuantScheme{0, true}})
      v.emplace_back(p, s);
  return v;
}
inline std::string format_name(Precision p, QuantScheme s) {
  return std::string(name(p)) +
         (s.group_size ? " g" + std::to_string(s.group_size) : std::string(" channel")) +
         (s.zero_point ? " affine" : " symmetric");
}

/// Tolerance relative to the magnitude sum, as tests/precision/kernels_test.cpp: fp32 accumulation
/// of a few thousand terms in blocks (the warp's lanes, then the butterfly) stays far below 2^-16
/// of Σ|terms|, while a wrong code, scale or order moves the result by about one term (~1/cols).
inline constexpr double rel_tol = 1.0 / 65536;

/// Per row of W: the float64 reference W_r·x, the magnitude sum the tolerance scales with
/// (tests/precision/test_support.hpp dot_magnitude), and, given per-column input errors `e`,
/// Σ_c |W_rc|·e_c (how errors of x propagate through the row).
struct RowReference {
  std::vector<double> dot, magnitude, propagated;
};
inline RowReference reference_rows(const MatrixView& w, const float* x, const double* e = nullptr) {
  RowReference ref{std::vector<double>(w.rows), std::vector<double>(w.rows),
                   std::vector<double>(w.rows)};
  const RowLayout l = w.layout();
  parallel_for(w.rows, [&](std::size_t b, std::size_t end) {
    for (std::size_t r = b; r < end; ++r) {
      const std::byte* row = w.row(r);
      double dot = 0, mag = 0, prop = 0;
      for (std::size_t c = 0; c < w.cols; ++c) {
        const std::size_t g = c / l.group_size;
        const float s = group_scale(row, l, g), z = group_zero(row, l, g);
        const unsigned q = read_code(row, c, l.bits);
        const double wv = weight_at(row, l, w.precision, c);
        dot += wv * x[c];
        mag += std::fabs(s) * (q + std::fabs(z)) * std::fabs(x[c]);
        if (e) prop += std::fabs(wv) * e[c];
      }
      ref.dot[r] = dot;
      ref.magnitude[r] = mag;
      ref.propagated[r] = prop;
    }
  });
  return ref;
}

/// A matrix on the device at byte `offset` of its allocation (offset 0: 256-byte aligned, the
/// 128-bit path when the row stride is a multiple of 16; offset 4: the byte-wise fallback).
struct DeviceMatrix {
  DeviceBytes bytes;
  MatrixView view;
  DeviceMatrix(std::span<const std::byte> host, const MatrixView& v, std::size_t offset)
      : bytes(host.size() + offset), view(v) {
    bytes.upload(host, offset);
    view.data = bytes.data(offset);
  }
};

}  // namespace moekit::gpu_test
