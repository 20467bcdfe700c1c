#pragma once
/// \file ThreadPool: a fixed set of worker threads that run `parallel_for` over index ranges.
///
/// Made for kernels called thousands of times per second on machines shared with other work: a
/// call allocates nothing (the job is a function pointer plus a pointer to the caller's callable)
/// and the calling thread works too. Three rules keep two threads from ever being slower than one:
///
/// - A job is done when its chunks are done, not when every worker has reported in. Chunks of
///   `grain` indices are claimed from one atomic word tagged with the job's number, so a worker
///   that wakes late (its core lent to another process, a futex wake-up still in flight) finds the
///   job gone and claims nothing, and the caller never waits for it: it waits only for chunks a
///   worker has actually started. The old pool waited for every worker's check-in, and a decode
///   step of a few dozen jobs paid the scheduler's wake-up latency on each one whenever another
///   process was runnable (issue 28: two threads at a third of one thread's speed).
/// - Idle workers poll before they sleep. Outside an `Active` region they poll for `spin_time`;
///   inside one (a whole decode step: Model::forward) for `active_spin()`, an adaptive bound of
///   `spin_factor` times the wake-up latency measured on this machine, so an idle gap in the step
///   is only slept through when a wake-up costs at most 1/spin_factor of it (a load wait, say).
///   This is how ggml's threadpool (polling between graph nodes and graphs) and OpenMP's active
///   wait policy keep threads warm; unlike them the bound adapts instead of being a spin count.
/// - A job announces itself with a system call only when a worker sleeps.
///
/// One job runs at a time; concurrent callers are serialised. Exceptions thrown by the body are
/// rethrown in the caller (the first one wins; the job's remaining chunks are skipped).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/error.hpp"

#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <ctime>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace moekit {

namespace pool_detail {

/// Sleeps while `a` holds `old`, for at most `timeout`; a spurious or timed-out return is fine
/// (callers re-check in a loop). Why not std::atomic::wait: a decode run hung once with the
/// caller asleep in it after every chunk was done (a lost wake-up, libstdc++ 12); with a bounded
/// sleep a lost wake-up costs at most `timeout`, never the run. Linux: the futex system call on
/// the atomic's word, woken by `wake` below (not by std::atomic::notify_*).
inline void sleep_while(std::atomic<std::uint32_t>& a, std::uint32_t old,
                        std::chrono::microseconds timeout) noexcept {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
#if defined(__linux__)
  const timespec ts{static_cast<time_t>(timeout.count() / 1'000'000),
                    static_cast<long>(timeout.count() % 1'000'000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&a), FUTEX_WAIT_PRIVATE, old, &ts, nullptr,
            0);
#else
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (a.load(std::memory_order_seq_cst) == old && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
#endif
}

/// Wakes one (or every) thread in `sleep_while` on `a`.
inline void wake(std::atomic<std::uint32_t>& a, bool all) noexcept {
#if defined(__linux__)
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&a), FUTEX_WAKE_PRIVATE,
            all ? INT32_MAX : 1, nullptr, nullptr, 0);
#else
  (void)a, (void)all;
#endif
}

/// The CPU the calling thread runs on; -1 where unknown.
inline int current_cpu() noexcept {
#if defined(__linux__)
  return ::sched_getcpu();
#else
  return -1;
#endif
}

/// Moves the calling thread off CPU `cpu` without pinning it: narrows its affinity to the CPUs
/// it may use but `cpu` (the kernel migrates it at once), then restores the affinity it had, so
/// the scheduler stays free to place it later. False where it cannot (one CPU allowed; not Linux).
inline bool move_off_cpu(int cpu) noexcept {
#if defined(__linux__)
  cpu_set_t allowed;
  if (cpu < 0 || cpu >= CPU_SETSIZE || ::sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
      !CPU_ISSET(cpu, &allowed) || CPU_COUNT(&allowed) < 2)
    return false;
  cpu_set_t others = allowed;
  CPU_CLR(cpu, &others);
  if (::sched_setaffinity(0, sizeof others, &others) != 0) return false;
  ::sched_setaffinity(0, sizeof allowed, &allowed);
  return true;
#else
  (void)cpu;
  return false;
#endif
}

}  // namespace pool_detail

