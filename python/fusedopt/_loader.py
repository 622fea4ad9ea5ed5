"""Finds and loads the op library once, with errors a user can act on.

Every native library of the package (the op library, ``_core``, ``_core_cuda``) is
checked before it is dlopen'ed: a truncated file (an interrupted copy, a full disk) is
mapped anyway and the process dies of SIGBUS on the first touch of a missing page, so
a damaged, empty or foreign file must become an ImportError first. The checks: a
regular, non-empty 64-bit ELF shared object whose headers and loadable segments lie
inside the file, and, when ``_build_info.json`` beside it records the file, the size
and sha256 the build wrote.
"""
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import struct
import sys
import threading
from typing import Any, Dict, Optional

__all__ = ["LIBRARY_NAME", "REBUILD_COMMAND", "BAZEL_REBUILD_COMMAND", "EXTENSIONS",
           "library_path", "build_info", "library_record", "rebuild_hint", "library_problem",
           "recorded", "check_library", "tensorflow_distribution", "wheel_name",
           "tensorflow_requirement", "load_library", "install_import_check"]

LIBRARY_NAME = "_fusedopt_ops.so"
REBUILD_COMMAND = "pip install --no-build-isolation --force-reinstall --no-deps ."
BAZEL_REBUILD_COMMAND = "tools/bazel_build.sh /path/to/venv/bin/python"
# Extension modules checked by the import hook below.
EXTENSIONS = ("fusedopt._core", "fusedopt._core_cuda")

_lock = threading.Lock()
_library = None
# The package's release, set by fusedopt/__init__.py (this module imports nothing of the
# package: it sits below everything, and setup.py loads it by path).
package_version = "0"


