#pragma once
/// \file KvCache: keys and values of every decoder layer for the positions of one sequence.
///
/// Fixed capacity chosen at construction (the context length), so generation never reallocates.
/// A sliding-window layer (window W) keeps only its last W positions, in a ring buffer of W
/// slots (position p in slot p mod W): that is all a query there can see (positions > p − W),
/// so the cache of a windowed model stays W positions long however long the sequence grows.
/// Attention reads the keys of the tokens of its own forward from its scratch and only older
/// ones from here, so a forward of more than W tokens needs no extra slots.
/// `truncate` rolls the sequence back (a token policy's fallback recomputes the last token); a
/// ring that has wrapped can roll back one position, not more (older ones are overwritten).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"

namespace moekit::engine {

/// Keys and values, per layer [slot × kv_dim] (RoPE already applied to the keys).
class KvCache {
 public:
  /// `window[l]` > 0 makes layer l a ring of min(window, capacity) slots; empty = no window.
  KvCache(std::uint32_t n_layers, std::uint32_t kv_dim, std::uint32_t capacity,
          std::span<const std::uint32_t> window = {})
      : kv_dim_(kv_dim),
        capacity_(capacity),
        slots_(n_layers, capacity),
        k_(n_layers),
        v_(n_layers) {
    MOEKIT_EXPECTS(capacity > 0, "KvCache: the context length must be > 0");
    MOEKIT_EXPECTS(window.empty() || window.size() == n_layers,
                   "KvCache: one window per layer (or none)");
    for (std::uint32_t l = 0; l < n_layers; ++l) {
      if (!window.empty() && window[l] > 0) slots_[l] = std::min(window[l], capacity);
      k_[l].assign(std::size_t{slots_[l]} * kv_dim, 0.f);
      v_[l].assign(std::size_t{slots_[l]} * kv_dim, 0.f);
    }
  }

  /// Positions filled so far (the next token's position).
  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint32_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint32_t kv_dim() const noexcept { return kv_dim_; }
  /// Positions layer `layer` retains (the context length, or its window).
  [[nodiscard]] std::uint32_t slots(std::uint32_t layer) const noexcept { return slots_[layer]; }
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& k : k_) n += 2 * k.size() * sizeof(float);
    return n;
  }

  /// Throws unless `n` more positions fit.
  void check_room(std::uint32_t n) const {
    if (std::size_t{size_} + n > capacity_)
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "context full: " + std::to_string(size_) + " + " + std::to_string(n) +
                               " tokens exceed the context length " + std::to_string(capacity_));
  }
  /// Key / value of `pos` at `layer`; `pos` must be one of the layer's last `slots` positions.
  float* keys(std::uint32_t layer, std::uint32_t pos) noexcept {
    return k_[layer].data() + slot(layer, pos);
  }
  float* values(std::uint32_t layer, std::uint32_t pos) noexcept {
    return v_[layer].data() + slot(layer, pos);
  }
  const float* keys(std::uint32_t layer, std::uint32_t pos) const noexcept {
    return k_[layer].data() + slot(layer, pos);
  }
  const float* values(std::uint32_t layer, std::uint32_t pos) const noexcept {
    return v_[layer].data() + slot(layer, pos);
  }

  /// The positions [size, size + n) have been written by every layer.
  void advance(std::uint32_t n) noexcept { size_ += n; }
  /// Forgets every position from `n` on. Throws when a wrapped ring would need positions it has
  /// overwritten (a roll-back of more than one position once a window is full).
  void truncate(std::uint32_t n) {
    if (n >= size_) return;
    for (std::uint32_t s : slots_)
      if (s < capacity_ && size_ > s && size_ - n > 1)
        moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                             "KvCache: a sliding-window layer keeps " + std::to_string(s) +
                                 " positions and cannot roll back " + std::to_string(size_ - n) +
                                 " (from " + std::to_string(size_) + " to " + std::to_string(n) +
                                 ")");
    size_ = n;
  }
  void clear() noexcept { size_ = 0; }

 private:
  [[nodiscard]] std::size_t slot(std::uint32_t layer, std::uint32_t pos) const noexcept {
    return std::size_t{pos % slots_[layer]} * kv_dim_;
  }

  std::uint32_t kv_dim_;
  std::uint32_t capacity_;
  std::uint32_t size_ = 0;
  std::vector<std::uint32_t> slots_;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace moekit::engine
