"""Buffers TensorFlow did not allocate: variables, gradients, indices and hyper-parameters
adopting NumPy memory through DLPack (cc/tf/variable_access.h).

NumPy aligns large arrays to 16 bytes, TF's allocators to 64. TF copies an adopted
variable before its first update (the memory is not its own) and its copy,
functor::DenseUpdate, CHECK-fails, aborting the process, on a buffer that is not 64-byte
aligned. The ops copy variables themselves, so such variables, even ones not aligned to
their elements, update exactly as TF-owned ones; a gradient, indices or hyper-parameter
(read where it lies) that is not aligned to its elements is refused with an
InvalidArgumentError that names it, every variable unchanged. Each case runs in a child
process: an abort is a failed test, not a lost test run.
"""
import json
import os
import subprocess
import sys

import pytest

from harness import hyper_for

CHILD = r"""
import ctypes, json, sys
import numpy as np
import tensorflow as tf
from fusedopt import ops
from fusedopt.ops import RULES

HYPER = {rule: [h[name] for name in RULES[rule]["hyper"]]  # in the ops' order
         for rule, h in json.loads(sys.argv[1]).items()}
rng = np.random.default_rng(0)
_get = ctypes.pythonapi.PyCapsule_GetPointer
_get.restype = ctypes.c_void_p
_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_keep = []  # the NumPy memory the adopted tensors live in


def address(x):
    t = x.read_value() if isinstance(x, tf.Variable) else x
    capsule = tf.experimental.dlpack.to_dlpack(t)
    return ctypes.c_void_p.from_address(_get(capsule, b"dltensor")).value


def placed(values, offset):
    # A NumPy copy of `values` starting `offset` bytes past a 64-byte boundary, as a TF
    # tensor sharing its memory.
    values = np.asarray(values)
    raw = np.empty(values.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    a = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    a[...] = values
    _keep.append(a)
    t = tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    assert address(t) % 64 == offset, "TF did not adopt the memory"
    return t, a


def state(rule, shape):
    var = rng.uniform(-1, 1, shape).astype(np.float32)
    slots = [rng.uniform(0.1, 1, shape).astype(np.float32) for _ in RULES[rule]["slots"]]
    return var, slots


def digest(variables):
    return [v.numpy().tobytes().hex() for v in variables]


def dense(rule, offset):
    var, slots = state(rule, [1000])
    grad = rng.uniform(-1, 1, [1000]).astype(np.float32)
    apply = getattr(ops, "resource_apply_" + rule)
    want = [tf.Variable(x) for x in [var, *slots]]
    apply(*want, *HYPER[rule], grad)
    got = [tf.Variable(placed(x, offset)[0]) for x in [var, *slots]]
    held = [v.read_value() for v in got]
    # The gradient is read where it lies: aligned to its elements, at least.
    apply(*got, *HYPER[rule], placed(grad, 16 if offset % 4 else offset)[0])
    return dict(equal=digest(got) == digest(want),
                held_unchanged=[h.numpy().tobytes() for h in held]
                == [x.tobytes() for x in [var, *slots]])


def sparse(rule, offset, index_dtype, read_offset):
    var, slots = state(rule, [50, 8])
    ids = np.array([3, 7, 3, 49, 0, 7, 7], index_dtype)
    grad = rng.uniform(-1, 1, [len(ids), 8]).astype(np.float32)
    apply = getattr(ops, "resource_sparse_apply_" + rule)
    want = [tf.Variable(x) for x in [var, *slots]]
    apply(*want, *HYPER[rule], grad, ids)
    got = [tf.Variable(placed(x, offset)[0]) for x in [var, *slots]]
    held = [v.read_value() for v in got]  # copy-on-read mode copies them first
    apply(*got, *HYPER[rule], placed(grad, read_offset)[0], placed(ids, read_offset)[0])
    return dict(equal=digest(got) == digest(want),
                held_unchanged=[h.numpy().tobytes() for h in held]
                == [x.tobytes() for x in [var, *slots]])


def group(rule, offset, packed, read_offset):
    members = [state(rule, shape) for shape in ([300], [4, 5])]
    grads = [rng.uniform(-1, 1, v.shape).astype(np.float32) for v, _ in members]
    n_slots = len(RULES[rule]["slots"])

    def run(make, grad_tensors):
        variables = [make(v) for v, _ in members]
        slots = [[make(s[k]) for _, s in members] for k in range(n_slots)]
        if packed:
            pack = ops.variable_pack([*variables, *sum(slots, [])])
            getattr(ops, "resource_packed_group_apply_" + rule)(
                pack, *HYPER[rule], grad=grad_tensors)
        else:
            getattr(ops, "resource_group_apply_" + rule)(
                variables, *slots, *HYPER[rule], grad=grad_tensors)
        return digest([*variables, *sum(slots, [])])

    want = run(tf.Variable, grads)
    held = []

    def adopt(x):
        v = tf.Variable(placed(x, offset)[0])
        held.append(v.read_value())
        return v

    return dict(equal=run(adopt, [placed(g, read_offset)[0] for g in grads]) == want)


def refused(rule, what):
    # `what` placed one byte past its elements' alignment; returns the error and whether
    # every variable kept its bits.
    var, slots = state(rule, [40, 4])
    grad = rng.uniform(-1, 1, [40, 4]).astype(np.float32)
    misaligned = lambda x: placed(x, 1)[0]
    hyper = list(HYPER[rule])
    if what == "hyper":
        hyper[0] = misaligned(np.float32(hyper[0]))
    variables = [tf.Variable(x) for x in [var, *slots]]
    before = digest(variables)
    try:
        if what == "group grad":
            getattr(ops, "resource_group_apply_" + rule)(
                [variables[0]], *[[s] for s in variables[1:]], *hyper, grad=[misaligned(grad)])
        elif what == "indices":
            getattr(ops, "resource_sparse_apply_" + rule)(
                *variables, *hyper, grad[:5], misaligned(np.arange(5, dtype=np.int64)))
        else:
            getattr(ops, "resource_apply_" + rule)(
                *variables, *hyper, misaligned(grad) if what == "grad" else grad)
        error = None
    except tf.errors.InvalidArgumentError as e:
        error = e.message
    return dict(error=error, unchanged=digest(variables) == before)


cases = json.loads(sys.argv[2])
print(json.dumps([globals()[case](*args) for case, *args in cases]))
"""

