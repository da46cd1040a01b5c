// The teachers' discriminator step: the kernel shared by the TF ops
// (teacher_step_op.cc) and the C entry points for in-place numpy state (teacher_step_capi.cc).
// Training: forward, backward and Adam of one teacher in one pass, every intermediate in
// cache; the query: every teacher's -dL_G/dx on a shared fake batch.
//
// The network is dclens.datalens.networks' conditional DCGAN discriminator (K classes, df = conv1
// filters - K, dfc = dense units):
//
//   x [H, W, C] ++ y-maps -> conv5x5/2 SAME -> C0 = C+K ch, lrelu
//   ++ y-maps             -> conv5x5/2 SAME -> C1 ch, batch norm, lrelu
//   flatten ++ y          -> dense D, batch norm, lrelu
//   ++ y                  -> dense 1 (logit)
//
// with batch-norm statistics over each of `groups` equal slices of the batch (population
// variance, epsilon bn_epsilon), leaky-ReLU slope `leaky_slope`, and the loss
//   train:  L = mean_{real} softplus(-logit) + mean_{fake} softplus(logit)
//   query:  L_G = mean softplus(-logit), output -dL_G/dx.
// The constant label maps are folded out of the convolutions exactly as in
// dclens/datalens/fast_ensemble.py: conv(x ++ y-maps, W) = conv(x, W_x) + sum_k y_k M_k with
// M_k[p, o] = sum of W_y[tap, k, o] over the taps of output p inside the image.
//
// Each teacher is computed by one thread (the callers spread teachers over threads) with a
// single-threaded GEMM on im2col patches (ops/small_gemm.h on AVX2/FMA builds without
// AVX-512, Eigen's elsewhere), so results do not depend on the number of threads: the
// same inputs give the same bits on the same machine and build.  The math is
// the reference's; the float32 rounding differs from TF's kernels (tests compare within
// stated tolerances). Adam is the formula of TF's ApplyAdam:
//   alpha = lr sqrt(1 - beta2^t) / (1 - beta1^t); m += (g - m)(1 - beta1);
//   v += (g^2 - v)(1 - beta2); w -= alpha m / (sqrt(v) + epsilon).

#ifndef DCLENS_OPS_TEACHER_STEP_KERNEL_H_
#define DCLENS_OPS_TEACHER_STEP_KERNEL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// Exact vectorised sqrt (Eigen's fast-math sqrt is an approximation): with FMA contraction
// off (ops/Makefile) every element-wise result is the same in a vector lane and in a
// scalar tail, so a teacher's result does not depend on where it sits in its chunk.
#define EIGEN_FAST_MATH 0
#include "Eigen/Core"
#include "small_gemm.h"
#include "teacher_step_profile.h"

namespace dclens {
namespace teacher_step {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
// Column-major destinations: Eigen's GEMM kernel tiles the destination's rows, so a tall,
// narrow product (patches x kernel: 1470 x 42) runs ~2x faster into a column-major
// result, copied to row-major afterwards (measured on these shapes).
using ColMatrixMap = Eigen::Map<Eigen::MatrixXf>;

constexpr int kKernel = 5;
constexpr int kTaps = kKernel * kKernel;
constexpr int kStride = 2;

// 'SAME' padding before the first row/column of a 5x5 stride-2 convolution (TF's rule).
inline int PadBefore(int in, int out) {
  return std::max((out - 1) * kStride + kKernel - in, 0) / 2;
}

// Shapes and parameter offsets of one teacher (dclens.datalens.networks.discriminator_weight_shapes
// order: conv0/kernel, conv0/bias, conv1/kernel, conv1/bias, bn1/gamma, bn1/beta,
// dense2/kernel, dense2/bias, bn2/gamma, bn2/beta, dense3/kernel, dense3/bias).
struct Geometry {
  int n = 0, groups = 1;         // images per pass; batch-norm slices
  int h = 0, w = 0, c = 0, k = 0;
  int c0 = 0, c1 = 0, dense = 0;
  int h1 = 0, w1 = 0, h2 = 0, w2 = 0;
  int pad0_top = 0, pad0_left = 0, pad1_top = 0, pad1_left = 0;
  int64_t flat = 0;              // h2 * w2 * c1
  int64_t k0 = 0, b0 = 0, k1 = 0, b1 = 0, g1 = 0, be1 = 0;
  int64_t k2 = 0, b2 = 0, g2 = 0, be2 = 0, k3 = 0, b3 = 0, size = 0;

