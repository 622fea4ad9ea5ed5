// How the kernels reach the variables they update, on every device: TF's rules from
// training_op_helpers.h (locks taken in address order, shared for sparse updates without
// use_locking; copy-on-write when a read still holds the buffer; copy-on-read mode for
// sparse updates), with the copy made here instead of by TF's functor::DenseUpdate:
//  - on the CPU TF's copy CHECK-fails, aborting the process, when the buffer is not
//    64-byte aligned, as a variable adopting NumPy memory through DLPack is (NumPy
//    aligns large arrays to 16 bytes); a plain copy needs no alignment;
//  - on the GPU its symbols exist only in TF's CUDA builds (gpu_variables.h).
// A device's copy is VariableCopy<Device>::Run: the CPU's below, the GPU's in
// gpu_variables.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/tf/cpu_executor.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/kernels/training_op_helpers.h"  // VariableInputLockHolder

// tsl::mutex is deprecated in favour of absl::Mutex, but it is what Var and the ref inputs
// hold (TF's own helpers use it too; their header is a system header, so it stays quiet).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace fusedopt {
namespace tf {

using CPUDevice = Eigen::ThreadPoolDevice;

// VariableCopy<Device>::Run(ctx, tensor): *tensor = a fresh copy of it, values unchanged.
template <typename Device>
struct VariableCopy;

template <>
struct VariableCopy<CPUDevice> {
  static absl::Status Run(::tensorflow::OpKernelContext* ctx, ::tensorflow::Tensor* tensor) {
    if (!::tensorflow::DataTypeCanUseMemcpy(tensor->dtype())) {
      return absl::InvalidArgumentError("fusedopt cannot copy a variable of dtype " +
                                        ::tensorflow::DataTypeString(tensor->dtype()));
    }
    ::tensorflow::Tensor copy;
    ::tensorflow::AllocatorAttributes attr;  // as TF's copy asks
    attr.set_gpu_compatible(true);
    attr.set_nic_compatible(true);
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy, attr));
    const char* from = tensor->tensor_data().data();
    char* to = const_cast<char*>(copy.tensor_data().data());
    const int64_t bytes = static_cast<int64_t>(tensor->tensor_data().size());
    // A table of gigabytes is copied by every pool thread, as TF's Eigen copy is.
    constexpr int64_t kBlock = int64_t{1} << 16;
    TfCpuExecutor executor(ctx);
    executor.ParallelFor((bytes + kBlock - 1) / kBlock, kBlock / 4,
                         [&](int64_t first, int64_t last) {
                           const int64_t begin = first * kBlock;
                           const int64_t end = std::min(bytes, last * kBlock);
                           std::memcpy(to + begin, from + begin, static_cast<size_t>(end - begin));
                         });
    *tensor = copy;
    return absl::OkStatus();
  }
};

// TF's PrepareToUpdateVariable: the buffer is copied when a read may still hold it.
template <typename Device>
absl::Status PrepareToUpdate(::tensorflow::OpKernelContext* ctx, ::tensorflow::Tensor* tensor,
                             bool copy_on_read_mode) {
  if (copy_on_read_mode || !tensor->RefCountIsOne()) {
    return VariableCopy<Device>::Run(ctx, tensor);
  }
  return absl::OkStatus();
}

// TF's EnsureSparseVariableAccess: switches the variable to copy-on-read mode (reads copy,
// so sparse updates may write in place under a shared lock), copying it first when a read
// still holds its buffer.
template <typename Device>
absl::Status EnsureCopyOnReadMode(::tensorflow::OpKernelContext* ctx, ::tensorflow::Var* var) {
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  tsl::mutex_lock ml(*var->mu());
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  if (!var->tensor()->RefCountIsOne()) {
    TF_RETURN_IF_ERROR(VariableCopy<Device>::Run(ctx, var->tensor()));
  }
  var->copy_on_read_mode.store(true);
  return absl::OkStatus();
}

