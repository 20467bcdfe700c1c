#pragma once
/// \file SimLoader: a Loader that moves no bytes and computes when each load would complete.
///
/// Model: one read path (bandwidth B bytes/s, latency L s) with `reads_in_flight` R readers, or
/// two (LinkModel::store: experts at the checkpoint's precision in place, the others from a store)
/// with their own readers on one disk. A transfer of an expert at precision p is w = L·r1 +
/// bytes(p) bytes of work (r1: what one read of its path gets alone); up to R transfers of a path
/// run at once and share it equally (processor sharing: with n running, each gets B/n, at most
/// r1, so two equal reads started together both finish after twice one), the disk capping both
/// paths together (the rates water-filled under it while both read), without preemption: a started
/// transfer runs to its end. Each path's waiting requests form two FIFO queues; whenever one of its
/// readers is free the oldest on-demand request goes first, then the oldest prefetch (on-demand
/// before prefetch, as the Loader concept asks). R = 1 is one transfer at a time: a transfer
/// submitted while another runs starts when it ends. A queued (not started) prefetch can be
/// cancelled. Time is a VirtualClock owned by the loader: `poll` answers at the clock's current
/// time, `wait` advances the clock to the completion and counts the difference as stall.
/// Completion times are computed lazily from the submit times (events in time order up to the
/// clock), so the result equals an event-driven simulation and is deterministic.
///
/// Host reads (`set_host_reads(true)`: experts the host CPU runs outside the cache are read over
/// the link first, a CPU-only machine): `prepare_host_bytes`, which the pipeline calls in `route`
/// for each expert it places on the host CPU, submits an on-demand transfer of it, and
/// `host_read` returns its ticket for the replay to wait on before the expert runs (moe-run's
/// HostReadRing, io/host_read_ring.hpp). Off by default: the hook does nothing.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/sim/virtual_clock.hpp"

namespace moekit::sim {

/// One read path into the expert cache: its readers and rates.
struct ReadPath {
  double bandwidth_bytes_per_s = 16e9;  ///< sustained bandwidth (of all its readers together)
  double latency_s = 0.0;               ///< fixed cost of each transfer (setup, first byte)
  /// Transfers in flight at once, sharing the bandwidth (the loader's reader threads); 1: one at
  /// a time.
  std::uint32_t reads_in_flight = 1;
  /// The most one transfer gets alone (one reader thread reading and transcoding in turn), at
  /// most `bandwidth_bytes_per_s`; 0: the whole bandwidth.
  double read_bandwidth_bytes_per_s = 0.0;
  /// Seconds by which each byte this path reads while the kernels run delays them: the loader's
  /// own CPU work (system calls, checksums, transcoding) on the cores the kernels use
  /// (SimLoader::compute). 0: reads cost the kernels nothing (a spare core, or a DMA engine).
  double compute_s_per_byte = 0.0;

