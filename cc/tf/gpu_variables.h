// What the GPU kernels need of TF (built only with FUSEDOPT_CUDA): the op's stream, scratch
// memory, and the variable copy of variable_access.h. TF's own copy,
// functor::DenseUpdate<GPUDevice, T>, exists only in TF's CUDA builds: a library that
// instantiated it would fail to load in tensorflow-cpu. This one is cudaMemcpyAsync on the
// op's stream (the core's CopyDeviceToDevice), so the CUDA-built library loads everywhere.
#pragma once

#include <vector>

#include "cc/core/gpu/engine_gpu.h"
#include "cc/tf/variable_access.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "xla/stream_executor/stream.h"

namespace fusedopt {
namespace tf {

// Template tag for the GPU kernels. Deliberately not Eigen::GpuDevice: nothing here may
// instantiate TF's GPU functors (see above).
struct GpuDeviceTag {};

inline absl::Status ToAbsl(const gpu::Status& s) {
  switch (s.code) {
    case gpu::Status::kOk:
      return absl::OkStatus();
    case gpu::Status::kInvalidArgument:
      return absl::InvalidArgumentError(s.message);
    case gpu::Status::kResourceExhausted:
      return absl::ResourceExhaustedError(s.message);
    default:
      return absl::InternalError(s.message);
  }
}

// The CUstream TF runs this kernel's work on.
inline gpu::Stream GpuStreamOf(::tensorflow::OpKernelContext* ctx) {
  const ::tensorflow::DeviceContext* device_context = ctx->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) return nullptr;
  return static_cast<gpu::Stream>(device_context->stream()->platform_specific_handle().stream);
}

// Scratch memory from TF's GPU allocator; the tensors live as long as this object (the
// kernel's Compute), and TF's stream-ordered allocator keeps them valid for the work
// already enqueued on the compute stream. A failed allocation keeps TF's status (out of
// memory: ResourceExhausted) for the kernel to report.
class TfGpuTempAllocator final : public gpu::TempAllocator {
 public:
  explicit TfGpuTempAllocator(::tensorflow::OpKernelContext* ctx) : ctx_(ctx) {}
  void* Allocate(size_t bytes) override {
    temps_.emplace_back();
    ::tensorflow::Tensor& t = temps_.back();
    const absl::Status s = ctx_->allocate_temp(
        ::tensorflow::DT_INT8, ::tensorflow::TensorShape({static_cast<int64_t>(bytes)}), &t);
    if (!s.ok()) {
      if (status_.ok()) status_ = s;
      return nullptr;
    }
    return const_cast<char*>(t.tensor_data().data());
  }
  const absl::Status& status() const { return status_; }

 private:
  ::tensorflow::OpKernelContext* ctx_;
  std::vector<::tensorflow::Tensor> temps_;
  absl::Status status_;
};

// *tensor = a fresh device copy of *tensor (TF's PrepareToUpdateVariable copy).
inline absl::Status CopyTensorOnGpu(::tensorflow::OpKernelContext* ctx,
                                    ::tensorflow::Tensor* tensor) {
  const gpu::Stream stream = GpuStreamOf(ctx);
  if (stream == nullptr) return absl::InternalError("fusedopt: no GPU stream to copy a variable on");
  ::tensorflow::Tensor tmp;
  tsl::AllocatorAttributes attr;
  attr.set_gpu_compatible(true);
  attr.set_nic_compatible(true);
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &tmp, attr));
  TF_RETURN_IF_ERROR(ToAbsl(gpu::CopyDeviceToDevice(
      const_cast<char*>(tmp.tensor_data().data()), tensor->tensor_data().data(),
      tensor->TotalBytes(), stream)));
  *tensor = tmp;
  return absl::OkStatus();
}

// The GPU's copy for variable_access.h.
template <>
struct VariableCopy<GpuDeviceTag> {
  static absl::Status Run(::tensorflow::OpKernelContext* ctx, ::tensorflow::Tensor* tensor) {
    return CopyTensorOnGpu(ctx, tensor);
  }
};

}  // namespace tf
}  // namespace fusedopt
