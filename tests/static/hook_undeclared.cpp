// expect: moekit::Hooks: the component defines prepare_insert but does not declare it
// A policy that defines a hook but forgets to declare it: the cache must not skip it in silence.
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/lru.hpp"

struct Undeclared : moekit::LruPolicy {  // declares LruPolicy's hooks (bind) only
  void prepare_insert(moekit::ExpertKey, const moekit::AccessInfo&) {}
};
using C = moekit::ExpertCache<Undeclared>;
int main() { return sizeof(C) > 0 ? 0 : 1; }
