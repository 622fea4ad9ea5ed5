// The per-rule CUDA kernels and their launchers, templated on the rule, the storage type T,
// the slots' storage type S (var's own; bfloat16/half beside float) and (sparse) the index
// type. nvcc only: included by the engine_gpu_*.cu.cc files, each of which instantiates
// every rule for some (T, S) pairs (InstantiateAll below), so the CUDA build's longest
// compile is split across translation units that build in parallel.
//
// Compiled with --fmad=false (no multiply-add contraction) and CUDA's default IEEE
// sqrt/division, so float and double results equal the CPU engine's bit for bit.
#pragma once

#include "cc/core/gpu/gpu_common.cuh"
#include "cc/core/rules/all_rules.h"

namespace fusedopt {
namespace gpu {
namespace detail {
namespace {

// Slots are stored as S: var's T, or 16-bit beside a float var (compact slots, numeric.h).
template <typename S, int kSlots>
struct SlotPointers {
  S* p[kSlots > 0 ? kSlots : 1];
};

// kVec consecutive elements moved as one aligned load/store (16 bytes when kVec > 1).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Pack i (elements i*kVec .. i*kVec+kVec-1) of var, slots and grad: loaded as one aligned
// vector each (16 bytes when kVec > 1; a compact slot's pack is sizeof(S) * kVec bytes),
// updated element by element, stored back. Slots are rounded as engine.h rounds them: to
// nearest or, kStochastic, with the noise of the element's value before the update.
template <typename Rule, typename T, typename S, int kVec, bool kStochastic>
__device__ __forceinline__ void UpdatePack(const ParamsFor<Rule, T>& p, T* __restrict__ var,
                                           const SlotPointers<S, NumSlots<Rule>()>& slots,
                                           const T* __restrict__ grad, int64_t i) {
  using C = ComputeType<T>;
  using P = Pack<T, kVec>;
  using PS = Pack<S, kVec>;
  constexpr int kSlots = NumSlots<Rule>();
  P pv = reinterpret_cast<const P*>(var)[i];
  const P pg = reinterpret_cast<const P*>(grad)[i];
  PS ps[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) ps[k] = reinterpret_cast<const PS*>(slots.p[k])[i];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    C v = Load(pv.v[j]);
    const uint32_t salt = SaltBits(v) ^ p.rounding_salt;
    C s[kSlots];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) s[k] = Load(ps[k].v[j]);
    Rule::Update(p, v, s, Load(pg.v[j]));
    Store(pv.v[j], v);
#pragma unroll
    for (int k = 0; k < kSlots; ++k) StoreSlot<kStochastic>(ps[k].v[j], s[k], salt, k);
  }
  reinterpret_cast<P*>(var)[i] = pv;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) reinterpret_cast<PS*>(slots.p[k])[i] = ps[k];
}

// One fused pass over n elements; with kVec > 1 every pointer is aligned to its pack (16
// bytes; a compact slot's sizeof(S) * kVec) and the first n / kVec packs go vectorised, the
// remainder element by element.
template <typename Rule, typename T, typename S, int kVec, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    DenseKernel(const ParamsFor<Rule, T> p, T* __restrict__ var,
                const SlotPointers<S, NumSlots<Rule>()> slots, const T* __restrict__ grad,
                int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / kVec;
  for (int64_t i = first; i < packs; i += stride) {
    UpdatePack<Rule, T, S, kVec, kStochastic>(p, var, slots, grad, i);
  }
  if (kVec > 1) {
    for (int64_t i = packs * kVec + first; i < n; i += stride) {
      UpdatePack<Rule, T, S, 1, kStochastic>(p, var, slots, grad, i);
    }
  }
}

// The tensors of one group launch, passed by value as the kernel's parameter (about 3 KB
// for two slots: within the 4 KB every CUDA driver takes). Tensor t's chunks of
// kGroupChunk elements are numbered chunk_start[t] .. chunk_start[t + 1].
constexpr int64_t kGroupChunk = 4096;  // 16 packs of 16 bytes per thread for float

template <typename T, typename S, int kSlots>
struct GroupLaunch {
  int count = 0;
  uint64_t aligned = 0;  // bit t: tensor t's var, slots and grad are all aligned to their packs
  int64_t chunk_start[kMaxGroupTensorsPerLaunch + 1];
  int64_t n[kMaxGroupTensorsPerLaunch];
  T* var[kMaxGroupTensorsPerLaunch];
  S* slots[kSlots > 0 ? kSlots : 1][kMaxGroupTensorsPerLaunch];
  const T* grad[kMaxGroupTensorsPerLaunch];
};
static_assert(kMaxGroupTensorsPerLaunch <= 64, "GroupLaunch::aligned has 64 bits");
// Kernel parameters beyond 4 KB need CUDA 12.1 and a Volta or newer GPU: stay below.
static_assert(sizeof(GroupLaunch<double, double, 2>) + 256 <= 4096, "group launch parameters");

// Multi-tensor apply: the blocks take the launch's chunks in turn (grid-stride over the
// chunk numbers); a chunk lies in one tensor, whose 16-byte-aligned ones go vectorised.
template <typename Rule, typename T, typename S, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    DenseGroupKernel(const ParamsFor<Rule, T> p,
                     const GroupLaunch<T, S, NumSlots<Rule>()> launch) {
  constexpr int kSlots = NumSlots<Rule>();
  constexpr int kVec = 16 / sizeof(T);
  static_assert(kGroupChunk % kVec == 0, "chunks start on pack boundaries");
  const int64_t num_chunks = launch.chunk_start[launch.count];
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    int lo = 0, hi = launch.count;  // the tensor t with chunk_start[t] <= c < chunk_start[t+1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (launch.chunk_start[mid] <= c) lo = mid; else hi = mid;
    }
    const int t = lo;
    SlotPointers<S, kSlots> slots;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) slots.p[k] = launch.slots[k][t];
    const int64_t begin = (c - launch.chunk_start[t]) * kGroupChunk;
    const int64_t end = min(launch.n[t], begin + kGroupChunk);
    int64_t scalar_from = begin;
    if (kVec > 1 && ((launch.aligned >> t) & 1u)) {
      const int64_t packs_end = end / kVec;
      for (int64_t i = begin / kVec + threadIdx.x; i < packs_end; i += blockDim.x) {
        UpdatePack<Rule, T, S, kVec, kStochastic>(p, launch.var[t], slots, launch.grad[t], i);
      }
      scalar_from = packs_end * kVec;
    }
    for (int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
      UpdatePack<Rule, T, S, 1, kStochastic>(p, launch.var[t], slots, launch.grad[t], i);
    }
  }
}

