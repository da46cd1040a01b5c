// The teachers' discriminator step as two fused TF CPU ops (see dclens/datalens/teacher_op.py);
// the kernel, its math and its rounding are in teacher_step_kernel.h.
//
//   Dclens>TeacherTrain           num_steps Adam steps of every teacher of a chunk on its own
//                                 merged batch (first half real, second half fake).
//   Dclens>TeacherImageGradients  every teacher's descent direction -dL_G/dx on a shared fake
//                                 batch (the query of a TopAgg round).
//
// Teachers are spread over TF's intra-op pool, one teacher per thread at a time.

#include "teacher_step_kernel.h"

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace dclens {
namespace {

using teacher_step::Geometry;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

tensorflow::Status ReadNetwork(OpKernelConstruction* ctx, teacher_step::Network* net) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_classes", &net->num_classes));
  TF_RETURN_IF_ERROR(ctx->GetAttr("conv1_filters", &net->conv1_filters));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dense_units", &net->dense_units));
  TF_RETURN_IF_ERROR(ctx->GetAttr("leaky_slope", &net->leaky_slope));
  TF_RETURN_IF_ERROR(ctx->GetAttr("bn_epsilon", &net->bn_epsilon));
  return tensorflow::OkStatus();
}

// Checks weights [T, P] against the geometry and the labels' range.
tensorflow::Status CheckInputs(const Geometry& g, const Tensor& weights, const Tensor& labels,
                               int64_t teachers) {
  if (weights.dims() != 2)
    return InvalidArgument("weights must be [teachers, ", g.size, "], got ",
                           weights.shape().DebugString());
  const std::string problem = teacher_step::Validate(
      g, weights.dim_size(1), labels.flat<int32_t>().data(), labels.NumElements());
  if (!problem.empty()) return InvalidArgument(problem);
  if (weights.dim_size(0) != teachers)
    return InvalidArgument("weights has ", weights.dim_size(0), " teachers, the images ",
                           teachers);
  return tensorflow::OkStatus();
}

class TeacherTrainOp : public OpKernel {
 public:
  explicit TeacherTrainOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadNetwork(ctx, &network_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_steps", &adam_.num_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("learning_rate", &adam_.learning_rate));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &adam_.beta1));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &adam_.beta2));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &adam_.epsilon));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& images = ctx->input(3);
    const Tensor& labels = ctx->input(4);
    const Tensor& first_step = ctx->input(5);
    OP_REQUIRES(ctx, images.dims() == 5,
                InvalidArgument("images must be [teachers, 2B, H, W, C], got ",
                                images.shape().DebugString()));
    const int64_t teachers = images.dim_size(0);
    const int n = static_cast<int>(images.dim_size(1));
    OP_REQUIRES(ctx, labels.dims() == 2 && labels.dim_size(0) == teachers &&
                         labels.dim_size(1) == n,
                InvalidArgument("labels must be [teachers, 2B] = [", teachers, ", ", n,
                                "], got ", labels.shape().DebugString()));
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(first_step.shape()),
                InvalidArgument("first_step must be a scalar"));
    const Geometry g(n, 2, static_cast<int>(images.dim_size(2)),
                     static_cast<int>(images.dim_size(3)), static_cast<int>(images.dim_size(4)),
                     network_.num_classes, network_.conv1_filters, network_.dense_units);
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, CheckInputs(g, ctx->input(i), labels, teachers));
    }
    Tensor* outputs[3];
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(),
                                                                &outputs[i]));
    }
    Tensor* losses = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({teachers}), &losses));
    teacher_step::Adam adam = adam_;
    adam.first_step = first_step.scalar<int64_t>()();
    // The first Adam step reads the inputs and writes the outputs (no copy); later steps
    // update the outputs in place.  A forwarded input is the output itself.
    auto work = [&](int64_t begin, int64_t end) {
      teacher_step::TrainTeachers(
          g, network_, adam, ctx->input(0).flat<float>().data(),
          ctx->input(1).flat<float>().data(), ctx->input(2).flat<float>().data(),
          outputs[0]->flat<float>().data(), outputs[1]->flat<float>().data(),
          outputs[2]->flat<float>().data(), images.flat<float>().data(),
          labels.flat<int32_t>().data(), losses->flat<float>().data(), begin, end);
    };
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(pool->num_threads, pool->workers, teachers,
                      teacher_step::TeacherCost(g) * adam.num_steps * 3, work);
  }

 private:
  teacher_step::Network network_;
  teacher_step::Adam adam_;
};

