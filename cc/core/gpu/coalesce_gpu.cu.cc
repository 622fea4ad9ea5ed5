// Rule-independent CUDA pieces: device info, copies, and the sparse index check and
// duplicate coalescing (CUB radix sort + run-length encode + scans, hot-row chunking). Kept apart from the
// per-rule kernels so the two translation units compile in parallel.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <atomic>
#include <climits>

#include "cc/core/coalesce.h"
#include "cc/core/gpu/gpu_common.cuh"

namespace fusedopt {
namespace gpu {

Status DeviceCount(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // not sticky: clear it for the next call
  *count = 0;
  if (err == cudaErrorNoDevice) return Status::Ok();
  return detail::CudaError(err, "initialisation (cudaGetDeviceCount)");
}

Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return Status::Ok();
  return detail::CudaError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                           "copy");
}

namespace detail {

int MultiProcessorCount() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0: not read yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return 132;  // only sizes the grid; a grid-stride loop is correct with any count
  }
  int count = cache[device].load(std::memory_order_relaxed);
  if (count == 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        count <= 0) {
      cudaGetLastError();
      count = 132;
    }
    cache[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

namespace {

// check->position: smallest offending position (atomicMin); kAllInRange when none.
template <typename Index>
__global__ void CheckIndicesKernel(const Index* __restrict__ indices, int64_t n, int64_t num_rows,
                                   DeviceIndexCheck* check) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= num_rows) {
      atomicMin(&check->position, static_cast<unsigned long long>(i));
    }
  }
}

// check->value = the offending index, so the verdict carries the whole message.
template <typename Index>
__global__ void FetchOffenderKernel(const Index* __restrict__ indices, DeviceIndexCheck* check) {
  if (IndicesRejected(check)) {
    check->value = static_cast<long long>(indices[check->position]);
  }
}

// Sort input: keys are the rows (as unsigned; garbage after a bad index, which the update
// kernels then ignore), values the positions. Checks each index as it reads it (as
// CheckIndicesKernel): the keys the update kernels write at are the values checked, even
// if another stream changes `indices` meanwhile.
template <typename Index>
__global__ void PrepareSortKernel(const Index* __restrict__ indices, int64_t n, int64_t num_rows,
                                  KeyOf<Index>* __restrict__ keys, uint32_t* __restrict__ positions,
                                  DeviceIndexCheck* check) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const Index index = indices[i];
    const int64_t row = static_cast<int64_t>(index);
    if (row < 0 || row >= num_rows) {
      atomicMin(&check->position, static_cast<unsigned long long>(i));
    }
    keys[i] = static_cast<KeyOf<Index>>(index);
    positions[i] = static_cast<uint32_t>(i);
  }
}

// chunks[g] = the number of hot-row chunks of group g (0 for groups summed in one chain,
// and for the unused entries past the last group, whose run length is 0).
__global__ void HotChunkCountKernel(const uint32_t* __restrict__ counts, int64_t entries,
                                    uint32_t* __restrict__ chunks) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < entries;
       g += stride) {
    const int64_t count = counts[g];
    chunks[g] = count > kSerialSumLength ? static_cast<uint32_t>(DuplicateChunks(count)) : 0u;
  }
}

// Bump allocation inside one scratch buffer.
class Arena {
 public:
  void Add(size_t bytes) { total_ += Round(bytes); }
  size_t total() const { return total_; }
  void Start(void* base) {
    base_ = static_cast<char*>(base);
    used_ = 0;
  }
  template <typename U>
  U* Take(size_t count) {
    U* p = reinterpret_cast<U*>(base_ + used_);
    used_ += Round(count * sizeof(U));
    return p;
  }

 private:
  static size_t Round(size_t bytes) { return (bytes + 255) & ~size_t{255}; }
  size_t total_ = 0, used_ = 0;
  char* base_ = nullptr;
};

}  // namespace

