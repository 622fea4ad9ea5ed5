"""A CPU stand-in for fusedopt._core_cuda (selected by FUSEDOPT_GPU_STANDIN=1, see
tests/gpu/conftest.py), over the stand-in cupy beside it.

Same functions, signatures and errors as the real module (cc/pybind/core_cuda_module.cc);
each update is forwarded to the real CPU engine, fusedopt._core, on NumPy views of the
stand-in's device memory, and runs in stream order (cupy/_device.py): at once on the legacy
default stream, deferred behind anything already enqueued on another stream. One "device".

What this proves: the GPU tests' logic, the harness, the API contract (errors, stream order,
wait=False). What it cannot: anything about the CUDA kernels themselves.

Known difference: the index-count limit is checked before the shape checks that the engine
makes (the real module checks it after them); a call that breaks both gets the other error.
"""
import importlib
import re

import numpy as np

import cupy

if not getattr(cupy, "IS_STANDIN", False):  # the real CuPy came first on sys.path
    raise ImportError("the _core_cuda stand-in needs the cupy stand-in (tests/gpu/standin)")
from cupy import _device

try:
    _core = importlib.import_module("_core")
except ImportError:
    from fusedopt import _core

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

MAX_INDICES = 2147483646  # the real module's limit: CUB counts items in int, scan covers n + 1
DTYPES = ("float16", "bfloat16", "float32", "float64")
COMPACT = ("bfloat16", "float16")  # slot dtypes beside a float32 var (compact slots)
# The engine's out-of-range message: with wait=False it is reported by PendingCheck.result().
_INDEX_ERROR = re.compile(r"indices\[\d+\] = -?\d+ is not in \[0, \d+\)")


def rules():
    return _core.rules()


def device_count():
    return 1


def cuda_init_error():
    return ""


class PendingCheck:
    """The index check of a sparse update enqueued with wait=False."""

    def __init__(self, queue=None, work=None):
        self._queue = queue
        self._work = work
        self._error = None

    def done(self):
        """Whether the stream has reached the check (never blocks)."""
        return self._work is None or self._work.finished

    def result(self):
        """Waits for the check; None, or the ValueError of the first out-of-range index
        (nothing written)."""
        if self._queue is not None:
            self._queue.wait_for(self._work)
        if self._error is not None:
            raise ValueError(str(self._error))


class _Interface:
    """FromInterface: what the real module reads from __cuda_array_interface__."""

    def __init__(self, obj, what):
        if hasattr(obj, "__cuda_array_interface__"):
            d = obj.__cuda_array_interface__
        elif isinstance(obj, dict):
            d = obj
        else:
            raise ValueError(f"{what} must be a CUDA array (__cuda_array_interface__) or its dict")
        self.what = what
        self.shape = tuple(int(n) for n in d["shape"])
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.typestr = str(d["typestr"])
        self.ptr, self.readonly = int(d["data"][0]), bool(d["data"][1])
        item = _item_size(self.typestr)
        _require(item <= 1 or self.ptr % item == 0,
                 f"{what} is not aligned to its {item}-byte elements")
        _require(d.get("mask") is None, f"{what} must not be masked")
        strides = d.get("strides")
        if strides is not None:
            expected, contiguous = _item_size(self.typestr), len(strides) == len(self.shape)
            for dim, stride in reversed(list(zip(self.shape, strides)) if contiguous else []):
                if dim != 1 and stride != expected:
                    contiguous = False
                expected *= dim
            _require(contiguous or self.size == 0, "arrays must be C-contiguous")

    def blank(self, dtype_name):
        """Zeros of this array's shape and dtype: for checking a call without its memory."""
        return _as(np.zeros(self.shape, np.dtype(self.typestr)), dtype_name)

    def memory(self, dtype_name=None):
        """NumPy view of the device memory (bfloat16 bits viewed as bfloat16)."""
        if self.size == 0:
            return self.blank(dtype_name)
        view = _device.host_view(self.ptr, self.shape, np.dtype(self.typestr))
        if view is None:
            raise RuntimeError(f"cudaErrorIllegalAddress (stand-in): {self.what} at "
                               f"{self.ptr:#x} is not device memory")
        return _as(view, dtype_name)


def _as(array, dtype_name):
    return array.view(ml_dtypes.bfloat16) if dtype_name == "bfloat16" else array


