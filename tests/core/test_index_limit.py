"""One limit on the number of indices per sparse call, the same on every engine:
2147483646 (the CUDA engine sorts with 32-bit positions and CUB's int item counts). The
check is part of the shared shape validation, so it runs before anything is read or
written, and these tests never touch 8 GB: NumPy's zeros are untouched virtual pages, and
TF's placeholders have shapes only."""
import numpy as np
import pytest
import tensorflow as tf

import fusedopt.ops as fops
from fusedopt import _core

LIMIT = 2147483646
HYPER = dict(lr=0.1, epsilon=0.1)


def message(n):
    return f"sparse updates take at most {LIMIT} indices per call, got {n}"


@pytest.mark.parametrize("n,rejected", [(LIMIT, False), (LIMIT + 1, True)])
def test_core_rejects_more_than_the_limit_before_reading(n, rejected):
    var = np.ones((4, 0), np.float32)  # rows of width 0: grad holds no data at any n
    acc = np.ones_like(var)
    grad = np.zeros((n, 0), np.float32)
    indices = np.zeros(n, np.int32)  # calloc'd: no page is touched unless the call reads it
    if rejected:
        with pytest.raises(ValueError, match=message(n)):
            _core.apply_sparse("adagrad", var, [acc], grad, indices, HYPER)
    else:
        # At the limit the call proceeds; out-of-range ids are still found (indices[0] = 0
        # is fine, so shrink the table to make the first one fail fast).
        with pytest.raises(ValueError, match=r"indices\[0\] = 0 is not in \[0, 0\)"):
            _core.apply_sparse("adagrad", np.ones((0, 0), np.float32),
                               [np.ones((0, 0), np.float32)], grad, indices, HYPER)


@pytest.mark.parametrize("resource", [True, False])
def test_graph_construction_rejects_more_than_the_limit(resource):
    with tf.Graph().as_default():
        if resource:
            var = tf.compat.v1.get_variable("var", [4, 3], use_resource=True)
            acc = tf.compat.v1.get_variable("acc", [4, 3], use_resource=True)
            op = fops.resource_sparse_apply_adagrad
        else:
            var = tf.compat.v1.Variable(tf.zeros([4, 3]), use_resource=False)
            acc = tf.compat.v1.Variable(tf.zeros([4, 3]), use_resource=False)
            op = fops.sparse_apply_adagrad
        grad = tf.compat.v1.placeholder(tf.float32, [LIMIT + 1, 3])
        indices = tf.compat.v1.placeholder(tf.int64, [LIMIT + 1])
        with pytest.raises(ValueError, match=message(LIMIT + 1)):
            op(var, acc, 0.1, 0.1, grad, indices)
