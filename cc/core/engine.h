// The generic CPU engine: applies any rule densely (element-wise over the whole
// variable) or sparsely (row-wise over the rows named by indices, duplicates summed
// first). Rules supply only the per-element math (and, with per-row slots, the per-row
// phase: rule.h); this file owns traversal, coalescing and threading. Callers validate shapes first (validate.h); the sparse
// entry point validates indices itself before it writes anything.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "cc/core/coalesce.h"
#include "cc/core/cpu_isa.h"
#include "cc/core/executor.h"
#include "cc/core/huge_pages.h"
#include "cc/core/row_sum.h"
#include "cc/core/rule.h"
#include "cc/core/sum_order.h"

namespace fusedopt {

// A call's parameters: the rule's own, prepared once from the hyper-parameters
// (Rule::Prepare), and the salt stochastic rounding adds to every element's this call
// (CallSalt of the op's rounding seed: numeric.h). Rules see their Params (the base).
template <typename Rule, typename T>
struct CallParams : Rule::template Params<ComputeType<T>> {
  uint32_t rounding_salt = 0;
};
template <typename Rule, typename T>
using ParamsFor = CallParams<Rule, T>;

// Rule::Prepare from hyper-parameters still in storage type T; `rounding_seed`: the call's
// seed of stochastic rounding (unused by rounding to nearest).
template <typename Rule, typename T>
ParamsFor<Rule, T> PrepareParams(const T* const* hyper, const bool* options,
                                 uint64_t rounding_seed = 0) {
  using C = ComputeType<T>;
  std::array<C, Rule::kHyper.size()> values{};
  for (int i = 0; i < NumHyper<Rule>(); ++i) values[i] = Load(*hyper[i]);
  ParamsFor<Rule, T> params;
  static_cast<typename Rule::template Params<C>&>(params) =
      Rule::template Prepare<C>(values.data(), options);
  params.rounding_salt = CallSalt(rounding_seed);
  return params;
}

// What a caller reports when the engine throws std::bad_alloc: it allocates everything
// (grouping, scratch rows) before its first write, so nothing was written.
constexpr const char* kOutOfMemoryBeforeWriting =
    "out of memory for the update's working buffers (grouping the indices, summing "
    "duplicate rows); nothing was written: the variable and its slots are unchanged";

namespace detail {

// One row of a rule with a per-row phase: var and grad hold the row's n elements, a
// per-element slots[k] the same, a per-row slots[k] the row's one value. The row phase
// first (its sum in row_sum.h's order), then every element with the row's values.
// Slots are stored as S (T, or 16-bit for a float32 var: numeric.h), rounded to nearest
// or, kStochastic, stochastically; a per-row slot's salt is the row's first element
// (each salt with the call's, p.rounding_salt).
template <typename Rule, typename T, typename S, typename G, bool kStochastic>
FO_ALWAYS_INLINE void UpdateRowLoop(const ParamsFor<Rule, T>& p, T* __restrict var,
                                    S* const* slots, const G* __restrict grad, int64_t n) {
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  C row_slots[kSlots];
  for (int k = 0; k < kSlots; ++k) row_slots[k] = IsPerRowSlot<Rule>(k) ? Load(*slots[k]) : C(0);
  const uint32_t row_salt = (n > 0 ? SaltBits(Load(var[0])) : 0u) ^ p.rounding_salt;
  const C row = Rule::UpdateRow(p, row_slots, RowSum<Rule, C>(grad, n), static_cast<C>(n));
  for (int k = 0; k < kSlots; ++k) {
    if (IsPerRowSlot<Rule>(k)) StoreSlot<kStochastic>(*slots[k], row_slots[k], row_salt, k);
  }
  for (int64_t i = 0; i < n; ++i) {
    C v = Load(var[i]);
    const uint32_t salt = SaltBits(v) ^ p.rounding_salt;
    C s[kSlots];
    for (int k = 0; k < kSlots; ++k) s[k] = IsPerRowSlot<Rule>(k) ? row_slots[k] : Load(slots[k][i]);
    Rule::Update(p, v, s, C(Load(grad[i])), row);
    Store(var[i], v);
    for (int k = 0; k < kSlots; ++k) {
      if (!IsPerRowSlot<Rule>(k)) StoreSlot<kStochastic>(slots[k][i], s[k], salt, k);
    }
  }
}

// Rules with up to this many slots get each slot as a pointer of its own and the loop
// FO_LOOP_NO_ALIAS: with an array of slot pointers, or one overlap check per pair of
// pointers (GCC caps their number), the 3-slot centered RMSprop's loop stayed scalar and
// ran 2.2x slower than TF's own kernel.
constexpr int kMaxRestrictSlots = 3;

template <typename Rule, typename T, typename S, typename G, bool kStochastic>
FO_ALWAYS_INLINE void UpdateElementLoop(const ParamsFor<Rule, T>& p, T* __restrict var,
                                        const G* __restrict grad, int64_t n,
                                        S* __restrict s0, S* __restrict s1,
                                        S* __restrict s2) {
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  static_assert(kSlots >= 1 && kSlots <= kMaxRestrictSlots);
  FO_LOOP_NO_ALIAS
  for (int64_t i = 0; i < n; ++i) {
    C v = Load(var[i]);
    const uint32_t salt = SaltBits(v) ^ p.rounding_salt;
    C s[kSlots];
    s[0] = Load(s0[i]);
    if constexpr (kSlots > 1) s[1] = Load(s1[i]);
    if constexpr (kSlots > 2) s[2] = Load(s2[i]);
    Rule::Update(p, v, s, Load(grad[i]));
    Store(var[i], v);
    StoreSlot<kStochastic>(s0[i], s[0], salt, 0);
    if constexpr (kSlots > 1) StoreSlot<kStochastic>(s1[i], s[1], salt, 1);
    if constexpr (kSlots > 2) StoreSlot<kStochastic>(s2[i], s[2], salt, 2);
  }
}

// Updates n consecutive elements; for a rule with a per-row phase, exactly one row. G is the gradient's type: T straight from the
// caller's buffer, or ComputeType<T> for a duplicate-summed row. The slot-count
// specialisations give the compiler restrict pointers so the loop vectorises.
// Always inlined: it is compiled once per instruction set of UpdateSpan below.
template <typename Rule, typename T, typename S, typename G, bool kStochastic>
FO_ALWAYS_INLINE void UpdateSpanLoop(const ParamsFor<Rule, T>& p, T* __restrict var,
                                     S* const* slots, const G* __restrict grad, int64_t n) {
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  if constexpr (HasRowPhase<Rule>()) {
    UpdateRowLoop<Rule, T, S, G, kStochastic>(p, var, slots, grad, n);
  } else if constexpr (kSlots <= kMaxRestrictSlots) {
    UpdateElementLoop<Rule, T, S, G, kStochastic>(p, var, grad, n, slots[0],
                                                  kSlots > 1 ? slots[1] : nullptr,
                                                  kSlots > 2 ? slots[2] : nullptr);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      C v = Load(var[i]);
      const uint32_t salt = SaltBits(v) ^ p.rounding_salt;
      C s[kSlots];
      for (int k = 0; k < kSlots; ++k) s[k] = Load(slots[k][i]);
      Rule::Update(p, v, s, Load(grad[i]));
      Store(var[i], v);
      for (int k = 0; k < kSlots; ++k) StoreSlot<kStochastic>(slots[k][i], s[k], salt, k);
    }
  }
}

#if FUSEDOPT_CPU_DISPATCH
// The same loop for CPUs with AVX2: twice the vector width of the x86-64 baseline the
// library is compiled for. Not FMA: each element's result must not depend on the CPU
// (the same IEEE operations in the same order, only more lanes at a time).
template <typename Rule, typename T, typename S, typename G, bool kStochastic>
__attribute__((target("avx2"))) void UpdateSpanAvx2(const ParamsFor<Rule, T>& p, T* var,
                                                    S* const* slots, const G* grad, int64_t n) {
  UpdateSpanLoop<Rule, T, S, G, kStochastic>(p, var, slots, grad, n);
}
#endif

template <typename Rule, typename T, typename S, typename G, bool kStochastic>
void UpdateSpanOn(const ParamsFor<Rule, T>& p, T* var, S* const* slots, const G* grad,
                  int64_t n) {
#if FUSEDOPT_CPU_DISPATCH
  if (CpuVectorIsa() == VectorIsa::kAvx2) {
    UpdateSpanAvx2<Rule, T, S, G, kStochastic>(p, var, slots, grad, n);
    return;
  }
#endif
  UpdateSpanLoop<Rule, T, S, G, kStochastic>(p, var, slots, grad, n);
}

// `stochastic` (stochastic rounding of the slots) matters only for 16-bit slots; the
// loops without it are compiled once per S.
template <typename Rule, typename T, typename S, typename G>
void UpdateSpan(const ParamsFor<Rule, T>& p, T* var, S* const* slots, const G* grad, int64_t n,
                bool stochastic) {
  if constexpr (IsCompactStorage<S>()) {
    if (stochastic) {
      UpdateSpanOn<Rule, T, S, G, true>(p, var, slots, grad, n);
      return;
    }
  }
  UpdateSpanOn<Rule, T, S, G, false>(p, var, slots, grad, n);
}

// Rows are scattered over tables far larger than the caches, so each row's first
// touch of var and every slot is a DRAM (and often TLB) miss the hardware prefetcher
// cannot predict. Asking for the rows a few groups ahead overlaps those misses.
constexpr int64_t kPrefetchRows = 8;  // measured best of 2..32 at 16K rows of 64 floats
constexpr int64_t kPrefetchBytes = 1024;  // of each row; the rest streams in

// Where row `row` (of row_size elements) of each slot starts: its per-row value, or its
// first element.
template <typename Rule, typename S>
inline void SlotsAtRow(S* const* slots, int64_t row, int64_t row_size, S** out) {
  for (int k = 0; k < NumSlots<Rule>(); ++k) {
    out[k] = slots[k] + (IsPerRowSlot<Rule>(k) ? row : row * row_size);
  }
}

template <typename Rule, typename T, typename S>
inline void PrefetchRow(const T* var, S* const* slots, int64_t row, int64_t row_size) {
  const int64_t row_bytes = row_size * static_cast<int64_t>(sizeof(T));
  const int64_t lines = row_bytes < kPrefetchBytes ? row_bytes : kPrefetchBytes;
  const int64_t slot_lines = lines * static_cast<int64_t>(sizeof(S)) / static_cast<int64_t>(sizeof(T));
  S* at[NumSlots<Rule>() > 0 ? NumSlots<Rule>() : 1];
  SlotsAtRow<Rule>(slots, row, row_size, at);
  for (int k = 0; k < NumSlots<Rule>(); ++k) {
    if (IsPerRowSlot<Rule>(k)) __builtin_prefetch(at[k], 1);
  }
  for (int64_t b = 0; b < lines; b += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(var + row * row_size) + b, 1);
    if (b >= slot_lines) continue;
    for (int k = 0; k < NumSlots<Rule>(); ++k) {
      if (!IsPerRowSlot<Rule>(k)) __builtin_prefetch(reinterpret_cast<const char*>(at[k]) + b, 1);
    }
  }
}

