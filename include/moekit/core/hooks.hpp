#pragma once
/// \file Optional hooks are declared, not guessed: `Hook`, `Hooks`, `declares<C>(hook)` and the
/// checks that keep a component's declaration and its members in step.
///
/// A component opts into the optional calls it wants with one declaration:
///
///     struct MyPolicy {
///       static constexpr moekit::Hooks hooks = moekit::Hook::bind | moekit::Hook::begin_sequence;
///       void bind(const moekit::ModelShape&);
///       void begin_sequence();
///       ...  // on_hit, on_insert, on_evict, victim
///     };
///
/// The library calls a hook only when it is declared (`if constexpr (declares<C>(Hook::bind))`),
/// and `assert_hooks` (run wherever a component is plugged in: ExpertCache, OffloadPipeline, the
/// wrappers) refuses, with a message naming the hook:
///  - a declared hook without a member of the hook's signature (a misspelt `begin_sequnce`);
///  - a member named like a hook the caller would call, not declared (so a forgotten declaration
///    cannot silently disable it);
///  - a wrapper (`using wrapped_component = Inner;`) that does not declare every hook its inner
///    component declares, except those it lists in `consumed_hooks` (calls itself).
/// The failing component's type is in the compiler's "In instantiation of ... [with C = ...]".

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "moekit/core/cache_events.hpp"
#include "moekit/core/expert_key.hpp"
#include "moekit/core/matrix_order.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/core/prefetch_list.hpp"

namespace moekit {

/// One optional hook. Signatures (and who calls them) are in the `detail::hook_*` concepts below.
enum class Hook : std::uint16_t {
  bind = 1u << 0,                  ///< cache policy: `void bind(const ModelShape&)`
  pool_capacities = 1u << 1,       ///< cache policy: per-pool byte capacities
  pool_of = 1u << 2,               ///< cache policy: pool index of a key at a precision
  begin_sequence = 1u << 3,        ///< every pipeline component: a new sequence
  begin_token = 1u << 4,           ///< cache policy: `n` tokens enter the model
  prepare_insert = 1u << 5,        ///< cache policy: an insertion is about to ask for victims
  set_layer_capacities = 1u << 6,  ///< cache policy inside ShallowFavoring: slots per layer
  end_layer_call = 1u << 7,        ///< cache policy under sim::replay: a layer call ended
  on_verdict = 1u << 8,            ///< predictor: the token policy's verdict on a token
  host_bytes = 1u << 9,            ///< loader: an expert's bytes in host memory (CPU execution)
  prepare_host_bytes = 1u << 10,   ///< loader: `host_bytes` of this expert will be asked for soon
  planned_experts = 1u << 11,      ///< predictor: experts fixed in advance for a layer (MoBiLE)
  matrix_order = 1u << 12,   ///< loader: where the rows of the blobs it delivers are (else rows)
  tokens_asking = 1u << 13,  ///< scorer: how many of a demand's tokens asked its precision
};

/// A set of hooks; `Hook::a | Hook::b` builds one.
struct Hooks {
  std::uint16_t bits = 0;

  constexpr Hooks() = default;
  constexpr Hooks(Hook h) noexcept : bits(static_cast<std::uint16_t>(h)) {}  // NOLINT: a set of one

  [[nodiscard]] constexpr bool contains(Hook h) const noexcept {
    return (bits & static_cast<std::uint16_t>(h)) != 0;
  }
  friend constexpr Hooks operator|(Hooks a, Hooks b) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits | b.bits));
  }
  /// `a` without the hooks of `b`.
  friend constexpr Hooks operator-(Hooks a, Hooks b) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits & ~b.bits));
  }
  friend constexpr bool operator==(Hooks, Hooks) = default;

 private:
  static constexpr Hooks from_bits(std::uint16_t b) noexcept {
    Hooks h;
    h.bits = b;
    return h;
  }
};
constexpr Hooks operator|(Hook a, Hook b) noexcept { return Hooks(a) | Hooks(b); }

/// The hooks `C` declares (`static constexpr moekit::Hooks hooks = ...;`); none without one.
template <class C>
inline constexpr Hooks hooks_of = [] {
  using T = std::remove_cvref_t<C>;
  if constexpr (requires {
                  { T::hooks } -> std::convertible_to<Hooks>;
                }) {
    return Hooks(T::hooks);
  } else {
    static_assert(
        !requires { T::hooks; },
        "moekit::Hooks: a component's `hooks` must be a `static constexpr moekit::Hooks`");
    return Hooks{};
  }
}();

