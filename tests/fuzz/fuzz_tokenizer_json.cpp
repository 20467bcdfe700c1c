// libFuzzer target: moe-run's byte-level BPE tokenizer (examples/moe-run/bpe_vocab.hpp). The input
// is a tokenizer.json; it must load or raise moekit::Error, and a vocabulary that loads must
// encode any bytes (the input itself included, valid UTF-8 or not) and decode what it encoded.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "moekit/error.hpp"

#include "moekit/engine/bpe_vocab.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The loader reads a file (and a tokenizer_config.json beside it, absent here).
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("moekit-fuzz-tokenizer-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::filesystem::path file = dir / "tokenizer.json";
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  try {
    const auto vocab = moekit::engine::BpeVocab::from_tokenizer_json(file);
    for (std::string_view s :
         {std::string_view("Hello world's 12 tokens\n\n  ok"), text.substr(0, 512)}) {
      const auto ids = vocab.encode(s);
      (void)vocab.decode(ids);
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
