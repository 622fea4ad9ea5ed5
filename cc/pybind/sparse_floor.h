// The floor of a sparse step: what the least work a sparse update must do costs on this
// machine, measured without fusedopt's engine, so the benchmark can report each sparse
// step as "x the floor" (issue 33). Two stages, each the best of `repeats`:
//   group  one thread turns the batch's ids into distinct rows with their gradient rows
//          summed (an open-addressing hash keyed by id, sums accumulated in place, rows in
//          order of first appearance): one pass over the ids and the gradient.
//   rows   `num_threads` threads read, update and write exactly the distinct rows of var
//          and each slot (var -= a*sum, slot = b*slot + c*sum: one multiply-add per value,
//          no sqrt or division), a contiguous share of the rows each, every row
//          prefetched a few rows ahead; per-row slots (one value per row) likewise.
// The tables are the probe's own ([num_rows, row_size] float32 each), on 2 MB pages where
// the kernel grants them (MADV_HUGEPAGE, then MADV_COLLAPSE), and touched before timing.
// Footprint() counts every buffer Measure allocates, so that the caller can refuse a call
// that would not fit before anything is allocated. No other check beyond what the probe
// needs to stay in bounds: it is a measuring stick.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cc/core/executor.h"

namespace fusedopt {
namespace sparse_floor {

struct Batch {
  const int64_t* ids;
  int64_t n;
};

struct Result {
  double group_ms = 0;  // best over repeats (and batches: the mean of a batch cycle)
  double rows_ms = 0;
  int64_t distinct_rows = 0;  // of the first batch
};

// An anonymous mapping on 2 MB boundaries, advised and collapsed to huge pages.
class Table {
 public:
  explicit Table(int64_t floats) : bytes_(static_cast<size_t>(floats) * sizeof(float)) {
    const size_t huge = size_t{2} << 20;
    mapped_ = bytes_ + huge;
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("sparse_floor: cannot map the probe's tables");
    base_ = p;
    data_ = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1));
    madvise(data_, bytes_, MADV_HUGEPAGE);
    std::fill(data_, data_ + floats, 0.5f);  // touched first, as a variable's initializer does
    madvise(data_, bytes_, 25);               // MADV_COLLAPSE (Linux 6.1; ignored before)
  }
  ~Table() { munmap(base_, mapped_); }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  float* data() const { return data_; }

 private:
  size_t bytes_, mapped_;
  void* base_;
  float* data_;
};

// Slots of the grouping's hash table for a batch of n ids: a power of two, at least 16 and 2n.
inline double HashCapacity(double n) {
  double capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  return capacity;
}

// Stage 1: distinct rows (first appearance) and their summed gradient rows.
class Grouper {
 public:
  void Run(const Batch& batch, const float* grad, int64_t row_size) {
    const auto capacity = static_cast<int64_t>(HashCapacity(static_cast<double>(batch.n)));
    const int shift = 64 - __builtin_ctzll(static_cast<uint64_t>(capacity));
    if (static_cast<int64_t>(keys_.size()) != capacity) {
      keys_.assign(capacity, -1);
      slot_group_.resize(capacity);
    }
    const uint64_t mask = static_cast<uint64_t>(capacity - 1);
    rows.clear();
    used_.clear();
    rows.reserve(static_cast<size_t>(batch.n));  // the sizes Footprint counts
    used_.reserve(static_cast<size_t>(batch.n));
    sums.resize(static_cast<size_t>(batch.n * row_size));
    for (int64_t i = 0; i < batch.n; ++i) {
      const int64_t id = batch.ids[i];
      uint64_t s = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift;
      while (keys_[s] != -1 && keys_[s] != id) s = (s + 1) & mask;
      const float* g = grad + i * row_size;
      if (keys_[s] == -1) {
        keys_[s] = id;
        slot_group_[s] = static_cast<int64_t>(rows.size());
        used_.push_back(s);
        float* out = sums.data() + rows.size() * row_size;
        std::memcpy(out, g, static_cast<size_t>(row_size) * sizeof(float));
        rows.push_back(id);
      } else {
        float* out = sums.data() + slot_group_[s] * row_size;
        for (int64_t j = 0; j < row_size; ++j) out[j] += g[j];
      }
    }
    for (const uint64_t s : used_) keys_[s] = -1;
  }

  std::vector<int64_t> rows;
  std::vector<float> sums;

 private:
  std::vector<int64_t> keys_, slot_group_;
  std::vector<uint64_t> used_;
};

// Stage 2 on rows [first, last): var and every per-element slot row updated from the sum.
inline void UpdateRows(const std::vector<int64_t>& rows, const float* sums, int64_t first,
                       int64_t last, int64_t row_size, float* const* element_tables,
                       int element_count, float* const* row_tables, int row_count) {
  constexpr int64_t kAhead = 8;
  auto prefetch = [&](int64_t r) {
    for (int t = 0; t < element_count; ++t) {
      const char* p = reinterpret_cast<const char*>(element_tables[t] + r * row_size);
      for (int64_t b = 0; b < row_size * 4; b += 64) __builtin_prefetch(p + b, 1);
    }
    for (int t = 0; t < row_count; ++t) __builtin_prefetch(row_tables[t] + r, 1);
  };
  for (int64_t g = first; g < std::min(last, first + kAhead); ++g) prefetch(rows[g]);
  for (int64_t g = first; g < last; ++g) {
    if (g + kAhead < last) prefetch(rows[g + kAhead]);
    const float* sum = sums + g * row_size;
    float* __restrict var = element_tables[0] + rows[g] * row_size;
    for (int64_t j = 0; j < row_size; ++j) var[j] -= 0.001f * sum[j];
    for (int t = 1; t < element_count; ++t) {
      float* __restrict slot = element_tables[t] + rows[g] * row_size;
      for (int64_t j = 0; j < row_size; ++j) slot[j] = 0.9f * slot[j] + 0.1f * sum[j];
    }
    for (int t = 0; t < row_count; ++t) {
      float& value = row_tables[t][rows[g]];
      value = 0.9f * value + 0.1f * sum[0];
    }
  }
}

