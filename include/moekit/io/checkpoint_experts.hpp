#pragma once
/// \file Routed experts read in place from the checkpoint that holds them (GGUF or safetensors),
/// with no converted copy: `CheckpointExperts` records where each expert's three matrices lie in
/// the files, and `CheckpointExpertSource` is a ByteSource that reads a whole expert blob
/// (io/expert_blob.hpp) from them. Each blob has a virtual offset (its index × its size), which
/// is what `blob()` hands an AsyncLoader, so the loader's queues, priorities and cancellation
/// serve checkpoints as they serve expert stores.
///
/// A file's bytes become blob bytes in one of two ways, both without rounding anything again:
/// - as they are: F32, F16 and BF16 matrices are moekit's f32/f16/bf16 rows byte for byte;
/// - transcoded: GGUF Q8_0 and Q4_0 blocks are moekit's q8/q4 group-32 symmetric rows with the
///   bytes moved (io/gguf_transcode.hpp), the same values bit for bit;
/// - the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K as they are (moekit's q2_k .. q6_k rows),
///   mixed as GGUF files mix them: each matrix in its slot of a K-quant blob (core/model_shape.hpp,
///   KquantBlob) at its own type, which the blob's tag names.
/// Other types (Q8_0/Q4_0 under another scheme, or types mixed other than K-quants among
/// themselves) have no exact path: `in_place_precision` says so, and the caller converts them once
/// into a store instead. `CheckpointExperts::locate_as_f32` reads every type
/// io/dequantize.hpp knows, K-quants and mixes of types included, as f32 rows dequantized chunk by
/// chunk on read: their exact values (gguf-py's, bit for bit) at four bytes a weight, with
/// nothing model-sized in memory. It is the reference that a conversion's loss is measured
/// against (engine/conversion_loss.hpp).
///
/// O_DIRECT needs 4096-aligned offsets; tensors start at 32 (GGUF) or 8 (safetensors) byte
/// boundaries, so each matrix is read as the aligned range covering it, in chunks of whole rows
/// through staging buffers, and the slice is copied or transcoded into the blob while the next
/// chunk is read.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/detail/background_task.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/gguf_transcode.hpp"
#include "moekit/io/tensor.hpp"
#include "moekit/io/tensor_names.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"

namespace moekit::io {

/// The precision an expert matrix stored as `t` is read at in place, or nullopt when no exact
/// path exists. Q8_0/Q4_0 map onto q8/q4 only with the group-32 symmetric scheme; the K-quants
/// Q2_K..Q6_K are moekit formats as they lie (q2_k..q6_k), whatever the scheme.
inline std::optional<Precision> in_place_precision(DType t, QuantScheme scheme) noexcept {
  switch (t) {
    case DType::f32:
      return Precision::f32;
    case DType::f16:
      return Precision::f16;
    case DType::bf16:
      return Precision::bf16;
    default:
      if (const auto k = in_place_moekit_precision(t)) return k;
      return scheme == gguf_exact_scheme ? exact_moekit_precision(t) : std::nullopt;
  }
}

/// Where one expert matrix lies: which file, at which absolute offset, in which type.
struct TensorLocation {
  std::uint32_t file = 0;    ///< index into CheckpointExperts::files()
  std::uint64_t offset = 0;  ///< absolute offset in that file
  std::uint64_t bytes = 0;
  DType dtype = DType::f32;
  std::uint64_t rows = 0, cols = 0;
};

/// Where every routed expert of a checkpoint lies, and the one precision they are read at.
class CheckpointExperts {
 public:
  using Matrices = std::array<TensorLocation, 3>;  ///< w1 (gate), w3 (up), w2 (down)

  /// Locates every expert of `shape` in `reader`; `layers[l]` is the checkpoint's decoder layer
  /// holding MoE layer l. Throws `Error(unsupported)` naming a tensor whose type has no exact
  /// in-place path, or whose type differs from the first expert's (one precision per run), unless
  /// both are K-quants: then `shape().kquant` describes the K-quant blob they are read into.
  template <TensorReader R>
  static CheckpointExperts locate(const R& reader, Architecture arch, TensorFormat format,
                                  const ModelShape& shape, std::span<const std::uint32_t> layers) {
    return locate_typed(reader, arch, format, shape, layers, false);
  }

  /// As `locate`, but every expert matrix is read as f32 rows, dequantized on read from any type
  /// io/dequantize.hpp reads (the matrices may differ in type, as in Q4_K_M files).
  template <TensorReader R>
  static CheckpointExperts locate_as_f32(const R& reader, Architecture arch, TensorFormat format,
                                         const ModelShape& shape,
                                         std::span<const std::uint32_t> layers) {
    return locate_typed(reader, arch, format, shape, layers, true);
  }