def _require(ok, message):
    if not ok:
        raise ValueError(message)


def _item_size(typestr):
    return int(typestr[2:]) if len(typestr) >= 3 else 0


def _dtype_name(a, dtype):
    kind = a.typestr[1:]
    if dtype == "bfloat16":
        _require(kind in ("u2", "i2", "V2", "f2"),
                 "dtype='bfloat16' needs 2-byte arrays, got typestr " + a.typestr)
        return "bfloat16"
    return {"f2": "float16", "f4": "float32", "f8": "float64"}.get(kind, "typestr " + a.typestr)


def _slot_dtype_name(a, name, dtype, slot_dtype):
    """SlotDtypeName: a slot's typestr's dtype; bfloat16 for 2-byte arrays where slot_dtype
    (or, slot_dtype empty, dtype) says so."""
    named = dtype if slot_dtype == "" else slot_dtype
    two_bytes = a.typestr[1:] in ("u2", "i2", "V2", "f2")
    if named == "bfloat16":
        _require(two_bytes or slot_dtype == "", "slot_dtype='bfloat16' needs 2-byte arrays, but "
                 f"{name} has typestr {a.typestr}")
        if two_bytes:
            return "bfloat16"
    got = _dtype_name(a, "")
    _require(slot_dtype in ("", "bfloat16") or got == slot_dtype,
             f"slot_dtype='{slot_dtype}' but {name} has typestr {a.typestr}")
    return got


def _slot_dtype(var_dtype, names, dtypes):
    """pycommon::SlotDtype: the slots' one dtype, var's or bfloat16/float16 beside float32."""
    for name, got in zip(names, dtypes):
        if not (got == var_dtype or (var_dtype == "float32" and got in COMPACT)):
            message = f"{name} has dtype {got} but var is {var_dtype}"
            if var_dtype == "float32":
                message += " (slots may be float32, bfloat16 or float16)"
            elif got in COMPACT:
                message += " (bfloat16/float16 slots are for float32 variables)"
            raise ValueError(message)
        _require(got == dtypes[0], f"{name} has dtype {got} but {names[0]} has {dtypes[0]}: an "
                 "update's slots are stored in one dtype")
    return dtypes[0] if dtypes else var_dtype


def _check_seed(rounding_seed, stochastic):
    if rounding_seed is None:
        if stochastic:
            raise ValueError("stochastic_rounding=True needs rounding_seed: an integer that "
                             "changes every call, such as the step number (without one, an "
                             "element that does not change would round the same way every "
                             "step, a bias)")
        return
    if not isinstance(rounding_seed, (int, np.integer)) or isinstance(rounding_seed, bool):
        raise TypeError("rounding_seed must be an integer, got " + type(rounding_seed).__name__)
    if not -(2 ** 63) <= int(rounding_seed) < 2 ** 64:
        raise ValueError("rounding_seed must fit in 64 bits")


def _check_keywords(slot_dtype, stochastic_rounding):
    if not isinstance(slot_dtype, str):
        raise TypeError("incompatible function arguments (stand-in _core_cuda)")
    _require(slot_dtype in ("",) + DTYPES,
             f"unsupported slot_dtype {slot_dtype} (float16, bfloat16, float32, float64)")
    if not isinstance(stochastic_rounding, (bool, np.bool_)):
        raise TypeError("stochastic_rounding must be a bool, got "
                        + type(stochastic_rounding).__name__)
    return bool(stochastic_rounding)


def _dispatch(rule, dtype_name):
    table = _core.rules()
    _require(rule in table, "unknown rule " + str(rule))
    _require(dtype_name in DTYPES,
             f"unsupported dtype {dtype_name} (float16, bfloat16, float32, float64)")
    return len(table[rule]["slots"])


def _check_types(rule, slots, hyper, options, stream, dtype, wait=True):
    """pybind11's argument conversion: the real module raises TypeError for these."""
    if not (isinstance(rule, str) and isinstance(slots, list) and isinstance(hyper, dict)
            and isinstance(options, dict) and isinstance(dtype, str)
            and isinstance(stream, (int, np.integer)) and stream >= 0
            and isinstance(wait, (bool, np.bool_))):
        raise TypeError("incompatible function arguments (stand-in _core_cuda)")