// Threads work in lane groups of 2^lanes_log2 per row (narrow rows share a block, wide
// rows stride over columns); each group walks items (rows or chunks) grid-stride.
struct RowLanes {
  int lanes_log2;
  __device__ int lane() const { return threadIdx.x & ((1 << lanes_log2) - 1); }
  __device__ int64_t first_item() const {
    return static_cast<int64_t>(blockIdx.x) * (blockDim.x >> lanes_log2) +
           (threadIdx.x >> lanes_log2);
  }
  __device__ int64_t item_step() const {
    return static_cast<int64_t>(gridDim.x) * (blockDim.x >> lanes_log2);
  }
};

// Left-to-right sum of column c over gradient rows positions[begin .. end), end > begin.
template <typename T>
__device__ __forceinline__ ComputeType<T> SumColumn(const T* __restrict__ grad, int64_t row_size,
                                                    const uint32_t* __restrict__ positions,
                                                    uint32_t begin, uint32_t end, int64_t c) {
  ComputeType<T> sum = Load(grad[static_cast<int64_t>(positions[begin]) * row_size + c]);
  for (uint32_t j = begin + 1; j < end; ++j) {
    sum += Load(grad[static_cast<int64_t>(positions[j]) * row_size + c]);
  }
  return sum;
}

template <typename Rule, typename T, typename S, bool kStochastic>
__device__ __forceinline__ void UpdateElement(const ParamsFor<Rule, T>& p, T* __restrict__ var,
                                              const SlotPointers<S, NumSlots<Rule>()>& slots,
                                              int64_t i, ComputeType<T> g) {
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  C v = Load(var[i]);
  const uint32_t salt = SaltBits(v) ^ p.rounding_salt;
  C s[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) s[k] = Load(slots.p[k][i]);
  Rule::Update(p, v, s, g);
  Store(var[i], v);
#pragma unroll
  for (int k = 0; k < kSlots; ++k) StoreSlot<kStochastic>(slots.p[k][i], s[k], salt, k);
}