  /// The shape given to `locate`, with `kquant` set when the experts are K-quants.
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  /// The precision every expert is read at (the checkpoint's own, mapped exactly; f32 when
  /// dequantized).
  [[nodiscard]] Precision precision() const noexcept { return precision_; }
  /// The checkpoint's type of the expert matrices (of the first one when dequantized).
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  /// True when read by `locate_as_f32`.
  [[nodiscard]] bool dequantized() const noexcept { return dequantized_; }
  [[nodiscard]] const std::vector<std::string>& files() const noexcept { return files_; }
  [[nodiscard]] const Matrices& matrices(ExpertKey k) const {
    return matrices_.at(shape_.index(k));
  }
  /// Bytes of every expert matrix as the files store them.
  [[nodiscard]] std::uint64_t stored_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const Matrices& m : matrices_)
      for (const TensorLocation& t : m) b += t.bytes;
    return b;
  }

 private:
  template <TensorReader R>
  static CheckpointExperts locate_typed(const R& reader, Architecture arch, TensorFormat format,
                                        const ModelShape& shape,
                                        std::span<const std::uint32_t> layers, bool as_f32) {
    MOEKIT_EXPECTS(layers.size() == shape.n_layers, "CheckpointExperts: one layer per MoE layer");
    CheckpointExperts c;
    c.shape_ = shape;
    c.dequantized_ = as_f32;
    c.matrices_.resize(shape.expert_count());
    std::map<std::string, std::uint32_t, std::less<>> file_index;
    for (std::uint32_t l = 0; l < shape.n_layers; ++l)
      for (std::uint32_t e = 0; e < shape.n_experts; ++e) {
        const ExpertMatrices m = find_expert_matrices(reader, arch, format, {layers[l], e}, shape);
        Matrices& out = c.matrices_[shape.index({l, e})];
        for (std::size_t i = 0; i < 3; ++i) {
          const TensorView& t = m[all_expert_matrices[i]];
          c.check_type(t, i);
          auto [it, added] = file_index.try_emplace(std::string(t.file),
                                                    static_cast<std::uint32_t>(c.files_.size()));
          if (added) c.files_.emplace_back(t.file);
          out[i] = {it->second, t.file_offset, t.bytes.size(), t.dtype, t.rows(), t.cols()};
        }
      }
    if (!as_f32 && is_gguf_kquant(c.precision_)) {
      c.shape_.kquant = {c.precision_, c.widest_[0], c.widest_[1], c.widest_[2]};
      c.shape_.validate();
    }
    return c;
  }

  // `role`: 0 w1, 1 w3, 2 w2.
  void check_type(const TensorView& t, std::size_t role) {
    if (dequantized_) {  // every type io/dequantize reads, mixed or not
      if (!typed_) dtype_ = t.dtype;
      typed_ = true;
      precision_ = Precision::f32;
      return;
    }
    const std::optional<Precision> p = in_place_precision(t.dtype, shape_.quant);
    if (!p)
      throw Error(ErrorKind::unsupported,
                  t.where() + ": type " + std::string(name(t.dtype)) +
                      " has no exact in-place path (F32, F16, BF16, and Q8_0/Q4_0 with group-32 "
                      "symmetric experts)");
    if (is_gguf_kquant(*p) && t.cols() % kquant_block_weights != 0)
      throw Error(ErrorKind::unsupported, t.where() + ": " + std::string(name(t.dtype)) +
                                              " rows of " + std::to_string(t.cols()) +
                                              " columns are not whole 256-weight super-blocks");
    if (!typed_) {
      typed_ = true;
      dtype_ = t.dtype;
      precision_ = *p;
    }
    if (is_gguf_kquant(*p) && is_gguf_kquant(precision_)) {  // K-quants mix: a slot per matrix
      Precision& w = widest_[role];
      if (w == Precision::skip || kquant_block_bytes(*p) > kquant_block_bytes(w)) w = *p;
    } else if (t.dtype != dtype_) {
      throw Error(ErrorKind::unsupported, t.where() + ": type " + std::string(name(t.dtype)) +
                                              " differs from the " + std::string(name(dtype_)) +
                                              " of the first expert matrix; experts of mixed "
                                              "types are read through an expert store");
    }
  }

  ModelShape shape_{};
  std::vector<std::string> files_;
  std::vector<Matrices> matrices_;
  bool typed_ = false;
  bool dequantized_ = false;
  DType dtype_ = DType::f32;
  Precision precision_ = Precision::f32;
  Precision widest_[3] = {Precision::skip, Precision::skip, Precision::skip};
};

