// Probe behind the table-size aim (BENCHMARKS.md, "A quiet run of every scenario"): the
// sparse engine's memory pattern without TensorFlow. An Adam-like update of 16,384 distinct
// random rows of 64 floats in var, m and v ([rows, 64] each), two threads, each row
// prefetched `distance` rows ahead as the engine does (0: none), rows visited in random or
// ascending order, the buffers on 4 KB pages or collapsed to 2 MB pages (MADV_COLLAPSE).
// Prints the median and 10th-percentile step of 200 steps over 16 cycled batches, and the
// process's AnonHugePages (what the kernel actually gave).
//
//   g++ -O2 -mavx2 -pthread -o /tmp/rows benchmarks/experiments/table_rows_probe.cc
//   /tmp/rows ROWS HUGE DISTANCE [sorted]       e.g. /tmp/rows 10000000 1 8
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr int kDim = 64;
constexpr int kIds = 16384;
constexpr int kThreads = 2;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr int kCollapse = 25;  // MADV_COLLAPSE (Linux 6.1)

float* Table(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  char* a = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) &
                                    ~uintptr_t{kHugePage - 1});
  madvise(a, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(a, 0, bytes);  // touched first, as a TF variable is by its initializer
  if (huge) madvise(a, bytes, kCollapse);
  return reinterpret_cast<float*>(a);
}

long AnonHugePagesMb() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "AnonHugePages:", 14) == 0) kb = std::atol(line + 14);
  }
  std::fclose(f);
  return kb / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ROWS HUGE(0|1) DISTANCE [sorted]\n", argv[0]);
    return 2;
  }
  const long rows = std::atol(argv[1]);
  const bool huge = std::atoi(argv[2]) != 0;
  const long distance = std::atol(argv[3]);
  const bool sorted = argc > 4 && std::strcmp(argv[4], "sorted") == 0;
  const size_t bytes = static_cast<size_t>(rows) * kDim * sizeof(float);
  float* var = Table(bytes, huge);
  float* m = Table(bytes, huge);
  float* v = Table(bytes, huge);
  std::vector<float> grad(static_cast<size_t>(kIds) * kDim, 0.5f);
  std::mt19937_64 rng(1);
  std::vector<std::vector<long>> batches(16);
  for (auto& batch : batches) {
    for (int i = 0; i < kIds; ++i) batch.push_back(static_cast<long>(rng() % rows));
    std::sort(batch.begin(), batch.end());
    batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
    if (!sorted) std::shuffle(batch.begin(), batch.end(), rng);
  }
  auto update = [&](const std::vector<long>& batch, int t) {
    const long n = static_cast<long>(batch.size());
    const long begin = n * t / kThreads, end = n * (t + 1) / kThreads;
    for (long r = begin; r < end; ++r) {
      if (distance > 0 && r + distance < end) {
        const long ahead = batch[r + distance] * kDim;
        for (int b = 0; b < kDim * 4; b += 64) {
          __builtin_prefetch(reinterpret_cast<char*>(var + ahead) + b, 1);
          __builtin_prefetch(reinterpret_cast<char*>(m + ahead) + b, 1);
          __builtin_prefetch(reinterpret_cast<char*>(v + ahead) + b, 1);
        }
      }
      const long o = batch[r] * kDim;
      const float* g = grad.data() + (r % kIds) * kDim;
      for (int i = 0; i < kDim; ++i) {
        const float mi = m[o + i] = 0.9f * m[o + i] + 0.1f * g[i];
        const float vi = v[o + i] = 0.999f * v[o + i] + 0.001f * g[i] * g[i];
        var[o + i] -= 1e-3f * mi / (std::sqrt(vi) + 1e-7f);
      }
    }
  };
  std::vector<double> ms;
  for (int step = 0; step < 200; ++step) {
    const auto& batch = batches[step % batches.size()];
    const auto start = std::chrono::steady_clock::now();
    std::thread helper(update, std::cref(batch), 1);
    update(batch, 0);
    helper.join();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("rows %ld huge %d distance %ld %s: median %.3f ms p10 %.3f ms anon_huge_pages %ld MB\n",
              rows, huge ? 1 : 0, distance, sorted ? "sorted" : "random", ms[ms.size() / 2],
              ms[ms.size() / 10], AnonHugePagesMb());
  return 0;
}
