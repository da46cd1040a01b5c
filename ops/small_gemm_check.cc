// Checks ops/small_gemm.h against its reference triple loop, bit for bit, and (--bench)
// times it against Eigen's single-threaded GEMM on the teacher step's own products.
//
//   make -C ops small-gemm-check && ops/build/small_gemm_check [--cases N] [--seed S]
//       [--bench] [--repeats R]
//
// Prints JSON.  The check: N random products (shapes 1..70 with a k up to 900, every
// combination of row- and column-major operands and result, padded leading dimensions) and
// the teacher's shapes, each through Multiply and through both orientations, compared with
// ReferenceMultiply element for element by their bits (also NaN-free inputs only: the
// values are random normals).  The bench: GFLOP/s of each teacher product, small_gemm and
// Eigen (the expression the kernel used before, with its copy of a column-major result to
// row-major), timed alternately R times each: medians and bests (on a busy machine the best
// is the fairer figure).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define EIGEN_FAST_MATH 0
#include "Eigen/Core"
#include "small_gemm.h"

namespace sg = dclens::small_gemm;

namespace {

struct Layout {
  bool row_major;
  int64_t pad;   // extra leading-dimension elements
};

// A matrix of rows x cols stored with `layout`; returns its view.
struct Stored {
  std::vector<float> data;
  int64_t rs = 0, cs = 0;
};

Stored Make(int64_t rows, int64_t cols, Layout layout, std::mt19937_64* rng, bool fill) {
  Stored s;
  const int64_t ld = (layout.row_major ? cols : rows) + layout.pad;
  s.rs = layout.row_major ? ld : 1;
  s.cs = layout.row_major ? 1 : ld;
  s.data.assign(static_cast<size_t>(ld * (layout.row_major ? rows : cols) + 1), 0.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (fill)
    for (auto& v : s.data) v = normal(*rng);
  return s;
}

[[maybe_unused]] int64_t CountMismatches(int64_t m, int64_t n, const Stored& got, const Stored& want) {
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float x = got.data[i * got.rs + j * got.cs], y = want.data[i * want.rs + j * want.cs];
      if (std::memcmp(&x, &y, sizeof(float)) != 0) ++bad;
    }
  return bad;
}

struct Totals {
  int64_t cases = 0, products = 0, mismatches = 0, first_bad_m = -1, first_bad_n = -1,
          first_bad_k = -1;
};

void CheckOne(int64_t m, int64_t n, int64_t k, Layout la, Layout lb, Layout lc,
              std::mt19937_64* rng, Totals* totals) {
#ifdef DCLENS_SMALL_GEMM
  Stored a = Make(m, k, la, rng, true), b = Make(k, n, lb, rng, true);
  Stored want = Make(m, n, lc, rng, false);
  sg::ReferenceMultiply(m, n, k, {a.data.data(), a.rs, a.cs}, {b.data.data(), b.rs, b.cs},
                        {want.data.data(), want.rs, want.cs});
  std::vector<float> pack;
  ++totals->cases;
  for (int way = 0; way < 3; ++way) {
    Stored got = Make(m, n, lc, rng, true);   // garbage in C: the product must overwrite it
    const sg::Matrix av{a.data.data(), a.rs, a.cs}, bv{b.data.data(), b.rs, b.cs};
    const sg::Output cv{got.data.data(), got.rs, got.cs};
    if (way == 0) sg::Multiply(m, n, k, av, bv, cv, &pack);
    else if (way == 1) sg::MultiplyOriented(m, n, k, av, bv, cv, &pack);
    else sg::MultiplyOriented(n, m, k, bv.Transposed(), av.Transposed(), cv.Transposed(), &pack);
    ++totals->products;
    const int64_t bad = CountMismatches(m, n, got, want);
    if (bad && totals->first_bad_m < 0) {
      totals->first_bad_m = m;
      totals->first_bad_n = n;
      totals->first_bad_k = k;
    }
    totals->mismatches += bad;
  }
#else
  (void)m, (void)n, (void)k, (void)la, (void)lb, (void)lc, (void)rng, (void)totals;
#endif
}

// The teacher step's products at the paper's Fashion-MNIST shapes (B = 15: 30 images a
// training pass): name, m, n, k, whether A and B are stored transposed (as the kernel reads
// them) and whether C is column-major.
struct Shape {
  const char* name;
  int64_t m, n, k;
  bool a_transposed, b_transposed, c_col_major;
};
const Shape kTeacherShapes[] = {
    {"conv0_forward", 5880, 11, 25, false, false, true},
    {"conv1_forward", 1470, 42, 275, false, false, true},
    {"dense2_forward", 30, 256, 2058, false, false, false},
    {"dense2_kernel_gradient", 2058, 256, 30, true, false, false},
    {"dense2_input_gradient", 30, 2058, 256, false, true, false},
    {"conv1_kernel_gradient", 275, 42, 1470, true, false, true},
    {"conv1_patch_gradient", 1470, 275, 42, false, true, false},
    {"conv0_kernel_gradient", 25, 11, 5880, true, false, true},
    {"conv0_patch_gradient", 5880, 25, 11, false, true, false},
};

Layout OperandLayout(bool transposed) { return {!transposed, 0}; }

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double Seconds(const std::chrono::steady_clock::time_point& since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Seconds per call of f and g, timed alternately (inner calls per timing, `repeats`
// timings each, after a warm-up), so that a noisy machine slows both alike: the median and
// the best timing of each.
struct Timing {
  double median_f, best_f, median_g, best_g;
};
template <class F, class G>
Timing AlternateSeconds(int repeats, int inner, F&& f, G&& g) {
  std::vector<double> tf, tg;
  f();
  g();
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    tf.push_back(Seconds(start) / inner);
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) g();
    tg.push_back(Seconds(start) / inner);
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tg.begin(), tg.end());
  return {tf[tf.size() / 2], tf[0], tg[tg.size() / 2], tg[0]};
}

void Bench(int repeats, std::mt19937_64* rng) {
  std::printf(",\n  \"bench\": [");
  bool first = true;
  for (const Shape& s : kTeacherShapes) {
    // Stored as the kernel stores them: A [m, k] (or its transpose [k, m]) row-major.
    Stored a = Make(s.m, s.k, OperandLayout(s.a_transposed), rng, true);
    Stored b = Make(s.k, s.n, OperandLayout(s.b_transposed), rng, true);
    // Eigen's column-major results are copied to row-major afterwards, as the kernel did;
    // small_gemm writes the row-major result directly, as the kernel now does.
    Stored c = Make(s.m, s.n, {!s.c_col_major, 0}, rng, false);
    Stored c_rows = Make(s.m, s.n, {true, 0}, rng, false);
    const int64_t a_rows = s.a_transposed ? s.k : s.m, a_cols = s.a_transposed ? s.m : s.k;
    const int64_t b_rows = s.b_transposed ? s.n : s.k, b_cols = s.b_transposed ? s.k : s.n;
    Eigen::Map<const RowMatrix> ae(a.data.data(), a_rows, a_cols), be(b.data.data(), b_rows, b_cols);
    const double flop = 2.0 * s.m * s.n * s.k;
    const int inner = std::max(1, static_cast<int>(2e8 / flop));
    auto eigen = [&] {
      if (s.c_col_major) {
        Eigen::Map<Eigen::MatrixXf> ce(c.data.data(), s.m, s.n);
        if (s.a_transposed) ce.noalias() = ae.transpose() * be;
        else if (s.b_transposed) ce.noalias() = ae * be.transpose();
        else ce.noalias() = ae * be;
        Eigen::Map<RowMatrix>(c_rows.data.data(), s.m, s.n) = ce;
      } else {
        Eigen::Map<RowMatrix> ce(c.data.data(), s.m, s.n);
        if (s.a_transposed) ce.noalias() = ae.transpose() * be;
        else if (s.b_transposed) ce.noalias() = ae * be.transpose();
        else ce.noalias() = ae * be;
      }
    };
#ifdef DCLENS_SMALL_GEMM
    std::vector<float> pack;
    auto small = [&] {
      sg::Multiply(s.m, s.n, s.k, {a.data.data(), a.rs, a.cs}, {b.data.data(), b.rs, b.cs},
                   {c_rows.data.data(), c_rows.rs, c_rows.cs}, &pack);
    };
    const Timing t = AlternateSeconds(repeats, inner, eigen, small);
    char small_fields[256];
    std::snprintf(small_fields, sizeof small_fields,
                  "\"small_gemm_gflops\": %.3f, \"speedup\": %.3f, "
                  "\"small_gemm_gflops_best\": %.3f, \"speedup_best\": %.3f",
                  flop / t.median_g * 1e-9, t.median_f / t.median_g,
                  flop / t.best_g * 1e-9, t.best_f / t.best_g);
#else
    const Timing t = AlternateSeconds(repeats, inner, eigen, [] {});
    const char* small_fields = "\"small_gemm_gflops\": null, \"speedup\": null, "
                               "\"small_gemm_gflops_best\": null, \"speedup_best\": null";
#endif
    std::printf("%s\n    {\"product\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
                "\"eigen_gflops\": %.3f, \"eigen_gflops_best\": %.3f, %s}",
                first ? "" : ",", s.name, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k),
                flop / t.median_f * 1e-9, flop / t.best_f * 1e-9, small_fields);
    first = false;
  }
  std::printf("\n  ]");
}

}  // namespace

