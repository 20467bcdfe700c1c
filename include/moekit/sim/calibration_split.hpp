#pragma once
/// \file Cutting a routing trace into the part that calibrates (EdgeMoE's activation-path profile
/// and prior, Fiddler's popularity) and the part that is replayed, so that calibration is never
/// evaluation: moe-sim's halves (split_for_calibration), and the tokens `moe-run --routing-trace`
/// replays for a given prompt and decode count with the rest calibrating
/// (slice_like_routing_replay), which moe-sim --replay-slice and moe-run's calibration run share.

#include <cstddef>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_walk.hpp"

namespace moekit::sim {

/// A trace cut in two: the first part calibrates, the second is replayed (calibration is not
/// evaluation).
struct CalibrationSplit {
  RoutingTrace calibration, evaluation;
  std::string text;  ///< what each part holds, for the output
};

/// Appends token `g` of `in` (a global index) to `out`'s current sequence as a token of `phase`.
inline void copy_token(RoutingTrace& out, const RoutingTrace& in, std::size_t g,
                       moekit::Phase phase) {
  const std::size_t t = out.append_token(phase);
  for (std::uint32_t l = 0; l < in.dims().n_layers; ++l)
    if (in.valid(g, l))
      out.set_route(t, l, in.experts(g, l), in.weights(g, l), in.logits(g, l), in.hidden(g, l));
}

/// Appends tokens [first, end) of `in` (global indices, one sequence) to `out` as a sequence.
inline void copy_tokens(RoutingTrace& out, const RoutingTrace& in, const std::string& seq_name,
                        std::size_t first, std::size_t end) {
  out.begin_sequence(seq_name);
  for (std::size_t g = first; g < end; ++g) copy_token(out, in, g, in.phase(g));
}

/// The first half of `tr`'s sequences calibrates and the second half is replayed; a trace of one
/// sequence is cut inside its decode tokens (calibration: the prefill and the first half of the
/// decode tokens; replayed: the other decode tokens, without a prefill).
inline CalibrationSplit split_for_calibration(const RoutingTrace& tr) {
  CalibrationSplit s{RoutingTrace(tr.dims(), tr.name() + " (calibration half)", tr.synthetic()),
                     RoutingTrace(tr.dims(), tr.name(), tr.synthetic()),
                     {}};
  const std::size_t n = tr.sequence_count();
  auto seq_end = [&](std::size_t q) { return tr.global_token(q, 0) + tr.sequence_length(q); };
  if (n >= 2) {
    for (std::size_t q = 0; q < n; ++q)
      copy_tokens(q < n / 2 ? s.calibration : s.evaluation, tr, tr.sequence_name(q),
                  tr.global_token(q, 0), seq_end(q));
    s.text = "calibration: sequences 1-" + std::to_string(n / 2) + " of " + std::to_string(n) +
             ", replayed: sequences " + std::to_string(n / 2 + 1) + "-" + std::to_string(n);
    return s;
  }
  const std::size_t pre = n ? tr.prefill_length(0) : 0, len = n ? tr.sequence_length(0) : 0;
  MOEKIT_EXPECTS(len >= pre + 2, "trace '" + tr.name() +
                                     "': calibration needs two sequences or two decode tokens "
                                     "(the first part calibrates, the rest is replayed)");
  const std::size_t cut = pre + (len - pre) / 2;
  copy_tokens(s.calibration, tr, tr.sequence_name(0), 0, cut);
  copy_tokens(s.evaluation, tr, tr.sequence_name(0), cut, len);
  s.text = "calibration: the prefill and decode tokens 1-" + std::to_string(cut - pre) + " of " +
           std::to_string(len - pre) + ", replayed: decode tokens " +
           std::to_string(cut - pre + 1) + "-" + std::to_string(len - pre) + " (no prefill)";
  return s;
}

/// The tokens `moe-run --routing-trace` replays for a prompt of `prompt` tokens and `decode`
/// decode forwards: the same walks (`sim::PhaseWalks`, which engine/routing_replay.hpp takes its
/// tokens from). The replayed part is one sequence of those tokens; the tokens it does not use
/// calibrate, so that moe-sim and moe-run replay the same routing.
inline CalibrationSplit slice_like_routing_replay(const RoutingTrace& tr, std::size_t prompt,
                                                  std::size_t decode) {
  PhaseWalks walks(tr);
  MOEKIT_EXPECTS(!walks.empty(), "--replay-slice: trace '" + tr.name() + "' holds no token");
  CalibrationSplit s{
      RoutingTrace(tr.dims(), tr.name() + " (calibration: the rest)", tr.synthetic()),
      RoutingTrace(tr.dims(), tr.name(), tr.synthetic()),
      {}};
  std::vector<bool> used(tr.token_count(), false);
  std::vector<std::size_t> tokens;
  s.evaluation.begin_sequence("moe-run slice");
  auto take = [&](moekit::Phase phase, std::size_t n) {
    walks.peek(phase, n, tokens);
    walks.advance(phase, n);
    for (std::size_t g : tokens) {
      used[g] = true;
      copy_token(s.evaluation, tr, g, phase);
    }
  };
  take(moekit::Phase::prefill, prompt);
  take(moekit::Phase::decode, decode);
  for (std::size_t q = 0; q < tr.sequence_count(); ++q) {
    const std::size_t first = tr.global_token(q, 0), end = first + tr.sequence_length(q);
    for (std::size_t g = first; g < end;) {  // each run of unused tokens: a sequence
      if (used[g]) {
        ++g;
        continue;
      }
      std::size_t e = g;
      while (e < end && !used[e]) ++e;
      copy_tokens(s.calibration, tr, tr.sequence_name(q), g, e);
      g = e;
    }
  }
  s.text = "replayed as moe-run --routing-trace does with a " + std::to_string(prompt) +
           "-token prompt and " + std::to_string(decode) + " decode tokens; calibration: the " +
           std::to_string(s.calibration.token_count()) + " other tokens";
  return s;
}

}  // namespace moekit::sim