/// Fixed-size pool of `threads − 1` workers plus the calling thread.
class ThreadPool {
 public:
  /// `threads` ≥ 1 threads in total, counting the caller of `parallel_for`.
  explicit ThreadPool(unsigned threads) : threads_(threads) {
    MOEKIT_EXPECTS(threads >= 1 && threads <= 1024, "ThreadPool: threads must be in [1, 1024]");
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) {
      try {
        workers_.emplace_back([this] { worker_loop(); });
      } catch (const std::system_error& e) {
        // A destructor does not run for a constructor that throws: the started workers are
        // stopped and joined here (a joinable std::thread destroyed would call terminate()).
        stop_and_join();
        throw Error(ErrorKind::invalid_argument,
                    "ThreadPool: cannot start thread " + std::to_string(i + 1) + " of " +
                        std::to_string(threads) + " (" + e.what() +
                        "): too many threads for this process's limits (ulimit -u, ulimit -v, "
                        "cgroup pids.max); use fewer threads");
      }
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() { stop_and_join(); }

  /// Threads of the pool, the caller included.
  [[nodiscard]] unsigned size() const noexcept { return threads_; }
  /// Threads the next job runs on: size(), or 1 in a step the StepChooser runs on the caller
  /// alone (kernels size their chunks by it: one range per thread keeps each a single stream).
  [[nodiscard]] unsigned team_size() const noexcept {
    return solo_.load(std::memory_order_relaxed) ? 1 : threads_;
  }

  /// Calls `body(b, e)` on disjoint sub-ranges [b, e) covering [begin, end), each at most `grain`
  /// long, on all threads; returns when all are done. `body` must be safe to call concurrently.
  /// Not re-entrant: calling it from inside a job of the same pool deadlocks.
  template <class Body>
  void parallel_for(std::size_t begin, std::size_t end, std::size_t grain, Body&& body) {
    if (begin >= end) return;
    grain = std::max<std::size_t>(grain, 1);
    using B = std::remove_reference_t<Body>;
    if (threads_ == 1 || end - begin <= grain || solo_.load(std::memory_order_relaxed)) {
      for (std::size_t b = begin; b < end; b += grain) body(b, std::min(end, b + grain));
      return;
    }
    MOEKIT_EXPECTS((end - begin - 1) / grain < 0xFFFF'FFFFu,
                   "ThreadPool::parallel_for: more than 2^32 - 1 chunks (raise the grain)");
    std::lock_guard<std::mutex> one_job(call_mutex_);
    // Close the last job's claim word before its fields change: a worker still in run_chunks for
    // it, between reading claim_ and its compare-exchange, would otherwise claim chunks past the
    // last job's count against this job's (larger) chunks_, run them on this job's fields and
    // count them in this job's done_, which then passes chunks_ and the caller waits forever
    // (seen once: done_ 1533 of 1024 chunks, the caller stopped by SIGSTOP in this window).
    claim_.store(std::uint64_t{job_} << 32 | 0xFFFF'FFFFu, std::memory_order_seq_cst);
    fn_ = [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<B*>(ctx))(b, e); };
    ctx_ = const_cast<void*>(static_cast<const void*>(&body));
    begin_ = begin;
    end_ = end;
    grain_ = grain;
    // Release: a worker that reads this count has seen the claim word closed above.
    chunks_.store(static_cast<std::uint32_t>((end - begin + grain - 1) / grain),
                  std::memory_order_release);
    failed_.store(false, std::memory_order_relaxed);
    caller_cpu_.store(pool_detail::current_cpu(), std::memory_order_relaxed);
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const std::uint32_t job = ++job_;
    // Published with release: a worker that claims a chunk of `job` sees the fields above.
    claim_.store(std::uint64_t{job} << 32, std::memory_order_release);
    // seq_cst with the sleepers' count (worker_loop): either a worker about to sleep sees the new
    // generation, or this sees it counted and wakes it.
    generation_.store(job, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      announced_ns_.store(now_ns(), std::memory_order_relaxed);
      pool_detail::wake(generation_, /*all=*/true);
    }
    run_chunks(job);
    wait_for_chunks();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// While an Active lives, idle workers poll for the next job for up to active_spin() instead of
  /// spin_time: open one around a burst of jobs with short serial gaps between them (a decode
  /// step). Nests; movable, not copyable. An outermost Active opened with `adaptive` is a step
  /// of the StepChooser: its jobs run on all threads or on the caller alone, whichever the
  /// chooser finds faster, and its wall time is measured (two clock reads per step).
  class Active {
   public:
    explicit Active(ThreadPool& p, bool adaptive = false) noexcept : pool_(&p) {
      if (pool_->active_.fetch_add(1, std::memory_order_relaxed) == 0 && adaptive &&
          pool_->threads_ > 1) {
        step_ = true;
        const bool team = pool_->chooser_.team_next();
        const bool probe = pool_->chooser_.probing();
        pool_->solo_.store(!team, std::memory_order_relaxed);
        pool_->solo_probe_.store(probe && !team, std::memory_order_relaxed);
        start_ = std::chrono::steady_clock::now();
      }
    }
    Active(Active&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), step_(o.step_), start_(o.start_) {}
    /// Leaves `waited` out of this step's measured time: time the step spent waiting for
    /// something other than its jobs (loads from disk), which no thread count shortens and which
    /// would otherwise decide the choice by the luck of each step's misses.
    void discount(std::chrono::nanoseconds waited) noexcept {
      if (step_) start_ += std::max(waited, std::chrono::nanoseconds{0});
    }
    Active& operator=(Active&&) = delete;
    Active(const Active&) = delete;
    ~Active() {
      if (!pool_) return;
      if (step_) {
        const bool team = !pool_->solo_.load(std::memory_order_relaxed);
        pool_->solo_probe_.store(false, std::memory_order_relaxed);
        pool_->chooser_.record(team, std::chrono::steady_clock::now() - start_);
        pool_->last_step_team_.store(team, std::memory_order_relaxed);
        pool_->solo_.store(false, std::memory_order_relaxed);
      }
      pool_->active_.fetch_sub(1, std::memory_order_relaxed);
    }

   private:
    ThreadPool* pool_;
    bool step_ = false;
    std::chrono::steady_clock::time_point start_{};
  };

  /// Picks, step by step, whether a repeated step (a decode token) runs its jobs on all threads
  /// ("team") or on the caller alone ("solo"), from the measured step times: the mode with the
  /// lower moving average runs, and the other is re-measured now and then (a probe: two steps of
  /// the other mode, of which the second is measured), every `first_probe`
  /// steps while the two are within `close` of each other, backing off (at least doubling, and
  /// so that probes cost at most `probe_budget` of the time) up to every `last_probe` steps
  /// while the probes keep confirming it slower. On a quiet machine two threads win and the
  /// probes cost a fraction of a percent; when other processes take the cores (a second thread
  /// then only steals the caller's share of them) one thread wins, so two threads never run
  /// much below one.
  class StepChooser {
   public:
    static constexpr std::uint32_t first_probe = 16, last_probe = 1024;
    static constexpr double close = 1.10;
    static constexpr double probe_budget = 0.02;
    /// Steps a switch to the other mode runs (at the start, and for each probe); only the last
    /// is measured. The first step after a switch pays for the switch: workers asleep through
    /// solo steps must be woken (a halted virtual CPU's wake-up took up to milliseconds on a Zen 5
    /// VM, bench/RESULTS.md "Thread scaling on Zen 5"), caches are cold, and the first step of a
    /// run wakes the workers after the prompt. Measured, that step made one mode look several
    /// times slower than its steady state and decided the next dozens of steps.
    static constexpr unsigned switch_steps = 2;

    /// True: the next step runs on all threads.
    bool team_next() noexcept {
      if (switch_left_ > 0) {
        --switch_left_;
        return switch_team_;
      }
      if (seen_[0] == 0 || seen_[1] == 0) return begin_switch(seen_[1] == 0, false);
      const bool team_wins = avg_[1] <= avg_[0];
      if (++since_probe_ >= probe_every_) {
        since_probe_ = 0;
        return begin_switch(!team_wins, true);
      }
      return team_wins;
    }
    /// The step just run (on all threads when `team`) took `took`.
    void record(bool team, std::chrono::nanoseconds took) noexcept {
      ++steps_;
      if (team) ++team_steps_;
      if (switch_left_ > 0) return;  // a switch's first steps: the switch's cost, not the mode's
      double& avg = avg_[team];
      const auto ns = static_cast<double>(took.count());
      // A probe faster than the running mode's average replaces its own mode's average instead
      // of joining it: that average is as old as the last probe, and one slow step in it (a step
      // disturbed by another process, the first cold step) would otherwise outvote several fast
      // probes, keeping the slower mode for dozens of steps. A lucky probe costs little: its mode
      // then runs and is measured every step. A slow probe only joins the average, since it may
      // be the one disturbed (a worker woken from sleep on a loaded machine).
      const bool wins = probing_ && ns < avg_[!team];
      avg = seen_[team]++ == 0 || wins ? ns : 0.75 * avg + 0.25 * ns;
      if (!probing_) return;
      probing_ = false;  // the probed mode is the one just run
      const double ratio = ns / std::max(avg_[!team], 1.0);
      if (ratio <= close) {
        probe_every_ = first_probe;
        return;
      }
      // Confirmed slower: at least twice as long to the next probe, and long enough that probes
      // cost at most probe_budget of the steps' time (a probe of switch_steps steps `ratio` times
      // as slow costs switch_steps × (ratio − 1) steps).
      const double affordable = switch_steps * (ratio - 1) / probe_budget;
      probe_every_ = static_cast<std::uint32_t>(
          std::min<double>(last_probe, std::max<double>(2.0 * probe_every_, affordable)));
    }
    [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
    /// Whether the step team_next() last chose belongs to a probe of the slower mode.
    [[nodiscard]] bool probing() const noexcept { return probing_; }
    /// Moving average of the steps run on all threads (`team`) or on the caller alone, in ns.
    [[nodiscard]] double average_ns(bool team) const noexcept { return avg_[team]; }
    [[nodiscard]] std::uint64_t team_steps() const noexcept { return team_steps_; }

   private:
    double avg_[2] = {0, 0};  ///< [solo, team] moving average of the step time, ns
    std::uint64_t seen_[2] = {0, 0};
    std::uint64_t steps_ = 0, team_steps_ = 0;
    std::uint32_t probe_every_ = first_probe, since_probe_ = 0;
    unsigned switch_left_ = 0;  ///< unmeasured steps left of the current switch
    bool switch_team_ = false;  ///< the mode switched to
    bool probing_ = false;

    bool begin_switch(bool team, bool probe) noexcept {
      switch_team_ = team;
      switch_left_ = switch_steps - 1;
      probing_ = probe;
      return team;
    }
  };

  /// Steps (adaptive Active regions) run so far, and how many of them ran on all threads.
  [[nodiscard]] std::uint64_t adaptive_steps() const noexcept { return chooser_.steps(); }
  [[nodiscard]] std::uint64_t team_steps() const noexcept { return chooser_.team_steps(); }
  /// How often a worker found itself on its job's caller's CPU and moved off it.
  [[nodiscard]] std::uint64_t moves_off_caller_cpu() const noexcept {
    return moves_.load(std::memory_order_relaxed);
  }
  /// The StepChooser's moving average of team (all threads) or solo steps, in ns.
  [[nodiscard]] double average_step_ns(bool team) const noexcept {
    return chooser_.average_ns(team);
  }
  /// Whether the last adaptive step ran on all threads (true before the first). Work between
  /// steps that splits itself over the pool (the sampler's passes) follows the chooser: when the
  /// caller alone was faster, a job beside it would mostly wait for the other core.
  [[nodiscard]] bool last_step_on_team() const noexcept {
    return last_step_team_.load(std::memory_order_relaxed);
  }

  /// How long an idle worker polls for the next job outside an Active region, and the least it
  /// polls inside one; also how long the caller polls for the last chunks before it sleeps.
  static constexpr std::chrono::microseconds spin_time{50};
  /// Longest single sleep of the caller waiting for chunks, and of an idle worker: bounds what a
  /// lost wake-up can cost (each re-checks and sleeps again).
  static constexpr std::chrono::microseconds caller_nap{1000}, worker_nap{20000};
  /// Most an idle worker polls inside an Active region, whatever the wake-up latency.
  static constexpr std::chrono::microseconds max_active_spin{2000};
  /// Inside an Active region a worker polls for spin_factor × the measured wake-up latency: a gap
  /// it sleeps through then loses at most 1/spin_factor of its length to the wake-up.
  static constexpr unsigned spin_factor = 32;

  /// The polling bound inside an Active region: spin_factor × the wake-up latency measured so far
  /// (moving average), within [spin_time, max_active_spin].
  [[nodiscard]] std::chrono::nanoseconds active_spin() const noexcept {
    const auto wake = std::chrono::nanoseconds(wake_ns_.load(std::memory_order_relaxed));
    return std::clamp<std::chrono::nanoseconds>(wake * spin_factor, spin_time, max_active_spin);
  }

  /// Adds the nanoseconds each parallel_for's caller spends waiting for other threads' chunks
  /// (after its own) to `*sink`; null (the default) reads no clock. For profilers: the caller of
  /// parallel_for must be the only writer of `*sink`.
  void set_wait_sink(std::uint64_t* sink) noexcept { wait_sink_ = sink; }

  /// A pool with one thread per hardware thread, shared by default by the kernels.
  static ThreadPool& shared() {
    static ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
    return pool;
  }

 private:
  // Wakes every worker to see stop_, then joins them (the destructor, and a failed constructor).
  void stop_and_join() noexcept {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    pool_detail::wake(generation_, /*all=*/true);
    for (auto& t : workers_) t.join();
  }

  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Claims and runs chunks of job `job` until none is left (or the job is over).
  void run_chunks(std::uint32_t job) noexcept {
    std::uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
      // A stale tag (the job is over) or no chunk left. chunks_ may already be the next job's
      // then: its caller closed this job's claim word first (parallel_for), so the
      // compare-exchange below fails and the next pass returns.
      if (c >> 32 != job ||
          static_cast<std::uint32_t>(c) >= chunks_.load(std::memory_order_acquire))
        return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
        continue;
      // The chunk is ours: the job cannot end before it is done, so its fields are stable.
      const std::size_t b = begin_ + static_cast<std::uint32_t>(c) * grain_;
      if (!failed_.load(std::memory_order_relaxed)) {
        try {
          fn_(ctx_, b, std::min(end_, b + grain_));
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex_);
          if (!error_) error_ = std::current_exception();
          failed_.store(true, std::memory_order_relaxed);
        }
      }
      if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 ==
              chunks_.load(std::memory_order_relaxed) &&
          caller_sleeps_.load(std::memory_order_seq_cst))
        pool_detail::wake(done_, /*all=*/false);
      c = claim_.load(std::memory_order_acquire);
    }
  }