  /// Throws `moekit::Error` naming the bad field of `what` ("LinkModel", "LinkModel.store").
  void validate(const std::string& what) const {
    MOEKIT_EXPECTS(bandwidth_bytes_per_s > 0 && bandwidth_bytes_per_s < 1e300,
                   what + ".bandwidth_bytes_per_s must be finite and > 0");
    MOEKIT_EXPECTS(latency_s >= 0 && latency_s < 1e300,
                   what + ".latency_s must be finite and >= 0");
    MOEKIT_EXPECTS(
        reads_in_flight >= 1 && reads_in_flight <= max_reads_in_flight,
        what + ".reads_in_flight must be in [1, " + std::to_string(max_reads_in_flight) + "]");
    MOEKIT_EXPECTS(
        read_bandwidth_bytes_per_s >= 0 && read_bandwidth_bytes_per_s <= bandwidth_bytes_per_s,
        what + ".read_bandwidth_bytes_per_s must be in [0, bandwidth_bytes_per_s]");
    MOEKIT_EXPECTS(compute_s_per_byte >= 0 && compute_s_per_byte < max_compute_s_per_byte,
                   what + ".compute_s_per_byte must be finite, >= 0 and below " +
                       std::to_string(max_compute_s_per_byte));
  }
  /// Bytes per second one transfer gets alone.
  [[nodiscard]] double alone_bytes_per_s() const noexcept {
    return read_bandwidth_bytes_per_s > 0 ? read_bandwidth_bytes_per_s : bandwidth_bytes_per_s;
  }
  /// Bytes per second each of `n` running transfers of this path gets, before the disk's cap
  /// (SimLoader's disk cap): an even share, at most one read's own rate.
  [[nodiscard]] double rate(std::size_t n) const noexcept {
    const double even = bandwidth_bytes_per_s / double(n);
    return even < alone_bytes_per_s() ? even : alone_bytes_per_s();
  }
  /// The work of a transfer of `bytes`, in bytes: its bytes and its latency at one read's rate,
  /// so that a read alone takes exactly `latency_s` + bytes ÷ (what one read gets). (The latency
  /// is not divided by a small share: with a link far faster than one read it would grow by
  /// their ratio.)
  [[nodiscard]] double work_bytes(std::size_t bytes) const noexcept {
    return latency_s * alone_bytes_per_s() + double(bytes);
  }
  static constexpr std::uint32_t max_reads_in_flight = 1024;
  /// Above it a byte read would cost more than a millisecond of compute: a unit mistake.
  static constexpr double max_compute_s_per_byte = 1e-3;
};

/// The read paths between the slow tier and the expert cache: one (the fields of ReadPath), or,
/// with `store`, two on the same disk, as moe-run reads a checkpoint's experts: those at its own
/// precision (`in_place`) in place through one loader, every other precision from an expert
/// store through another, each with its own readers and rates, both together at most
/// `disk_bandwidth_bytes_per_s` (bench/RESULTS.md, "Presets on real routing at 50% of the full
/// Mixtral file": one link for both read the store's small q2 experts 10–20% too fast).
struct LinkModel {
  // The main path (an aggregate, as before the store: LinkModel{bw, latency, readers}):
  double bandwidth_bytes_per_s = 16e9;           ///< ReadPath::bandwidth_bytes_per_s
  double latency_s = 0.0;                        ///< ReadPath::latency_s
  std::uint32_t reads_in_flight = 1;             ///< ReadPath::reads_in_flight
  double read_bandwidth_bytes_per_s = 0.0;       ///< ReadPath::read_bandwidth_bytes_per_s
  double compute_s_per_byte = 0.0;               ///< ReadPath::compute_s_per_byte
  std::optional<ReadPath> store = std::nullopt;  ///< the second path (none: one path)
  Precision in_place = Precision::skip;          ///< with `store`: the main path's precision
  double disk_bandwidth_bytes_per_s = 0.0;       ///< both paths' cap; 0: the faster path's
  static constexpr std::uint32_t max_reads_in_flight = ReadPath::max_reads_in_flight;

