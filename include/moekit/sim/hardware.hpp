#pragma once
/// \file HardwareModel: the machine a replay pretends to run on — the link that brings experts
/// into the cache, and how fast the device and the host CPU run an expert and a layer's dense part.
///
/// Cost model (per call over n tokens, the form `ComputeModel` in replay.hpp uses):
///   expert on a processor P at precision p:  P.call_overhead_s + bytes(p) /
///   P.weight_bytes_per_s[p]
///                                            + n · 2·params / P.flops_per_s
///   dense part of a layer (router + attention projections, on the device):
///                                            layer_overhead_s + dense bytes / device rate
///                                            + n · 2·dense params / device.flops_per_s
///   transfer of b bytes over the link:       link.latency_s + b / link.bandwidth_bytes_per_s
/// The fixed term is the weight read a call pays once (memory-bound GEMV at batch 1); the per-token
/// term is the arithmetic that grows with the batch (prefill). Attention over the KV cache is not
/// modelled (it is small next to expert I/O at the sequence lengths of the papers).
///
/// Presets for the machines of the papers (design/papers/*.md). Every number says where it comes
/// from: [paper] a paper states it, [derived] computed from paper numbers, [vendor] the maker's
/// spec sheet, [choice] our assumption (an efficiency factor or an unreported quantity).
/// `this_machine` is read from a JSON file written by a calibration command (schema below).

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// One executor (a GPU, or the host CPU) in the linear cost model of the file comment.
struct ProcessorModel {
  /// Effective rate at which a batch-1 expert call streams its weights, per stored precision
  /// (index = `Precision` value; quantized formats include their dequantization cost).
  std::array<double, precision_count> weight_bytes_per_s{};
  double flops_per_s = 0;      ///< effective matmul throughput for the per-token term
  double call_overhead_s = 0;  ///< fixed cost per expert call (kernel launch, thread wake-up)

  /// Same rate for every precision.
  [[nodiscard]] static ProcessorModel uniform(double bytes_per_s, double flops, double overhead) {
    ProcessorModel p;
    p.weight_bytes_per_s.fill(bytes_per_s);
    p.flops_per_s = flops;
    p.call_overhead_s = overhead;
    return p;
  }
  /// Throws `moekit::Error` naming `what` and the bad field.
  void validate(std::string_view what) const {
    auto positive = [](double v) { return v > 0 && std::isfinite(v); };
    for (std::size_t i = 0; i < precision_count; ++i)
      MOEKIT_EXPECTS(positive(weight_bytes_per_s[i]), std::string(what) + ".weight_bytes_per_s." +
                                                          std::string(name(all_precisions[i])) +
                                                          " must be finite and > 0");
    MOEKIT_EXPECTS(positive(flops_per_s),
                   std::string(what) + ".flops_per_s must be finite and > 0");
    MOEKIT_EXPECTS(call_overhead_s >= 0 && std::isfinite(call_overhead_s),
                   std::string(what) + ".call_overhead_s must be finite and >= 0");
  }
  /// Seconds to run one expert of `shape` stored at `p` over `n_tokens` tokens.
  [[nodiscard]] double expert_s(const ModelShape& shape, Precision p,
                                std::uint32_t n_tokens) const noexcept {
    if (p == Precision::skip) return 0.0;
    return fixed_s(shape, p) + per_token_s(shape) * n_tokens;
  }
  [[nodiscard]] double fixed_s(const ModelShape& shape, Precision p) const noexcept {
    return call_overhead_s +
           double(shape.expert_bytes(p)) / weight_bytes_per_s[static_cast<std::size_t>(p)];
  }
  [[nodiscard]] double per_token_s(const ModelShape& shape) const noexcept {
    return 2.0 * 3.0 * double(shape.hidden) * double(shape.ffn) / flops_per_s;
  }
};

/// The non-expert weights of one layer that every token passes through (attention projections,
/// router, shared experts), as parameter count and storage precision.
struct DenseLayerShape {
  std::uint64_t params = 0;
  Precision precision = Precision::bf16;

  /// q, k, v, o projections of grouped-query attention plus the router (n_experts × hidden) and
  /// the shared experts of `shape`.
  [[nodiscard]] static DenseLayerShape from(const ModelShape& shape, std::uint32_t n_heads,
                                            std::uint32_t n_kv_heads, std::uint32_t head_dim,
                                            Precision p = Precision::bf16) {
    const std::uint64_t d = shape.hidden;
    const std::uint64_t attn = d * n_heads * head_dim * 2 + d * n_kv_heads * head_dim * 2;
    const std::uint64_t shared = std::uint64_t{shape.n_shared_experts} * 3 * d * shape.shared_ffn;
    return {attn + std::uint64_t{shape.n_experts} * d + shared, p};
  }
};

