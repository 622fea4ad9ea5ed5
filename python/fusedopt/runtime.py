"""What the loaded op library reports about itself at run time.

Counters of the CPU kernels' memory work (huge pages, buffer separation), the vector
instruction set their element loops picked, and how the resource ops lower under XLA.
Each counter function reads the library TensorFlow loaded (the same handle: the same
counters) through one ctypes call. ``python -m fusedopt.info`` prints them.
"""
import ctypes
import os
from typing import Dict, Union

import tensorflow as tf

from fusedopt import _loader

__all__ = ["HUGE_PAGE_STATS", "SEPARATION_STATS", "huge_page_stats", "buffer_separation_stats",
           "cpu_isa", "xla_cpu_lowering"]

HUGE_PAGE_STATS = ("enabled", "advised_calls", "collapsed_buffers", "collapsed_bytes",
                   "collapse_failures", "pending_bytes")
SEPARATION_STATS = ("enabled", "moved_buffers", "moved_bytes", "failures")


def _library():
    _loader.load_library()  # TF's load first: ctypes then gets the same handle
    return ctypes.CDLL(_loader.library_path())


def _counters(symbol, names):
    """{name: int64} from the library's `symbol(int64_t* out)`; ``enabled`` as a bool."""
    values = (ctypes.c_int64 * len(names))()
    getattr(_library(), symbol)(values)
    stats = dict(zip(names, values))
    stats["enabled"] = bool(stats["enabled"])
    return stats


def huge_page_stats() -> Dict[str, Union[int, bool]]:
    """What the op library's CPU kernels did about huge pages (cc/core/huge_pages.h): for
    variables and slots of 32 MB or more they advise transparent huge pages and collapse
    the buffer to huge pages once, in a background thread. ``enabled`` is False with
    ``FUSEDOPT_HUGE_PAGES=0``. ``collapsed_bytes`` grows while that thread works;
    ``pending_bytes`` is what it still has to do."""
    return _counters("fusedopt_huge_page_stats", HUGE_PAGE_STATS)


def buffer_separation_stats() -> Dict[str, Union[int, bool]]:
    """Variable and slot buffers (1 MB or more) the CPU kernels moved because the L1 cache
    could not hold them beside another buffer of the same update (cc/core/cache_alias.h):
    addresses equal modulo 256 MB, as TF's allocator places equal-size large tensors, evict
    each other on AMD Zen cores (a step several times slower). Each is moved once, its
    values copied unchanged. ``enabled`` is False with ``FUSEDOPT_SEPARATE_BUFFERS=0``;
    ``failures`` counts buffers left where they were (no memory for the copy)."""
    return _counters("fusedopt_separation_stats", SEPARATION_STATS)


def cpu_isa() -> str:
    """The vector instruction set of the op library's CPU element loops: ``"avx2"`` where
    the CPU has it, else ``"baseline"`` (x86-64 SSE2; also with ``FUSEDOPT_CPU_ISA=baseline``).
    Results are bit-identical either way (the same operations per element, no FMA)."""
    library = _library()
    library.fusedopt_cpu_isa.restype = ctypes.c_char_p
    return library.fusedopt_cpu_isa().decode()


def xla_cpu_lowering() -> str:
    """How the resource ops run inside XLA-compiled steps on the CPU: "custom_call" (the CPU
    engine itself, called from XLA; TF >= 2.16, whose XLA has the typed FFI) or "hlo" (the
    rule built as XLA operations; also what XLA:GPU runs, and FUSEDOPT_XLA_LOWERING=hlo)."""
    if os.environ.get("FUSEDOPT_XLA_LOWERING") == "hlo":
        return "hlo"
    header = os.path.join(tf.sysconfig.get_include(), "xla", "ffi", "api", "ffi.h")
    return "custom_call" if os.path.exists(header) else "hlo"
