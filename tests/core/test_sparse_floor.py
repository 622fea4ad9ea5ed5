"""fusedopt._core.sparse_floor, the benchmark's floor of a sparse step (issue 33): what it
reports and what it refuses. Its figures are measured, never asserted against a time."""
import numpy as np
import pytest

from fusedopt import _core


def zipf_batches(rows, n, count=2, seed=0):
    rng = np.random.default_rng(seed)
    return [((rng.zipf(1.1, n) - 1) % rows).astype(np.int64) for _ in range(count)]


@pytest.mark.parametrize("element_slots,row_slots,threads", [(2, 0, 1), (1, 0, 2), (1, 1, 2),
                                                             (0, 1, 1)])
def test_reports_both_stages_and_the_distinct_rows(element_slots, row_slots, threads):
    batches = zipf_batches(5000, 2048)
    out = _core.sparse_floor(batches, 5000, 16, element_slots, row_slots, threads, repeats=3)
    assert set(out) == {"group_ms", "rows_ms", "floor_ms", "distinct_rows"}
    assert out["group_ms"] > 0 and out["rows_ms"] > 0
    assert out["floor_ms"] == out["group_ms"] + out["rows_ms"]
    assert out["distinct_rows"] == len(np.unique(batches[0]))


def test_takes_lists_and_any_integer_dtype():
    out = _core.sparse_floor([[0, 3, 3, 1], np.array([2, 2], np.int32), np.array([4], np.uint8)],
                             5, 4, element_slots=1, repeats=1)
    assert out["distinct_rows"] == 3


@pytest.mark.parametrize("batches,message", [
    ([np.array([0, 5, 7])], r"indices\[1\] = 5 is not in \[0, 5\)"),
    ([np.array([0, -1])], r"indices\[1\] = -1 is not in \[0, 5\)"),
    ([np.array([0.5, 1.0])], "integer array, got numpy.ndarray of dtype float64"),
    (["0, 1"], "integer array, got str"),
    ([np.zeros((2, 2), np.int64)], "non-empty 1-D array"),
    ([np.zeros(0, np.int64)], "non-empty 1-D array"),
    ([], "at least one array of ids"),
])
def test_refuses_bad_ids(batches, message):
    with pytest.raises(ValueError, match=message):
        _core.sparse_floor(batches, 5, 4, element_slots=1, repeats=1)


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_rows=0), "num_rows and row_size must be positive"),
    (dict(row_size=-1), "num_rows and row_size must be positive"),
    (dict(element_slots=5), r"element_slots and row_slots must be in \[0, 4\]"),
    (dict(row_slots=-1), r"element_slots and row_slots must be in \[0, 4\]"),
    (dict(repeats=0), r"repeats must be in \[1, 10000\]"),
    (dict(num_rows=1 << 40), "num_rows \\* row_size is too large"),
    (dict(num_rows=1 << 34), "more than half of this machine's memory"),
    (dict(num_threads=0), "num_threads"),
])
def test_refuses_bad_sizes_before_mapping_anything(kwargs, message):
    args = dict(batches=[np.array([0, 1])], num_rows=5, row_size=4, element_slots=1, repeats=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        _core.sparse_floor(**args)