/// Mixtral-8x7B's dense layer: 32 heads, 8 KV heads, head_dim 128 (public HF config).
inline DenseLayerShape mixtral_8x7b_dense() {
  return DenseLayerShape::from(mixtral_8x7b, 32, 8, 128);
}

/// What a calibration timed for the processors' rates: per stored precision, the activation type
/// ("f32", "int8", "bf16") and the matrix order ("rows", "panels", "blocked-panels") of the kernel
/// run, on `threads` threads with instruction set `isa`. Empty strings: that precision not timed.
struct TimedKernels {
  std::uint32_t threads = 0;
  std::string isa;
  std::array<std::string, precision_count> activations{};
  std::array<std::string, precision_count> layout{};
};

/// A machine: the link into the expert cache, the device and the host CPU.
struct HardwareModel {
  std::string name;
  std::string source;           ///< where the numbers come from
  LinkModel link;               ///< slow tier → expert cache (PCIe, SSD, or disk → RAM)
  ProcessorModel device;        ///< where cached experts and the dense part run
  ProcessorModel cpu;           ///< host CPU (Fiddler's / HOBBIT's cooperative mode)
  double layer_overhead_s = 0;  ///< fixed cost of a layer's dense part (launches, norms)
  /// Host memory holds every expert, so the host CPU runs one without moving it (a GPU
  /// machine's RAM: Fiddler's setting). False on a CPU-only machine, where the expert cache is
  /// the host memory: an expert the host CPU runs outside the cache is read over the link first.
  bool host_holds_experts = true;
  /// The device is the host CPU (a CPU-only machine running moe-run): experts placed on the host
  /// CPU run on the same cores as the device's, one after another in the plan's order, not beside
  /// them; with `host_holds_experts` false each is read over the link (shared with the cache's
  /// loads, SimLoader's host reads) before it runs. False: a separate device (GPU), the host CPU
  /// side runs beside it and its reads, if any, cost their transfer time on the CPU side.
  bool host_is_device = false;
  /// A layer's experts run only once every load of its plan has arrived (moe-run's engine:
  /// MoeLayer resolves the whole plan, then runs the experts). False: each device expert runs as
  /// soon as its own load is in, overlapping the loads of the ones after it.
  bool experts_after_all_loads = false;
  /// The fixed parts (call overhead + bytes / weight rate, the dense part's too) are what a
  /// one-token call costs, measured so: a call over n tokens adds the per-token part for the
  /// n − 1 others (moe-calibrate: decode runs a GEMV, a batch the GEMM, whose slope would count
  /// the first token twice). False: the per-token part for all n (the papers' presets).
  bool fixed_includes_first_token = false;
  /// The device run on one thread (moe-calibrate: the same kernels on a one-thread pool), for
  /// the decode steps moe-run runs on the caller alone: its ThreadPool's StepChooser keeps the
  /// mode whose steps (less their load waits) were shorter, one thread when other processes take
  /// the cores.
  std::optional<ProcessorModel> solo;
  /// The share of decode steps run on all threads; the others run at `solo`'s rates. A
  /// one-token call costs decode_team_fraction · (all threads) + (1 − it) · (one thread). Only
  /// with `solo`; 1 without it.
  double decode_team_fraction = 1.0;
  /// What the device's and CPU's rates were measured on (moe-calibrate writes it; descriptive,
  /// not used by the cost model).
  std::optional<TimedKernels> timed;

