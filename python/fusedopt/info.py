"""``python -m fusedopt.info``: what this fusedopt build is and what it registers.

It prints every line it can. When TensorFlow, the op library or ``_core`` does not load,
that line says NOT LOADABLE, and the full error (the loader's message, which says what to
rebuild or install) follows the lines, on stderr; the exit status is then 1.
"""
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Tuple

import fusedopt
from fusedopt import _loader

__all__ = ["HUGE_PAGES_SETTING", "SEPARATION_SETTING", "transparent_huge_pages_mode",
           "huge_pages_available", "kernel_can_collapse", "huge_pages_status",
           "buffer_separation_status", "cpu_vector_status", "describe", "main"]


HUGE_PAGES_SETTING = "FUSEDOPT_HUGE_PAGES"


def transparent_huge_pages_mode() -> Optional[str]:
    """The kernel's transparent huge page mode ('always', 'madvise', 'never'), or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    chosen = [word[1:-1] for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else None


def huge_pages_available() -> bool:
    """Whether the kernel gives huge pages to memory that asks for them (THP not 'never')."""
    return transparent_huge_pages_mode() in ("always", "madvise")


def kernel_can_collapse() -> bool:
    """MADV_COLLAPSE exists from Linux 6.1."""
    try:
        major, minor = (int(part) for part in platform.release().split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 1)


def huge_pages_status() -> str:
    """One line: do the ops put big tables on huge pages (docs/guides/performance.md)?"""
    if os.environ.get(HUGE_PAGES_SETTING) == "0":
        return f"off ({HUGE_PAGES_SETTING}=0)"
    mode = transparent_huge_pages_mode()
    if not huge_pages_available():
        return f"unavailable (transparent huge pages: {mode or 'not in this kernel'})"
    collapse = ("collapsed once in a background thread" if kernel_can_collapse() else
                "collapsed by khugepaged, slowly (Linux < 6.1 has no MADV_COLLAPSE)")
    return (f"on (variables and slots of 32 MB or more: MADV_HUGEPAGE, {collapse}; THP mode "
            f"{mode}; {HUGE_PAGES_SETTING}=0 turns it off)")


SEPARATION_SETTING = "FUSEDOPT_SEPARATE_BUFFERS"


def buffer_separation_status() -> str:
    """One line: do the ops move variable/slot buffers the L1 cache cannot hold together?"""
    if os.environ.get(SEPARATION_SETTING) == "0":
        return f"off ({SEPARATION_SETTING}=0)"
    return ("on (CPU resource variables and slots of 1 MB or more whose addresses agree with "
            f"another of the update's buffers modulo 256 MB move once; {SEPARATION_SETTING}=0 "
            "turns it off)")


def cpu_vector_status() -> str:
    """One line: the vector instruction set of the CPU kernels' element loops."""
    try:
        from fusedopt import _core

        isa = _core.cpu_isa()
    except Exception:  # noqa: BLE001 - _core's own line reports why it does not load
        return "unknown (fusedopt._core does not load)"
    if isa == "avx2":
        return "avx2 (chosen at run time; FUSEDOPT_CPU_ISA=baseline for x86-64 SSE2)"
    forced = os.environ.get("FUSEDOPT_CPU_ISA") == "baseline"
    return "baseline (x86-64 SSE2%s)" % ("; FUSEDOPT_CPU_ISA=baseline" if forced else
                                          ": the CPU has no AVX2")


def xla_status(build_info):
    """One line: can the ops run inside XLA-compiled steps (``jit_compile=True``), and how."""
    if not build_info.get("xla", False):
        return ("no (built with FUSEDOPT_XLA=0: steps with jit_compile=True that contain the "
                "ops fail to compile)")
    try:
        from fusedopt import runtime

        lowering = runtime.xla_cpu_lowering()
    except Exception:  # noqa: BLE001 - TensorFlow's own line reports why it does not load
        return "yes"
    how = ("a custom call into the CPU engine" if lowering == "custom_call" else
           "the rules built as XLA operations")
    return f"yes (XLA:CPU: {how}; XLA:GPU: the rules built as XLA operations)"


