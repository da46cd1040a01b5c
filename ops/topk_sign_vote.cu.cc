// CUDA kernel of Dclens>TopkSignVote.  The device code itself is in
// topk_sign_vote_kernel.h (shared with the CPU op and the standalone harness
// cuda_harness.cu); this file only gives the TF op a launcher compiled by nvcc.
// Build: `make -C ops cuda` (nvcc -DGOOGLE_CUDA=1).
#if GOOGLE_CUDA

#include <cuda_runtime.h>

#include <cstdint>

#include "topk_sign_vote_kernel.h"

namespace dclens {

cudaError_t LaunchTopkSignVoteGpu(const float* grads, const float* uniforms,
                                  int64_t teachers, int64_t images, int64_t dim, int64_t k,
                                  float c, bool stochastic, int32_t* out, void* stream) {
  return vote::launch_topk_sign_vote(grads, uniforms, teachers, images, dim, k, c,
                                     stochastic, out, static_cast<cudaStream_t>(stream));
}

const char* CudaErrorString(cudaError_t error) { return cudaGetErrorString(error); }

}  // namespace dclens

#endif  // GOOGLE_CUDA
