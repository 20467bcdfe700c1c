#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "io/gguf_builder.hpp"
#include "io/io_test_util.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/safetensors.hpp"
#include "moekit/io/tensor_names.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::GgufBuilder;
using moekit::test::require_error;
using moekit::test::TempDir;

namespace {

constexpr ModelShape small{.n_layers = 2,
                           .n_experts = 2,
                           .top_k = 1,
                           .hidden = 32,
                           .ffn = 64,
                           .n_shared_experts = 1,
                           .shared_ffn = 32};

/// Values that identify (layer, expert, matrix) and vary along the row.
std::vector<float> values(std::uint32_t l, std::uint32_t e, ExpertMatrix m, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    // integers < 256, exact in bf16
    v[i] = static_cast<float>(l * 128 + (e % 10) * 12 + static_cast<unsigned>(m) * 4 + i % 4);
  return v;
}

std::vector<std::uint64_t> hf_shape(ExpertMatrix m, std::uint64_t ffn = small.ffn) {
  return m == ExpertMatrix::down ? std::vector<std::uint64_t>{small.hidden, ffn}
                                 : std::vector<std::uint64_t>{ffn, small.hidden};
}

std::vector<std::byte> as_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("tensor names: Mixtral, Qwen2-MoE and OLMoE in HF and GGUF naming", "[io][names]") {
  using A = Architecture;
  using F = TensorFormat;
  using M = ExpertMatrix;
  CHECK(expert_tensor_name(A::mixtral, F::hugging_face, {3, 5}, M::gate) ==
        "model.layers.3.block_sparse_moe.experts.5.w1.weight");
  CHECK(expert_tensor_name(A::mixtral, F::hugging_face, {3, 5}, M::up) ==
        "model.layers.3.block_sparse_moe.experts.5.w3.weight");
  CHECK(expert_tensor_name(A::mixtral, F::hugging_face, {3, 5}, M::down) ==
        "model.layers.3.block_sparse_moe.experts.5.w2.weight");
  CHECK(expert_tensor_name(A::qwen2_moe, F::hugging_face, {0, 59}, M::gate) ==
        "model.layers.0.mlp.experts.59.gate_proj.weight");
  CHECK(expert_tensor_name(A::olmoe, F::hugging_face, {15, 63}, M::down) ==
        "model.layers.15.mlp.experts.63.down_proj.weight");
  CHECK(expert_tensor_name(A::mixtral, F::gguf, {1, 7}, M::up) == "blk.1.ffn_up.7.weight");
  CHECK(stacked_expert_tensor_name(2, M::gate) == "blk.2.ffn_gate_exps.weight");
  CHECK(stacked_expert_tensor_name(2, M::down) == "blk.2.ffn_down_exps.weight");
  CHECK(router_tensor_name(A::mixtral, F::hugging_face, 4) ==
        "model.layers.4.block_sparse_moe.gate.weight");
  CHECK(router_tensor_name(A::olmoe, F::hugging_face, 4) == "model.layers.4.mlp.gate.weight");
  CHECK(router_tensor_name(A::qwen2_moe, F::gguf, 4) == "blk.4.ffn_gate_inp.weight");
  CHECK(shared_expert_tensor_name(A::qwen2_moe, F::hugging_face, 1, M::up) ==
        "model.layers.1.mlp.shared_expert.up_proj.weight");
  CHECK(shared_expert_tensor_name(A::qwen2_moe, F::gguf, 1, M::down) ==
        "blk.1.ffn_down_shexp.weight");
  CHECK(shared_expert_gate_tensor_name(A::qwen2_moe, F::hugging_face, 1) ==
        "model.layers.1.mlp.shared_expert_gate.weight");
  CHECK(shared_expert_gate_tensor_name(A::qwen2_moe, F::gguf, 1) ==
        "blk.1.ffn_gate_inp_shexp.weight");
  require_error([] { (void)shared_expert_tensor_name(A::mixtral, F::gguf, 0, M::gate); },
                ErrorKind::unsupported, {"mixtral"});
  CHECK(parse_architecture("llama") == A::mixtral);
  CHECK(parse_architecture("qwen2moe") == A::qwen2_moe);
  CHECK(parse_architecture("qwen2_moe") == A::qwen2_moe);
  CHECK(parse_architecture("olmoe") == A::olmoe);
  CHECK_FALSE(parse_architecture("gpt2"));
}

TEST_CASE(
    "tensor names: find an expert's matrices in HF safetensors (Mixtral, OLMoE, Qwen2-MoE shared)",
    "[io][names]") {
  TempDir dir;
  for (Architecture a : {Architecture::mixtral, Architecture::olmoe, Architecture::qwen2_moe}) {
    INFO(name(a));
    SafetensorsWriter w;
    for (std::uint32_t l = 0; l < 2; ++l) {
      for (std::uint32_t e = 0; e < 2; ++e)
        for (ExpertMatrix m : all_expert_matrices)
          w.add(expert_tensor_name(a, TensorFormat::hugging_face, {l, e}, m), DType::bf16,
                hf_shape(m), values(l, e, m, small.ffn * small.hidden));
      if (a == Architecture::qwen2_moe)
        for (ExpertMatrix m : all_expert_matrices)
          w.add(shared_expert_tensor_name(a, TensorFormat::hugging_face, l, m), DType::f32,
                hf_shape(m, small.shared_ffn), values(l, 9, m, small.shared_ffn * small.hidden));
    }
    const auto path = dir.file(std::string(name(a)) + ".safetensors");
    w.write(path);
    SafetensorsFile f(path);
    auto x = find_expert_matrices(f, a, TensorFormat::hugging_face, {1, 1}, small);
    CHECK(x.gate.rows() == small.ffn);
    CHECK(x.down.rows() == small.hidden);
    CHECK(dequantize(x.gate) == values(1, 1, ExpertMatrix::gate, small.ffn * small.hidden));
    CHECK(dequantize(x.up) == values(1, 1, ExpertMatrix::up, small.ffn * small.hidden));
    CHECK(dequantize(x[ExpertMatrix::down]) ==
          values(1, 1, ExpertMatrix::down, small.ffn * small.hidden));
    if (a == Architecture::qwen2_moe) {
      auto s = find_shared_expert_matrices(f, a, TensorFormat::hugging_face, 0, small);
      CHECK(dequantize(s.down) ==
            values(0, 9, ExpertMatrix::down, small.shared_ffn * small.hidden));
    }
    ModelShape wrong = small;
    wrong.ffn = 128;
    require_error(
        [&] {
          (void)find_expert_matrices(f, a, TensorFormat::hugging_face, {0, 0}, wrong);
        },
        ErrorKind::invalid_format, {"does not match the model description", "ffn 128"});
    require_error(
        [&] {
          (void)find_expert_matrices(f, a, TensorFormat::hugging_face, {2, 0});
        },
        ErrorKind::invalid_format, {"no tensor", "layer 2"});
  }
}

TEST_CASE("tensor names: GGUF stacked 3-D experts and per-expert tensors", "[io][names]") {
  TempDir dir;
  GgufBuilder stacked;
  stacked.kv_string("general.architecture", "llama");
  for (ExpertMatrix m : all_expert_matrices) {
    std::vector<float> all;
    for (std::uint32_t e = 0; e < 2; ++e) {
      auto v = values(0, e, m, small.ffn * small.hidden);
      all.insert(all.end(), v.begin(), v.end());
    }
    const auto s = hf_shape(m);
    stacked.tensor(stacked_expert_tensor_name(0, m), {s[1], s[0], 2}, ggml_type::f32,
                   as_bytes(all));
  }
  moekit::test::write_file(dir.file("stacked.gguf"), stacked.bytes());
  GgufFile g(dir.file("stacked.gguf"));
  REQUIRE(parse_architecture(g.architecture()) == Architecture::mixtral);
  auto x = find_expert_matrices(g, Architecture::mixtral, TensorFormat::gguf, {0, 1}, small);
  CHECK(x.gate.rank == 2);
  CHECK(x.gate.rows() == small.ffn);
  CHECK(x.gate.cols() == small.hidden);
  CHECK(x.down.rows() == small.hidden);
  CHECK(dequantize(x.gate) == values(0, 1, ExpertMatrix::gate, small.ffn * small.hidden));
  CHECK(dequantize(x.down) == values(0, 1, ExpertMatrix::down, small.ffn * small.hidden));
  ModelShape three = small;
  three.n_experts = 3;
  require_error(
      [&] {
        (void)find_expert_matrices(g, Architecture::mixtral, TensorFormat::gguf, {0, 0}, three);
      },
      ErrorKind::invalid_format, {"ffn_gate_exps", "2 experts"});

  GgufBuilder per;
  for (std::uint32_t e = 0; e < 2; ++e)
    for (ExpertMatrix m : all_expert_matrices) {
      const auto s = hf_shape(m);
      per.tensor(expert_tensor_name(Architecture::qwen2_moe, TensorFormat::gguf, {1, e}, m),
                 {s[1], s[0]}, ggml_type::f32, as_bytes(values(1, e, m, small.ffn * small.hidden)));
    }
  moekit::test::write_file(dir.file("per.gguf"), per.bytes());
  GgufFile p(dir.file("per.gguf"));
  auto y = find_expert_matrices(p, Architecture::qwen2_moe, TensorFormat::gguf, {1, 0}, small);
  CHECK(dequantize(y.up) == values(1, 0, ExpertMatrix::up, small.ffn * small.hidden));
  require_error(
      [&] {
        (void)find_expert_matrices(p, Architecture::qwen2_moe, TensorFormat::gguf, {0, 0});
      },
      ErrorKind::invalid_format, {"blk.0.ffn_gate.0.weight", "ffn_gate_exps"});
}