template <typename Index>
Status CheckAndCoalesce(const Index* indices, int64_t n, int64_t num_rows, bool coalesce,
                        TempAllocator& allocator, Stream stream, IndexCheck* host_check,
                        DeviceGroups<Index>* groups) {
  using Key = KeyOf<Index>;
  const int items = static_cast<int>(n);
  // Valid rows fit in `bits` bits (num_rows - 1 >= every valid index): fewer radix passes.
  int bits = 1;
  while (bits < static_cast<int>(8 * sizeof(Key)) &&
         (static_cast<uint64_t>(num_rows - 1) >> bits) != 0) {
    ++bits;
  }
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  if (coalesce) {
    Status s = CudaError(cub::DeviceRadixSort::SortPairs(
                             nullptr, sort_bytes, static_cast<const Key*>(nullptr),
                             static_cast<Key*>(nullptr), static_cast<const uint32_t*>(nullptr),
                             static_cast<uint32_t*>(nullptr), items, 0, bits, stream),
                         "radix sort sizing");
    if (!s.ok()) return s;
    s = CudaError(cub::DeviceRunLengthEncode::Encode(
                      nullptr, rle_bytes, static_cast<const Key*>(nullptr),
                      static_cast<Key*>(nullptr), static_cast<uint32_t*>(nullptr),
                      static_cast<uint32_t*>(nullptr), items, stream),
                  "run-length encode sizing");
    if (!s.ok()) return s;
    s = CudaError(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                                static_cast<const uint32_t*>(nullptr),
                                                static_cast<uint32_t*>(nullptr), items + 1,
                                                stream),
                  "scan sizing");
    if (!s.ok()) return s;
  }
  size_t cub_bytes = sort_bytes;
  if (rle_bytes > cub_bytes) cub_bytes = rle_bytes;
  if (scan_bytes > cub_bytes) cub_bytes = scan_bytes;

  Arena arena;
  arena.Add(sizeof(DeviceIndexCheck));
  if (coalesce) {
    arena.Add(n * sizeof(Key));             // keys in
    arena.Add(n * sizeof(Key));             // keys out (sorted)
    arena.Add(n * sizeof(uint32_t));        // positions in
    arena.Add(n * sizeof(uint32_t));        // positions out (sorted)
    arena.Add(n * sizeof(Key));             // unique rows
    arena.Add((n + 1) * sizeof(uint32_t));  // run lengths
    arena.Add((n + 1) * sizeof(uint32_t));  // offsets
    arena.Add((n + 1) * sizeof(uint32_t));  // hot-row chunks per group
    arena.Add((n + 1) * sizeof(uint32_t));  // their offsets
    arena.Add(sizeof(uint32_t));            // number of groups
    arena.Add(cub_bytes);
  }
  void* base = allocator.Allocate(arena.total());
  if (base == nullptr) {
    return {Status::kResourceExhausted,
            "fusedopt: could not allocate " + std::to_string(arena.total()) +
                " bytes of GPU scratch memory for a sparse update"};
  }
  arena.Start(base);
  auto* check = arena.Take<DeviceIndexCheck>(1);
  groups->check = check;

  // 1. Index check (fused into the sort's preparation when coalescing), its verdict
  //    copied to the host without waiting for it.
  Status s = CudaError(cudaMemsetAsync(check, 0xff, sizeof(DeviceIndexCheck), stream), "memset");
  if (!s.ok()) return s;
  auto send_verdict = [&]() {
    FetchOffenderKernel<Index><<<1, 1, 0, stream>>>(indices, check);
    Status launched = LaunchStatus("index check");
    if (!launched.ok()) return launched;
    return CudaError(cudaMemcpyAsync(host_check, check, sizeof(IndexCheck),
                                     cudaMemcpyDeviceToHost, stream),
                     "index check copy");
  };
  if (!coalesce) {
    CheckIndicesKernel<Index><<<GridFor(n, kThreads), kThreads, 0, stream>>>(indices, n,
                                                                             num_rows, check);
    return send_verdict();
  }

  // 2. Stable sort of (row, position): positions stay ascending within a row.
  Key* keys_in = arena.Take<Key>(n);
  Key* keys_out = arena.Take<Key>(n);
  uint32_t* positions_in = arena.Take<uint32_t>(n);
  uint32_t* positions_out = arena.Take<uint32_t>(n);
  Key* rows = arena.Take<Key>(n);
  uint32_t* counts = arena.Take<uint32_t>(n + 1);
  uint32_t* offsets = arena.Take<uint32_t>(n + 1);
  uint32_t* hot_chunks = arena.Take<uint32_t>(n + 1);
  uint32_t* hot_chunk_offsets = arena.Take<uint32_t>(n + 1);
  uint32_t* num_groups = arena.Take<uint32_t>(1);
  void* cub_temp = arena.Take<char>(cub_bytes);
  PrepareSortKernel<Index><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      indices, n, num_rows, keys_in, positions_in, check);
  s = LaunchStatus("sort preparation");
  if (!s.ok()) return s;
  s = send_verdict();
  if (!s.ok()) return s;
  size_t bytes = sort_bytes;
  s = CudaError(cub::DeviceRadixSort::SortPairs(cub_temp, bytes, keys_in, keys_out, positions_in,
                                                positions_out, items, 0, bits, stream),
                "radix sort");
  if (!s.ok()) return s;
  // 3. One group per distinct row; offsets = exclusive sum of the run lengths (entries past
  //    the number of runs are zero, so offsets[num_groups] == n).
  s = CudaError(cudaMemsetAsync(counts, 0, (n + 1) * sizeof(uint32_t), stream), "memset");
  if (!s.ok()) return s;
  bytes = rle_bytes;
  s = CudaError(cub::DeviceRunLengthEncode::Encode(cub_temp, bytes, keys_out, rows, counts,
                                                   num_groups, items, stream),
                "run-length encode");
  if (!s.ok()) return s;
  bytes = scan_bytes;
  s = CudaError(cub::DeviceScan::ExclusiveSum(cub_temp, bytes, counts, offsets, items + 1, stream),
                "scan");
  if (!s.ok()) return s;
  // 4. Hot rows: number their chunks (an exclusive sum again; the same item count, so the
  //    same scratch size).
  HotChunkCountKernel<<<GridFor(n + 1, kThreads), kThreads, 0, stream>>>(counts, n + 1,
                                                                        hot_chunks);
  s = LaunchStatus("hot-row chunk count");
  if (!s.ok()) return s;
  bytes = scan_bytes;
  s = CudaError(cub::DeviceScan::ExclusiveSum(cub_temp, bytes, hot_chunks, hot_chunk_offsets,
                                              items + 1, stream),
                "scan");
  if (!s.ok()) return s;
  groups->rows = rows;
  groups->offsets = offsets;
  groups->positions = positions_out;
  groups->num_groups = num_groups;
  groups->hot_chunk_offsets = hot_chunk_offsets;
  return Status::Ok();
}

template Status CheckAndCoalesce<int32_t>(const int32_t*, int64_t, int64_t, bool, TempAllocator&,
                                          Stream, IndexCheck*, DeviceGroups<int32_t>*);
template Status CheckAndCoalesce<int64_t>(const int64_t*, int64_t, int64_t, bool, TempAllocator&,
                                          Stream, IndexCheck*, DeviceGroups<int64_t>*);

}  // namespace detail
}  // namespace gpu
}  // namespace fusedopt
