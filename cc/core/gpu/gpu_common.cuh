// Internals shared by the two CUDA translation units (nvcc only): launch sizing,
// error mapping, and the interface between index coalescing (coalesce_gpu.cu.cc,
// rule-independent, holds all CUB code) and the per-rule kernels (engine_gpu.cu.cc).
#ifndef FUSEDOPT_CC_CORE_GPU_GPU_COMMON_CUH_
#define FUSEDOPT_CC_CORE_GPU_GPU_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/core/gpu/engine_gpu.h"

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

// Duplicate-coalesced rows of a sparse call, all in device memory: group g updates row
// rows[g] with gradient rows positions[offsets[g] .. offsets[g+1]) (ascending). The
// number of groups stays on the device (*num_groups) so no extra sync is needed.
template <typename Index>
struct DeviceGroups {
  const KeyOf<Index>* rows = nullptr;
  const uint32_t* offsets = nullptr;
  const uint32_t* positions = nullptr;
  const uint32_t* num_groups = nullptr;
};

// Checks every index is in [0, num_rows) (the one host sync: an InvalidArgument status
// with the CPU's message names the first offender, before anything is written), then,
// when `coalesce` is true, sorts and groups. n must be in [1, 2^31 - 1).
template <typename Index>
Status CheckAndCoalesce(const Index* indices, int64_t n, int64_t num_rows, bool coalesce,
                        TempAllocator& allocator, Stream stream, DeviceGroups<Index>* groups);

}  // namespace detail
}  // namespace gpu
}  // namespace fusedopt

#endif  // FUSEDOPT_CC_CORE_GPU_GPU_COMMON_CUH_
