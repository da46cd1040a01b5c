// TopAgg voting math shared by the CPU op, the CUDA op and the standalone CUDA harness.
//
// This header has no TensorFlow dependency.  It defines, for one (teacher, image) row of
// D gradient coordinates g[0..D) and k uniform draws u[0..k) (in top-k order):
//
//   1. the k coordinates of largest |g|, ties broken by the lower index first (exactly the
//      order of tf.math.top_k(|g|, sorted=True));
//   2. clipped_j = clip(g_j, -c, c); scale = max_j |clipped_j|;
//      n_j = scale == 0 ? 0 : clipped_j / scale            (tf.math.divide_no_nan);
//   3. vote_j = +1 if u_j < (1 + n_j) / 2 else -1           (stochastic sign), or
//      vote_j = +1 if n_j >= 0 else -1                      (deterministic sign),
//   where j is the rank in top-k order (largest |g| first), and adds the k votes to an
//   int32 output row.
//
// Ordering key.  Each coordinate gets a 64-bit key (|g| bits << 32) | (0xFFFFFFFF - i):
// for non-negative floats the IEEE bit pattern orders like the value, so a larger key is
// "larger |g|, then lower index".  Keys are unique, so the top-k set and its order are
// unique and equal to tf.math.top_k's.  NaN sorts above +inf (tf.math.top_k leaves NaN
// unspecified; gradients are assumed finite).
//
// Denormals.  TensorFlow runs its CPU kernels with flush-to-zero and denormals-are-zero
// set, so in the reference a denormal |g| ties with 0 and a denormal quotient becomes 0.
// The functions below reproduce that explicitly (denormal inputs and results are replaced
// by a zero of the same sign), so the host and device paths give TensorFlow's CPU answer
// whatever the floating-point environment of the calling thread.  All float arithmetic is
// plain IEEE single precision; compile with -ffp-contract=off (host) and -fmad=false
// (nvcc) and never with fast-math.
#ifndef DCLENS_OPS_TOPK_SIGN_VOTE_KERNEL_H_
#define DCLENS_OPS_TOPK_SIGN_VOTE_KERNEL_H_

#include <stdint.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#define DCLENS_HD __host__ __device__ __forceinline__
#else
#define DCLENS_HD inline
#endif

