"""The one list of C++ sources. Bazel loads it; setup.py reads it with exec().

tests/test_build_config.py fails when a file under cc/ is missing from here.
"""

# Layer 1: TensorFlow-free core (rules + generic CPU engine). Header-only.
CORE_HDRS = [
    "cc/core/numeric.h",
    "cc/core/rule.h",
    "cc/core/executor.h",
    "cc/core/engine.h",
    "cc/core/coalesce.h",
    "cc/core/validate.h",
    "cc/core/rules/lazy_adam.h",
    "cc/core/rules/adamax.h",
    "cc/core/rules/adagrad.h",
    "cc/core/rules/all_rules.h",
]

# Layer 2: TensorFlow binding. One registration file per optimizer.
TF_HDRS = [
    "cc/tf/op_defs.h",
    "cc/tf/kernels.h",
]
TF_SRCS = [
    "cc/tf/lazy_adam.cc",
    "cc/tf/adamax.cc",
    "cc/tf/adagrad.cc",
]

# Layer 3: pybind11 module fusedopt._core over the same core.
PYBIND_SRCS = [
    "cc/pybind/core_module.cc",
]