// A gradient row is read once, but from wherever its id stands in the batch: as scattered
// as the table's rows. Prefetching the first rows of a group along with its table rows, and
// the duplicates a few rows ahead while summing, took 10-15 % off a 16K-id Adagrad step
// (1M x 64 table, 1 and 2 threads; LazyAdam, bound by its two slots, 3-5 %).
constexpr int64_t kPrefetchGradRows = 4;      // of each group, kPrefetchRows groups ahead
constexpr int64_t kSumPrefetchDistance = 8;  // duplicates ahead, while summing a group

template <typename T>
inline void PrefetchGradRow(const T* grad, int64_t position, int64_t row_size) {
  const int64_t row_bytes = row_size * static_cast<int64_t>(sizeof(T));
  const char* row = reinterpret_cast<const char*>(grad + position * row_size);
  const int64_t bytes = std::min(row_bytes, kPrefetchBytes);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, /*rw=*/0);
}

// Group g's table rows and its first gradient rows.
template <typename Rule, typename T, typename S>
inline void PrefetchGroup(const RowGroups& groups, int64_t g, const T* var, S* const* slots,
                          const T* grad, int64_t row_size) {
  PrefetchRow<Rule>(var, slots, groups.rows[g], row_size);
  const int64_t begin = groups.offsets[g];
  const int64_t end = std::min(groups.offsets[g + 1], begin + kPrefetchGradRows);
  for (int64_t j = begin; j < end; ++j) {
    PrefetchGradRow(grad, groups.all_unique() ? j : groups.positions[j], row_size);
  }
}

