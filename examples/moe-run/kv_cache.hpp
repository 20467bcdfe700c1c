#pragma once
/// \file KvCache: keys and values of every decoder layer for the positions of one sequence.
///
/// Fixed capacity chosen at construction (the context length), so generation never reallocates.
/// All positions are kept even on sliding-window layers (the window is applied by attention);
/// `truncate` rolls the sequence back (a token policy's fallback recomputes the last token).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/error.hpp"

namespace moe_run {

/// Keys and values, per layer [position × kv_dim] (RoPE already applied to the keys).
class KvCache {
 public:
  KvCache(std::uint32_t n_layers, std::uint32_t kv_dim, std::uint32_t capacity)
      : kv_dim_(kv_dim), capacity_(capacity), k_(n_layers), v_(n_layers) {
    MOEKIT_EXPECTS(capacity > 0, "KvCache: the context length must be > 0");
    for (auto& k : k_) k.assign(std::size_t{capacity} * kv_dim, 0.f);
    for (auto& v : v_) v.assign(std::size_t{capacity} * kv_dim, 0.f);
  }

  /// Positions filled so far (the next token's position).
  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint32_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint32_t kv_dim() const noexcept { return kv_dim_; }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return 2 * k_.size() * std::size_t{capacity_} * kv_dim_ * sizeof(float);
  }

  /// Throws unless `n` more positions fit.
  void check_room(std::uint32_t n) const {
    if (std::size_t{size_} + n > capacity_)
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "context full: " + std::to_string(size_) + " + " + std::to_string(n) +
                               " tokens exceed the context length " + std::to_string(capacity_));
  }
  float* keys(std::uint32_t layer, std::uint32_t pos) noexcept {
    return k_[layer].data() + std::size_t{pos} * kv_dim_;
  }
  float* values(std::uint32_t layer, std::uint32_t pos) noexcept {
    return v_[layer].data() + std::size_t{pos} * kv_dim_;
  }
  const float* keys(std::uint32_t layer, std::uint32_t pos) const noexcept {
    return k_[layer].data() + std::size_t{pos} * kv_dim_;
  }
  const float* values(std::uint32_t layer, std::uint32_t pos) const noexcept {
    return v_[layer].data() + std::size_t{pos} * kv_dim_;
  }

  /// The positions [size, size + n) have been written by every layer.
  void advance(std::uint32_t n) noexcept { size_ += n; }
  /// Forgets every position from `n` on.
  void truncate(std::uint32_t n) noexcept { size_ = n < size_ ? n : size_; }
  void clear() noexcept { size_ = 0; }

 private:
  std::uint32_t kv_dim_;
  std::uint32_t capacity_;
  std::uint32_t size_ = 0;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace moe_run