def _check_state(rule, var, slots, grad, dtype, slot_dtype=""):
    """CheckState up to the shape checks (the engine makes those): the arrays' interfaces.
    Returns (var, slots, grad, var's dtype name, the slots' dtype name)."""
    dtype_name = _dtype_name(_Interface(var, "var"), dtype)
    num_slots = _dispatch(rule, dtype_name)
    _require(len(slots) == num_slots, f"{rule} needs {num_slots} slot arrays")
    v, g = _Interface(var, "var"), _Interface(grad, "grad")
    s = [_Interface(x, "slot") for x in slots]
    _require(not v.readonly, "var and slots must be writeable")
    for x in s:
        _require(not x.readonly, "var and slots must be writeable")
    _require(g.typestr == v.typestr, f"grad has typestr {g.typestr} but var {v.typestr}: var "
             "and grad must share one dtype")
    names = _core.rules()[rule]["slots"]
    slot_name = _slot_dtype(dtype_name, names,
                            [_slot_dtype_name(x, n, dtype, slot_dtype) for x, n in zip(s, names)])
    return v, s, g, dtype_name, slot_name


def _check_device_of(a):
    """DeviceScope: the device is found from this array's pointer (var's, or the indices'
    when var is empty)."""
    if _device.find_allocation(a.ptr, 1) is None:
        raise ValueError("var must be device (or managed) memory")


def _is_index_error(e):
    return bool(_INDEX_ERROR.fullmatch(str(e)))


def apply_dense(rule, var, slots, grad, hyper, options={}, stream=0, dtype="", *,  # noqa: B006
                slot_dtype="", stochastic_rounding=False, rounding_seed=None):
    """Dense update of var and slots in place, enqueued on `stream`. Slots: var's dtype or,
    beside a float32 var, all bfloat16 or all float16 (slot_dtype='bfloat16' for 2-byte
    arrays of bfloat16 bits), rounded to nearest even or, with stochastic_rounding=True,
    stochastically."""
    _check_types(rule, slots, hyper, options, stream, dtype)
    stochastic = _check_keywords(slot_dtype, stochastic_rounding)
    _check_seed(rounding_seed, stochastic)
    v, s, g, dtype_name, slot_name = _check_state(rule, var, slots, grad, dtype, slot_dtype)
    # Shapes and hyper-parameters: the engine's own checks, on zeros of the same shapes.
    _core.apply_dense(rule, v.blank(dtype_name), [x.blank(slot_name) for x in s],
                      g.blank(dtype_name), hyper, options)
    if v.size == 0:
        return
    _check_device_of(v)
    arrays = v.memory(dtype_name), [x.memory(slot_name) for x in s], g.memory(dtype_name)
    _device.launch(int(stream), lambda: _core.apply_dense(rule, *arrays, hyper, options,
                                                          stochastic_rounding=stochastic,
                       rounding_seed=rounding_seed))


def apply_sparse(rule, var, slots, grad, indices, hyper, options={}, stream=0,  # noqa: B006
                 dtype="", wait=True, *, slot_dtype="", stochastic_rounding=False,
                 rounding_seed=None):
    """Sparse update of the rows named by indices (duplicates summed first), in place;
    out-of-range indices raise ValueError with nothing written (wait=False: from the returned
    PendingCheck's result()). Slots as apply_dense takes them."""
    _check_types(rule, slots, hyper, options, stream, dtype, wait)
    stochastic = _check_keywords(slot_dtype, stochastic_rounding)
    _check_seed(rounding_seed, stochastic)
    i = _Interface(indices, "indices")
    _require(i.typestr[1:] in ("i4", "i8"), "indices must be int32 or int64, got typestr "
             + i.typestr)
    v, s, g, dtype_name, slot_name = _check_state(rule, var, slots, grad, dtype, slot_dtype)
    if i.size > MAX_INDICES:
        raise ValueError(f"sparse GPU updates take at most {MAX_INDICES} indices per call, "
                         f"got {i.size}")
    try:  # shapes and hyper-parameters, on zeros; the index check belongs to the run
        _core.apply_sparse(rule, v.blank(dtype_name), [x.blank(slot_name) for x in s],
                           g.blank(dtype_name), i.blank(None), hyper, options)
    except ValueError as e:
        if not _is_index_error(e):  # zero indices fail only where var has no rows
            raise
    if i.size == 0:
        return None if wait else PendingCheck()
    _check_device_of(v if v.size > 0 else i)
    arrays = (v.memory(dtype_name), [x.memory(slot_name) for x in s], g.memory(dtype_name),
              i.memory())
    pending = PendingCheck(_device.queue_of(int(stream)))

    def check_and_update():
        try:
            _core.apply_sparse(rule, *arrays, hyper, options, stochastic_rounding=stochastic,
                       rounding_seed=rounding_seed)
        except ValueError as e:
            if not _is_index_error(e):
                raise
            pending._error = e  # nothing was written: the engine checks before it writes

    pending._work = _device.launch(int(stream), check_and_update)
    return pending.result() if wait else pending