// Hash slots a thread keeps between sparse calls: 2^18 (about 6 MB of buffers in all)
// covers batches of up to 128K ids; a larger batch frees its buffers when done.
constexpr int64_t kMaxRetainedHashSlots = int64_t{1} << 18;

// out[0 .. row_size) = grad rows positions[0] + positions[1] + ... (count >= 1), left to
// right, in the compute type.
template <typename T, typename C>
void SumRows(const T* grad, const int64_t* positions, int64_t count, int64_t row_size, C* out) {
  for (int64_t j = kPrefetchGradRows; j < std::min(count, kSumPrefetchDistance); ++j) {
    PrefetchGradRow(grad, positions[j], row_size);  // the first ones came with the group
  }
  const T* first = grad + positions[0] * row_size;
  for (int64_t i = 0; i < row_size; ++i) out[i] = Load(first[i]);
  for (int64_t j = 1; j < count; ++j) {
    if (j + kSumPrefetchDistance < count) {
      PrefetchGradRow(grad, positions[j + kSumPrefetchDistance], row_size);
    }
    const T* row = grad + positions[j] * row_size;
    for (int64_t i = 0; i < row_size; ++i) out[i] += Load(row[i]);
  }
}

template <typename Rule, typename T, typename S>
void AdviseHugePagesFor(const T* var, S* const* slots, int64_t num_rows, int64_t row_size) {
  AdviseHugePages(var, num_rows * row_size * static_cast<int64_t>(sizeof(T)));
  for (int k = 0; k < NumSlots<Rule>(); ++k) {
    AdviseHugePages(slots[k], num_rows * (IsPerRowSlot<Rule>(k) ? 1 : row_size) *
                                  static_cast<int64_t>(sizeof(S)));
  }
}

