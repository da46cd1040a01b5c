// Where the fused teacher step spends its time: a standalone harness (no TensorFlow, one
// thread) that runs the kernel of teacher_step_kernel.h at the paper's Fashion-MNIST
// shapes with its section timers compiled in (DCLENS_TEACHER_PROFILE,
// teacher_step_profile.h) and prints one JSON object: seconds per teacher step of each
// section, its share, the GEMM sections' GFLOP/s, and the same run's single-thread Eigen
// GEMM peak (a 1024^3 float32 product, the best of its repeats) to compare them with, and
// which GEMM the kernel uses on this build (ops/small_gemm.h, made for the teacher's small
// shapes, or Eigen's).
//
//   make -C ops teacher-profile && ops/build/teacher_profile [--teachers T] [--batch B]
//       [--steps S] [--repeats R] [--dense D] [--seed N]
//
// Weights, images and labels are pseudo-random (the timing does not depend on them).  The
// harness measures; the ops' correctness is tested through Python (tests/test_teacher_op.py).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifndef DCLENS_TEACHER_PROFILE
#error "build with -DDCLENS_TEACHER_PROFILE (make -C ops teacher-profile)"
#endif
#include "teacher_step_kernel.h"

namespace ts = dclens::teacher_step;
namespace profile = dclens::teacher_step::profile;

namespace {

struct Options {
  int teachers = 20, batch = 15, steps = 2, repeats = 5, dense = 256, seed = 0;
};

int ParsePositive(const char* flag, const char* value) {
  char* end = nullptr;
  const long parsed = value == nullptr ? 0 : std::strtol(value, &end, 10);
  if (value == nullptr || *end != '\0' || parsed < 1 || parsed > 1000000) {
    std::fprintf(stderr, "teacher_profile: %s takes an integer from 1 to 1000000, got %s\n",
                 flag, value == nullptr ? "nothing" : value);
    std::exit(2);
  }
  return static_cast<int>(parsed);
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    int* target = flag == "--teachers" ? &options.teachers
                  : flag == "--batch"  ? &options.batch
                  : flag == "--steps"  ? &options.steps
                  : flag == "--repeats" ? &options.repeats
                  : flag == "--dense"  ? &options.dense
                  : flag == "--seed"   ? &options.seed : nullptr;
    if (target == nullptr) {
      std::fprintf(stderr, "teacher_profile: unknown flag %s; flags: --teachers --batch "
                   "--steps --repeats --dense --seed\n", argv[i]);
      std::exit(2);
    }
    *target = ParsePositive(argv[i], value);
    ++i;
  }
  return options;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Best GFLOP/s of a single-thread n^3 float32 Eigen product over `repeats` runs.
double GemmPeak(int n, int repeats, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Eigen::MatrixXf a(n, n), b(n, n), c(n, n);
  for (int i = 0; i < n * n; ++i) {
    a.data()[i] = normal(*rng);
    b.data()[i] = normal(*rng);
  }
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    best = std::max(best, 2.0 * n * n * n / Seconds(start) / 1e9);
  }
  if (!std::isfinite(c(0, 0))) std::fprintf(stderr, "teacher_profile: non-finite GEMM\n");
  return best;
}


// Multiply-adds x 2 of each GEMM section of one pass (n images).
std::vector<double> SectionFlops(const ts::Geometry& g, bool training) {
  std::vector<double> flops(profile::kNumSections, 0.0);
  const double rows0 = static_cast<double>(g.n) * g.h1 * g.w1, rows1 = static_cast<double>(g.n) * g.h2 * g.w2;
  const double taps_c = static_cast<double>(ts::kTaps) * g.c, taps_c0 = static_cast<double>(ts::kTaps) * g.c0;
  flops[profile::kConv0Forward] = 2 * rows0 * taps_c * g.c0;
  flops[profile::kConv1Gemm] = 2 * rows1 * taps_c0 * g.c1;
  flops[profile::kDense2Gemm] = 2.0 * g.n * g.flat * g.dense;
  flops[profile::kDense2InputGradient] = 2.0 * g.n * g.dense * g.flat;
  flops[profile::kConv1PatchGradient] = 2 * rows1 * g.c1 * taps_c0;
  if (training) {
    flops[profile::kDense2KernelGradient] = 2.0 * g.flat * g.n * g.dense;
    flops[profile::kConv1KernelGradient] = 2 * taps_c0 * rows1 * g.c1;
    flops[profile::kConv0Backward] = 2 * taps_c * rows0 * g.c0;
  } else {
    flops[profile::kInputGradient] = 2 * rows0 * g.c0 * taps_c;
  }
  return flops;
}