def _one_line(error):
    return " ".join(str(error).split())


def _extension_status(name, errors):
    """'ok (path)' or why fusedopt.<name> does not import (a damaged file is refused)."""
    import importlib

    try:
        module = importlib.import_module("fusedopt." + name)
    except Exception as e:  # noqa: BLE001 - reported, not raised: that is this command's job
        errors.append((f"fusedopt.{name}", e))
        return "NOT LOADABLE: " + _one_line(e)
    return "ok (%s)" % module.__file__


def _registered_ops(errors):
    """{op name: [devices]} for the loaded library (every rule's ops, its group ops, and
    the member pack op), or None (the error appended)."""
    try:
        from tensorflow.python.framework import kernels

        from fusedopt.ops import ALL_VARIANTS, RULES, load_library, op_name

        load_library()
        names = [op_name(rule, variant) for rule in RULES for variant in ALL_VARIANTS]
        names.append("FusedOpt>VariablePack")
        return {name: sorted({k.device_type
                              for k in kernels.get_registered_kernels_for_op(name).kernel})
                for name in names}
    except Exception as e:  # noqa: BLE001 - ImportError from the loader, or TF's own errors
        errors.append(("fusedopt's op library", e))
        return None


def describe(errors: Optional[List[Tuple[str, Exception]]] = None) -> Dict[str, Any]:
    """A dict describing the build, the running TF and the registered kernels.

    Nothing that fails to load is raised: its entry says NOT LOADABLE, and the exception is
    appended to `errors` (a list of (what, exception)) when one is given.

    Args:
      errors: a list to append ``(what, exception)`` to for each part that does not load.

    Returns:
      ``{"fusedopt_version", "library", "op_library", "core_module",
      "built_against_tensorflow", "running_tensorflow", "build_system", "compiler",
      "cpu_kernels", "cuda_kernels", "huge_pages_for_tables", "cpu_vector_loops",
      "cache_aliased_buffers", "ops"}``: what ``python -m fusedopt.info`` prints.
    """
    errors = [] if errors is None else errors
    info = _loader.build_info()
    try:
        import tensorflow as tf

        running = tf.__version__
    except Exception as e:  # noqa: BLE001 - not installed, or broken
        errors.append(("TensorFlow", e))
        running = "NOT LOADABLE: " + _one_line(e)
    if errors:
        ops, library_status = None, "not loaded: TensorFlow does not import"
    else:
        ops = _registered_ops(errors)
        library_status = "ok" if ops is not None else "NOT LOADABLE: " + _one_line(errors[-1][1])
    all_devices = {d for devices in (ops or {}).values() for d in devices}
    return {
        "fusedopt_version": fusedopt.__version__,
        "library": _loader.library_path(),
        "op_library": library_status,
        "core_module": _extension_status("_core", errors),
        "built_against_tensorflow": info.get("tensorflow_version"),
        "running_tensorflow": running,
        "build_system": info.get("build_system"),
        "compiler": info.get("compiler"),
        "cpu_kernels": "CPU" in all_devices,
        "cuda_kernels": "GPU" in all_devices,
        "xla_kernels": xla_status(info),
        "huge_pages_for_tables": huge_pages_status(),
        "cpu_vector_loops": cpu_vector_status(),
        "cache_aliased_buffers": buffer_separation_status(),
        "ops": ops or {},
    }


def main() -> int:
    """Prints the description, then any load error in full; exit status 1 if there was one."""
    errors = []
    info = describe(errors)
    for key, value in info.items():
        if key != "ops":
            print(f"{key:26s} {value}")
    print(f"{'which_kernel':26s} fusedopt.explain(optimizer, variables) tells, per variable")
    print(f"ops ({len(info['ops'])}):")
    for name, devices in info["ops"].items():
        print(f"  {name:40s} {', '.join(devices)}")
    sys.stdout.flush()
    for what, error in errors:
        print(f"\n{what} does not load ({type(error).__name__}):\n{error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
