"""Huge pages by default (cc/core/huge_pages.h): the CPU engine advises transparent huge
pages for variables and slots of 32 MB or more and collapses each such buffer once, in a
background thread; FUSEDOPT_HUGE_PAGES=0 turns that off. Values never depend on it.

Each case runs in a child process (the setting is read once per process) and reads the
process's AnonHugePages from /proc/self/smaps_rollup before and after. NumPy's own
huge-page advice is switched off there, so only ours can put the arrays on huge pages."""
import json
import os
import subprocess
import sys

import pytest

from fusedopt import info

MB = 1 << 20

needs_thp = pytest.mark.skipif(
    not (info.huge_pages_available() and info.kernel_can_collapse()),
    reason="this kernel gives no transparent huge pages (THP 'never' or absent) or has no "
           "MADV_COLLAPSE (Linux < 6.1)")
# In THP "always" mode memory is huge from its first write whatever we do: the page counts
# then say nothing about our advice, and only the counters are checked.
MADVISE_MODE = info.transparent_huge_pages_mode() == "madvise"

PRELUDE = r"""
import hashlib, json, os, time
import numpy as np
try:
    np._core.multiarray._set_madvise_hugepage(False)
except AttributeError:
    np.core.multiarray._set_madvise_hugepage(False)

def huge_mb():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    return 0.0

def settle(stats):
    deadline = time.monotonic() + 120
    while stats()["pending_bytes"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats()

def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()

HYPER = dict(beta1_power=0.9, beta2_power=0.999, lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7)
rng = np.random.default_rng(0)
"""

CORE = PRELUDE + r"""
from fusedopt import _core
rows, dim, sparse = {rows}, 64, {sparse}
arrays = [np.empty((rows, dim), np.float32) for _ in range(3)]
for a in arrays:
    a[...] = rng.normal(size=(rows, dim)).astype(np.float32)  # written: 4 KB pages now
before = huge_mb()
ids = rng.integers(0, rows, 4096)
grad = rng.normal(size=(4096, dim)).astype(np.float32)
for _ in range(3):
    if sparse:
        _core.apply_sparse("lazy_adam", arrays[0], arrays[1:], grad, ids, HYPER)
    else:
        _core.apply_dense("lazy_adam", arrays[0], arrays[1:], np.ones_like(arrays[0]), HYPER)
stats = settle(_core.huge_page_stats)
print(json.dumps(dict(stats=stats, delta_mb=huge_mb() - before, digest=digest(*arrays))))
"""

OPS = PRELUDE + r"""
import tensorflow as tf
from fusedopt import ops
rows, dim = {rows}, 64
var, m, v = (tf.Variable(rng.normal(size=(rows, dim)).astype(np.float32)) for _ in range(3))
before = huge_mb()
ids = tf.constant(rng.integers(0, rows, 4096))
grad = tf.constant(rng.normal(size=(4096, dim)).astype(np.float32))
for _ in range(3):
    ops.resource_sparse_apply_lazy_adam(var, m, v, grad=grad, indices=ids, **HYPER)
stats = settle(ops.huge_page_stats)
print(json.dumps(dict(stats=stats, delta_mb=huge_mb() - before,
                      digest=digest(var.numpy(), m.numpy(), v.numpy()))))
"""


def run_child(code, setting):
    env = {k: v for k, v in os.environ.items() if k != info.HUGE_PAGES_SETTING}
    if setting is not None:
        env[info.HUGE_PAGES_SETTING] = setting
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_huge(result, buffers, buffer_bytes):
    """Every buffer advised and queued once; what was collapsed is on huge pages now."""
    stats = result["stats"]
    assert stats["enabled"] is True
    assert stats["advised_calls"] >= buffers
    assert stats["pending_bytes"] == 0
    assert stats["collapsed_buffers"] + stats["collapse_failures"] == buffers, stats
    # Whole 2 MB pages inside each buffer: at most one page short at each end.
    assert stats["collapsed_bytes"] <= buffers * buffer_bytes
    assert stats["collapsed_bytes"] >= 0.5 * buffers * buffer_bytes, stats  # kernel may refuse a few
    if MADVISE_MODE:
        assert result["delta_mb"] * MB >= 0.9 * stats["collapsed_bytes"], result