  /// Throws `moekit::Error` naming the bad field.
  void validate() const {
    main().validate("LinkModel");
    if (!store) return;
    store->validate("LinkModel.store");
    MOEKIT_EXPECTS(in_place != Precision::skip,
                   "LinkModel.in_place must name the main path's precision when a store is set");
    MOEKIT_EXPECTS(disk_bandwidth_bytes_per_s >= 0 && disk_bandwidth_bytes_per_s < 1e300,
                   "LinkModel.disk_bandwidth_bytes_per_s must be finite and >= 0");
  }
  [[nodiscard]] ReadPath main() const noexcept {
    return {bandwidth_bytes_per_s, latency_s, reads_in_flight, read_bandwidth_bytes_per_s,
            compute_s_per_byte};
  }
  /// Sets the main path's five fields from `p`.
  void set_main(const ReadPath& p) noexcept {
    bandwidth_bytes_per_s = p.bandwidth_bytes_per_s;
    latency_s = p.latency_s;
    reads_in_flight = p.reads_in_flight;
    read_bandwidth_bytes_per_s = p.read_bandwidth_bytes_per_s;
    compute_s_per_byte = p.compute_s_per_byte;
  }
  /// The main path's bandwidth set to `bw` (moe-sim --bandwidth, --sweep bandwidth); a store's
  /// and the disk cap scale by the same factor (the same machine with a faster or slower disk),
  /// each one-read rate at most its path's new bandwidth.
  void set_bandwidth(double bw) noexcept {
    const double f = bw / bandwidth_bytes_per_s;
    bandwidth_bytes_per_s = bw;
    if (!store) return;
    store->bandwidth_bytes_per_s *= f;
    store->read_bandwidth_bytes_per_s =
        std::min(store->read_bandwidth_bytes_per_s, store->bandwidth_bytes_per_s);
    disk_bandwidth_bytes_per_s *= f;
  }
  /// The path a load at `p` takes: 0 the main one, 1 the store.
  [[nodiscard]] std::size_t path_of(Precision p) const noexcept {
    return store && p != in_place ? 1 : 0;
  }
  [[nodiscard]] ReadPath path(std::size_t i) const noexcept { return i == 1 ? *store : main(); }
  /// Both paths' cap together (one path: its own bandwidth, never binding).
  [[nodiscard]] double disk_bytes_per_s() const noexcept {
    if (!store) return bandwidth_bytes_per_s;
    if (disk_bandwidth_bytes_per_s > 0) return disk_bandwidth_bytes_per_s;
    return std::max(bandwidth_bytes_per_s, store->bandwidth_bytes_per_s);
  }
  /// Seconds one transfer of `bytes` takes alone on the main path at its whole bandwidth.
  [[nodiscard]] double transfer_s(std::size_t bytes) const noexcept {
    return latency_s + double(bytes) / bandwidth_bytes_per_s;
  }
  /// The same on the path a load at `p` takes.
  [[nodiscard]] double transfer_s(std::size_t bytes, Precision p) const noexcept {
    const ReadPath r = path(path_of(p));
    return r.latency_s + double(bytes) / r.bandwidth_bytes_per_s;
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
  double busy_s = 0.0;           ///< seconds of the whole link's work transferred
  std::uint64_t host_reads = 0;  ///< transfers for the host CPU (set_host_reads), in `loads`
};

/// The simulator's Loader: see the file comment.
class SimLoader {
 public:
  static constexpr std::string_view name = "sim";
  static constexpr bool keeps_bytes = false;
  static constexpr Hooks hooks = Hook::prepare_host_bytes;