  // The caller, its own chunks done: polls, then sleeps, until every claimed chunk is done.
  void wait_for_chunks() noexcept {
    const std::uint32_t n = chunks_.load(std::memory_order_relaxed);
    auto all_done = [&] { return done_.load(std::memory_order_acquire) == n; };
    if (all_done()) return;
    const std::int64_t t0 = wait_sink_ ? now_ns() : 0;
    if (!poll_until(spin_time, all_done)) {
      caller_sleeps_.store(true, std::memory_order_seq_cst);
      for (std::uint32_t d = done_.load(std::memory_order_seq_cst); d != n;
           d = done_.load(std::memory_order_seq_cst))
        pool_detail::sleep_while(done_, d, caller_nap);
      caller_sleeps_.store(false, std::memory_order_relaxed);
    }
    if (wait_sink_) *wait_sink_ += static_cast<std::uint64_t>(now_ns() - t0);
  }

  /// Between two clock reads of a poll (64 pauses: a few microseconds), a longer jump is time
  /// the thread was not running: preempted, or its virtual CPU descheduled.
  static constexpr std::chrono::microseconds preempted_jump{50};

  /// Polls `done` for up to `limit` of the thread's running time; true when it held. Time the
  /// thread spent preempted does not count: a worker preempted for a scheduler slice while it
  /// polled would otherwise find its poll over on return and sleep just before the next job,
  /// and waking it costs another slice on a loaded machine.
  template <class Done>
  static bool poll_until(std::chrono::nanoseconds limit, Done&& done) noexcept {
    auto last = std::chrono::steady_clock::now();
    auto until = last + limit;
    for (unsigned i = 0;; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
      if (i % 64 != 63) continue;
      const auto now = std::chrono::steady_clock::now();
      if (now - last > preempted_jump) until += now - last;
      last = now;
      if (now >= until) return done();
    }
  }

