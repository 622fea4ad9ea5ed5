// FUSEDOPT_CUDA builds: the asynchronous kernel of the sparse ops on DEVICE_GPU, and
// which kernel class each GPU op gets (kernels.h registers them).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cc/tf/apply_kernel.h"
#include "cc/tf/device_engine_gpu.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace fusedopt {
namespace tf {

// Sparse GPU ops are asynchronous, as TF's own GPU ops that must report a data-dependent
// error: Compute enqueues the whole update and returns; the index check's verdict is
// copied into page-locked host memory behind it, and TF's EventMgr runs the callback that
// turns a bad index into InvalidArgument (nothing was written) once the stream gets there.
// The compute stream never drains for an embedding update.
template <typename T, typename Rule, Variant kVariant, typename Index>
class FusedSparseApplyGpuOp : public ::tensorflow::AsyncOpKernel {
 public:
  explicit FusedSparseApplyGpuOp(::tensorflow::OpKernelConstruction* ctx)
      : AsyncOpKernel(ctx), apply_(ctx) {}

  void ComputeAsync(::tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    ::tensorflow::Tensor verdict;
    tsl::AllocatorAttributes on_host;
    on_host.set_on_host(true);
    on_host.set_gpu_compatible(true);  // page-locked: the device copies into it
    OP_REQUIRES_OK_ASYNC(
        ctx,
        ctx->allocate_temp(::tensorflow::DT_INT64,
                           ::tensorflow::TensorShape({sizeof(gpu::IndexCheck) / sizeof(int64_t)}),
                           &verdict, on_host),
        done);
    auto* check = reinterpret_cast<gpu::IndexCheck*>(verdict.flat<int64_t>().data());
    int64_t num_rows = 0;
    apply_.Run(ctx, check, &num_rows);
    if (!ctx->status().ok()) {
      done();
      return;
    }
    const auto* device_info = ctx->device()->tensorflow_accelerator_device_info();
    OP_REQUIRES_ASYNC(ctx, device_info != nullptr && device_info->event_mgr != nullptr,
                      absl::InternalError("fusedopt: no GPU event manager for this op"), done);
    // `verdict` rides along so its memory outlives the copy into it.
    device_info->event_mgr->ThenExecute(
        ctx->op_device_context()->stream(),
        [ctx, verdict, num_rows, done = std::move(done)]() {
          const auto* result =
              reinterpret_cast<const gpu::IndexCheck*>(verdict.flat<int64_t>().data());
          const gpu::Status status = gpu::IndexCheckStatus(*result, num_rows);
          if (!status.ok()) ctx->SetStatus(ToAbsl(status));
          done();
        });
  }

 private:
  FusedApply<GpuDeviceTag, T, Rule, kVariant, Index> apply_;
};

// The kernel class of each GPU op: the asynchronous one for the sparse ops.
template <typename T, typename Rule, Variant kVariant, typename Index>
struct KernelFor<GpuDeviceTag, T, Rule, kVariant, Index> {
  using type = std::conditional_t<IsSparse(kVariant), FusedSparseApplyGpuOp<T, Rule, kVariant, Index>,
                                  FusedApplyOp<GpuDeviceTag, T, Rule, kVariant, Index>>;
};

}  // namespace tf
}  // namespace fusedopt
