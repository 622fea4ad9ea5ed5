"""The order in which the sparse engines sum a row's duplicate gradients (cc/core/sum_order.h),
checked bit for bit on the CPU engine (fusedopt._core) against an independent NumPy model.

A row named c times is summed in chunks of 32 (c <= 1024) or ceil(sqrt(c)) (larger), each
chunk left to right, then the chunk sums left to right; up to 32 duplicates that is the
plain order of appearance the engine always used, so those results are unchanged. The CUDA
engine sums in the same order (tests/gpu checks GPU == CPU bit for bit).

LazyAdam with beta1 = 0 and m = 0 leaves m = the summed gradient exactly (m += (g - 0) * 1),
so the slot shows the sum itself.
"""
import math

import numpy as np
import pytest

from fusedopt import _core
from numpy_reference import np_dtype

HYPER = dict(beta1_power=0.5, beta2_power=0.5, lr=0.0, beta1=0.0, beta2=0.5, epsilon=1.0)
COMPUTE = {"float16": np.float32, "bfloat16": np.float32, "float32": np.float32,
           "float64": np.float64}


def chunk_length(count):
    """The model of DuplicateChunkLength, written from the rule, not from the C++."""
    if count <= 32 * 32:
        return 32
    return math.isqrt(count - 1) + 1  # ceil(sqrt(count))


def ordered_sum(rows, compute):
    """rows [count, width] in storage type -> the engine's sum, in the compute type."""
    rows = rows.astype(compute)
    length = chunk_length(len(rows))
    total = None
    for start in range(0, len(rows), length):
        part = rows[start].copy()
        for row in rows[start + 1:start + length]:
            part = part + row
        total = part if total is None else total + part
    return total


def plain_sum(rows, compute):
    total = rows[0].astype(compute)
    for row in rows[1:]:
        total = total + row.astype(compute)
    return total


def summed_by_engine(dtype, num_rows, indices, grad):
    t = np_dtype(dtype)
    var = np.zeros((num_rows, grad.shape[1]), t)
    m, v = np.zeros_like(var), np.zeros_like(var)
    _core.apply_sparse("lazy_adam", var, [m, v], grad, indices, HYPER, {})
    return m


def spread_grad(rng, shape, dtype):
    """Magnitudes over many binades, so different summation orders round differently."""
    g = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))
    return g.astype(np_dtype(dtype))


def test_chunk_length_model():
    assert [chunk_length(c) for c in (1, 32, 33, 1024)] == [32] * 4
    assert [chunk_length(c) for c in (1025, 1089, 1090, 70000)] == [33, 33, 34, 265]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_duplicate_sums_follow_the_shared_order(dtype):
    rng = np.random.default_rng(11)
    counts = [1, 2, 31, 32, 33, 64, 65, 1024, 1025, 1090, 5000]
    width = 5
    indices = np.concatenate([np.full(c, row, np.int64) for row, c in enumerate(counts)])
    rng.shuffle(indices)  # positions of each row interleave; order of appearance is kept
    grad = spread_grad(rng, (indices.size, width), dtype)
    if dtype == "float16":
        grad = (grad.astype(np.float32) * 1e-3).astype(np.float16)  # no overflow to inf
    got = summed_by_engine(dtype, len(counts), indices, grad)
    compute = COMPUTE[dtype]
    differs_from_plain = 0
    for row, count in enumerate(counts):
        rows = grad[indices == row]
        assert len(rows) == count
        want = ordered_sum(rows, compute).astype(np_dtype(dtype))
        np.testing.assert_array_equal(got[row].view(np.uint8), want.view(np.uint8),
                                      err_msg=f"row with {count} duplicates")
        plain = plain_sum(rows, compute).astype(np_dtype(dtype))
        if count <= 32:  # unchanged from the engine's earlier left-to-right order
            np.testing.assert_array_equal(got[row].view(np.uint8), plain.view(np.uint8))
        else:
            differs_from_plain += int(np.any(plain.view(np.uint8) != want.view(np.uint8)))
    if dtype in ("float32", "float64"):
        # The data is spread enough that the two orders really differ: the check above
        # could tell a wrong order from the right one.
        assert differs_from_plain >= 3


def test_order_does_not_depend_on_threads():
    rng = np.random.default_rng(12)
    indices = np.minimum(rng.zipf(1.3, 50_000) - 1, 999).astype(np.int32)
    grad = spread_grad(rng, (indices.size, 8), "float32")
    results = []
    for threads in (1, 2, 7):
        var = np.zeros((1000, 8), np.float32)
        m, v = np.zeros_like(var), np.zeros_like(var)
        _core.apply_sparse("lazy_adam", var, [m, v], grad, indices, HYPER, {},
                           num_threads=threads)
        results.append(m.tobytes())
    assert results[0] == results[1] == results[2]
    hottest = np.bincount(indices).argmax()
    assert np.count_nonzero(indices == hottest) > 1024  # the two-level (sqrt) case is in it
    m = np.frombuffer(results[0], np.float32).reshape(1000, 8)
    np.testing.assert_array_equal(m[hottest], ordered_sum(grad[indices == hottest], np.float32))
