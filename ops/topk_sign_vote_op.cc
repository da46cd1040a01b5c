// The TensorFlow op Dclens>TopkSignVote: TopAgg's per-teacher top-k (stochastic) sign
// votes, summed over teachers.  See dclens/datalens/topagg.py (the pure-TF reference) and
// topk_sign_vote_kernel.h (the math, shared with the CUDA kernel).
//
// CPU kernel: the (teacher, image) rows are split into units (a block of teachers x one
// image); units run on TensorFlow's CPU worker pool.  A unit owns one output row of a
// private partial sum (one partial per teacher block), so no two threads write the same
// memory; the partials are then added (integers: exact, deterministic).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tsl/platform/denormal.h"
#include "topk_sign_vote_kernel.h"

#if GOOGLE_CUDA
#include <cuda_runtime_api.h>

#include "xla/stream_executor/stream.h"
#endif

namespace dclens {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
namespace errors = ::tensorflow::errors;

REGISTER_OP("Dclens>TopkSignVote")
    .Input("grads: float")
    .Input("uniforms: float")
    .Output("votes: int32")
    .Attr("k: int >= 1")
    .Attr("max_grad: float")
    .Attr("stochastic: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      int64_t k;
      bool stochastic;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      TF_RETURN_IF_ERROR(c->GetAttr("stochastic", &stochastic));
      ShapeHandle grads;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &grads));
      DimensionHandle dim = c->Dim(grads, 2);
      if (c->ValueKnown(dim) && c->Value(dim) < k) {
        return errors::InvalidArgument("k=", k, " is larger than the gradient dimension ",
                                       c->Value(dim), " (grads shape ",
                                       c->DebugString(grads), ")");
      }
      if (stochastic) {
        ShapeHandle uniforms;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &uniforms));
        DimensionHandle unused;
        TF_RETURN_IF_ERROR(c->Merge(c->Dim(uniforms, 0), c->Dim(grads, 0), &unused));
        TF_RETURN_IF_ERROR(c->Merge(c->Dim(uniforms, 1), c->Dim(grads, 1), &unused));
        TF_RETURN_IF_ERROR(c->WithValue(c->Dim(uniforms, 2), k, &unused));
      }
      c->set_output(0, c->Matrix(c->Dim(grads, 1), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
TopAgg votes summed over teachers (DataLens, Alg. 2).

For every teacher t and image b: the k coordinates of largest |grads[t, b]| (ties: lower
index first, as tf.math.top_k), clipped to [-max_grad, max_grad] and divided by their
largest magnitude (0 if that is 0), vote +1 / -1: stochastic sign, +1 iff
uniforms[t, b, j] < (1 + n_j) / 2 with j the rank in top-k order; deterministic sign, +1
iff n_j >= 0.  votes[b] is the sum over t of these k-sparse vote vectors.

grads: float32 [teachers, images, dim].
uniforms: float32 [teachers, images, k] U[0, 1) draws in top-k order.  Ignored when
  stochastic is false; it may then be empty (any shape with 0 elements) or [teachers,
  images, k].
votes: int32 [images, dim].
k: the number of votes per teacher and image (1 <= k <= dim).
max_grad: the clip bound c (> 0, not NaN).
stochastic: stochastic sign (true) or deterministic sign (false).
)doc");

// Checks shapes and returns (teachers, images, dim) through the pointers.
static ::tensorflow::Status ValidateInputs(const Tensor& grads, const Tensor& uniforms,
                                           int64_t k, bool stochastic, int64_t* teachers,
                                           int64_t* images, int64_t* dim) {
  if (grads.dims() != 3) {
    return errors::InvalidArgument(
        "grads must be [teachers, images, dim] (rank 3), got rank ", grads.dims(),
        " with shape ", grads.shape().DebugString());
  }
  *teachers = grads.dim_size(0);
  *images = grads.dim_size(1);
  *dim = grads.dim_size(2);
  if (k > *dim) {
    return errors::InvalidArgument("k=", k, " is larger than the gradient dimension ", *dim,
                                   " (grads shape ", grads.shape().DebugString(),
                                   "); use k <= ", *dim);
  }
  if (*dim > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument("the gradient dimension ", *dim,
                                   " does not fit in int32");
  }
  const TensorShape expected({*teachers, *images, k});
  if (stochastic || uniforms.NumElements() != 0) {
    if (uniforms.shape() != expected) {
      return errors::InvalidArgument(
          "uniforms must have shape [teachers, images, k] = ", expected.DebugString(),
          " for grads ", grads.shape().DebugString(), " and k=", k, ", got ",
          uniforms.shape().DebugString(),
          stochastic ? "" : " (with stochastic=false it may also be empty)");
    }
  }
  return absl::OkStatus();
}

class TopkSignVoteOpBase : public OpKernel {
 public:
  explicit TopkSignVoteOpBase(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES_OK(context, context->GetAttr("max_grad", &max_grad_));
    OP_REQUIRES_OK(context, context->GetAttr("stochastic", &stochastic_));
    OP_REQUIRES(context, max_grad_ > 0.0f,
                errors::InvalidArgument("max_grad must be > 0, got ", max_grad_));
  }

 protected:
  // Checks the inputs (see ValidateInputs) and allocates the [images, dim] vote sums.
  absl::Status PrepareOutput(OpKernelContext* context, int64_t* teachers, int64_t* images,
                             int64_t* dim, Tensor** output) const {
    TF_RETURN_IF_ERROR(ValidateInputs(context->input(0), context->input(1), k_, stochastic_,
                                      teachers, images, dim));
    return context->allocate_output(0, TensorShape({*images, *dim}), output);
  }

  int64_t k_ = 1;
  float max_grad_ = 1.0f;
  bool stochastic_ = true;
};

class TopkSignVoteCpuOp : public TopkSignVoteOpBase {
 public:
  using TopkSignVoteOpBase::TopkSignVoteOpBase;

  void Compute(OpKernelContext* context) override {
    const Tensor& grads = context->input(0);
    const Tensor& uniforms = context->input(1);
    int64_t teachers, images, dim;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, PrepareOutput(context, &teachers, &images, &dim, &output));
    int32_t* out = output->flat<int32_t>().data();
    const int64_t out_size = images * dim;
    if (out_size == 0) return;
    if (teachers == 0) {
      std::fill(out, out + out_size, 0);
      return;
    }

    auto* workers = context->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t threads = std::max(1, workers->NumThreads());
    // Teacher blocks: enough units (blocks x images) to balance ~8 per thread, bounded
    // by the number of teachers and by 64M int32 of partial sums.
    int64_t blocks = std::min<int64_t>(teachers, (8 * threads + images - 1) / images);
    blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t{1} << 26) / out_size));
    int32_t* partial = out;
    Tensor partial_tensor;
    if (blocks > 1) {
      OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_INT32,
                                                     TensorShape({blocks * out_size}),
                                                     &partial_tensor));
      partial = partial_tensor.flat<int32_t>().data();
    }

    const float* g = grads.flat<float>().data();
    const float* u = stochastic_ ? uniforms.flat<float>().data() : nullptr;
    const int64_t k = k_;
    const float c = max_grad_;
    const bool stochastic = stochastic_;
    const int64_t per_block = (teachers + blocks - 1) / blocks;
    auto work = [&](int64_t begin, int64_t end) {
      tsl::port::ScopedFlushDenormal flush;  // As TF's own CPU kernels (see the header).
      vote::HostScratch scratch;
      scratch.reserve(dim, k);
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t block = unit / images, b = unit % images;
        int32_t* row_out = partial + block * out_size + b * dim;
        std::fill(row_out, row_out + dim, 0);
        const int64_t t_end = std::min(teachers, (block + 1) * per_block);
        for (int64_t t = block * per_block; t < t_end; ++t) {
          const int64_t row = t * images + b;
          vote::vote_row_host(g + row * dim, stochastic ? u + row * k : nullptr, dim, k, c,
                              stochastic, &scratch, row_out);
        }
      }
    };
    // Rough cycles per row: keys and selection ~10 per coordinate, ~30 per chosen one.
    const int64_t cost = per_block * (10 * dim + 30 * k);
    workers->ParallelFor(blocks * images, cost, work);

    if (blocks > 1) {
      auto reduce = [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          int32_t sum = 0;
          for (int64_t blk = 0; blk < blocks; ++blk) sum += partial[blk * out_size + i];
          out[i] = sum;
        }
      };
      workers->ParallelFor(out_size, 2 * blocks, reduce);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Dclens>TopkSignVote").Device(DEVICE_CPU), TopkSignVoteCpuOp);

