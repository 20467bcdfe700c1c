// HardwareModel: presets agree with the paper numbers they were derived from; the this_machine
// JSON round-trips and every malformed field is reported by name.

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "moekit/core/model_shape.hpp"
#include "moekit/sim/hardware.hpp"

using namespace moekit;
using namespace moekit::sim;

TEST_CASE("every preset validates and is reachable by name", "[sim][hardware]") {
  for (const auto& n : hardware_preset_names()) {
    const HardwareModel h = hardware_preset(n);
    CHECK(h.name == n);
    CHECK_FALSE(h.source.empty());
    CHECK_NOTHROW(h.validate());
  }
  try {
    (void)hardware_preset("rtx9090");
    FAIL();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(e.message().find("rtx4090-pcie4") != std::string::npos);
  }
  CHECK_THROWS_AS(hardware_preset("this_machine"), Error);
}

TEST_CASE("presets reproduce the papers' reference costs", "[sim][hardware]") {
  const ModelShape m = mixtral_8x7b;
  const std::size_t f16 = m.expert_bytes(Precision::f16);
  REQUIRE(f16 == 352'321'536u);
  SECTION("HOBBIT RTX 4090: a layer (8 experts) copies in ~88 ms and computes in ~3 ms") {
    const HardwareModel h = rtx4090_pcie4();
    CHECK(8 * h.transfer_s(f16) == Approx(0.088).epsilon(0.02));
    CHECK(8 * h.device.expert_s(m, Precision::f16, 1) == Approx(3e-3).epsilon(0.05));
    CHECK(h.cpu.expert_s(m, Precision::f16, 1) == Approx(5e-3).epsilon(0.05));
  }
  SECTION("Fiddler Quadro RTX 6000: copy ~50 ms, GPU ~1/10 of it, CPU ~3 ms per token") {
    const HardwareModel h = quadro_rtx6000_pcie3();
    CHECK(h.transfer_s(f16) == Approx(0.050).epsilon(0.01));
    CHECK(h.device.expert_s(m, Precision::f16, 1) / h.transfer_s(f16) == Approx(0.1).epsilon(0.05));
    CHECK(h.cpu.expert_s(m, Precision::f16, 1) == Approx(3e-3).epsilon(0.15));
    // CPU cost grows with tokens, GPU cost barely (Fiddler App. B).
    CHECK(h.cpu.expert_s(m, Precision::f16, 32) > 1.5 * h.cpu.expert_s(m, Precision::f16, 1));
    CHECK(h.device.expert_s(m, Precision::f16, 32) < 1.1 * h.device.expert_s(m, Precision::f16, 1));
  }
  SECTION("HOBBIT Orin: loading dominates (paper: 94.5 % of a layer's time)") {
    const HardwareModel h = jetson_orin_ssd();
    const double load = 2 * h.transfer_s(m.expert_bytes(Precision::q8));
    const double compute =
        2 * h.device.expert_s(m, Precision::q8, 1) + h.dense_layer_s(mixtral_8x7b_dense(), 1);
    CHECK(load / (load + compute) > 0.9);
  }
  SECTION("lower precision is cheaper to move and to run") {
    for (const auto& n : hardware_preset_names()) {
      const HardwareModel h = hardware_preset(n);
      CHECK(h.transfer_s(m.expert_bytes(Precision::q4)) < h.transfer_s(f16));
      CHECK(h.device.expert_s(m, Precision::q4, 1) < h.device.expert_s(m, Precision::f16, 1));
    }
  }
}

TEST_CASE("compute_model matches the processor costs", "[sim][hardware]") {
  const HardwareModel h = rtx3090_pcie3();
  const ModelShape m = mixtral_8x7b;
  const DenseLayerShape dense = mixtral_8x7b_dense();
  // q, k, v, o of Mixtral (4096·4096·2 + 4096·1024·2) plus the 8 × 4096 router.
  CHECK(dense.params == 4096ull * 4096 * 2 + 4096ull * 1024 * 2 + 8 * 4096);
  const ComputeModel c = h.compute_model(m, dense);
  for (Precision p : all_precisions) {
    CHECK(c.device(p, 1) == Approx(h.device.expert_s(m, p, 1)));
    CHECK(c.cpu(p, 7) == Approx(h.cpu.expert_s(m, p, 7)));
  }
  CHECK(c.layer(1) == Approx(h.dense_layer_s(dense, 1)));
  CHECK(c.layer(64) == Approx(h.dense_layer_s(dense, 64)));
  SECTION("a CPU-only machine: the host CPU reads an expert over the link before running it") {
    HardwareModel cpu_only = h;
    cpu_only.host_holds_experts = false;
    const ComputeModel u = cpu_only.compute_model(m, dense);
    for (Precision p : all_precisions)
      CHECK(u.cpu(p, 7) == Approx(h.cpu.expert_s(m, p, 7) + h.transfer_s(m.expert_bytes(p))));
  }
}

