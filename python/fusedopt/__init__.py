"""fusedopt: fused optimizer-update ops for TensorFlow.

``fusedopt.ops`` holds one wrapper per op (loading the op library on first use);
``fusedopt.keras`` / ``fusedopt.compat.v1`` the optimizer classes; ``fusedopt.estimator``
multi-tower Estimator training; ``fusedopt.reference`` the same rules in composed TF ops;
``fusedopt._core`` the TF-free kernels over NumPy arrays. ``fusedopt.explain`` says which
kernel updates each variable; ``python -m fusedopt.info`` describes the build. Warnings
fusedopt gives have categories of their own (``FusedOptWarning`` and its subclasses).

``import fusedopt`` does not import TensorFlow: the subpackages above are imported on first
attribute access (``fusedopt.keras.LazyAdam`` works after a plain ``import fusedopt``).
"""
import importlib as _importlib

__version__ = "0.2.0"

__all__ = ["__version__", "ops", "keras", "compat", "estimator", "reference", "explain",
           "Explanation", "VariableRoute", "FusedOptWarning", "FallbackWarning",
           "IgnoredOptionWarning"]

from fusedopt import _loader
from fusedopt._warnings import FallbackWarning, FusedOptWarning, IgnoredOptionWarning

_loader.package_version = __version__
# fusedopt._core / _core_cuda are checked before Python dlopens them (a truncated file
# would crash the process with SIGBUS instead of raising ImportError).
_loader.install_import_check()

# PEP 562: subpackages imported when first used, so that `import fusedopt` stays cheap.
_LAZY_SUBMODULES = ("ops", "keras", "compat", "estimator", "reference")


# fusedopt.explain and its result types live in fusedopt._explain (which imports the rest of
# the package when called): fetched on first use, as the subpackages are.
_FROM_EXPLAIN = ("explain", "Explanation", "VariableRoute")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    if name in _FROM_EXPLAIN:
        return getattr(_importlib.import_module(f"{__name__}._explain"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