// ---------------------------------------------------------------------------------------
// Rules with a per-row phase: one warp per row. Lane j takes the row's elements j, j+32,
// ... in order and the lane sums fold by shuffles, lane j += lane j+w for w = 16 .. 1:
// row_sum.h's order, so the row sums equal the CPU's bit for bit. grad_at(c) is the row's
// (duplicate-summed) gradient at element c, computed again for the element pass. A per-row
// slot's stochastic salt is the row's first element before the update (engine.h), which
// lane 0 reads before its element pass writes it.
constexpr int kWarp = 32;
static_assert(kWarp == kRowSumLanes, "a warp is row_sum.h's lanes");
static_assert(kThreads % kWarp == 0, "whole warps per block");

template <typename Rule, typename T, typename S, bool kStochastic, typename GradAt>
__device__ __forceinline__ void UpdateRowWarp(const ParamsFor<Rule, T>& p, T* __restrict__ var,
                                              const SlotPointers<S, NumSlots<Rule>()>& slots,
                                              int64_t row, int64_t row_size, int lane,
                                              GradAt grad_at) {
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  C sum = C(0);
  for (int64_t c = lane; c < row_size; c += kWarp) sum += Rule::RowTerm(grad_at(c));
  for (int w = kWarp / 2; w > 0; w /= 2) sum += __shfl_down_sync(0xffffffffu, sum, w);
  C row_slots[kSlots];
  C factor = C(0);
#pragma unroll
  for (int k = 0; k < kSlots; ++k) row_slots[k] = C(0);
  const int64_t base = row * row_size;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      if (IsPerRowSlot<Rule>(k)) row_slots[k] = Load(slots.p[k][row]);
    }
    const uint32_t row_salt = (row_size > 0 ? SaltBits(Load(var[base])) : 0u) ^ p.rounding_salt;
    factor = Rule::UpdateRow(p, row_slots, sum, static_cast<C>(row_size));
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      if (IsPerRowSlot<Rule>(k)) StoreSlot<kStochastic>(slots.p[k][row], row_slots[k], row_salt, k);
    }
  }
  factor = __shfl_sync(0xffffffffu, factor, 0);
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if (IsPerRowSlot<Rule>(k)) row_slots[k] = __shfl_sync(0xffffffffu, row_slots[k], 0);
  }
  for (int64_t c = lane; c < row_size; c += kWarp) {
    C v = Load(var[base + c]);
    const uint32_t salt = SaltBits(v) ^ p.rounding_salt;
    C s[kSlots];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      s[k] = IsPerRowSlot<Rule>(k) ? row_slots[k] : Load(slots.p[k][base + c]);
    }
    Rule::Update(p, v, s, grad_at(c), factor);
    Store(var[base + c], v);
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      if (!IsPerRowSlot<Rule>(k)) StoreSlot<kStochastic>(slots.p[k][base + c], s[k], salt, k);
    }
  }
}

// Dense, per-row phase: warp w of the grid takes rows w, w + warps, ...
template <typename Rule, typename T, typename S, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    DenseRowKernel(const ParamsFor<Rule, T> p, T* __restrict__ var,
                   const SlotPointers<S, NumSlots<Rule>()> slots, const T* __restrict__ grad,
                   int64_t num_rows, int64_t row_size) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       r < num_rows; r += warps) {
    const T* g = grad + r * row_size;
    UpdateRowWarp<Rule, T, S, kStochastic>(p, var, slots, r, row_size, lane,
                                           [g](int64_t c) { return ComputeType<T>(Load(g[c])); });
  }
}