  void validate() const {
    MOEKIT_EXPECTS(!name.empty(), "HardwareModel.name must not be empty");
    link.validate();
    device.validate("HardwareModel.device");
    cpu.validate("HardwareModel.cpu");
    MOEKIT_EXPECTS(layer_overhead_s >= 0 && std::isfinite(layer_overhead_s),
                   "HardwareModel.layer_overhead_s must be finite and >= 0");
    if (solo) solo->validate("HardwareModel.solo");
    MOEKIT_EXPECTS(decode_team_fraction >= 0 && decode_team_fraction <= 1,
                   "HardwareModel.decode_team_fraction must be in [0, 1]");
  }
  /// Seconds to move `bytes` over the link.
  [[nodiscard]] double transfer_s(std::size_t bytes) const noexcept {
    return link.transfer_s(bytes);
  }
  /// Seconds for the dense part of one layer over `n_tokens` tokens.
  [[nodiscard]] double dense_layer_s(const DenseLayerShape& dense,
                                     std::uint32_t n_tokens) const noexcept {
    return dense_fixed_s(dense, device) +
           2.0 * double(dense.params) * n_tokens / device.flops_per_s;
  }
  /// A one-token call's fixed part when `solo` is set: the blend decode_team_fraction gives.
  [[nodiscard]] double decode_blend(double team_s, double solo_s) const noexcept {
    return decode_team_fraction * team_s + (1.0 - decode_team_fraction) * solo_s;
  }
  /// The replay's per-call compute model for a model of `shape` with dense layers `dense`.
  [[nodiscard]] ComputeModel compute_model(const ModelShape& shape,
                                           const DenseLayerShape& dense) const {
    validate();
    shape.validate();
    ComputeModel m;
    for (std::size_t i = 0; i < precision_count; ++i) {
      const Precision p = all_precisions[i];
      const auto idx = static_cast<std::size_t>(p);
      m.device_expert_s[idx] = device.fixed_s(shape, p);
      m.device_expert_token_s[idx] = device.per_token_s(shape);
      m.cpu_expert_s[idx] =
          cpu.fixed_s(shape, p) +
          (host_holds_experts || host_is_device ? 0.0 : link.transfer_s(shape.expert_bytes(p), p));
      m.cpu_expert_token_s[idx] = cpu.per_token_s(shape);
    }
    m.layer_s = dense_layer_s(dense, 0);
    m.layer_token_s = 2.0 * double(dense.params) / device.flops_per_s;
    m.cpu_beside_device = !host_is_device;
    m.cpu_reads_over_link = host_is_device && !host_holds_experts;
    m.experts_after_all_loads = experts_after_all_loads;
    m.first_token_in_fixed = fixed_includes_first_token;
    if (solo && decode_team_fraction < 1.0) m.one_token = one_token_costs(shape, dense, m);
    return m;
  }

 private:
  [[nodiscard]] double dense_fixed_s(const DenseLayerShape& dense,
                                     const ProcessorModel& p) const noexcept {
    const double bytes = double(matrix_bytes(1, dense.params, dense.precision));
    return layer_overhead_s +
           bytes / p.weight_bytes_per_s[static_cast<std::size_t>(dense.precision)];
  }
  // One-token calls at the decode blend: device experts and the dense part from `solo`; host
  // CPU experts too when the host CPU is the device (the same cores, the same pool).
  [[nodiscard]] ComputeModel::OneToken one_token_costs(const ModelShape& shape,
                                                       const DenseLayerShape& dense,
                                                       const ComputeModel& m) const {
    ComputeModel::OneToken o;
    for (std::size_t i = 0; i < precision_count; ++i) {
      const Precision p = all_precisions[i];
      const auto idx = static_cast<std::size_t>(p);
      o.device_expert_s[idx] = decode_blend(m.device_expert_s[idx], solo->fixed_s(shape, p));
      o.cpu_expert_s[idx] = host_is_device
                                ? decode_blend(m.cpu_expert_s[idx], solo->fixed_s(shape, p))
                                : m.cpu_expert_s[idx];
    }
    o.layer_s = decode_blend(m.layer_s, dense_fixed_s(dense, *solo));
    return o;
  }
};

// ---- presets ------------------------------------------------------------------------------------

namespace detail {
// Bytes of one Mixtral-8x7B expert at 16 bit: 3 × 4096 × 14336 × 2 [derived, hobbit.md §4].
inline constexpr double mixtral_expert_f16_bytes = 352'321'536.0;
}  // namespace detail

/// RTX 4090 + PCIe 4.0 (HOBBIT's edge server; hobbit.md §5.2).
inline HardwareModel rtx4090_pcie4() {
  HardwareModel h;
  h.name = "rtx4090-pcie4";
  h.source =
      "link 32 GB/s [paper: HOBBIT §5.2, PCIe 4.0 theoretical], latency 10 us [choice]; "
      "device 940 GB/s [derived: HOBBIT §2.1, one Mixtral layer of 8 fp16 experts computes in "
      "~3 ms] (vendor peak 1008 GB/s), 82.6 TFLOP/s [choice: half the vendor 165.2 TFLOP/s fp16 "
      "tensor, fp32 accumulate]; CPU 70.5 GB/s [derived: HOBBIT §2.5, 5 ms per fp16 Mixtral "
      "expert with llama.cpp], 2 TFLOP/s [choice: 64 cores]";
  h.link = {.bandwidth_bytes_per_s = 32e9, .latency_s = 10e-6};
  h.device = ProcessorModel::uniform(8 * detail::mixtral_expert_f16_bytes / 3e-3, 82.6e12, 5e-6);
  h.cpu = ProcessorModel::uniform(detail::mixtral_expert_f16_bytes / 5e-3, 2e12, 20e-6);
  h.layer_overhead_s = 50e-6;  // [choice] norms, rotary, launches
  return h;
}

