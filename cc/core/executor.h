// How the core runs work in parallel without knowing who owns the threads.
//
// The TF binding adapts TensorFlow's intra-op CPU thread pool; the pybind11 module
// uses ThreadExecutor below; tests use SerialExecutor. The engine only promises
// that every index in [0, n) is visited exactly once, by disjoint [begin, end)
// blocks, and it never depends on the order or the number of blocks for its
// results (which is what makes the updates deterministic).
#ifndef FUSEDOPT_CC_CORE_EXECUTOR_H_
#define FUSEDOPT_CC_CORE_EXECUTOR_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace fusedopt {

class Executor {
 public:
  using Block = std::function<void(int64_t begin, int64_t end)>;
  virtual ~Executor() = default;
  // Calls fn on disjoint blocks covering [0, n); `cost_per_unit` is a rough cost
  // of one unit in cycles, so small jobs stay on the calling thread.
  virtual void ParallelFor(int64_t n, int64_t cost_per_unit, const Block& fn) = 0;
};

class SerialExecutor final : public Executor {
 public:
  void ParallelFor(int64_t n, int64_t, const Block& fn) override {
    if (n > 0) fn(0, n);
  }
};

// Plain std::thread fan-out for callers without a pool (the pybind11 module).
class ThreadExecutor final : public Executor {
 public:
  explicit ThreadExecutor(int num_threads) : num_threads_(std::max(1, num_threads)) {}

  void ParallelFor(int64_t n, int64_t cost_per_unit, const Block& fn) override {
    if (n <= 0) return;
    // Below ~50k cycles of work a thread costs more than it saves.
    const int64_t min_units = std::max<int64_t>(1, 50000 / std::max<int64_t>(1, cost_per_unit));
    const int64_t blocks =
        std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / min_units));
    if (blocks <= 1) {
      fn(0, n);
      return;
    }
    const int64_t step = (n + blocks - 1) / blocks;
    std::vector<std::thread> workers;
    for (int64_t begin = step; begin < n; begin += step) {
      workers.emplace_back(fn, begin, std::min(n, begin + step));
    }
    fn(0, std::min(n, step));
    for (auto& w : workers) w.join();
  }

 private:
  int num_threads_;
};

}  // namespace fusedopt

#endif  // FUSEDOPT_CC_CORE_EXECUTOR_H_
