// expect: moekit::Loader: missing member `bool cancel\(LoadTicket\)`
#include "moekit/presets.hpp"

struct Uncancellable {
  moekit::LoadTicket submit(const moekit::LoadRequest&) { return {1}; }
  bool poll(moekit::LoadTicket) { return true; }
  void wait(moekit::LoadTicket) {}
};
using P = moekit::presets::Baseline<Uncancellable>;
int main() { return sizeof(P) > 0 ? 0 : 1; }