  // Inside a team step, and in a single solo step probed amid team steps (the next step needs
  // the workers again), workers poll for active_spin(); otherwise for spin_time.
  [[nodiscard]] std::chrono::nanoseconds idle_spin() const noexcept {
    const bool needed_soon =
        active_.load(std::memory_order_relaxed) > 0 &&
        (!solo_.load(std::memory_order_relaxed) || solo_probe_.load(std::memory_order_relaxed));
    return needed_soon ? active_spin() : std::chrono::nanoseconds(spin_time);
  }

  // A worker woken by a futex: folds how long the wake-up took into the moving average.
  void record_wake_up() noexcept {
    const std::int64_t at = announced_ns_.load(std::memory_order_relaxed);
    const std::int64_t took = now_ns() - at;
    if (at == 0 || took <= 0 || took > 100'000'000) return;  // no announcement, or a stale one
    const std::int64_t old = wake_ns_.load(std::memory_order_relaxed);
    wake_ns_.store(old == 0 ? took : (7 * old + took) / 8, std::memory_order_relaxed);
  }

  /// Least time between two moves of a worker off the caller's CPU: bounds what a scheduler that
  /// keeps putting it back (the other CPUs busy) costs, a migration per this interval at most.
  static constexpr std::chrono::milliseconds move_interval{10};