TEST_CASE("this_machine JSON round-trips and is validated field by field", "[sim][hardware]") {
  HardwareModel h = rtx4080_pcie4();
  h.name = "this_machine";
  h.cpu.weight_bytes_per_s[static_cast<std::size_t>(Precision::q4)] = 12.5e9;
  const std::string text = serialize_hardware_json(h);
  const HardwareModel back = parse_hardware_json(text, "mem");
  CHECK(back.name == h.name);
  CHECK(back.source == h.source);
  CHECK(back.link.bandwidth_bytes_per_s == h.link.bandwidth_bytes_per_s);
  CHECK(back.link.latency_s == h.link.latency_s);
  CHECK(back.device.weight_bytes_per_s == h.device.weight_bytes_per_s);
  CHECK(back.cpu.weight_bytes_per_s == h.cpu.weight_bytes_per_s);
  CHECK(back.cpu.flops_per_s == h.cpu.flops_per_s);
  CHECK(back.device.call_overhead_s == h.device.call_overhead_s);
  CHECK(back.layer_overhead_s == h.layer_overhead_s);
  CHECK(back.host_holds_experts);
  h.host_holds_experts = false;  // what moe-calibrate writes
  CHECK_FALSE(parse_hardware_json(serialize_hardware_json(h), "mem").host_holds_experts);
  h.host_holds_experts = true;

  const auto path = (std::filesystem::temp_directory_path() /
                     ("moekit-hw-" + std::to_string(::getpid()) + ".json"))
                        .string();
  std::filesystem::remove(path);
  write_hardware_json(h, path);
  CHECK(hardware_preset("this_machine", path).cpu.weight_bytes_per_s == h.cpu.weight_bytes_per_s);
  CHECK_THROWS_AS(write_hardware_json(h, path), Error);
  std::filesystem::remove(path);
  CHECK_THROWS_AS(read_hardware_json(path), Error);

  auto expect_error = [&](const nlohmann::json& j, const std::string& field) {
    try {
      (void)parse_hardware_json(j.dump(), "hw.json");
      FAIL("accepted a document with a bad '" << field << "'");
    } catch (const Error& e) {
      INFO(e.message());
      CHECK(e.kind() == ErrorKind::invalid_format);
      CHECK(e.message().find("hw.json") != std::string::npos);
      CHECK(e.message().find("'" + field + "'") != std::string::npos);
    }
  };
  const nlohmann::json good = nlohmann::json::parse(text);
  auto edit = [&](auto&& f) {
    nlohmann::json j = good;
    f(j);
    return j;
  };
  expect_error(edit([](auto& j) { j["format"] = "x"; }), "format");
  expect_error(edit([](auto& j) { j["version"] = 2; }), "version");
  expect_error(edit([](auto& j) { j.erase("cpu"); }), "cpu");
  expect_error(edit([](auto& j) { j["extra"] = 1; }), "extra");
  expect_error(edit([](auto& j) { j["link"]["bandwidth_bytes_per_s"] = 0; }),
               "link.bandwidth_bytes_per_s");
  expect_error(edit([](auto& j) { j["link"]["latency_s"] = -1; }), "link.latency_s");
  expect_error(edit([](auto& j) { j["device"]["weight_bytes_per_s"].erase("q2"); }),
               "device.weight_bytes_per_s.q2");
  expect_error(edit([](auto& j) { j["cpu"]["weight_bytes_per_s"]["q8"] = "fast"; }),
               "cpu.weight_bytes_per_s.q8");
  expect_error(edit([](auto& j) { j["device"]["flops_per_s"] = -3; }), "device.flops_per_s");
  expect_error(edit([](auto& j) { j["layer_overhead_s"] = nullptr; }), "layer_overhead_s");
  expect_error(edit([](auto& j) { j["name"] = ""; }), "name");
  expect_error(edit([](auto& j) { j["host_holds_experts"] = 1; }), "host_holds_experts");
  CHECK(parse_hardware_json(edit([](auto& j) { j.erase("host_holds_experts"); }).dump(), "old.json")
            .host_holds_experts);  // files written before the key: a host that holds experts
  try {
    (void)parse_hardware_json("{", "hw.json");
    FAIL();
  } catch (const Error& e) {
    CHECK(e.message().find("invalid JSON") != std::string::npos);
  }
}