// TF's MaybeLockVariableInputMutexesInOrder. Where TF ignores a failed copy (out of
// memory) this sets it as the op's status; the caller checks ctx->status().
template <typename Device, typename T>
::tensorflow::VariableInputLockHolder LockVariableInputs(::tensorflow::OpKernelContext* ctx,
                                                         bool do_lock, bool sparse,
                                                         const std::vector<int>& input_ids) {
  using ::tensorflow::VariableInputLockHolder;
  bool any_resource = false;
  for (int i : input_ids) any_resource |= ctx->input_dtype(i) == ::tensorflow::DT_RESOURCE;
  if (!do_lock && !any_resource) return VariableInputLockHolder({}, {}, {});
  std::vector<::tensorflow::Var*> vars;  // each with a reference the holder gives back
  std::vector<tsl::mutex*> mutexes;
  std::vector<int> acquire_order;
  for (int input : input_ids) {
    ::tensorflow::Var* var;
    // Device-independent template body: the CPU instantiation is the one TF ships.
    tsl::mutex* mutex = ::tensorflow::GetTrainingVariableMutex<CPUDevice, T>(ctx, input, &var);
    if (var) vars.push_back(var);
    if (std::find(mutexes.begin(), mutexes.end(), mutex) == mutexes.end()) {
      acquire_order.push_back(static_cast<int>(mutexes.size()));
      mutexes.push_back(mutex);
    }
  }
  auto locks = std::make_unique<std::vector<tsl::mutex_lock>>();
  auto shared_locks = std::make_unique<std::vector<tsl::tf_shared_lock>>();
  if (sparse) {
    for (::tensorflow::Var* var : vars) {
      const absl::Status status = EnsureCopyOnReadMode<Device>(ctx, var);
      if (!status.ok()) {
        ctx->SetStatus(status);
        return VariableInputLockHolder(std::move(vars), std::move(locks), std::move(shared_locks));
      }
    }
  }
  std::sort(acquire_order.begin(), acquire_order.end(),
            [&mutexes](int a, int b) { return mutexes[a] < mutexes[b]; });
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
  return VariableInputLockHolder(std::move(vars), std::move(locks), std::move(shared_locks));
}

// TF's GetInputTensorFromVariable: the tensor to update (the caller holds the variable's
// lock as LockVariableInputs took it), copied first when a dense update needs it.
template <typename Device>
absl::Status VariableForUpdate(::tensorflow::OpKernelContext* ctx, int input, bool lock_held,
                               bool sparse, ::tensorflow::Tensor* out) {
  if (ctx->input_dtype(input) == ::tensorflow::DT_RESOURCE) {
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
    TF_RETURN_IF_ERROR(
        ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, input), &var));
    if (!sparse) {
      TF_RETURN_IF_ERROR(
          PrepareToUpdate<Device>(ctx, var->tensor(), var->copy_on_read_mode.load()));
    }
    *out = *var->tensor();
    return absl::OkStatus();
  }
  *out = ctx->mutable_input(input, lock_held);
  return absl::OkStatus();
}

// TF's allocators align every buffer (to 64 bytes); memory adopted from outside TF
// (DLPack) need not be aligned even to its elements, which the engines' loads (every load
// on the GPU) assume. Such a buffer is refused before anything is written.
inline absl::Status RequireElementAligned(const std::string& name, const ::tensorflow::Tensor& t) {
  const int64_t size = ::tensorflow::DataTypeSize(t.dtype());
  const auto address = reinterpret_cast<uintptr_t>(t.tensor_data().data());
  if (size <= 1 || address % static_cast<uintptr_t>(size) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      name + " is in memory not aligned to its " + std::to_string(size) + "-byte " +
      ::tensorflow::DataTypeString(t.dtype()) +
      " elements (adopted from outside TensorFlow, e.g. through DLPack?)");
}

}  // namespace tf
}  // namespace fusedopt

#pragma GCC diagnostic pop
