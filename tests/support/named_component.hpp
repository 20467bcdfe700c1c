#pragma once
// Every component of moekit says its own name (`static constexpr std::string_view name`): the typed
// suites report it, and a component enrolled without one fails to compile with this concept named.

#include <concepts>
#include <set>
#include <string_view>
#include <tuple>
#include <vector>

namespace moekit::test {

template <class C>
concept NamedComponent = requires {
  { C::name } -> std::convertible_to<std::string_view>;
};

/// The names of the components of a type list (a std::tuple), in its order.
template <class List>
std::vector<std::string_view> names_of() {
  return []<class... C>(std::tuple<C...>*) {
    static_assert((NamedComponent<C> && ...), "every component of the list says its name");
    return std::vector<std::string_view>{C::name...};
  }(static_cast<List*>(nullptr));
}

/// True when the names are non-empty and pairwise different.
inline bool names_distinct(const std::vector<std::string_view>& names) {
  const std::set<std::string_view> distinct(names.begin(), names.end());
  return distinct.size() == names.size() && !distinct.contains(std::string_view{});
}

}  // namespace moekit::test