def library_path() -> str:
    """$FUSEDOPT_OPS_LIBRARY if set (e.g. a Bazel output), else the one in the package."""
    return os.environ.get("FUSEDOPT_OPS_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def build_info(path: Optional[str] = None) -> Dict[str, Any]:
    """What the library at `path` was built with (from _build_info.json beside it), or {}."""
    info_path = os.path.join(os.path.dirname(path or library_path()), "_build_info.json")
    try:
        with open(info_path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def library_record(path: str) -> Dict[str, Any]:
    """{"size", "sha256"} of a built library, as the builds record it in _build_info.json."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"size": os.path.getsize(path), "sha256": digest.hexdigest()}


def rebuild_hint(info: Dict[str, Any]) -> str:
    hint = f"rebuild it in this environment with:\n    {REBUILD_COMMAND}"
    if info.get("build_system") == "bazel":
        hint += f"\n(or, for this Bazel build: {BAZEL_REBUILD_COMMAND})"
    return hint


_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr, little-endian
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr
_PT_LOAD, _ET_DYN = 1, 3


def _elf_problem(f, size):
    """Why the open file `f` of `size` bytes is no complete 64-bit ELF shared object."""
    header = f.read(_ELF_HEADER.size)
    if len(header) < 4 or header[:4] != b"\x7fELF":
        return "is not a shared library (no ELF header)"
    if len(header) < _ELF_HEADER.size:
        return f"is truncated ({size} bytes: not even a whole ELF header)"
    (ident, e_type, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize,
     shnum, _) = _ELF_HEADER.unpack(header)
    if ident[4] != 2 or ident[5] != 1:
        return "is not a 64-bit little-endian ELF file"
    if e_type != _ET_DYN:
        return "is an ELF file but not a shared library"
    need = max(phoff + phnum * phentsize, shoff + shnum * shentsize if shoff else 0)
    if phoff + phnum * phentsize <= size and phentsize >= _PROGRAM_HEADER.size:
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, offset, _, _, filesz, _, _ = _PROGRAM_HEADER.unpack(
                f.read(_PROGRAM_HEADER.size))
            if p_type == _PT_LOAD:
                need = max(need, offset + filesz)
    if need > size:
        return f"is truncated ({size} bytes; its ELF headers need at least {need})"
    return None


def library_problem(path: str, record: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """Why the native library at `path` must not be loaded (a phrase), or None.

    `record`: {"size", "sha256"} from the build, checked when given.
    """
    if not os.path.exists(path):
        return "is missing"
    if not os.path.isfile(path):
        return "is not a regular file"
    try:
        size = os.path.getsize(path)
        if size == 0:
            return "is empty (0 bytes)"
        with open(path, "rb") as f:
            problem = _elf_problem(f, size)
        if problem:
            return problem
        if record:
            if size != record.get("size"):
                return f"is {size} bytes but the build wrote {record.get('size')}"
            if library_record(path)["sha256"] != record.get("sha256"):
                return ("differs from the file the build wrote (sha256 mismatch: modified or "
                        "partly overwritten)")
    except (OSError, struct.error) as e:
        return f"cannot be read ({e})"
    return None


def recorded(path: str, info: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The build's {"size", "sha256"} for the library at `path`, or None if not recorded."""
    info = build_info(path) if info is None else info
    libraries = info.get("libraries")
    record = libraries.get(os.path.basename(path)) if isinstance(libraries, dict) else None
    return record if isinstance(record, dict) else None


def check_library(path: str, what: str) -> None:
    """Raises ImportError (naming the file, the problem and the rebuild command) unless the
    library at `path` is safe to dlopen."""
    info = build_info(path)
    problem = library_problem(path, recorded(path, info))
    if problem:
        raise ImportError(f"{what} {path} {problem}; {rebuild_hint(info)}", path=path)


def _major_minor(version):
    return tuple(str(version).split(".")[:2])


# Distributions that install the `tensorflow` package, most common first.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-intel",
                            "tensorflow-macos", "tf-nightly-cpu", "tf-nightly")


def tensorflow_distribution(tf_version: str) -> str:
    """The installed distribution whose version is `tf_version` (the running `tensorflow`
    package's), e.g. "tensorflow-cpu"; "tensorflow" when none is found."""
    import importlib.metadata

    for name in TENSORFLOW_DISTRIBUTIONS:
        try:
            if importlib.metadata.version(name) == tf_version:
                return name
        except importlib.metadata.PackageNotFoundError:
            pass
    return "tensorflow"


def wheel_name(tf_version: str, distribution: str) -> str:
    """The distribution name of fusedopt's wheel for a TensorFlow: ``fusedopt-tf2.21`` pins
    `tensorflow`, ``fusedopt-tf2.21-cpu`` pins `tensorflow-cpu` (tools/build_wheel.sh).

    One name per TensorFlow minor and distribution, each with fusedopt's own version: a
    public index takes neither a local version label (``0.2.0+tf2.21``) nor two wheels of one
    name and version that differ only in their pin, and ``pip install -U`` of such a name
    upgrades fusedopt without ever moving TensorFlow to another minor."""
    major, minor = _major_minor(tf_version)
    return f"fusedopt-tf{major}.{minor}" + ("-cpu" if distribution == "tensorflow-cpu" else "")


def tensorflow_requirement(tf_version: str, distribution: str) -> str:
    """The requirement a wheel built against `tf_version` pins: that minor of `distribution`."""
    major, minor = (int(x) for x in _major_minor(tf_version))
    return f"{distribution}>={major}.{minor}.0,<{major}.{minor + 1}"


def _wheel_hint(running):
    """'pip install fusedopt==<the wheel for the running TensorFlow>' (a line)."""
    name = wheel_name(running, tensorflow_distribution(running))
    major_minor = ".".join(_major_minor(running))
    return (f"or install fusedopt's wheel for TensorFlow {major_minor}:\n"
            f"    pip install {name}=={package_version}\n"
            f"(tools/build_wheel.sh builds it in an environment with TensorFlow {major_minor})")


def _mismatch_error(path, built, running, detail=""):
    built_for = (f"TensorFlow {built}" if built else
                 "another TensorFlow (unknown version: no _build_info.json beside it)")
    return ImportError(
        f"fusedopt's op library {path} was built for {built_for} "
        f"but TensorFlow {running} is running. A custom-op library only loads in the TensorFlow "
        f"it was compiled against; rebuild it in this environment with:\n    {REBUILD_COMMAND}\n"
        + _wheel_hint(running)
        + (f"\n(loader said: {detail})" if detail else ""))


def load_library() -> Any:
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
    check_library(path, "fusedopt's op library")
    built = build_info(path).get("tensorflow_version")
    running = tf.__version__
    # Refuse before dlopen: a library built for another TF can fail in obscure ways.
    if built and _major_minor(built) != _major_minor(running):
        raise _mismatch_error(path, built, running)
    try:
        library = tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
        if "undefined symbol" not in str(e):
            raise
        if built:  # built for this TensorFlow: a symbol it does not export, not a mismatch
            raise ImportError(
                f"fusedopt's op library {path} was built for TensorFlow {built} and does not "
                f"load in TensorFlow {running}: it needs a symbol that TensorFlow does not "
                f"export (not a version mismatch). Please report "
                f"it with `python -m fusedopt.info`'s output.\n(loader said: {str(e).strip()})"
            ) from e
        raise _mismatch_error(path, built, running, str(e).strip()) from e
    return library


class _CheckedExtensionFinder(importlib.abc.MetaPathFinder):
    """Finds fusedopt's extension modules as Python would, then checks the file before
    Python dlopens it (see the module docstring)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in EXTENSIONS:
            return None
        what = f"fusedopt's extension module {fullname}:"
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            check_library(spec.origin, what)
        elif spec is None:
            # Python skips a non-file where the module should be; say what is there.
            base = fullname.rpartition(".")[2]
            for folder in path or ():
                for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                    candidate = os.path.join(folder, base + suffix)
                    if os.path.lexists(candidate):
                        check_library(candidate, what)
        return spec


def install_import_check() -> None:
    """Puts the extension check in front of Python's own finders (once)."""
    if not any(isinstance(f, _CheckedExtensionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckedExtensionFinder())
