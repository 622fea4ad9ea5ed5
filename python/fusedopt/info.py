"""``python -m fusedopt.info``: what this fusedopt build is and what it registers."""
import os
import platform
import sys

import fusedopt
from fusedopt import _loader


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def huge_pages_available():
    """Whether glibc's malloc can be told to back big allocations with transparent huge
    pages (THP not 'never', glibc >= 2.35). TensorFlow's CPU allocator uses malloc."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return False
    except OSError:
        return False
    libc, version = platform.libc_ver()
    try:
        return libc == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
    except ValueError:
        return False


def huge_pages_status():
    """One line: are big tables of this process on huge pages (see README, Performance)?"""
    if not huge_pages_available():
        return "unavailable (needs glibc >= 2.35 and transparent huge pages not 'never')"
    if HUGE_PAGES_TUNABLE in os.environ.get("GLIBC_TUNABLES", ""):
        return f"on (GLIBC_TUNABLES={HUGE_PAGES_TUNABLE})"
    return f"off (start with GLIBC_TUNABLES={HUGE_PAGES_TUNABLE} for tables of millions of rows)"


def _extension_status(name):
    """'ok (path)' or why fusedopt.<name> does not import (a damaged file is refused)."""
    import importlib

    try:
        module = importlib.import_module("fusedopt." + name)
    except ImportError as e:
        return "NOT LOADABLE: " + " ".join(str(e).split())
    return "ok (%s)" % module.__file__


def describe():
    """A dict describing the build, the running TF and the registered kernels.

    A library that cannot be loaded is reported (``op_library``: why), not raised."""
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    try:
        from fusedopt import ops as fused_ops  # loads the op library (and reads _core's rules)
        library_status = "ok"
    except ImportError as e:
        library_status = "NOT LOADABLE: " + " ".join(str(e).split())
    ops = {}
    if library_status == "ok":
        for rule in fused_ops.RULES:
            for variant in fused_ops.VARIANTS:
                name = fused_ops.op_name(rule, variant)
                devices = sorted({k.device_type
                                  for k in kernels.get_registered_kernels_for_op(name).kernel})
                ops[name] = devices
    all_devices = {d for devices in ops.values() for d in devices}
    info = _loader.build_info()
    return {
        "fusedopt_version": fusedopt.__version__,
        "library": _loader.library_path(),
        "op_library": library_status,
        "core_module": _extension_status("_core"),
        "built_against_tensorflow": info.get("tensorflow_version"),
        "running_tensorflow": tf.__version__,
        "build_system": info.get("build_system"),
        "compiler": info.get("compiler"),
        "cpu_kernels": "CPU" in all_devices,
        "cuda_kernels": "GPU" in all_devices,
        "huge_pages_for_tables": huge_pages_status(),
        "ops": ops,
    }


def main():
    """Prints the description; exit status 1 when the op library or _core does not load."""
    info = describe()
    for key, value in info.items():
        if key != "ops":
            print(f"{key:26s} {value}")
    print(f"ops ({len(info['ops'])}):")
    for name, devices in info["ops"].items():
        print(f"  {name:40s} {', '.join(devices)}")
    return 0 if info["op_library"] == "ok" and info["core_module"].startswith("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