namespace dclens {
namespace vote {

DCLENS_HD uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

DCLENS_HD float bits_float(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// A denormal (or zero) becomes a zero of the same sign; anything else is unchanged.
DCLENS_HD float flush(float x) {
  const uint32_t b = float_bits(x);
  return (b & 0x7f800000u) == 0 ? bits_float(b & 0x80000000u) : x;
}

// The ordering key of |g|: its bit pattern without the sign, 0 for zeros and denormals.
DCLENS_HD uint32_t abs_key(float g) {
  const uint32_t a = float_bits(g) & 0x7fffffffu;
  return a < 0x00800000u ? 0u : a;
}

DCLENS_HD uint64_t composite_key(float g, uint32_t index) {
  return (static_cast<uint64_t>(abs_key(g)) << 32) | static_cast<uint64_t>(0xffffffffu - index);
}

DCLENS_HD uint32_t key_index(uint64_t key) {
  return 0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu);
}

// tf.clip_by_value(x, -c, c) = maximum(minimum(x, c), -c), on the flushed value.
DCLENS_HD float clip(float g, float c) {
  const float x = flush(g);
  const float lo = x < c ? x : c;
  return lo > -c ? lo : -c;
}

DCLENS_HD float abs_value(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }

// tf.math.divide_no_nan(clipped, scale), with the quotient flushed like TF's FTZ.
DCLENS_HD float normalise(float clipped, float scale) {
  return scale == 0.0f ? 0.0f : flush(clipped / scale);
}

// +1 or -1 for one voted coordinate.
DCLENS_HD int32_t sign_vote(float n, float u, bool stochastic) {
  if (stochastic) {
    const float half = (1.0f + n) / 2.0f;
    return u < half ? 1 : -1;
  }
  return n >= 0.0f ? 1 : -1;
}

// Adds the k votes of one row, given its chosen coordinates in top-k order (stochastic)
// or in any order (deterministic).
inline void add_votes_host(const float* g, const float* u, const uint32_t* chosen, int64_t k,
                           float c, bool stochastic, int32_t* out) {
  float scale = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    const float a = abs_value(clip(g[chosen[j]], c));
    scale = a > scale ? a : scale;
  }
  for (int64_t j = 0; j < k; ++j) {
    const uint32_t i = chosen[j];
    out[i] += sign_vote(normalise(clip(g[i], c), scale), stochastic ? u[j] : 0.0f, stochastic);
  }
}

// The obviously-correct host path for one row: std::nth_element + std::sort on the 64-bit
// keys.  scratch: dim keys; chosen: k indices.  Adds the k votes to out[0..dim).  Used as
// the reference by the CUDA harness and by the self-check of the fast path.
inline void vote_row_host_simple(const float* g, const float* u, int64_t dim, int64_t k,
                                 float c, bool stochastic, uint64_t* scratch,
                                 uint32_t* chosen, int32_t* out) {
  for (int64_t i = 0; i < dim; ++i) scratch[i] = composite_key(g[i], static_cast<uint32_t>(i));
  const std::greater<uint64_t> larger;
  if (k < dim) std::nth_element(scratch, scratch + (k - 1), scratch + dim, larger);
  std::sort(scratch, scratch + k, larger);
  for (int64_t j = 0; j < k; ++j) chosen[j] = key_index(scratch[j]);
  add_votes_host(g, u, chosen, k, c, stochastic, out);
}

// Scratch memory of the fast host path, reused across rows.
struct HostScratch {
  std::vector<uint32_t> keys, candidates, chosen_key, chosen_index, tmp_key, tmp_index;
  void reserve(int64_t dim, int64_t k) {
    keys.resize(dim);
    candidates.resize(dim + 1);
    chosen_key.resize(k + 1);
    chosen_index.resize(k + 1);
    tmp_key.resize(k + 1);
    tmp_index.resize(k + 1);
  }
};

// Radix digits of a 31-bit |g| key, most significant first: the exponent (bits 30..23),
// then the mantissa in 8 + 8 + 7 bits.
constexpr int kDigitShift[4] = {23, 15, 7, 0};
constexpr uint32_t kDigitMask[4] = {0xff, 0xff, 0xff, 0x7f};

// The fast host path for one row (same result as vote_row_host_simple):
//  1. 32-bit keys abs_key(g_i); an exact radix select of the k-th largest key, one digit
//     per pass over the surviving candidates, stopping as soon as every candidate with
//     the selected prefix is taken;
//  2. the chosen coordinates, collected in index order: every key above the selected
//     prefix plus the first `remaining` (lowest indices) equal to it (ties: lower index);
//  3. stochastic sign only: a stable LSD radix sort of the chosen by key, descending
//     (stability keeps equal keys in index order), skipping digits all chosen keys share;
//  4. the votes.
// O(dim + k) per row; no comparison sorts.
inline void vote_row_host(const float* g, const float* u, int64_t dim, int64_t k, float c,
                          bool stochastic, HostScratch* scratch, int32_t* out) {
  uint32_t* keys = scratch->keys.data();
  uint32_t hist[256];
  if (k < dim) {
    // The keys and the histogram of their first digit (the exponent) in one pass.  Four
    // sub-histograms: gradients share few exponents, and one counter incremented back to
    // back would serialise on store-to-load forwarding.
    uint32_t sub[4][256] = {};
    const int64_t quads = dim - dim % 4;
    int64_t i = 0;
    for (; i < quads; i += 4) {
      for (int lane = 0; lane < 4; ++lane) {
        const uint32_t key = abs_key(g[i + lane]);
        keys[i + lane] = key;
        ++sub[lane][key >> 23];
      }
    }
    for (; i < dim; ++i) {
      keys[i] = abs_key(g[i]);
      ++sub[0][keys[i] >> 23];
    }
    for (int d = 0; d < 256; ++d) hist[d] = sub[0][d] + sub[1][d] + sub[2][d] + sub[3][d];
  } else {
    for (int64_t i = 0; i < dim; ++i) keys[i] = abs_key(g[i]);
  }

  // 1. Radix select.
  const uint32_t* src = keys;
  uint32_t* cand = scratch->candidates.data();
  int64_t n = dim, remaining = k;
  uint32_t prefix = 0;
  int level = 0;
  if (k < dim) {
    for (; level < 4; ++level) {
      const int shift = kDigitShift[level];
      const uint32_t mask = kDigitMask[level];
      if (level > 0) {
        std::fill(hist, hist + 256, 0u);
        for (int64_t i = 0; i < n; ++i) ++hist[(src[i] >> shift) & mask];
      }
      int64_t above = 0;
      uint32_t d = mask;
      for (; d > 0; --d) {
        if (above + hist[d] >= remaining) break;
        above += hist[d];
      }
      remaining -= above;
      prefix |= d << shift;
      if (static_cast<int64_t>(hist[d]) == remaining) break;  // All of them are chosen.
      int64_t m = 0;  // Branch-free compaction (cand has room for one extra write).
      for (int64_t i = 0; i < n; ++i) {
        cand[m] = src[i];
        m += ((src[i] >> shift) & mask) == d;
      }
      src = cand;
      n = m;
    }
  }
  // The selected prefix covers the digits 0..level (all of them if level reached 4).
  const int low = level < 4 ? kDigitShift[level] : 0;
  const uint32_t top = prefix >> low;

  // 2. The chosen, in index order.
  uint32_t* ck = scratch->chosen_key.data();
  uint32_t* ci = scratch->chosen_index.data();
  int64_t j = 0;
  if (k == dim) {
    for (int64_t i = 0; i < dim; ++i) {
      ck[i] = keys[i];
      ci[i] = static_cast<uint32_t>(i);
    }
    j = dim;
  } else {
    int64_t ties = remaining;  // Branch-free (ck, ci have room for one extra write).
    for (int64_t i = 0; i < dim; ++i) {
      const uint32_t t = keys[i] >> low;
      const int64_t tie = (t == top) & (ties > 0);
      const int64_t take = (t > top) | tie;
      ck[j] = keys[i];
      ci[j] = static_cast<uint32_t>(i);
      j += take;
      ties -= tie;
    }
  }

  // 3. Stable LSD radix sort by key, descending.
  if (stochastic && k > 1) {
    uint32_t any = 0, all = 0xffffffffu;
    for (int64_t i = 0; i < k; ++i) {
      any |= ck[i];
      all &= ck[i];
    }
    const uint32_t varying = any ^ all;
    uint32_t* tk = scratch->tmp_key.data();
    uint32_t* ti = scratch->tmp_index.data();
    for (int lvl = 3; lvl >= 0; --lvl) {
      const int shift = kDigitShift[lvl];
      const uint32_t mask = kDigitMask[lvl];
      if (((varying >> shift) & mask) == 0) continue;
      std::fill(hist, hist + 256, 0u);
      for (int64_t i = 0; i < k; ++i) ++hist[(ck[i] >> shift) & mask];
      uint32_t start = 0;  // Descending: the largest digit goes first.
      for (int64_t d = mask; d >= 0; --d) {
        const uint32_t h = hist[d];
        hist[d] = start;
        start += h;
      }
      for (int64_t i = 0; i < k; ++i) {
        const uint32_t pos = hist[(ck[i] >> shift) & mask]++;
        tk[pos] = ck[i];
        ti[pos] = ci[i];
      }
      std::swap(ck, tk);
      std::swap(ci, ti);
    }
  }

  // 4. Votes.
  add_votes_host(g, u, ci, k, c, stochastic, out);
}

// Host path for a whole [teachers, images, dim] problem (single-threaded; the CUDA
// harness's reference).  out [images, dim] is overwritten.  simple: use
// vote_row_host_simple instead of the fast vote_row_host.
inline void vote_all_host(const float* grads, const float* uniforms, int64_t teachers,
                          int64_t images, int64_t dim, int64_t k, float c, bool stochastic,
                          int32_t* out, bool simple = true) {
  std::vector<uint64_t> keys(dim);
  std::vector<uint32_t> chosen(k);
  HostScratch fast;
  fast.reserve(dim, k);
  std::fill(out, out + images * dim, 0);
  for (int64_t t = 0; t < teachers; ++t) {
    for (int64_t b = 0; b < images; ++b) {
      const int64_t row = t * images + b;
      const float* u = stochastic ? uniforms + row * k : nullptr;
      if (simple) {
        vote_row_host_simple(grads + row * dim, u, dim, k, c, stochastic, keys.data(),
                             chosen.data(), out + b * dim);
      } else {
        vote_row_host(grads + row * dim, u, dim, k, c, stochastic, &fast, out + b * dim);
      }
    }
  }
}

#if defined(__CUDACC__)
// ---------------------------------------------------------------------------------------
// Device path: one thread block per (teacher, image) row (grid-stride over rows).
//
//  * Selection: an exact radix select of the k-th largest 64-bit key, 8 bits per pass
//    (256-bin shared-memory histogram), stopping early once every key matching the prefix
//    is taken.  A coordinate is chosen iff (key & mask) >= prefix.
//  * Scale: atomicMax on the bit pattern of |clipped| (non-negative floats order like
//    their bits).
//  * Ranks (stochastic sign only): the chosen keys are gathered in shared memory (when
//    k * 8 bytes fits, see kMaxSharedK) and each one's rank is the number of chosen keys
//    larger than it; otherwise the rank is counted over all dim keys of the row.
//  * Votes are added to out[image, i] with integer atomicAdd: exact and order-independent,
//    so the result is deterministic.
// ---------------------------------------------------------------------------------------

constexpr int kBlock = 256;
constexpr int64_t kMaxSharedK = 5120;  // 40 KiB of 64-bit keys (+ ~1 KiB static) < 48 KiB.

__global__ void topk_sign_vote_device(const float* __restrict__ grads,
                                      const float* __restrict__ uniforms, int64_t rows,
                                      int64_t images, int64_t dim, int64_t k, float c,
                                      bool stochastic, bool shared_list,
                                      int32_t* __restrict__ out) {
  extern __shared__ unsigned long long chosen_keys[];
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ unsigned long long s_remaining;
  __shared__ int s_done;
  __shared__ unsigned int s_count;
  __shared__ unsigned int s_scale_bits;
  const int tid = threadIdx.x;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* g = grads + row * dim;
    const float* u = stochastic ? uniforms + row * k : nullptr;
    int32_t* o = out + (row % images) * dim;

    // 1. Radix select.
    unsigned long long prefix = 0, mask = 0, remaining = static_cast<unsigned long long>(k);
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      for (int64_t i = tid; i < dim; i += blockDim.x) {
        const unsigned long long key = composite_key(g[i], static_cast<uint32_t>(i));
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        unsigned long long above = 0;
        int d = 255;
        for (; d > 0; --d) {
          if (above + hist[d] >= remaining) break;
          above += hist[d];
        }
        s_prefix = prefix | (static_cast<unsigned long long>(d) << shift);
        s_remaining = remaining - above;
        s_done = (hist[d] == remaining - above) ? 1 : 0;
      }
      __syncthreads();
      prefix = s_prefix;
      mask |= 0xffull << shift;
      remaining = s_remaining;
      const int done = s_done;
      __syncthreads();
      if (done) break;
    }

