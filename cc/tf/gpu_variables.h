// Variable access for the GPU kernels (built only with FUSEDOPT_CUDA).
//
// TF's helpers in training_op_helpers.h (MaybeLockVariableInputMutexesInOrder,
// GetInputTensorFromVariable) copy variables with functor::DenseUpdate<GPUDevice, T>,
// whose symbols exist only in TF's CUDA builds: a library that instantiates them fails
// to load in tensorflow-cpu. These are the same helpers with the same locking and
// copy-on-write/copy-on-read rules, copying with cudaMemcpyAsync on the op's stream
// (the core's CopyDeviceToDevice) instead, so the CUDA-built library loads everywhere.
#ifndef FUSEDOPT_CC_TF_GPU_VARIABLES_H_
#define FUSEDOPT_CC_TF_GPU_VARIABLES_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cc/core/gpu/engine_gpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "xla/stream_executor/stream.h"

// tsl::mutex is deprecated in favour of absl::Mutex, but it is what Var and the ref inputs
// hold (TF's own helpers use it too; their header is a system header, so it stays quiet).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

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

// TF's EnsureSparseVariableAccess with the copy on the GPU.
inline absl::Status EnsureSparseVariableAccessGpu(::tensorflow::OpKernelContext* ctx,
                                                  ::tensorflow::Var* var) {
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  tsl::mutex_lock ml(*var->mu());
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  if (!var->tensor()->RefCountIsOne()) {
    TF_RETURN_IF_ERROR(CopyTensorOnGpu(ctx, var->tensor()));
  }
  var->copy_on_read_mode.store(true);
  return absl::OkStatus();
}

// TF's MaybeLockVariableInputMutexesInOrder with the GPU copy above.
template <typename T>
::tensorflow::VariableInputLockHolder MaybeLockVariableInputMutexesInOrderGpu(
    ::tensorflow::OpKernelContext* ctx, bool do_lock, bool sparse,
    const std::vector<int>& input_ids) {
  using ::tensorflow::VariableInputLockHolder;
  bool any_resource = false;
  for (int i : input_ids) any_resource |= ctx->input_dtype(i) == ::tensorflow::DT_RESOURCE;
  if (!do_lock && !any_resource) return VariableInputLockHolder({}, {}, {});
  std::vector<::tensorflow::Var*> vars;
  std::vector<tsl::mutex*> mutexes;
  std::vector<int> acquire_order;
  for (int input : input_ids) {
    ::tensorflow::Var* var;
    // Device-independent template body: the CPU instantiation is the one TF ships.
    tsl::mutex* mutex =
        ::tensorflow::GetTrainingVariableMutex<Eigen::ThreadPoolDevice, T>(ctx, input, &var);
    if (var) vars.push_back(var);
    if (std::find(mutexes.begin(), mutexes.end(), mutex) == mutexes.end()) {
      acquire_order.push_back(static_cast<int>(mutexes.size()));
      mutexes.push_back(mutex);
    }
  }
  if (sparse) {
    // TF's helper CHECK-fails here; a failed copy (out of memory) is the op's error instead.
    for (::tensorflow::Var* var : vars) {
      const absl::Status status = EnsureSparseVariableAccessGpu(ctx, var);
      if (!status.ok()) {
        ctx->SetStatus(status);
        return VariableInputLockHolder({}, {}, {});
      }
    }
  }
  std::sort(acquire_order.begin(), acquire_order.end(),
            [&mutexes](int a, int b) { return mutexes[a] < mutexes[b]; });
  auto locks = std::make_unique<std::vector<tsl::mutex_lock>>();
  auto shared_locks = std::make_unique<std::vector<tsl::tf_shared_lock>>();
  locks->reserve(acquire_order.size());
  for (int acquire : acquire_order) {
    tsl::mutex* mu = mutexes[acquire];
    if (mu == nullptr) continue;
    if (!sparse || do_lock) {
      locks->emplace_back(*mu);
    } else {
      shared_locks->emplace_back(*mu);
    }
  }
  return VariableInputLockHolder(vars, std::move(locks), std::move(shared_locks));
}

// TF's GetInputTensorFromVariable with the GPU copy-on-write.
inline absl::Status GetInputTensorFromVariableGpu(::tensorflow::OpKernelContext* ctx, int input,
                                                  bool lock_held, bool sparse,
                                                  ::tensorflow::Tensor* out) {
  if (ctx->input_dtype(input) == ::tensorflow::DT_RESOURCE) {
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
    TF_RETURN_IF_ERROR(
        ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, input), &var));
    // The caller holds var's lock (MaybeLockVariableInputMutexesInOrderGpu): shared for sparse
    // updates without use_locking, else exclusive. (No mutex assertions: TF 2.15's tsl::mutex
    // has none.)
    if (sparse) {
      *out = *var->tensor();
      return absl::OkStatus();
    }
    if (var->copy_on_read_mode.load() || !var->tensor()->RefCountIsOne()) {
      TF_RETURN_IF_ERROR(CopyTensorOnGpu(ctx, var->tensor()));
    }
    *out = *var->tensor();
    return absl::OkStatus();
  }
  *out = ctx->mutable_input(input, lock_held);
  return absl::OkStatus();
}

}  // namespace tf
}  // namespace fusedopt

#pragma GCC diagnostic pop

#endif  // FUSEDOPT_CC_TF_GPU_VARIABLES_H_
