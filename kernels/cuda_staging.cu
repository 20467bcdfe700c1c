// Compiles the host→device staging path (include/moekit/io/cuda_staging.hpp) with nvcc, so the
// CUDA runtime calls of CudaCopyEngine are type-checked for the configured architectures.
// Compiled only: moekit's machines have no GPU, so none of this has been run.
#include "moekit/io/byte_source.hpp"
#include "moekit/io/cuda_staging.hpp"

namespace moekit::io {

static_assert(CudaCopyEngine::available, "nvcc must see the CUDA CudaCopyEngine");

// Explicit instantiations: every member of the pipeline over the CUDA engine, for file sources.
template class StagingPipeline<CudaCopyEngine>;
template void StagingPipeline<CudaCopyEngine>::load<PreadSource>(const PreadSource&, BlobRange,
                                                                 void*);
template void StagingPipeline<CudaCopyEngine>::load<MmapSource>(const MmapSource&, BlobRange,
                                                                void*);

}  // namespace moekit::io
