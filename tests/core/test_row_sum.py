"""The order in which a per-row phase sums over a row (cc/core/row_sum.h), checked bit for
bit on the CPU engine (fusedopt._core) against an independent NumPy model.

Element i of a row goes to lane i % 32, each lane sums its elements left to right, then the
32 lanes fold in halves (lane j += lane j + w, w = 16, 8, 4, 2, 1). The CUDA engine's warp
reduction and the XLA lowerings compute the same sums (tests/gpu, tests/xla).

Row-wise Adagrad from accum = 0 leaves accum = row_sum(g²) / D (one division in the compute
type), so the slot shows the row sum.
"""
import numpy as np
import pytest

from fusedopt import _core
from numpy_reference import np_dtype

HYPER = dict(lr=0.0, epsilon=1.0)
COMPUTE = {"float16": np.float32, "bfloat16": np.float32, "float32": np.float32,
           "float64": np.float64}
WIDTHS = [1, 5, 31, 32, 33, 64, 100, 257, 1000]


def lane_sum(terms):
    """The model of RowSum: 32 lanes, left to right within a lane, folded in halves."""
    compute = terms.dtype
    lanes = [compute.type(0)] * 32
    for i, x in enumerate(terms):
        lanes[i % 32] = compute.type(lanes[i % 32] + x)
    width = 16
    while width:
        for j in range(width):
            lanes[j] = compute.type(lanes[j] + lanes[j + width])
        width //= 2
    return lanes[0]


def plain_sum(terms):
    total = terms.dtype.type(0)
    for x in terms:
        total = terms.dtype.type(total + x)
    return total


def expected_accum(grad_rows, dtype):
    """accum after one step from 0, row by row, by the model."""
    compute = np.dtype(COMPUTE[dtype])
    out = []
    for row in grad_rows:
        g = row.astype(compute)
        out.append(compute.type(lane_sum(g * g) / compute.type(len(g))))
    return np.array(out, compute).astype(np_dtype(dtype))


def spread_grad(rng, shape, dtype):
    """Magnitudes over many binades, so different summation orders round differently."""
    g = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))
    if dtype == "float16":
        g = g * 1e-2  # squares stay finite in float32, the values in half
    return g.astype(np_dtype(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_row_sums_follow_the_shared_order(dtype, sparse):
    rng = np.random.default_rng(3)
    differs_from_plain = 0
    for width in WIDTHS:
        rows = 6
        t = np_dtype(dtype)
        var = np.zeros((rows, width), t)
        accum = np.zeros(rows, t)
        grad = spread_grad(rng, (rows, width), dtype)
        if sparse:  # each row once, in a shuffled order: the sums are the rows themselves
            order = rng.permutation(rows).astype(np.int64)
            _core.apply_sparse("row_wise_adagrad", var, [accum], grad[order], order, HYPER, {})
        else:
            _core.apply_dense("row_wise_adagrad", var, [accum], grad, HYPER, {})
        want = expected_accum(grad, dtype)
        np.testing.assert_array_equal(accum.view(np.uint8), want.view(np.uint8),
                                      err_msg=f"rows of {width}")
        compute = np.dtype(COMPUTE[dtype])
        for row in grad:
            g = row.astype(compute)
            differs_from_plain += int(plain_sum(g * g) != lane_sum(g * g))
    if dtype in ("float32", "float64"):
        # The data is spread enough that the order matters: the check could tell.
        assert differs_from_plain >= 3


def test_duplicates_are_summed_first_then_the_row():
    """A row named twice: its gradient rows summed (sum_order.h), then squared and summed
    across the row (row_sum.h): the mean of the summed row's squares, not of each id's."""
    var = np.zeros((3, 4), np.float32)
    accum = np.zeros(3, np.float32)
    grad = np.array([[1, 2, 3, 4], [1, 0, -1, 2]], np.float32)
    _core.apply_sparse("row_wise_adagrad", var, [accum], grad, np.array([1, 1]), HYPER, {})
    summed = grad.sum(axis=0)
    np.testing.assert_array_equal(accum, [0.0, (summed * summed).mean(), 0.0])
    assert var.tolist() == np.zeros((3, 4)).tolist()  # lr 0


def test_rows_of_no_elements_keep_their_accumulator():
    var = np.zeros((3, 0), np.float32)
    accum = np.array([0.5, 0.25, 1.0], np.float32)
    _core.apply_dense("row_wise_adagrad", var, [accum], np.zeros((3, 0), np.float32), HYPER, {})
    _core.apply_sparse("row_wise_adagrad", var, [accum], np.zeros((2, 0), np.float32),
                       np.array([0, 2]), HYPER, {})
    assert accum.tolist() == [0.5, 0.25, 1.0]
