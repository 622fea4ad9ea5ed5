"""fusedopt: fused optimizer-update ops for TensorFlow.

``fusedopt.ops`` holds one wrapper per op (loading the op library on first use);
``fusedopt.reference`` the same rules in composed TF ops; ``fusedopt._core`` the
TF-free kernels over NumPy arrays. ``python -m fusedopt.info`` describes the build.
"""
__version__ = "0.1.0"
