#pragma once
/// \file Which checkpoint an expert store belongs to. A store records the fingerprint of the
/// checkpoint it was built from (names, sizes and modification times of its weight files:
/// `checkpoint_fingerprint`, `file_fingerprint`); a store opened with another checkpoint of the
/// same shape, or with its own checkpoint changed since, would run silently with foreign or stale
/// experts. `check_store_origin` refuses that, naming both, unless the caller forces it.

#include <filesystem>
#include <string>

#include "moekit/error.hpp"
#include "moekit/io/expert_store.hpp"

#include "moekit/engine/expert_source.hpp"

namespace moekit::engine {

/// The fingerprint of the checkpoint a run reads its dense part from: the GGUF file `gguf`, else
/// the Hugging Face directory `dir` (as the store builders record it).
inline std::string current_checkpoint_fingerprint(const std::filesystem::path& dir,
                                                  const std::filesystem::path& gguf) {
  return gguf.empty() ? checkpoint_fingerprint(dir) : file_fingerprint(gguf);
}

/// Throws `Error(invalid_argument)` naming `flag` (how the store was given), the store, the
/// checkpoint it records and the one given, unless `store` was built from the checkpoint at
/// `dir`/`gguf` as it is now, or `force`.
inline void check_store_origin(const moekit::io::ExpertStore& store,
                               const std::filesystem::path& dir, const std::filesystem::path& gguf,
                               bool force, const std::string& flag) {
  if (force) return;
  const auto& meta = store.manifest().meta;
  const std::string given = (gguf.empty() ? dir : gguf).string();
  const std::string recorded_fp = meta.value("checkpoint_fingerprint", std::string());
  std::string recorded = meta.value("gguf", std::string());
  if (recorded.empty()) recorded = meta.value("checkpoint_dir", std::string("(not recorded)"));
  const std::string head = flag + ": expert store '" + store.path() + "' ";
  if (recorded_fp.empty())
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        head + "records no checkpoint fingerprint, so it cannot be matched with '" +
                            given +
                            "' (rebuild it with moe-convert, or pass --force to use it "
                            "anyway)");
  const std::string now = current_checkpoint_fingerprint(dir, gguf);
  if (now == recorded_fp) return;
  throw moekit::Error(
      moekit::ErrorKind::invalid_argument,
      head + "was built from the checkpoint '" + recorded + "' (fingerprint " + recorded_fp +
          "), but the checkpoint given is '" + given + "' (fingerprint " + now +
          "): another checkpoint, or this one changed since the store was built; its experts "
          "would not match the dense part (rebuild the store with moe-convert, or pass --force "
          "to use it anyway)");
}

}  // namespace moekit::engine