void Report(const char* name, const ts::Geometry& g, bool training, double passes,
            double wall, double peak, bool last) {
  const profile::Laps& laps = profile::ThreadLaps();
  const std::vector<double> flops = SectionFlops(g, training);
  double total = 0.0, total_flops = 0.0;
  for (int s = 0; s < profile::kNumSections; ++s) {
    total += laps.seconds[s];
    total_flops += flops[s];
  }
  std::printf("  \"%s\": {\n    \"passes\": %.0f,\n    \"images_per_pass\": %d,\n", name,
              passes, g.n);
  std::printf("    \"seconds_per_pass\": %.6e,\n    \"wall_seconds_per_pass\": %.6e,\n",
              total / passes, wall / passes);
  std::printf("    \"gemm_flop_per_pass\": %.0f,\n", total_flops);
  std::printf("    \"gemm_gflops\": %.3f,\n    \"fraction_of_single_thread_peak\": %.4f,\n",
              total_flops * passes / total / 1e9, total_flops * passes / total / 1e9 / peak);
  std::printf("    \"sections\": {\n");
  bool first = true;
  for (int s = 0; s < profile::kNumSections; ++s) {
    if (laps.calls[s] == 0) continue;
    std::printf("%s      \"%s\": {\"seconds_per_pass\": %.6e, \"share\": %.4f", first ? "" : ",\n",
                profile::SectionName(s), laps.seconds[s] / passes, laps.seconds[s] / total);
    if (flops[s] > 0)
      std::printf(", \"gflops\": %.3f, \"of_peak\": %.4f",
                  flops[s] * passes / laps.seconds[s] / 1e9,
                  flops[s] * passes / laps.seconds[s] / 1e9 / peak);
    std::printf("}");
    first = false;
  }
  std::printf("\n    }\n  }%s\n", last ? "" : ",");
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  std::mt19937 rng(options.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, 9);
  constexpr int kHeight = 28, kWidth = 28, kChannels = 1, kClasses = 10, kFilters = 32;
  const ts::Geometry train(2 * options.batch, 2, kHeight, kWidth, kChannels, kClasses,
                           kFilters + kClasses, options.dense);
  const ts::Geometry query(options.batch, 1, kHeight, kWidth, kChannels, kClasses,
                           kFilters + kClasses, options.dense);
  const int64_t T = options.teachers, P = train.size;
  std::vector<float> w(T * P), m(T * P, 0.0f), v(T * P, 1e-6f), losses(T);
  for (float& x : w) x = 0.02f * normal(rng);
  const int64_t train_image = int64_t{train.n} * kHeight * kWidth * kChannels;
  std::vector<float> x(T * train_image), grads(T * int64_t{query.n} * kHeight * kWidth);
  for (float& value : x) value = normal(rng);
  std::vector<int32_t> y(T * train.n), yq(query.n);
  for (int32_t& value : y) value = label(rng);
  for (int32_t& value : yq) value = label(rng);
  const ts::Network network{kClasses, kFilters + kClasses, options.dense, 0.2f, 1e-5f};
  ts::Adam adam{options.steps, 0, 2e-4f, 0.5f, 0.999f, 1e-8f};

  const double peak = GemmPeak(1024, 5, &rng);
  // Warm-up (buffers, caches), then the timed repeats with fresh laps.
  ts::TrainTeachers(train, network, adam, w.data(), m.data(), v.data(), w.data(), m.data(),
                    v.data(), x.data(), y.data(), losses.data(), 0, T);
  profile::ThreadLaps() = profile::Laps();
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < options.repeats; ++r) {
    adam.first_step = int64_t{r + 1} * options.steps;
    ts::TrainTeachers(train, network, adam, w.data(), m.data(), v.data(), w.data(),
                      m.data(), v.data(), x.data(), y.data(), losses.data(), 0, T);
  }
  const double train_wall = Seconds(start);
  const double train_passes = static_cast<double>(options.repeats) * T * options.steps;
  std::printf("{\n  \"harness\": \"ops/teacher_profile.cc\",\n");
  std::printf("  \"teachers\": %d,\n  \"batch\": %d,\n  \"adam_steps_per_call\": %d,\n"
              "  \"repeats\": %d,\n  \"parameters_per_teacher\": %lld,\n",
              options.teachers, options.batch, options.steps, options.repeats,
              static_cast<long long>(P));
  std::printf("  \"single_thread_gemm_peak_gflops\": %.3f,\n", peak);
#ifdef DCLENS_SMALL_GEMM
  std::printf("  \"kernel_gemm\": \"small_gemm\",\n");
#else
  std::printf("  \"kernel_gemm\": \"eigen\",\n");
#endif
  Report("training_step", train, true, train_passes, train_wall, peak, false);

  ts::ImageGradients(query, network, w.data(), x.data(), yq.data(), grads.data(), 0, T);
  profile::ThreadLaps() = profile::Laps();
  start = std::chrono::steady_clock::now();
  for (int r = 0; r < options.repeats; ++r)
    ts::ImageGradients(query, network, w.data(), x.data(), yq.data(), grads.data(), 0, T);
  Report("image_gradient_query", query, false, static_cast<double>(options.repeats) * T, Seconds(start),
         peak, true);
  std::printf("}\n");
  return std::isfinite(losses[0]) ? 0 : 1;
}
