// How the core runs work in parallel without knowing who owns the threads.
//
// The TF binding adapts TensorFlow's intra-op CPU thread pool; the pybind11 module
// uses ThreadExecutor below; XLA's custom call a pool of XLA's. The engine only promises
// that every index in [0, n) is visited exactly once, by disjoint [begin, end)
// blocks, and it never depends on the order or the number of blocks for its
// results (which is what makes the updates deterministic).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
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
  // The most blocks of one ParallelFor that may run at the same time, the calling
  // thread's included: the engine allocates per-block scratch for that many up front, so
  // that nothing allocates once writing has begun.
  virtual int64_t MaxConcurrentBlocks() const = 0;
};

// Most threads a std::thread executor starts for one call. More would only cost memory
// (each reserves a stack) and start-up time; callers asking for more get this many.
constexpr int kMaxThreads = 256;

// Runs fn(0) on the calling thread and fn(1) .. fn(count - 1) on new threads. Every thread
// is started before any fn runs, so when one cannot be started (a thread limit, no address
// space left for its stack) nothing has run: the started ones are released unrun and
// joined, and std::runtime_error says why (letting a joinable std::thread go out of scope
// would call std::terminate). An exception thrown by fn is rethrown here once every
// thread has finished.
template <typename Fn>
void RunOnThreads(int count, const Fn& fn) {
  if (count <= 1) {
    if (count == 1) fn(0);
    return;
  }
  enum class Gate { kWait, kGo, kCancel };
  Gate gate = Gate::kWait;
  std::mutex mu;
  std::condition_variable opened;
  std::exception_ptr error;
  auto run = [&](int t) {
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(count - 1);
  auto open_and_join = [&](Gate to) {
    {
      std::lock_guard<std::mutex> lock(mu);
      gate = to;
    }
    opened.notify_all();
    for (auto& t : threads) t.join();
  };
  try {
    for (int t = 1; t < count; ++t) {
      threads.emplace_back([&, t] {
        {
          std::unique_lock<std::mutex> lock(mu);
          opened.wait(lock, [&] { return gate != Gate::kWait; });
          if (gate == Gate::kCancel) return;
        }
        run(t);
      });
    }
  } catch (const std::exception& e) {
    const size_t started = threads.size();
    open_and_join(Gate::kCancel);
    throw std::runtime_error("could not start thread " + std::to_string(started + 2) + " of " +
                             std::to_string(count) + " (" + e.what() +
                             "); nothing was run: use fewer threads");
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    gate = Gate::kGo;
  }
  opened.notify_all();
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

// Runs fn over [0, n) cut into `blocks` equal pieces with the help of a thread pool:
// schedule(task) hands `task` to the pool (called `helpers` times). The calling thread claims
// pieces too and then waits only for pieces other threads are running, so a busy pool can
// neither stall nor deadlock it. The pool's tasks may start after this returns (when the
// caller ran every piece itself): they then find nothing left and exit.
template <typename Schedule>
void RunClaimingPieces(int64_t n, int64_t blocks, int64_t helpers, const Schedule& schedule,
                       const Executor::Block& fn) {
  if (n <= 0) return;
  blocks = std::max<int64_t>(1, std::min(blocks, n));
  if (blocks == 1) {
    fn(0, n);
    return;
  }
  struct Progress {
    std::atomic<int64_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    int64_t done = 0;
  };
  auto progress = std::make_shared<Progress>();
  const int64_t step = (n + blocks - 1) / blocks;
  blocks = (n + step - 1) / step;
  const Executor::Block* body = &fn;  // valid until every piece is done (the caller waits)
  auto claim_pieces = [progress, step, n, blocks, body] {
    for (;;) {
      const int64_t piece = progress->next.fetch_add(1);
      if (piece >= blocks) return;
      (*body)(piece * step, std::min(n, (piece + 1) * step));
      std::lock_guard<std::mutex> lock(progress->mu);
      if (++progress->done == blocks) progress->cv.notify_all();
    }
  };
  // Handing a task to the pool allocates: should that fail, the pieces not yet claimed are
  // the calling thread's, and no exception leaves while helpers run.
  try {
    for (int64_t t = 0; t < std::min(helpers, blocks - 1); ++t) schedule(claim_pieces);
  } catch (const std::exception&) {
  }
  claim_pieces();
  std::unique_lock<std::mutex> lock(progress->mu);
  progress->cv.wait(lock, [&] { return progress->done == blocks; });
}

// Plain std::thread fan-out for callers without a pool (the pybind11 module), at most
// kMaxThreads threads.
class ThreadExecutor final : public Executor {
 public:
  explicit ThreadExecutor(int num_threads)
      : num_threads_(std::clamp(num_threads, 1, kMaxThreads)) {}

  int64_t MaxConcurrentBlocks() const override { return num_threads_; }

  void ParallelFor(int64_t n, int64_t cost_per_unit, const Block& fn) override {
    if (n <= 0) return;
    // Below ~50k cycles of work a thread costs more than it saves.
    const int64_t min_units = std::max<int64_t>(1, 50000 / std::max<int64_t>(1, cost_per_unit));
    const int64_t blocks =
        std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / min_units));
    const int64_t step = (n + blocks - 1) / blocks;
    RunOnThreads(static_cast<int>((n + step - 1) / step), [&](int t) {
      const int64_t begin = t * step;
      fn(begin, std::min(n, begin + step));
    });
  }

 private:
  int num_threads_;
};

}  // namespace fusedopt
