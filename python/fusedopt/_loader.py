"""Finds and loads the op library once, with errors a user can act on."""
import json
import os
import threading

LIBRARY_NAME = "_fusedopt_ops.so"
REBUILD_COMMAND = "pip install --no-build-isolation --force-reinstall --no-deps ."

_lock = threading.Lock()
_library = None


def library_path():
    """$FUSEDOPT_OPS_LIBRARY if set (e.g. a Bazel output), else the one in the package."""
    return os.environ.get("FUSEDOPT_OPS_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def build_info(path=None):
    """What the library at `path` was built with (from _build_info.json beside it), or {}."""
    info_path = os.path.join(os.path.dirname(path or library_path()), "_build_info.json")
    try:
        with open(info_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _major_minor(version):
    return tuple(version.split(".")[:2])


def _mismatch_error(path, built, running, detail=""):
    built_for = (f"TensorFlow {built}" if built else
                 "another TensorFlow (unknown version: no _build_info.json beside it)")
    return ImportError(
        f"fusedopt's op library {path} was built for {built_for} "
        f"but TensorFlow {running} is running. A custom-op library only loads in the TensorFlow "
        f"it was compiled against; rebuild it in this environment with:\n    {REBUILD_COMMAND}"
        + (f"\n(loader said: {detail})" if detail else ""))


def load_library():
    """Loads the op library (once) and returns its generated op module."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            _library = _load()
    return _library


def _load():
    import tensorflow as tf

    path = library_path()
    if not os.path.exists(path):
        raise ImportError(f"fusedopt's op library is missing ({path}); build it with:\n"
                          f"    {REBUILD_COMMAND}")
    built = build_info(path).get("tensorflow_version")
    running = tf.__version__
    # Refuse before dlopen: a library built for another TF can fail in obscure ways.
    if built and _major_minor(built) != _major_minor(running):
        raise _mismatch_error(path, built, running)
    try:
        library = tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
        if "undefined symbol" in str(e):
            raise _mismatch_error(path, built, running, str(e).strip()) from e
        raise
    return library