/// A ByteSource over a checkpoint's experts: blob i (`shape.index(key)`) at virtual offset
/// i × expert_bytes. `FileSource` reads one file (e.g. PreadSource with O_DIRECT). Reads whole
/// blobs only. Thread-safe when `FileSource::read` is (the staging buffers are per thread).
template <ByteSource FileSource>
class CheckpointExpertSource {
 public:
  struct Config {
    MatrixOrder order = MatrixOrder::rows;  ///< where the rows of a quantized blob go
    /// Bytes read at once per loader thread (two such buffers: one read, one converted): whole
    /// rows of the largest expert matrices fit many times over, and the buffers stay small next
    /// to one expert.
    std::uint64_t staging_bytes = 8u << 20;
  };

  /// `files[i]` reads `experts->files()[i]`.
  CheckpointExpertSource(std::shared_ptr<const CheckpointExperts> experts,
                         std::vector<FileSource> files, Config config = {})
      : experts_(std::move(experts)),
        files_(std::move(files)),
        order_(config.order),
        staging_bytes_(config.staging_bytes) {
    MOEKIT_EXPECTS(files_.size() == experts_->files().size(),
                   "CheckpointExpertSource: one source per checkpoint file");
    if (!is_quantized(experts_->precision())) order_ = MatrixOrder::rows;
  }

  /// Blob of `k` at `p` as an AsyncLoader locates it; `p` must be the checkpoint's precision.
  [[nodiscard]] StoreBlob blob(ExpertKey k, Precision p) const {
    const ModelShape& s = experts_->shape();
    if (p != experts_->precision())
      throw Error(ErrorKind::unsupported, "checkpoint experts are read in place at " +
                                              std::string(moekit::name(experts_->precision())) +
                                              ", not at " + std::string(moekit::name(p)));
    MOEKIT_EXPECTS(s.contains(k), "CheckpointExpertSource: expert key outside the model");
    return StoreBlob{k, p, s.index(k) * s.expert_bytes(p), s.expert_bytes(p), 0};
  }