// Rough cycles per element of one update, for the executor's work splitting.
constexpr int64_t kCyclesPerElement = 12;

// The sparse step's work is split by cost, not by row: a group costs its table rows (read
// and written back: two transfers per per-element array, one for a per-row slot) plus one
// read per gradient row it sums. Embedding ids are skewed (Zipf): the first rows to appear
// are the hot ones, and an even split by rows gave one thread about three quarters of the
// gradient rows of a 16K-id batch.
template <typename Rule>
constexpr int64_t GroupWeight() {
  int64_t weight = 2;  // var
  for (int k = 0; k < NumSlots<Rule>(); ++k) weight += IsPerRowSlot<Rule>(k) ? 1 : 2;
  return weight;
}

// Cost units of the sparse step: group g covers [Start(g), Start(g + 1)), and a block of
// units updates the groups that start in it, so blocks of any split cover every group once.
template <typename Rule>
struct WeightedGroups {
  const RowGroups& groups;
  int64_t Start(int64_t g) const { return GroupWeight<Rule>() * g + groups.offsets[g]; }
  int64_t Units() const { return Start(groups.size()); }
  int64_t FirstStartingAt(int64_t unit) const {  // the first group with Start(g) >= unit
    int64_t lo = 0, hi = groups.size();
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (Start(mid) < unit) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
};

// Scratch rows for summing duplicate gradient rows: a pair (summed, partial) for each
// block of a ParallelFor that can run at once, all allocated before the step writes
// anything. An allocation refused (std::bad_alloc, to the caller) then leaves the variable
// and every slot as they were; in the blocks nothing allocates.
template <typename C>
class SumScratch {
 public:
  // `pairs`: the most blocks that will hold a pair at once (Executor::MaxConcurrentBlocks,
  // or fewer when fewer groups have duplicates).
  SumScratch(int64_t row_size, int64_t pairs)
      : row_size_(row_size), rows_(static_cast<size_t>(2 * row_size * pairs)) {
    free_.reserve(static_cast<size_t>(pairs));
    for (int64_t i = pairs - 1; i >= 0; --i) free_.push_back(i);
  }