#if GOOGLE_CUDA
// Defined in topk_sign_vote.cu.cc (compiled by nvcc).
cudaError_t LaunchTopkSignVoteGpu(const float* grads, const float* uniforms,
                                  int64_t teachers, int64_t images, int64_t dim, int64_t k,
                                  float c, bool stochastic, int32_t* out, void* stream);
const char* CudaErrorString(cudaError_t error);

class TopkSignVoteGpuOp : public TopkSignVoteOpBase {
 public:
  using TopkSignVoteOpBase::TopkSignVoteOpBase;

  void Compute(OpKernelContext* context) override {
    const Tensor& grads = context->input(0);
    const Tensor& uniforms = context->input(1);
    int64_t teachers, images, dim;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, PrepareOutput(context, &teachers, &images, &dim, &output));
    if (images * dim == 0) return;
    void* stream = context->op_device_context()->stream()->platform_specific_handle().stream;
    const cudaError_t err = LaunchTopkSignVoteGpu(
        grads.flat<float>().data(), stochastic_ ? uniforms.flat<float>().data() : nullptr,
        teachers, images, dim, k_, max_grad_, stochastic_, output->flat<int32_t>().data(),
        stream);
    OP_REQUIRES(context, err == cudaSuccess,
                errors::Internal("Dclens>TopkSignVote CUDA launch failed: ",
                                 CudaErrorString(err)));
  }
};

REGISTER_KERNEL_BUILDER(Name("Dclens>TopkSignVote").Device(::tensorflow::DEVICE_GPU),
                        TopkSignVoteGpuOp);
#endif  // GOOGLE_CUDA

}  // namespace dclens
