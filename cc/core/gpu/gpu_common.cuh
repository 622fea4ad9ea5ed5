// Internals shared by the CUDA translation units (nvcc only): launch sizing, error mapping,
// the device-side index check, and the interface between index coalescing
// (coalesce_gpu.cu.cc, rule-independent, holds all CUB code) and the per-rule kernels
// (engine_gpu_kernels.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/core/gpu/engine_gpu.h"
#include "cc/core/sum_order.h"

namespace fusedopt {
namespace gpu {
namespace detail {

constexpr int kThreads = 256;

// Multiprocessor count of the current device, from cudaDeviceGetAttribute (never
// cudaDeviceProp: its layout differs between the CUDA 12 headers TF was built with and
// the CUDA 13 toolkit that compiles this). Cached per device.
int MultiProcessorCount();

// Blocks for a grid-stride loop over `work` items handled `per_block` at a time:
// enough to fill every SM (8 resident blocks of 256 threads), no more than needed.
inline int GridFor(int64_t work, int64_t per_block) {
  const int64_t needed = (work + per_block - 1) / per_block;
  const int64_t full = static_cast<int64_t>(MultiProcessorCount()) * 8;
  const int64_t blocks = needed < full ? needed : full;
  return static_cast<int>(blocks < 1 ? 1 : blocks);
}

inline Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return {Status::kInternal, std::string("CUDA error in fusedopt ") + what + ": " +
                                 cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

// Errors from the launches just made on this thread.
inline Status LaunchStatus(const char* what) { return CudaError(cudaGetLastError(), what); }

template <typename Index>
using KeyOf = std::make_unsigned_t<Index>;

// The device's copy of the index check (IndexCheck's layout): position is the smallest
// offending position (atomicMin), kAllInRange when there is none.
struct DeviceIndexCheck {
  unsigned long long position;
  long long value;
};
static_assert(sizeof(DeviceIndexCheck) == sizeof(IndexCheck), "IndexCheck layout");

// Every kernel that writes var or slots starts with this: after a bad index, nothing.
__device__ __forceinline__ bool IndicesRejected(const DeviceIndexCheck* check) {
  return check->position != static_cast<unsigned long long>(IndexCheck::kAllInRange);
}

// Duplicate-coalesced rows of a sparse call, all in device memory: group g updates row
// rows[g] with gradient rows positions[offsets[g] .. offsets[g+1]) (ascending). Groups of
// more than kSerialSumLength rows ("hot" rows) are summed in chunks (sum_order.h): their
// chunks are numbered hot_chunk_offsets[g] .. hot_chunk_offsets[g+1] (no chunks for the
// other groups). Counts stay on the device (*num_groups) so nothing synchronises.
template <typename Index>
struct DeviceGroups {
  const KeyOf<Index>* rows = nullptr;
  const uint32_t* offsets = nullptr;
  const uint32_t* positions = nullptr;
  const uint32_t* num_groups = nullptr;
  const uint32_t* hot_chunk_offsets = nullptr;
  const DeviceIndexCheck* check = nullptr;
};

// Hot-row chunks of a call with n indices never exceed this (sum_order.h: a group of
// c > 32 rows has fewer than c / 16 chunks), which sizes the partial-sum scratch.
inline int64_t MaxHotChunks(int64_t n) { return n / 16 + 1; }

// Enqueues the index check (its verdict into groups->check on the device and, by an
// asynchronous copy, into *host_check) and, when `coalesce` is true, the sort and grouping.
// Coalescing runs even after a bad index (it only reads indices and writes scratch); the
// update kernels then write nothing. n must be in [1, kMaxSparseIndices].
template <typename Index>
Status CheckAndCoalesce(const Index* indices, int64_t n, int64_t num_rows, bool coalesce,
                        TempAllocator& allocator, Stream stream, IndexCheck* host_check,
                        DeviceGroups<Index>* groups);

}  // namespace detail
}  // namespace gpu
}  // namespace fusedopt