class TeacherImageGradientsOp : public OpKernel {
 public:
  explicit TeacherImageGradientsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadNetwork(ctx, &network_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& weights = ctx->input(0);
    const Tensor& images = ctx->input(1);
    const Tensor& labels = ctx->input(2);
    OP_REQUIRES(ctx, images.dims() == 4,
                InvalidArgument("images must be [B, H, W, C], got ",
                                images.shape().DebugString()));
    const int n = static_cast<int>(images.dim_size(0));
    OP_REQUIRES(ctx, labels.dims() == 1 && labels.dim_size(0) == n,
                InvalidArgument("labels must be [B] = [", n, "], got ",
                                labels.shape().DebugString()));
    OP_REQUIRES(ctx, weights.dims() == 2,
                InvalidArgument("weights must be [teachers, P], got ",
                                weights.shape().DebugString()));
    const int64_t teachers = weights.dim_size(0);
    const Geometry g(n, 1, static_cast<int>(images.dim_size(1)),
                     static_cast<int>(images.dim_size(2)), static_cast<int>(images.dim_size(3)),
                     network_.num_classes, network_.conv1_filters, network_.dense_units);
    OP_REQUIRES_OK(ctx, CheckInputs(g, weights, labels, teachers));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({teachers, n, g.h, g.w, g.c}), &out));
    auto work = [&](int64_t begin, int64_t end) {
      teacher_step::ImageGradients(g, network_, weights.flat<float>().data(),
                                   images.flat<float>().data(), labels.flat<int32_t>().data(),
                                   out->flat<float>().data(), begin, end);
    };
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(pool->num_threads, pool->workers, teachers,
                      teacher_step::TeacherCost(g) * 2, work);
  }

 private:
  teacher_step::Network network_;
};

}  // namespace

#define DCLENS_NETWORK_ATTRS                 \
  Attr("num_classes: int >= 1")              \
      .Attr("conv1_filters: int >= 1")       \
      .Attr("dense_units: int >= 1")         \
      .Attr("leaky_slope: float")            \
      .Attr("bn_epsilon: float")

REGISTER_OP("Dclens>TeacherTrain")
    .Input("weights: float")
    .Input("adam_m: float")
    .Input("adam_v: float")
    .Input("images: float")
    .Input("labels: int32")
    .Input("first_step: int64")
    .Output("new_weights: float")
    .Output("new_adam_m: float")
    .Output("new_adam_v: float")
    .Output("losses: float")
    .Attr("num_steps: int >= 1")
    .Attr("learning_rate: float")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .DCLENS_NETWORK_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->input(i));
      c->set_output(3, c->Vector(c->Dim(c->input(0), 0)));
      return tensorflow::OkStatus();
    });

REGISTER_OP("Dclens>TeacherImageGradients")
    .Input("weights: float")
    .Input("images: float")
    .Input("labels: int32")
    .Output("descent: float")
    .DCLENS_NETWORK_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(c->Dim(c->input(0), 0)), c->input(1), &out));
      c->set_output(0, out);
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("Dclens>TeacherTrain").Device(tensorflow::DEVICE_CPU),
                        TeacherTrainOp);
REGISTER_KERNEL_BUILDER(Name("Dclens>TeacherImageGradients").Device(tensorflow::DEVICE_CPU),
                        TeacherImageGradientsOp);

}  // namespace dclens
