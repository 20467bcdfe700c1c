#pragma once
/// \file LogProbFile: the .mklogp file of per-position top-K log-probabilities that
/// `moe-run --perplexity --save-logits` writes and `--kl-reference` reads (perplexity.hpp).
/// Apart from the engine so the reader builds alone (the fuzz target tests/fuzz/fuzz_mklogp.cpp).
///
/// .mklogp, version 2 (little-endian, no padding; version 1 is read too: its field at 20 is 0):
///
/// | offset | size | field                                                                   |
/// |--------|------|-------------------------------------------------------------------------|
/// | 0      | 8    | magic "MKLOGP\0\0"                                                      |
/// | 8      | 4    | version (u32) = 2                                                       |
/// | 12     | 4    | vocab (u32)                                                             |
/// | 16     | 4    | K (u32), 1 ≤ K ≤ vocab                                                  |
/// | 20     | 4    | ctx (u32): tokens per scored chunk (--ctx-size), 0 = not recorded (v1)  |
/// | 24     | 8    | positions (u64)                                                         |
/// | 32     | …    | per position: u32 target token, f32 log p(target), u32 ids[K] (descending
/// log-prob, ties → lower id), f32 log-probs[K] |
///
/// The file ends exactly after the last position.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/output_file.hpp"

namespace moekit::engine {

/// Refuses (naming `flag`) a path that is not a regular file: a device such as /dev/zero or a
/// pipe would be read without end.
inline void require_regular_file(const std::filesystem::path& path, std::string_view flag) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         std::string(flag) + ": '" + path.string() +
                             "' is not a regular file (a directory, device or pipe)");
}

/// Per-position log-probabilities of a reference run (the .mklogp format in the file comment).
class LogProbFile {
 public:
  static constexpr char magic[8] = {'M', 'K', 'L', 'O', 'G', 'P', '\0', '\0'};
  static constexpr std::uint32_t version = 2;
  static constexpr std::size_t header_bytes = 32;

  LogProbFile() = default;
  /// An empty file for a vocabulary of `vocab` keeping the `top_k` most likely tokens.
  LogProbFile(std::uint32_t vocab, std::uint32_t top_k) : vocab_(vocab), k_(top_k) {
    MOEKIT_EXPECTS(vocab > 0 && top_k >= 1 && top_k <= vocab,
                   "LogProbFile: K must be in [1, vocab] (got K = " + std::to_string(top_k) +
                       ", vocab = " + std::to_string(vocab) + ")");
  }

