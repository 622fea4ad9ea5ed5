"""Buffers the L1 cache cannot hold together (cc/core/cache_alias.h): before an update the
CPU kernels move a variable or slot buffer of 1 MB or more whose address agrees with another
buffer of the same update modulo 256 MB (within 64 KB) to fresh memory, once, values
unchanged; FUSEDOPT_SEPARATE_BUFFERS=0 turns that off.

Each case runs in a child process (the setting is read once per process). The buffers are
placed at chosen addresses: the variables adopt NumPy memory handed over by DLPack, cut from
one reservation at exact 256 MB distances (untouched pages of the reservation cost nothing).
"""
import json
import os
import subprocess
import sys

import pytest

SETTING = "FUSEDOPT_SEPARATE_BUFFERS"
PERIOD = 1 << 28
WINDOW = 64 << 10

PRELUDE = r"""
import ctypes, hashlib, json
import numpy as np
import tensorflow as tf
from fusedopt import ops

PERIOD, WINDOW = 1 << 28, 64 << 10
_get = ctypes.pythonapi.PyCapsule_GetPointer
_get.restype = ctypes.c_void_p
_get.argtypes = [ctypes.py_object, ctypes.c_char_p]

def address(x):
    t = x.read_value() if isinstance(x, tf.Variable) else x
    capsule = tf.experimental.dlpack.to_dlpack(t)
    return ctypes.c_void_p.from_address(_get(capsule, b"dltensor")).value

def aliased(a, b):
    d = (a - b) % PERIOD
    return d < WINDOW or d > PERIOD - WINDOW

def aliased_pairs(xs):
    a = [address(x) for x in xs]
    return [(i, j) for i in range(len(a)) for j in range(i) if aliased(a[i], a[j])]

def digest(*xs):
    h = hashlib.sha256()
    for x in xs:
        h.update(np.ascontiguousarray(x.numpy()).tobytes())
    return h.hexdigest()

# One reservation; tensor k of shape `shape` starts at k * PERIOD + offsets[k] bytes.
reservation = np.empty(4 * PERIOD + (1 << 22), np.uint8)
base = (-reservation.ctypes.data) % 4096

def placed(k, shape, values, offset=0):
    n = int(np.prod(shape))
    start = base + k * PERIOD + offset
    a = reservation[start:start + 4 * n].view(np.float32).reshape(shape)
    a[...] = values
    return tf.experimental.dlpack.from_dlpack(a.__dlpack__())

HYPER = dict(beta1_power=0.9, beta2_power=0.999, lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7)
rng = np.random.default_rng(0)
shape = (8192, 64)  # 2 MB
init = [rng.normal(size=shape).astype(np.float32) for _ in range(3)]
init[2] = np.abs(init[2])  # v >= 0
grad_values = rng.normal(size=shape).astype(np.float32)
"""

DENSE = PRELUDE + r"""
offsets = {offsets}
var, m, v = (tf.Variable(placed(k, shape, init[k], offsets[k])) for k in range(3))
grad = placed(3, shape, grad_values, offsets[3])
assert [address(x) for x in (var, m, v)] == [reservation.ctypes.data + base + k * PERIOD + offsets[k]
                                              for k in range(3)], "the variables did not adopt"
before = aliased_pairs([grad, var, m, v])
held = var.read_value()  # a read still holding var's buffer while it is updated
held_digest = digest(held)
ops.resource_apply_lazy_adam(var, m, v, grad=grad, **HYPER)
first = ops.buffer_separation_stats()
addresses = [address(x) for x in (var, m, v)]
for _ in range(2):
    ops.resource_apply_lazy_adam(var, m, v, grad=grad, **HYPER)
print(json.dumps(dict(before=before, after=aliased_pairs([grad, var, m, v]), first=first,
                      stats=ops.buffer_separation_stats(), digest=digest(var, m, v),
                      held_unchanged=digest(held) == held_digest,
                      stable=addresses == [address(x) for x in (var, m, v)])))
"""

SPARSE = PRELUDE + r"""
var, m, v = (tf.Variable(placed(k, shape, init[k])) for k in range(3))
before = aliased_pairs([var, m, v])
ids = tf.constant(rng.integers(0, shape[0], 512))
rows = tf.constant(rng.normal(size=(512, shape[1])).astype(np.float32))
for _ in range(3):
    ops.resource_sparse_apply_lazy_adam(var, m, v, grad=rows, indices=ids, **HYPER)
print(json.dumps(dict(before=before, stats=ops.buffer_separation_stats(),
                      digest=digest(var, m, v))))
"""

