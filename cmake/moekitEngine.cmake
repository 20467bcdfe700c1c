# moekit::engine — the engine library (include/moekit/engine/): model config, weights, attention,
# MoE layer, model, tokenizers, KV cache, sampler, expert sources, calibration, and moe-run's
# command line. Header-only like the core; it adds the engine's own Debian dependencies
# (tokenizers: SentencePiece, PCRE2, utf8proc; command line: CLI11). The tools, the engine tests
# and the engine benchmarks link it; a consumer of the core alone never needs these libraries.
set(moekit_engine_required "")
if(MOEKIT_BUILD_EXAMPLES OR MOEKIT_BUILD_TESTS OR MOEKIT_BUILD_BENCHMARKS OR MOEKIT_BUILD_FUZZERS)
  set(moekit_engine_required REQUIRED)
endif()
find_package(Threads ${moekit_engine_required})
find_package(CLI11 ${moekit_engine_required})
find_package(PkgConfig ${moekit_engine_required})
if(PkgConfig_FOUND)
  pkg_check_modules(SENTENCEPIECE ${moekit_engine_required} IMPORTED_TARGET GLOBAL sentencepiece)
  pkg_check_modules(PCRE2 ${moekit_engine_required} IMPORTED_TARGET GLOBAL libpcre2-8)
  pkg_check_modules(UTF8PROC ${moekit_engine_required} IMPORTED_TARGET GLOBAL libutf8proc)
endif()
if(CLI11_FOUND AND SENTENCEPIECE_FOUND AND PCRE2_FOUND AND UTF8PROC_FOUND)
  add_library(moekit_engine INTERFACE)
  add_library(moekit::engine ALIAS moekit_engine)
  target_link_libraries(moekit_engine INTERFACE moekit::moekit Threads::Threads CLI11::CLI11
                        PkgConfig::SENTENCEPIECE PkgConfig::PCRE2 PkgConfig::UTF8PROC)
endif()
