// The CUDA engine: the same rules as engine.h applied to device buffers, on a stream
// the caller owns. TensorFlow-free and CUDA-header-free, so host code (the TF binding,
// the pybind11 module) includes it with any compiler; the definitions live in the
// .cu.cc files next to it (compiled by nvcc, explicitly instantiated for every rule,
// storage type and index type).
//
// Semantics are those of the CPU engine, word for word:
//   dense   one fused pass per element (read var/slots/grad once, write var/slots once);
//   sparse  every index checked first (the first offending position is reported with
//           the CPU's message and nothing is written), duplicates summed in order of
//           appearance, then one Update() per unique row. Coalescing is a stable radix
//           sort of (row, position) pairs, so the sum order is the CPU's and results are
//           bit-identical run to run and, for float/double, with the CPU engine (device
//           code is compiled with --fmad=false and IEEE sqrt/division).
// The only host synchronisation is the one read-back of the index check in sparse
// calls. Work is enqueued on `stream`; buffers must stay valid until it completes.
#ifndef FUSEDOPT_CC_CORE_GPU_ENGINE_GPU_H_
#define FUSEDOPT_CC_CORE_GPU_ENGINE_GPU_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/core/engine.h"

struct CUstream_st;  // cudaStream_t / CUstream without the CUDA headers

namespace fusedopt {
namespace gpu {

using Stream = CUstream_st*;

struct Status {
  enum Code { kOk = 0, kInvalidArgument, kInternal };
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

// Dense update of n elements. Never fails on valid pointers except for CUDA errors.
template <typename Rule, typename T>
Status ApplyDense(const ParamsFor<Rule, T>& p, T* var, T* const* slots, const T* grad, int64_t n,
                  Stream stream);

// var and slots are [num_rows, row_size] on the device; grad [n, row_size]; indices [n].
template <typename Rule, typename T, typename Index>
Status ApplySparse(const ParamsFor<Rule, T>& p, T* var, T* const* slots, int64_t num_rows,
                   int64_t row_size, const T* grad, const Index* indices, int64_t n,
                   TempAllocator& allocator, Stream stream);

// Stream-ordered device-to-device copy (copy-on-write of variables).
Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream);

// Number of CUDA devices visible to this process's CUDA runtime: 0 when the runtime
// reports none (cudaErrorNoDevice); any other failure to initialise CUDA (no driver, a
// driver too old for this CUDA 13 runtime, ...) is an error naming the CUDA error, so a
// broken setup is never mistaken for a machine without a GPU.
Status DeviceCount(int* count);

}  // namespace gpu
}  // namespace fusedopt

#endif  // FUSEDOPT_CC_CORE_GPU_ENGINE_GPU_H_
