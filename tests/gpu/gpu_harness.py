"""What the GPU test files in tests/gpu share: the modules under test, the skip marker,
the rule table, host-state builders, device copies, the bit-for-bit comparison, and
StreamHold (keeps a stream busy, to see which stream a call used).

The modules come from $FUSEDOPT_GPU_BUILD (what tools/gpu_check.sh builds) or the
installed fusedopt package; with FUSEDOPT_GPU_STANDIN=1, _core_cuda and cupy are the CPU
stand-ins of tests/gpu/standin (conftest.py). A test file marks itself
`pytestmark = requires_gpu`: every test in it is skipped ("no GPU: skipped") where
_core_cuda, _core, CuPy or a CUDA device is missing — except in the stand-in run, where a
missing piece is an error (a stand-in run that skips everything would prove nothing).
"""
import glob
import importlib
import importlib.util
import os
import pkgutil
import sys
import threading
import time

import numpy as np
import pytest

STANDIN = os.environ.get("FUSEDOPT_GPU_STANDIN") == "1"
STANDIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
if STANDIN and STANDIN_DIR not in sys.path:  # conftest.py does this under pytest
    sys.path.insert(0, STANDIN_DIR)
BUILD = os.environ.get("FUSEDOPT_GPU_BUILD")


def _load_built(name):
    """Module `name` from $FUSEDOPT_GPU_BUILD, loaded from its file and registered under
    its bare name. Never that directory on sys.path: when it is a fusedopt package
    directory, its `keras` subpackage would shadow the real keras for the whole session."""
    paths = glob.glob(os.path.join(BUILD, name + ".*so")) if BUILD else []
    if not paths:
        return None
    spec = importlib.util.spec_from_file_location(name, paths[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def _import(name):
    for full in (name, "fusedopt." + name):
        try:
            return importlib.import_module(full)
        except ImportError:
            continue
    return None


# _core first: the stand-in _core_cuda imports it by its bare name. The stand-in
# _core_cuda (on sys.path) wins over a built one.
core = _load_built("_core") or _import("_core")
core_cuda = (None if STANDIN else _load_built("_core_cuda")) or _import("_core_cuda")
try:
    import cupy as cp
except Exception:  # not installed, or no CUDA runtime for it
    cp = None
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

_devices = core_cuda.device_count() if core_cuda is not None else 0
MISSING = [what for what, ok in (("fusedopt._core_cuda", core_cuda is not None),
                                 ("fusedopt._core", core is not None), ("cupy", cp is not None),
                                 ("a CUDA device", _devices > 0)) if not ok]
if STANDIN and MISSING:
    raise ImportError("FUSEDOPT_GPU_STANDIN=1 but missing: " + ", ".join(MISSING))
if STANDIN and not (getattr(cp, "IS_STANDIN", False)
                    and os.path.dirname(core_cuda.__file__) == STANDIN_DIR):
    raise ImportError("FUSEDOPT_GPU_STANDIN=1 but the real cupy or _core_cuda was imported")
requires_gpu = pytest.mark.skipif(bool(MISSING), reason="no GPU: skipped (missing "
                                  + ", ".join(MISSING) + ")")

# The rules as the C++ registry reports them (a new rule is tested with no line here),
# with each rule's option sets, slot ranges and hyper-parameters from its NumPy oracle
# module (tests/support/numpy_rules; NumPy only, so it also runs on a machine without TF).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "support"))
from numpy_rules import __path__ as _oracle_path  # noqa: E402

ORACLES = {info.name: importlib.import_module("numpy_rules." + info.name)
           for info in pkgutil.iter_modules(_oracle_path)}
RULE_SPECS = core.rules() if core is not None else {}
RULES = sorted(RULE_SPECS) or sorted(ORACLES)
DTYPES = ["float16", "bfloat16", "float32", "float64"]


def _hyper(rule, step=3):
    """Hyper-parameters for `step`: the oracle's, with small learning rates and epsilons so
    a step does not dwarf the state (Adam-like 1e-2 / 1e-7)."""
    oracle = ORACLES[rule]
    h = dict(oracle.BASE_HYPER)
    h.update({k: v * 0.1 for k, v in h.items() if k == "lr"})
    for power, base in oracle.POWERS.items():
        h[power] = h[base] ** step
    return h


HYPER = {rule: _hyper(rule) for rule in RULES}
OPTIONS = {rule: ORACLES[rule].OPTION_SETS for rule in RULES}
RULE_OPTIONS = [(r, o) for r in RULES for o in OPTIONS[r]]
NUM_SLOTS = {rule: len(ORACLES[rule].SLOTS) for rule in RULES}


from numpy_reference import np_dtype, slot_shape  # noqa: E402  (NumPy only; on the GPU machine too)


def dtype_arg(dtype):
    """The `dtype` argument of _core_cuda: bfloat16 travels as uint16 bits and must be named."""
    return "bfloat16" if dtype == "bfloat16" else ""


def slot_dtype_arg(var, slots):
    """The `slot_dtype` argument of _core_cuda for host slots beside host var: bfloat16
    slots beside a var of another dtype (compact slots) must be named."""
    bf16 = np_dtype("bfloat16")
    compact = slots and slots[0].dtype == bf16 and var.dtype != bf16
    return "bfloat16" if compact else ""


def make_state(rule, dtype, shape, rng, grad_rows=None):
    """var, slots (drawn from the oracle's SLOT_RANGES) and grad, as host arrays."""
    t = np_dtype(dtype)
    var = rng.standard_normal(shape).astype(t)
    ranges = ORACLES[rule].SLOT_RANGES
    slots = [rng.uniform(*ranges[name], slot_shape(rule, name, shape)).astype(t)
             for name in ORACLES[rule].SLOTS]
    grad_shape = shape if grad_rows is None else (grad_rows,) + tuple(shape[1:])
    grad = rng.standard_normal(grad_shape).astype(t)
    return var, slots, grad


def to_device(a):
    if a.dtype == np_dtype("bfloat16"):
        return cp.asarray(a.view(np.uint16))
    return cp.asarray(a)


def to_host(d, dtype):
    return cp.asnumpy(d).view(np_dtype(dtype))


def group_to_device(members, unaligned=()):
    """(vars, slots per slot, grads) on the device of a group's members [(var, slots,
    grad)]; the members numbered in `unaligned` (1-D) one element past a 16-byte boundary."""
    def device(a, i):
        if i not in unaligned or a.size == 0:
            return to_device(a)
        assert a.ndim == 1
        return to_device(np.concatenate([a[:1], a]))[1:]

    dvars = [device(var, i) for i, (var, _, _) in enumerate(members)]
    dslots = [[device(slots[k], i) for i, (_, slots, _) in enumerate(members)]
              for k in range(len(members[0][1]))]
    dgrads = [device(grad, i) for i, (_, _, grad) in enumerate(members)]
    return dvars, dslots, dgrads


def run_gpu(rule, dtype, var, slots, grad, hyper, options, indices=None, stream=0,
            stochastic_rounding=False, rounding_seed=0):
    """Device copies, one call, results on the host. Slots keep their host dtype (compact
    slots: bfloat16/float16 beside a float32 var)."""
    dvar, dslots, dgrad = to_device(var), [to_device(s) for s in slots], to_device(grad)
    kw = dict(options=options, stream=stream, dtype=dtype_arg(dtype))
    if slot_dtype_arg(var, slots) or stochastic_rounding:  # older modules lack the keywords
        kw.update(slot_dtype=slot_dtype_arg(var, slots), stochastic_rounding=stochastic_rounding)
    if rounding_seed:
        kw.update(rounding_seed=rounding_seed)
    if indices is None:
        core_cuda.apply_dense(rule, dvar, dslots, dgrad, hyper, **kw)
    else:
        core_cuda.apply_sparse(rule, dvar, dslots, dgrad, cp.asarray(indices), hyper, **kw)
    cp.cuda.runtime.deviceSynchronize()
    return to_host(dvar, dtype), [to_host(d, s.dtype) for d, s in zip(dslots, slots)]


def run_cpu(rule, var, slots, grad, hyper, options, indices=None, **kw):
    var, slots = var.copy(), [s.copy() for s in slots]
    if indices is None:
        core.apply_dense(rule, var, slots, grad, hyper, options, **kw)
    else:
        core.apply_sparse(rule, var, slots, grad, indices, hyper, options, **kw)
    return var, slots


def assert_bits_equal(got, want, what):
    g, w = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert g.shape == w.shape, what
    if g.size == 0:
        return
    gb, wb = g.view(np.uint8).reshape(g.size, -1), w.view(np.uint8).reshape(w.size, -1)
    diff = np.flatnonzero((gb != wb).any(axis=1))
    assert diff.size == 0, (f"{what}: {diff.size} of {g.size} elements differ from the CPU engine; "
                            f"first at {diff[0]}: gpu {g.flat[diff[0]]!r} cpu {w.flat[diff[0]]!r}")


def check_same(rule, dtype, gpu, cpu):
    assert_bits_equal(gpu[0], cpu[0], f"{rule}/{dtype} var")
    for k, (g, c) in enumerate(zip(gpu[1], cpu[1])):
        assert_bits_equal(g, c, f"{rule}/{dtype} slot {k}")


# A one-thread kernel that keeps its stream busy until the host sets *release (a flag in
# pinned host memory: under unified addressing its host pointer is valid on the device, and
# the host writes it directly, so releasing needs no kernel or copy and works even where a
# tool serialises kernels), or until max_ns of %globaltimer (wall-clock ns) have passed.
_HOLD_KERNEL = r"""
extern "C" __global__ void hold_stream(unsigned long long release_address,
                                       unsigned long long max_ns) {
  const volatile unsigned int* release = (const volatile unsigned int*)release_address;
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    if (*release != 0u) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < max_ns);
}
"""


_HOLD_FLAGS = []


class StreamHold:
    """Keeps `stream` busy from now until release() (or max_seconds), so that work enqueued
    on it meanwhile cannot run yet: the way to see which stream a call really used.
    GPU: the spinning kernel above. Stand-in: the stand-in stream's hold, same semantics.
    A context manager; leaving it releases."""

    def __init__(self, stream, max_seconds=5.0):
        if STANDIN:
            self._standin_hold = stream.standin_hold(max_seconds)
            return
        flag_memory = cp.cuda.alloc_pinned_memory(4)
        # Never handed back to CuPy's pool: a later hold must not reuse (and zero) a flag that
        # a kernel of an earlier hold may still be polling.
        _HOLD_FLAGS.append(flag_memory)
        self._flag = np.frombuffer(flag_memory, np.uint32, 1)
        self._flag[0] = 0
        kernel = cp.RawKernel(_HOLD_KERNEL, "hold_stream")
        with stream:
            kernel((1,), (1,), (np.uint64(flag_memory.ptr), np.uint64(max_seconds * 1e9)))

    def release(self):
        if STANDIN:
            self._standin_hold.release()
        else:
            self._flag[0] = 1

    def release_after(self, seconds):
        """Releases from another thread after `seconds` (for calls that block on the stream)."""
        timer = threading.Timer(seconds, self.release)
        timer.start()
        return timer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class IgnoresTheStream:
    """A deliberately wrong backend for proving the stream tests can fail: forwards every
    call to `backend` but drops `stream`, so the work goes to the legacy default stream."""

    def __init__(self, backend):
        self._backend = backend

    def apply_dense(self, *args, stream=0, **kwargs):
        return self._backend.apply_dense(*args, **kwargs)

    def apply_sparse(self, *args, stream=0, **kwargs):
        return self._backend.apply_sparse(*args, **kwargs)

    def apply_dense_group(self, *args, stream=0, **kwargs):
        return self._backend.apply_dense_group(*args, **kwargs)


def elapsed(fn):
    """(fn(), seconds it took)."""
    start = time.monotonic()
    result = fn()
    return result, time.monotonic() - start