template <typename Rule, typename T, typename S, bool kStochastic>
Status LaunchDenseRows(const ParamsFor<Rule, T>& p, T* var,
                       const SlotPointers<S, NumSlots<Rule>()>& slots, const T* grad, int64_t n,
                       int64_t row_size, Stream stream) {
  if (n <= 0 || row_size <= 0) return Status::Ok();
  const int64_t rows = n / row_size;
  DenseRowKernel<Rule, T, S, kStochastic><<<GridFor(rows, kThreads / kWarp), kThreads, 0, stream>>>(
      p, var, slots, grad, rows, row_size);
  return LaunchStatus("dense row-wise update");
}

// Rows with at most kSerialSumLength gradient rows (nearly all of them): one left-to-right
// sum per element, then the update. Hot rows are left to the two kernels below.
template <typename Rule, typename T, typename S, typename Index, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    SparseKernel(const ParamsFor<Rule, T> p, T* __restrict__ var,
                 const SlotPointers<S, NumSlots<Rule>()> slots, const T* __restrict__ grad,
                 int64_t row_size, DeviceGroups<Index> groups, RowLanes lanes) {
  if (IndicesRejected(groups.check)) return;
  const int64_t num_groups = *groups.num_groups;
  for (int64_t g = lanes.first_item(); g < num_groups; g += lanes.item_step()) {
    const uint32_t begin = groups.offsets[g], end = groups.offsets[g + 1];
    if (end - begin > kSerialSumLength) continue;
    if constexpr (HasRowPhase<Rule>()) {  // lanes: one warp per row
      UpdateRowWarp<Rule, T, S, kStochastic>(
          p, var, slots, groups.rows[g], row_size, lanes.lane(), [&](int64_t c) {
            return SumColumn(grad, row_size, groups.positions, begin, end, c);
          });
    } else {
      const int64_t base = static_cast<int64_t>(groups.rows[g]) * row_size;
      for (int64_t c = lanes.lane(); c < row_size; c += 1 << lanes.lanes_log2) {
        UpdateElement<Rule, T, S, kStochastic>(
            p, var, slots, base + c, SumColumn(grad, row_size, groups.positions, begin, end, c));
      }
    }
  }
}

// Hot rows, first level: every chunk of every hot row, spread over the whole GPU, sums
// its gradient rows left to right into partials[chunk].
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads)
    HotChunkKernel(const T* __restrict__ grad, int64_t row_size, DeviceGroups<Index> groups,
                   ComputeType<T>* __restrict__ partials, RowLanes lanes) {
  if (IndicesRejected(groups.check)) return;
  const int64_t num_groups = *groups.num_groups;
  const uint32_t* chunk_offsets = groups.hot_chunk_offsets;
  const int64_t num_chunks = chunk_offsets[num_groups];
  for (int64_t h = lanes.first_item(); h < num_chunks; h += lanes.item_step()) {
    // The group owning chunk h: the last g with chunk_offsets[g] <= h.
    int64_t lo = 0, hi = num_groups;  // chunk_offsets[lo] <= h < chunk_offsets[hi]
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (chunk_offsets[mid] <= h) lo = mid; else hi = mid;
    }
    const uint32_t group_begin = groups.offsets[lo], group_end = groups.offsets[lo + 1];
    const int64_t length = DuplicateChunkLength(group_end - group_begin);
    const uint32_t begin =
        group_begin + static_cast<uint32_t>((h - chunk_offsets[lo]) * length);
    const uint32_t end = min(group_end, static_cast<uint32_t>(begin + length));
    for (int64_t c = lanes.lane(); c < row_size; c += 1 << lanes.lanes_log2) {
      partials[h * row_size + c] = SumColumn(grad, row_size, groups.positions, begin, end, c);
    }
  }
}