namespace {
/// `text` changed by `edit` is refused by the reader with an error naming `field`.
template <class Edit>
void expect_rejected(const std::string& text, Edit&& edit, const std::string& field) {
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  try {
    (void)parse_hardware_json(j.dump(), "hw.json");
    FAIL("accepted a document with a bad '" << field << "'");
  } catch (const Error& e) {
    INFO(e.message());
    CHECK(e.message().find("'" + field + "'") != std::string::npos);
  }
}
}  // namespace

TEST_CASE("this_machine JSON: the link's readers, the CPU-only engine and what was timed",
          "[sim][hardware]") {
  HardwareModel h = rtx4080_pcie4();
  h.name = "this_machine";
  h.link.reads_in_flight = 4;
  h.link.read_bandwidth_bytes_per_s = h.link.bandwidth_bytes_per_s / 4;
  h.host_holds_experts = false;
  h.host_is_device = true;
  h.experts_after_all_loads = true;
  TimedKernels t;
  t.threads = 2;
  t.isa = "avx2";
  t.activations[static_cast<std::size_t>(Precision::q4)] = "int8";
  t.layout[static_cast<std::size_t>(Precision::q4)] = "blocked-panels";
  t.activations[static_cast<std::size_t>(Precision::f16)] = "f32";
  t.layout[static_cast<std::size_t>(Precision::f16)] = "rows";
  h.timed = t;
  const std::string text = serialize_hardware_json(h);
  const HardwareModel back = parse_hardware_json(text, "mem");
  CHECK(back.link.reads_in_flight == 4);
  CHECK(back.link.read_bandwidth_bytes_per_s == h.link.read_bandwidth_bytes_per_s);
  CHECK(back.host_is_device);
  CHECK(back.experts_after_all_loads);
  REQUIRE(back.timed);
  CHECK(back.timed->threads == 2);
  CHECK(back.timed->isa == "avx2");
  CHECK(back.timed->activations == t.activations);
  CHECK(back.timed->layout == t.layout);

  // A file without the new keys (written before them) reads as the model it was made for.
  nlohmann::json old = nlohmann::json::parse(text);
  old["link"].erase("reads_in_flight");
  old["link"].erase("read_bandwidth_bytes_per_s");
  old["link"].erase("compute_s_per_byte");
  old.erase("host_is_device");
  old.erase("experts_after_all_loads");
  old.erase("fixed_includes_first_token");
  old.erase("timed");
  const HardwareModel o = parse_hardware_json(old.dump(), "old.json");
  CHECK(o.link.reads_in_flight == 1);
  CHECK(o.link.read_bandwidth_bytes_per_s == 0.0);
  CHECK(o.link.compute_s_per_byte == 0.0);
  CHECK_FALSE(o.host_is_device);
  CHECK_FALSE(o.experts_after_all_loads);
  CHECK_FALSE(o.fixed_includes_first_token);
  CHECK_FALSE(o.timed);

  auto rejects = [&](auto&& f, const std::string& field) { expect_rejected(text, f, field); };
  rejects([](auto& j) { j["link"]["reads_in_flight"] = 0; }, "link.reads_in_flight");
  rejects([](auto& j) { j["link"]["reads_in_flight"] = 1.5; }, "link.reads_in_flight");
  rejects([](auto& j) { j["link"]["read_bandwidth_bytes_per_s"] = 1e300; },
          "link.read_bandwidth_bytes_per_s");
  rejects([](auto& j) { j["host_is_device"] = "yes"; }, "host_is_device");
  rejects([](auto& j) { j["experts_after_all_loads"] = 0; }, "experts_after_all_loads");
  rejects([](auto& j) { j["fixed_includes_first_token"] = 1; }, "fixed_includes_first_token");
  rejects([](auto& j) { j["timed"]["activations"]["q3"] = "int8"; }, "timed.activations.q3");
  rejects([](auto& j) { j["timed"]["layout"]["q4"] = ""; }, "timed.layout.q4");
  rejects([](auto& j) { j["timed"].erase("threads"); }, "timed.threads");
}

