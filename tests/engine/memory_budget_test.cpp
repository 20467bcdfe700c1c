// The arithmetic of `--expert-budget auto` (moekit/engine/memory_budget.hpp): what is left of the
// usable memory after the fixed costs and the margin, capped at all experts; the refusal when
// even one token's experts do not fit; the margin; the byte formatter.

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "moekit/engine/memory_budget.hpp"
#include "moekit/error.hpp"
#include "moekit/io/memory_limit.hpp"

namespace memory_budget_test {

using moekit::engine::auto_expert_budget;
using moekit::engine::AutoBudget;
using moekit::engine::AutoBudgetInputs;
using moekit::engine::format_bytes;

constexpr std::uint64_t mib = std::uint64_t{1} << 20;
constexpr std::uint64_t gib = std::uint64_t{1} << 30;

/// A Mixtral-sized run: 12 GiB usable, 4 GiB dense, 46 GiB of experts.
AutoBudgetInputs mixtral_like() {
  AutoBudgetInputs in;
  in.usable_bytes = 12 * gib;
  in.usable_source = "cgroup v1 memory.limit_in_bytes of /x";
  in.dense_bytes = 4 * gib;
  in.kv_cache_bytes = 512 * mib;
  in.io_buffer_bytes = 64 * mib;
  in.other_bytes = 32 * mib;
  in.minimum_expert_bytes = 2 * 336 * mib;
  in.all_resident_expert_bytes = 46 * gib;
  return in;
}

/// The moekit::Error `f` throws (fails the test when it throws none).
template <class F>
moekit::Error error_of(F&& f) {
  try {
    f();
  } catch (const moekit::Error& e) {
    return e;
  }
  FAIL("expected a moekit::Error");
  return moekit::Error(moekit::ErrorKind::internal, "unreachable");
}

TEST_CASE("auto budget: experts get the usable memory less fixed costs and margin",
          "[engine][memory_budget]") {
  const AutoBudgetInputs in = mixtral_like();
  const AutoBudget b = auto_expert_budget(in);
  const std::uint64_t margin = 12 * gib / 20;  // 5% of 12 GiB is above the 256 MiB floor
  CHECK(b.margin_bytes == margin);
  CHECK(b.fixed_bytes == 4 * gib + 512 * mib + 64 * mib + 32 * mib);
  CHECK(b.expert_bytes == 12 * gib - b.fixed_bytes - margin);
  CHECK_FALSE(b.all_resident);
  // Zero terms (staging here) are left out.
  CHECK(b.explanation ==
        "auto: 6.8 GiB of experts (of 46.0 GiB) = 12.0 GiB usable − 4.0 GiB dense − 512.0 MiB "
        "KV cache − 64.0 MiB I/O buffers − 32.0 MiB scratch − 614.4 MiB margin (cgroup v1 "
        "memory.limit_in_bytes of /x)");
}

TEST_CASE("auto budget: every expert when all fit", "[engine][memory_budget]") {
  AutoBudgetInputs in = mixtral_like();
  in.all_resident_expert_bytes = 3 * gib;
  in.staging_bytes = 128 * mib;
  in.usable_source = "MemAvailable";
  const AutoBudget b = auto_expert_budget(in);
  CHECK(b.all_resident);
  CHECK(b.expert_bytes == 3 * gib);
  CHECK(b.explanation ==
        "auto: all experts (3.0 GiB) fit in the 6.7 GiB left of 12.0 GiB usable − 4.0 GiB dense "
        "− 512.0 MiB KV cache − 64.0 MiB I/O buffers − 128.0 MiB staging − 32.0 MiB scratch − "
        "614.4 MiB margin (MemAvailable)");

  SECTION("exactly enough left is all resident; one byte less is not") {
    in.margin = {.fraction = 0, .floor_bytes = 256 * mib};  // not moved by the usable bytes
    in.usable_bytes = b.fixed_bytes + 256 * mib + in.all_resident_expert_bytes;
    const AutoBudget exact = auto_expert_budget(in);
    CHECK(exact.all_resident);
    CHECK(exact.expert_bytes == in.all_resident_expert_bytes);
    in.usable_bytes = *in.usable_bytes - 1;
    const AutoBudget short_by_one = auto_expert_budget(in);
    CHECK_FALSE(short_by_one.all_resident);
    CHECK(short_by_one.expert_bytes == in.all_resident_expert_bytes - 1);
  }
}

TEST_CASE("auto budget: the margin is a share of the usable memory with a floor",
          "[engine][memory_budget]") {
  moekit::engine::BudgetMargin m;  // max(5%, 256 MiB)
  CHECK(m.bytes(64 * gib) == 64 * gib / 20);
  CHECK(m.bytes(2 * gib) == 256 * mib);  // 5% would be 102.4 MiB
  CHECK(m.bytes(0) == 256 * mib);
  CHECK(m.bytes(6 * gib) == 6 * gib / 20);  // 5% rounded down to whole bytes

  AutoBudgetInputs in = mixtral_like();
  in.margin = {.fraction = 0.10, .floor_bytes = 0};
  const AutoBudget b = auto_expert_budget(in);
  CHECK(b.margin_bytes == static_cast<std::uint64_t>(0.10 * static_cast<double>(12 * gib)));
  CHECK(b.expert_bytes == 12 * gib - b.fixed_bytes - b.margin_bytes);

  in.margin = {.fraction = 0, .floor_bytes = 0};
  const AutoBudget none = auto_expert_budget(in);
  CHECK(none.margin_bytes == 0);
  CHECK(none.explanation.find("margin") == std::string::npos);

  in.margin.fraction = 1.0;
  const moekit::Error e = error_of([&] { (void)auto_expert_budget(in); });
  CHECK(e.kind() == moekit::ErrorKind::invalid_argument);
  CHECK_THAT(e.message(), Catch::Contains("margin fraction"));
}

TEST_CASE("auto budget: refused, before loading, with the missing memory and the flag",
          "[engine][memory_budget]") {
  AutoBudgetInputs in = mixtral_like();
  in.usable_bytes = 4 * gib;  // 5% is below the floor: the margin is 256 MiB
  in.kv_cache_bytes = in.io_buffer_bytes = in.other_bytes = 0;
  in.usable_source = "MemAvailable";
  const std::uint64_t needed = 4 * gib + 256 * mib + in.minimum_expert_bytes;

  const moekit::Error e = error_of([&] { (void)auto_expert_budget(in); });
  CHECK(e.kind() == moekit::ErrorKind::invalid_argument);
  CHECK(e.message() ==
        "--expert-budget auto: " + format_bytes(needed - 4 * gib) +
            " of memory missing: this run needs at least 4.9 GiB (672.0 MiB for one token's "
            "experts + 4.0 GiB dense + 256.0 MiB margin) but 4.0 GiB is usable (MemAvailable); "
            "free memory, shorten the context or lower the precision (an explicit "
            "--expert-budget SIZE skips this check)");
  CHECK_THAT(e.message(), Catch::StartsWith("--expert-budget auto: 928.0 MiB of memory missing"));

  SECTION("one byte short is refused; exactly enough runs at the minimum") {
    in.margin = {.fraction = 0, .floor_bytes = 256 * mib};  // the margin must not move with it
    in.usable_bytes = needed - 1;
    CHECK_THAT(error_of([&] { (void)auto_expert_budget(in); }).message(),
               Catch::StartsWith("--expert-budget auto: 1 B of memory missing"));
    in.usable_bytes = needed;
    CHECK(auto_expert_budget(in).expert_bytes == in.minimum_expert_bytes);
  }
  SECTION("fixed costs above the usable memory, and absurd sizes, do not wrap around") {
    in.dense_bytes = UINT64_MAX - 10;
    in.kv_cache_bytes = 100;
    const moekit::Error big = error_of([&] { (void)auto_expert_budget(in); });
    CHECK(big.kind() == moekit::ErrorKind::invalid_argument);
    CHECK_THAT(big.message(), Catch::Contains("of memory missing"));
  }
  SECTION("the flag named is the caller's") {
    in.flag = "--cache";
    CHECK_THAT(error_of([&] { (void)auto_expert_budget(in); }).message(),
               Catch::StartsWith("--cache auto: ") && Catch::Contains("explicit --cache SIZE"));
  }
}

TEST_CASE("auto budget: unknown usable memory and inconsistent inputs are refused",
          "[engine][memory_budget]") {
  AutoBudgetInputs in = mixtral_like();
  in.usable_bytes.reset();
  const moekit::Error unknown = error_of([&] { (void)auto_expert_budget(in); });
  CHECK(unknown.kind() == moekit::ErrorKind::unsupported);
  CHECK_THAT(unknown.message(), Catch::StartsWith("--expert-budget auto: cannot tell") &&
                                    Catch::Contains("--expert-budget 4GiB"));

  in = mixtral_like();
  in.minimum_expert_bytes = 0;
  CHECK(error_of([&] { (void)auto_expert_budget(in); }).kind() ==
        moekit::ErrorKind::invalid_argument);
  in.minimum_expert_bytes = in.all_resident_expert_bytes + 1;
  CHECK(error_of([&] { (void)auto_expert_budget(in); }).kind() ==
        moekit::ErrorKind::invalid_argument);
}

TEST_CASE("auto budget: fed from io::MemoryLimits", "[engine][memory_budget]") {
  moekit::io::MemoryLimits limits;
  limits.mem_available = 20 * gib;
  limits.cgroup =
      moekit::io::CgroupMemory{1, "/mk-test", "memory.limit_in_bytes", 8 * gib, gib, 512 * mib};
  AutoBudgetInputs in = mixtral_like();
  in.usable_bytes = limits.usable_bytes();
  in.usable_source = limits.source();
  const AutoBudget b = auto_expert_budget(in);
  CHECK(b.expert_bytes == 8 * gib - 512 * mib - b.fixed_bytes - b.margin_bytes);
  CHECK_THAT(b.explanation, Catch::Contains("= 7.5 GiB usable − ") &&
                                Catch::EndsWith("(cgroup v1 memory.limit_in_bytes of /mk-test)"));
}

TEST_CASE("auto budget: byte sizes for people", "[engine][memory_budget]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.0 KiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(512 * mib) == "512.0 MiB");
  CHECK(format_bytes(gib - 1) == "1.0 GiB");  // not "1024.0 MiB"
  CHECK(format_bytes(6 * gib + gib / 10) == "6.1 GiB");
  CHECK(format_bytes(UINT64_MAX) == "16.0 EiB");
}

}  // namespace memory_budget_test

