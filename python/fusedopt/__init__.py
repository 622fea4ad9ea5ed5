"""fusedopt: fused optimizer-update ops for TensorFlow.

``fusedopt.ops`` holds one wrapper per op (loading the op library on first use);
``fusedopt.reference`` the same rules in composed TF ops; ``fusedopt._core`` the
TF-free kernels over NumPy arrays. ``python -m fusedopt.info`` describes the build.
"""
__version__ = "0.1.0"

from fusedopt import _loader

# fusedopt._core / _core_cuda are checked before Python dlopens them (a truncated file
# would crash the process with SIGBUS instead of raising ImportError).
_loader.install_import_check()
