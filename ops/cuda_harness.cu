// Standalone check of the CUDA TopAgg voting kernel against the host implementation.
// Includes only the TF-free header.  Build: `make -C ops cuda-harness`; run
// ops/build/cuda_harness on a machine with a GPU.  Exit status: 0 all cases equal,
// 1 a mismatch or CUDA error, 2 no CUDA device.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "topk_sign_vote_kernel.h"

namespace {

#define CHECK_CUDA(expr)                                                           \
  do {                                                                             \
    cudaError_t err_ = (expr);                                                     \
    if (err_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,         \
                   cudaGetErrorString(err_));                                      \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

struct Case {
  std::string name;
  int64_t teachers, images, dim, k;
  float c;
  int kind;  // 0 normal, 1 tied integers, 2 zeros + sparse, 3 beyond clip, 4 denormals
};

std::vector<float> make_grads(const Case& cs, std::mt19937_64& rng) {
  const int64_t n = cs.teachers * cs.images * cs.dim;
  std::vector<float> g(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ints(-3, 3);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    switch (cs.kind) {
      case 0: g[i] = 1e-5f * normal(rng); break;
      case 1: g[i] = static_cast<float>(ints(rng)); break;
      case 2: g[i] = unif(rng) < 0.05f ? static_cast<float>(ints(rng)) : 0.0f; break;
      case 3: g[i] = 10.0f * normal(rng); break;
      default: {
        const float r = unif(rng);
        g[i] = r < 0.3f ? 1e-40f * ints(rng) : (r < 0.6f ? 0.0f : 1e-38f * normal(rng));
      }
    }
  }
  if (cs.kind == 2) {  // Every other image all-zero.
    for (int64_t t = 0; t < cs.teachers; ++t)
      for (int64_t b = 0; b < cs.images; b += 2)
        for (int64_t d = 0; d < cs.dim; ++d) g[(t * cs.images + b) * cs.dim + d] = 0.0f;
  }
  return g;
}

bool run_case(const Case& cs, bool stochastic, std::mt19937_64& rng) {
  const std::vector<float> g = make_grads(cs, rng);
  std::vector<float> u(cs.teachers * cs.images * cs.k);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  for (auto& x : u) x = unif(rng);
  const int64_t out_size = cs.images * cs.dim;
  std::vector<int32_t> want(out_size), got(out_size);
  dclens::vote::vote_all_host(g.data(), u.data(), cs.teachers, cs.images, cs.dim, cs.k, cs.c,
                              stochastic, want.data());

  float *d_g = nullptr, *d_u = nullptr;
  int32_t* d_out = nullptr;
  CHECK_CUDA(cudaMalloc(&d_g, sizeof(float) * (g.size() ? g.size() : 1)));
  CHECK_CUDA(cudaMalloc(&d_u, sizeof(float) * (u.size() ? u.size() : 1)));
  CHECK_CUDA(cudaMalloc(&d_out, sizeof(int32_t) * (out_size ? out_size : 1)));
  CHECK_CUDA(cudaMemcpy(d_g, g.data(), sizeof(float) * g.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_u, u.data(), sizeof(float) * u.size(), cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start));
  CHECK_CUDA(dclens::vote::launch_topk_sign_vote(d_g, d_u, cs.teachers, cs.images, cs.dim,
                                                 cs.k, cs.c, stochastic, d_out, 0));
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaDeviceSynchronize());
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaMemcpy(got.data(), d_out, sizeof(int32_t) * out_size, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d_g));
  CHECK_CUDA(cudaFree(d_u));
  CHECK_CUDA(cudaFree(d_out));

  int64_t mismatches = 0, first = -1, total_abs = 0;
  for (int64_t i = 0; i < out_size; ++i) {
    if (got[i] != want[i]) {
      if (first < 0) first = i;
      ++mismatches;
    }
    total_abs += want[i] < 0 ? -want[i] : want[i];
  }
  std::printf("%-28s %-13s T=%-5lld B=%-3lld D=%-6lld k=%-6lld %8.3f ms  %s", cs.name.c_str(),
              stochastic ? "stochastic" : "deterministic", (long long)cs.teachers,
              (long long)cs.images, (long long)cs.dim, (long long)cs.k, ms,
              mismatches ? "MISMATCH" : "ok");
  if (mismatches) {
    std::printf(" (%lld of %lld differ; first at %lld: gpu %d host %d)", (long long)mismatches,
                (long long)out_size, (long long)first, got[first], want[first]);
  }
  std::printf("  sum|votes|=%lld\n", (long long)total_abs);
  return mismatches == 0;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to compare\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  const std::vector<Case> cases = {
      {"normal mnist", 200, 15, 784, 200, 1e-5f, 0},
      {"normal celeba", 40, 15, 12288, 700, 1e-5f, 0},
      {"ties", 100, 7, 784, 200, 2.0f, 1},
      {"ties k=1", 50, 5, 100, 1, 2.0f, 1},
      {"ties k=dim", 50, 5, 100, 100, 2.0f, 1},
      {"zeros + sparse", 60, 6, 784, 200, 1.5f, 2},
      {"beyond clip", 60, 6, 784, 200, 0.5f, 3},
      {"denormals", 60, 6, 784, 200, 1e-38f, 4},
      {"k=dim, dim=7", 9, 2, 7, 7, 1.0f, 0},
      {"large k (global ranks)", 3, 2, 9000, 7000, 2.0f, 1},
      {"k at shared limit", 3, 2, 9000, 5120, 2.0f, 1},
      {"many teachers", 4000, 15, 784, 200, 1e-5f, 0},
  };
  std::mt19937_64 rng(20240601);
  bool ok = true;
  for (const Case& cs : cases) {
    for (bool stochastic : {true, false}) ok = run_case(cs, stochastic, rng) && ok;
  }
  std::printf(ok ? "ALL EQUAL\n" : "SOME CASES DIFFER\n");
  return ok ? 0 : 1;
}
