// Where a sparse step's time goes, without TensorFlow: the engine's grouping alone (on one
// thread, and split over two by row), the whole step (cc/core/engine.h ApplySparse) on three kinds of thread pool, and the floor
// probe (cc/pybind/sparse_floor.h) on the same ids, in one process, alternating rounds.
//
//   g++ -std=c++20 -O3 -fno-math-errno -pthread -I. -o /tmp/phases benchmarks/experiments/sparse_phases.cc
//   /tmp/phases [rows] [ids] [rounds]        (default 1000000 16384 3; row width 64)
//
// The pools: "started" starts its threads at every step and joins them (as fusedopt._core's
// ThreadExecutor does); "sleeping" keeps them, blocked on a condition variable between
// steps (as TensorFlow's pool does once idle); "spinning" keeps them running between steps
// (as the floor probe's threads wait at its barrier). The gap between them is the cost of
// handing work to another core on this machine, which the floor does not pay.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/rules/all_rules.h"
#include "cc/pybind/sparse_floor.h"

namespace {

using fusedopt::Executor;
using Clock = std::chrono::steady_clock;

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Threads kept between steps; each ParallelFor cuts [0, n) into one piece per thread, which
// the threads (the caller included) claim; it returns once every thread has left the job,
// so none is still claiming when the next one starts. Spinning: idle threads yield in a
// loop; else they block on a condition variable until the next job.
class KeptThreads final : public Executor {
 public:
  KeptThreads(int threads, bool spinning) : threads_(threads), spinning_(spinning) {
    for (int t = 1; t < threads_; ++t) workers_.emplace_back([this] { Work(); });
  }
  ~KeptThreads() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++job_;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int64_t MaxConcurrentBlocks() const override { return threads_; }

  void ParallelFor(int64_t n, int64_t, const Block& fn) override {
    fn_ = &fn;
    total_ = n;
    next_ = 0;
    left_ = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++job_;
    }
    if (!spinning_) wake_.notify_all();
    Claim();
    while (left_.load() < threads_) std::this_thread::yield();
  }

 private:
  void Claim() {
    const int64_t step = (total_ + threads_ - 1) / threads_;
    for (int64_t piece = next_.fetch_add(1); piece < threads_; piece = next_.fetch_add(1)) {
      const int64_t begin = piece * step;
      if (begin < total_) (*fn_)(begin, std::min(total_, begin + step));
    }
    left_.fetch_add(1);
  }
  void Work() {
    int64_t seen = 0;
    for (;;) {
      if (spinning_) {
        while (job_.load() == seen) std::this_thread::yield();
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return job_.load() != seen; });
      }
      seen = job_.load();
      if (stop_) return;
      Claim();
    }
  }
  const int threads_;
  const bool spinning_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<int64_t> job_{0}, next_{0}, left_{0};
  std::atomic<bool> stop_{false};
  const Block* fn_ = nullptr;
  int64_t total_ = 0;
};