// Hot rows, second level: each hot row sums its chunks' partials left to right, then
// updates the row once.
template <typename Rule, typename T, typename S, typename Index, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    HotRowKernel(const ParamsFor<Rule, T> p, T* __restrict__ var,
                 const SlotPointers<S, NumSlots<Rule>()> slots, int64_t row_size,
                 DeviceGroups<Index> groups, const ComputeType<T>* __restrict__ partials,
                 RowLanes lanes) {
  using C = ComputeType<T>;
  if (IndicesRejected(groups.check)) return;
  const int64_t num_groups = *groups.num_groups;
  for (int64_t g = lanes.first_item(); g < num_groups; g += lanes.item_step()) {
    const uint32_t first = groups.hot_chunk_offsets[g], last = groups.hot_chunk_offsets[g + 1];
    if (first == last) continue;  // not a hot row
    auto summed = [&](int64_t c) {
      C sum = partials[static_cast<int64_t>(first) * row_size + c];
      for (uint32_t h = first + 1; h < last; ++h) {
        sum += partials[static_cast<int64_t>(h) * row_size + c];
      }
      return sum;
    };
    if constexpr (HasRowPhase<Rule>()) {  // lanes: one warp per row
      UpdateRowWarp<Rule, T, S, kStochastic>(p, var, slots, groups.rows[g], row_size,
                                             lanes.lane(), summed);
    } else {
      const int64_t base = static_cast<int64_t>(groups.rows[g]) * row_size;
      for (int64_t c = lanes.lane(); c < row_size; c += 1 << lanes.lanes_log2) {
        UpdateElement<Rule, T, S, kStochastic>(p, var, slots, base + c, summed(c));
      }
    }
  }
}

template <typename S, int kSlots>
SlotPointers<S, kSlots> ToSlotPointers(S* const* slots) {
  SlotPointers<S, kSlots> out{};
  for (int k = 0; k < kSlots; ++k) out.p[k] = slots[k];
  return out;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether var, grad and every slot can be moved in packs of kVec = 16 / sizeof(T) elements:
// var and grad 16-byte aligned, each slot to its pack's sizeof(S) * kVec bytes.
template <typename T, typename S>
bool PacksAligned(const T* var, S* const* slots, int num_slots, const T* grad) {
  constexpr uintptr_t kSlotPack = sizeof(S) * (16 / sizeof(T));
  bool aligned = Aligned16(var) && Aligned16(grad);
  for (int k = 0; k < num_slots; ++k) {
    aligned = aligned && (reinterpret_cast<uintptr_t>(slots[k]) % kSlotPack) == 0;
  }
  return aligned;
}

// f(std::bool_constant<kStochastic>{}): stochastic rounding is compiled only for 16-bit slot
// storage (IsCompactStorage); elsewhere `stochastic` changes nothing, as in engine.h.
template <typename S, typename F>
Status WithRounding(bool stochastic, F&& f) {
  if constexpr (IsCompactStorage<S>()) {
    if (stochastic) return f(std::true_type{});
  }
  return f(std::false_type{});
}

}  // namespace
}  // namespace detail

template <typename Rule, typename T, typename S>
Status ApplyDense(const ParamsFor<Rule, T>& p, T* var, S* const* slots, const T* grad, int64_t n,
                  int64_t row_size, Stream stream, bool stochastic) {
  using namespace detail;
  constexpr int kSlots = NumSlots<Rule>();
  constexpr int kVec = 16 / sizeof(T);
  if (n <= 0) return Status::Ok();
  const auto slot_pointers = ToSlotPointers<S, kSlots>(slots);
  return WithRounding<S>(stochastic, [&](auto rounding) {
    constexpr bool kStochastic = decltype(rounding)::value;
    if constexpr (HasRowPhase<Rule>()) {
      return LaunchDenseRows<Rule, T, S, kStochastic>(p, var, slot_pointers, grad, n, row_size,
                                                      stream);
    } else {
      if (PacksAligned(var, slots, kSlots, grad) && n >= kVec) {
        DenseKernel<Rule, T, S, kVec, kStochastic>
            <<<GridFor(n / kVec, kThreads), kThreads, 0, stream>>>(p, var, slot_pointers, grad, n);
      } else {
        DenseKernel<Rule, T, S, 1, kStochastic>
            <<<GridFor(n, kThreads), kThreads, 0, stream>>>(p, var, slot_pointers, grad, n);
      }
      return LaunchStatus("dense update");
    }
  });
}

