// Section timers for the teacher-step kernel (teacher_step_kernel.h), compiled in only by
// the profiling harness (ops/teacher_profile.cc, `make -C ops teacher-profile`, which
// defines DCLENS_TEACHER_PROFILE).  In every other build DCLENS_LAP(section) is empty, so
// the ops' code and bits do not change.
//
// DCLENS_LAP(s) adds the wall time since this thread's previous lap to section s: the
// kernel calls it at the end of each piece of work, so consecutive sections tile the
// step without gaps.  Per thread; the harness runs one thread.

#ifndef DCLENS_OPS_TEACHER_STEP_PROFILE_H_
#define DCLENS_OPS_TEACHER_STEP_PROFILE_H_

#ifdef DCLENS_TEACHER_PROFILE
#include <array>
#include <chrono>
#include <cstdint>
#endif

namespace dclens {
namespace teacher_step {
namespace profile {

// The pieces of one training step, in the order the kernel does them.
enum Section : int {
  kConv0Forward,        // conv0: kernel gather, label fold, im2col, GEMM, labels, bias, lrelu
  kConv1Im2Col,         // conv1: kernel gather, label fold, im2col
  kConv1Gemm,           // conv1: patches x kernel GEMM (+ copy to row-major)
  kBatchNorm1Forward,   // conv1: labels, bias, batch norm, lrelu
  kDense2Gemm,          // dense2: activations x kernel GEMM
  kDense2Rest,          // dense2: labels, bias, batch norm, lrelu; dense3 forward
  kLossAndDense3Backward,  // loss, dlogit, dense3 backward
  kBatchNorm2Backward,
  kDense2KernelGradient,   // dense2: a1^T dz2 GEMM (+ label rows, bias)
  kDense2InputGradient,    // dense2: dz2 W^T GEMM
  kBatchNorm1Backward,
  kConv1KernelGradient,    // conv1: patches^T dz1 GEMM, scatter, label and bias gradients
  kConv1PatchGradient,     // conv1: dz1 W^T GEMM
  kConv0Backward,          // col2im, lrelu, conv0 kernel gradient
  kInputGradient,          // dz0 W^T GEMM and col2im into dx (queries only)
  kAdam,
  kNumSections
};

inline const char* SectionName(int section) {
  static const char* const kNames[kNumSections] = {
      "conv0_forward", "conv1_im2col", "conv1_gemm", "batch_norm1_forward", "dense2_gemm",
      "dense2_rest_and_dense3", "loss_and_dense3_backward", "batch_norm2_backward",
      "dense2_kernel_gradient", "dense2_input_gradient", "batch_norm1_backward",
      "conv1_kernel_gradient", "conv1_patch_gradient", "conv0_backward", "input_gradient",
      "adam"};
  return kNames[section];
}

#ifdef DCLENS_TEACHER_PROFILE
struct Laps {
  std::array<double, kNumSections> seconds{};
  std::array<int64_t, kNumSections> calls{};
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();

  void Restart() { last = std::chrono::steady_clock::now(); }
  void Lap(int section) {
    const auto now = std::chrono::steady_clock::now();
    seconds[section] += std::chrono::duration<double>(now - last).count();
    calls[section] += 1;
    last = now;
  }
};

inline Laps& ThreadLaps() {
  thread_local Laps laps;
  return laps;
}
#define DCLENS_LAP(section) ::dclens::teacher_step::profile::ThreadLaps().Lap(section)
#define DCLENS_LAP_RESTART() ::dclens::teacher_step::profile::ThreadLaps().Restart()
#else
#define DCLENS_LAP(section) ((void)0)
#define DCLENS_LAP_RESTART() ((void)0)
#endif

}  // namespace profile
}  // namespace teacher_step
}  // namespace dclens

#endif  // DCLENS_OPS_TEACHER_STEP_PROFILE_H_
