"""fusedopt: fused optimizer-update ops for TensorFlow.

``fusedopt.ops`` holds one wrapper per op (loading the op library on first use);
``fusedopt.keras`` / ``fusedopt.compat.v1`` the optimizer classes; ``fusedopt.estimator``
multi-tower Estimator training; ``fusedopt.reference`` the same rules in composed TF ops;
``fusedopt._core`` the TF-free kernels over NumPy arrays. ``python -m fusedopt.info``
describes the build.

``import fusedopt`` does not import TensorFlow: the subpackages above are imported on first
attribute access (``fusedopt.keras.LazyAdam`` works after a plain ``import fusedopt``).
"""
import importlib as _importlib

__version__ = "0.2.0"

__all__ = ["__version__", "ops", "keras", "compat", "estimator", "reference"]

from fusedopt import _loader
from fusedopt._warnings import FallbackWarning, FusedOptWarning, IgnoredOptionWarning

_loader.package_version = __version__
# fusedopt._core / _core_cuda are checked before Python dlopens them (a truncated file
# would crash the process with SIGBUS instead of raising ImportError).
_loader.install_import_check()

# PEP 562: subpackages imported when first used, so that `import fusedopt` stays cheap.
_LAZY_SUBMODULES = ("ops", "keras", "compat", "estimator", "reference")


def explain(optimizer, variables=None):
    """Which kernel updates each of `variables` under `optimizer`: a dense gradient, a sparse
    one (``tf.IndexedSlices``), the slots' dtype; ``print()`` it for a table. Reads the
    optimizer's settings only. `variables` may be left out for a built Keras 3 optimizer.
    Returns a ``fusedopt._explain.Explanation`` (``.fused``: every update runs fusedopt's ops).
    Imports TensorFlow."""
    return _importlib.import_module(f"{__name__}._explain").explain(optimizer, variables)


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