// The grouping split over threads by row: thread t scans every id, keeps those whose row
// hashes to t (a hot row's ids all land on one thread) and groups them with a Coalescer
// of its own; positions are mapped back through the kept ids' list. A row belongs to one
// thread, so the groups are those of one Coalescer on all the ids, in another order,
// which the update's bits do not depend on (each row is updated once, from its group's
// gradient rows in ascending positions).
class SplitGrouping {
 public:
  explicit SplitGrouping(int threads) : parts_(threads) {}
  int Threads() const { return static_cast<int>(parts_.size()); }
  static int PartOf(int64_t row, int threads) {
    return static_cast<int>(((static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> 32) %
                            static_cast<uint64_t>(threads));
  }
  void Group(const int64_t* ids, int64_t n, int64_t rows, Executor& executor) {
    executor.ParallelFor(Threads(), 1 << 30, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        Part& part = parts_[t];
        part.kept.clear();
        part.where.clear();
        for (int64_t i = 0; i < n; ++i) {
          if (PartOf(ids[i], Threads()) == t) {
            part.kept.push_back(ids[i]);
            part.where.push_back(i);
          }
        }
        part.groups = part.coalescer.Group(part.kept.data(), static_cast<int64_t>(part.kept.size()),
                                           rows, &part.error);
      }
    });
  }
  // Every group as (row, its positions in the whole batch, ascending), sorted by row.
  std::vector<std::vector<int64_t>> Canonical() const {
    std::vector<std::vector<int64_t>> out;
    for (const Part& part : parts_) {
      if (part.groups == nullptr) continue;
      AppendCanonical(*part.groups, part.where.data(), &out);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  static void AppendCanonical(const fusedopt::RowGroups& groups, const int64_t* where,
                              std::vector<std::vector<int64_t>>* out) {
    for (int64_t g = 0; g < groups.size(); ++g) {
      std::vector<int64_t> group{groups.rows[g]};
      for (int64_t j = groups.offsets[g]; j < groups.offsets[g + 1]; ++j) {
        const int64_t local = groups.all_unique() ? j : groups.positions[j];
        group.push_back(where == nullptr ? local : where[local]);
      }
      out->push_back(std::move(group));
    }
  }

 private:
  struct Part {
    fusedopt::Coalescer coalescer;
    std::vector<int64_t> kept, where;
    const fusedopt::RowGroups* groups = nullptr;
    std::string error;
  };
  std::vector<Part> parts_;
};

// Zipf(1.1) ids over [0, rows), as the benchmark draws them (numpy's zipf(1.1) - 1, taken
// modulo rows, is within rounding of this truncated inverse CDF for the hot ids).
std::vector<std::vector<int64_t>> ZipfBatches(int64_t rows, int64_t ids, int count) {
  std::vector<double> cdf(static_cast<size_t>(rows));
  double total = 0;
  for (int64_t k = 0; k < rows; ++k) cdf[k] = total += 1.0 / std::pow(k + 1.0, 1.1);
  std::mt19937_64 rng(0);
  std::uniform_real_distribution<double> draw(0, total);
  std::vector<std::vector<int64_t>> batches(count, std::vector<int64_t>(ids));
  for (auto& batch : batches) {
    for (auto& id : batch) id = std::lower_bound(cdf.begin(), cdf.end(), draw(rng)) - cdf.begin();
  }
  return batches;
}

template <typename Rule>
void Measure(const char* name, int64_t rows, int64_t ids, int rounds) {
  constexpr int64_t kDim = 64;
  constexpr int kBatches = 8, kSteps = 200;
  const auto batches = ZipfBatches(rows, ids, kBatches);
  std::vector<float> grad(ids * kDim, 0.01f), var(rows * kDim, 0.1f);
  std::vector<std::vector<float>> slots;
  int element_slots = 0, row_slots = 0;
  for (int k = 0; k < fusedopt::NumSlots<Rule>(); ++k) {
    const bool per_row = fusedopt::IsPerRowSlot<Rule>(k);
    (per_row ? row_slots : element_slots)++;
    slots.emplace_back(per_row ? rows : rows * kDim, 0.1f);
  }
  std::vector<float*> slot_ptrs;
  for (auto& s : slots) slot_ptrs.push_back(s.data());
  // Every hyper-parameter any rule reads, in one array: each rule takes its own by index.
  const float hyper[] = {0.9f, 0.999f, 1e-3f, 0.9f, 0.999f, 1e-7f, 0.9f, 0.5f};
  const float* hyper_ptrs[8];
  for (int i = 0; i < 8; ++i) hyper_ptrs[i] = &hyper[i];
  const bool options[4] = {false, false, false, false};
  const auto params = fusedopt::PrepareParams<Rule, float>(hyper_ptrs, options);
  fusedopt::ThreadExecutor started(2);
  KeptThreads sleeping(2, false), spinning(2, true);
  auto steps = [&](Executor& executor) {
    const auto start = Clock::now();
    for (int k = 0; k < kSteps; ++k) {
      fusedopt::ApplySparse<Rule, float, int64_t, float>(params, var.data(), slot_ptrs.data(),
                                                         rows, kDim, grad.data(),
                                                         batches[k % kBatches].data(), ids,
                                                         executor);
    }
    return MillisecondsSince(start) / kSteps;
  };
  steps(started);  // pages touched, huge pages advised: give the collapse a moment
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::vector<fusedopt::sparse_floor::Batch> floor_batches;
  for (const auto& b : batches) floor_batches.push_back({b.data(), ids});
  SplitGrouping split(2);
  {  // the split grouping makes the same groups as one Coalescer (else its time means nothing)
    fusedopt::Coalescer whole;
    std::string error;
    std::vector<std::vector<int64_t>> expected;
    SplitGrouping::AppendCanonical(*whole.Group(batches[0].data(), ids, rows, &error), nullptr,
                                   &expected);
    std::sort(expected.begin(), expected.end());
    split.Group(batches[0].data(), ids, rows, spinning);
    if (split.Canonical() != expected) {
      std::fprintf(stderr, "%s: the grouping split over threads differs from one thread's\n",
                   name);
      std::exit(1);
    }
  }
  for (int round = 0; round < rounds; ++round) {
    fusedopt::Coalescer coalescer;
    std::string error;
    auto start = Clock::now();
    for (int k = 0; k < kSteps; ++k) coalescer.Group(batches[k % kBatches].data(), ids, rows, &error);
    const double group_ms = MillisecondsSince(start) / kSteps;
    start = Clock::now();
    for (int k = 0; k < kSteps; ++k) split.Group(batches[k % kBatches].data(), ids, rows, spinning);
    const double split_group_ms = MillisecondsSince(start) / kSteps;
    const double started_ms = steps(started), sleeping_ms = steps(sleeping);
    const double spinning_ms = steps(spinning);
    const auto floor = fusedopt::sparse_floor::Measure(floor_batches, rows, kDim, element_slots,
                                                       row_slots, 2, 10);
    std::printf("%s round %d: grouping %.3f ms, split over 2 spinning threads %.3f ms; step "
                "with threads started %.3f, sleeping %.3f, spinning %.3f ms; floor %.3f ms "
                "(group %.3f, rows %.3f)\n",
                name, round + 1, group_ms, split_group_ms, started_ms, sleeping_ms,
                spinning_ms, floor.group_ms + floor.rows_ms, floor.group_ms, floor.rows_ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const int64_t ids = argc > 2 ? std::atoll(argv[2]) : 16384;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  if (rows < 1 || ids < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: %s [rows >= 1] [ids >= 1] [rounds >= 1]\n", argv[0]);
    return 2;
  }
  Measure<fusedopt::RowWiseAdagradRule>("row_wise_adagrad", rows, ids, rounds);
  Measure<fusedopt::LazyAdamRule>("lazy_adam", rows, ids, rounds);
  Measure<fusedopt::PartialRowWiseAdamRule>("partial_row_wise_adam", rows, ids, rounds);
  Measure<fusedopt::AdagradRule>("adagrad", rows, ids, rounds);
  return 0;
}