  // A block's pair, taken when the block first needs it and given back when it ends.
  class Lease {
   public:
    explicit Lease(SumScratch& scratch) : scratch_(scratch) {}
    ~Lease() {
      if (index_ >= 0) scratch_.Give(index_);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    C* summed() { return Take(); }
    C* partial() { return Take() + scratch_.row_size_; }

   private:
    C* Take() {
      if (index_ < 0) index_ = scratch_.TakeIndex();
      return scratch_.rows_.data() + 2 * scratch_.row_size_ * index_;
    }
    SumScratch& scratch_;
    int64_t index_ = -1;
  };

 private:
  int64_t TakeIndex() {
    std::unique_lock<std::mutex> lock(mu_);
    // More blocks at once than the executor promised would find none left: such a block
    // waits for one to end (blocks holding a pair never wait), rather than allocate.
    returned_.wait(lock, [this] { return !free_.empty(); });
    const int64_t index = free_.back();
    free_.pop_back();
    return index;
  }
  void Give(int64_t index) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(index);  // within the capacity reserved: no allocation
    }
    returned_.notify_one();
  }

  const int64_t row_size_;
  std::vector<C> rows_;
  std::vector<int64_t> free_;
  std::mutex mu_;
  std::condition_variable returned_;
};

// Updates group g's row with the sum of its gradient rows (sum_order.h's order, the GPU
// engine's: each chunk left to right, then the chunk sums left to right, in compute
// type); a row named once takes its gradient row as it is. `scratch`: the block's pair of
// rows, reused across its groups.
template <typename Rule, typename T, typename S, typename C = ComputeType<T>>
FO_ALWAYS_INLINE void UpdateGroup(const ParamsFor<Rule, T>& p, T* var, S* const* slots,
                                  int64_t row_size, const T* grad, const RowGroups& groups,
                                  int64_t g, typename SumScratch<C>::Lease& scratch,
                                  bool stochastic) {
  std::array<S*, NumSlots<Rule>()> s;
  const int64_t offset = groups.rows[g] * row_size;
  SlotsAtRow<Rule>(slots, groups.rows[g], row_size, s.data());
  const int64_t begin = groups.offsets[g], end = groups.offsets[g + 1];
  if (end - begin == 1) {
    const int64_t position = groups.all_unique() ? begin : groups.positions[begin];
    UpdateSpan<Rule, T, S, T>(p, var + offset, s.data(), grad + position * row_size, row_size,
                              stochastic);
    return;
  }
  C* const summed = scratch.summed();
  C* const partial = scratch.partial();
  const int64_t chunk = DuplicateChunkLength(end - begin);
  SumRows(grad, groups.positions.data() + begin, std::min(chunk, end - begin), row_size, summed);
  for (int64_t j = begin + chunk; j < end; j += chunk) {
    SumRows(grad, groups.positions.data() + j, std::min(chunk, end - j), row_size, partial);
    for (int64_t i = 0; i < row_size; ++i) summed[i] += partial[i];
  }
  UpdateSpan<Rule, T, S, C>(p, var + offset, s.data(), summed, row_size, stochastic);
}