def apply_dense_group(rule, vars, slots, grads, hyper, options={}, stream=0,  # noqa: B006
                      dtype="", *, slot_dtype="", stochastic_rounding=False,
                      rounding_seed=None):
    """Dense updates of many variables in place (the group op's engine), enqueued on
    `stream`; slots: one list per slot, each with an entry per variable, all of one dtype
    (as apply_dense takes them)."""
    if not all(isinstance(x, (list, tuple)) for x in (vars, slots, grads)):
        raise TypeError("incompatible function arguments (stand-in _core_cuda)")
    _check_types(rule, list(slots), hyper, options, stream, dtype)
    stochastic = _check_keywords(slot_dtype, stochastic_rounding)
    _check_seed(rounding_seed, stochastic)
    n = len(vars)
    _require(len(grads) == n, f"vars and grads must have one entry per variable, got {n} and "
             f"{len(grads)}")
    if n == 0:
        return
    num_slots = _dispatch(rule, _dtype_name(_Interface(vars[0], "var"), dtype))
    _require(len(slots) == num_slots, f"{rule} needs {num_slots} slot lists (one per slot, "
             "each with an entry per variable)")
    slot_names = _core.rules()[rule]["slots"]
    for name, entries in zip(slot_names, slots):
        _require(len(entries) == n, f"{name} has {len(entries)} entries for {n} variables")
    members = []
    for i in range(n):
        try:
            v, s, g, dtype_name, slot_name = _check_state(rule, vars[i], [x[i] for x in slots],
                                                          grads[i], dtype, slot_dtype)
            _core.apply_dense(rule, v.blank(dtype_name), [x.blank(slot_name) for x in s],
                              g.blank(dtype_name), hyper, options)
            if members:
                _require(dtype_name == members[0][3], f"dtype {dtype_name} differs from "
                         f"variable 0's {members[0][3]} (one group, one dtype)")
                _require(slot_name == members[0][4], f"slot dtype {slot_name} differs from "
                         f"variable 0's {members[0][4]} (one group, one slot dtype)")
        except ValueError as e:
            raise ValueError(f"variable {i} of {n}: {e}") from None
        members.append((v, s, g, dtype_name, slot_name))
    spans = []  # (begin, end, name, written)
    for i, (v, s, g, _, _) in enumerate(members):
        if v.size == 0:
            continue
        def span(a, label, written):  # each array's own size (a per-row slot: one per row)
            return (a.ptr, a.ptr + a.size * _item_size(a.typestr), f"{label}[{i}]", written)
        spans += [span(v, "var", True)]
        spans += [span(x, name, True) for name, x in zip(slot_names, s)]
        spans += [span(g, "grad", False)]
    if not spans:
        return
    spans.sort(key=lambda x: x[0])
    furthest_written = furthest_any = None
    for x in spans:
        other = furthest_any if x[3] else furthest_written
        if other is not None and x[0] < other[1]:
            raise ValueError(f"{other[2]} and {x[2]} overlap in memory; every var and slot needs "
                             "its own array")
        if x[3] and (furthest_written is None or x[1] > furthest_written[1]):
            furthest_written = x
        if furthest_any is None or x[1] > furthest_any[1]:
            furthest_any = x
    for v, _, _, _, _ in members:
        if v.size:
            _check_device_of(v)
    arrays = [(v.memory(d), [x.memory(sd) for x in s], g.memory(d))
              for v, s, g, d, sd in members if v.size]

    def update_all():
        for a in arrays:
            _core.apply_dense(rule, *a, hyper, options, stochastic_rounding=stochastic,
                       rounding_seed=rounding_seed)
    _device.launch(int(stream), update_all)
