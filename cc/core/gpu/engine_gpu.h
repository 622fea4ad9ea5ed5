// The CUDA engine: the same rules as engine.h applied to device buffers, on a stream
// the caller owns. TensorFlow-free and CUDA-header-free, so host code (the TF binding,
// the pybind11 module) includes it with any compiler; the definitions live in the
// .cu.cc files next to it (compiled by nvcc, explicitly instantiated for every rule,
// storage type and index type).
//
// Slots are stored as S: var's own T or, beside a float var, bfloat16_t or half_t (compact
// slots; the pairs of cc/tf/tf_types.h's SlotStorageAllowed are the ones instantiated). The
// rules compute in ComputeType<T> and round each slot once on store, to nearest even or,
// with `stochastic` (16-bit slots only; elsewhere it changes nothing), stochastically with
// the CPU engine's noise and salts (numeric.h StoreSlot, engine.h): the same bits.
//
// Semantics are those of the CPU engine, word for word:
//   dense   one fused pass per element (read var/slots/grad once, write var/slots once);
//   sparse  every index checked first (the first offending position is reported with
//           the CPU's message and nothing is written), duplicates summed in the order of
//           sum_order.h, then one Update() per unique row. Coalescing is a stable radix
//           sort of (row, position) pairs, so results are bit-identical run to run and,
//           for float/double, with the CPU engine (device code is compiled with
//           --fmad=false and IEEE sqrt/division).
// Nothing here synchronises with the host: work is enqueued on `stream` and the calls
// return. A sparse call's index check runs on the device; every kernel that writes reads
// its verdict first and writes nothing after a bad index, and the verdict is copied into
// host memory the caller provides (IndexCheck), to be read once the stream has passed the
// call (an event, a stream callback or a synchronisation). Buffers must stay valid until
// the enqueued work completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/core/engine.h"
#include "cc/core/validate.h"

struct CUstream_st;  // cudaStream_t / CUstream without the CUDA headers

namespace fusedopt {
namespace gpu {

using Stream = CUstream_st*;

struct Status {
  enum Code { kOk = 0, kInvalidArgument, kResourceExhausted, kInternal };
  Code code = kOk;
  std::string message;
  bool ok() const { return code == kOk; }
  static Status Ok() { return {}; }
};

// Device scratch memory for sparse calls. Allocate() returns device memory of at least
// `bytes` bytes aligned to 256, or nullptr; it must stay usable by work enqueued on the
// stream until that work completes (TF: ctx->allocate_temp; the pybind11 module:
// cudaMallocAsync/cudaFreeAsync on the same stream).
class TempAllocator {
 public:
  virtual ~TempAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
};

// The verdict of a sparse call's index check, copied by the device into host memory
// (page-locked, for the copy to be asynchronous). Same layout as the device's record.
struct IndexCheck {
  static constexpr uint64_t kAllInRange = ~uint64_t{0};
  uint64_t position = kAllInRange;  // first offending position
  int64_t value = 0;                // its index
};

// InvalidArgument with the CPU engine's message when `check` found a bad index. Read it
// only after the stream has passed the call that fills it.
inline Status IndexCheckStatus(const IndexCheck& check, int64_t num_rows) {
  if (check.position == IndexCheck::kAllInRange) return Status::Ok();
  return {Status::kInvalidArgument,
          IndexErrorMessage(static_cast<int64_t>(check.position), check.value, num_rows)};
}

// Dense update of n elements in rows of row_size (RowSizeOf: only rules with a per-row
// phase read it; they update a row per warp). Never fails on valid pointers except for
// CUDA errors.
template <typename Rule, typename T, typename S = T>
Status ApplyDense(const ParamsFor<Rule, T>& p, T* var, S* const* slots, const T* grad, int64_t n,
                  int64_t row_size, Stream stream, bool stochastic = false);

// Dense updates of `count` tensors with the same params (the group op): one launch per
// kMaxGroupTensorsPerLaunch tensors, the tensors' elements cut into chunks that every block
// of the grid takes in turn (a multi-tensor apply), so 1,000 small variables cost 16
// launches, not 1,000. Each element sees exactly ApplyDense's math (the same bits). Rules
// with a per-row phase: one row-per-warp launch per tensor.
// `tensors` is host memory, read before the call returns (the launches carry copies).
constexpr int kMaxGroupTensorsPerLaunch = 64;

template <typename Rule, typename T, typename S = T>
Status ApplyDenseGroup(const ParamsFor<Rule, T>& p, const DenseTensor<Rule, T, S>* tensors,
                       int64_t count, Stream stream, bool stochastic = false);

// var and per-element slots are [num_rows, row_size] on the device, per-row slots
// [num_rows]; grad [n, row_size]; indices [n],
// n <= kMaxSparseIndices. Enqueues the index check, coalescing and updates and a copy of
// the check's verdict into *check (host memory that must stay valid until the stream has
// passed the call; it reads "all in range" until then). The returned Status covers what
// the host sees while enqueueing: launch errors, scratch memory (kResourceExhausted).
template <typename Rule, typename T, typename Index, typename S = T>
Status ApplySparse(const ParamsFor<Rule, T>& p, T* var, S* const* slots, int64_t num_rows,
                   int64_t row_size, const T* grad, const Index* indices, int64_t n,
                   TempAllocator& allocator, Stream stream, IndexCheck* check,
                   bool stochastic = false);

// Stream-ordered device-to-device copy (copy-on-write of variables).
Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream);

// Number of CUDA devices visible to this process's CUDA runtime: 0 when the runtime
// reports none (cudaErrorNoDevice); any other failure to initialise CUDA (no driver, a
// driver too old for this CUDA 13 runtime, ...) is an error naming the CUDA error, so a
// broken setup is never mistaken for a machine without a GPU.
Status DeviceCount(int* count);

}  // namespace gpu
}  // namespace fusedopt