// Scratch pairs a sparse step needs: none without duplicates, else one per block that can
// run at once, and no more than groups with duplicates (each has at least two indices).
inline int64_t ScratchPairs(const RowGroups& groups, int64_t n, const Executor& executor) {
  if (groups.all_unique()) return 0;
  return std::max<int64_t>(1, std::min<int64_t>(executor.MaxConcurrentBlocks(),
                                                n - groups.size()));
}

}  // namespace detail

// One dense tensor of a group: var and grad hold n elements in rows of row_size
// (RowSizeOf); a per-element slots[k] n elements, a per-row one a value per row. Only
// rules with a per-row phase read row_size. Slots are stored as S (numeric.h).
template <typename Rule, typename T, typename S = T>
struct DenseTensor {
  T* var;
  std::array<S*, NumSlots<Rule>()> slots;
  const T* grad;
  int64_t n;
  int64_t row_size = 1;
};

// Elements per row of a variable: dim 0 counts its rows (a scalar is one row of one
// element). `num_elements` is the product of all its dims.
inline int64_t RowSizeOf(int64_t rank, int64_t first_dim, int64_t num_elements) {
  if (rank == 0) return 1;
  return first_dim == 0 ? 0 : num_elements / first_dim;
}

// Updates every tensor of a group with the same params in one parallel pass over all
// their elements: small tensors share the threads instead of each paying a dispatch.
// Each element sees exactly the per-element math of a call on its tensor alone.
// `stochastic`: stochastic rounding of 16-bit slots (numeric.h), else to nearest.
template <typename Rule, typename T, typename S>
void ApplyDenseGroup(const ParamsFor<Rule, T>& p, const DenseTensor<Rule, T, S>* tensors,
                     int64_t count, Executor& executor, bool stochastic = false) {
  // Work is cut into blocks of units, elements (a block: a cache-line multiple, so threads
  // never share a line) or, with a per-row phase, whole rows (about as many elements); a
  // block never spans two tensors. first_block[t] is tensor t's first block in the
  // group's numbering.
  constexpr bool kRows = HasRowPhase<Rule>();
  constexpr int64_t kBlock = 1024;
  auto units = [](const DenseTensor<Rule, T, S>& x) -> int64_t {
    if (!kRows) return x.n;
    return x.row_size == 0 ? 0 : x.n / x.row_size;
  };
  auto block_units = [](const DenseTensor<Rule, T, S>& x) -> int64_t {
    return kRows ? std::max<int64_t>(1, kBlock / std::max<int64_t>(1, x.row_size)) : kBlock;
  };
  std::vector<int64_t> first_block(count + 1, 0);
  for (int64_t t = 0; t < count; ++t) {
    const DenseTensor<Rule, T, S>& x = tensors[t];
    detail::AdviseHugePagesFor<Rule>(x.var, x.slots.data(), units(x), kRows ? x.row_size : 1);
    first_block[t + 1] = first_block[t] + (units(x) + block_units(x) - 1) / block_units(x);
  }
  executor.ParallelFor(first_block[count], kBlock * detail::kCyclesPerElement,
                       [&](int64_t first, int64_t last) {
    int64_t t = std::upper_bound(first_block.begin(), first_block.end(), first) -
                first_block.begin() - 1;
    for (int64_t b = first; b < last; ++t) {
      if (first_block[t + 1] <= b) continue;  // an empty tensor
      const DenseTensor<Rule, T, S>& x = tensors[t];
      const int64_t stop = std::min(last, first_block[t + 1]);
      const int64_t begin = (b - first_block[t]) * block_units(x);
      const int64_t end = std::min(units(x), (stop - first_block[t]) * block_units(x));
      std::array<S*, NumSlots<Rule>()> s;
      if constexpr (kRows) {
        for (int64_t row = begin; row < end; ++row) {
          detail::SlotsAtRow<Rule>(x.slots.data(), row, x.row_size, s.data());
          detail::UpdateSpan<Rule, T, S, T>(p, x.var + row * x.row_size, s.data(),
                                            x.grad + row * x.row_size, x.row_size, stochastic);
        }
      } else {
        for (int k = 0; k < NumSlots<Rule>(); ++k) s[k] = x.slots[k] + begin;
        detail::UpdateSpan<Rule, T, S, T>(p, x.var + begin, s.data(), x.grad + begin,
                                          end - begin, stochastic);
      }
      b = stop;
    }
  });
}