/// Jetson AGX Orin 32 GB, experts on an NVMe SSD (HOBBIT's end device; hobbit.md §5.2).
inline HardwareModel jetson_orin_ssd() {
  HardwareModel h;
  h.name = "jetson-orin-ssd";
  h.source =
      "link 3.0 GB/s [paper: HOBBIT §5.2, Samsung 980 PRO ~3,000 MB/s in practice], latency "
      "100 us [choice: NVMe read setup]; device 164 GB/s [choice: 0.8 x vendor 204.8 GB/s LPDDR5 "
      "unified memory], 13.5 TFLOP/s [choice: half of ~27 TFLOP/s fp16, vendor dense estimate]; "
      "CPU 30 GB/s, 0.2 TFLOP/s [choice: 12 Cortex-A78AE cores sharing the same memory]";
  h.link = {.bandwidth_bytes_per_s = 3.0e9, .latency_s = 100e-6};
  h.device = ProcessorModel::uniform(0.8 * 204.8e9, 13.5e12, 10e-6);
  h.cpu = ProcessorModel::uniform(30e9, 0.2e12, 20e-6);
  h.layer_overhead_s = 100e-6;  // [choice]
  return h;
}

/// RTX 3090 + PCIe 3.0 ×16 (Fate's high-end PC; fate.md §5.2).
inline HardwareModel rtx3090_pcie3() {
  HardwareModel h;
  h.name = "rtx3090-pcie3";
  h.source =
      "link 16 GB/s [paper: Fate §5.2, PCIe 3.0 x16], latency 10 us [choice] (Fate measured "
      "~6 ms per Qwen expert, far above 17.3 MB / 16 GB/s: calibrate for absolute numbers); "
      "device 796 GB/s [choice: 0.85 x vendor 936 GB/s], 35.5 TFLOP/s [choice: half the vendor "
      "71 TFLOP/s fp16 tensor, fp32 accumulate]; CPU i9-9900X 51 GB/s [choice: 0.6 x vendor "
      "85.3 GB/s 4-channel DDR4-2666], 0.5 TFLOP/s [choice]";
  h.link = {.bandwidth_bytes_per_s = 16e9, .latency_s = 10e-6};
  h.device = ProcessorModel::uniform(0.85 * 936e9, 35.5e12, 5e-6);
  h.cpu = ProcessorModel::uniform(0.6 * 85.3e9, 0.5e12, 20e-6);
  h.layer_overhead_s = 50e-6;  // [choice]
  return h;
}

/// RTX 4080 16 GB + PCIe 4.0 (MoBiLE's machine; mobile.md §5.1).
inline HardwareModel rtx4080_pcie4() {
  HardwareModel h;
  h.name = "rtx4080-pcie4";
  h.source =
      "link 32 GB/s [derived: MoBiLE §5.1 quotes 64 GB/s bidirectional PCIe 4.0 x16, 32 GB/s per "
      "direction], latency 10 us [choice]; device 609 GB/s [choice: 0.85 x vendor 716.8 GB/s], "
      "48.7 TFLOP/s [choice: half the vendor 97.5 TFLOP/s fp16 tensor, fp32 accumulate]; CPU "
      "i5-12400 30.7 GB/s [choice: 0.6 x vendor 51.2 GB/s dual-channel DDR4-3200], 0.3 TFLOP/s "
      "[choice]";
  h.link = {.bandwidth_bytes_per_s = 32e9, .latency_s = 10e-6};
  h.device = ProcessorModel::uniform(0.85 * 716.8e9, 48.7e12, 5e-6);
  h.cpu = ProcessorModel::uniform(0.6 * 51.2e9, 0.3e12, 20e-6);
  h.layer_overhead_s = 50e-6;  // [choice]
  return h;
}