  // A worker on the CPU the job's caller runs on takes turns with it instead of running beside
  // it: its chunks wait for the caller's slice and its polls take the caller's time. Seen on a
  // 2-vCPU Zen 5 VM: right after another process stopped, the scheduler kept the caller and the
  // worker on one CPU (its load average still counted the stopped process on the other), and a
  // team step ran 3-4 times as long as a solo one for the whole run (bench/RESULTS.md "Thread
  // scaling on Zen 5"). The worker moves itself off that CPU, without pinning itself anywhere.
  void leave_caller_cpu() noexcept {
    const int cpu = pool_detail::current_cpu();
    if (cpu < 0 || cpu != caller_cpu_.load(std::memory_order_relaxed)) return;
    const std::int64_t now = now_ns(), last = moved_ns_.load(std::memory_order_relaxed);
    if (last != 0 && now - last < std::chrono::nanoseconds(move_interval).count()) return;
    moved_ns_.store(now, std::memory_order_relaxed);
    if (pool_detail::move_off_cpu(cpu)) moves_.fetch_add(1, std::memory_order_relaxed);
  }

  void worker_loop() noexcept {
    std::uint32_t seen = 0;
    for (;;) {
      if (!poll_until(idle_spin(),
                      [&] { return generation_.load(std::memory_order_acquire) != seen; })) {
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        while (generation_.load(std::memory_order_seq_cst) == seen)
          pool_detail::sleep_while(generation_, seen, worker_nap);
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
        record_wake_up();
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      leave_caller_cpu();
      run_chunks(seen);
    }
  }

  unsigned threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex error_mutex_;
  std::uint32_t job_ = 0;  ///< number of the last job (caller only)
  /// (job number << 32) | next chunk to claim.
  alignas(64) std::atomic<std::uint64_t> claim_{0};
  alignas(64) std::atomic<std::uint32_t> done_{0};  ///< chunks of the current job finished
  std::atomic<bool> caller_sleeps_{false};
  alignas(64) std::atomic<std::uint32_t> generation_{0};  ///< number of the last job announced
  std::atomic<unsigned> sleeping_{0};                     ///< workers in generation_.wait
  std::atomic<unsigned> active_{0};                       ///< open Active regions
  std::atomic<bool> solo_{false};        ///< this step's jobs run on the caller alone (StepChooser)
  std::atomic<bool> solo_probe_{false};  ///< this step belongs to a probe of solo
  std::atomic<int> caller_cpu_{-1};      ///< the CPU the current job's caller runs on
  std::atomic<std::int64_t> moved_ns_{0};   ///< when a worker last moved off the caller's CPU
  std::atomic<std::uint64_t> moves_{0};     ///< workers' moves off the caller's CPU
  std::atomic<bool> last_step_team_{true};  ///< the last adaptive step ran on all threads
  StepChooser chooser_;  ///< used by the thread that opens adaptive Active regions
  std::atomic<std::int64_t> announced_ns_{0};  ///< when a job last woke sleeping workers
  std::atomic<std::int64_t> wake_ns_{0};       ///< moving average of the wake-up latency
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<std::uint32_t> chunks_{0};
  void (*fn_)(void*, std::size_t, std::size_t) = nullptr;
  void* ctx_ = nullptr;
  std::size_t begin_ = 0, end_ = 0, grain_ = 1;
  std::exception_ptr error_;
  std::uint64_t* wait_sink_ = nullptr;
};

}  // namespace moekit
