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
///   a wrong manifest is an error naming the file, layer, expert and precision, not changed text;
///   its cost is measured by moekit_bench_loader_throughput).
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
    /// With verification, a blob is read in pieces of at most this many bytes (a multiple of
    /// 4096), each hashed on a thread of its own while the next is read. Pieces halve towards the
    /// end of the blob (down to 1 MiB): large reads keep the disk busy, and the check costs only
    /// the hash of the last, small piece (bench/RESULTS.md, "Verifying blobs on load").
    std::size_t verify_chunk = 32u << 20;
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
    MOEKIT_EXPECTS(config.bandwidth_bytes_per_s >= 0,
                   "AsyncLoader: bandwidth_bytes_per_s must be >= 0");
    MOEKIT_EXPECTS(config.verify_chunk >= 4096 && config.verify_chunk % 4096 == 0,
                   "AsyncLoader: verify_chunk must be a positive multiple of 4096");
    if (config.bandwidth_bytes_per_s > 0)
      bucket_.emplace(config.bandwidth_bytes_per_s, static_cast<double>(config.throttle_chunk));
    for (std::size_t i = slots_.size(); i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
    if (config.verify_checksums)
      for (unsigned t = 0; t < config.io_threads; ++t)
        hashers_.push_back(std::make_unique<ChunkHasher>());
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

  // Hashes the pieces of one blob, in order, on a thread of its own: `hash` hands it a piece (after
  // `wait` returned for the previous one), the I/O thread reads the next meanwhile.
  class ChunkHasher {
   public:
    ChunkHasher() : thread_([this] { work(); }) {}
    ChunkHasher(const ChunkHasher&) = delete;
    ChunkHasher& operator=(const ChunkHasher&) = delete;
    ~ChunkHasher() {
      stop_.store(true);
      ready_.release();
      thread_.join();
    }
    void reset() noexcept { h_.reset(); }
    void hash(std::span<const std::byte> piece) {
      piece_ = piece;
      busy_ = true;
      ready_.release();
    }
    void wait() {
      if (!busy_) return;
      done_.acquire();
      busy_ = false;
    }
    [[nodiscard]] std::uint64_t digest() const noexcept { return h_.digest(); }

   private:
    void work() {
      for (;;) {
        ready_.acquire();
        if (stop_.load()) return;
        h_.update(piece_);
        done_.release();
      }
    }
    Xxh64 h_;
    std::span<const std::byte> piece_;
    bool busy_ = false;  // used by the I/O thread only
    std::binary_semaphore ready_{0}, done_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;  // last: starts once the rest exists
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
      std::exception_ptr error;
      try {
        load(s.request, s.blob, thread_index);
      } catch (...) {
        error = std::current_exception();
      }
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

  // The next piece of a blob with `left` bytes to read: half of them (the hash of a piece, several
  // times faster than the read, ends while the next half is read), between 1 MiB and
  // verify_chunk, a multiple of 4096; all of them when that is at most 1 MiB.
  [[nodiscard]] std::uint64_t next_piece(std::uint64_t left) const noexcept {
    constexpr std::uint64_t smallest = 1u << 20;
    if (left <= smallest) return left;
    const std::uint64_t half = (left / 2) / 4096 * 4096;
    return std::min<std::uint64_t>(config_.verify_chunk, std::max(half, smallest));
  }

  // The blob read piece by piece, each piece hashed while the next is read; its XXH64.
  std::uint64_t read_hashed(const StoreBlob& b, std::span<std::byte> dest, ChunkHasher& hasher) {
    hasher.reset();
    try {
      for (std::uint64_t from = 0, n = 0; from < b.bytes; from += n) {
        n = next_piece(b.bytes - from);
        read_range(b, dest, from, n);
        hasher.wait();
        hasher.hash(dest.subspan(from, n));
      }
    } catch (...) {
      hasher.wait();  // never leave it reading a buffer the caller may free
      throw;
    }
    hasher.wait();
    return hasher.digest();
  }

  void load(const LoadRequest& r, const StoreBlob& b, unsigned thread_index) {
    std::span<std::byte> dest = r.dest;
    std::uint64_t got = 0;
    if (!config_.verify_checksums)
      read_range(b, dest, 0, b.bytes);
    else if (b.bytes <= (2u << 20)) {  // small: hashed after the read
      read_range(b, dest, 0, b.bytes);
      got = xxh64(dest.first(b.bytes));
    } else {
      got = read_hashed(b, dest, *hashers_[thread_index]);
    }
    bytes_loaded_.fetch_add(b.bytes, std::memory_order_relaxed);
    if (config_.verify_checksums) {
      if (got != b.checksum)
        throw Error(ErrorKind::checksum,
                    "'" + std::string(source_.name()) + "': blob (layer " +
                        std::to_string(r.key.layer) + ", expert " + std::to_string(r.key.expert) +
                        ", " + std::string(moekit::name(r.precision)) + ") at offset " +
                        std::to_string(b.offset) + " loaded with XXH64 " + detail::hex64(got) +
                        ", expected " + detail::hex64(b.checksum) +
                        ": the file is damaged or changed since it was written (rebuild it)");
    }
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
  std::vector<std::unique_ptr<ChunkHasher>> hashers_;  // one per I/O thread, when verifying
  std::vector<std::thread> threads_;
};

static_assert(Loader<AsyncLoader<MemorySource>>, "AsyncLoader must model moekit::Loader");

}  // namespace moekit::io