// var and grad hold n elements in rows of row_size (RowSizeOf); slots[k] n elements, or
// per row one.
template <typename Rule, typename T, typename S>
void ApplyDense(const ParamsFor<Rule, T>& p, T* var, S* const* slots, const T* grad, int64_t n,
                int64_t row_size, Executor& executor, bool stochastic = false) {
  DenseTensor<Rule, T, S> tensor{var, {}, grad, n, row_size};
  for (int k = 0; k < NumSlots<Rule>(); ++k) tensor.slots[k] = slots[k];
  ApplyDenseGroup<Rule, T, S>(p, &tensor, 1, executor, stochastic);
}

// var and per-element slots are [num_rows, row_size], per-row slots [num_rows]; grad is
// [n, row_size]; indices [n].
// Returns "" on success, else an error message, in which case nothing was written.
template <typename Rule, typename T, typename Index, typename S>
std::string ApplySparse(const ParamsFor<Rule, T>& p, T* var, S* const* slots, int64_t num_rows,
                        int64_t row_size, const T* grad, const Index* indices, int64_t n,
                        Executor& executor, bool stochastic = false) {
  using C = ComputeType<T>;
  if (n == 0) return "";
  // Grouping checks every index and reads each once (coalesce.h): the rows written below
  // are the checked values, whatever happens to `indices` meanwhile.
  Coalescer& coalescer = ThreadCoalescer();  // its buffers outlive the call
  std::string error;
  const RowGroups* grouped = coalescer.Group(indices, n, num_rows, &error);
  if (grouped == nullptr || row_size == 0) {
    coalescer.ReleaseIfAbove(detail::kMaxRetainedHashSlots);
    return error;
  }
  const RowGroups& groups = *grouped;
  detail::AdviseHugePagesFor<Rule>(var, slots, num_rows, row_size);
  detail::SumScratch<C> scratch(row_size, detail::ScratchPairs(groups, n, executor));
  const detail::WeightedGroups<Rule> weighted{groups};
  const int64_t cost = std::max<int64_t>(
      1, row_size * detail::kCyclesPerElement * n / weighted.Units());
  executor.ParallelFor(weighted.Units(), cost, [&](int64_t begin, int64_t end) {
    const int64_t first = weighted.FirstStartingAt(begin);
    const int64_t last = weighted.FirstStartingAt(end);
    typename detail::SumScratch<C>::Lease rows(scratch);
    for (int64_t g = first; g < std::min(last, first + detail::kPrefetchRows); ++g) {
      detail::PrefetchGroup<Rule>(groups, g, var, slots, grad, row_size);
    }
    for (int64_t g = first; g < last; ++g) {
      if (g + detail::kPrefetchRows < last) {
        detail::PrefetchGroup<Rule>(groups, g + detail::kPrefetchRows, var, slots, grad, row_size);
      }
      detail::UpdateGroup<Rule>(p, var, slots, row_size, grad, groups, g, rows, stochastic);
    }
  });
  coalescer.ReleaseIfAbove(detail::kMaxRetainedHashSlots);
  return "";
}