TEST_CASE("this_machine JSON: the expert store's read path beside the checkpoint's",
          "[sim][hardware][paths]") {
  HardwareModel h = rtx4080_pcie4();
  h.link.reads_in_flight = 4;
  h.link.store = ReadPath{.bandwidth_bytes_per_s = 1.5e9,
                          .latency_s = 2e-4,
                          .reads_in_flight = 2,
                          .read_bandwidth_bytes_per_s = 0.9e9,
                          .compute_s_per_byte = 3e-11};
  h.link.compute_s_per_byte = 1e-11;
  h.link.in_place = Precision::q4;
  h.link.disk_bandwidth_bytes_per_s = 2.2e9;
  const std::string text = serialize_hardware_json(h);
  const HardwareModel back = parse_hardware_json(text, "mem");
  REQUIRE(back.link.store);
  CHECK(back.link.store->bandwidth_bytes_per_s == 1.5e9);
  CHECK(back.link.store->latency_s == 2e-4);
  CHECK(back.link.store->reads_in_flight == 2);
  CHECK(back.link.store->read_bandwidth_bytes_per_s == 0.9e9);
  CHECK(back.link.store->compute_s_per_byte == 3e-11);
  CHECK(back.link.compute_s_per_byte == 1e-11);
  CHECK(back.link.in_place == Precision::q4);
  CHECK(back.link.disk_bandwidth_bytes_per_s == 2.2e9);
  // The path a precision takes decides its transfer time in the cost models too.
  CHECK(back.link.transfer_s(1500, Precision::q2) == Approx(2e-4 + 1e-6));
  CHECK(back.link.transfer_s(1500, Precision::q4) == back.link.transfer_s(1500));

  auto rejects = [&](auto&& f, const std::string& field) { expect_rejected(text, f, field); };
  rejects([](auto& j) { j["link"].erase("in_place"); }, "link.in_place");
  rejects([](auto& j) { j["link"]["in_place"] = "q3"; }, "link.in_place");
  rejects([](auto& j) { j["link"]["store"]["reads_in_flight"] = 0; }, "link.store.reads_in_flight");
  rejects([](auto& j) { j["link"]["store"]["extra"] = 1; }, "link.store.extra");
  rejects([](auto& j) { j["link"]["store"]["read_bandwidth_bytes_per_s"] = 2e9; },
          "link.store.read_bandwidth_bytes_per_s");
  rejects([](auto& j) { j["link"]["store"]["compute_s_per_byte"] = -1e-12; },
          "link.store.compute_s_per_byte");
  rejects([](auto& j) { j["link"]["compute_s_per_byte"] = 0.5; }, "link.compute_s_per_byte");
  rejects(
      [](auto& j) {
        j["link"].erase("store");
        j["link"].erase("disk_bandwidth_bytes_per_s");
      },
      "link.in_place");
}

TEST_CASE("compute_model: a CPU-only machine runs host experts in line, after their reads",
          "[sim][hardware]") {
  const ModelShape& s = mixtral_8x7b;
  const DenseLayerShape dense = mixtral_8x7b_dense();
  HardwareModel h = rtx4080_pcie4();
  h.host_holds_experts = false;
  const auto q4 = static_cast<std::size_t>(Precision::q4);
  // A GPU machine whose host does not hold the experts: the CPU side pays the transfer itself.
  const ComputeModel gpu = h.compute_model(s, dense);
  CHECK(gpu.cpu_beside_device);
  CHECK_FALSE(gpu.cpu_reads_over_link);
  CHECK_FALSE(gpu.experts_after_all_loads);
  CHECK(gpu.cpu_expert_s[q4] ==
        h.cpu.fixed_s(s, Precision::q4) + h.link.transfer_s(s.expert_bytes(Precision::q4)));
  h.host_is_device = true;
  h.experts_after_all_loads = true;
  const ComputeModel cpu_only = h.compute_model(s, dense);
  CHECK_FALSE(cpu_only.cpu_beside_device);
  CHECK(cpu_only.cpu_reads_over_link);  // the SimLoader reads them; the CPU time is compute only
  CHECK(cpu_only.experts_after_all_loads);
  CHECK(cpu_only.cpu_expert_s[q4] == h.cpu.fixed_s(s, Precision::q4));
  h.host_holds_experts = true;
  CHECK_FALSE(h.compute_model(s, dense).cpu_reads_over_link);

  // fixed_includes_first_token: a one-token call costs the fixed part, n tokens n − 1 slopes more.
  CHECK(cpu_only.device(Precision::q4, 1) ==
        cpu_only.device_expert_s[q4] + cpu_only.device_expert_token_s[q4]);
  h.fixed_includes_first_token = true;
  const ComputeModel first = h.compute_model(s, dense);
  CHECK(first.device(Precision::q4, 1) == first.device_expert_s[q4]);
  CHECK(first.device(Precision::q4, 3) ==
        first.device_expert_s[q4] + 2 * first.device_expert_token_s[q4]);
  CHECK(first.layer(1) == first.layer_s);
  CHECK(first.cpu(Precision::q4, 0) == first.cpu_expert_s[q4]);
  CHECK(parse_hardware_json(serialize_hardware_json(h), "mem").fixed_includes_first_token);
}

