#pragma once
/// \file ThreadPool: a fixed set of worker threads that run `parallel_for` over index ranges.
///
/// Made for kernels called thousands of times per second: a call allocates nothing (the job is a
/// function pointer plus a pointer to the caller's callable), and the calling thread works too.
/// Between jobs a worker polls for the next one for up to `spin_time` before it sleeps on an
/// atomic generation counter, and the caller polls for the workers' end the same way: a decode
/// step runs hundreds of small jobs back to back, and waking a sleeping thread (a futex round
/// trip, 10-30 µs on this VM) cost more than a small job (moe-run on the default model ran no
/// faster on two threads than on one). A job is only announced with a system call when a worker
/// sleeps. Chunks of `grain` indices are claimed from a shared atomic counter, so a worker slowed
/// by a busy core takes fewer chunks. One job runs at a time; concurrent callers are serialised.
/// Exceptions thrown by the body are rethrown in the caller (the first one wins).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace moekit {

/// Fixed-size pool of `threads − 1` workers plus the calling thread.
class ThreadPool {
 public:
  /// `threads` ≥ 1 threads in total, counting the caller of `parallel_for`.
  explicit ThreadPool(unsigned threads) : threads_(threads) {
    MOEKIT_EXPECTS(threads >= 1 && threads <= 1024, "ThreadPool: threads must be in [1, 1024]");
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
  }

  /// Threads that run a job, the caller included.
  [[nodiscard]] unsigned size() const noexcept { return threads_; }

  /// Calls `body(b, e)` on disjoint sub-ranges [b, e) covering [begin, end), each at most `grain`
  /// long, on all threads; returns when all are done. `body` must be safe to call concurrently.
  /// Not re-entrant: calling it from inside a job of the same pool deadlocks.
  template <class Body>
  void parallel_for(std::size_t begin, std::size_t end, std::size_t grain, Body&& body) {
    if (begin >= end) return;
    grain = std::max<std::size_t>(grain, 1);
    using B = std::remove_reference_t<Body>;
    if (threads_ == 1 || end - begin <= grain) {
      for (std::size_t b = begin; b < end; b += grain) body(b, std::min(end, b + grain));
      return;
    }
    std::lock_guard<std::mutex> one_job(call_mutex_);
    fn_ = [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<B*>(ctx))(b, e); };
    ctx_ = const_cast<void*>(static_cast<const void*>(&body));
    begin_ = begin;
    end_ = end;
    grain_ = grain;
    next_.store(begin, std::memory_order_relaxed);
    error_ = nullptr;
    busy_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
    // seq_cst with the sleepers' count (worker_loop): either a worker about to sleep sees the new
    // generation, or this sees it counted and wakes it.
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    run_chunks();
    poll_until([&] { return busy_.load(std::memory_order_acquire) == 0; });
    for (unsigned left = busy_.load(std::memory_order_acquire); left != 0;
         left = busy_.load(std::memory_order_acquire))
      busy_.wait(left, std::memory_order_acquire);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// How long an idle thread polls for the next job (a worker) or for the workers' end (the
  /// caller) before sleeping.
  static constexpr std::chrono::microseconds spin_time{50};

  /// A pool with one thread per hardware thread, shared by default by the kernels.
  static ThreadPool& shared() {
    static ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
    return pool;
  }

 private:
  void run_chunks() noexcept {
    for (;;) {
      const std::size_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
      if (b >= end_) return;
      try {
        fn_(ctx_, b, std::min(end_, b + grain_));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(end_, std::memory_order_relaxed);  // stop handing out chunks
      }
    }
  }

  /// Polls `done` for up to spin_time; true when it held.
  template <class Done>
  static bool poll_until(Done&& done) noexcept {
    const auto until = std::chrono::steady_clock::now() + spin_time;
    for (unsigned i = 0;; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
      if (i % 64 == 63 && std::chrono::steady_clock::now() >= until) return done();
    }
  }

  void worker_loop() noexcept {
    std::uint64_t seen = 0;
    for (;;) {
      if (!poll_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        generation_.wait(seen, std::memory_order_seq_cst);
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      run_chunks();
      if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_.notify_one();
    }
  }

  unsigned threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex error_mutex_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<unsigned> busy_{0};
  std::atomic<unsigned> sleeping_{0};  ///< workers in generation_.wait
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> next_{0};
  void (*fn_)(void*, std::size_t, std::size_t) = nullptr;
  void* ctx_ = nullptr;
  std::size_t begin_ = 0, end_ = 0, grain_ = 1;
  std::exception_ptr error_;
};

}  // namespace moekit