  void read(BlobRange r, std::span<std::byte> dest) const {
    const ModelShape& s = experts_->shape();
    const std::uint64_t n = s.expert_bytes(experts_->precision());
    if (r.offset % n != 0 || r.bytes != n || r.offset / n >= s.expert_count() || dest.size() < n)
      throw Error(ErrorKind::invalid_argument,
                  "checkpoint expert source: reads whole expert blobs only (offset " +
                      std::to_string(r.offset) + ", " + std::to_string(r.bytes) + " bytes)");
    const std::uint64_t index = r.offset / n;
    const ExpertKey k{static_cast<std::uint32_t>(index / s.n_experts),
                      static_cast<std::uint32_t>(index % s.n_experts)};
    if (s.kquant.set()) return read_kquant_blob(k, dest.first(n));
    std::array<MatrixTarget, 3> targets;
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const TensorLocation& m = experts_->matrices(k)[i];
      const std::uint64_t out = matrix_bytes(m.rows, m.cols, experts_->precision(), s.quant);
      targets[i] = {&m, dest.subspan(at, out)};
      at += out;
    }
    read_matrices(targets);
  }

  [[nodiscard]] std::string name() const {
    return experts_->files().empty() ? std::string("(no files)") : experts_->files().front();
  }
  [[nodiscard]] const CheckpointExperts& experts() const noexcept { return *experts_; }
  [[nodiscard]] MatrixOrder order() const noexcept { return order_; }

 private:
  static constexpr std::uint64_t page = 4096;
  /// Rows of one blocked_panels4 group, a whole number of panels4 panels.
  static constexpr std::uint64_t rows_per_group = PanelLayout::height * PanelLayout::blocked_group;

  // A K-quant blob: each matrix's bytes as they lie, at the start of its slot, then the tag.
  void read_kquant_blob(ExpertKey k, std::span<std::byte> dest) const {
    const KquantBlob& kb = experts_->shape().kquant;
    const Precision slots[3] = {kb.w1, kb.w3, kb.w2};
    std::array<Precision, 3> types{};
    std::array<MatrixTarget, 3> targets;
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const TensorLocation& m = experts_->matrices(k)[i];
      types[i] = *in_place_moekit_precision(m.dtype);
      targets[i] = {&m, dest.subspan(at, matrix_bytes(m.rows, m.cols, types[i]))};
      at += matrix_bytes(m.rows, m.cols, slots[i]);
    }
    read_matrices(targets);
    write_kquant_tag(dest, types);
  }

  // Where one matrix of a blob goes.
  struct MatrixTarget {
    const TensorLocation* m = nullptr;
    std::span<std::byte> dest;
  };
  // Rows of one matrix read (and converted) at once.
  struct Chunk {
    const MatrixTarget* target = nullptr;
    std::uint64_t r0 = 0, rows = 0;
  };

  // The matrices into their places in the blob's format and order, in chunks of whole rows.
  // Each chunk's covering range is read on a thread of the caller's own while the chunk before
  // it is converted on the caller's, so the disk does not wait for the conversion (one missed
  // expert at a time is what a decode step waits for: bench/RESULTS.md, "Reading ahead of the
  // conversion"). A chunk is a whole number of panel groups, whose bytes are the same contiguous
  // range whether the chunk is packed alone or as part of the matrix.
  void read_matrices(std::span<const MatrixTarget> targets) const {
    std::vector<Chunk> chunks;
    for (const MatrixTarget& t : targets) {
      const std::uint64_t per = rows_per_chunk(*t.m);
      for (std::uint64_t r0 = 0; r0 < t.m->rows; r0 += per)
        chunks.push_back({&t, r0, std::min(per, t.m->rows - r0)});
    }
    ReadAhead& ahead = thread_read_ahead();
    std::span<const std::byte> in[2];
    const auto fetch = [&](std::size_t i) {
      const TensorLocation& m = *chunks[i].target->m;
      const std::uint64_t src_row = m.bytes / m.rows;
      in[i % 2] = read_range(ahead.staging[i % 2], m.file, m.offset + chunks[i].r0 * src_row,
                             chunks[i].rows * src_row);
    };
    ahead.task.start([&] { fetch(0); });
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      ahead.task.wait();
      if (i + 1 < chunks.size()) ahead.task.start([&fetch, i] { fetch(i + 1); });
      try {
        convert_chunk(chunks[i], in[i % 2]);
      } catch (...) {
        try {
          ahead.task.wait();  // the read ahead writes into staging: let it end first
        } catch (...) {       // the conversion's error is the one to report
        }
        throw;
      }
    }
  }

  [[nodiscard]] std::uint64_t rows_per_chunk(const TensorLocation& m) const {
    const std::uint64_t src_row = m.bytes / m.rows;
    return std::max<std::uint64_t>(rows_per_group,
                                   (staging_bytes_ - std::min(staging_bytes_, 2 * page)) / src_row /
                                       rows_per_group * rows_per_group);
  }

  // One chunk's rows, read into `src`, converted into their place.
  void convert_chunk(const Chunk& c, std::span<const std::byte> src) const {
    const TensorLocation& m = *c.target->m;
    const Precision p = experts_->precision();
    const std::uint64_t src_row = m.bytes / m.rows;
    const std::uint64_t dst_row =  // a K-quant matrix at its own type, the bytes as they are
        is_gguf_kquant(p) ? src_row : row_bytes(m.cols, p, experts_->shape().quant);
    const std::span<std::byte> out = c.target->dest.subspan(c.r0 * dst_row, c.rows * dst_row);
    if (experts_->dequantized() && m.dtype != DType::f32)
      dequantize_rows(m, src, c.rows, out);
    else if (m.dtype == DType::q8_0 || m.dtype == DType::q4_0)
      transcode_matrix(m.dtype, src, c.rows, m.cols, out, order_, "checkpoint expert");
    else
      std::memcpy(out.data(), src.data(), out.size());
  }

  // `rows` rows of `m` (its type's bytes in `src`) as f32 rows into `out`.
  void dequantize_rows(const TensorLocation& m, std::span<const std::byte> src, std::uint64_t rows,
                       std::span<std::byte> out) const {
    TensorView v;
    v.name = "expert matrix";
    v.file = experts_->files().at(m.file);
    v.file_offset = m.offset;
    v.dtype = m.dtype;
    v.rank = 2;
    v.dims = {rows, m.cols, 0, 0};
    v.bytes = src;
    MOEKIT_EXPECTS(out.size() == rows * m.cols * sizeof(float) &&
                       reinterpret_cast<std::uintptr_t>(out.data()) % alignof(float) == 0,
                   "checkpoint expert source: f32 rows need an aligned output of their size");
    dequantize(v, std::span<float>(reinterpret_cast<float*>(out.data()), rows * m.cols));
  }

  // `bytes` at `offset` of file `f`, read into `staging` as the 4096-aligned range covering them.
  std::span<const std::byte> read_range(AlignedBuffer& staging, std::uint32_t f,
                                        std::uint64_t offset, std::uint64_t bytes) const {
    const std::uint64_t start = offset / page * page;
    const std::uint64_t end = (offset + bytes + page - 1) / page * page;
    if (staging.size() < end - start)
      staging = AlignedBuffer(std::max(end - start, staging_bytes_));
    files_[f].read({start, offset + bytes - start}, staging.span().first(end - start));
    return staging.span().subspan(offset - start, bytes);
  }

  // Per calling thread: the thread that reads ahead for it, and the two chunks' staging.
  struct ReadAhead {
    detail::BackgroundTask task;
    AlignedBuffer staging[2];
  };
  static ReadAhead& thread_read_ahead() {
    thread_local ReadAhead ahead;
    return ahead;
  }
  std::shared_ptr<const CheckpointExperts> experts_;
  std::vector<FileSource> files_;
  MatrixOrder order_;
  std::uint64_t staging_bytes_;
};

}  // namespace moekit::io
