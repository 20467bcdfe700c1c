#pragma once
/// \file The arithmetic of `--expert-budget auto`: the expert cache gets what is left of the
/// usable memory after the parts of a run that do not shrink with the budget (dense weights, KV
/// cache, I/O and staging buffers, scratch) and a safety margin, and never more than all
/// experts. A machine where even the smallest budget does not fit is refused before anything is
/// loaded, with how much memory is missing.
///
/// The usable memory comes from `io::read_memory_limits()` (moekit/io/memory_limit.hpp), read
/// before the model is loaded:
///
///     const moekit::io::MemoryLimits limits = moekit::io::read_memory_limits();
///     const moekit::engine::AutoBudget b = moekit::engine::auto_expert_budget(
///         {.usable_bytes = limits.usable_bytes(), .usable_source = limits.source(),
///          .dense_bytes = dense, .kv_cache_bytes = kv, .io_buffer_bytes = loader_slots,
///          .minimum_expert_bytes = min_budget, .all_resident_expert_bytes = all_experts});
///     std::fprintf(stderr, "%s\n", b.explanation.c_str());  // then run with b.expert_bytes

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "moekit/error.hpp"

namespace moekit::engine {

/// `bytes` for people: "512 B", "12.0 KiB", "6.1 GiB" (powers of 1024, one decimal).
/// (moekit had no formatter of sizes; moe-run's parser of them is in examples/moe-run/cli.hpp.)
inline std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  std::size_t u = 0;
  // 1023.95 would print as "1024.0": move to the next unit instead.
  while (v >= 1023.95 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", v, units[u]);
  return text;
}

/// Memory held back from the expert budget: max(fraction × usable, floor).
///
/// Why: the usable memory is a snapshot (other processes allocate after it is read) and the
/// fixed costs are estimates; beyond them a run pays allocator slack, thread stacks, page
/// tables, its code and libraries, and kernel memory charged to its cgroup. Running out means
/// the kernel kills the process mid-run, while a budget a little small costs a few more expert
/// loads. The fraction covers what grows with the machine and the model (estimation error,
/// fragmentation); the floor covers what does not (code, stacks, thread pools, I/O rings), which
/// dominates on small machines.
struct BudgetMargin {
  double fraction = 0.05;                                ///< of the usable memory, in [0, 1)
  std::uint64_t floor_bytes = std::uint64_t{256} << 20;  ///< at least this much