    // 2. Scale, and the chosen keys in shared memory.
    if (tid == 0) {
      s_count = 0;
      s_scale_bits = 0;
    }
    __syncthreads();
    for (int64_t i = tid; i < dim; i += blockDim.x) {
      const unsigned long long key = composite_key(g[i], static_cast<uint32_t>(i));
      if ((key & mask) >= prefix) {
        atomicMax(&s_scale_bits, float_bits(abs_value(clip(g[i], c))));
        if (stochastic && shared_list) chosen_keys[atomicAdd(&s_count, 1u)] = key;
      }
    }
    __syncthreads();
    const float scale = bits_float(s_scale_bits);

    // 3. Votes.
    if (stochastic && shared_list) {
      for (int64_t s = tid; s < k; s += blockDim.x) {
        const unsigned long long key = chosen_keys[s];
        int64_t rank = 0;
        for (int64_t j = 0; j < k; ++j) rank += chosen_keys[j] > key ? 1 : 0;
        const uint32_t i = key_index(key);
        atomicAdd(&o[i], sign_vote(normalise(clip(g[i], c), scale), u[rank], true));
      }
    } else {
      for (int64_t i = tid; i < dim; i += blockDim.x) {
        const unsigned long long key = composite_key(g[i], static_cast<uint32_t>(i));
        if ((key & mask) < prefix) continue;
        float draw = 0.0f;
        if (stochastic) {
          int64_t rank = 0;
          for (int64_t j = 0; j < dim; ++j)
            rank += composite_key(g[j], static_cast<uint32_t>(j)) > key ? 1 : 0;
          draw = u[rank];
        }
        atomicAdd(&o[i], sign_vote(normalise(clip(g[i], c), scale), draw, stochastic));
      }
    }
    __syncthreads();  // The shared state is reused by the next row.
  }
}

// Zeroes out [images, dim] and launches the kernel on `stream`.  Returns the first CUDA
// error (launch errors only; the kernel runs asynchronously).
inline cudaError_t launch_topk_sign_vote(const float* grads, const float* uniforms,
                                         int64_t teachers, int64_t images, int64_t dim,
                                         int64_t k, float c, bool stochastic, int32_t* out,
                                         cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(int32_t) * images * dim, stream);
  if (err != cudaSuccess) return err;
  const int64_t rows = teachers * images;
  if (rows == 0 || dim == 0) return cudaSuccess;
  const bool shared_list = stochastic && k <= kMaxSharedK;
  const size_t shared_bytes = shared_list ? sizeof(unsigned long long) * k : 0;
  const int64_t grid = rows < (int64_t{1} << 20) ? rows : (int64_t{1} << 20);
  topk_sign_vote_device<<<static_cast<unsigned int>(grid), kBlock, shared_bytes, stream>>>(
      grads, uniforms, rows, images, dim, k, c, stochastic, shared_list, out);
  return cudaGetLastError();
}
#endif  // __CUDACC__

}  // namespace vote
}  // namespace dclens

#endif  // DCLENS_OPS_TOPK_SIGN_VOTE_KERNEL_H_