/// Whether `C` declares `h` (the library calls `h` on `C` exactly when this holds).
template <class C>
[[nodiscard]] consteval bool declares(Hook h) {
  return hooks_of<C>.contains(h);
}

/// The hooks each kind of component may be called with (what `assert_hooks` looks for undeclared).
inline constexpr Hooks cache_policy_hooks =
    Hook::bind | Hook::pool_capacities | Hook::pool_of | Hook::begin_sequence | Hook::begin_token |
    Hook::prepare_insert | Hook::set_layer_capacities | Hook::end_layer_call;
inline constexpr Hooks predictor_hooks =
    Hook::begin_sequence | Hook::on_verdict | Hook::planned_experts;
inline constexpr Hooks sequence_hooks = Hook::begin_sequence;  ///< scheduler, token policy
inline constexpr Hooks scorer_hooks = Hook::begin_sequence | Hook::tokens_asking;
inline constexpr Hooks loader_hooks =
    Hook::host_bytes | Hook::prepare_host_bytes | Hook::matrix_order;

namespace detail {
// ---- each hook's signature (the call its caller makes)
// -------------------------------------------
template <class C>
concept hook_bind = requires(C& c, const ModelShape& s) {
  c.bind(s);
};
template <class C>
concept hook_pool_capacities = requires(C& c, const ModelShape& s, std::size_t b, Precision p) {
  { c.pool_capacities(s, b, p) } -> std::convertible_to<std::vector<std::size_t>>;
};
template <class C>  // const: ExpertCache::pool_of is a const query
concept hook_pool_of = requires(const C& c, ExpertKey k, Precision p) {
  { c.pool_of(k, p) } -> std::convertible_to<std::uint32_t>;
};
template <class C>
concept hook_begin_sequence = requires(C& c) {
  c.begin_sequence();
};
template <class C>
concept hook_begin_token = requires(C& c, std::uint32_t n) {
  c.begin_token(n);
};
template <class C>
concept hook_prepare_insert = requires(C& c, ExpertKey k, const AccessInfo& a) {
  c.prepare_insert(k, a);
};
template <class C>
concept hook_set_layer_capacities = requires(C& c, std::span<const std::uint32_t> slots) {
  c.set_layer_capacities(slots);
};
template <class C>
concept hook_end_layer_call = requires(C& c) {
  c.end_layer_call();
};
template <class C>
concept hook_on_verdict = requires(C& c, TokenVerdict v, PrefetchList& out) {
  c.on_verdict(v, out);
};
template <class C>  // const: asked by the engine between layer calls
concept hook_planned_experts = requires(const C& c, std::uint32_t layer) {
  { c.planned_experts(layer) } -> std::convertible_to<std::span<const std::uint32_t>>;
};
template <class C>
concept hook_host_bytes = requires(C& c, ExpertKey k, Precision p) {
  { c.host_bytes(k, p) } -> std::convertible_to<std::span<const std::byte>>;
};
template <class C>
concept hook_prepare_host_bytes = requires(C& c, ExpertKey k, Precision p) {
  c.prepare_host_bytes(k, p);
};
template <class C>  // const: asked by the pipeline for each view it resolves
concept hook_matrix_order = requires(const C& c, Precision p) {
  { c.matrix_order(p) } -> std::same_as<MatrixOrder>;
};
template <class C>  // const: asked by the pipeline after `score`, per demand of that call
concept hook_tokens_asking = requires(const C& c, std::size_t demand) {
  { c.tokens_asking(demand) } -> std::convertible_to<std::uint32_t>;
};

// ---- a member of the hook's name, whatever its signature ---------------------------------------
// `&C::name` finds a single non-template member; the signature test finds overloaded ones.
#define MOEKIT_DETAIL_NAMES_HOOK(name)                \
  template <class C>                                  \
  concept names_##name = hook_##name<C> || requires { \
    &C::name;                                         \
  };
