// DeviceEngine<GpuDeviceTag>: the CUDA engine (cc/core/gpu) on the op's stream, for the
// kernels registered on DEVICE_GPU in FUSEDOPT_CUDA builds (see device_engine.h).
// Hyper-parameters arrive in host memory; nothing here waits for the device.
#pragma once

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

  template <typename Rule, typename Storage, typename S>
  static absl::Status Dense(::tensorflow::OpKernelContext* ctx,
                            const ParamsFor<Rule, Storage>& params, Storage* var,
                            S* const* slots, const Storage* grad, int64_t n,
                            int64_t row_size, bool stochastic) {
    return ToAbsl(gpu::ApplyDense<Rule, Storage, S>(params, var, slots, grad, n, row_size,
                                                    GpuStreamOf(ctx), stochastic));
  }

  // The index check runs on the device; the update kernels write nothing after a bad
  // index, and the verdict reaches *check without the host waiting for it.
  template <typename Rule, typename Storage, typename Index, typename S>
  static absl::Status Sparse(::tensorflow::OpKernelContext* ctx,
                             const ParamsFor<Rule, Storage>& params, Storage* var,
                             S* const* slots, int64_t num_rows, int64_t row_size,
                             const Storage* grad, const Index* indices, int64_t num_indices,
                             gpu::IndexCheck* check, bool stochastic) {
    TfGpuTempAllocator allocator(ctx);
    const gpu::Status status = gpu::ApplySparse<Rule, Storage, Index, S>(
        params, var, slots, num_rows, row_size, grad, indices, num_indices, allocator,
        GpuStreamOf(ctx), check, stochastic);
    if (!allocator.status().ok()) return allocator.status();
    return ToAbsl(status);
  }

  template <typename Rule, typename Storage, typename S>
  static absl::Status DenseGroup(::tensorflow::OpKernelContext* ctx,
                                 const ParamsFor<Rule, Storage>& params,
                                 DenseTensor<Rule, Storage, S>* tensors, int64_t n,
                                 bool stochastic) {
    return ToAbsl(gpu::ApplyDenseGroup<Rule, Storage, S>(params, tensors, n, GpuStreamOf(ctx),
                                                         stochastic));
  }
};

}  // namespace tf
}  // namespace fusedopt
