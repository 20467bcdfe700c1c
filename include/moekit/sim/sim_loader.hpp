#pragma once
/// \file SimLoader: a Loader that moves no bytes and computes when each load would complete.
///
/// Model: one link (bandwidth B bytes/s, latency L s) serves one transfer at a time, without
/// preemption. A transfer of an expert at precision p takes L + bytes(p) / B and occupies the link
/// for all of it. Waiting requests form two FIFO queues; whenever the link is free the oldest
/// on-demand request goes first, then the oldest prefetch (on-demand before prefetch, as the
/// Loader concept asks). A queued (not started) prefetch can be cancelled. Time is a VirtualClock
/// owned by the loader: `poll` answers at the clock's current time, `wait` advances the clock to
/// the completion and counts the difference as stall. Completion times are computed lazily from
/// the submit times, so the result equals an event-driven simulation and is deterministic.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/sim/virtual_clock.hpp"

namespace moekit::sim {

/// A transfer link between the slow tier and the expert cache.
struct LinkModel {
  double bandwidth_bytes_per_s = 16e9;  ///< sustained bandwidth
  double latency_s = 0.0;               ///< fixed cost of each transfer (setup, first byte)

  /// Throws `moekit::Error` naming the bad field.
  void validate() const {
    MOEKIT_EXPECTS(bandwidth_bytes_per_s > 0 && bandwidth_bytes_per_s < 1e300,
                   "LinkModel.bandwidth_bytes_per_s must be finite and > 0");
    MOEKIT_EXPECTS(latency_s >= 0 && latency_s < 1e300,
                   "LinkModel.latency_s must be finite and >= 0");
  }
  /// Seconds one transfer of `bytes` occupies the link.
  [[nodiscard]] double transfer_s(std::size_t bytes) const noexcept {
    return latency_s + double(bytes) / bandwidth_bytes_per_s;
  }
};

/// Counters of a SimLoader.
struct SimLoaderStats {
  std::uint64_t loads = 0;  ///< transfers started (completed or in progress)
  std::uint64_t bytes = 0;  ///< bytes of started transfers
  std::uint64_t demand_bytes = 0;
  std::uint64_t prefetch_bytes = 0;
  std::uint64_t cancelled = 0;  ///< queued prefetches withdrawn before they started
  std::uint64_t cancelled_bytes = 0;
  std::uint64_t late_waits = 0;  ///< waits on a prefetch that had not completed yet
  std::uint64_t late_bytes = 0;  ///< bytes of those prefetches
  double late_stall_s = 0.0;     ///< stall spent in those waits
  double busy_s = 0.0;           ///< time the link spent transferring
};

/// The simulator's Loader: see the file comment.
class SimLoader {
 public:
  static constexpr std::string_view name = "sim";
  static constexpr bool keeps_bytes = false;

  SimLoader(const ModelShape& shape, const LinkModel& link) : shape_(shape), link_(link) {
    shape_.validate();
    link_.validate();
    for (std::size_t i = 0; i < bytes_.size(); ++i)  // every Precision, `skip` included
      bytes_[i] = shape_.expert_bytes(static_cast<Precision>(i));
  }

  // ---- Loader concept ------------------------------------------------------------------------
  /// Queues a transfer at the current simulated time.
  LoadTicket submit(const LoadRequest& r) {
    MOEKIT_EXPECTS(shape_.contains(r.key), "SimLoader::submit: key outside the model shape");
    MOEKIT_EXPECTS(r.precision != Precision::skip, "SimLoader::submit: `skip` is not a format");
    settle();
    Record rec;
    rec.bytes = bytes_[static_cast<std::size_t>(r.precision)];
    rec.priority = r.priority;
    rec.submitted = clock_.now();
    records_.push_back(rec);
    const auto id = static_cast<std::uint32_t>(records_.size() - 1);
    (r.priority == LoadPriority::on_demand ? demand_q_ : prefetch_q_).push(id);
    ++queued_;
    settle();  // an idle link starts it at once
    return LoadTicket{records_.size()};
  }
  /// True when the load has completed by the current simulated time.
  bool poll(LoadTicket t) {
    Record& r = at(t, "poll");
    settle();
    return r.state == State::started && r.done <= clock_.now();
  }
  /// Advances the clock to the load's completion (stall); waits behind the transfers that the
  /// link serves first. Throws on a cancelled or unknown ticket.
  void wait(LoadTicket t) {
    Record& r = at(t, "wait");
    if (r.state == State::cancelled)
      moekit::detail::fail(ErrorKind::invalid_argument, "SimLoader::wait: load was cancelled");
    settle();
    const double entered = clock_.now();
    while (r.state == State::queued) {
      clock_.stall_until(next_start());  // the link frees up, or the next request arrives
      settle();
    }
    const bool late = r.priority == LoadPriority::prefetch && r.done > entered && !r.waited;
    const double stalled = r.done > entered ? r.done - entered : 0.0;
    if (late) {
      ++stats_.late_waits;
      stats_.late_bytes += r.bytes;
      stats_.late_stall_s += stalled;
    }
    r.waited = true;
    clock_.stall_until(r.done);
  }
  /// Withdraws a queued prefetch; false if it has started (or is an on-demand load).
  bool cancel(LoadTicket t) {
    Record& r = at(t, "cancel");
    settle();
    if (r.state != State::queued || r.priority != LoadPriority::prefetch) return false;
    r.state = State::cancelled;
    --queued_;
    ++stats_.cancelled;
    stats_.cancelled_bytes += r.bytes;
    return true;
  }

