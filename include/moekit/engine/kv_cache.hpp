#pragma once
/// \file KvCache: keys and values of every decoder layer for the positions of one sequence.
///
/// Fixed capacity chosen at construction (the context length), so generation never reallocates.
/// The element type is `KvType` (llama.cpp's --cache-type-k/-v): f32, or f16 (half the bytes a
/// long-context decode reads; values rounded to nearest on write, read widened exactly).
/// Each layer holds its rows head by head ([KV head][slot][head_dim]): one query head's attention
/// streams its KV head's rows contiguously rather than head_dim values every kv_dim.
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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/precision/half.hpp"

#include "moekit/engine/kv_rows.hpp"

namespace moekit::engine {

/// Element type of the KV cache.
enum class KvType : std::uint8_t {
  f32,  ///< exact
  f16,  ///< IEEE binary16, round to nearest even (llama.cpp's default)
};

constexpr std::string_view name(KvType t) noexcept { return t == KvType::f16 ? "f16" : "f32"; }

/// Parses "f32" or "f16" (nullopt otherwise).
constexpr std::optional<KvType> parse_kv_type(std::string_view s) noexcept {
  for (KvType t : {KvType::f32, KvType::f16})
    if (name(t) == s) return t;
  return std::nullopt;
}

/// Bytes of one stored key or value element.
constexpr std::size_t kv_element_bytes(KvType t) noexcept { return t == KvType::f16 ? 2 : 4; }

/// Keys and values, per layer [KV head × slot × head_dim] (RoPE already applied to the keys).
class KvCache {
 public:
  /// `window[l]` > 0 makes layer l a ring of min(window, capacity) slots; empty = no window.
  KvCache(std::uint32_t n_layers, std::uint32_t n_kv_heads, std::uint32_t head_dim,
          std::uint32_t capacity, std::span<const std::uint32_t> window = {},
          KvType type = KvType::f32)
      : type_(type),
        n_kv_heads_(n_kv_heads),
        head_dim_(head_dim),
        capacity_(capacity),
        slots_(n_layers, capacity),
        k_(n_layers),
        v_(n_layers) {
    MOEKIT_EXPECTS(capacity > 0, "KvCache: the context length must be > 0");
    MOEKIT_EXPECTS(n_kv_heads > 0 && head_dim > 0, "KvCache: heads and head_dim must be > 0");
    MOEKIT_EXPECTS(window.empty() || window.size() == n_layers,
                   "KvCache: one window per layer (or none)");
    for (std::uint32_t l = 0; l < n_layers; ++l) {
      if (!window.empty() && window[l] > 0) slots_[l] = std::min(window[l], capacity);
      const std::size_t n = std::size_t{slots_[l]} * kv_dim();
      k_[l].allocate(type, n);
      v_[l].allocate(type, n);
    }
  }

  [[nodiscard]] KvType type() const noexcept { return type_; }
  /// Positions filled so far (the next token's position).
  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint32_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint32_t n_kv_heads() const noexcept { return n_kv_heads_; }
  [[nodiscard]] std::uint32_t head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::uint32_t kv_dim() const noexcept { return n_kv_heads_ * head_dim_; }
  /// Positions layer `layer` retains (the context length, or its window).
  [[nodiscard]] std::uint32_t slots(std::uint32_t layer) const noexcept { return slots_[layer]; }
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (std::size_t l = 0; l < slots_.size(); ++l)
      n += 2 * std::size_t{slots_[l]} * kv_dim() * kv_element_bytes(type_);
    return n;
  }

  /// Throws unless `n` more positions fit.
  void check_room(std::uint32_t n) const {
    if (std::size_t{size_} + n > capacity_)
      moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                           "context full: " + std::to_string(size_) + " + " + std::to_string(n) +
                               " tokens exceed the context length " + std::to_string(capacity_));
  }

  /// The head_dim keys / values of KV head `head` at `pos` of `layer`, as stored: `T` is float
  /// for f32, Float16 for f16 (checked in debug builds). `pos` must be one of the layer's last
  /// `slots` positions; the rows of consecutive positions are head_dim apart until the ring wraps.
  template <class T>
  [[nodiscard]] const T* keys(std::uint32_t layer, std::uint32_t head,
                              std::uint32_t pos) const noexcept {
    return k_[layer].template data<T>() + offset(layer, head, pos);
  }
  template <class T>
  [[nodiscard]] const T* values(std::uint32_t layer, std::uint32_t head,
                                std::uint32_t pos) const noexcept {
    return v_[layer].template data<T>() + offset(layer, head, pos);
  }

  /// Stores the keys and values of `pos` at `layer` (kv_dim floats each, the heads one after
  /// another), converted to the cache's type.
  void store(std::uint32_t layer, std::uint32_t pos, const float* k, const float* v) noexcept {
    for (std::uint32_t h = 0; h < n_kv_heads_; ++h) {
      const std::size_t at = offset(layer, h, pos), from = std::size_t{h} * head_dim_;
      k_[layer].put(at, k + from, head_dim_);
      v_[layer].put(at, v + from, head_dim_);
    }
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
  // One layer's keys or values at the cache's type (only one of the vectors is used).
  struct Rows {
    std::vector<float> f32;
    std::vector<moekit::Float16> f16;

    void allocate(KvType t, std::size_t n) {
      if (t == KvType::f16)
        f16.assign(n, moekit::Float16{});
      else
        f32.assign(n, 0.f);
    }
    template <class T>
    [[nodiscard]] const T* data() const noexcept {
      if constexpr (std::is_same_v<T, float>)
        return f32.data();
      else
        return f16.data();
    }
    void put(std::size_t at, const float* x, std::size_t n) noexcept {
      if (!f16.empty())
        kv_rows::to_f16(x, f16.data() + at, n);
      else
        std::copy_n(x, n, f32.data() + at);
    }
  };

  [[nodiscard]] std::size_t offset(std::uint32_t layer, std::uint32_t head,
                                   std::uint32_t pos) const noexcept {
    return (std::size_t{head} * slots_[layer] + pos % slots_[layer]) * head_dim_;
  }

  KvType type_;
  std::uint32_t n_kv_heads_, head_dim_;
  std::uint32_t capacity_;
  std::uint32_t size_ = 0;
  std::vector<std::uint32_t> slots_;
  std::vector<Rows> k_, v_;
};

}  // namespace moekit::engine