  Geometry(int n_, int groups_, int h_, int w_, int c_, int k_, int conv1_filters, int dense_)
      : n(n_), groups(groups_), h(h_), w(w_), c(c_), k(k_) {
    c0 = c + k;
    c1 = conv1_filters;
    dense = dense_;
    h1 = (h + 1) / 2;
    w1 = (w + 1) / 2;
    h2 = (h1 + 1) / 2;
    w2 = (w1 + 1) / 2;
    pad0_top = PadBefore(h, h1);
    pad0_left = PadBefore(w, w1);
    pad1_top = PadBefore(h1, h2);
    pad1_left = PadBefore(w1, w2);
    flat = int64_t{h2} * w2 * c1;
    int64_t at = 0;
    auto take = [&at](int64_t count) { int64_t start = at; at += count; return start; };
    k0 = take(int64_t{kTaps} * (c + k) * c0);
    b0 = take(c0);
    k1 = take(int64_t{kTaps} * (c0 + k) * c1);
    b1 = take(c1);
    g1 = take(c1);
    be1 = take(c1);
    k2 = take((flat + k) * dense);
    b2 = take(dense);
    g2 = take(dense);
    be2 = take(dense);
    k3 = take(dense + k);
    b3 = take(1);
    size = at;
  }
};

// im2col of a 5x5 stride-2 'SAME' convolution: src [n, hi, wi, ci] ->
// dst [n * ho * wo, 25 * ci], column (tap * ci + channel), zeros outside the image.
// A tap row (dy) of a patch inside the image's width is 5 * ci contiguous floats of one
// input row: copied as one span; only the border patches go tap by tap.
inline void Im2Col(const float* src, int n, int hi, int wi, int ci, int ho, int wo, int pad_top,
            int pad_left, float* dst) {
  const int64_t row = int64_t{kTaps} * ci;
  const int span = kKernel * ci;
  for (int b = 0; b < n; ++b) {
    const float* image = src + int64_t{b} * hi * wi * ci;
    for (int oy = 0; oy < ho; ++oy) {
      for (int ox = 0; ox < wo; ++ox) {
        float* out = dst + ((int64_t{b} * ho + oy) * wo + ox) * row;
        const int x0 = ox * kStride - pad_left;
        const bool inside = x0 >= 0 && x0 + kKernel <= wi;
        for (int dy = 0; dy < kKernel; ++dy) {
          const int iy = oy * kStride + dy - pad_top;
          float* taps = out + dy * span;
          if (iy < 0 || iy >= hi) {
            for (int i = 0; i < span; ++i) taps[i] = 0.0f;
            continue;
          }
          const float* line = image + int64_t{iy} * wi * ci;
          if (inside) {
            const float* from = line + int64_t{x0} * ci;
            for (int i = 0; i < span; ++i) taps[i] = from[i];
            continue;
          }
          for (int dx = 0; dx < kKernel; ++dx) {
            const int ix = x0 + dx;
            float* tap = taps + dx * ci;
            if (ix < 0 || ix >= wi) {
              for (int ch = 0; ch < ci; ++ch) tap[ch] = 0.0f;
            } else {
              const float* pixel = line + int64_t{ix} * ci;
              for (int ch = 0; ch < ci; ++ch) tap[ch] = pixel[ch];
            }
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: dst [n, hi, wi, ci] = sum of the patches' entries that read it,
// added in the order (oy, ox, dy, dx) whether a tap row is added as one span (inside the
// width) or tap by tap, so both give the same bits.
inline void Col2Im(const float* cols, int n, int hi, int wi, int ci, int ho, int wo, int pad_top,
            int pad_left, float* dst) {
  const int64_t row = int64_t{kTaps} * ci;
  const int span = kKernel * ci;
  std::fill(dst, dst + int64_t{n} * hi * wi * ci, 0.0f);
  for (int b = 0; b < n; ++b) {
    float* image = dst + int64_t{b} * hi * wi * ci;
    for (int oy = 0; oy < ho; ++oy) {
      for (int ox = 0; ox < wo; ++ox) {
        const float* patch = cols + ((int64_t{b} * ho + oy) * wo + ox) * row;
        const int x0 = ox * kStride - pad_left;
        const bool inside = x0 >= 0 && x0 + kKernel <= wi;
        for (int dy = 0; dy < kKernel; ++dy) {
          const int iy = oy * kStride + dy - pad_top;
          if (iy < 0 || iy >= hi) continue;
          float* line = image + int64_t{iy} * wi * ci;
          const float* taps = patch + dy * span;
          if (inside) {
            float* to = line + int64_t{x0} * ci;
            for (int i = 0; i < span; ++i) to[i] += taps[i];
            continue;
          }
          for (int dx = 0; dx < kKernel; ++dx) {
            const int ix = x0 + dx;
            if (ix < 0 || ix >= wi) continue;
            const float* tap = taps + dx * ci;
            float* pixel = line + int64_t{ix} * ci;
            for (int ch = 0; ch < ci; ++ch) pixel[ch] += tap[ch];
          }
        }
      }
    }
  }
}

// One convolution layer's geometry, for the label fold and its gradient.
struct ConvShape {
  int hi, wi, ci;        // image channels of the input (labels excluded)
  int ho, wo, co;
  int pad_top, pad_left;
  int k;                 // label channels after the image channels
};

// Image part of the kernel [5, 5, ci + k, co] as a [25 * ci, co] matrix.
inline void GatherImageKernel(const float* kernel, const ConvShape& s, float* out) {
  const int cin = s.ci + s.k;
  for (int tap = 0; tap < kTaps; ++tap)
    for (int ch = 0; ch < s.ci; ++ch)
      std::copy(kernel + (int64_t{tap} * cin + ch) * s.co,
                kernel + (int64_t{tap} * cin + ch + 1) * s.co,
                out + (int64_t{tap} * s.ci + ch) * s.co);
}

// Adds a [25 * ci, co] image-kernel gradient into the full kernel gradient.
inline void ScatterImageKernel(const float* image_grad, const ConvShape& s, float* kernel_grad) {
  const int cin = s.ci + s.k;
  for (int tap = 0; tap < kTaps; ++tap)
    for (int ch = 0; ch < s.ci; ++ch) {
      const float* from = image_grad + (int64_t{tap} * s.ci + ch) * s.co;
      float* to = kernel_grad + (int64_t{tap} * cin + ch) * s.co;
      for (int o = 0; o < s.co; ++o) to[o] = from[o];
    }
}

// V [ho * wo, 25]: 1 where tap (dy, dx) of output p reads inside the image, else 0.
inline RowMatrix InsideTaps(const ConvShape& s) {
  RowMatrix taps = RowMatrix::Zero(int64_t{s.ho} * s.wo, kTaps);
  for (int oy = 0; oy < s.ho; ++oy)
    for (int ox = 0; ox < s.wo; ++ox)
      for (int dy = 0; dy < kKernel; ++dy) {
        const int iy = oy * kStride + dy - s.pad_top;
        if (iy < 0 || iy >= s.hi) continue;
        for (int dx = 0; dx < kKernel; ++dx) {
          const int ix = ox * kStride + dx - s.pad_left;
          if (ix >= 0 && ix < s.wi) taps(oy * s.wo + ox, dy * kKernel + dx) = 1.0f;
        }
      }
  return taps;
}

using StridedMap = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;

// The label part W_y of a kernel [5, 5, ci + k, co] as a [25, k * co] matrix (a view).
inline ConstStridedMap LabelKernel(const float* kernel, const ConvShape& s) {
  return ConstStridedMap(kernel + int64_t{s.ci} * s.co, kTaps, int64_t{s.k} * s.co,
                         Eigen::OuterStride<>(int64_t{s.ci + s.k} * s.co));
}

// M [ho * wo, k * co] = V W_y: M[p, y, o] = sum over the taps of p inside the image of
// W_y[tap, y, o].
inline void FoldLabels(const float* kernel, const ConvShape& s, const RowMatrix& taps, float* m) {
  MatrixMap(m, taps.rows(), int64_t{s.k} * s.co).noalias() = taps * LabelKernel(kernel, s);
}

// dW_y = V^T S from S [ho * wo, k * co], S[p, y, o] = sum of dz[n, p, o] over the images
// n of class y (written into the label rows of the kernel gradient).
inline void UnfoldLabelGradient(const float* s_sum, const ConvShape& s, const RowMatrix& taps,
                         float* kernel_grad) {
  StridedMap(kernel_grad + int64_t{s.ci} * s.co, kTaps, int64_t{s.k} * s.co,
             Eigen::OuterStride<>(int64_t{s.ci + s.k} * s.co)).noalias() =
      taps.transpose() * ConstMatrixMap(s_sum, taps.rows(), int64_t{s.k} * s.co);
}

// Leaky ReLU over n values, a = z > 0 ? z : z * slope, and its gradient in place,
// grad = x > 0 ? grad : grad * slope: the same bits as those scalar expressions (a select,
// no arithmetic on the kept branch), computed with Eigen's vector compare-and-select.
// Written as scalar loops, GCC keeps the branch (under the default -ftrapping-math it does
// not compute a multiply that only one branch does), which mispredicts on about half of
// the elements: 40x slower on these sizes (ops/teacher_profile.cc measures the sections).
inline void LeakyRelu(const float* z, int64_t n, float slope, float* a) {
  Eigen::Map<const Eigen::ArrayXf> x(z, n);
  Eigen::Map<Eigen::ArrayXf>(a, n) = (x > 0.0f).select(x, x * slope);
}
inline void LeakyReluGradient(const float* x, int64_t n, float slope, float* grad) {
  Eigen::Map<const Eigen::ArrayXf> at(x, n);
  Eigen::Map<Eigen::ArrayXf> g(grad, n);
  g = (at > 0.0f).select(g, g * slope);
}

inline float Softplus(float x) {
  return x > 0.0f ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}
inline float Sigmoid(float x) {
  return x >= 0.0f ? 1.0f / (1.0f + std::exp(-x)) : std::exp(x) / (1.0f + std::exp(x));
}

// Batch norm over `groups` slices of `rows` rows x `cols` features (in place: z -> xhat,
// u = gamma xhat + beta, a = lrelu(u)); rstd [groups, cols].
inline void BatchNormForward(int groups, int64_t rows, int cols, float epsilon, float slope,
                      const float* gamma, const float* beta, float* xhat, float* u,
                      float* a, float* rstd) {
  const int64_t per_group = rows / groups;
  std::vector<float> mean(cols), var(cols);
  for (int g = 0; g < groups; ++g) {
    float* x = xhat + g * per_group * cols;
    std::fill(mean.begin(), mean.end(), 0.0f);
    std::fill(var.begin(), var.end(), 0.0f);
    for (int64_t r = 0; r < per_group; ++r)
      for (int f = 0; f < cols; ++f) mean[f] += x[r * cols + f];
    for (int f = 0; f < cols; ++f) mean[f] /= static_cast<float>(per_group);
    for (int64_t r = 0; r < per_group; ++r)
      for (int f = 0; f < cols; ++f) {
        const float d = x[r * cols + f] - mean[f];
        var[f] += d * d;
      }
    float* inv = rstd + g * cols;
    for (int f = 0; f < cols; ++f)
      inv[f] = 1.0f / std::sqrt(var[f] / static_cast<float>(per_group) + epsilon);
    float* u_g = u + g * per_group * cols;
    float* a_g = a + g * per_group * cols;
    for (int64_t r = 0; r < per_group; ++r)
      for (int f = 0; f < cols; ++f) {
        const int64_t i = r * cols + f;
        const float normalised = (x[i] - mean[f]) * inv[f];
        x[i] = normalised;
        u_g[i] = gamma[f] * normalised + beta[f];
      }
    LeakyRelu(u_g, per_group * cols, slope, a_g);
  }
}

// Backward of lrelu(batch norm): du (in place from da) -> dz; accumulates dgamma, dbeta.
inline void BatchNormBackward(int groups, int64_t rows, int cols, float slope, const float* gamma,
                       const float* xhat, const float* u, const float* rstd, float* grad,
                       float* dgamma, float* dbeta) {
  const int64_t per_group = rows / groups;
  std::vector<double> sum_dxhat(cols), sum_dxhat_xhat(cols), sum_du(cols), sum_du_xhat(cols);
  LeakyReluGradient(u, rows * cols, slope, grad);
  for (int g = 0; g < groups; ++g) {
    std::fill(sum_du.begin(), sum_du.end(), 0.0);
    std::fill(sum_du_xhat.begin(), sum_du_xhat.end(), 0.0);
    const int64_t base = g * per_group * cols;
    for (int64_t r = 0; r < per_group; ++r)
      for (int f = 0; f < cols; ++f) {
        const int64_t i = base + r * cols + f;
        sum_du[f] += grad[i];
        sum_du_xhat[f] += double{grad[i]} * xhat[i];
      }
    for (int f = 0; f < cols; ++f) {
      dbeta[f] += static_cast<float>(sum_du[f]);
      dgamma[f] += static_cast<float>(sum_du_xhat[f]);
    }
    const float* inv = rstd + g * cols;
    for (int64_t r = 0; r < per_group; ++r)
      for (int f = 0; f < cols; ++f) {
        const int64_t i = base + r * cols + f;
        // dz = gamma rstd (du - mean(du) - xhat mean(du xhat))
        const double centred = grad[i] - sum_du[f] / per_group - xhat[i] * sum_du_xhat[f] / per_group;
        grad[i] = static_cast<float>(gamma[f] * inv[f] * centred);
      }
  }
}

// TF's ApplyAdam formula on one teacher's P parameters: reads (w, m, v) from `from_*` and
// writes them to `to_*` (the same arrays for an update in place; element i only touches
// index i, so the loop is vectorised either way).
inline void AdamUpdate(int64_t size, const float* grad, float alpha, float one_minus_beta1,
                float one_minus_beta2, float epsilon, const float* from_w, const float* from_m,
                const float* from_v, float* to_w, float* to_m, float* to_v) {
  using ConstArray = Eigen::Map<const Eigen::ArrayXf>;
  using Array = Eigen::Map<Eigen::ArrayXf>;
  constexpr int64_t kBlock = 1024;   // three passes over a block that stays in L1
  for (int64_t at = 0; at < size; at += kBlock) {
    const int64_t n = std::min(kBlock, size - at);
    ConstArray g(grad + at, n);
    Array m(to_m + at, n), v(to_v + at, n);
    m = ConstArray(from_m + at, n) + (g - ConstArray(from_m + at, n)) * one_minus_beta1;
    v = ConstArray(from_v + at, n) + (g.square() - ConstArray(from_v + at, n)) * one_minus_beta2;
    Array(to_w + at, n) = ConstArray(from_w + at, n) - alpha * m / (v.sqrt() + epsilon);
  }
}

// One Adam step of one teacher (the arguments of AdamUpdate), applied to a range of its
// parameters at a time: element i of the update reads grad[i] and the moments of i only,
// so updating the parameters range by range gives the bits of one whole pass.
struct AdamStep {
  float alpha, one_minus_beta1, one_minus_beta2, epsilon;
  const float *from_w, *from_m, *from_v;
  float *w, *m, *v;

  // Parameters [begin, begin + count) with their gradient at grad[0 .. count).
  void Apply(int64_t begin, int64_t count, const float* grad) const {
    AdamUpdate(count, grad, alpha, one_minus_beta1, one_minus_beta2, epsilon, from_w + begin,
               from_m + begin, from_v + begin, w + begin, m + begin, v + begin);
  }
};

// One teacher's forward and backward pass; buffers are reused across teachers of a thread.
class Discriminator {
 public:
  Discriminator(const Geometry& g, float slope, float bn_epsilon)
      : g_(g), slope_(slope), bn_epsilon_(bn_epsilon) {
    conv0_ = {g.h, g.w, g.c, g.h1, g.w1, g.c0, g.pad0_top, g.pad0_left, g.k};
    conv1_ = {g.h1, g.w1, g.c0, g.h2, g.w2, g.c1, g.pad1_top, g.pad1_left, g.k};
    taps0_ = InsideTaps(conv0_);
    taps1_ = InsideTaps(conv1_);
    rows0_ = int64_t{g.n} * g.h1 * g.w1;
    rows1_ = int64_t{g.n} * g.h2 * g.w2;
    w0x_.resize(int64_t{kTaps} * g.c * g.c0);
    w1x_.resize(int64_t{kTaps} * g.c0 * g.c1);
    m0_.resize(int64_t{g.k} * g.h1 * g.w1 * g.c0);
    m1_.resize(int64_t{g.k} * g.h2 * g.w2 * g.c1);
    p0_.resize(rows0_ * kTaps * g.c);
    z0_.resize(rows0_ * g.c0);
    a0_.resize(rows0_ * g.c0);
    p1_.resize(rows1_ * kTaps * g.c0);
    xhat1_.resize(rows1_ * g.c1);
    u1_.resize(rows1_ * g.c1);
    a1_.resize(rows1_ * g.c1);
    rstd1_.resize(int64_t{g.groups} * g.c1);
    xhat2_.resize(int64_t{g.n} * g.dense);
    u2_.resize(int64_t{g.n} * g.dense);
    a2_.resize(int64_t{g.n} * g.dense);
    rstd2_.resize(int64_t{g.groups} * g.dense);
    logits_.resize(g.n);
    d2_.resize(int64_t{g.n} * g.dense);
    d1_.resize(rows1_ * g.c1);
    dp_.resize(std::max(rows1_ * kTaps * g.c0, rows0_ * kTaps * g.c));
    d0_.resize(rows0_ * g.c0);
    kgrad_.resize(std::max(int64_t{kTaps} * g.c0 * g.c1, int64_t{kTaps} * g.c * g.c0));
    col_.resize(std::max({rows0_ * g.c0, rows1_ * g.c1, static_cast<int64_t>(kgrad_.size())}));
    label_sum_.resize(std::max(m0_.size(), m1_.size()));
  }

  const std::vector<float>& logits() const { return logits_; }

  // [begin, end) of the parameters that Backward with `adam` updates itself.
  std::pair<int64_t, int64_t> DenseImageRows() const {
    return {g_.k2, g_.k2 + g_.flat * g_.dense};
  }

  // A [P] buffer for this thread's parameter gradients (allocated at the first use).
  float* GradientBuffer() {
    if (grad_.size() != static_cast<size_t>(g_.size)) grad_.resize(g_.size);
    return grad_.data();
  }

  bool Matches(const Geometry& g, float slope, float bn_epsilon) const {
    return g.n == g_.n && g.groups == g_.groups && g.h == g_.h && g.w == g_.w &&
           g.c == g_.c && g.k == g_.k && g.c1 == g_.c1 && g.dense == g_.dense &&
           slope == slope_ && bn_epsilon == bn_epsilon_;
  }

  // x [n, h, w, c]; y [n] class indices in [0, k).  `same_images`: x is the batch of this
  // object's previous Forward (a shared query batch), whose conv0 patches it still holds
  // (only Forward writes them), so they are not gathered again.
  void Forward(const float* p, const float* x, const int32_t* y, bool same_images = false) {
    const Geometry& g = g_;
    // conv0 (image part as a GEMM on patches, label part folded) + bias, lrelu
    GatherImageKernel(p + g.k0, conv0_, w0x_.data());
    FoldLabels(p + g.k0, conv0_, taps0_, m0_.data());
    if (!same_images)
      Im2Col(x, g.n, g.h, g.w, g.c, g.h1, g.w1, g.pad0_top, g.pad0_left, p0_.data());
    const int64_t taps0 = int64_t{kTaps} * g.c, taps1 = int64_t{kTaps} * g.c0;
    Product(rows0_, g.c0, taps0, {p0_.data(), taps0, 1}, {w0x_.data(), g.c0, 1},
            {z0_.data(), g.c0, 1}, [&] {
              ColMatrixMap z0_col(col_.data(), rows0_, g.c0);
              z0_col.noalias() = ConstMatrixMap(p0_.data(), rows0_, taps0) *
                                 ConstMatrixMap(w0x_.data(), taps0, g.c0);
              MatrixMap(z0_.data(), rows0_, g.c0) = z0_col;
            });
    AddLabelAndBias(m0_.data(), p + g.b0, y, int64_t{g.h1} * g.w1, g.c0, z0_.data());
    LeakyRelu(z0_.data(), rows0_ * g.c0, slope_, a0_.data());
    DCLENS_LAP(profile::kConv0Forward);
    // conv1 + bias, batch norm, lrelu
    GatherImageKernel(p + g.k1, conv1_, w1x_.data());
    FoldLabels(p + g.k1, conv1_, taps1_, m1_.data());
    Im2Col(a0_.data(), g.n, g.h1, g.w1, g.c0, g.h2, g.w2, g.pad1_top, g.pad1_left, p1_.data());
    DCLENS_LAP(profile::kConv1Im2Col);
    Product(rows1_, g.c1, taps1, {p1_.data(), taps1, 1}, {w1x_.data(), g.c1, 1},
            {xhat1_.data(), g.c1, 1}, [&] {
              ColMatrixMap z1_col(col_.data(), rows1_, g.c1);
              z1_col.noalias() = ConstMatrixMap(p1_.data(), rows1_, taps1) *
                                 ConstMatrixMap(w1x_.data(), taps1, g.c1);
              MatrixMap(xhat1_.data(), rows1_, g.c1) = z1_col;
            });
    DCLENS_LAP(profile::kConv1Gemm);
    AddLabelAndBias(m1_.data(), p + g.b1, y, int64_t{g.h2} * g.w2, g.c1, xhat1_.data());
    BatchNormForward(g.groups, rows1_, g.c1, bn_epsilon_, slope_, p + g.g1, p + g.be1,
                     xhat1_.data(), u1_.data(), a1_.data(), rstd1_.data());
    DCLENS_LAP(profile::kBatchNorm1Forward);
    // dense2 on [flatten, y] + bias, batch norm, lrelu
    Product(g.n, g.dense, g.flat, {a1_.data(), g.flat, 1}, {p + g.k2, g.dense, 1},
            {xhat2_.data(), g.dense, 1}, [&] {
              MatrixMap(xhat2_.data(), g.n, g.dense).noalias() =
                  ConstMatrixMap(a1_.data(), g.n, g.flat) *
                  ConstMatrixMap(p + g.k2, g.flat, g.dense);
            });
    DCLENS_LAP(profile::kDense2Gemm);
    for (int b = 0; b < g.n; ++b) {
      const float* label_row = p + g.k2 + (g.flat + y[b]) * g.dense;
      float* out = xhat2_.data() + int64_t{b} * g.dense;
      for (int d = 0; d < g.dense; ++d) out[d] += label_row[d] + p[g.b2 + d];
    }
    BatchNormForward(g.groups, g.n, g.dense, bn_epsilon_, slope_, p + g.g2, p + g.be2,
                     xhat2_.data(), u2_.data(), a2_.data(), rstd2_.data());
    // dense3 on [a2, y]
    for (int b = 0; b < g.n; ++b) {
      const float* a = a2_.data() + int64_t{b} * g.dense;
      float sum = 0.0f;
      for (int d = 0; d < g.dense; ++d) sum += a[d] * p[g.k3 + d];
      logits_[b] = sum + p[g.k3 + g.dense + y[b]] + p[g.b3];
    }
    DCLENS_LAP(profile::kDense2Rest);
  }

  // Backward from dL/dlogit [n].  grad (size P), if not null, receives dL/dparameters;
  // dx [n, h, w, c], if not null, receives dL/dx.  `adam` (with grad): dense2's image rows
  // of the kernel, 95% of the parameters, get their Adam step here, a block of rows at a
  // time straight from the GEMM while the block is in cache (after dz2 W^T has read the
  // old weights); their gradient is not written to grad, and the caller updates the rest
  // (DenseImageRows() tells which range is done).  Only where the GEMM is small_gemm:
  // there a block's entries are the same fma chains as the whole product's, so the bits
  // are those of the unfused step.
  void Backward(const float* p, const int32_t* y, const float* dlogit, float* grad,
                float* dx, const AdamStep* adam = nullptr) {
    const Geometry& g = g_;
#ifndef DCLENS_SMALL_GEMM
    if (adam != nullptr) std::abort();   // callers fuse only on small_gemm builds
#endif
    if (grad != nullptr) {
      // Assigned below: the conv kernels and dense2's image rows; accumulated: the rest.
      std::fill(grad + g.b0, grad + g.k1, 0.0f);
      std::fill(grad + g.b1, grad + g.k2, 0.0f);
      std::fill(grad + g.k2 + g.flat * g.dense, grad + g.size, 0.0f);
    }
    // dense3
    for (int b = 0; b < g.n; ++b) {
      const float* a = a2_.data() + int64_t{b} * g.dense;
      float* da = d2_.data() + int64_t{b} * g.dense;
      for (int d = 0; d < g.dense; ++d) da[d] = dlogit[b] * p[g.k3 + d];
      if (grad != nullptr) {
        for (int d = 0; d < g.dense; ++d) grad[g.k3 + d] += a[d] * dlogit[b];
        grad[g.k3 + g.dense + y[b]] += dlogit[b];
        grad[g.b3] += dlogit[b];
      }
    }
    DCLENS_LAP(profile::kLossAndDense3Backward);
    // batch norm 2 and lrelu -> dz2 (in d2_)
    std::vector<float> scratch_gamma, scratch_beta;
    float* dgamma2 = grad != nullptr ? grad + g.g2 : Scratch(&scratch_gamma, g.dense);
    float* dbeta2 = grad != nullptr ? grad + g.be2 : Scratch(&scratch_beta, g.dense);
    BatchNormBackward(g.groups, g.n, g.dense, slope_, p + g.g2, xhat2_.data(), u2_.data(),
                      rstd2_.data(), d2_.data(), dgamma2, dbeta2);
    DCLENS_LAP(profile::kBatchNorm2Backward);
    ConstMatrixMap dz2(d2_.data(), g.n, g.dense);
    if (grad != nullptr) {
      if (adam == nullptr)
        Product(g.flat, g.dense, g.n, {a1_.data(), 1, g.flat}, {d2_.data(), g.dense, 1},
                {grad + g.k2, g.dense, 1}, [&] {
                  MatrixMap(grad + g.k2, g.flat, g.dense).noalias() =
                      ConstMatrixMap(a1_.data(), g.n, g.flat).transpose() * dz2;
                });
      for (int b = 0; b < g.n; ++b) {
        float* label_row = grad + g.k2 + (g.flat + y[b]) * g.dense;
        for (int d = 0; d < g.dense; ++d) {
          label_row[d] += dz2(b, d);
          grad[g.b2 + d] += dz2(b, d);
        }
      }
    }
    DCLENS_LAP(profile::kDense2KernelGradient);
    // -> da1, batch norm 1 and lrelu -> dz1 (in d1_)
    Product(g.n, g.flat, g.dense, {d2_.data(), g.dense, 1}, {p + g.k2, 1, g.dense},
            {d1_.data(), g.flat, 1}, [&] {
              MatrixMap(d1_.data(), g.n, g.flat).noalias() =
                  dz2 * ConstMatrixMap(p + g.k2, g.flat, g.dense).transpose();
            });
    DCLENS_LAP(profile::kDense2InputGradient);
#ifdef DCLENS_SMALL_GEMM
    if (grad != nullptr && adam != nullptr) {
      constexpr int64_t kRows = 48;   // a block's gradient: 48 x 256 floats, in L2
      block_grad_.resize(static_cast<size_t>(kRows * g.dense));
      for (int64_t r0 = 0; r0 < g.flat; r0 += kRows) {
        const int64_t rows = std::min(kRows, g.flat - r0);
        small_gemm::Multiply(rows, g.dense, g.n, {a1_.data() + r0, 1, g.flat},
                             {d2_.data(), g.dense, 1}, {block_grad_.data(), g.dense, 1}, &pack_);
        DCLENS_LAP(profile::kDense2KernelGradient);
        adam->Apply(g.k2 + r0 * g.dense, rows * g.dense, block_grad_.data());
        DCLENS_LAP(profile::kAdam);
      }
    }
#endif
    float* dgamma1 = grad != nullptr ? grad + g.g1 : Scratch(&scratch_gamma, g.c1);
    float* dbeta1 = grad != nullptr ? grad + g.be1 : Scratch(&scratch_beta, g.c1);
    BatchNormBackward(g.groups, rows1_, g.c1, slope_, p + g.g1, xhat1_.data(), u1_.data(),
                      rstd1_.data(), d1_.data(), dgamma1, dbeta1);
    DCLENS_LAP(profile::kBatchNorm1Backward);
    ConstMatrixMap dz1(d1_.data(), rows1_, g.c1);
    if (grad != nullptr) {
      KernelGradient(p1_.data(), dz1, conv1_, taps1_, rows1_, y,
                     grad + g.k1, grad + g.b1);
    }
    DCLENS_LAP(profile::kConv1KernelGradient);
    // -> da0 via the patches' gradient, lrelu -> dz0 (in d0_)
    const int64_t taps1 = int64_t{kTaps} * g.c0;
    Product(rows1_, taps1, g.c1, {d1_.data(), g.c1, 1}, {w1x_.data(), 1, g.c1},
            {dp_.data(), taps1, 1}, [&] {
              MatrixMap(dp_.data(), rows1_, taps1).noalias() =
                  dz1 * ConstMatrixMap(w1x_.data(), taps1, g.c1).transpose();
            });
    DCLENS_LAP(profile::kConv1PatchGradient);
    Col2Im(dp_.data(), g.n, g.h1, g.w1, g.c0, g.h2, g.w2, g.pad1_top, g.pad1_left, d0_.data());
    LeakyReluGradient(z0_.data(), rows0_ * g.c0, slope_, d0_.data());
    ConstMatrixMap dz0(d0_.data(), rows0_, g.c0);
    if (grad != nullptr) {
      KernelGradient(p0_.data(), dz0, conv0_, taps0_, rows0_, y, grad + g.k0, grad + g.b0);
    }
    DCLENS_LAP(profile::kConv0Backward);
    if (dx != nullptr) {
      const int64_t taps0 = int64_t{kTaps} * g.c;
      Product(rows0_, taps0, g.c0, {d0_.data(), g.c0, 1}, {w0x_.data(), 1, g.c0},
              {dp_.data(), taps0, 1}, [&] {
                MatrixMap(dp_.data(), rows0_, taps0).noalias() =
                    dz0 * ConstMatrixMap(w0x_.data(), taps0, g.c0).transpose();
              });
      Col2Im(dp_.data(), g.n, g.h, g.w, g.c, g.h1, g.w1, g.pad0_top, g.pad0_left, dx);
    }
  }

 private:
  // C [m, n] = A [m, k] B [k, n] (strided views) with this build's GEMM: ops/small_gemm.h
  // where it is built (AVX2/FMA without AVX-512: every element one fma chain over k, in
  // order), else `eigen`, the Eigen product the kernel has always used (its bits unchanged).
  template <class EigenProduct>
  void Product(int64_t m, int64_t n, int64_t k, small_gemm::Matrix a, small_gemm::Matrix b,
               small_gemm::Output c, EigenProduct&& eigen) {
#ifdef DCLENS_SMALL_GEMM
    (void)eigen;
    small_gemm::Multiply(m, n, k, a, b, c, &pack_);
#else
    (void)m, (void)n, (void)k, (void)a, (void)b, (void)c;
    eigen();
#endif
  }

  static float* Scratch(std::vector<float>* buffer, int size) {
    buffer->assign(size, 0.0f);
    return buffer->data();
  }

  // z [n, positions, co] += M[p, y_n, :] + bias.
  void AddLabelAndBias(const float* m, const float* bias, const int32_t* y, int64_t positions,
                       int co, float* z) const {
    const int k = g_.k;
    for (int b = 0; b < g_.n; ++b)
      for (int64_t p = 0; p < positions; ++p) {
        const float* fold = m + (p * k + y[b]) * co;
        float* out = z + (b * positions + p) * co;
        for (int o = 0; o < co; ++o) out[o] += fold[o] + bias[o];
      }
  }

  // Kernel (image and label parts) and bias gradients of one convolution from dz.
  void KernelGradient(const float* patches, const ConstMatrixMap& dz, const ConvShape& s,
                      const RowMatrix& taps, int64_t rows, const int32_t* y,
                      float* kernel_grad, float* bias_grad) {
    const int64_t taps_in = int64_t{kTaps} * s.ci;
    Product(taps_in, s.co, rows, {patches, 1, taps_in}, {dz.data(), s.co, 1},
            {kgrad_.data(), s.co, 1}, [&] {
              ColMatrixMap image_grad_col(col_.data(), taps_in, s.co);
              image_grad_col.noalias() = ConstMatrixMap(patches, rows, taps_in).transpose() * dz;
              MatrixMap(kgrad_.data(), taps_in, s.co) = image_grad_col;
            });
    ScatterImageKernel(kgrad_.data(), s, kernel_grad);
    const int64_t positions = int64_t{s.ho} * s.wo;
    const int k = s.k, co = s.co;
    std::fill(label_sum_.begin(), label_sum_.begin() + positions * k * co, 0.0f);
    for (int b = 0; b < g_.n; ++b)
      for (int64_t p = 0; p < positions; ++p) {
        const float* from = dz.data() + (b * positions + p) * co;
        float* to = label_sum_.data() + (p * k + y[b]) * co;
        for (int o = 0; o < co; ++o) to[o] += from[o];
      }
    for (int64_t row = 0; row < positions * k; ++row)
      for (int o = 0; o < co; ++o) bias_grad[o] += label_sum_[row * co + o];
    UnfoldLabelGradient(label_sum_.data(), s, taps, kernel_grad);
  }

  Geometry g_;
  float slope_, bn_epsilon_;
  ConvShape conv0_{}, conv1_{};
  RowMatrix taps0_, taps1_;
  int64_t rows0_ = 0, rows1_ = 0;
  std::vector<float> w0x_, w1x_, m0_, m1_, p0_, z0_, a0_, p1_, xhat1_, u1_, a1_, rstd1_;
  std::vector<float> xhat2_, u2_, a2_, rstd2_, logits_, d2_, d1_, dp_, d0_, kgrad_, label_sum_;
  std::vector<float> grad_, col_, pack_, block_grad_;
};

// Discriminators (with their buffers, ~10 MB for 28x28) kept across calls and threads: the
// C entry points start fresh threads every call, so a thread-local cache would allocate
// and zero them for every chunk.  A lease takes a matching one from the pool (or builds
// one) and gives it back when it ends.
class DiscriminatorLease {
 public:
  DiscriminatorLease(const Geometry& g, float slope, float bn_epsilon) {
    {
      std::lock_guard<std::mutex> lock(Mutex());
      auto& pool = Pool();
      for (auto it = pool.begin(); it != pool.end(); ++it) {
        if ((*it)->Matches(g, slope, bn_epsilon)) {
          net_ = std::move(*it);
          pool.erase(it);
          break;
        }
      }
    }
    if (net_ == nullptr) net_ = std::make_unique<Discriminator>(g, slope, bn_epsilon);
  }
  ~DiscriminatorLease() {
    std::lock_guard<std::mutex> lock(Mutex());
    auto& pool = Pool();
    pool.push_back(std::move(net_));
    if (pool.size() > kMaxPooled) pool.erase(pool.begin());   // the oldest goes
  }
  DiscriminatorLease(const DiscriminatorLease&) = delete;
  DiscriminatorLease& operator=(const DiscriminatorLease&) = delete;
  Discriminator& operator*() { return *net_; }

 private:
  static constexpr size_t kMaxPooled = 64;
  static std::mutex& Mutex() {
    static std::mutex mutex;
    return mutex;
  }
  static std::vector<std::unique_ptr<Discriminator>>& Pool() {
    static std::vector<std::unique_ptr<Discriminator>> pool;
    return pool;
  }
  std::unique_ptr<Discriminator> net_;
};

struct Network {
  int num_classes = 0, conv1_filters = 0, dense_units = 0;
  float leaky_slope = 0.2f, bn_epsilon = 1e-5f;
};

struct Adam {
  int num_steps = 1;
  int64_t first_step = 0;   // the teachers' Adam step count before these steps
  float learning_rate = 0.0f, beta1 = 0.0f, beta2 = 0.0f, epsilon = 0.0f;
};

// Empty if the shapes and labels fit the network; else what is wrong.
inline std::string Validate(const Geometry& g, int64_t weight_columns, const int32_t* labels,
                            int64_t num_labels) {
  // Batch-norm statistics, and the pooled buffers sized from them, are per group of
  // n / groups images (training: the real half, then the fake half): an uneven split
  // would read past a group.  Every entry point relies on this check alone.
  if (g.n < 1) return "the batch is empty";
  if (g.groups < 1 || g.n < g.groups || g.n % g.groups != 0)
    return g.groups == 2 ? "each teacher's batch must be real then fake halves of equal "
                           "size, got " + std::to_string(g.n) + " images"
                         : "a batch of " + std::to_string(g.n) + " images does not split "
                           "into " + std::to_string(g.groups) + " equal batch-norm groups";
  if (g.h % 4 != 0 || g.w % 4 != 0)
    return "image height and width must be multiples of 4, got " + std::to_string(g.h) + "x" +
           std::to_string(g.w);
  if (weight_columns != g.size)
    return "weights must be [teachers, " + std::to_string(g.size) +
           "] for this image shape and network, got " + std::to_string(weight_columns) +
           " columns";
  for (int64_t i = 0; i < num_labels; ++i)
    if (labels[i] < 0 || labels[i] >= g.k)
      return "label " + std::to_string(labels[i]) + " at position " + std::to_string(i) +
             " is outside [0, " + std::to_string(g.k) + ")";
  return "";
}

// num_steps Adam steps of teachers [begin, end): teacher t reads (w, m, v) from in_* + t S
// on the first step and writes out_* + t S (in_* may equal out_*: an update in place);
// images x [T, n, h, w, c] (first half real), labels y [T, n]; losses [T] of the last step.
// S = row_stride floats between consecutive teachers' rows (0: packed, S = P); a row's
// P parameters are contiguous, and the S - P floats after them are never touched.
inline void TrainTeachers(const Geometry& g, const Network& net_params, const Adam& adam,
                          const float* in_w, const float* in_m, const float* in_v,
                          float* out_w, float* out_m, float* out_v, const float* x,
                          const int32_t* y, float* losses, int64_t begin, int64_t end,
                          int64_t row_stride = 0) {
  const int64_t stride = row_stride > 0 ? row_stride : g.size;
  DiscriminatorLease lease(g, net_params.leaky_slope, net_params.bn_epsilon);
  Discriminator& net = *lease;
  float* grad = net.GradientBuffer();
  const int n = g.n, half = g.n / 2;
  const int64_t image_size = int64_t{n} * g.h * g.w * g.c;
  std::vector<float> dlogit(n);
  DCLENS_LAP_RESTART();
  for (int64_t t = begin; t < end; ++t) {
    float* w = out_w + t * stride;
    float* m = out_m + t * stride;
    float* v = out_v + t * stride;
    const int32_t* yt = y + t * n;
    for (int s = 0; s < adam.num_steps; ++s) {
      const float* from_w = s == 0 ? in_w + t * stride : w;
      const float* from_m = s == 0 ? in_m + t * stride : m;
      const float* from_v = s == 0 ? in_v + t * stride : v;
      net.Forward(from_w, x + t * image_size, yt);
      const std::vector<float>& logit = net.logits();
      double real = 0.0, fake = 0.0;
      for (int b = 0; b < half; ++b) {
        real += Softplus(-logit[b]);
        dlogit[b] = -Sigmoid(-logit[b]) / half;
      }
      for (int b = half; b < n; ++b) {
        fake += Softplus(logit[b]);
        dlogit[b] = Sigmoid(logit[b]) / half;
      }
      losses[t] = static_cast<float>(real / half + fake / half);
      const double step = static_cast<double>(adam.first_step + s + 1);
      const float beta1_power = static_cast<float>(std::pow(double{adam.beta1}, step));
      const float beta2_power = static_cast<float>(std::pow(double{adam.beta2}, step));
      const float alpha =
          adam.learning_rate * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
      const AdamStep update{alpha, 1.0f - adam.beta1, 1.0f - adam.beta2, adam.epsilon,
                            from_w, from_m, from_v, w, m, v};
#ifdef DCLENS_SMALL_GEMM
      // dense2's image rows are updated inside Backward (fused with their gradient).
      net.Backward(from_w, yt, dlogit.data(), grad, nullptr, &update);
      const auto [fused_begin, fused_end] = net.DenseImageRows();
      update.Apply(0, fused_begin, grad);
      update.Apply(fused_end, g.size - fused_end, grad + fused_end);
#else
      net.Backward(from_w, yt, dlogit.data(), grad, nullptr);
      update.Apply(0, g.size, grad);
#endif
      DCLENS_LAP(profile::kAdam);
    }
  }
}

// -dL_G/dx [T, n, h, w, c] of teachers [begin, end) on the shared batch x [n, h, w, c];
// teacher t's weights at weights + t S (S = row_stride, 0: packed, S = P).
inline void ImageGradients(const Geometry& g, const Network& net_params, const float* weights,
                           const float* x, const int32_t* y, float* out, int64_t begin,
                           int64_t end, int64_t row_stride = 0) {
  const int64_t stride = row_stride > 0 ? row_stride : g.size;
  DiscriminatorLease lease(g, net_params.leaky_slope, net_params.bn_epsilon);
  Discriminator& net = *lease;
  const int n = g.n;
  const int64_t image_size = int64_t{n} * g.h * g.w * g.c;
  std::vector<float> dlogit(n);
  DCLENS_LAP_RESTART();
  for (int64_t t = begin; t < end; ++t) {
    net.Forward(weights + t * stride, x, y, /*same_images=*/t > begin);
    const std::vector<float>& logit = net.logits();
    for (int b = 0; b < n; ++b) dlogit[b] = -Sigmoid(-logit[b]) / n;
    float* out_t = out + t * image_size;
    net.Backward(weights + t * stride, y, dlogit.data(), nullptr, out_t);
    for (int64_t i = 0; i < image_size; ++i) out_t[i] = -out_t[i];
    DCLENS_LAP(profile::kInputGradient);
  }
}

// Multiply-adds of one teacher pass, for splitting work.
inline int64_t TeacherCost(const Geometry& g) {
  return 6 * (int64_t{g.n} * (g.h1 * g.w1 * kTaps * g.c * g.c0 +
                               g.h2 * g.w2 * kTaps * g.c0 * g.c1 + g.flat * g.dense));
}

}  // namespace teacher_step
}  // namespace dclens

#endif  // DCLENS_OPS_TEACHER_STEP_KERNEL_H_
