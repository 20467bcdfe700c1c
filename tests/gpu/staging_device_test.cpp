// StagingPipeline<CudaCopyEngine> moving expert matrices host→device through 1, 2 and 3 pinned
// slots, with the completion order checked: an engine wrapper records an event behind every copy
// and, whenever the pipeline waits, checks that copies complete in submission order and that the
// waited slot's copy (and everything before it) is complete. The device bytes must equal the
// source, and a GEMV launched on the copy stream right after the last load (no host
// synchronisation) must see the whole expert: bit-identical to the same GEMV on a plain upload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "gpu/device_support.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/cuda_staging.hpp"
#include "precision/test_support.hpp"

using namespace moekit;
using namespace moekit::gpu_test;

namespace {

/// Forwards to a CudaCopyEngine and checks the order in which its copies complete.
class OrderCheckingEngine {
 public:
  explicit OrderCheckingEngine(io::CudaCopyEngine& e) : e_(e), last_copy_(e.slot_count(), npos) {}
  ~OrderCheckingEngine() {
    for (cudaEvent_t ev : done_) (void)cudaEventDestroy(ev);
  }
  OrderCheckingEngine(const OrderCheckingEngine&) = delete;
  OrderCheckingEngine& operator=(const OrderCheckingEngine&) = delete;

  [[nodiscard]] std::size_t slot_count() const { return e_.slot_count(); }
  [[nodiscard]] std::size_t slot_bytes() const { return e_.slot_bytes(); }
  std::span<std::byte> slot(std::size_t i) {
    // The pipeline writes a slot only after its last copy completed (or never had one).
    if (last_copy_[i] != npos && cudaEventQuery(done_[last_copy_[i]]) != cudaSuccess)
      violations << " slot " << i << " handed out while copy " << last_copy_[i] << " reads it;";
    (void)cudaGetLastError();  // cudaErrorNotReady is an answer, not an error to report later
    return e_.slot(i);
  }
  void copy_async(std::size_t i, void* dst, std::size_t n) {
    e_.copy_async(i, dst, n);
    cudaEvent_t ev = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    done_.push_back(ev);
    check_cuda(cudaEventRecord(ev, e_.stream()), "cudaEventRecord");
    last_copy_[i] = done_.size() - 1;
    ++copies;
  }
  void wait_slot(std::size_t i) {
    check_prefix("before wait_slot");
    e_.wait_slot(i);
    ++waits;
    // Stream order: slot i's last copy and every copy before it have completed.
    for (std::size_t k = 0; last_copy_[i] != npos && k <= last_copy_[i]; ++k)
      if (cudaEventQuery(done_[k]) != cudaSuccess)
        violations << " wait_slot(" << i << ") returned before copy " << k << " completed;";
    (void)cudaGetLastError();
  }
  void synchronize() {
    check_prefix("before synchronize");
    e_.synchronize();
    for (std::size_t k = 0; k < done_.size(); ++k)
      if (cudaEventQuery(done_[k]) != cudaSuccess)
        violations << " synchronize() left copy " << k << " running;";
    (void)cudaGetLastError();
  }

  std::ostringstream violations;
  std::size_t copies = 0, waits = 0;

 private:
  static constexpr std::size_t npos = ~std::size_t{0};
  /// Completed copies are a prefix of the submitted ones. Queried newest first: a later copy seen
  /// complete means every earlier one (queried after it) must be complete too.
  void check_prefix(const char* when) {
    bool later_done = false;
    for (std::size_t k = done_.size(); k-- > 0;) {
      const bool done = cudaEventQuery(done_[k]) == cudaSuccess;
      if (later_done && !done)
        violations << " " << when << ": copy " << k << " running after a later one completed;";
      later_done = later_done || done;
    }
    (void)cudaGetLastError();
  }

  io::CudaCopyEngine& e_;
  std::vector<cudaEvent_t> done_;  // one event per copy, in submission order
  std::vector<std::size_t> last_copy_;
};

}  // namespace

TEST_CASE("StagingPipeline<CudaCopyEngine> moves experts host->device in order through few slots",
          "[gpu][staging]") {
  INFO("seed " << test::test_seed());
  // Three q4 experts (w1 slices of 96 × 4096: 221184 bytes = 3.4 slots of 64 KiB) back to back in
  // one host "file".
  constexpr std::size_t rows = 96, cols = 4096, experts = 3;
  const Precision p = Precision::q4;
  const QuantScheme s{64, true};
  const std::size_t expert_bytes = matrix_bytes(rows, cols, p, s);
  std::vector<std::byte> file;
  for (std::size_t e = 0; e < experts; ++e) {
    const auto b =
        encode_parallel(test::random_normal(rows * cols, 100 + e, 0.05f), rows, cols, p, s);
    file.insert(file.end(), b.begin(), b.end());
  }
  const io::MemorySource source(file, "experts");
  const auto x = exact_activations(test::random_normal(cols, 99));
  const auto xb = activation_bytes(x, cuda::ActivationType::f32);
  DeviceBytes dx(xb.size());
  dx.upload(xb);

  for (std::size_t slots : {1u, 2u, 3u}) {
    INFO(slots << " slots of 64 KiB");
    io::CudaCopyEngine cuda_engine(io::CudaCopyEngine::Config{slots, 64u << 10, -1});
    OrderCheckingEngine engine(cuda_engine);
    io::StagingPipeline pipeline(engine);
    std::vector<std::unique_ptr<DeviceBytes>> dst;
    DeviceBytes y_staged(experts * rows * 4), y_plain(experts * rows * 4);
    for (std::size_t e = 0; e < experts; ++e) {
      dst.push_back(std::make_unique<DeviceBytes>(expert_bytes));
      pipeline.load(source, {e * expert_bytes, expert_bytes}, dst.back()->data());
      // On the copy stream, without waiting on the host: stream order must make the expert whole.
      const MatrixView v{dst.back()->data(), rows, cols, p, s};
      cuda::gemv(v, dx.data(), cuda::ActivationType::f32,
                 reinterpret_cast<float*>(y_staged.data(e * rows * 4)), 1.f, false,
                 cuda_engine.stream());
    }
    pipeline.synchronize();
    check_cuda(cudaStreamSynchronize(cuda_engine.stream()), "gemv on the copy stream");
    CHECK(engine.violations.str() == "");
    CHECK(engine.copies == experts * ((expert_bytes + (64u << 10) - 1) / (64u << 10)));
    if (slots < engine.copies)
      CHECK(engine.waits > 0);  // the slots were reused: the waits were exercised
    for (std::size_t e = 0; e < experts; ++e) {
      INFO("expert " << e);
      const auto got = dst[e]->download<std::byte>(expert_bytes);
      CHECK(std::equal(got.begin(), got.end(),
                       file.begin() + static_cast<std::ptrdiff_t>(e * expert_bytes)));
      const DeviceMatrix plain(
          std::span<const std::byte>(file).subspan(e * expert_bytes, expert_bytes),
          MatrixView{nullptr, rows, cols, p, s}, 0);
      cuda::gemv(plain.view, dx.data(), cuda::ActivationType::f32,
                 reinterpret_cast<float*>(y_plain.data(e * rows * 4)), 1.f, false, nullptr);
    }
    check_cuda(cudaDeviceSynchronize(), "gemv on the plain upload");
    CHECK(y_staged.download<float>(experts * rows) == y_plain.download<float>(experts * rows));
  }
}
