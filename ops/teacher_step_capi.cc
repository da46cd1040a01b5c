// C entry points of the teacher step for numpy state updated in place (dclens/datalens/teacher_op.py
// calls them through ctypes, which releases the GIL): no TensorFlow tensors, so no copy of
// the chunk's weights and Adam moments in or out.  Same kernel as the TF ops
// (teacher_step_kernel.h): the same inputs give the same bits through either entry point.
//
// Every function returns 0, or 1 with a message in `error` (at most error_size bytes).
// Teachers are split into `threads` contiguous blocks, one std::thread each.

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "teacher_step_kernel.h"

namespace {

using dclens::teacher_step::Geometry;

int Fail(const std::string& message, char* error, int error_size) {
  if (error != nullptr && error_size > 0) {
    std::strncpy(error, message.c_str(), error_size - 1);
    error[error_size - 1] = '\0';
  }
  return 1;
}

template <typename Work>
void Parallel(int64_t teachers, int threads, Work work) {
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, teachers)));
  if (threads == 1) {
    work(0, teachers);
    return;
  }
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    const int64_t begin = teachers * i / threads, end = teachers * (i + 1) / threads;
    pool.emplace_back([=] { work(begin, end); });
  }
  for (auto& thread : pool) thread.join();
}

std::string StrideProblem(int64_t row_stride, int64_t columns) {
  return "rows must be at least " + std::to_string(columns) +
         " floats apart, got a row stride of " + std::to_string(row_stride);
}

dclens::teacher_step::Network MakeNetwork(int num_classes, int conv1_filters, int dense_units,
                                          float leaky_slope, float bn_epsilon) {
  dclens::teacher_step::Network net;
  net.num_classes = num_classes;
  net.conv1_filters = conv1_filters;
  net.dense_units = dense_units;
  net.leaky_slope = leaky_slope;
  net.bn_epsilon = bn_epsilon;
  return net;
}

}  // namespace

extern "C" {

// The entry points' signatures, for a caller to refuse a library built from older sources
// (2: the row_stride argument).
int dclens_teacher_capi_version() { return 2; }

// num_steps Adam steps of `teachers` teachers, in place on weights/adam_m/adam_v [T, P]
// (teacher t's row at t * row_stride floats: P parameters, then padding left untouched);
// images [T, n, h, w, c] (first half real, second half fake), labels [T, n]; losses [T].
int dclens_teacher_train_in_place(float* weights, float* adam_m, float* adam_v,
                                  int64_t teachers, int64_t columns, int64_t row_stride,
                                  const float* images, const int32_t* labels, int n, int h,
                                  int w, int c,
                                  int num_classes, int conv1_filters, int dense_units,
                                  float leaky_slope, float bn_epsilon, int num_steps,
                                  int64_t first_step, float learning_rate, float beta1,
                                  float beta2, float epsilon, float* losses, int threads,
                                  char* error, int error_size) {
  if (num_steps < 1)
    return Fail("num_steps must be >= 1, got " + std::to_string(num_steps), error,
                error_size);
  const Geometry g(n, 2, h, w, c, num_classes, conv1_filters, dense_units);
  const std::string problem = dclens::teacher_step::Validate(g, columns, labels, teachers * n);
  if (!problem.empty()) return Fail(problem, error, error_size);
  if (row_stride < columns) return Fail(StrideProblem(row_stride, columns), error, error_size);
  const auto net = MakeNetwork(num_classes, conv1_filters, dense_units, leaky_slope, bn_epsilon);
  dclens::teacher_step::Adam adam;
  adam.num_steps = num_steps;
  adam.first_step = first_step;
  adam.learning_rate = learning_rate;
  adam.beta1 = beta1;
  adam.beta2 = beta2;
  adam.epsilon = epsilon;
  Parallel(teachers, threads, [&](int64_t begin, int64_t end) {
    dclens::teacher_step::TrainTeachers(g, net, adam, weights, adam_m, adam_v, weights,
                                        adam_m, adam_v, images, labels, losses, begin, end,
                                        row_stride);
  });
  return 0;
}

// -dL_G/dx of every teacher: weights [T, P] (rows row_stride floats apart), shared images
// [n, h, w, c] and labels [n]; out [T, n, h, w, c].
int dclens_teacher_image_gradients(const float* weights, int64_t teachers, int64_t columns,
                                   int64_t row_stride, const float* images,
                                   const int32_t* labels, int n, int h, int w, int c,
                                   int num_classes, int conv1_filters, int dense_units,
                                   float leaky_slope, float bn_epsilon,
                                   float* out, int threads, char* error, int error_size) {
  const Geometry g(n, 1, h, w, c, num_classes, conv1_filters, dense_units);
  const std::string problem = dclens::teacher_step::Validate(g, columns, labels, n);
  if (!problem.empty()) return Fail(problem, error, error_size);
  if (row_stride < columns) return Fail(StrideProblem(row_stride, columns), error, error_size);
  const auto net = MakeNetwork(num_classes, conv1_filters, dense_units, leaky_slope, bn_epsilon);
  Parallel(teachers, threads, [&](int64_t begin, int64_t end) {
    dclens::teacher_step::ImageGradients(g, net, weights, images, labels, out, begin, end,
                                         row_stride);
  });
  return 0;
}

}  // extern "C"
