// ThreadPool: every index exactly once, many consecutive jobs, jobs that find the workers
// polling or asleep, exceptions reach the caller.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/thread_pool.hpp"

using namespace moekit;

TEST_CASE("parallel_for covers every index exactly once", "[precision][thread_pool]") {
  for (unsigned threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t grain : {1u, 3u, 64u, 5000u}) {
      std::vector<std::atomic<int>> hits(1000);
      std::atomic<bool> too_long{false};  // Catch assertions are not thread-safe: record, check after
      pool.parallel_for(7, 1000, grain, [&](std::size_t b, std::size_t e) {
        if (e - b > grain) too_long = true;
        for (std::size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      CHECK_FALSE(too_long.load());
      for (std::size_t i = 0; i < 1000; ++i) REQUIRE(hits[i].load() == (i >= 7 ? 1 : 0));
    }
  }
}

TEST_CASE("many short jobs in a row all complete", "[precision][thread_pool]") {
  ThreadPool pool(3);
  std::atomic<long> sum{0};
  for (int job = 0; job < 2000; ++job)
    pool.parallel_for(0, 64, 4, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) sum.fetch_add(static_cast<long>(i));
    });
  CHECK(sum.load() == 2000L * (63 * 64 / 2));
}

TEST_CASE("jobs after idle gaps shorter and longer than the polling time reach every worker",
          "[precision][thread_pool]") {
  // Gaps around ThreadPool::spin_time: a job arrives while the workers poll, just as they give
  // up, or after they sleep; each must be taken by every worker (no lost wake-up), which the
  // body checks by waiting until all threads have joined the job.
  ThreadPool pool(3);
  const auto spin = ThreadPool::spin_time;
  const std::chrono::microseconds gaps[] = {std::chrono::microseconds(0), spin / 2, spin, spin * 2,
                                            spin * 20};
  for (int round = 0; round < 40; ++round) {
    std::this_thread::sleep_for(gaps[round % 5]);
    std::atomic<unsigned> arrived{0};
    std::atomic<bool> all_came{true};
    pool.parallel_for(0, 3, 1, [&](std::size_t, std::size_t) {
      arrived.fetch_add(1);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived.load() < 3)  // every index held until the three threads are in the job
        if (std::chrono::steady_clock::now() > give_up) {
          all_came = false;
          break;
        }
    });
    INFO("round " << round);
    REQUIRE(all_came.load());
  }
}

TEST_CASE("an exception in the body reaches the caller and the pool stays usable",
          "[precision][thread_pool]") {
  ThreadPool pool(2);
  CHECK_THROWS_WITH(pool.parallel_for(0, 100, 1,
                                      [](std::size_t b, std::size_t) {
                                        if (b == 50) throw std::runtime_error("boom at 50");
                                      }),
                    "boom at 50");
  std::atomic<int> n{0};
  pool.parallel_for(0, 10, 1, [&](std::size_t b, std::size_t e) { n += static_cast<int>(e - b); });
  CHECK(n.load() == 10);
  CHECK_THROWS_AS(ThreadPool(0), Error);
}
