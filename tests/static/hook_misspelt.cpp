// expect: moekit::Hooks: the component declares begin_sequence but has no `void begin_sequence\(\)`
// A policy that declares begin_sequence and misspells the member: without the declaration check
// the hook would silently never be called.
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/lru.hpp"

struct Misspelt : moekit::LruPolicy {
  static constexpr moekit::Hooks hooks = moekit::Hook::bind | moekit::Hook::begin_sequence;
  void begin_sequnce() {}
};
using C = moekit::ExpertCache<Misspelt>;
int main() { return sizeof(C) > 0 ? 0 : 1; }