MOEKIT_DETAIL_NAMES_HOOK(bind)
MOEKIT_DETAIL_NAMES_HOOK(pool_capacities)
MOEKIT_DETAIL_NAMES_HOOK(pool_of)
MOEKIT_DETAIL_NAMES_HOOK(begin_sequence)
MOEKIT_DETAIL_NAMES_HOOK(begin_token)
MOEKIT_DETAIL_NAMES_HOOK(prepare_insert)
MOEKIT_DETAIL_NAMES_HOOK(set_layer_capacities)
MOEKIT_DETAIL_NAMES_HOOK(end_layer_call)
MOEKIT_DETAIL_NAMES_HOOK(on_verdict)
MOEKIT_DETAIL_NAMES_HOOK(planned_experts)
MOEKIT_DETAIL_NAMES_HOOK(host_bytes)
MOEKIT_DETAIL_NAMES_HOOK(prepare_host_bytes)
MOEKIT_DETAIL_NAMES_HOOK(matrix_order)
MOEKIT_DETAIL_NAMES_HOOK(tokens_asking)
#undef MOEKIT_DETAIL_NAMES_HOOK

/// Hooks a wrapper must declare: those its wrapped component declares, less the ones it consumes.
template <class W>
consteval Hooks hooks_to_forward() {
  if constexpr (requires { typename W::wrapped_component; }) {
    Hooks consumed;
    if constexpr (requires { W::consumed_hooks; }) consumed = W::consumed_hooks;
    return hooks_of<typename W::wrapped_component> - consumed;
  } else {
    return Hooks{};
  }
}
}  // namespace detail

/// The three rules for each hook; `called` = the hooks the caller plugging `C` in may call.
/// One macro per hook keeps the hook's name in each message (static_assert takes only literals).
#define MOEKIT_DETAIL_CHECK_HOOK(name, signature)                                                \
  static_assert(!declares<C>(Hook::name) || detail::hook_##name<C>,                              \
                "moekit::Hooks: the component declares " #name " but has no `" signature "`");   \
  static_assert(                                                                                 \
      !called.contains(Hook::name) || declares<C>(Hook::name) || !detail::names_##name<C>,       \
      "moekit::Hooks: the component defines " #name                                              \
      " but does not declare it (add "                                                           \
      "Hook::" #name " to its `static constexpr moekit::Hooks hooks`)");                         \
  static_assert(!detail::hooks_to_forward<C>().contains(Hook::name) || declares<C>(Hook::name),  \
                "moekit::Hooks: the wrapper does not forward " #name                             \
                ", which its wrapped component declares (declare and forward it, or list it in " \
                "`consumed_hooks`)");

template <class C, Hooks called>
consteval bool assert_hooks() {
  MOEKIT_DETAIL_CHECK_HOOK(bind, "void bind(const ModelShape&)")
  MOEKIT_DETAIL_CHECK_HOOK(pool_capacities,
                           "std::vector<std::size_t> pool_capacities(const ModelShape&, "
                           "std::size_t budget_bytes, Precision sizing)")
  MOEKIT_DETAIL_CHECK_HOOK(pool_of, "std::uint32_t pool_of(ExpertKey, Precision) const")
  MOEKIT_DETAIL_CHECK_HOOK(begin_sequence, "void begin_sequence()")
  MOEKIT_DETAIL_CHECK_HOOK(begin_token, "void begin_token(std::uint32_t n)")
  MOEKIT_DETAIL_CHECK_HOOK(prepare_insert, "void prepare_insert(ExpertKey, const AccessInfo&)")
  MOEKIT_DETAIL_CHECK_HOOK(set_layer_capacities,
                           "void set_layer_capacities(std::span<const std::uint32_t>)")
  MOEKIT_DETAIL_CHECK_HOOK(end_layer_call, "void end_layer_call()")
  MOEKIT_DETAIL_CHECK_HOOK(on_verdict, "void on_verdict(TokenVerdict, PrefetchList&)")
  MOEKIT_DETAIL_CHECK_HOOK(planned_experts,
                           "std::span<const std::uint32_t> planned_experts(std::uint32_t) const")
  MOEKIT_DETAIL_CHECK_HOOK(host_bytes,
                           "std::span<const std::byte> host_bytes(ExpertKey, Precision)")
  MOEKIT_DETAIL_CHECK_HOOK(prepare_host_bytes, "void prepare_host_bytes(ExpertKey, Precision)")
  MOEKIT_DETAIL_CHECK_HOOK(matrix_order, "MatrixOrder matrix_order(Precision) const")
  MOEKIT_DETAIL_CHECK_HOOK(tokens_asking, "std::uint32_t tokens_asking(std::size_t demand) const")
  return true;
}
#undef MOEKIT_DETAIL_CHECK_HOOK

}  // namespace moekit