/// Quadro RTX 6000 + PCIe 3.0 (Fiddler's environment 1; fiddler.md §5.2, §5.5).
inline HardwareModel quadro_rtx6000_pcie3() {
  HardwareModel h;
  h.name = "quadro-rtx6000-pcie3";
  h.source =
      "link 7.05 GB/s [derived: Fiddler App. B, ~50 ms to copy one 352 MB expert; nominal PCIe "
      "3.0 x16 is 16 GB/s per direction], latency 10 us [choice]; device 70.5 GB/s [derived: "
      "Fiddler App. B, GPU expert compute ~1/10 of the copy = 5 ms], 65 TFLOP/s [choice: half "
      "the vendor 130.5 TFLOP/s]; CPU 117 GB/s [derived: ~3 ms per Mixtral expert per token in "
      "Fiddler, hobbit.md §2.5], 1 TFLOP/s [choice: the prefill slope is not reported]";
  h.link = {.bandwidth_bytes_per_s = detail::mixtral_expert_f16_bytes / 50e-3, .latency_s = 10e-6};
  h.device = ProcessorModel::uniform(detail::mixtral_expert_f16_bytes / 5e-3, 65e12, 5e-6);
  h.cpu = ProcessorModel::uniform(detail::mixtral_expert_f16_bytes / 3e-3, 1e12, 20e-6);
  h.layer_overhead_s = 50e-6;  // [choice]
  return h;
}

/// Names accepted by `hardware_preset` (besides "this_machine", which needs a file).
inline std::vector<std::string> hardware_preset_names() {
  return {"rtx4090-pcie4", "jetson-orin-ssd", "rtx3090-pcie3", "rtx4080-pcie4",
          "quadro-rtx6000-pcie3"};
}

// ---- this_machine: JSON written by a calibration command ----------------------------------------
//
// {"format": "moekit-hardware", "version": 1, "name": str, "source": str,
//  "link":   {"bandwidth_bytes_per_s": num, "latency_s": num, "reads_in_flight": int,
//             "read_bandwidth_bytes_per_s": num, "compute_s_per_byte": num,
//             "store": {the five fields above}, "in_place": precision,
//             "disk_bandwidth_bytes_per_s": num},
//  "device": {"weight_bytes_per_s": {"f32": num, "bf16": num, "f16": num, "q8": num, "q4": num,
//                                    "q2": num},
//             "flops_per_s": num, "call_overhead_s": num},
//  "cpu":    {same fields as "device"},
//  "layer_overhead_s": num, "host_holds_experts": bool, "host_is_device": bool,
//  "experts_after_all_loads": bool, "fixed_includes_first_token": bool,
//  "solo": {same fields as "device"}, "decode_team_fraction": num,
//  "timed":  {"threads": int, "isa": str, "activations": {precision: str, ...},
//             "layout": {precision: str, ...}}}
// All numbers SI (bytes, seconds). Every key is required but these optional ones, whose
// defaults are the model before they existed (a file without them replays as it did):
// "link.reads_in_flight" (default 1: one transfer at a time), "link.read_bandwidth_bytes_per_s"
// (default 0: one read alone gets the whole bandwidth), "link.compute_s_per_byte" (default 0:
// reads delay no compute), the same three of "link.store", "link.store"
// (default none: every load over the one path; with it "link.in_place" is required and
// "link.disk_bandwidth_bytes_per_s" defaults to 0, the faster path's; it caps the two only while
// both read), "host_holds_experts" (default true), "host_is_device", "experts_after_all_loads",
// "fixed_includes_first_token" (default false each), "solo" (default none: decode runs at
// "device"'s rates), "decode_team_fraction" (in [0, 1], default 1; only with "solo") and "timed"
// (what was measured: descriptive only; "activations" and "layout" name some of the precisions). No
// other key is allowed. On a CPU-only machine "device" is the CPU running the project's kernels
// from the RAM cache, "link" is the read path of the experts (O_DIRECT disk bandwidth, or moe-run's
// loader on the checkpoint in place, with as many reads in flight as it runs; "store": the expert
// store's loader beside it), "host_holds_experts" is false (the cache is the host memory),
// "host_is_device" and "experts_after_all_loads" are true (moe-run's engine), and
// "fixed_includes_first_token" is true (the rates come from one-token calls).

inline constexpr std::string_view hardware_json_format = "moekit-hardware";