  SimLoader(const ModelShape& shape, const LinkModel& link) : shape_(shape), link_(link) {
    shape_.validate();
    link_.validate();
    for (std::size_t i = 0; i < bytes_.size(); ++i)  // every Precision, `skip` included
      bytes_[i] = shape_.expert_bytes(static_cast<Precision>(i));
    paths_ = {link_.main(), link_.store.value_or(ReadPath{})};
    delays_compute_ = paths_[0].compute_s_per_byte > 0 || paths_[1].compute_s_per_byte > 0;
    active_.reserve(link_.reads_in_flight + (link_.store ? link_.store->reads_in_flight : 0));
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
    rec.path = static_cast<std::uint8_t>(link_.path_of(r.precision));
    records_.push_back(rec);
    const auto id = static_cast<std::uint32_t>(records_.size() - 1);
    (r.priority == LoadPriority::on_demand ? demand_q_ : prefetch_q_)[rec.path].push(id);
    ++queued_;
    settle();  // a free reader starts it at once
    return LoadTicket{records_.size()};
  }
  /// True when the load has completed by the current simulated time.
  bool poll(LoadTicket t) {
    Record& r = at(t, "poll");
    settle();
    return r.state == State::finished;
  }
  /// Advances the clock to the load's completion (stall); waits behind the transfers that the
  /// link serves first. Throws on a cancelled or unknown ticket.
  void wait(LoadTicket t) {
    Record& r = at(t, "wait");
    if (r.state == State::cancelled)
      moekit::detail::fail(ErrorKind::invalid_argument, "SimLoader::wait: load was cancelled");
    settle();
    const double entered = clock_.now();
    while (r.state != State::finished) {
      const double next = next_completion();  // a reader frees up: the next event
      if (next >= 1e300)
        moekit::detail::fail(ErrorKind::internal, "SimLoader::wait: a queued load with no reader");
      clock_.stall_until(next);
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

  // ---- host reads (see the file comment) -------------------------------------------------------
  /// Experts the host CPU runs are read over the link first (false: they cost no transfer here).
  void set_host_reads(bool on) noexcept { host_reads_on_ = on; }
  [[nodiscard]] bool host_reads() const noexcept { return host_reads_on_; }
  /// The pipeline places `k` at `p` on the host CPU: with host reads on, its transfer starts
  /// (on-demand) unless one for it is pending already.
  void prepare_host_bytes(ExpertKey k, Precision p) {
    if (!host_reads_on_ || host_read(k, p).valid()) return;
    host_pending_.push_back({k, p, submit({k, p, LoadPriority::on_demand, {}})});
    ++stats_.host_reads;
  }
  /// The ticket of the pending host read of `k` at `p` (invalid when there is none).
  [[nodiscard]] LoadTicket host_read(ExpertKey k, Precision p) const noexcept {
    for (const HostRead& h : host_pending_)
      if (h.key == k && h.precision == p) return h.ticket;
    return {};
  }
  /// Forgets the pending host reads (the replay calls it once a layer call's experts have run).
  void clear_host_reads() noexcept { host_pending_.clear(); }

  // ---- simulation ------------------------------------------------------------------------------
  /// Advances the clock by `seconds` of compute on the cores the loader's reads use too, and
  /// returns how far it moved: each byte a path reads meanwhile delays the compute by the path's
  /// compute_s_per_byte, and the bytes read during that delay delay it in turn (charged until
  /// the delay added is below 1e-12 s, or 16 rounds). Bytes read while nothing computes (a
  /// stall) cost nothing. With every path's compute_s_per_byte 0: exactly `seconds`.
  double compute(double seconds) {
    if (!delays_compute_) {
      clock_.advance(seconds);
      return seconds;
    }
    const double start = clock_.now();
    double charged = delay_up_to_now();
    clock_.advance(seconds);
    for (int round = 0; round < 16; ++round) {
      const double owed = delay_up_to_now() - charged;
      if (!(owed > 1e-12)) break;
      charged += owed;
      clock_.advance(owed);
    }
    return clock_.now() - start;
  }
  [[nodiscard]] VirtualClock& clock() noexcept { return clock_; }
  [[nodiscard]] const VirtualClock& clock() const noexcept { return clock_; }
  [[nodiscard]] const LinkModel& link() const noexcept { return link_; }
  [[nodiscard]] const SimLoaderStats& stats() const noexcept { return stats_; }
  /// Simulated completion time of a started load (for tests and traces of the schedule): final
  /// once it has completed; while it runs beside others, the time it would complete if no other
  /// transfer started or ended first. Throws if it has not started.
  [[nodiscard]] double completion_time(LoadTicket t) {
    Record& r = at(t, "completion_time");
    settle();
    MOEKIT_EXPECTS(r.state == State::started || r.state == State::finished,
                   "SimLoader::completion_time: load has not started by the current time");
    return r.done;
  }
  /// Time at which the link finishes everything started so far (if nothing else starts).
  [[nodiscard]] double link_free_at() const {
    if (active_.empty()) return link_free_;
    std::vector<Running> run;  // the running ones, in turn ending, the rest speeding up
    for (std::uint32_t id : active_) run.push_back({records_[id].work_left, records_[id].path});
    double t = last_event_;
    std::vector<double> rate, sorted;
    while (!run.empty()) {
      rates_of(run, rate, sorted);
      std::size_t first = 0;  // the next to end
      for (std::size_t i = 1; i < run.size(); ++i)
        if (run[i].work / rate[i] < run[first].work / rate[first]) first = i;
      const double step = run[first].work / rate[first];
      t += step;
      std::size_t w = 0;
      for (std::size_t i = 0; i < run.size(); ++i) {
        run[i].work -= step * rate[i];
        if (i != first && run[i].work > 0.0) run[w++] = run[i];
      }
      run.resize(w);
    }
    return t;
  }
  /// Requests queued and not started at the current time.
  [[nodiscard]] std::size_t queued() {
    settle();
    std::size_t n = 0;
    for (std::size_t i = 0; i < 2; ++i) n += demand_q_[i].size(*this) + prefetch_q_[i].size(*this);
    return n;
  }

 private:
  enum class State : std::uint8_t { queued, started, finished, cancelled };
  struct Record {
    std::size_t bytes = 0;
    double submitted = 0.0;
    double done = 0.0;       ///< completion (while running: if the set of running ones stays)
    double work_left = 0.0;  ///< bytes of work it still needs (while running; ReadPath::work_bytes)
    double rate = 0.0;       ///< bytes per second while the set of running ones stays
    LoadPriority priority = LoadPriority::on_demand;
    std::uint8_t path = 0;  ///< LinkModel::path_of its precision
    State state = State::queued;
    bool waited = false;
    double delay_per_work = 0.0;  ///< compute delay per byte of its work (compute_s_per_byte)
  };
  /// A running transfer as the rates see it.
  struct Running {
    double work;
    std::uint8_t path;
  };
  /// Bytes per second of each of `run` into `rate`: its path's even share (at most one read's
  /// rate), then, when both paths are reading and together would exceed the disk, the disk
  /// water-filled: the transfers below the level keep their rate, the rest get the level. One
  /// path alone keeps its own rate: the cap is what the two get together (moe-calibrate measures
  /// it so), which may be below what either gets alone. `sorted` is scratch for the level; both
  /// vectors are reused, so that the loader's events allocate nothing once warm.
  void rates_of(const std::vector<Running>& run, std::vector<double>& rate,
                std::vector<double>& sorted) const {
    std::size_t n[2] = {0, 0};
    for (const Running& r : run) ++n[r.path];
    rate.resize(run.size());
    double sum = 0.0;
    for (std::size_t i = 0; i < run.size(); ++i)
      sum += rate[i] = paths_[run[i].path].rate(n[run[i].path]);
    const double disk = link_.disk_bytes_per_s();
    if (sum <= disk || n[0] == 0 || n[1] == 0) return;
    sorted.assign(rate.begin(), rate.end());
    std::sort(sorted.begin(), sorted.end());
    double left = disk, level = 0.0;
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      level = left / double(sorted.size() - i);
      if (sorted[i] >= level) break;
      left -= sorted[i];
    }
    for (double& r : rate) r = std::min(r, level);
  }
  struct HostRead {
    ExpertKey key;
    Precision precision;
    LoadTicket ticket;
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

  /// Time of the next completion among the running transfers; +inf if none runs.
  [[nodiscard]] double next_completion() const noexcept {
    double t = 1e300;
    for (std::uint32_t id : active_) t = records_[id].done < t ? records_[id].done : t;
    return t;
  }

  /// Processes, in time order, every completion up to the current time (each frees a reader
  /// that the oldest waiting request takes, on-demand first), then starts what a free reader
  /// takes now.
  void settle() {
    const double now = clock_.now();
    for (double t = next_completion(); t <= now; t = next_completion()) {
      advance(t);
      std::size_t w = 0;
      for (std::uint32_t id : active_) {
        Record& r = records_[id];
        if (r.done <= t) {
          r.state = State::finished;
          --running_[r.path];
          link_free_ = r.done > link_free_ ? r.done : link_free_;
        } else {
          active_[w++] = id;
        }
      }
      active_.resize(w);
      start_queued(t);
    }
    if (queued_ > 0 && (free_reader(0) || free_reader(1))) {
      advance(now);
      start_queued(now);
    }
  }

  /// Credits the running transfers with their work from the last event to `t`.
  void advance(double t) noexcept {
    if (!active_.empty() && t > last_event_)
      for (std::uint32_t id : active_) {
        Record& r = records_[id];
        r.work_left -= (t - last_event_) * r.rate;
        delay_ += (t - last_event_) * r.rate * r.delay_per_work;
      }
    last_event_ = t > last_event_ ? t : last_event_;
  }
  /// The compute delay of every byte read up to the clock's time (see `compute`).
  double delay_up_to_now() {
    settle();
    advance(clock_.now());
    return delay_;
  }
  /// Whether path `i` has a reader free (false for a path the link does not have).
  [[nodiscard]] bool free_reader(std::size_t i) const noexcept {
    if (i == 1 && !link_.store) return false;
    return running_[i] < paths_[i].reads_in_flight;
  }

  /// Starts waiting requests at `t` while a reader of their path is free, then sets every
  /// running transfer's rate and completion for the new set running.
  void start_queued(double t) {
    for (std::size_t i = 0; i < 2; ++i)
      while (free_reader(i) && (demand_q_[i].front(*this) || prefetch_q_[i].front(*this)))
        start(demand_q_[i].front(*this) ? demand_q_[i].pop(*this) : prefetch_q_[i].pop(*this));
    run_.clear();
    for (std::uint32_t id : active_) {
      Record& r = records_[id];
      r.work_left = r.work_left > 0.0 ? r.work_left : 0.0;  // a rounding tie: it ends now
      run_.push_back({r.work_left, r.path});
    }
    rates_of(run_, rate_, sorted_);
    for (std::size_t i = 0; i < active_.size(); ++i) {
      Record& r = records_[active_[i]];
      r.rate = rate_[i];
      r.done = t + r.work_left / r.rate;
    }
  }
  void start(Record* r) {
    r->state = State::started;
    --queued_;
    ++running_[r->path];
    r->work_left = paths_[r->path].work_bytes(r->bytes);
    r->delay_per_work =  // the bytes' share of the work (the latency's is no CPU work)
        r->work_left > 0 ? paths_[r->path].compute_s_per_byte * double(r->bytes) / r->work_left
                         : 0.0;
    active_.push_back(static_cast<std::uint32_t>(r - records_.data()));
    ++stats_.loads;
    stats_.bytes += r->bytes;
    (r->priority == LoadPriority::on_demand ? stats_.demand_bytes : stats_.prefetch_bytes) +=
        r->bytes;
    stats_.busy_s += r->work_left / link_.disk_bytes_per_s();  // the disk's busy time when full
  }

  ModelShape shape_;
  LinkModel link_;
  std::array<ReadPath, 2> paths_;  ///< link_'s main path and its store (or a default)
  VirtualClock clock_;
  std::vector<Record> records_;
  Queue demand_q_[2], prefetch_q_[2];  ///< per path (LinkModel::path_of)
  std::vector<std::uint32_t> active_;  ///< running transfers (at most their paths' readers)
  std::size_t running_[2] = {0, 0};    ///< of them, per path
  std::vector<HostRead> host_pending_;
  std::vector<Running> run_;           ///< start_queued's scratch: the running transfers
  std::vector<double> rate_, sorted_;  ///< ... their rates, and rates_of's scratch
  double last_event_ = 0.0;            ///< time up to which the running transfers' work is credited
  double link_free_ = 0.0;             ///< latest completion so far
  double delay_ = 0.0;                 ///< compute delay of the bytes read so far (`compute`)
  bool delays_compute_ = false;        ///< some path's compute_s_per_byte > 0
  std::size_t queued_ = 0;             ///< records in State::queued
  bool host_reads_on_ = false;
  std::array<std::size_t, precision_slots> bytes_{};  ///< expert bytes per Precision
  SimLoaderStats stats_{};
};
static_assert(Loader<SimLoader>);

}  // namespace moekit::sim
