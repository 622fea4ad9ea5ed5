// Probe behind cc/core/cache_alias.h: an Adam-like update over var, m, v (read and
// written) and g (read), placed `stride` bytes apart plus a per-buffer offset, in one
// anonymous mapping. On AMD Zen, buffers agreeing modulo 2^28 make the loop several times
// slower (BENCHMARKS.md, "Buffers the L1 cannot hold together").
//
//   g++ -O3 -fno-math-errno -o /tmp/probe benchmarks/experiments/cache_alias_probe.cc
//   /tmp/probe N STRIDE OFFSET_M OFFSET_V OFFSET_G   (elements; bytes; offsets nondecreasing)
//   /tmp/probe 134217728 536870912 0 0 0             # all four aliased
//   /tmp/probe 134217728 536870912 4096 8192 12288   # 4 KB apart modulo 2^28
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

__attribute__((target("avx2"), noinline)) void Update(float* __restrict var, float* __restrict m,
                                                      float* __restrict v,
                                                      const float* __restrict g, long n) {
  for (long i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] + (gi - m[i]) * 0.1f;
    const float vi = v[i] + (gi * gi - v[i]) * 0.001f;
    m[i] = mi;
    v[i] = vi;
    var[i] -= 1e-3f * mi / (std::sqrt(vi) + 1e-7f);
  }
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s N STRIDE OFFSET_M OFFSET_V OFFSET_G\n", argv[0]);
    return 2;
  }
  const long n = std::atol(argv[1]), stride = std::atol(argv[2]);
  const long offset[4] = {0, std::atol(argv[3]), std::atol(argv[4]), std::atol(argv[5])};
  if (stride < n * 4 || offset[1] < 0 || offset[2] < offset[1] || offset[3] < offset[2]) {
    std::fprintf(stderr, "need STRIDE >= 4 N and 0 <= offsets, nondecreasing\n");
    return 2;
  }
  const long bytes = 3 * stride + offset[3] + n * 4;
  char* base = static_cast<char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED) return 1;
  float* b[4];
  for (int k = 0; k < 4; ++k) {
    b[k] = reinterpret_cast<float*>(base + k * stride + offset[k]);
    for (long i = 0; i < n; ++i) b[k][i] = 0.01f * (k + 1);
  }
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Update(b[0], b[1], b[2], b[3], n);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = ms < best ? ms : best;
  }
  std::printf("n %ld stride %ld offsets %ld %ld %ld: best of 5 %.1f ms\n", n, stride, offset[1],
              offset[2], offset[3], best);
  return 0;
}
