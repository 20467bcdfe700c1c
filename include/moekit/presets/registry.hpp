#pragma once
/// \file The preset registry: every `PresetSpec` moekit ships, in one list, and the one place a
/// name chosen at run time becomes a compile-time preset.
///
/// Code that knows its preset names its spec and compiles only that one:
///
///     auto p = presets::make_pipeline<presets::HobbitSpec>(shape, pc, params, loader, inputs);
///
/// A name chosen at run time is looked up once; `visit` then compiles the caller's code for every
/// registered preset (a pipeline type is fixed at compile time) and runs the one named:
///
///     const presets::PresetEntry* e = presets::find(name);            // nullptr: unknown
///     presets::visit(*e, [&]<class Spec>(std::type_identity<Spec>) { ... });
///
/// Adding a preset: its header in this folder, its spec in `Registered` below (and its #include).

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/presets/baseline.hpp"
#include "moekit/presets/edgemoe.hpp"
#include "moekit/presets/fate.hpp"
#include "moekit/presets/fate_oracle.hpp"
#include "moekit/presets/fiddler.hpp"
#include "moekit/presets/hobbit.hpp"
#include "moekit/presets/hobbit_oracle.hpp"
#include "moekit/presets/mobile.hpp"
#include "moekit/presets/mobile_oracle.hpp"
#include "moekit/presets/nextuse.hpp"
#include "moekit/presets/nextuse_fit.hpp"
#include "moekit/presets/preset_spec.hpp"

namespace moekit::presets {

/// A list of specs, each checked against `PresetSpec` with a diagnostic that names the gap.
template <class... Specs>
struct PresetList {
  static_assert((assert_preset_spec<Specs>() && ...));
  static constexpr std::size_t size = sizeof...(Specs);
};

/// Every preset, in the order moe-run lists them: one line per preset.
// clang-format off
using Registered = PresetList<
    BaselineSpec,
    HobbitSpec,
    FateSpec,
    EdgeMoeSpec,
    MobileSpec,
    FiddlerSpec,
    NextUseSpec,
    NextUseFitSpec,
    HobbitOracleSpec,
    FateOracleSpec,
    MobileOracleSpec>;
// clang-format on

/// A registered preset as a run-time value: what does not depend on the loader type.
struct PresetEntry {
  std::string_view name;
  std::string_view summary;
  PresetNeeds needs;
  std::uint32_t quant_group_size;                      ///< its experts' codec (0: per channel)
  std::size_t index;                                   ///< position in `Registered`
  void (*check)(Precision base, const PresetParams&);  ///< the spec's own checks
  std::vector<Precision> (*precisions)(const ModelShape&, Precision base, const PresetParams&,
                                       const PresetInputs&);
};

namespace registry_detail {
template <class S>
constexpr PresetEntry entry(std::size_t index) {
  return {S::name, S::summary, S::needs, S::quant_group_size, index, &S::check, &S::precisions};
}
template <class... S, std::size_t... I>
constexpr auto entries(PresetList<S...>, std::index_sequence<I...>) {
  return std::array<PresetEntry, sizeof...(S)>{entry<S>(I)...};
}
template <class S, class... Rest>
constexpr std::size_t index_of(PresetList<Rest...>) {
  constexpr bool found[] = {std::is_same_v<S, Rest>...};
  for (std::size_t i = 0; i < sizeof...(Rest); ++i)
    if (found[i]) return i;
  return sizeof...(Rest);
}
template <class S, class R, class F>
R call(F& f) {
  return f(std::type_identity<S>{});
}
template <class... S, class F>
decltype(auto) visit(PresetList<S...>, std::size_t i, F& f) {
  using First = std::tuple_element_t<0, std::tuple<S...>>;
  using R = decltype(f(std::type_identity<First>{}));
  static constexpr R (*table[])(F&) = {&call<S, R, F>...};
  return table[i](f);
}
template <class... S, class F>
void for_each(PresetList<S...>, F& f) {
  (f(std::type_identity<S>{}), ...);
}
}  // namespace registry_detail

/// Every registered preset, in `Registered` order.
inline constexpr auto entries =
    registry_detail::entries(Registered{}, std::make_index_sequence<Registered::size>{});

/// The position of `S` in `Registered` (a registered spec only).
template <PresetSpec S>
inline constexpr std::size_t index_of = registry_detail::index_of<S>(Registered{});

/// The entry of `S` (a registered spec: any other fails to compile, out of `entries`' bounds).
template <PresetSpec S>
inline constexpr const PresetEntry& entry_of = entries[index_of<S>];

/// True when `e` is the entry of `S`.
template <PresetSpec S>
constexpr bool is(const PresetEntry& e) noexcept {
  return e.index == index_of<S>;
}

/// The preset called `name`, or nullptr.
constexpr const PresetEntry* find(std::string_view name) noexcept {
  for (const PresetEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

/// The registered names, in order, separated by `sep` (for messages and help texts).
inline std::string names(std::string_view sep = ", ") {
  std::string out;
  for (const PresetEntry& e : entries) {
    if (!out.empty()) out += sep;
    out += e.name;
  }
  return out;
}

/// Calls `f(std::type_identity<Spec>{})` with the spec of `e`. `f` is compiled for every
/// registered spec and must return the same type for each.
template <class F>
decltype(auto) visit(const PresetEntry& e, F&& f) {
  return registry_detail::visit(Registered{}, e.index, f);
}

/// Calls `f(std::type_identity<Spec>{})` for every registered spec, in order.
template <class F>
void for_each(F&& f) {
  registry_detail::for_each(Registered{}, f);
}

/// Checks the knobs (`check_params`) and then the knobs preset `e` reads.
inline void check(const PresetEntry& e, Precision base, const PresetParams& q) {
  check_params(q);
  e.check(base, q);
}

/// Preset `S`'s pipeline (a `std::unique_ptr<S::Pipeline<Loader>>`) at `pc` over `loader`,
/// configured from `q` and placed: the knobs are checked, the pipeline built from
/// `S::configure(shape, pc.base_precision, q)`, and its start-up experts preloaded.
template <PresetSpec S, class Loader>
auto make_pipeline(const ModelShape& shape, const PipelineConfig& pc, const PresetParams& q,
                   Loader loader, const PresetInputs& in) {
  check_params(q);
  S::check(pc.base_precision, q);
  auto p = S::template build<Loader>(shape, pc, std::move(loader),
                                     S::configure(shape, pc.base_precision, q), in);
  S::place(*p, in);
  return p;
}

}  // namespace moekit::presets
