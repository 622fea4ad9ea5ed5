// STREAM-style probes of the memory bandwidth this machine sustains, for the
// benchmark's "% of the limit" figure. They run on plain threads, each over its own
// contiguous slice that the same thread initialised (first touch), and report the
// best of several repeats, as STREAM does.
//
// Bytes are counted as the bytes that actually cross the memory bus. That is why
// copy and triad use non-temporal stores: an ordinary store to a line not in cache
// first reads it (write-allocate), moving a word STREAM's convention does not count
// and making a copy look slower than the hardware is. "update" is a read-modify-write
// (a += s * b): its stores hit lines it has just read, so it needs no special stores.
// "update3" (a, b, c += s * d) has exactly the traffic of a dense Adam step (read four
// arrays, write three) with no math: the roofline for that access pattern. With one
// or two threads it reads higher than copy/triad, because a core's bandwidth is bounded
// by the misses it keeps in flight, and more streams keep more in flight.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc/core/executor.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fusedopt {
namespace bandwidth {

// 4 TiB per array: far beyond any machine, small enough that byte counts cannot overflow.
constexpr int64_t kMaxElements = int64_t{1} << 40;

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], AlignedFree>;

inline Buffer Allocate(int64_t n) {
  const size_t bytes = ((static_cast<size_t>(n) * sizeof(float) + 63) / 64) * 64;
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw std::runtime_error("out of memory for the bandwidth probe");
  return Buffer(p);
}

// dst[i] = value, with non-temporal stores where available. n is a multiple of 16
// and dst 64-byte aligned (the slicing below guarantees both).
inline void StreamStore(float* dst, const float* a, const float* b, float s, int64_t n) {
#if defined(__SSE2__)
  const __m128 scale = _mm_set1_ps(s);
  for (int64_t i = 0; i < n; i += 4) {
    __m128 x = _mm_load_ps(a + i);
    if (b != nullptr) x = _mm_add_ps(x, _mm_mul_ps(scale, _mm_load_ps(b + i)));
    _mm_stream_ps(dst + i, x);
  }
  _mm_sfence();
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = b != nullptr ? a[i] + s * b[i] : a[i];
#endif
}

// Runs fn(begin, end) on num_threads threads over 16-element-aligned slices of [0, n).
template <typename Fn>
void OnThreads(int64_t n, int num_threads, const Fn& fn) {
  const int64_t per = ((n / num_threads + 15) / 16) * 16;
  RunOnThreads(num_threads, [&](int t) { fn(std::min(n, t * per), std::min(n, (t + 1) * per)); });
}

// Best GB/s over `repeats` runs of `kernel` ("copy", "triad" or "update") on arrays
// of n floats each.
inline double Measure(const std::string& kernel, int64_t n, int num_threads, int repeats) {
  if (kernel != "copy" && kernel != "triad" && kernel != "update" && kernel != "update3") {
    throw std::invalid_argument("kernel must be copy, triad, update or update3, got " + kernel);
  }
  if (num_threads < 1 || num_threads > kMaxThreads || n < int64_t{16} * num_threads ||
      n > kMaxElements || repeats < 1) {
    throw std::invalid_argument("need 1 <= num_threads <= " + std::to_string(kMaxThreads) +
                                ", 16 * num_threads <= n <= 2^40, repeats >= 1");
  }
  n = (n / 16) * 16;
  const bool four = kernel == "update3";
  Buffer a = Allocate(n), b = Allocate(n), c = Allocate(n), d = Allocate(four ? n : 16);
  float *pa = a.get(), *pb = b.get(), *pc = c.get(), *pd = d.get();
  OnThreads(n, num_threads, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pa[i] = 1.0f;
      pb[i] = 2.0f;
      pc[i] = 0.0f;
      if (four) pd[i] = 0.5f;
    }
  });
  // Words per element crossing the bus: copy reads a, writes c; triad and update read
  // two and write one; update3 reads four and writes three.
  const double words = kernel == "copy" ? 2 : four ? 7 : 3;
  double best = 0;
  for (int r = 0; r <= repeats; ++r) {  // r == 0 warms up
    const auto start = std::chrono::steady_clock::now();
    OnThreads(n, num_threads, [=, &kernel](int64_t begin, int64_t end) {
      const int64_t len = end - begin;
      if (kernel == "copy") {
        StreamStore(pc + begin, pa + begin, nullptr, 0.0f, len);
      } else if (kernel == "triad") {
        StreamStore(pc + begin, pa + begin, pb + begin, 3.0f, len);
      } else if (kernel == "update") {
        float* __restrict x = pa + begin;
        const float* __restrict y = pb + begin;
        for (int64_t i = 0; i < len; ++i) x[i] += 1e-3f * y[i];
      } else {
        float* __restrict x = pa + begin;
        float* __restrict y = pb + begin;
        float* __restrict z = pc + begin;
        const float* __restrict g = pd + begin;
        for (int64_t i = 0; i < len; ++i) {
          x[i] += 1e-3f * g[i];
          y[i] += 1e-3f * g[i];
          z[i] += 1e-3f * g[i];
        }
      }
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) best = std::max(best, words * sizeof(float) * n / seconds / 1e9);
  }
  return best;
}

}  // namespace bandwidth
}  // namespace fusedopt