namespace memory_budget_test {

TEST_CASE("memory fit: the large allocations against the usable memory, before any is made",
          "[engine][memory_budget]") {
  using moekit::engine::require_memory_fit;
  require_memory_fit(8 * gib, "MemAvailable",
                     {{4 * gib, "KV cache at -c 1000", "-c"}, {2 * gib, "dense weights", ""}});
  require_memory_fit(std::nullopt, "unknown", {{100 * gib, "KV cache at -c 1000", "-c"}});
  const std::string alone = error_of([] {
                              require_memory_fit(8 * gib, "MemAvailable",
                                                 {{77 * gib, "KV cache at -c 100000000", "-c"},
                                                  {1 * gib, "dense weights", ""}});
                            }).message();
  INFO(alone);
  CHECK(alone.find("-c: the KV cache at -c 100000000 (77.0 GiB) does not fit in the 8.0 GiB") !=
        std::string::npos);
  CHECK(alone.find("(MemAvailable)") != std::string::npos);
  CHECK(alone.find("needs at least 78.0 GiB") != std::string::npos);
  CHECK(alone.find("70.0 GiB more") != std::string::npos);
  const std::string together = error_of([] {
                                 require_memory_fit(8 * gib, "ulimit -v (RLIMIT_AS)",
                                                    {{5 * gib, "expert cache", "--expert-budget"},
                                                     {4 * gib, "KV cache at -c 9000", "-c"}});
                               }).message();
  INFO(together);
  CHECK(together.find("--expert-budget: the expert cache (5.0 GiB) with the rest does not fit") !=
        std::string::npos);
}

}  // namespace memory_budget_test