/// Serialises `h` in the schema above (what the calibration command writes).
[[nodiscard]] inline std::string serialize_hardware_json(const HardwareModel& h) {
  auto proc = [](const ProcessorModel& p) {
    nlohmann::json rates = nlohmann::json::object();
    for (std::size_t i = 0; i < precision_count; ++i)
      rates[std::string(name(all_precisions[i]))] =
          p.weight_bytes_per_s[static_cast<std::size_t>(all_precisions[i])];
    return nlohmann::json{{"weight_bytes_per_s", rates},
                          {"flops_per_s", p.flops_per_s},
                          {"call_overhead_s", p.call_overhead_s}};
  };
  nlohmann::json j = {
      {"format", hardware_json_format},
      {"version", 1},
      {"name", h.name},
      {"source", h.source},
      {"link",
       {{"bandwidth_bytes_per_s", h.link.bandwidth_bytes_per_s}, {"latency_s", h.link.latency_s}}},
      {"device", proc(h.device)},
      {"cpu", proc(h.cpu)},
      {"layer_overhead_s", h.layer_overhead_s},
      {"host_holds_experts", h.host_holds_experts},
      {"host_is_device", h.host_is_device},
      {"experts_after_all_loads", h.experts_after_all_loads},
      {"fixed_includes_first_token", h.fixed_includes_first_token}};
  j["link"]["reads_in_flight"] = h.link.reads_in_flight;
  j["link"]["read_bandwidth_bytes_per_s"] = h.link.read_bandwidth_bytes_per_s;
  j["link"]["compute_s_per_byte"] = h.link.compute_s_per_byte;
  if (h.link.store) {
    const ReadPath& s = *h.link.store;
    j["link"]["store"] = {{"bandwidth_bytes_per_s", s.bandwidth_bytes_per_s},
                          {"latency_s", s.latency_s},
                          {"reads_in_flight", s.reads_in_flight},
                          {"read_bandwidth_bytes_per_s", s.read_bandwidth_bytes_per_s},
                          {"compute_s_per_byte", s.compute_s_per_byte}};
    j["link"]["in_place"] = std::string(name(h.link.in_place));
    j["link"]["disk_bandwidth_bytes_per_s"] = h.link.disk_bandwidth_bytes_per_s;
  }
  if (h.solo) {
    j["solo"] = proc(*h.solo);
    j["decode_team_fraction"] = h.decode_team_fraction;
  }
  if (h.timed) {
    nlohmann::json acts = nlohmann::json::object(), layout = nlohmann::json::object();
    for (std::size_t i = 0; i < precision_count; ++i) {
      const std::string n(name(all_precisions[i]));
      const auto k = static_cast<std::size_t>(all_precisions[i]);
      if (!h.timed->activations[k].empty()) acts[n] = h.timed->activations[k];
      if (!h.timed->layout[k].empty()) layout[n] = h.timed->layout[k];
    }
    j["timed"] = {{"threads", h.timed->threads},
                  {"isa", h.timed->isa},
                  {"activations", acts},
                  {"layout", layout}};
  }
  return j.dump(2) + "\n";
}

namespace detail {

/// The checks parse_hardware_json makes, each failing with the file and the field's path.
struct HardwareJsonReader {
  std::string_view source;

