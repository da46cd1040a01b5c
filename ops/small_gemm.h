// A single-threaded float32 GEMM for the teacher step's small, oddly shaped products, with
// an AVX2/FMA register-tile kernel; every result element is one fused multiply-add chain.
//
// C = A B, with A [m, k], B [k, n] and C [m, n] given by strides (element (i, j) of a
// matrix at data[i * rs + j * cs]), so transposed operands and results cost nothing.  Each
// element is computed as
//
//     acc = 0;  for p = 0 .. k-1:  acc = fma(A[i, p], B[p, j], acc);  C[i, j] = acc
//
// in exactly this order (fma: one rounding, as std::fma), whatever the shapes, strides,
// tile or orientation: the register tile carries acc across the k blocks (it reloads C,
// written after the previous block, as the chain's running value), a short tile's
// padding rows and columns only ever meet their own accumulators (never stored), and
// fma(a, b, acc) = fma(b, a, acc) lets the driver compute C^T = B^T A^T instead when that
// wastes less of the tile.  So the
// result is that of the plain triple loop above (small_gemm_check.cc checks it bit for bit),
// and it depends neither on the machine's number of threads nor on where a teacher sits in
// its chunk.
//
// Why not Eigen's GEMM: on the teacher's shapes (30-row dense products, 42- and 11-column
// convolution kernels) Eigen packs both operands, including the 2 MB dense kernel every
// call, and its generic blocking wastes much of its tile; docs/performance.md has the
// measured sections.  Here an operand is read in place when its rows are contiguous
// (B's 16-column panels, through lane masks at a narrow edge; A's broadcasts at any
// stride); only a B whose columns are strided is packed, into the caller's buffer, and a
// result whose rows are strided goes through a tile buffer.
//
// Built only where the compiler targets AVX2 and FMA without AVX-512 (DCLENS_SMALL_GEMM);
// AVX-512 builds and other CPUs keep Eigen's kernels (their bits unchanged), as does a
// build with -DDCLENS_EIGEN_GEMM (for A/B measurements).

#ifndef DCLENS_OPS_SMALL_GEMM_H_
#define DCLENS_OPS_SMALL_GEMM_H_

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) && \
    !defined(DCLENS_EIGEN_GEMM)
#define DCLENS_SMALL_GEMM 1
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#ifdef DCLENS_SMALL_GEMM
#include <immintrin.h>
#endif

namespace dclens {
namespace small_gemm {

// A read-only matrix view: element (i, j) at data[i * rs + j * cs].
struct Matrix {
  const float* data;
  int64_t rs, cs;
  Matrix Transposed() const { return {data, cs, rs}; }
};

// A writable matrix view, the same addressing.
struct Output {
  float* data;
  int64_t rs, cs;
  Output Transposed() const { return {data, cs, rs}; }
};

// The reference: the triple loop the fast path must equal bit for bit.
inline void ReferenceMultiply(int64_t m, int64_t n, int64_t k, Matrix a, Matrix b, Output c) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        acc = __builtin_fmaf(a.data[i * a.rs + p * a.cs], b.data[p * b.rs + j * b.cs], acc);
      c.data[i * c.rs + j * c.cs] = acc;
    }
}

#ifdef DCLENS_SMALL_GEMM

constexpr int kMr = 6;    // rows of the register tile
constexpr int kNr = 16;   // columns: two 8-float vectors
constexpr int64_t kKcMax = 384;
// A k block's B panels (kc x n floats) up to this size stay in L2 across the row tiles.
constexpr int64_t kPanelBytesInL2 = 192 * 1024;

// Lane masks for the first `cols` of 16 columns (cols in 1..16): two 8-lane halves.
inline void ColumnMasks(int64_t cols, __m256i* low, __m256i* high) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  *low = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)), lanes);
  *high = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols) - 8), lanes);
}