  [[nodiscard]] std::uint64_t bytes(std::uint64_t usable) const noexcept {
    const double share = std::floor(fraction * static_cast<double>(usable));
    // 2^64 and above do not convert (a usable size near 2^64 can round up to it).
    const std::uint64_t bytes = share < 0x1p64 ? static_cast<std::uint64_t>(share) : UINT64_MAX;
    return std::max(floor_bytes, bytes);
  }
};

/// The memory a run may use and what it needs besides its expert cache, all in bytes.
struct AutoBudgetInputs {
  /// `io::MemoryLimits::usable_bytes()` read before loading; nullopt when the system did not
  /// tell (then `auto` is refused and the flag's explicit form is asked for).
  std::optional<std::uint64_t> usable_bytes;
  std::string usable_source;          ///< `io::MemoryLimits::source()`: "MemAvailable", ...
  std::uint64_t dense_bytes = 0;      ///< dense weights at the dense precision they are held at
  std::uint64_t kv_cache_bytes = 0;   ///< KV cache at the context length
  std::uint64_t io_buffer_bytes = 0;  ///< the expert loader's buffers (O_DIRECT slots, rings)
  std::uint64_t staging_bytes = 0;    ///< staging slots beyond the expert budget
  std::uint64_t other_bytes = 0;      ///< activations, scratch, logits
  BudgetMargin margin{};
  /// The smallest budget the pipeline accepts: one token's top-k experts of a layer at the run
  /// precision (moe-run: `minimum_expert_budget`). Staging is not part of it: `staging_bytes`.
  std::uint64_t minimum_expert_bytes = 0;
  /// Every routed expert resident at the run precision: no budget above this helps.
  std::uint64_t all_resident_expert_bytes = 0;
  std::string flag = "--expert-budget";  ///< the flag messages name
};

/// The budget `auto` resolves to.
struct AutoBudget {
  std::uint64_t expert_bytes = 0;  ///< the expert budget
  bool all_resident = false;       ///< every expert fits (`expert_bytes` is all of them)
  std::uint64_t fixed_bytes = 0;   ///< dense + KV + I/O buffers + staging + other
  std::uint64_t margin_bytes = 0;
  /// One line for the log: "auto: 6.1 GiB of experts (of 46.0 GiB) = 11.8 GiB usable −
  /// 4.2 GiB dense − ... (cgroup v1 memory.limit_in_bytes of /x)".
  std::string explanation;
};

namespace budget_detail {

/// a + b, saturating: absurd inputs must not wrap around into a large budget.
constexpr std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/// Dense + KV + I/O buffers + staging + other.
inline std::uint64_t fixed_run_bytes(const AutoBudgetInputs& in) noexcept {
  std::uint64_t sum = 0;
  for (std::uint64_t b :
       {in.dense_bytes, in.kv_cache_bytes, in.io_buffer_bytes, in.staging_bytes, in.other_bytes})
    sum = saturating_add(sum, b);
  return sum;
}

/// " − 4.2 GiB dense − 512.0 MiB KV ..." (with `sep` for " − "), leaving out zero terms.
inline std::string cost_terms(const AutoBudgetInputs& in, std::uint64_t margin, const char* sep) {
  const std::pair<std::uint64_t, const char*> terms[] = {
      {in.dense_bytes, "dense"},           {in.kv_cache_bytes, "KV cache"},
      {in.io_buffer_bytes, "I/O buffers"}, {in.staging_bytes, "staging"},
      {in.other_bytes, "scratch"},         {margin, "margin"}};
  std::string out;
  for (const auto& [bytes, what] : terms)
    if (bytes != 0) out += sep + format_bytes(bytes) + " " + what;
  return out;
}

}  // namespace budget_detail

/// Resolves `auto`: min(all experts, usable − fixed costs − margin). Throws
/// `Error(invalid_argument)` naming `in.flag` with the missing bytes when that is below
/// `minimum_expert_bytes`, `Error(unsupported)` when the usable memory is unknown, and
/// `Error(invalid_argument)` for inconsistent inputs.
inline AutoBudget auto_expert_budget(const AutoBudgetInputs& in) {
  MOEKIT_EXPECTS(in.margin.fraction >= 0 && in.margin.fraction < 1,
                 "auto_expert_budget: the margin fraction must be in [0, 1)");
  MOEKIT_EXPECTS(
      in.minimum_expert_bytes > 0 && in.minimum_expert_bytes <= in.all_resident_expert_bytes,
      "auto_expert_budget: need 0 < minimum expert bytes <= all-resident bytes");
  const std::string source = in.usable_source.empty() ? "" : " (" + in.usable_source + ")";
  if (!in.usable_bytes)
    throw Error(ErrorKind::unsupported,
                in.flag +
                    " auto: cannot tell how much memory this process may use (no memory "
                    "cgroup limit and no MemAvailable in /proc/meminfo); give a size, e.g. " +
                    in.flag + " 4GiB");
  const std::uint64_t usable = *in.usable_bytes;
  AutoBudget out;
  out.fixed_bytes = budget_detail::fixed_run_bytes(in);
  out.margin_bytes = in.margin.bytes(usable);
  const std::uint64_t held = budget_detail::saturating_add(out.fixed_bytes, out.margin_bytes);
  const std::uint64_t needed = budget_detail::saturating_add(held, in.minimum_expert_bytes);
  if (usable < needed)
    throw Error(ErrorKind::invalid_argument,
                in.flag + " auto: " + format_bytes(needed - usable) +
                    " of memory missing: this run needs at least " + format_bytes(needed) + " (" +
                    format_bytes(in.minimum_expert_bytes) + " for one token's experts" +
                    budget_detail::cost_terms(in, out.margin_bytes, " + ") + ") but " +
                    format_bytes(usable) + " is usable" + source +
                    "; free memory, shorten the context or lower the precision (an explicit " +
                    in.flag + " SIZE skips this check)");
  const std::uint64_t left = usable - held;
  const std::string equation =
      format_bytes(usable) + " usable" + budget_detail::cost_terms(in, out.margin_bytes, " − ");
  out.all_resident = left >= in.all_resident_expert_bytes;
  out.expert_bytes = std::min(left, in.all_resident_expert_bytes);
  out.explanation = out.all_resident
                        ? "auto: all experts (" + format_bytes(out.expert_bytes) + ") fit in the " +
                              format_bytes(left) + " left of " + equation + source
                        : "auto: " + format_bytes(out.expert_bytes) + " of experts (of " +
                              format_bytes(in.all_resident_expert_bytes) + ") = " + equation +
                              source;
  return out;
}

/// One large allocation a run makes, for `require_memory_fit`.
struct MemoryCost {
  std::uint64_t bytes = 0;
  std::string what;  ///< "KV cache at -c 100000"
  std::string flag;  ///< what lowers it: "-c", "--expert-budget", "" when nothing does
};

/// Refuses a run whose large allocations (KV cache, dense weights, expert budget, buffers) add up
/// to more than `usable` (io::MemoryLimits::usable_bytes(), read before loading), before any of
/// them is made: `Error(invalid_argument)` saying how much is missing, each cost, and which does
/// not fit on its own or is the largest, with the flag that lowers it. An unknown `usable` checks
/// nothing. No margin is held back (unlike `auto_expert_budget`): the sizes are lower bounds, so
/// a refusal is certain to be right, and an explicit size is the user's word.
///
/// Why: `-c 100000000` once zero-filled a 77 GB KV cache until the kernel killed the process
/// after a minute of thrashing a shared machine; with an address-space cap it was a bare
/// std::bad_alloc.
inline void require_memory_fit(std::optional<std::uint64_t> usable, const std::string& source,
                               std::initializer_list<MemoryCost> costs) {
  if (!usable) return;
  std::uint64_t total = 0;
  const MemoryCost* largest = nullptr;
  std::string terms;
  for (const MemoryCost& c : costs) {
    if (c.bytes == 0) continue;
    total = budget_detail::saturating_add(total, c.bytes);
    if (!largest || c.bytes > largest->bytes) largest = &c;
    terms += (terms.empty() ? "" : " + ") + format_bytes(c.bytes) + " " + c.what;
  }
  if (total <= *usable) return;
  const bool alone = largest->bytes > *usable;
  throw Error(ErrorKind::invalid_argument,
              (largest->flag.empty() ? std::string("memory") : largest->flag) + ": the " +
                  largest->what + " (" + format_bytes(largest->bytes) + ") " +
                  (alone ? "does not fit" : "with the rest does not fit") + " in the " +
                  format_bytes(*usable) + " this process may use" +
                  (source.empty() ? "" : " (" + source + ")") + ": this run needs at least " +
                  format_bytes(total) + " (" + terms + "), " + format_bytes(total - *usable) +
                  " more; nothing was allocated");
}

}  // namespace moekit::engine
