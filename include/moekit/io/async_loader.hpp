#pragma once
/// \file AsyncLoader: moves experts from a byte source into caller memory on a pool of I/O
/// threads; a model of moekit's Loader concept.
///
/// - `submit(LoadRequest)` → LoadTicket. Requests wait in two Boost.Lockfree queues; I/O threads
///   always drain the on-demand queue before the prefetch queue.
/// - At most `Config::max_outstanding` loads exist at once (slots); `submit` blocks while all are
///   taken (a bounded queue), reclaiming finished loads nobody waited on first.
/// - `cancel(ticket)` withdraws a queued (not started) prefetch; on-demand loads and started loads
///   are never cancelled.
/// - `poll(ticket)` → done?; `wait(ticket)` blocks until done and rethrows the load's error.
///   A ticket is finished with once waited on; waiting again (or on a ticket of a load that was
///   cancelled or reclaimed) returns at once. Failed loads keep their slot until waited on.
/// - Optional bandwidth cap (TokenBucket) paced per `throttle_chunk` bytes, and XXH64 verification
///   of every loaded blob (on by default: a flipped byte, a store overwritten while it is read or
///   a wrong manifest is an error naming the file, layer, expert and precision, not changed text).
///   Each I/O thread hands the pieces it reads to a verifier thread of its own, which hashes them
///   and finishes the load while the I/O thread reads the next blob; the cost is measured by
///   moekit_bench_loader_throughput.
/// Blobs are located by a callback `(ExpertKey, Precision) → StoreBlob` (an ExpertStore's `blob`).

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/lockfree/queue.hpp>

#include "moekit/core/concepts.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/checksum.hpp"
#include "moekit/io/detail/bytes.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/token_bucket.hpp"

namespace moekit::io {

/// Finds the blob of an expert at a precision (throws when absent).
using BlobLocator = std::function<StoreBlob(ExpertKey, Precision)>;

/// The next piece a verifying loader reads of a blob with `left` bytes to read: 3/4 of them (a
/// multiple of 4096), so that its hash, several times faster than the read, ends while the rest
/// is read, but at least `tail`; all of them when that is at most `tail` (or `tail` is 0).
[[nodiscard]] inline std::uint64_t verify_piece(std::uint64_t left, std::uint64_t tail) noexcept {
  if (tail == 0 || left <= tail) return left;
  return std::max<std::uint64_t>(tail, left / 4 * 3 / 4096 * 4096);
}

/// Asynchronous loader over a ByteSource. Thread-safe: any thread may submit, poll, wait, cancel.
template <ByteSource Source>
class AsyncLoader {
 public:
  static constexpr std::string_view name = "async";
  struct Config {
    unsigned io_threads = 2;                ///< I/O threads (≈ reads in flight across blobs)
    std::size_t max_outstanding = 256;      ///< slots: loads submitted and not yet finished with
    double bandwidth_bytes_per_s = 0;       ///< 0: no cap; else a token bucket paces the reads
    std::size_t throttle_chunk = 1u << 20;  ///< bytes per paced read (multiple of 4096)
    bool verify_checksums = true;           ///< XXH64-check every loaded blob
    /// Verifying, a blob is read in a few pieces, each 3/4 of what is left, down to this many
    /// bytes (a multiple of 4096); each is hashed on a thread of its own while the next is read,
    /// so a load waits for the hash of its last piece only; 0: one read, hashed after it. Either
    /// way the I/O thread reads the next blob while a hash ends. 8 MiB: a q4 expert in 2 pieces,
    /// f16 in 3 (2 MiB, 3 and 4 pieces, cost q4 throughput: bench/RESULTS.md, "Verifying blobs on
    /// load").
    std::size_t verify_tail = 8u << 20;
  };

