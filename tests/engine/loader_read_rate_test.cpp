// moe-calibrate's read rates through moe-run's own loaders (engine/loader_read_rate.hpp): each
// path alone reads what it is asked, and both at once read while the other does, their rates
// summed over the same wall time; a store that does not open is an error naming it.

#include <catch2/catch.hpp>

#include <cstddef>
#include <filesystem>
#include <vector>

#include "moekit/engine/loader_read_rate.hpp"
#include "moekit/io/expert_store.hpp"

#include "engine_test_support.hpp"

// A namespace of its own: the engine tests are compiled as one unity translation unit.
namespace loader_read_rate_test {

using namespace moekit::engine;
using moekit::Precision;
namespace fs = std::filesystem;

const fs::path checkpoint = engine_test::data_dir() / "mixtral" / "model-q8_0.gguf";

// A q4 store at the checkpoint's shape (the rates read its bytes, whatever they hold).
fs::path q4_store(const fs::path& file) {
  const moekit::ModelShape s = checkpoint_path_loader(checkpoint).shape;
  const std::vector<Precision> ps{Precision::q4};
  moekit::io::write_expert_store(file.string(), s, ps, [&](moekit::ExpertKey k, Precision p) {
    return std::vector<std::byte>(s.expert_bytes(p), std::byte(k.expert + 1));
  });
  return file;
}

TEST_CASE("loader read rates: each path alone, and both at once summed", "[engine][calibrate]") {
  if (!fs::exists(checkpoint)) {
    WARN("fixture " << checkpoint << " is missing; skipped");
    return;
  }
  const fs::path dir = engine_test::scratch("loader-read-rate", "paths");
  const fs::path store = q4_store(dir / "experts.moestore");
  const StoreIo io{.io_threads = 1};

  const LoaderReadRate a = loader_read_rate(checkpoint, 5, io, 2);
  CHECK(a.experts == 5);
  CHECK(a.precision == Precision::q8);
  CHECK(a.bytes_per_s > 0);
  CHECK(a.cpu_s_per_byte >= 0);
  // More loads than the file has experts go around again from the first.
  const ReadPathLoader path = checkpoint_path_loader(checkpoint, io);
  const auto all = static_cast<std::uint32_t>(path.shape.expert_count());
  CHECK(loader_read_rate(checkpoint, all + 3, io, 2).experts == all + 3);

  const LoaderReadRate b = store_read_rate(store, 4, io, 1);
  CHECK(b.experts == 4);
  CHECK(b.precision == Precision::q4);

  const BothPathsReadRate both = read_both_paths(checkpoint, store, 6, io, 2, 1);
  CHECK(both.in_place.experts == 6);
  CHECK(both.in_place.precision == Precision::q8);
  CHECK(both.store.experts >= 1);  // it read until the in-place loads were done
  CHECK(both.store.precision == Precision::q4);
  CHECK(both.bytes_per_s == both.in_place.bytes_per_s + both.store.bytes_per_s);

  CHECK_THROWS_WITH(read_both_paths(checkpoint, dir / "absent.moestore", 2, io, 1, 1),
                    Catch::Contains("absent.moestore"));
}

TEST_CASE("the kernels' delay per byte read: the loader's CPU beyond the spare cores",
          "[engine][calibrate]") {
  LoaderReadRate r;
  r.bytes_per_s = 1e9;
  r.cpu_s_per_byte = 1e-10;                                   // a tenth of a core at that rate
  CHECK(compute_delay_per_byte(r, 2, 2) == Approx(0.5e-10));  // shared by both kernel threads
  CHECK(compute_delay_per_byte(r, 1, 2) == 0.0);              // the spare core absorbs it
  r.cpu_s_per_byte = 2e-9;  // two cores at that rate: one spare, one taken from the kernels
  CHECK(compute_delay_per_byte(r, 1, 2) == Approx(1e-9));
  CHECK(compute_delay_per_byte(r, 4, 2) == Approx(0.5e-9));  // more threads than cores
  r.bytes_per_s = 0;
  CHECK(compute_delay_per_byte(r, 2, 2) == 0.0);
}

}  // namespace loader_read_rate_test