// The 6 x 16 register tile over one k block.  A's rows at a + i * a_rs (i < rows; a short
// tile repeats its last row, whose chains are computed and never stored), stepping a_cs
// per p; B's 16 contiguous columns at b, stepping b_rs per p (kMaskB: only the first
// `cols` read, for a narrow panel read in place); the tile's first `rows` x `cols` at
// c + i * ldc, unit column stride, masked past `cols`.  kLoad: start the chains from the
// tile's current values (a later k block), else from 0.
template <bool kLoad, bool kMaskB>
inline void Kernel(int64_t kc, const float* a, int64_t a_rs, int64_t a_cs, int64_t rows,
                   const float* b, int64_t b_rs, float* c, int64_t ldc, int64_t cols) {
  __m256i mask_low, mask_high;
  ColumnMasks(cols, &mask_low, &mask_high);
  const bool full = cols == kNr;
  __m256 acc[kMr][2];
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    if (kLoad && i < rows) {
      acc[i][0] = full ? _mm256_loadu_ps(c + i * ldc) : _mm256_maskload_ps(c + i * ldc, mask_low);
      acc[i][1] = full ? _mm256_loadu_ps(c + i * ldc + 8)
                       : _mm256_maskload_ps(c + i * ldc + 8, mask_high);
    } else {
      acc[i][0] = _mm256_setzero_ps();
      acc[i][1] = _mm256_setzero_ps();
    }
  }
  const float* row[kMr];
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) row[i] = a + std::min<int64_t>(i, rows - 1) * a_rs;
  int64_t at = 0;
  for (int64_t p = 0; p < kc; ++p, at += a_cs, b += b_rs) {
    const __m256 b0 = kMaskB ? _mm256_maskload_ps(b, mask_low) : _mm256_loadu_ps(b);
    const __m256 b1 = kMaskB ? _mm256_maskload_ps(b + 8, mask_high) : _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      const __m256 x = _mm256_broadcast_ss(row[i] + at);
      acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    if (i >= rows) break;
    if (full) {
      _mm256_storeu_ps(c + i * ldc, acc[i][0]);
      _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
    } else {
      _mm256_maskstore_ps(c + i * ldc, mask_low, acc[i][0]);
      _mm256_maskstore_ps(c + i * ldc + 8, mask_high, acc[i][1]);
    }
  }
}

inline int64_t Tiles(int64_t size, int64_t tile) { return (size + tile - 1) / tile; }

// Work of computing C = A B in this orientation, in multiply-add units: the padded tiles'
// multiply-adds, plus a few per float of B packed (when its columns are strided) and of C
// gathered and scattered (when its rows are), per k block.
inline double OrientationCost(int64_t m, int64_t n, int64_t k, const Matrix& b,
                              const Output& c) {
  const double tiles = static_cast<double>(Tiles(m, kMr) * Tiles(n, kNr));
  const double blocks = static_cast<double>(Tiles(k, kKcMax));
  double cost = tiles * kMr * kNr * k;
  if (b.cs != 1) cost += 8.0 * static_cast<double>(k) * Tiles(n, kNr) * kNr;
  if (c.cs != 1) cost += 8.0 * tiles * kMr * kNr * blocks;
  return cost;
}

