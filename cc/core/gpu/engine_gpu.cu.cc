// The per-rule CUDA kernels, instantiated for every rule in AllRules, every storage
// type and (sparse) both index types. One translation unit for all rules keeps the nvcc
// time of the CUDA build to two compiles (this one and coalesce_gpu.cu.cc).
//
// Compiled with --fmad=false (no multiply-add contraction) and CUDA's default IEEE
// sqrt/division, so float and double results equal the CPU engine's bit for bit.
#include "cc/core/gpu/gpu_common.cuh"
#include "cc/core/rules/all_rules.h"

namespace fusedopt {
namespace gpu {
namespace detail {
namespace {

template <typename T, int kSlots>
struct SlotPointers {
  T* p[kSlots > 0 ? kSlots : 1];
};

// kVec consecutive elements moved as one aligned load/store (16 bytes when kVec > 1).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// One fused pass over n elements; with kVec > 1 every pointer is 16-byte aligned and the
// first n / kVec packs go vectorised, the remainder element by element.
template <typename Rule, typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    DenseKernel(const ParamsFor<Rule, T> p, T* __restrict__ var,
                const SlotPointers<T, NumSlots<Rule>()> slots, const T* __restrict__ grad,
                int64_t n) {
  using C = ComputeType<T>;
  using P = Pack<T, kVec>;
  constexpr int kSlots = NumSlots<Rule>();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / kVec;
  for (int64_t i = first; i < packs; i += stride) {
    P pv = reinterpret_cast<const P*>(var)[i];
    const P pg = reinterpret_cast<const P*>(grad)[i];
    P ps[kSlots];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) ps[k] = reinterpret_cast<const P*>(slots.p[k])[i];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      C v = Load(pv.v[j]);
      C s[kSlots];
#pragma unroll
      for (int k = 0; k < kSlots; ++k) s[k] = Load(ps[k].v[j]);
      Rule::Update(p, v, s, Load(pg.v[j]));
      Store(pv.v[j], v);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) Store(ps[k].v[j], s[k]);
    }
    reinterpret_cast<P*>(var)[i] = pv;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) reinterpret_cast<P*>(slots.p[k])[i] = ps[k];
  }
  if (kVec > 1) {
    for (int64_t i = packs * kVec + first; i < n; i += stride) {
      C v = Load(var[i]);
      C s[kSlots];
#pragma unroll
      for (int k = 0; k < kSlots; ++k) s[k] = Load(slots.p[k][i]);
      Rule::Update(p, v, s, Load(grad[i]));
      Store(var[i], v);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) Store(slots.p[k][i], s[k]);
    }
  }
}

// One update per distinct row. Threads are grouped in lanes of 2^lanes_log2 per row
// (narrow rows share a block, wide rows stride over columns); each element sums its
// gradient rows in position order, exactly as the CPU engine does.
template <typename Rule, typename T, typename Key>
__global__ void __launch_bounds__(kThreads)
    SparseKernel(const ParamsFor<Rule, T> p, T* __restrict__ var,
                 const SlotPointers<T, NumSlots<Rule>()> slots, const T* __restrict__ grad,
                 int64_t row_size, const Key* __restrict__ rows,
                 const uint32_t* __restrict__ offsets, const uint32_t* __restrict__ positions,
                 const uint32_t* __restrict__ num_groups, int lanes_log2) {
  using C = ComputeType<T>;
  constexpr int kSlots = NumSlots<Rule>();
  const int lanes = 1 << lanes_log2;
  const int rows_per_block = blockDim.x >> lanes_log2;
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t groups = *num_groups;
  const int64_t step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * rows_per_block + (threadIdx.x >> lanes_log2);
       g < groups; g += step) {
    const int64_t base = static_cast<int64_t>(rows[g]) * row_size;
    const uint32_t begin = offsets[g], end = offsets[g + 1];
    const T* first_row = grad + static_cast<int64_t>(positions[begin]) * row_size;
    for (int64_t c = lane; c < row_size; c += lanes) {
      C sum = Load(first_row[c]);
      for (uint32_t j = begin + 1; j < end; ++j) {
        sum += Load(grad[static_cast<int64_t>(positions[j]) * row_size + c]);
      }
      C v = Load(var[base + c]);
      C s[kSlots];
#pragma unroll
      for (int k = 0; k < kSlots; ++k) s[k] = Load(slots.p[k][base + c]);
      Rule::Update(p, v, s, sum);
      Store(var[base + c], v);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) Store(slots.p[k][base + c], s[k]);
    }
  }
}

