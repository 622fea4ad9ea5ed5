// DeviceEngine<GpuDeviceTag>: the CUDA engine (cc/core/gpu) on the op's stream, for the
// kernels registered on DEVICE_GPU in FUSEDOPT_CUDA builds (see device_engine.h).
// Hyper-parameters arrive in host memory; nothing here waits for the device.
#ifndef FUSEDOPT_CC_TF_DEVICE_ENGINE_GPU_H_
#define FUSEDOPT_CC_TF_DEVICE_ENGINE_GPU_H_

#include <cstdint>

#include "cc/core/gpu/engine_gpu.h"
#include "cc/tf/device_engine.h"
#include "cc/tf/gpu_variables.h"

namespace fusedopt {
namespace tf {

template <>
struct DeviceEngine<GpuDeviceTag> {
  static constexpr bool kCpu = false;

  // Before anything can copy a variable on the GPU (copy-on-write needs the stream).
  static absl::Status CheckDevice(::tensorflow::OpKernelContext* ctx) {
    return GpuStreamOf(ctx) != nullptr ? absl::OkStatus()
                                       : absl::InternalError("fusedopt: no GPU stream for this op");
  }

  template <typename Rule, typename Storage>
  static absl::Status Dense(::tensorflow::OpKernelContext* ctx,
                            const ParamsFor<Rule, Storage>& params, Storage* var,
                            Storage* const* slots, const Storage* grad, int64_t n,
                            int64_t row_size) {
    return ToAbsl(gpu::ApplyDense<Rule, Storage>(params, var, slots, grad, n, row_size,
                                                 GpuStreamOf(ctx)));
  }

  // The index check runs on the device; the update kernels write nothing after a bad
  // index, and the verdict reaches *check without the host waiting for it.
  template <typename Rule, typename Storage, typename Index>
  static absl::Status Sparse(::tensorflow::OpKernelContext* ctx,
                             const ParamsFor<Rule, Storage>& params, Storage* var,
                             Storage* const* slots, int64_t num_rows, int64_t row_size,
                             const Storage* grad, const Index* indices, int64_t num_indices,
                             gpu::IndexCheck* check) {
    TfGpuTempAllocator allocator(ctx);
    const gpu::Status status = gpu::ApplySparse<Rule, Storage, Index>(
        params, var, slots, num_rows, row_size, grad, indices, num_indices, allocator,
        GpuStreamOf(ctx), check);
    if (!allocator.status().ok()) return allocator.status();
    return ToAbsl(status);
  }

  template <typename Rule, typename Storage>
  static absl::Status DenseGroup(::tensorflow::OpKernelContext* ctx,
                                 const ParamsFor<Rule, Storage>& params,
                                 DenseTensor<Rule, Storage>* tensors, int64_t n) {
    return ToAbsl(gpu::ApplyDenseGroup<Rule, Storage>(params, tensors, n, GpuStreamOf(ctx)));
  }
};

}  // namespace tf
}  // namespace fusedopt

#endif  // FUSEDOPT_CC_TF_DEVICE_ENGINE_GPU_H_