RULES = ["lazy_adam", "adamax", "adagrad", "rms_prop"]
HYPER = {rule: hyper_for(rule, "float", 3) for rule in RULES}


DENSE = [(rule, offset) for rule in RULES for offset in (16, 1)]
SPARSE = [(rule, 16, index_dtype, 16) for rule in RULES for index_dtype in ("int32", "int64")]
GROUP = [(rule, offset, packed, 16 if offset % 4 else offset)
         for rule in ("lazy_adam", "adagrad") for packed in (False, True) for offset in (16, 1)]
REFUSED = [("grad", "grad", "4-byte float"), ("indices", "indices", "8-byte int64"),
           ("hyper", "beta1_power", "4-byte float"), ("group grad", "grad[0]", "4-byte float")]


@pytest.fixture(scope="module")
def results():
    """Every case in one child process (TF starts once): {(case, *args): result}."""
    cases = ([("dense", *a) for a in DENSE] + [("sparse", *a) for a in SPARSE]
             + [("sparse", "lazy_adam", 2, "int64", 0)] + [("group", *a) for a in GROUP]
             + [("refused", "lazy_adam", what) for what, _, _ in REFUSED])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(HYPER), json.dumps(cases)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, f"child exited {out.returncode}:\n{out.stderr[-3000:]}"
    return dict(zip(map(tuple, cases), json.loads(out.stdout.strip().splitlines()[-1])))


@pytest.mark.slow
@pytest.mark.parametrize("rule,offset", DENSE)
def test_dense_update_of_adopted_variables(results, rule, offset):
    # TF's copy before the first update would abort here; the op's copy is exact (and
    # aligns the variables), a read taken before it keeps the old values.
    out = results[("dense", rule, offset)]
    assert out["equal"] and out["held_unchanged"]


@pytest.mark.parametrize("case", SPARSE)
def test_sparse_with_adopted_variables_gradient_and_indices(results, case):
    # Copy-on-read mode copies the variables first; gradient and indices are read in place.
    out = results[("sparse", *case)]
    assert out["equal"] and out["held_unchanged"]


def test_sparse_variables_not_aligned_to_their_elements(results):
    out = results[("sparse", "lazy_adam", 2, "int64", 0)]
    assert out["equal"] and out["held_unchanged"]


@pytest.mark.parametrize("case", GROUP)
def test_group_ops_with_adopted_members(results, case):
    assert results[("group", *case)]["equal"]


@pytest.mark.parametrize("what,named,element", REFUSED)
def test_inputs_read_in_place_not_aligned_to_their_elements_are_refused(
        results, what, named, element):
    out = results[("refused", "lazy_adam", what)]
    assert out["error"] is not None, f"misaligned {what} was accepted"
    assert f"{named} is in memory not aligned to its {element} elements" in out["error"]
    assert out["unchanged"]