// The bytes Measure allocates and touches for batches of these sizes: the tables, the
// gradient (as long as the longest batch), the ids as int64 (the caller's array or its copy)
// and each batch's grouping (summed rows; distinct rows and used slots, n each at most; the
// hash table's keys and groups). Doubles: sizes beyond int64 are counted, not wrapped.
struct Footprint {
  double tables = 0, gradient = 0, ids = 0, grouping = 0;
  double Total() const { return tables + gradient + ids + grouping; }
};

inline Footprint BytesNeeded(const std::vector<int64_t>& batch_sizes, int64_t num_rows,
                             int64_t row_size, int element_slots, int row_slots) {
  const double width = static_cast<double>(row_size);
  Footprint f;
  f.tables = 4.0 * static_cast<double>(num_rows) * ((1 + element_slots) * width + row_slots);
  double most = 0;
  for (const int64_t size : batch_sizes) {
    const double n = static_cast<double>(size);
    most = std::max(most, n);
    f.ids += 8.0 * n;
    f.grouping += 4.0 * n * width + 2 * 8.0 * n + 2 * 8.0 * HashCapacity(n);
  }
  f.gradient = 4.0 * most * width;
  return f;
}

inline double Milliseconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// batches: ids in [0, num_rows) (the caller checks); element_slots / row_slots: how many
// [num_rows, row_size] / [num_rows] slot tables the rule keeps beside var.
inline Result Measure(const std::vector<Batch>& batches, int64_t num_rows, int64_t row_size,
                      int element_slots, int row_slots, int num_threads, int repeats) {
  std::vector<std::unique_ptr<Table>> tables;
  std::vector<float*> element_tables, row_tables;
  for (int t = 0; t <= element_slots; ++t) {
    tables.push_back(std::make_unique<Table>(num_rows * row_size));
    element_tables.push_back(tables.back()->data());
  }
  for (int t = 0; t < row_slots; ++t) {
    tables.push_back(std::make_unique<Table>(num_rows));
    row_tables.push_back(tables.back()->data());
  }
  int64_t most = 0;
  for (const Batch& b : batches) most = std::max(most, b.n);
  std::vector<float> grad(static_cast<size_t>(most * row_size));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.01f * static_cast<float>(i % 13);

  std::vector<Grouper> groupers(batches.size());
  // Sized here, outside the threads: no allocation (nor bad_alloc) while they run.
  for (size_t b = 0; b < batches.size(); ++b) groupers[b].Run(batches[b], grad.data(), row_size);
  Result result;
  result.group_ms = result.rows_ms = 1e300;
  // The threads live for the whole measurement and meet at a spinning barrier, so no
  // thread start or futex wake-up is timed (the engines' pools keep their threads too).
  // A waiting thread spins kSpinsBeforeYield checks, then yields its core at every check:
  // with a core per thread it never sleeps; with more threads than cores the ones still
  // working get the cores, instead of waiting out the time slices of spinning ones.
  constexpr int kSpinsBeforeYield = 1 << 12;
  std::atomic<int64_t> arrived{0};
  auto barrier = [&](int64_t& generation) {
    ++generation;
    arrived.fetch_add(1);
    int spins = 0;
    while (arrived.load() < generation * num_threads) {
      if (spins < kSpinsBeforeYield) {
        ++spins;
      } else {
        std::this_thread::yield();
      }
    }
  };
  RunOnThreads(num_threads, [&](int t) {
    int64_t generation = 0;
    for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up (untimed)
      double group_ms = 0, rows_ms = 0;
      for (size_t b = 0; b < batches.size(); ++b) {
        auto t0 = std::chrono::steady_clock::now();
        if (t == 0) {
          groupers[b].Run(batches[b], grad.data(), row_size);
          group_ms += Milliseconds(t0);
          t0 = std::chrono::steady_clock::now();
        }
        barrier(generation);  // the groups are ready
        const Grouper& g = groupers[b];
        const int64_t distinct = static_cast<int64_t>(g.rows.size());
        UpdateRows(g.rows, g.sums.data(), distinct * t / num_threads,
                   distinct * (t + 1) / num_threads, row_size, element_tables.data(),
                   static_cast<int>(element_tables.size()), row_tables.data(),
                   static_cast<int>(row_tables.size()));
        barrier(generation);  // every share written
        if (t == 0) rows_ms += Milliseconds(t0);
      }
      if (t != 0 || r == 0) continue;
      const double count = static_cast<double>(batches.size());
      result.group_ms = std::min(result.group_ms, group_ms / count);
      result.rows_ms = std::min(result.rows_ms, rows_ms / count);
    }
  });
  result.distinct_rows = static_cast<int64_t>(groupers[0].rows.size());
  return result;
}

}  // namespace sparse_floor
}  // namespace fusedopt
