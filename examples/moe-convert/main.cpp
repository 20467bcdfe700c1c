// moe-convert: writes the expert store of a Mixture-of-Experts checkpoint — every routed expert at
// each requested precision as one 4 KiB-aligned blob [w1][w3][w2] (the layout moe-run reads with
// O_DIRECT). Resumable (an interrupted run keeps the blobs it finished), refuses to overwrite an
// existing store unless --force, and verifies every checksum at the end.
//
//   moe-convert -m models/moekit-tiny-moe -o tiny.moestore --precisions f16,q8,q4,q2
//   moe-run -m tiny.moestore -p "The history of"        (dense part from the recorded checkpoint)

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/tools/progress.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<moekit::Precision> parse_precisions(const std::string& text) {
  std::vector<moekit::Precision> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto p = moekit::parse_precision(item);
    if (!p || *p == moekit::Precision::skip)
      throw moekit::Error(moekit::ErrorKind::invalid_argument,
                          "--precisions: '" + item + "' is not one of f32, bf16, f16, q8, q4, q2");
    for (moekit::Precision q : out)
      if (q == *p)
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            "--precisions: '" + item + "' is listed twice");
    out.push_back(*p);
  }
  if (out.empty())
    throw moekit::Error(moekit::ErrorKind::invalid_argument, "--precisions: empty list");
  return out;
}

int run(const std::string& model, const std::string& out, const std::string& precisions_text,
        const std::string& layout, bool force, bool resume) {
  const auto precisions = parse_precisions(precisions_text);
  const auto order = moekit::engine::parse_layout_word(layout);
  if (!order)
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        "--layout: '" + layout + "' is not one of " + moekit::engine::layout_words);
  // Before any encoding: the directory exists and is writable, -o is not a directory or device
  // (never replaced, even with --force), an existing store only with --force.
  moekit::io::check_output_path(out, force, "-o");
  if (!fs::exists(model))
    throw moekit::Error(moekit::ErrorKind::invalid_argument, "-m: '" + model + "' does not exist");
  moekit::io::ExpertStoreWriteOptions wo;
  wo.overwrite = force;
  wo.resume = resume;
  wo.verify = false;  // verified below, with a progress bar
  wo.order = *order;
  wo.encode_threads = moekit::engine::store_encode_threads();
  moekit::tools::Progress encode_bar("encoding blobs", 0, moekit::tools::ProgressUnit::items,
                                     false);
  wo.progress = [&](std::size_t d, std::size_t t) {
    encode_bar.set_total(t), encode_bar.update(d);
  };
  moekit::io::ExpertStoreWriteReport r;
  if (fs::is_regular_file(model) && moekit::engine::is_gguf_file(model)) {  // by magic, as moe-run
    r = moekit::engine::build_store_from_gguf(model, precisions, out, wo);
  } else if (fs::is_directory(model) && fs::exists(fs::path(model) / "config.json")) {
    const moekit::engine::ModelConfig cfg = moekit::engine::load_config(model);
    r = moekit::engine::build_store_from_checkpoint(cfg, model, precisions, out, wo);
  } else {
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        "-m: '" + model +
                            "' is neither a Hugging Face model directory (config.json "
                            "+ safetensors) nor a .gguf file");
  }
  const auto store = moekit::io::ExpertStore::open(out);
  encode_bar.finish();
  moekit::tools::Progress verify_bar("verifying blobs", 0, moekit::tools::ProgressUnit::items,
                                     false);
  store.verify(
      [&](std::size_t d, std::size_t t) { verify_bar.set_total(t), verify_bar.update(d); });
  verify_bar.finish();
  std::fprintf(stderr,
               "%s: %zu blobs encoded, %zu resumed from an interrupted run, %llu bytes, "
               "checksums verified\n",
               out.c_str(), r.blobs_encoded, r.blobs_resumed,
               static_cast<unsigned long long>(r.file_bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("moe-convert: build a moekit expert store from a Hugging Face checkpoint or GGUF");
  std::string model, out, precisions = "f16,q8,q4,q2", layout = "rows";
  bool force = false, no_resume = false;
  app.add_option("-m,--model", model, "Hugging Face model directory or .gguf file")->required();
  app.add_option("-o,--output", out, "expert store to write")->required();
  app.add_option("--precisions", precisions,
                 "comma-separated stored precisions: f32, bf16, f16, q8, q4, q2")
      ->capture_default_str();
  app.add_option("--layout", layout,
                 "where the rows of the quantized experts go: rows, panels (four rows "
                 "interleaved every 512 columns: what the CPU's int8 kernels read fastest), or "
                 "blocked-panels (panels in groups of 16, in column blocks of at most 4096 "
                 "columns: faster again on wider rows; docs/formats.md)")
      ->capture_default_str();
  app.add_flag("--force", force, "overwrite an existing store");
  app.add_flag("--no-resume", no_resume, "ignore the blobs of an interrupted run");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(model, out, precisions, layout, force, !no_resume);
  } catch (const moekit::Error& e) {
    std::cerr << "moe-convert: " << e.message() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "moe-convert: " << e.what() << "\n";
  }
  return 1;
}