def check_off(result):
    stats = result["stats"]
    assert stats["enabled"] is False
    assert stats["advised_calls"] == stats["collapsed_bytes"] == stats["pending_bytes"] == 0
    if MADVISE_MODE:
        assert result["delta_mb"] < 32, result  # nothing of ours on huge pages


@pytest.mark.slow
@needs_thp
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_core_puts_big_buffers_on_huge_pages_and_values_do_not_change(sparse):
    rows = 256 * 1024  # 64 MB per buffer
    default = run_child(CORE.format(rows=rows, sparse=sparse), None)
    check_huge(default, buffers=3, buffer_bytes=rows * 64 * 4)
    off = run_child(CORE.format(rows=rows, sparse=sparse), "0")
    check_off(off)
    assert default["digest"] == off["digest"]
    assert run_child(CORE.format(rows=rows, sparse=sparse), "1")["stats"]["enabled"] is True


def test_small_buffers_are_left_alone():
    rows = 64 * 1024  # 16 MB per buffer: below the 32 MB threshold
    result = run_child(CORE.format(rows=rows, sparse=True), None)
    stats = result["stats"]
    assert stats["enabled"] is True
    assert stats["advised_calls"] == stats["collapsed_bytes"] == stats["pending_bytes"] == 0


@pytest.mark.slow
@needs_thp
def test_tf_ops_put_a_big_table_on_huge_pages_and_values_do_not_change():
    rows = 256 * 1024
    default = run_child(OPS.format(rows=rows), None)
    check_huge(default, buffers=3, buffer_bytes=rows * 64 * 4)
    off = run_child(OPS.format(rows=rows), "0")
    check_off(off)
    assert default["digest"] == off["digest"]


def test_info_names_the_setting():
    line = info.huge_pages_status()
    assert line.split()[0] in ("on", "off", "unavailable")
    if info.huge_pages_available() and os.environ.get(info.HUGE_PAGES_SETTING) != "0":
        assert line.startswith("on") and "FUSEDOPT_HUGE_PAGES=0" in line


# Issue 30, item 5: a range MADV_COLLAPSE fails on (Linux 6.18 returns EINVAL for memory
# never written, as np.zeros slots are) must not turn collapsing off for the process.
FAILED_RANGE_FIRST = PRELUDE + r"""
from fusedopt import _core
rows, dim = {rows}, 64
ids = rng.integers(0, 16, 16)  # a few rows: the zero slots stay almost all unwritten
grad = rng.normal(size=(16, dim)).astype(np.float32)
untouched = [np.zeros((rows, dim), np.float32) for _ in range(3)]  # never written
_core.apply_sparse("lazy_adam", untouched[0], untouched[1:], grad, ids, HYPER)
first = settle(_core.huge_page_stats)
written = [np.empty((rows, dim), np.float32) for _ in range(3)]
for a in written:
    a[...] = rng.normal(size=(rows, dim)).astype(np.float32)
_core.apply_sparse("lazy_adam", written[0], written[1:], grad, ids, HYPER)
second = settle(_core.huge_page_stats)
print(json.dumps(dict(first=first, second=second)))
"""


@needs_thp
def test_a_failed_range_does_not_stop_later_collapses():
    rows = 160 * 1024  # 40 MB per buffer
    result = run_child(FAILED_RANGE_FIRST.format(rows=rows), None)
    first, second = result["first"], result["second"]
    # Counted truthfully: each queued buffer either collapsed (every chunk) or failed.
    assert first["collapsed_buffers"] + first["collapse_failures"] == 3, result
    assert second["collapsed_buffers"] + second["collapse_failures"] == 6, result
    assert second["pending_bytes"] == 0, result
    # The written buffers collapse, whatever happened to the unwritten ones before.
    assert second["collapsed_buffers"] - first["collapsed_buffers"] == 3, result
