// The device half of the kernels, as TF's training_ops functors split it: the op kernels
// (apply_kernel.h, group_kernel.h) validate, lock and fetch buffers for any Device, then
// hand them to DeviceEngine<Device>. This file: the CPU engine on TF's thread pool.
// device_engine_gpu.h: the CUDA engine on the op's stream (FUSEDOPT_CUDA builds).
#pragma once

// Eigen::ThreadPoolDevice (CPUDevice, the CPU kernels' Device tag) in full.
#ifndef EIGEN_USE_THREADS
#define EIGEN_USE_THREADS
#endif

#include <cstdint>
#include <string>

#include "cc/core/engine.h"
#include "cc/tf/cpu_executor.h"
#include "cc/tf/variable_access.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace fusedopt {
namespace gpu {
struct IndexCheck;  // engine_gpu.h (CUDA builds): the GPU index check's verdict
}  // namespace gpu
namespace tf {

template <typename Device>
struct DeviceEngine;

template <>
struct DeviceEngine<CPUDevice> {
  static constexpr bool kCpu = true;  // buffer separation (cache_alias.h) is the CPU's

  static absl::Status CheckDevice(::tensorflow::OpKernelContext*) { return absl::OkStatus(); }

  // Slots are stored as S (var's type, or 16-bit for a float32 var); `stochastic`: their
  // rounding (numeric.h).
  template <typename Rule, typename Storage, typename S>
  static absl::Status Dense(::tensorflow::OpKernelContext* ctx,
                            const ParamsFor<Rule, Storage>& params,
                            Storage* var, S* const* slots, const Storage* grad, int64_t n,
                            int64_t row_size, bool stochastic) {
    TfCpuExecutor executor(ctx);
    return WithoutExceptions([&] {
      ApplyDense<Rule, Storage, S>(params, var, slots, grad, n, row_size, executor, stochastic);
      return absl::OkStatus();
    });
  }

  // Checks every index before it writes anything. `check` is the GPU's (unused here).
  template <typename Rule, typename Storage, typename Index, typename S>
  static absl::Status Sparse(::tensorflow::OpKernelContext* ctx,
                             const ParamsFor<Rule, Storage>& params,
                             Storage* var, S* const* slots, int64_t num_rows,
                             int64_t row_size, const Storage* grad, const Index* indices,
                             int64_t num_indices, gpu::IndexCheck* /*check*/, bool stochastic) {
    TfCpuExecutor executor(ctx);
    return WithoutExceptions([&] {
      const std::string error = ApplySparse<Rule, Storage, Index, S>(
          params, var, slots, num_rows, row_size, grad, indices, num_indices, executor,
          stochastic);
      return error.empty() ? absl::OkStatus() : absl::InvalidArgumentError(error);
    });
  }

  // The sparse gradient applied to every row (engine.h's ApplySparseEveryRow).
  template <typename Rule, typename Storage, typename Index, typename S>
  static absl::Status SparseEveryRow(::tensorflow::OpKernelContext* ctx,
                                     const ParamsFor<Rule, Storage>& params, Storage* var,
                                     S* const* slots, int64_t num_rows, int64_t row_size,
                                     const Storage* grad, const Index* indices,
                                     int64_t num_indices, bool stochastic) {
    TfCpuExecutor executor(ctx);
    return WithoutExceptions([&] {
      const std::string error = ApplySparseEveryRow<Rule, Storage, Index, S>(
          params, var, slots, num_rows, row_size, grad, indices, num_indices, executor,
          stochastic);
      return error.empty() ? absl::OkStatus() : absl::InvalidArgumentError(error);
    });
  }

  template <typename Rule, typename Storage, typename S>
  static absl::Status DenseGroup(::tensorflow::OpKernelContext* ctx,
                                 const ParamsFor<Rule, Storage>& params,
                                 DenseTensor<Rule, Storage, S>* tensors, int64_t n,
                                 bool stochastic) {
    TfCpuExecutor executor(ctx);
    return WithoutExceptions([&] {
      ApplyDenseGroup<Rule, Storage, S>(params, tensors, n, executor, stochastic);
      return absl::OkStatus();
    });
  }
};

}  // namespace tf
}  // namespace fusedopt