// The sparse gradient of ApplySparse applied to every row (Keras's and TF's Adam on an
// IndexedSlices gradient): a row no index names takes the rule's update with a zero
// gradient (its moments decay), a named row the sum of its gradient rows, as the dense
// update of the densified gradient would, in one pass over the table in row order and
// without that gradient's table-sized buffer. n == 0 still updates every row. Returns ""
// on success, else an error message, in which case nothing was written.
template <typename Rule, typename T, typename Index, typename S>
std::string ApplySparseEveryRow(const ParamsFor<Rule, T>& p, T* var, S* const* slots,
                                int64_t num_rows, int64_t row_size, const T* grad,
                                const Index* indices, int64_t n, Executor& executor,
                                bool stochastic = false) {
  using C = ComputeType<T>;
  Coalescer& coalescer = ThreadCoalescer();  // its buffers outlive the call
  std::string error;
  const RowGroups* grouped = coalescer.Group(indices, n, num_rows, &error);
  if (grouped == nullptr || row_size == 0 || num_rows == 0) {
    coalescer.ReleaseIfAbove(detail::kMaxRetainedHashSlots);
    return error;
  }
  const RowGroups& groups = *grouped;
  // The groups in row order: each block of rows finds its first named row by bisection.
  std::vector<int64_t> by_row(groups.size());
  for (int64_t g = 0; g < groups.size(); ++g) by_row[g] = g;
  std::sort(by_row.begin(), by_row.end(),
            [&](int64_t a, int64_t b) { return groups.rows[a] < groups.rows[b]; });
  detail::AdviseHugePagesFor<Rule>(var, slots, num_rows, row_size);
  // A run of unnamed rows is one span of elements for a rule without a per-row phase: its
  // zero gradient is read from `zeros` a piece at a time.
  constexpr bool kRows = HasRowPhase<Rule>();
  const int64_t zeros_length = kRows ? row_size : std::max<int64_t>(row_size, 4096);
  const std::vector<C> zeros(zeros_length, C(0));
  detail::SumScratch<C> scratch(row_size, detail::ScratchPairs(groups, n, executor));
  executor.ParallelFor(num_rows, row_size * detail::kCyclesPerElement,
                       [&](int64_t first, int64_t last) {
    typename detail::SumScratch<C>::Lease rows(scratch);
    std::array<S*, NumSlots<Rule>()> s;
    int64_t next = std::lower_bound(by_row.begin(), by_row.end(), first,
                                    [&](int64_t g, int64_t row) { return groups.rows[g] < row; }) -
                   by_row.begin();
    int64_t row = first;
    while (row < last) {
      const int64_t named = next < groups.size() ? groups.rows[by_row[next]] : last;
      const int64_t stop = std::min(named, last);  // rows [row, stop) are not named
      if constexpr (kRows) {
        for (; row < stop; ++row) {
          detail::SlotsAtRow<Rule>(slots, row, row_size, s.data());
          detail::UpdateSpan<Rule, T, S, C>(p, var + row * row_size, s.data(), zeros.data(),
                                            row_size, stochastic);
        }
      } else {
        for (int64_t e = row * row_size; e < stop * row_size; e += zeros_length) {
          const int64_t length = std::min(zeros_length, stop * row_size - e);
          for (int k = 0; k < NumSlots<Rule>(); ++k) s[k] = slots[k] + e;
          detail::UpdateSpan<Rule, T, S, C>(p, var + e, s.data(), zeros.data(), length,
                                            stochastic);
        }
        row = stop;
      }
      if (row < last && row == named) {
        detail::UpdateGroup<Rule>(p, var, slots, row_size, grad, groups, by_row[next], rows,
                                  stochastic);
        ++next;
        ++row;
      }
    }
  });
  coalescer.ReleaseIfAbove(detail::kMaxRetainedHashSlots);
  return "";
}

}  // namespace fusedopt