  [[noreturn]] void bad(const std::string& field, const std::string& why) const {
    ::moekit::detail::fail(ErrorKind::invalid_format, "hardware file '" + std::string(source) +
                                                          "': field '" + field + "': " + why);
  }
  /// `o` is an object with every key of `keys`, and no key outside `keys` and `optional`.
  void object(const nlohmann::json& o, const std::string& path,
              std::initializer_list<const char*> keys,
              const std::vector<const char*>& optional = {}) const {
    if (!o.is_object()) bad(path, "must be an object");
    for (const char* k : keys)
      if (!o.contains(k)) bad(path.empty() ? k : path + "." + k, "missing");
    for (const auto& [k, v] : o.items()) {
      bool known = false;
      for (const char* x : keys) known = known || k == x;
      for (const char* x : optional) known = known || k == x;
      if (!known) bad(path.empty() ? k : path + "." + k, "unknown key");
    }
  }
  [[nodiscard]] double number(const nlohmann::json& v, const std::string& path,
                              bool allow_zero) const {
    if (!v.is_number()) bad(path, "must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (!allow_zero && x == 0))
      bad(path, allow_zero ? "must be finite and >= 0" : "must be finite and > 0");
    return x;
  }
  [[nodiscard]] std::uint32_t count(const nlohmann::json& v, const std::string& path,
                                    std::uint32_t max) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > max)
      bad(path, "must be an integer in [1, " + std::to_string(max) + "]");
    return static_cast<std::uint32_t>(v.get<std::int64_t>());
  }
  /// An optional boolean: `fallback` when absent.
  [[nodiscard]] bool flag(const nlohmann::json& j, const char* key, bool fallback) const {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_boolean()) bad(key, "must be true or false");
    return j[key].get<bool>();
  }
  [[nodiscard]] ReadPath read_path(const nlohmann::json& o, const std::string& path,
                                   std::initializer_list<const char*> more = {}) const {
    std::vector<const char*> optional = {"reads_in_flight", "read_bandwidth_bytes_per_s",
                                         "compute_s_per_byte"};
    optional.insert(optional.end(), more.begin(), more.end());
    object(o, path, {"bandwidth_bytes_per_s", "latency_s"}, optional);
    ReadPath l;
    l.bandwidth_bytes_per_s =
        number(o["bandwidth_bytes_per_s"], path + ".bandwidth_bytes_per_s", false);
    l.latency_s = number(o["latency_s"], path + ".latency_s", true);
    if (o.contains("reads_in_flight"))
      l.reads_in_flight =
          count(o["reads_in_flight"], path + ".reads_in_flight", ReadPath::max_reads_in_flight);
    if (o.contains("read_bandwidth_bytes_per_s")) {
      l.read_bandwidth_bytes_per_s =
          number(o["read_bandwidth_bytes_per_s"], path + ".read_bandwidth_bytes_per_s", true);
      if (l.read_bandwidth_bytes_per_s > l.bandwidth_bytes_per_s)
        bad(path + ".read_bandwidth_bytes_per_s",
            "must be at most " + path + ".bandwidth_bytes_per_s");
    }
    if (o.contains("compute_s_per_byte")) {
      l.compute_s_per_byte = number(o["compute_s_per_byte"], path + ".compute_s_per_byte", true);
      if (l.compute_s_per_byte >= ReadPath::max_compute_s_per_byte)
        bad(path + ".compute_s_per_byte",
            "must be below " + std::to_string(ReadPath::max_compute_s_per_byte));
    }
    return l;
  }
  /// "link": one read path, or with "store" (a second path), "in_place" (the main path's
  /// precision) and optionally "disk_bandwidth_bytes_per_s".
  [[nodiscard]] LinkModel link(const nlohmann::json& o) const {
    LinkModel l;
    l.set_main(read_path(o, "link", {"store", "in_place", "disk_bandwidth_bytes_per_s"}));
    if (!o.contains("store")) {
      if (o.contains("in_place") || o.contains("disk_bandwidth_bytes_per_s"))
        bad("link.in_place", "\"in_place\" and \"disk_bandwidth_bytes_per_s\" need \"store\"");
      return l;
    }
    l.store = read_path(o["store"], "link.store");
    if (!o.contains("in_place") || !o["in_place"].is_string())
      bad("link.in_place", "must name the precision read in place (with \"store\")");
    const auto p = parse_precision(o["in_place"].get<std::string>());
    if (!p || *p == Precision::skip) bad("link.in_place", "unknown precision");
    l.in_place = *p;
    if (o.contains("disk_bandwidth_bytes_per_s"))
      l.disk_bandwidth_bytes_per_s =
          number(o["disk_bandwidth_bytes_per_s"], "link.disk_bandwidth_bytes_per_s", true);
    return l;
  }
  [[nodiscard]] ProcessorModel processor(const nlohmann::json& o, const std::string& path) const {
    object(o, path, {"weight_bytes_per_s", "flops_per_s", "call_overhead_s"});
    ProcessorModel p;
    const auto& rates = o["weight_bytes_per_s"];
    object(rates, path + ".weight_bytes_per_s", {"f32", "bf16", "f16", "q8", "q4", "q2"});
    for (Precision q : all_precisions) {
      const std::string n(name(q));
      p.weight_bytes_per_s[static_cast<std::size_t>(q)] =
          number(rates[n], path + ".weight_bytes_per_s." + n, false);
    }
    p.flops_per_s = number(o["flops_per_s"], path + ".flops_per_s", false);
    p.call_overhead_s = number(o["call_overhead_s"], path + ".call_overhead_s", true);
    return p;
  }
  /// Per precision name, a string (some precisions only).
  void names(const nlohmann::json& o, const std::string& path,
             std::array<std::string, precision_count>& out) const {
    object(o, path, {}, {"f32", "bf16", "f16", "q8", "q4", "q2"});
    for (Precision q : all_precisions) {
      const std::string n(name(q));
      if (!o.contains(n)) continue;
      if (!o[n].is_string() || o[n].get<std::string>().empty())
        bad(path + "." + n, "must be a non-empty string");
      out[static_cast<std::size_t>(q)] = o[n].get<std::string>();
    }
  }
  [[nodiscard]] TimedKernels timed(const nlohmann::json& o) const {
    object(o, "timed", {"threads", "isa", "activations", "layout"});
    TimedKernels t;
    t.threads = count(o["threads"], "timed.threads", 1u << 20);
    if (!o["isa"].is_string()) bad("timed.isa", "must be a string");
    t.isa = o["isa"].get<std::string>();
    names(o["activations"], "timed.activations", t.activations);
    names(o["layout"], "timed.layout", t.layout);
    return t;
  }
};

}  // namespace detail