  // ---- simulation ------------------------------------------------------------------------------
  [[nodiscard]] VirtualClock& clock() noexcept { return clock_; }
  [[nodiscard]] const VirtualClock& clock() const noexcept { return clock_; }
  [[nodiscard]] const LinkModel& link() const noexcept { return link_; }
  [[nodiscard]] const SimLoaderStats& stats() const noexcept { return stats_; }
  /// Simulated completion time of a started load (for tests and traces of the schedule);
  /// throws if it has not started.
  [[nodiscard]] double completion_time(LoadTicket t) {
    Record& r = at(t, "completion_time");
    settle();
    MOEKIT_EXPECTS(r.state == State::started,
                   "SimLoader::completion_time: load has not started by the current time");
    return r.done;
  }
  /// Time at which the link finishes everything started so far.
  [[nodiscard]] double link_free_at() const noexcept { return link_free_; }
  /// Requests queued and not started at the current time.
  [[nodiscard]] std::size_t queued() {
    settle();
    return demand_q_.size(*this) + prefetch_q_.size(*this);
  }

 private:
  enum class State : std::uint8_t { queued, started, cancelled };
  struct Record {
    std::size_t bytes = 0;
    double submitted = 0.0;
    double done = 0.0;
    LoadPriority priority = LoadPriority::on_demand;
    State state = State::queued;
    bool waited = false;
  };
  /// FIFO of record ids; cancelled ids are skipped when they reach the head.
  struct Queue {
    std::vector<std::uint32_t> ids;
    std::size_t head = 0;
    void push(std::uint32_t id) {
      if (head == ids.size()) ids.clear(), head = 0;  // reuse the storage once drained
      ids.push_back(id);
    }
    const Record* front(SimLoader& l) {
      while (head < ids.size() && l.records_[ids[head]].state != State::queued) ++head;
      return head < ids.size() ? &l.records_[ids[head]] : nullptr;
    }
    Record* pop(SimLoader& l) {
      front(l);
      return &l.records_[ids[head++]];
    }
    [[nodiscard]] std::size_t size(SimLoader& l) {
      std::size_t n = 0;
      for (std::size_t i = head; i < ids.size(); ++i)
        n += l.records_[ids[i]].state == State::queued;
      return n;
    }
  };

  Record& at(LoadTicket t, const char* what) {
    if (t.id == 0 || t.id > records_.size()) unknown_ticket(t, what);
    return records_[t.id - 1];
  }
  // Out of line: inlined into a caller's loop, GCC 12 reports the message's concatenation as an
  // out-of-bounds copy (-Warray-bounds, a false positive).
  [[noreturn, gnu::cold, gnu::noinline]] static void unknown_ticket(LoadTicket t,
                                                                    const char* what) {
    moekit::detail::fail(
        ErrorKind::invalid_argument,
        std::string("SimLoader::") + what + ": unknown ticket " + std::to_string(t.id));
  }

  /// When the next queued request can start (link free and request submitted); +inf if none.
  [[nodiscard]] double next_start() {
    const Record* d = demand_q_.front(*this);
    const Record* p = prefetch_q_.front(*this);
    if (!d && !p) return 1e300;
    double first = d ? d->submitted : p->submitted;
    if (d && p && p->submitted < first) first = p->submitted;
    return first > link_free_ ? first : link_free_;
  }

  /// Starts every queued transfer that the link would have started by the current time.
  void settle() {
    const double now = clock_.now();
    while (queued_ > 0) {
      const double t = next_start();
      if (t > now) return;
      const Record* d = demand_q_.front(*this);
      Record* r = (d && d->submitted <= t) ? demand_q_.pop(*this) : prefetch_q_.pop(*this);
      r->state = State::started;
      --queued_;
      const double dur = link_.transfer_s(r->bytes);
      r->done = t + dur;
      link_free_ = r->done;
      ++stats_.loads;
      stats_.bytes += r->bytes;
      (r->priority == LoadPriority::on_demand ? stats_.demand_bytes : stats_.prefetch_bytes) +=
          r->bytes;
      stats_.busy_s += dur;
    }
  }

  ModelShape shape_;
  LinkModel link_;
  VirtualClock clock_;
  std::vector<Record> records_;
  Queue demand_q_, prefetch_q_;
  double link_free_ = 0.0;
  std::size_t queued_ = 0;  ///< records in State::queued (settle's fast exit when none)
  std::array<std::size_t, precision_slots> bytes_{};  ///< expert bytes per Precision
  SimLoaderStats stats_{};
};
static_assert(Loader<SimLoader>);

}  // namespace moekit::sim
