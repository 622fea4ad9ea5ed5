"""Large tables: sparse updates of rows whose element offsets lie past 2^31 (all index
arithmetic must be 64-bit). Opt-in, needs ~10 GB of memory and a minute or two:

    FUSEDOPT_LARGE_TESTS=1 pytest -m large tests/core/test_large.py

The TF test uses a bfloat16 table of (2^31/64 + 10) x 64 elements (4.3 GB) with an
Adagrad accumulator (another 4.3 GB); the _core test a float32 table of the same shape
from np.zeros (calloc: only the touched pages become resident).
"""

import os

import numpy as np
import pytest

import numpy_reference as npref

pytestmark = [
    pytest.mark.large,
    pytest.mark.skipif(os.environ.get("FUSEDOPT_LARGE_TESTS") != "1",
                       reason="large-memory test; set FUSEDOPT_LARGE_TESTS=1 to run"),
]

COLS = 64
ROWS = 2**31 // COLS + 10  # 2^31 + 640 elements
# Rows around the 2^31-element boundary and the last rows, with duplicates.
INDICES = [ROWS - 1, 2**25 - 1, 2**25, ROWS - 1, 0, ROWS - 2, 2**25 + 3, ROWS - 10, 2**25]
HYPER = dict(lr=0.5, epsilon=0.1)


def _grad(dtype):
    rng = np.random.default_rng(0)
    g = rng.integers(-8, 9, (len(INDICES), COLS)) / 4.0  # exact in bfloat16
    return g.astype(dtype)


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_tf_resource_sparse_past_2_31(index_dtype):
    import tensorflow as tf
    import fusedopt.ops as fops

    bf16 = tf.bfloat16.as_numpy_dtype
    var = tf.Variable(tf.fill([ROWS, COLS], tf.constant(1.0, tf.bfloat16)))
    acc = tf.Variable(tf.fill([ROWS, COLS], tf.constant(0.25, tf.bfloat16)))
    assert var.shape.num_elements() > 2**31
    idx = np.asarray(INDICES, index_dtype)
    grad = _grad(bf16)
    fops.resource_sparse_apply_adagrad(var, acc, HYPER["lr"], HYPER["epsilon"],
                                       tf.constant(grad), tf.constant(idx))
    # Rows touched, and their neighbours (must be unchanged), read without copying the table.
    touched = sorted(set(INDICES))
    probe = sorted(set(touched + [2**25 - 2, 2**25 + 1, 2**25 + 4, ROWS - 3, 1]))
    got_var = var.sparse_read(probe).numpy()
    got_acc = acc.sparse_read(probe).numpy()
    # Reference on a small table holding just the probed rows (same update, remapped ids).
    pos = {r: i for i, r in enumerate(probe)}
    small_idx = np.asarray([pos[r] for r in INDICES], np.int64)
    v0 = np.ones((len(probe), COLS), bf16)
    a0 = np.full((len(probe), COLS), 0.25, bf16)
    exp_var, (exp_acc,) = npref.sparse_update("adagrad", v0, [a0], grad, small_idx, HYPER)
    npref.assert_close(got_var, exp_var, "bfloat16", "var rows past 2^31")
    npref.assert_close(got_acc, exp_acc, "bfloat16", "accum rows past 2^31")
    untouched = [pos[r] for r in probe if r not in touched]
    assert (got_var[untouched] == 1).all() and (got_acc[untouched] == 0.25).all()
    # The update really changed the last row (not a no-op that happens to match).
    assert (got_var[pos[ROWS - 1]] != 1).any()


def test_core_sparse_past_2_31():
    from fusedopt import _core

    var = np.zeros((ROWS, COLS), np.float32)  # calloc: untouched pages stay virtual
    acc = np.zeros((ROWS, COLS), np.float32)
    acc[INDICES] = 0.25
    var[INDICES] = 1.0
    probe = sorted(set(INDICES))
    v0, a0 = var[probe].copy(), acc[probe].copy()
    grad = _grad(np.float32)
    idx = np.asarray(INDICES, np.int64)
    _core.apply_sparse("adagrad", var, [acc], grad, idx, HYPER, {}, num_threads=2)
    pos = {r: i for i, r in enumerate(probe)}
    exp_var, (exp_acc,) = npref.sparse_update(
        "adagrad", v0, [a0], grad, np.asarray([pos[r] for r in INDICES]), HYPER)
    npref.assert_close(var[probe], exp_var, "float", "var rows past 2^31")
    npref.assert_close(acc[probe], exp_acc, "float", "accum rows past 2^31")
    assert var[2**25 + 1].tobytes() == np.zeros(COLS, np.float32).tobytes()
