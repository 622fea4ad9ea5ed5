// TF's intra-op CPU thread pool as a core Executor, for the CPU kernels and their
// variable copies (variable_access.h).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "cc/core/executor.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace fusedopt {
namespace tf {

// TF's intra-op CPU thread pool as a core Executor.
//
// Large jobs (memory-bound streams) get one contiguous piece per pool thread, claimed by
// the pool and the calling thread (RunClaimingPieces): each thread streams one range.
// Shard's cost model cuts them into many blocks and runs the calling thread beside every
// pool thread, one thread more than the pool (and, with the pool sized to the cores, than
// the cores); measured 8-15 % slower on a 16M-parameter dense step.
class TfCpuExecutor final : public Executor {
 public:
  explicit TfCpuExecutor(::tensorflow::OpKernelContext* ctx)
      : workers_(ctx->device()->tensorflow_cpu_worker_threads()) {}
  // The pool's threads and the calling thread (Shard and RunClaimingPieces alike).
  int64_t MaxConcurrentBlocks() const override { return workers_->num_threads + 1; }

  void ParallelFor(int64_t n, int64_t cost_per_unit, const Block& fn) override {
    const int64_t threads = workers_->num_threads;
    if (threads < 2 || n < threads || n * cost_per_unit < kStaticSplitCycles) {
      ::tensorflow::Shard(workers_->num_threads, workers_->workers, n, cost_per_unit, fn);
      return;
    }
    RunClaimingPieces(
        n, threads, threads - 1,
        [this](std::function<void()> task) { workers_->workers->Schedule(std::move(task)); },
        fn);
  }

 private:
  // Below this much work (cycles) Shard decides, small jobs staying on the calling thread.
  static constexpr int64_t kStaticSplitCycles = int64_t{1} << 24;
  const ::tensorflow::DeviceBase::CpuWorkerThreads* workers_;
};

}  // namespace tf
}  // namespace fusedopt
