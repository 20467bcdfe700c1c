#pragma once
// A deterministic Loader double: loads complete only when the test says so (or at once, when
// `instant`). Records every request, so scenario tests can assert exactly what was loaded.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "moekit/core/concepts.hpp"

namespace moekit::test {

class ManualLoader {
 public:
  struct Record {
    LoadRequest request;
    LoadTicket ticket;
    bool done = false;
    bool cancelled = false;
  };

  explicit ManualLoader(bool instant = true) : instant_(instant) {}

  LoadTicket submit(const LoadRequest& r) {
    const LoadTicket t{records_.size() + 1};
    records_.push_back({r, t, instant_, false});
    // Fill the destination with a pattern naming the expert, so views can be checked.
    if (!r.dest.empty()) std::memset(r.dest.data(), pattern(r.key), r.dest.size());
    return t;
  }
  [[nodiscard]] bool poll(LoadTicket t) const { return rec(t).done; }
  void wait(LoadTicket t) {
    Record& r = rec(t);
    if (r.cancelled) throw std::logic_error("ManualLoader: wait on a cancelled load");
    r.done = true;
  }
  bool cancel(LoadTicket t) {
    Record& r = rec(t);
    if (r.done || r.request.priority != LoadPriority::prefetch) return false;
    r.cancelled = true;
    return true;
  }
  void complete_all() {
    for (Record& r : records_) r.done = true;
  }
  [[nodiscard]] const std::vector<Record>& records() const noexcept { return records_; }
  void clear_records() { records_.clear(); }
  static int pattern(ExpertKey k) { return static_cast<int>((k.layer * 16 + k.expert) & 0xff); }

 private:
  Record& rec(LoadTicket t) { return records_.at(t.id - 1); }
  const Record& rec(LoadTicket t) const { return records_.at(t.id - 1); }
  bool instant_;
  std::vector<Record> records_;
};
static_assert(Loader<ManualLoader>);

}  // namespace moekit::test