/// Parses and validates a hardware JSON document; `source` names it in errors.
[[nodiscard]] inline HardwareModel parse_hardware_json(std::string_view text,
                                                       std::string_view source = "<memory>") {
  const detail::HardwareJsonReader r{source};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    r.bad("<document>", std::string("invalid JSON: ") + e.what());
  }
  r.object(j, "",
           {"format", "version", "name", "source", "link", "device", "cpu", "layer_overhead_s"},
           {"host_holds_experts", "host_is_device", "experts_after_all_loads",
            "fixed_includes_first_token", "solo", "decode_team_fraction", "timed"});
  if (!j["format"].is_string() || j["format"].get<std::string>() != hardware_json_format)
    r.bad("format", "must be \"moekit-hardware\"");
  if (!j["version"].is_number_integer() || j["version"].get<std::int64_t>() != 1)
    r.bad("version", "unsupported (this reader: 1)");
  if (!j["name"].is_string() || j["name"].get<std::string>().empty())
    r.bad("name", "must be a non-empty string");
  if (!j["source"].is_string()) r.bad("source", "must be a string");
  HardwareModel h;
  h.name = j["name"].get<std::string>();
  h.source = j["source"].get<std::string>();
  h.link = r.link(j["link"]);
  h.device = r.processor(j["device"], "device");
  h.cpu = r.processor(j["cpu"], "cpu");
  h.layer_overhead_s = r.number(j["layer_overhead_s"], "layer_overhead_s", true);
  h.host_holds_experts = r.flag(j, "host_holds_experts", true);
  h.host_is_device = r.flag(j, "host_is_device", false);
  h.experts_after_all_loads = r.flag(j, "experts_after_all_loads", false);
  h.fixed_includes_first_token = r.flag(j, "fixed_includes_first_token", false);
  if (j.contains("solo")) h.solo = r.processor(j["solo"], "solo");
  if (j.contains("decode_team_fraction")) {
    if (!h.solo) r.bad("decode_team_fraction", "needs \"solo\" (the one-thread rates)");
    h.decode_team_fraction = r.number(j["decode_team_fraction"], "decode_team_fraction", true);
    if (h.decode_team_fraction > 1) r.bad("decode_team_fraction", "must be in [0, 1]");
  }
  if (j.contains("timed")) h.timed = r.timed(j["timed"]);
  h.validate();
  return h;
}

/// Reads a hardware JSON file (the `this_machine` preset).
[[nodiscard]] inline HardwareModel read_hardware_json(const std::string& path) {
  return parse_hardware_json(detail::read_file_text(path), path);
}

/// Writes `h` as JSON; throws if the file exists unless `overwrite`.
inline void write_hardware_json(const HardwareModel& h, const std::string& path,
                                bool overwrite = false) {
  h.validate();
  const std::string text = serialize_hardware_json(h);
  detail::write_file_bytes(path, std::as_bytes(std::span<const char>(text.data(), text.size())),
                           overwrite);
}

/// A preset by name; "this_machine" reads `this_machine_json` (written by the calibration
/// command). Throws `moekit::Error(invalid_argument)` listing the names on an unknown one.
[[nodiscard]] inline HardwareModel hardware_preset(std::string_view preset,
                                                   const std::string& this_machine_json = "") {
  if (preset == "rtx4090-pcie4") return rtx4090_pcie4();
  if (preset == "jetson-orin-ssd") return jetson_orin_ssd();
  if (preset == "rtx3090-pcie3") return rtx3090_pcie3();
  if (preset == "rtx4080-pcie4") return rtx4080_pcie4();
  if (preset == "quadro-rtx6000-pcie3") return quadro_rtx6000_pcie3();
  if (preset == "this_machine") {
    MOEKIT_EXPECTS(!this_machine_json.empty(),
                   "hardware preset 'this_machine' needs the JSON file written by calibration");
    return read_hardware_json(this_machine_json);
  }
  std::string names;
  for (const auto& n : hardware_preset_names()) names += " " + n;
  ::moekit::detail::fail(
      ErrorKind::invalid_argument,
      "unknown hardware preset '" + std::string(preset) + "'; known:" + names + " this_machine");
}

}  // namespace moekit::sim
