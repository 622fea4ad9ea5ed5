// Registration of every rule's ops and kernels: FUSEDOPT_REGISTER_OPTIMIZER(Rule), one
// line in the rule's own translation unit (cc/tf/<rule>.cc). The kernels: apply_kernel.h
// (the four single-variable ops), group_kernel.h (the group ops), apply_kernel_gpu.h (the
// asynchronous sparse GPU ops, FUSEDOPT_CUDA builds, whose GPU kernels use gpu_variables.h:
// no TF GPU functors, so the library still loads in tensorflow-cpu).
#pragma once

// Eigen::ThreadPoolDevice (CPUDevice, the CPU kernels' Device tag) in full.
#ifndef EIGEN_USE_THREADS
#define EIGEN_USE_THREADS
#endif

#include <string>
#include <vector>

#include "cc/tf/apply_kernel.h"
#include "cc/tf/group_kernel.h"
#include "cc/tf/op_defs.h"
#include "cc/tf/tf_types.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#ifdef FUSEDOPT_CUDA
#include "cc/tf/apply_kernel_gpu.h"
#endif

namespace fusedopt {
namespace tf {

// Registers one kernel for op `op` on `device` with the given type constraints.
template <typename Kernel>
void RegisterKernel(const std::string& op, const char* device, ::tensorflow::DataType type,
                    ::tensorflow::DataType index_type, bool sparse,
                    const std::vector<const char*>& host_memory_inputs) {
  ::tensorflow::KernelDefBuilder builder(op.c_str());
  builder.Device(device).TypeConstraint("T", type);
  if (sparse) builder.TypeConstraint("Tindices", index_type);
  for (const char* input : host_memory_inputs) builder.HostMemory(input);
  // The registrar's constructor does the registration; the object itself is inert.
  ::tensorflow::kernel_factory::OpKernelRegistrar(
      builder.Build(), "fusedopt::tf::FusedApplyOp",
      [](::tensorflow::OpKernelConstruction* ctx) -> ::tensorflow::OpKernel* {
        return new Kernel(ctx);
      });
}

// On GPU the scalar hyper-parameters and the rounding seed are host-memory inputs (read
// once by Prepare()).
template <typename Rule>
std::vector<const char*> HostMemoryInputs(const char* device) {
  if (std::string(device) == ::tensorflow::DEVICE_CPU) return {};
  std::vector<const char*> inputs(Rule::kHyper.begin(), Rule::kHyper.end());
  inputs.push_back(kRoundingSeedInput);
  return inputs;
}

// The four single-variable ops' kernels on `device` for dtype T (sparse: every index type).
template <typename Device, typename Rule, typename T>
void RegisterKernelsForType(const char* device) {
  const auto type = ::tensorflow::DataTypeToEnum<T>::value;
  const char* name = Rule::kOpName;
  const std::vector<const char*> host = HostMemoryInputs<Rule>(device);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kApply, int32_t>::type>(
      OpName(name, Variant::kApply), device, type, ::tensorflow::DT_INT32, false, host);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kResourceApply, int32_t>::type>(
      OpName(name, Variant::kResourceApply), device, type, ::tensorflow::DT_INT32, false, host);
  ForEachType(IndexTypes{}, [&](auto tag) {
    using Index = typename decltype(tag)::type;
    const auto index_type = ::tensorflow::DataTypeToEnum<Index>::value;
    RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kSparseApply, Index>::type>(
        OpName(name, Variant::kSparseApply), device, type, index_type, true, host);
    RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kResourceSparseApply, Index>::type>(
        OpName(name, Variant::kResourceSparseApply), device, type, index_type, true, host);
  });
}

// The group ops' kernels on `device` for dtype T.
template <typename Device, typename Rule, typename T>
void RegisterGroupKernel(const char* device) {
  const std::vector<const char*> host = HostMemoryInputs<Rule>(device);
  RegisterKernel<FusedGroupApplyOp<Device, T, Rule>>(
      GroupOpName(Rule::kOpName), device, ::tensorflow::DataTypeToEnum<T>::value,
      ::tensorflow::DT_INT32, /*sparse=*/false, host);
  RegisterKernel<FusedGroupApplyOp<Device, T, Rule, /*kPacked=*/true>>(
      PackedGroupOpName(Rule::kOpName), device, ::tensorflow::DataTypeToEnum<T>::value,
      ::tensorflow::DT_INT32, /*sparse=*/false, host);
}

template <typename Device, typename Rule, typename T>
void RegisterAllKernelsForType(const char* device) {
  RegisterKernelsForType<Device, Rule, T>(device);
  RegisterGroupKernel<Device, Rule, T>(device);
}

// The four ops of a rule and its group ops, with their kernels for every storage type
// (tf_types.h) and index type: on the CPU, and with FUSEDOPT_CUDA on the GPU too (inert
// without a GPU: TF only instantiates them for GPU devices).
template <typename Rule>
bool RegisterOptimizer() {
  for (Variant v : kAllVariants) RegisterOpDef<Rule>(v);
  RegisterGroupOpDef<Rule>(/*packed=*/false);
  RegisterGroupOpDef<Rule>(/*packed=*/true);
  ForEachType(StorageTypes{}, [](auto tag) {
    using T = typename decltype(tag)::type;
    RegisterAllKernelsForType<CPUDevice, Rule, T>(::tensorflow::DEVICE_CPU);
#ifdef FUSEDOPT_CUDA
    RegisterAllKernelsForType<GpuDeviceTag, Rule, T>(::tensorflow::DEVICE_GPU);
#endif
  });
  return true;
}

}  // namespace tf
}  // namespace fusedopt

// One line per optimizer, in its own translation unit (compile time and memory).
#define FUSEDOPT_REGISTER_OPTIMIZER(Rule) \
  static const bool fusedopt_registered_##Rule = ::fusedopt::tf::RegisterOptimizer<::fusedopt::Rule>()
