// The memory bound of decode with every expert resident (issue 21, point 2): the bytes one decode
// token must read from memory — every dense matrix (attention, shared experts, routers, norms, the
// LM head; of the embeddings one row) plus top-k experts in every MoE layer, at their bytes in the
// GGUF file — against the streaming read of this machine measured in the same run, on the same
// threads, over buffers of that size. Prints one JSON line; bench/scale/run.sh divides each
// engine's resident decode speed by `bound_tokens_per_s` ("fraction of the memory bound").
//
//   moekit_bench_decode_bound FILE.gguf [--threads 2] [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cold_read.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/error.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/precision/thread_pool.hpp"

namespace {

struct TokenBytes {
  std::uint64_t dense = 0;    // read by every token (the embeddings' one row included)
  std::uint64_t experts = 0;  // top-k experts of every MoE layer
};

// Bytes a decode token reads with every expert resident, from the file's tensor sizes.
TokenBytes token_bytes(const moekit::io::GgufFile& g) {
  using namespace moekit::engine;
  const ModelConfig cfg = gguf_config(g);
  const moekit::ModelShape s = cfg.shape();
  const auto experts = locate_checkpoint_experts(cfg, {}, &g);
  if (!experts)
    throw moekit::Error(moekit::ErrorKind::unsupported,
                        g.path() + ": its experts' type has no in-place path");
  const std::uint64_t all_expert_bytes = experts->stored_bytes();
  TokenBytes b;
  for (const auto& t : g.tensors()) {
    if (t.name == "token_embd.weight")
      b.dense += t.bytes / std::max<std::uint64_t>(t.dims[0], 1);
    else
      b.dense += t.bytes;
  }
  b.dense -= all_expert_bytes;
  b.experts = all_expert_bytes / s.expert_count() * s.top_k * s.n_layers;
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: moekit_bench_decode_bound FILE.gguf [--threads N] [--reps N]\n");
    return 2;
  }
  unsigned threads = 2, reps = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view f = argv[i];
    if (f == "--threads")
      threads = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else if (f == "--reps")
      reps = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "moekit_bench_decode_bound: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    const moekit::io::GgufFile g(argv[1]);
    const TokenBytes b = token_bytes(g);
    const std::uint64_t per_token = b.dense + b.experts;
    moekit::ThreadPool pool(threads);
    // Two buffers of a token's bytes (at most 1 GiB each: the rate is what is measured), read in
    // turn: larger than any cache, as decode's weights are.
    const std::uint64_t buffer = std::min<std::uint64_t>(per_token, std::uint64_t{1} << 30);
    moekit::bench::ColdRead read(pool, buffer, 2);
    std::vector<double> secs;
    for (unsigned r = 0; r < reps + 1; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      read(r, /*quarters=*/true);
      if (r > 0)  // the first pass faults the pages in
        secs.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double rate = double(buffer) / moekit::bench::median(secs);
    nlohmann::json j{{"model", argv[1]},
                     {"threads", threads},
                     {"dense_bytes_per_token", b.dense},
                     {"expert_bytes_per_token", b.experts},
                     {"bytes_per_token", per_token},
                     {"read_bytes_per_s", rate},
                     {"bound_tokens_per_s", rate / double(per_token)}};
    std::printf("%s\n", j.dump().c_str());
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit_bench_decode_bound: %s\n", e.message().c_str());
    return 1;
  }
  return 0;
}