  AsyncLoader(Source source, BlobLocator locate, Config config)
      : source_(std::move(source)),
        locate_(std::move(locate)),
        config_(config),
        slots_(config.max_outstanding),
        on_demand_(config.max_outstanding),
        prefetch_(config.max_outstanding) {
    MOEKIT_EXPECTS(config.io_threads >= 1, "AsyncLoader: io_threads must be >= 1");
    MOEKIT_EXPECTS(config.max_outstanding >= 1 && config.max_outstanding < (1u << 31),
                   "AsyncLoader: max_outstanding must be in [1, 2^31)");
    MOEKIT_EXPECTS(config.throttle_chunk >= 4096 && config.throttle_chunk % 4096 == 0,
                   "AsyncLoader: throttle_chunk must be a positive multiple of 4096");
    MOEKIT_EXPECTS(config.verify_tail % 4096 == 0,
                   "AsyncLoader: verify_tail must be a multiple of 4096");
    MOEKIT_EXPECTS(config.bandwidth_bytes_per_s >= 0,
                   "AsyncLoader: bandwidth_bytes_per_s must be >= 0");
    if (config.bandwidth_bytes_per_s > 0)
      bucket_.emplace(config.bandwidth_bytes_per_s, static_cast<double>(config.throttle_chunk));
    for (std::size_t i = slots_.size(); i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
    if (config.verify_checksums)
      for (unsigned t = 0; t < config.io_threads; ++t)
        verifiers_.push_back(std::make_unique<Verifier>(*this));
    for (unsigned t = 0; t < config.io_threads; ++t) threads_.emplace_back([this, t] { run(t); });
  }

  /// A loader over an expert store's blobs.
  AsyncLoader(const ExpertStore& store, Source source, Config config)
      : AsyncLoader(
            std::move(source), [&store](ExpertKey k, Precision p) { return store.blob(k, p); },
            config) {}

  AsyncLoader(const AsyncLoader&) = delete;
  AsyncLoader& operator=(const AsyncLoader&) = delete;

  /// Cancels queued loads, finishes the running ones, joins the threads.
  ~AsyncLoader() {
    stopping_.store(true);
    for (auto& s : slots_) {
      std::uint32_t q = queued;
      s.state.compare_exchange_strong(q, cancelled);
    }
    ready_.release(static_cast<std::ptrdiff_t>(threads_.size()));
    for (auto& t : threads_) t.join();
    verifiers_.clear();  // each finishes the loads it was handed
  }

  /// Queues `r`; blocks while `max_outstanding` loads are outstanding. Throws
  /// `Error(invalid_argument)` when the blob is unknown or `r.dest` is too small.
  LoadTicket submit(const LoadRequest& r) {
    const StoreBlob blob = locate_(r.key, r.precision);
    if (r.dest.size() < blob.bytes)
      throw Error(
          ErrorKind::invalid_argument,
          "AsyncLoader: destination of " + std::to_string(r.dest.size()) + " bytes for layer " +
              std::to_string(r.key.layer) + ", expert " + std::to_string(r.key.expert) + " at " +
              std::string(moekit::name(r.precision)) + " needs " + std::to_string(blob.bytes));
    std::uint32_t idx;
    std::uint32_t gen;
    {
      std::unique_lock lock(m_);
      slot_freed_.wait(lock, [&] { return !free_.empty() || reclaim_one(); });
      idx = free_.back();
      free_.pop_back();
      Slot& s = slots_[idx];
      gen = ++s.generation;
      s.request = r;
      s.blob = blob;
      s.error = nullptr;
      s.state.store(queued, std::memory_order_release);
    }
    auto& q = r.priority == LoadPriority::on_demand ? on_demand_ : prefetch_;
    while (!q.push(idx)) std::this_thread::yield();  // cannot fail: capacity = slots
    ready_.release();
    return LoadTicket{(std::uint64_t{gen} << 32) | (idx + 1)};
  }

  /// True when the load is finished (done, failed or cancelled) or the ticket is finished with.
  bool poll(LoadTicket t) {
    std::lock_guard lock(m_);
    Slot* s = slot_of(t);
    if (s == nullptr) return true;
    const auto st = s->state.load(std::memory_order_acquire);
    return st == done || st == failed || st == cancelled;
  }

  /// Blocks until the load finishes; rethrows its error. Finishes with the ticket.
  void wait(LoadTicket t) {
    Slot* s;
    {
      std::lock_guard lock(m_);
      s = slot_of(t);
      if (s == nullptr) return;
      ++s->waiters;  // keeps the slot from being reclaimed while we sleep on it
    }
    for (auto st = s->state.load(std::memory_order_acquire); st == queued || st == running;
         st = s->state.load(std::memory_order_acquire))
      s->state.wait(st, std::memory_order_acquire);
    std::exception_ptr error;
    {
      std::lock_guard lock(m_);
      --s->waiters;
      if (slot_of(t) != s) return;  // finished with already
      error = s->error;
      // The last waiter finishes with the slot; a cancelled slot is freed once the worker has
      // popped it from its queue (sweep_cancelled).
      if (s->state.load(std::memory_order_acquire) == cancelled)
        sweep_cancelled();
      else if (s->waiters == 0)
        release_slot(*s);
    }
    if (error) std::rethrow_exception(error);
  }

  /// Withdraws a queued prefetch; false when the load is on-demand, started or finished.
  bool cancel(LoadTicket t) {
    std::lock_guard lock(m_);
    Slot* s = slot_of(t);
    if (s == nullptr || s->request.priority != LoadPriority::prefetch) return false;
    std::uint32_t q = queued;
    if (!s->state.compare_exchange_strong(q, cancelled, std::memory_order_acq_rel)) return false;
    s->state.notify_all();
    return true;
  }

  [[nodiscard]] const Source& source() const noexcept { return source_; }
  [[nodiscard]] const Config& config() const noexcept { return config_; }
  /// Bytes read so far (all loads).
  [[nodiscard]] std::uint64_t bytes_loaded() const noexcept { return bytes_loaded_.load(); }

 private:
  enum : std::uint32_t { free_state = 0, queued, running, done, failed, cancelled };

  struct Slot {
    std::atomic<std::uint32_t> state{free_state};
    std::uint32_t generation = 0;    // guarded by m_
    std::uint32_t waiters = 0;       // guarded by m_
    std::uint64_t finished_seq = 0;  // guarded by m_: order of completion, for reclaiming
    LoadRequest request{};
    StoreBlob blob{};
    std::exception_ptr error;
  };

  // Requires m_. The slot a ticket names, or nullptr when it has been finished with.
  Slot* slot_of(LoadTicket t) {
    const std::uint64_t idx1 = t.id & 0xFFFFFFFFu;
    if (idx1 == 0 || idx1 > slots_.size()) return nullptr;
    Slot& s = slots_[idx1 - 1];
    if (s.generation != static_cast<std::uint32_t>(t.id >> 32) ||
        s.state.load(std::memory_order_acquire) == free_state)
      return nullptr;
    return &s;
  }

  // Requires m_.
  void release_slot(Slot& s) {
    s.state.store(free_state, std::memory_order_release);
    s.request = {};
    s.error = nullptr;
    free_.push_back(static_cast<std::uint32_t>(&s - slots_.data()));
    slot_freed_.notify_one();
  }

  // Requires m_. Frees the oldest successfully finished load nobody is waiting on.
  bool reclaim_one() {
    Slot* best = nullptr;
    for (auto& s : slots_)
      if (s.waiters == 0 && s.state.load(std::memory_order_acquire) == done &&
          (best == nullptr || s.finished_seq < best->finished_seq))
        best = &s;
    if (best == nullptr) return false;
    release_slot(*best);
    return true;
  }

  // Hashes the blobs one I/O thread reads, on a thread of its own, and finishes their loads: the
  // I/O thread hands over each blob's pieces in order as they are read (`begin`, `ready`, `end`)
  // and goes on to read the next blob while the hash of this one ends, so the disk never waits
  // for a hash (bench/RESULTS.md, "Verifying blobs on load"). At most two loads are unfinished
  // per verifier (one read, one hashed): `begin` waits for the one before the last.
  class Verifier {
   public:
    explicit Verifier(AsyncLoader& owner) : owner_(owner), thread_([this] { work(); }) {}
    Verifier(const Verifier&) = delete;
    Verifier& operator=(const Verifier&) = delete;
    /// Finishes every load handed over (their reads have ended), then stops.
    ~Verifier() {
      {
        std::lock_guard lock(m_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }

    /// A load whose blob will be read into `bytes`.
    void begin(Slot& s, std::span<const std::byte> bytes) {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return jobs_.size() < 2; });
      jobs_.push_back(Job{&s, bytes, 0, false, nullptr});
    }
    /// The blob's bytes [0, upto) are in place.
    void ready(std::uint64_t upto) {
      {
        std::lock_guard lock(m_);
        jobs_.back().ready = upto;
      }
      cv_.notify_all();
    }
    /// The read has ended: every byte is in place, or it failed with `error`.
    void end(std::exception_ptr error) {
      {
        std::lock_guard lock(m_);
        jobs_.back().ended = true;
        jobs_.back().error = std::move(error);
      }
      cv_.notify_all();
    }

   private:
    struct Job {
      Slot* slot;
      std::span<const std::byte> bytes;
      std::uint64_t ready = 0;  // bytes in place (a prefix)
      bool ended = false;
      std::exception_ptr error;
    };

    void work() {
      Xxh64 h;
      std::uint64_t hashed = 0;  // of the first job
      std::unique_lock lock(m_);
      for (;;) {
        cv_.wait(lock, [&] {
          return (stop_ && jobs_.empty()) ||
                 (!jobs_.empty() && (jobs_.front().ready > hashed || jobs_.front().ended));
        });
        if (jobs_.empty()) return;
        Job& j = jobs_.front();  // a deque's push_back leaves references to it valid
        if (j.ready > hashed && !j.error) {
          const auto piece = j.bytes.subspan(hashed, j.ready - hashed);
          lock.unlock();
          h.update(piece);
          lock.lock();
          hashed += piece.size();
          continue;
        }
        Job finished = std::move(j);
        jobs_.pop_front();
        const std::uint64_t digest = h.digest();
        h.reset();
        hashed = 0;
        lock.unlock();
        cv_.notify_all();  // begin may go on
        owner_.finish_verified(*finished.slot, std::move(finished.error), digest);
        lock.lock();
      }
    }

    AsyncLoader& owner_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;  // guarded by m_; front: the load being hashed
    bool stop_ = false;     // guarded by m_
    std::thread thread_;    // last: starts once the rest exists
  };

  void run(unsigned thread_index) {
    for (;;) {
      ready_.acquire();
      std::uint32_t idx;
      if (!on_demand_.pop(idx) && !prefetch_.pop(idx)) {
        if (stopping_.load()) return;
        continue;
      }
      Slot& s = slots_[idx];
      std::uint32_t q = queued;
      if (!s.state.compare_exchange_strong(q, running, std::memory_order_acq_rel)) {
        std::lock_guard lock(m_);  // cancelled while queued: free it now
        if (s.waiters == 0)
          release_slot(s);
        else
          finish_cancelled_later_.push_back(idx);
        continue;
      }
      if (config_.verify_checksums) {
        read_verified(s, *verifiers_[thread_index]);  // the verifier finishes the load
        continue;
      }
      std::exception_ptr error;
      try {
        read_range(s.blob, s.request.dest, 0, s.blob.bytes);
        bytes_loaded_.fetch_add(s.blob.bytes, std::memory_order_relaxed);
      } catch (...) {
        error = std::current_exception();
      }
      finish(s, std::move(error));
    }
  }

  // Marks a started load done (or failed with `error`) and wakes its waiters.
  void finish(Slot& s, std::exception_ptr error) {
    {
      std::lock_guard lock(m_);
      const std::uint32_t outcome = error ? failed : done;
      // Moved, not copied: this thread keeps no reference, so the error is destroyed by the
      // thread that consumes it (a copy released here, after the waiter rethrew and dropped
      // its own, freed the exception on this thread: a race TSan cannot see through
      // libstdc++'s reference count).
      s.error = std::move(error);
      s.finished_seq = ++finished_counter_;
      s.state.store(outcome, std::memory_order_release);
      slot_freed_.notify_all();  // a finished load can be reclaimed
      sweep_cancelled();
    }
    s.state.notify_all();
  }

  // Requires m_: frees cancelled slots whose waiters have left.
  void sweep_cancelled() {
    for (std::size_t i = 0; i < finish_cancelled_later_.size();) {
      Slot& c = slots_[finish_cancelled_later_[i]];
      if (c.waiters == 0) {
        release_slot(c);
        finish_cancelled_later_[i] = finish_cancelled_later_.back();
        finish_cancelled_later_.pop_back();
      } else {
        ++i;
      }
    }
  }

  // Reads [from, from + n) of blob `b` into `dest` at the same offset, paced when capped.
  void read_range(const StoreBlob& b, std::span<std::byte> dest, std::uint64_t from,
                  std::uint64_t n) {
    if (!bucket_) {
      source_.read({b.offset + from, n}, dest.subspan(from));
      return;
    }
    for (std::uint64_t done_bytes = 0; done_bytes < n;) {
      const std::uint64_t m = std::min<std::uint64_t>(config_.throttle_chunk, n - done_bytes);
      bucket_->acquire(m);
      source_.read({b.offset + from + done_bytes, m}, dest.subspan(from + done_bytes));
      done_bytes += m;
    }
  }

  // Reads the blob of a started load in pieces (verify_piece) and hands each to `v` as it is in;
  // `v` hashes it while the next is read, and finishes the load while this thread goes on to the
  // next one.
  void read_verified(Slot& s, Verifier& v) {
    const StoreBlob& b = s.blob;
    const std::span<std::byte> dest = s.request.dest;
    v.begin(s, dest.first(b.bytes));
    std::exception_ptr error;
    try {
      for (std::uint64_t from = 0; from < b.bytes;) {
        const std::uint64_t n = verify_piece(b.bytes - from, config_.verify_tail);
        read_range(b, dest, from, n);
        from += n;
        v.ready(from);
      }
      bytes_loaded_.fetch_add(b.bytes, std::memory_order_relaxed);
    } catch (...) {
      error = std::current_exception();
    }
    v.end(std::move(error));
  }

  // Called by a Verifier with a read's digest (or its read error): finishes the load.
  void finish_verified(Slot& s, std::exception_ptr error, std::uint64_t got) {
    const StoreBlob& b = s.blob;
    const LoadRequest& r = s.request;
    if (!error && got != b.checksum)
      error = std::make_exception_ptr(
          Error(ErrorKind::checksum,
                "'" + std::string(source_.name()) + "': blob (layer " +
                    std::to_string(r.key.layer) + ", expert " + std::to_string(r.key.expert) +
                    ", " + std::string(moekit::name(r.precision)) + ") at offset " +
                    std::to_string(b.offset) + " loaded with XXH64 " + detail::hex64(got) +
                    ", expected " + detail::hex64(b.checksum) +
                    ": the file is damaged or changed since it was written (rebuild it)"));
    finish(s, std::move(error));
  }

  Source source_;
  BlobLocator locate_;
  Config config_;
  std::optional<TokenBucket> bucket_;
  std::vector<Slot> slots_;
  std::mutex m_;
  std::condition_variable slot_freed_;
  std::vector<std::uint32_t> free_;                    // guarded by m_
  std::vector<std::uint32_t> finish_cancelled_later_;  // guarded by m_
  std::uint64_t finished_counter_ = 0;                 // guarded by m_
  boost::lockfree::queue<std::uint32_t> on_demand_;
  boost::lockfree::queue<std::uint32_t> prefetch_;
  std::counting_semaphore<> ready_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> bytes_loaded_{0};
  std::vector<std::unique_ptr<Verifier>> verifiers_;  // one per I/O thread, when verifying
  std::vector<std::thread> threads_;
};

static_assert(Loader<AsyncLoader<MemorySource>>, "AsyncLoader must model moekit::Loader");

}  // namespace moekit::io