TEST_CASE("solo: one-token calls at the decode blend of all-thread and one-thread rates",
          "[sim][hardware]") {
  const ModelShape& s = mixtral_8x7b;
  const DenseLayerShape dense{mixtral_8x7b_dense().params, Precision::q4};
  HardwareModel h = rtx4080_pcie4();
  h.host_holds_experts = false;
  h.host_is_device = true;
  h.experts_after_all_loads = true;
  h.fixed_includes_first_token = true;
  h.cpu = h.device;
  const auto q4 = static_cast<std::size_t>(Precision::q4);
  const ComputeModel team = h.compute_model(s, dense);
  CHECK_FALSE(team.one_token);

  ProcessorModel one = h.device;
  for (double& r : one.weight_bytes_per_s) r /= 2;  // one thread streams at half the rate
  h.solo = one;
  // Without a fraction below 1 the solo rates change nothing.
  CHECK_FALSE(h.compute_model(s, dense).one_token);

  h.decode_team_fraction = 0.25;
  const ComputeModel m = h.compute_model(s, dense);
  REQUIRE(m.one_token);
  const double team_q4 = team.device_expert_s[q4], solo_q4 = one.fixed_s(s, Precision::q4);
  CHECK(solo_q4 > team_q4);
  CHECK(m.device(Precision::q4, 1) == Approx(0.25 * team_q4 + 0.75 * solo_q4));
  CHECK(m.cpu(Precision::q4, 1) == Approx(0.25 * team_q4 + 0.75 * solo_q4));  // same cores
  const double solo_dense =
      h.layer_overhead_s +
      double(matrix_bytes(1, dense.params, dense.precision)) / one.weight_bytes_per_s[q4];
  CHECK(m.layer(1) == Approx(0.25 * team.layer_s + 0.75 * solo_dense));
  // Batches (prefill) keep the all-thread costs.
  CHECK(m.device(Precision::q4, 4) == team.device(Precision::q4, 4));
  CHECK(m.layer(4) == team.layer(4));

  // A separate device (GPU): the host CPU's experts keep their own costs.
  h.host_is_device = false;
  CHECK(h.compute_model(s, dense).cpu(Precision::q4, 1) ==
        team.cpu_expert_s[q4] + h.link.transfer_s(s.expert_bytes(Precision::q4)));

  // JSON: round-trips; a file without the keys has no solo; the fraction needs solo, in [0, 1].
  h.host_is_device = true;
  const std::string text = serialize_hardware_json(h);
  const HardwareModel back = parse_hardware_json(text, "mem");
  REQUIRE(back.solo);
  CHECK(back.solo->weight_bytes_per_s == one.weight_bytes_per_s);
  CHECK(back.decode_team_fraction == 0.25);
  nlohmann::json old = nlohmann::json::parse(text);
  old.erase("solo");
  old.erase("decode_team_fraction");
  const HardwareModel o = parse_hardware_json(old.dump(), "old.json");
  CHECK_FALSE(o.solo);
  CHECK(o.decode_team_fraction == 1.0);
  auto rejects = [&](auto&& f, const std::string& field) { expect_rejected(text, f, field); };
  rejects([](auto& j) { j["decode_team_fraction"] = 1.5; }, "decode_team_fraction");
  rejects([](auto& j) { j["decode_team_fraction"] = -0.1; }, "decode_team_fraction");
  rejects([](auto& j) { j.erase("solo"); }, "decode_team_fraction");
  rejects([](auto& j) { j["solo"]["weight_bytes_per_s"]["q4"] = 0; }, "solo.weight_bytes_per_s.q4");
}
