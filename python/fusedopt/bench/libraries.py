"""The libraries contenders come from, each imported on demand: None where not installed.

Every contender names one of these loaders (``contenders.py``), so a missing optional
library drops its contenders instead of failing the run.
"""
import importlib
import warnings

from fusedopt.bench.config import THREADS


def _optional(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def tensorflow():
    return importlib.import_module("tensorflow")


def torch():
    module = _optional("torch")
    if module is not None:
        module.set_num_threads(THREADS)
    return module


def tf_keras():
    return _optional("tf_keras")


def tensorflow_addons():
    with warnings.catch_warnings():  # its end-of-life notice
        warnings.simplefilter("ignore")
        return _optional("tensorflow_addons")


def fusedopt_keras():
    return _optional("fusedopt.keras")


def fusedopt_legacy():
    """fusedopt.keras.legacy, where its Keras 2 (tf_keras, or tf.keras on TF 2.15) exists."""
    try:
        return importlib.import_module("fusedopt.keras.legacy")
    except ImportError:
        return None


def missing_peers(tf_version):
    """The libraries the benchmark would also compare with that are not installed here,
    each with how to install it, in plain words (printed once at the start)."""
    minor = ".".join(tf_version.split(".")[:2])
    out = []
    if torch() is None:
        out.append("PyTorch (pip install torch)")
    if tf_keras() is None:
        out.append(f"Keras 2's optimizers (pip install --no-deps tf-keras=={minor}.*)")
    if tuple(int(x) for x in tf_version.split(".")[:2]) > (2, 15):
        out.append("tensorflow-addons' LazyAdam (it needs TensorFlow 2.15 or older)")
    elif tensorflow_addons() is None:
        out.append("tensorflow-addons' LazyAdam (pip install tensorflow-addons)")
    return out
