#pragma once
/// \file BackgroundTask: one thread that runs one task at a time for its owner, who starts a task,
/// does other work, then waits for it (and gets its exception). What a reader needs to keep the
/// disk busy while it converts what it read last.

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "moekit/error.hpp"

namespace moekit::io::detail {

class BackgroundTask {
 public:
  BackgroundTask() : thread_(start_thread()) {}
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;
  ~BackgroundTask() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // a task still running ends first
  }

  /// Starts `task` on the thread; the previous one must have been waited for.
  void start(std::function<void()> task) {
    {
      std::lock_guard lock(m_);
      task_ = std::move(task);
      busy_ = true;
    }
    cv_.notify_all();
  }

  /// Blocks until the started task ends; rethrows its exception. Returns at once when none runs.
  void wait() {
    std::exception_ptr error;
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return !busy_; });
      error = std::exchange(error_, nullptr);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  std::thread start_thread() {
    try {
      return std::thread([this] { loop(); });
    } catch (const std::system_error& e) {
      throw Error(ErrorKind::io,
                  std::string("cannot start a read-ahead thread (") + e.what() +
                      "): too many threads for this process's limits (ulimit -u, ulimit -v, cgroup "
                      "pids.max); use fewer --io-threads");
    }
  }

  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (busy_ && task_); });
      if (stop_ && !busy_) return;
      auto task = std::exchange(task_, nullptr);
      lock.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = std::move(error);
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> task_;  // guarded by m_
  std::exception_ptr error_;    // guarded by m_
  bool busy_ = false;           // guarded by m_: a task started and not yet ended
  bool stop_ = false;           // guarded by m_
  std::thread thread_;          // last: starts once the rest exists
};

}  // namespace moekit::io::detail
