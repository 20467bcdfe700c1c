// The per-layer path allocates nothing once warm: a global operator new counts allocations.
// AddressSanitizer owns operator new/delete (its runtime's allocations would reach our free()), so
// under ASan this file registers no test; the release suite runs it.
#if defined(__SANITIZE_ADDRESS__)
#define MOEKIT_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOEKIT_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef MOEKIT_COUNT_ALLOCATIONS
#define MOEKIT_COUNT_ALLOCATIONS 1
#endif

#if MOEKIT_COUNT_ALLOCATIONS
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "moekit/io/memory_loader.hpp"
#include "moekit/presets.hpp"
#include "support/routing.hpp"

namespace {
std::atomic<std::size_t> g_allocations{0};
}

void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  ++g_allocations;
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace moekit;

TEST_CASE("OffloadPipeline's per-layer path allocates nothing after warm-up", "[core][pipeline]") {
  constexpr ModelShape shape{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 32, .ffn = 64};
  const std::size_t bytes = shape.expert_bytes(Precision::f16);
  std::vector<std::byte> host(bytes, std::byte{7});
  MemoryLoader loader([&](ExpertKey, Precision) { return std::span<const std::byte>(host); });
  presets::Baseline<MemoryLoader> p(shape, {.expert_budget_bytes = 6 * bytes}, std::move(loader));

  // A routing sequence that cycles through all experts so evictions happen every token.
  std::vector<test::Route> routes;
  for (std::uint32_t t = 0; t < 16; ++t)
    routes.push_back(test::Route(8, {{t % 8, (t * 3 + 1) % 8}}));
  auto run_token = [&](std::uint32_t t) {
    for (std::uint32_t l = 0; l < shape.n_layers; ++l) {
      const LayerContext c{l, shape.n_layers, t, Phase::decode, 0, 1};
      const auto& plan = p.route(c, routes[(t + l) % routes.size()].view());
      (void)p.resolve(plan);
      p.end_layer(c);
    }
    (void)p.end_token({});
  };
  p.begin_sequence();
  for (std::uint32_t t = 0; t < 32; ++t) run_token(t);  // warm-up
  const std::size_t before = g_allocations.load();
  for (std::uint32_t t = 32; t < 96; ++t) run_token(t);
  const std::size_t after = g_allocations.load();
  CHECK(after - before == 0);
  CHECK(p.stats().cache.evictions > 50);  // the measured window really evicted

  // The same through the scoped per-layer handle (LayerCall).
  const std::uint64_t evictions = p.stats().cache.evictions;
  const std::size_t scoped_before = g_allocations.load();
  for (std::uint32_t t = 96; t < 160; ++t) {
    for (std::uint32_t l = 0; l < shape.n_layers; ++l) {
      const LayerContext c{l, shape.n_layers, t, Phase::decode, 0, 1};
      auto call = p.layer(c, routes[(t + l) % routes.size()].view());
      (void)call.resolve();
    }
    (void)p.end_token({});
  }
  CHECK(g_allocations.load() - scoped_before == 0);
  CHECK(p.stats().cache.evictions > evictions + 50);
}
#endif  // MOEKIT_COUNT_ALLOCATIONS