namespace detail {
namespace {

// ApplyDenseGroup of a rule without a per-row phase: multi-tensor launches.
template <typename Rule, typename T, typename S, bool kStochastic>
Status LaunchDenseGroup(const ParamsFor<Rule, T>& p, const DenseTensor<Rule, T, S>* tensors,
                        int64_t count, Stream stream) {
  constexpr int kSlots = NumSlots<Rule>();
  GroupLaunch<T, S, kSlots> launch;
  auto flush = [&]() -> Status {
    const int64_t chunks = launch.chunk_start[launch.count];
    if (chunks > 0) {
      DenseGroupKernel<Rule, T, S, kStochastic>
          <<<GridFor(chunks, 1), kThreads, 0, stream>>>(p, launch);
      Status s = LaunchStatus("group dense update");
      if (!s.ok()) return s;
    }
    launch.count = 0;
    launch.aligned = 0;
    return Status::Ok();
  };
  launch.chunk_start[0] = 0;
  for (int64_t i = 0; i < count; ++i) {
    const DenseTensor<Rule, T, S>& x = tensors[i];
    if (x.n <= 0) continue;
    const int t = launch.count;
    const bool aligned = PacksAligned(x.var, x.slots.data(), kSlots, x.grad);
    launch.var[t] = x.var;
    for (int k = 0; k < kSlots; ++k) launch.slots[k][t] = x.slots[k];
    launch.grad[t] = x.grad;
    launch.n[t] = x.n;
    if (aligned) launch.aligned |= uint64_t{1} << t;
    launch.chunk_start[t + 1] = launch.chunk_start[t] + (x.n + kGroupChunk - 1) / kGroupChunk;
    launch.count = t + 1;
    if (launch.count == kMaxGroupTensorsPerLaunch) {
      Status s = flush();
      if (!s.ok()) return s;
    }
  }
  return flush();
}

}  // namespace
}  // namespace detail

template <typename Rule, typename T, typename S>
Status ApplyDenseGroup(const ParamsFor<Rule, T>& p, const DenseTensor<Rule, T, S>* tensors,
                       int64_t count, Stream stream, bool stochastic) {
  using namespace detail;
  constexpr int kSlots = NumSlots<Rule>();
  return WithRounding<S>(stochastic, [&](auto rounding) {
    constexpr bool kStochastic = decltype(rounding)::value;
    if constexpr (HasRowPhase<Rule>()) {
      for (int64_t i = 0; i < count; ++i) {
        const DenseTensor<Rule, T, S>& x = tensors[i];
        Status s = LaunchDenseRows<Rule, T, S, kStochastic>(
            p, x.var, ToSlotPointers<S, kSlots>(x.slots.data()), x.grad, x.n, x.row_size, stream);
        if (!s.ok()) return s;
      }
      return Status::Ok();
    } else {
      return LaunchDenseGroup<Rule, T, S, kStochastic>(p, tensors, count, stream);
    }
  });
}