int main(int argc, char** argv) {
  int cases = 400, repeats = 7;
  uint64_t seed = 0;
  bool bench = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--bench") { bench = true; continue; }
    if (i + 1 >= argc || (flag != "--cases" && flag != "--seed" && flag != "--repeats")) {
      std::fprintf(stderr, "small_gemm_check: unknown flag or missing value %s; flags: "
                   "--cases N --seed S --repeats R --bench\n", argv[i]);
      return 2;
    }
    const long long value = std::atoll(argv[++i]);
    if (flag == "--cases") cases = static_cast<int>(value);
    else if (flag == "--seed") seed = static_cast<uint64_t>(value);
    else repeats = static_cast<int>(value);
  }
  std::mt19937_64 rng(seed);
  Totals totals;
  std::uniform_int_distribution<int> small(1, 70), deep(1, 900), coin(0, 1), pad(0, 3);
  for (int c = 0; c < cases; ++c) {
    const int64_t m = small(rng), n = small(rng), k = c % 4 == 0 ? deep(rng) : small(rng);
    CheckOne(m, n, k, {coin(rng) == 1, pad(rng)}, {coin(rng) == 1, pad(rng)},
             {coin(rng) == 1, pad(rng)}, &rng, &totals);
  }
  for (const Shape& s : kTeacherShapes)
    CheckOne(s.m, s.n, s.k, OperandLayout(s.a_transposed), OperandLayout(s.b_transposed),
             {!s.c_col_major, 0}, &rng, &totals);
#ifdef DCLENS_SMALL_GEMM
  const bool built = true;
#else
  const bool built = false;
#endif
  std::printf("{\n  \"small_gemm_built\": %s,\n  \"cases\": %lld,\n  \"products\": %lld,\n"
              "  \"mismatched_elements\": %lld,\n  \"first_mismatch_mnk\": [%lld, %lld, %lld]",
              built ? "true" : "false", static_cast<long long>(totals.cases),
              static_cast<long long>(totals.products), static_cast<long long>(totals.mismatches),
              static_cast<long long>(totals.first_bad_m), static_cast<long long>(totals.first_bad_n),
              static_cast<long long>(totals.first_bad_k));
  if (bench) Bench(repeats, &rng);
  std::printf("\n}\n");
  return totals.mismatches == 0 ? 0 : 1;
}
