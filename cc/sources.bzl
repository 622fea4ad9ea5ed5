"""The one list of C++ sources. Bazel loads it; setup.py reads it with exec().

tests/build/test_build_config.py fails when a file under cc/ is missing from here.
"""

# Layer 1: TensorFlow-free core (rules + generic CPU engine). Header-only.
CORE_HDRS = [
    "cc/core/numeric.h",
    "cc/core/rule.h",
    "cc/core/executor.h",
    "cc/core/engine.h",
    "cc/core/huge_pages.h",
    "cc/core/cache_alias.h",
    "cc/core/cpu_isa.h",
    "cc/core/coalesce.h",
    "cc/core/sum_order.h",
    "cc/core/row_sum.h",
    "cc/core/validate.h",
    "cc/core/rules/lazy_adam.h",
    "cc/core/rules/adamax.h",
    "cc/core/rules/adagrad.h",
    "cc/core/rules/rms_prop.h",
    "cc/core/rules/row_wise_adagrad.h",
    "cc/core/rules/partial_row_wise_adam.h",
    "cc/core/rules/all_rules.h",
]

# Layer 1, CUDA (opt-in: FUSEDOPT_CUDA=1 pip install / bazel --config=cuda). TF-free: the
# same rules as CUDA kernels. GPU_HDRS are host-includable; GPU_CUDA_HDRS nvcc-only.
# GPU_SRCS are compiled by nvcc: every rule's kernels (engine_gpu_kernels.cuh) instantiated
# over three files, split by (var, slot) type pair so that they compile in parallel, and the
# rule-independent CUB part.
GPU_HDRS = [
    "cc/core/gpu/engine_gpu.h",
]
GPU_CUDA_HDRS = [
    "cc/core/gpu/gpu_common.cuh",
    "cc/core/gpu/engine_gpu_kernels.cuh",
]
GPU_SRCS = [
    "cc/core/gpu/engine_gpu_wide.cu.cc",
    "cc/core/gpu/engine_gpu_half.cu.cc",
    "cc/core/gpu/engine_gpu_bfloat16.cu.cc",
    "cc/core/gpu/coalesce_gpu.cu.cc",
]

# Layer 2: TensorFlow binding. One registration file per optimizer.
TF_HDRS = [
    "cc/tf/op_defs.h",
    "cc/tf/tf_types.h",
    "cc/tf/kernels.h",
    "cc/tf/apply_kernel.h",
    "cc/tf/group_kernel.h",
    "cc/tf/kernel_common.h",
    "cc/tf/device_engine.h",
    "cc/tf/cpu_executor.h",
    "cc/tf/variable_access.h",
    "cc/tf/separate_buffers.h",
    "cc/tf/variable_pack.h",
    "cc/tf/gpu_variables.h",  # these three used only with FUSEDOPT_CUDA
    "cc/tf/device_engine_gpu.h",
    "cc/tf/apply_kernel_gpu.h",
]
TF_SRCS = [
    "cc/tf/lazy_adam.cc",
    "cc/tf/adamax.cc",
    "cc/tf/adagrad.cc",
    "cc/tf/rms_prop.cc",
    "cc/tf/centered_rms_prop.cc",
    "cc/tf/row_wise_adagrad.cc",
    "cc/tf/partial_row_wise_adam.cc",
    "cc/tf/runtime_info.cc",
    "cc/tf/variable_pack.cc",
]

# Layer 2, XLA: kernels for the resource ops inside jit_compile (HLO from the rules through
# xla_value.h; on XLA:CPU a custom call into the CPU engine). One translation unit for all
# rules: XLA's headers are slow to compile. Links libtensorflow_cc.so.2; needs Debian's
# libhighwayhash-dev and libfarmhash-dev headers (tools/install_system_deps.sh).
XLA_HDRS = [
    "cc/tf/xla_value.h",
    "cc/tf/xla_common.h",
    "cc/tf/xla_hlo.h",
    "cc/tf/xla_op_kernels.h",
    "cc/tf/xla_ffi_handler.h",
]
XLA_SRCS = [
    "cc/tf/xla_kernels.cc",
]

# Layer 3: pybind11 module fusedopt._core over the same core.
PYBIND_HDRS = [
    "cc/pybind/common.h",
    "cc/pybind/bandwidth.h",
    "cc/pybind/sparse_floor.h",
    "cc/pybind/cuda_arrays.h",  # these two: _core_cuda only
    "cc/pybind/cuda_checks.h",
]
PYBIND_SRCS = [
    "cc/pybind/core_module.cc",
]

# fusedopt._core_cuda: the CUDA engine on device arrays (CUDA builds and tools/gpu_check.sh).
PYBIND_CUDA_SRCS = [
    "cc/pybind/core_cuda_module.cc",
]

# Linked into the setup.py builds' libraries (op library, _core) on x86-64 Linux, with
# abi_floor.h force-included: the wheel needs no newer glibc/libstdc++ than TensorFlow's
# own wheel (manylinux_2_27 for TF 2.21). FUSEDOPT_ABI_FLOOR=0 builds without them.
ABI_FLOOR_HDRS = [
    "cc/compat/abi_floor.h",
]
ABI_FLOOR_SRCS = [
    "cc/compat/abi_floor.cc",
]
