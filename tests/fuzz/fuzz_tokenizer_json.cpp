// libFuzzer target: moe-run's byte-level BPE tokenizer (moekit/engine/bpe_vocab.hpp). The input
// is a tokenizer.json; it must load or raise moekit::Error, and a vocabulary that loads must
// encode any bytes (the input itself included, valid UTF-8 or not) and decode what it encoded.
// It goes through from_tokenizer_json_text, the parser from_tokenizer_json runs on a file's text,
// so no file is written per input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/error.hpp"

#include "moekit/engine/bpe_vocab.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto vocab = moekit::engine::BpeVocab::from_tokenizer_json_text(text);
    for (std::string_view s :
         {std::string_view("Hello world's 12 tokens\n\n  ok"), text.substr(0, 512)}) {
      const auto ids = vocab.encode(s);
      (void)vocab.decode(ids);
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