GROUP = PRELUDE + r"""
big = [tf.Variable(placed(k, shape, init[k])) for k in range(3)]
grad = placed(3, shape, grad_values)
small = [tf.Variable(tf.fill([64], 0.5 + k)) for k in range(3)]  # TF-owned: never copied
before = aliased_pairs([grad] + big)
small_addresses = [address(x) for x in small]
for _ in range(3):
    ops.resource_group_apply_lazy_adam([big[0], small[0]], [big[1], small[1]], [big[2], small[2]],
                                       grad=[grad, tf.ones([64])], **HYPER)
print(json.dumps(dict(before=before, after=aliased_pairs([grad] + big),
                      stats=ops.buffer_separation_stats(), digest=digest(*big, *small),
                      small_stayed=small_addresses == [address(x) for x in small])))
"""


def run_child(code, setting=None):
    env = {k: v for k, v in os.environ.items() if k != SETTING}
    if setting is not None:
        env[SETTING] = setting
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


ALL_ALIASED = [0, 0, 0, 0]


@pytest.fixture(scope="module")
def dense_off():
    return run_child(DENSE.format(offsets=ALL_ALIASED), "0")


@pytest.mark.slow
def test_dense_aliased_buffers_move_once_values_unchanged(dense_off):
    on = run_child(DENSE.format(offsets=ALL_ALIASED))
    # grad, var, m, v: every pair aliased before; var and both slots moved (the gradient
    # stays), each once, and then no pair is aliased.
    assert len(on["before"]) == 6
    assert on["after"] == []
    assert on["first"]["enabled"] is True
    assert on["first"]["moved_buffers"] == 3
    assert on["first"]["moved_bytes"] == 3 * 8192 * 64 * 4
    assert on["stats"] == on["first"]  # later steps move nothing
    assert on["stable"]
    assert on["held_unchanged"]  # the read taken before the update kept its values
    assert on["digest"] == dense_off["digest"]  # bit-for-bit the update without moving


def test_dense_separation_off(dense_off):
    assert dense_off["stats"] == dict(enabled=False, moved_buffers=0, moved_bytes=0, failures=0)
    # (Where the buffers end up is then TF's copy-on-write's business: it copies memory it
    # does not own, as these adopted NumPy buffers, on the first update.)
    assert dense_off["held_unchanged"]


def test_dense_only_the_aliased_buffer_moves(dense_off):
    # var and v 128 KB off the period (not aliased), m aliased with the gradient only.
    out = run_child(DENSE.format(offsets=[128 << 10, 0, 256 << 10, 0]))
    assert sorted(map(tuple, out["before"])) == [(2, 0)]  # (m, grad)
    assert out["after"] == []
    assert out["stats"]["moved_buffers"] == 1


def test_dense_far_apart_nothing_moves():
    out = run_child(DENSE.format(offsets=[0, 128 << 10, 256 << 10, 384 << 10]))
    assert out["before"] == [] and out["after"] == []
    assert out["stats"]["moved_buffers"] == 0


@pytest.mark.slow
def test_sparse_slots_move_away_from_the_table():
    on, off = run_child(SPARSE), run_child(SPARSE, "0")
    # (After a sparse update TF reads the variables by copy, so their addresses are not
    # observable from here: the counts say what moved, and that nothing moved again.)
    assert len(on["before"]) == 3
    assert on["stats"]["moved_buffers"] == 2  # m and v; var, first, stays
    assert off["stats"]["moved_buffers"] == 0
    assert on["digest"] == off["digest"]


@pytest.mark.slow
def test_group_member_buffers_move_small_members_stay():
    on, off = run_child(GROUP), run_child(GROUP, "0")
    assert len(on["before"]) == 6 and on["after"] == []
    assert on["stats"]["moved_buffers"] == 3
    assert on["small_stayed"]
    assert on["digest"] == off["digest"]


def test_info_reports_the_setting():
    from fusedopt import info

    assert info.buffer_separation_status().startswith("on")
    os.environ[SETTING] = "0"
    try:
        assert info.buffer_separation_status().startswith("off")
    finally:
        del os.environ[SETTING]