// C = A B in the given orientation (Multiply picks it).  `pack` is scratch space.
inline void MultiplyOriented(int64_t m, int64_t n, int64_t k, Matrix a, Matrix b, Output c,
                             std::vector<float>* pack) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c.data[i * c.rs + j * c.cs] = 0.0f;
    return;
  }
  const int64_t row_tiles = Tiles(m, kMr), col_tiles = Tiles(n, kNr);
  const int64_t blocks = Tiles(k, kKcMax);
  const int64_t kc_max = Tiles(k, blocks);
  // B with strided columns is packed per k block into [col_tiles][kc][16], zero-padded;
  // B with contiguous columns is read in place (a narrow last panel through masks).
  const bool packed = b.cs != 1;
  if (packed) pack->resize(static_cast<size_t>(col_tiles * kNr * kc_max));
  const bool c_rows_contiguous = c.cs == 1;
  alignas(32) float tile[kMr * kNr];

  for (int64_t block = 0, p0 = 0; block < blocks; ++block) {
    const int64_t kc = std::min(kc_max, k - p0);
    const bool load = block > 0;
    if (packed) {
      for (int64_t jt = 0; jt < col_tiles; ++jt) {
        const int64_t j0 = jt * kNr, cols = std::min<int64_t>(kNr, n - j0);
        float* to = pack->data() + jt * kNr * kc_max;
        for (int64_t p = 0; p < kc; ++p) {
          const float* from = b.data + (p0 + p) * b.rs + j0 * b.cs;
          int64_t j = 0;
          for (; j < cols; ++j) to[p * kNr + j] = from[j * b.cs];
          for (; j < kNr; ++j) to[p * kNr + j] = 0.0f;
        }
      }
    }
    auto run_tile = [&](int64_t it, int64_t jt) {
      const int64_t i0 = it * kMr, j0 = jt * kNr;
      const int64_t rows = std::min<int64_t>(kMr, m - i0), cols = std::min<int64_t>(kNr, n - j0);
      const float* a_tile = a.data + i0 * a.rs + p0 * a.cs;
      const float* b_panel = packed ? pack->data() + jt * kNr * kc_max : b.data + p0 * b.rs + j0;
      const int64_t b_stride = packed ? kNr : b.rs;
      const bool mask_b = !packed && cols < kNr;
      float* c_tile = c.data + i0 * c.rs + j0 * c.cs;
      float* out = c_tile;
      int64_t ldc = c.rs;
      if (!c_rows_contiguous) {   // through a tile buffer, gathered and scattered
        out = tile;
        ldc = kNr;
        if (load)
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) tile[i * kNr + j] = c_tile[i * c.rs + j * c.cs];
      }
      if (load) {
        if (mask_b) Kernel<true, true>(kc, a_tile, a.rs, a.cs, rows, b_panel, b_stride, out, ldc, cols);
        else Kernel<true, false>(kc, a_tile, a.rs, a.cs, rows, b_panel, b_stride, out, ldc, cols);
      } else {
        if (mask_b) Kernel<false, true>(kc, a_tile, a.rs, a.cs, rows, b_panel, b_stride, out, ldc, cols);
        else Kernel<false, false>(kc, a_tile, a.rs, a.cs, rows, b_panel, b_stride, out, ldc, cols);
      }
      if (!c_rows_contiguous)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) c_tile[i * c.rs + j * c.cs] = tile[i * kNr + j];
    };
    const bool panels_in_l2 =
        kc * col_tiles * kNr * static_cast<int64_t>(sizeof(float)) <= kPanelBytesInL2;
    if (panels_in_l2) {
      // Row tiles outside: a row tile of A stays in L1 across every B panel (in L2).
      for (int64_t it = 0; it < row_tiles; ++it)
        for (int64_t jt = 0; jt < col_tiles; ++jt) run_tile(it, jt);
    } else {
      // Column panels outside: a B panel stays in L1 across the row tiles.
      for (int64_t jt = 0; jt < col_tiles; ++jt)
        for (int64_t it = 0; it < row_tiles; ++it) run_tile(it, jt);
    }
    p0 += kc;
  }
}

// C = A B (see the top of the file), in whichever orientation wastes less.
inline void Multiply(int64_t m, int64_t n, int64_t k, Matrix a, Matrix b, Output c,
                     std::vector<float>* pack) {
  if (OrientationCost(n, m, k, a.Transposed(), c.Transposed()) < OrientationCost(m, n, k, b, c))
    MultiplyOriented(n, m, k, b.Transposed(), a.Transposed(), c.Transposed(), pack);
  else
    MultiplyOriented(m, n, k, a, b, c, pack);
}

#endif  // DCLENS_SMALL_GEMM

}  // namespace small_gemm
}  // namespace dclens

#endif  // DCLENS_OPS_SMALL_GEMM_H_