template <typename Rule, typename T, typename Index, typename S>
Status ApplySparse(const ParamsFor<Rule, T>& p, T* var, S* const* slots, int64_t num_rows,
                   int64_t row_size, const T* grad, const Index* indices, int64_t n,
                   TempAllocator& allocator, Stream stream, IndexCheck* check, bool stochastic) {
  using namespace detail;
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  *check = IndexCheck{};
  if (n <= 0) return Status::Ok();  // nothing to check, nothing to write
  if (n > kMaxSparseIndices) {       // callers validate first; this guards the 32-bit math
    return {Status::kInvalidArgument, "sparse updates take at most " +
                                          std::to_string(kMaxSparseIndices) +
                                          " indices per call, got " + std::to_string(n)};
  }
  DeviceGroups<Index> groups;
  // Indices are checked even when rows are empty (row_size 0), as on the CPU.
  Status s = CheckAndCoalesce<Index>(indices, n, num_rows, row_size > 0, allocator, stream, check,
                                     &groups);
  if (!s.ok() || row_size == 0) return s;
  C* partials = static_cast<C*>(allocator.Allocate(
      static_cast<size_t>(MaxHotChunks(n)) * static_cast<size_t>(row_size) * sizeof(C)));
  if (partials == nullptr) {
    return {Status::kResourceExhausted,
            "fusedopt: could not allocate GPU scratch memory for the hot-row sums of a sparse "
            "update (" + std::to_string(MaxHotChunks(n)) + " x " + std::to_string(row_size) +
                " values)"};
  }
  RowLanes lanes{0};
  while ((int64_t{1} << lanes.lanes_log2) < row_size && (1 << lanes.lanes_log2) < kThreads) {
    ++lanes.lanes_log2;
  }
  if (HasRowPhase<Rule>()) lanes.lanes_log2 = 5;  // a warp per row (UpdateRowWarp)
  const int64_t rows_per_block = kThreads >> lanes.lanes_log2;
  const auto slot_pointers = ToSlotPointers<S, kSlots>(slots);
  return WithRounding<S>(stochastic, [&](auto rounding) {
    constexpr bool kStochastic = decltype(rounding)::value;
    SparseKernel<Rule, T, S, Index, kStochastic>
        <<<GridFor(n, rows_per_block), kThreads, 0, stream>>>(p, var, slot_pointers, grad,
                                                               row_size, groups, lanes);
    HotChunkKernel<T, Index><<<GridFor(MaxHotChunks(n), rows_per_block), kThreads, 0, stream>>>(
        grad, row_size, groups, partials, lanes);
    HotRowKernel<Rule, T, S, Index, kStochastic>
        <<<GridFor(n / (kSerialSumLength + 1) + 1, rows_per_block), kThreads, 0, stream>>>(
            p, var, slot_pointers, row_size, groups, partials, lanes);
    return LaunchStatus("sparse update");
  });
}

// Every rule in AllRules for the (T, S) pairs `Pairs` (and, sparse, both index types),
// instantiated by walking the registry: a new rule needs no line anywhere. The pairs in all
// are those of cc/tf/tf_types.h's SlotStorageAllowed, split over the engine_gpu_*.cu.cc
// files (tests/builds/test_build_config.py checks each pair is instantiated exactly once).
// Taking each specialisation's address inside an explicitly instantiated member function
// makes the compiler emit it in that file (the launchers have external linkage, so nothing
// here may be discarded as unused).
namespace instantiation {

template <typename T, typename S>
struct Pair {};

template <typename Rule, typename T, typename S>
void UseRuleAndTypes() {
  static void* volatile sink;
  sink = reinterpret_cast<void*>(&ApplyDense<Rule, T, S>);
  sink = reinterpret_cast<void*>(&ApplyDenseGroup<Rule, T, S>);
  sink = reinterpret_cast<void*>(&ApplySparse<Rule, T, int32_t, S>);
  sink = reinterpret_cast<void*>(&ApplySparse<Rule, T, int64_t, S>);
}

template <typename List, typename T, typename S>
struct InstantiateRules;

template <typename... Rules, typename T, typename S>
struct InstantiateRules<RuleList<Rules...>, T, S> {
  static void Run() { (UseRuleAndTypes<Rules, T, S>(), ...); }
};

template <typename List, typename... Pairs>
struct InstantiateAll;

template <typename List, typename... T, typename... S>
struct InstantiateAll<List, Pair<T, S>...> {
  static void Run() { (InstantiateRules<List, T, S>::Run(), ...); }
};

}  // namespace instantiation
}  // namespace gpu
}  // namespace fusedopt