  [[nodiscard]] std::uint32_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] std::uint32_t top_k() const noexcept { return k_; }
  [[nodiscard]] std::size_t positions() const noexcept { return targets_.size(); }
  /// Tokens per chunk of the run that wrote the file (0: not recorded, a version 1 file). A run
  /// that scored other chunks has positions that do not correspond: --kl-reference refuses it.
  [[nodiscard]] std::uint32_t context() const noexcept { return ctx_; }
  void set_context(std::uint32_t ctx) noexcept { ctx_ = ctx; }
  [[nodiscard]] std::uint32_t target(std::size_t i) const { return targets_.at(i); }
  [[nodiscard]] float target_logprob(std::size_t i) const { return target_lp_.at(i); }
  [[nodiscard]] std::span<const std::uint32_t> ids(std::size_t i) const {
    return std::span<const std::uint32_t>(ids_).subspan(i * k_, k_);
  }
  [[nodiscard]] std::span<const float> logprobs(std::size_t i) const {
    return std::span<const float>(lp_).subspan(i * k_, k_);
  }

  /// Appends a position: its target, the target's log-prob, and the K best (id, log-prob) pairs
  /// in descending order.
  void add(std::uint32_t target, float target_logprob, std::span<const std::uint32_t> ids,
           std::span<const float> logprobs) {
    MOEKIT_EXPECTS(ids.size() == k_ && logprobs.size() == k_,
                   "LogProbFile::add: expected K = " + std::to_string(k_) + " entries");
    targets_.push_back(target);
    target_lp_.push_back(target_logprob);
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    lp_.insert(lp_.end(), logprobs.begin(), logprobs.end());
  }

  /// Writes the file; refuses to replace an existing one unless `overwrite`. `flag` names the
  /// option in errors.
  void save(const std::filesystem::path& path, bool overwrite,
            std::string_view flag = "--save-logits") const {
    // A temporary file renamed into place: a full disk leaves no truncated file behind.
    moekit::io::write_file_atomically(path, to_bytes(), overwrite, flag);
  }

  /// The file's bytes (version 2), as `save` writes them.
  [[nodiscard]] std::vector<std::byte> to_bytes() const {
    std::vector<std::byte> out;
    out.reserve(header_bytes + positions() * (8 + 8 * std::size_t{k_}));
    auto put = [&](const auto& v) {
      const auto* p = reinterpret_cast<const std::byte*>(&v);
      out.insert(out.end(), p, p + sizeof v);
    };
    for (char c : magic) put(c);
    put(version);
    put(vocab_);
    put(k_);
    put(ctx_);
    put(std::uint64_t{positions()});
    for (std::size_t i = 0; i < positions(); ++i) {
      put(targets_[i]);
      put(target_lp_[i]);
      for (std::uint32_t id : ids(i)) put(id);
      for (float lp : logprobs(i)) put(lp);
    }
    return out;
  }

  /// Reads and checks a file; throws `Error(invalid_format)` naming `flag`, the path and the field.
  static LogProbFile load(const std::filesystem::path& path,
                          std::string_view flag = "--kl-reference") {
    require_regular_file(path, flag);
    std::ifstream in(path, std::ios::binary);
    if (!in)
      moekit::detail::fail(moekit::ErrorKind::io,
                           std::string(flag) + ": cannot open '" + path.string() + "'");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse(bytes, path.string(), flag);
  }

  /// Checks and decodes the bytes of a .mklogp file; errors name `flag`, `file` and the field.
  static LogProbFile parse(std::string_view bytes, const std::string& file,
                           std::string_view flag = "--kl-reference") {
    const std::string where = std::string(flag) + ": '" + file + "': ";
    auto bad = [&](const std::string& why) {
      moekit::detail::fail(moekit::ErrorKind::invalid_format, where + why);
    };
    std::size_t at = 0;
    auto get = [&]<class T>(T& v) {
      if (bytes.size() - at < sizeof v) bad("truncated");
      std::memcpy(&v, bytes.data() + at, sizeof v);
      at += sizeof v;
    };
    if (bytes.size() < header_bytes || std::memcmp(bytes.data(), magic, 8) != 0)
      bad("not a .mklogp file (bad magic)");
    at = 8;
    std::uint32_t ver = 0, vocab = 0, k = 0, ctx = 0;
    std::uint64_t n = 0;
    get(ver);
    get(vocab);
    get(k);
    get(ctx);
    get(n);
    if (ver != 1 && ver != version)
      bad("version " + std::to_string(ver) + " is not supported (expected 1 or 2)");
    if (vocab == 0 || k == 0 || k > vocab) bad("K must be in [1, vocab]");
    if (ver == 1 && ctx != 0) bad("reserved field is not 0");
    const std::uint64_t record = 8 + 8 * std::uint64_t{k};
    if (n > (bytes.size() - header_bytes) / record || header_bytes + n * record != bytes.size())
      bad("size does not match " + std::to_string(n) + " positions of K = " + std::to_string(k));
    LogProbFile f(vocab, k);
    f.ctx_ = ctx;
    f.targets_.resize(n);
    f.target_lp_.resize(n);
    f.ids_.resize(n * k);
    f.lp_.resize(n * k);
    for (std::uint64_t i = 0; i < n; ++i) {
      get(f.targets_[i]);
      get(f.target_lp_[i]);
      for (std::uint32_t j = 0; j < k; ++j) get(f.ids_[i * k + j]);
      for (std::uint32_t j = 0; j < k; ++j) get(f.lp_[i * k + j]);
      const std::string pos = "position " + std::to_string(i) + ": ";
      if (f.targets_[i] >= vocab) bad(pos + "target token out of range");
      if (!(f.target_lp_[i] <= 0.f)) bad(pos + "target log-prob is not a number <= 0");
      for (std::uint32_t j = 0; j < k; ++j) {
        const float lp = f.lp_[i * k + j];
        if (f.ids_[i * k + j] >= vocab) bad(pos + "token id out of range");
        if (!(lp <= 0.f) || !std::isfinite(lp)) bad(pos + "log-prob is not finite and <= 0");
        if (j > 0 && lp > f.lp_[i * k + j - 1]) bad(pos + "log-probs are not descending");
      }
    }
    return f;
  }

 private:
  std::uint32_t vocab_ = 0, k_ = 0, ctx_ = 0;
  std::vector<std::uint32_t> targets_;
  std::vector<float> target_lp_;
  std::vector<std::uint32_t> ids_;
  std::vector<float> lp_;
};

}  // namespace moekit::engine
