"""fusedopt._core.sparse_floor, the benchmark's floor of a sparse step (issue 33): what it
reports and what it refuses. Its figures are measured, never asserted against a time."""
import json
import os
import re
import subprocess
import sys

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


# --- refused before allocating; never stalled by more threads than cores (child processes)

CHILD = """if 1:
    import json, resource, sys
    import numpy as np
    from fusedopt import _core
    args = json.loads(sys.argv[1])
    batches = [np.zeros(n, np.int64) for n in args.pop("batch_sizes")]
    if args.pop("address_space_limit"):  # what is mapped now + 1 GiB: a buffer the size of
        with open("/proc/self/status") as f:  # the batch would fail, not swap or be OOM-killed
            vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        limit = vm * 1024 + (1 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        out = {"result": _core.sparse_floor(batches, **args)}
    except Exception as e:
        out = {"error": type(e).__name__, "message": str(e)}
    # The peak of this process's own memory (VmHWM; ru_maxrss keeps the parent's peak
    # across the exec that started this process, e.g. a test worker holding TensorFlow).
    with open("/proc/self/status") as f:
        hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    out["maxrss_mb"] = hwm_kb / 1024
    print(json.dumps(out))
"""


def _child(timeout, **args):
    import fusedopt

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fusedopt.__file__)))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [package_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
ROW = 1 << 20  # floats (4 MiB rows): a few thousand ids fill half of this machine's memory


def _ids(fraction):
    """A batch size whose gradient rows take `fraction` of this machine's memory."""
    return int(fraction * MEMORY / (4 * ROW)) + 1


# (num_rows, element_slots, batch sizes): each over half the memory only with the batch's
# buffers counted; the first two with tables of 8 MB, the last with tables under half.
BATCH_OVER_HALF = {
    "gradient_alone": (2, 0, [_ids(0.5)]),
    "gradient_and_summed_rows": (2, 0, [_ids(0.2), _ids(0.2)]),
    "tables_and_batch": (int(0.15 * MEMORY / (4 * ROW)), 1, [_ids(0.15)]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BATCH_OVER_HALF))
def test_refuses_batches_beyond_the_memory_before_allocating_them(case):
    """Every buffer is counted (tables, gradient, ids, summed rows, grouping): a batch whose
    buffers would take more than half of the memory is refused by name and size, under an
    address-space limit that any buffer of that size would break (MemoryError)."""
    num_rows, element_slots, sizes = BATCH_OVER_HALF[case]
    out = _child(60, batch_sizes=sizes, address_space_limit=True, num_rows=num_rows,
                 row_size=ROW, element_slots=element_slots, repeats=1)
    assert out.get("error") == "ValueError", out
    found = re.fullmatch(r"the probe would take (\d+) MB \(tables (\d+) MB, gradient (\d+) MB, "
                         r"ids (\d+) MB, grouping (\d+) MB\), more than half of this machine's "
                         r"memory \((\d+) MB\)", out["message"])
    assert found, out["message"]
    total, tables, gradient, ids, grouping, memory = map(int, found.groups())
    assert memory == int(MEMORY / 1e6)
    assert tables == int(4 * num_rows * ROW * (1 + element_slots) / 1e6) < memory / 2
    assert gradient == int(4 * max(sizes) * ROW / 1e6)
    assert ids == int(8 * sum(sizes) / 1e6)
    assert grouping >= int(4 * sum(sizes) * ROW / 1e6)  # the summed rows, and the hash
    assert abs(total - (tables + gradient + ids + grouping)) <= 4
    assert total > memory / 2
    assert out["maxrss_mb"] < 1024, out  # nothing of the batch's size was touched


@pytest.mark.slow
def test_more_threads_than_cores_does_not_stall():
    """The threads meet at a barrier twice a batch: one that spun without yielding took
    about a second per repeat for 64 threads on 2 cores (1000 repeats: a quarter of an hour);
    yielding, a few seconds."""
    threads = min(256, max(64, 4 * (os.cpu_count() or 1)))
    out = _child(120, batch_sizes=[256], address_space_limit=False, num_rows=100, row_size=4,
                 element_slots=1, num_threads=threads, repeats=1000)
    assert out["result"]["distinct_rows"] == 1, out