template <typename T, int kSlots>
SlotPointers<T, kSlots> ToSlotPointers(T* const* slots) {
  SlotPointers<T, kSlots> out{};
  for (int k = 0; k < kSlots; ++k) out.p[k] = slots[k];
  return out;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace
}  // namespace detail

template <typename Rule, typename T>
Status ApplyDense(const ParamsFor<Rule, T>& p, T* var, T* const* slots, const T* grad, int64_t n,
                  Stream stream) {
  using namespace detail;
  constexpr int kSlots = NumSlots<Rule>();
  constexpr int kVec = 16 / sizeof(T);
  if (n <= 0) return Status::Ok();
  const auto slot_pointers = ToSlotPointers<T, kSlots>(slots);
  bool aligned = Aligned16(var) && Aligned16(grad);
  for (int k = 0; k < kSlots; ++k) aligned = aligned && Aligned16(slots[k]);
  if (aligned && n >= kVec) {
    DenseKernel<Rule, T, kVec><<<GridFor(n / kVec, kThreads), kThreads, 0, stream>>>(
        p, var, slot_pointers, grad, n);
  } else {
    DenseKernel<Rule, T, 1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(p, var, slot_pointers,
                                                                           grad, n);
  }
  return LaunchStatus("dense update");
}

template <typename Rule, typename T, typename Index>
Status ApplySparse(const ParamsFor<Rule, T>& p, T* var, T* const* slots, int64_t num_rows,
                   int64_t row_size, const T* grad, const Index* indices, int64_t n,
                   TempAllocator& allocator, Stream stream) {
  using namespace detail;
  constexpr int kSlots = NumSlots<Rule>();
  if (n <= 0) return Status::Ok();  // nothing to check, nothing to write
  if (n >= INT32_MAX) {  // CUB's item counts are int (and the scan covers n + 1 items)
    return {Status::kInvalidArgument,
            "sparse GPU updates take at most 2147483646 indices per call, got " +
                std::to_string(n)};
  }
  DeviceGroups<Index> groups;
  // Indices are checked even when rows are empty (row_size 0), as on the CPU.
  Status s = CheckAndCoalesce<Index>(indices, n, num_rows, row_size > 0, allocator, stream,
                                     &groups);
  if (!s.ok() || row_size == 0) return s;
  int lanes_log2 = 0;
  while ((int64_t{1} << lanes_log2) < row_size && (1 << lanes_log2) < kThreads) ++lanes_log2;
  const int64_t rows_per_block = kThreads >> lanes_log2;
  SparseKernel<Rule, T, KeyOf<Index>><<<GridFor(n, rows_per_block), kThreads, 0, stream>>>(
      p, var, ToSlotPointers<T, kSlots>(slots), grad, row_size, groups.rows, groups.offsets,
      groups.positions, groups.num_groups, lanes_log2);
  return LaunchStatus("sparse update");
}

// Explicit instantiations: every rule x storage type (x index type).
#define FUSEDOPT_INSTANTIATE_GPU(Rule, T)                                                       \
  template Status ApplyDense<Rule, T>(const ParamsFor<Rule, T>&, T*, T* const*, const T*,       \
                                      int64_t, Stream);                                          \
  template Status ApplySparse<Rule, T, int32_t>(const ParamsFor<Rule, T>&, T*, T* const*,       \
                                                int64_t, int64_t, const T*, const int32_t*,      \
                                                int64_t, TempAllocator&, Stream);                \
  template Status ApplySparse<Rule, T, int64_t>(const ParamsFor<Rule, T>&, T*, T* const*,       \
                                                int64_t, int64_t, const T*, const int64_t*,      \
                                                int64_t, TempAllocator&, Stream);
#define FUSEDOPT_INSTANTIATE_GPU_RULE(Rule) \
  FUSEDOPT_INSTANTIATE_GPU(Rule, half_t)    \
  FUSEDOPT_INSTANTIATE_GPU(Rule, bfloat16_t) \
  FUSEDOPT_INSTANTIATE_GPU(Rule, float)     \
  FUSEDOPT_INSTANTIATE_GPU(Rule, double)

FUSEDOPT_INSTANTIATE_GPU_RULE(LazyAdamRule)
FUSEDOPT_INSTANTIATE_GPU_RULE(AdamaxRule)
FUSEDOPT_INSTANTIATE_GPU_RULE(AdagradRule)

}  // namespace gpu
}  // namespace fusedopt
