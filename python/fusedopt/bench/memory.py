"""Memory-bound behaviour of the sparse LazyAdam step: scaling and achieved bandwidth."""
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

from fusedopt.bench.config import BETA1, BETA2, EPS, LR, THREADS
from fusedopt.bench.timing import cycling, median_ms, quiet_function, time_contenders


def huge_pages_available():
    from fusedopt.info import huge_pages_available as available  # imports TensorFlow
    return available()


def anon_huge_pages_mb():
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def lazy_adam_table(tf, cfg, rows, ids, num_batches):
    """A rows x dim LazyAdam table (var, m, v) and `num_batches` batches of `ids` uniform
    ids with their gradients (more batches: fewer rows still cached from before), and the
    batches' mean number of distinct ids."""
    rng = np.random.default_rng(2)
    variables = [tf.Variable(tf.zeros([rows, cfg["dim"]])) for _ in range(3)]
    ids_list = [rng.integers(0, rows, ids) for _ in range(num_batches)]
    batches = [(tf.constant(i), tf.constant(rng.normal(0, 1, (ids, cfg["dim"])).astype(np.float32)))
               for i in ids_list]
    return variables, batches, float(np.mean([len(np.unique(i)) for i in ids_list]))


def lazy_adam_update(tf, variables, form="tf.function"):
    """The fused sparse LazyAdam op on `variables` in one of TABLE_FORMS: a tf.function, or
    compiled by XLA with the op's custom call (XLA:CPU's lowering) or its HLO lowering
    (XLA:GPU's, forced here with FUSEDOPT_XLA_LOWERING=hlo)."""
    from fusedopt import ops

    var, m, v = variables
    update = quiet_function(tf, lambda i, g: ops.resource_sparse_apply_lazy_adam(
        var, m, v, 0.5, 0.5, LR, BETA1, BETA2, EPS, g, i), jit_compile=form != "tf.function")
    if form != "XLA, HLO lowering":
        return update

    def hlo_update(i, g):  # the lowering is chosen when the step compiles, at its first call
        os.environ["FUSEDOPT_XLA_LOWERING"] = "hlo"
        try:
            update(i, g)
        finally:
            del os.environ["FUSEDOPT_XLA_LOWERING"]
    return hlo_update


TABLE_FORMS = ("tf.function", "XLA, custom call", "XLA, HLO lowering")


def sparse_lazy_adam_step(tf, cfg, rows, ids, num_batches):
    """A fused sparse LazyAdam step (a tf.function) on a new rows x dim table, cycling
    through `num_batches` batches of `ids` uniform ids."""
    variables, batches, _ = lazy_adam_table(tf, cfg, rows, ids, num_batches)
    update = lazy_adam_update(tf, variables)
    return cycling(lambda i, g, t: update(i, g), batches)


def wait_for_huge_pages(timeout_s=300):
    """Waits until the op library's background thread has collapsed what it was given
    (cc/core/huge_pages.h): a long run's steady state, not its first seconds."""
    from fusedopt import runtime

    deadline = time.monotonic() + timeout_s
    while runtime.huge_page_stats()["pending_bytes"] > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return runtime.huge_page_stats()


def table_scaling(tf, cfg, forms=("tf.function",)):
    """Step time at fixed ids per step (uniform) as the table grows: {form: {table rows:
    ms}} for each of `forms` (TABLE_FORMS; the XLA forms at the two largest tables only,
    the pair the aims compare, timed in fewer steps: the HLO lowering's step is ~10x the
    others), the sizes interleaved (memory speed on a shared machine drifts); {table rows:
    distinct ids per step}; the huge-page memory seen at the end."""
    tables = {rows: lazy_adam_table(tf, cfg, rows, cfg["scaling_ids"], 16)
              for rows in cfg["tables"]}
    steps = {}
    for form in forms:
        for rows in cfg["tables"] if form == "tf.function" else sorted(cfg["tables"])[-2:]:
            variables, batches, _ = tables[rows]
            update = lazy_adam_update(tf, variables, form)
            steps[form, rows] = cycling(lambda i, g, t, update=update: update(i, g), batches)
            steps[form, rows]()  # compiled; the ops see each table once: huge pages advised
    wait_for_huge_pages()
    ms = {}
    for group in ({k: s for k, s in steps.items() if k[0] == "tf.function"},
                  {k: s for k, s in steps.items() if k[0] != "tf.function"}):
        if not group:
            continue
        slow = any(form != "tf.function" for form, _ in group)
        times = median_ms(time_contenders(
            group, max(2, cfg["scaling_steps"] // 4) if slow else cfg["scaling_steps"],
            cfg["repeats"] if slow else 3 * cfg["repeats"], lambda _: None))
        for (form, rows), value in times.items():
            ms.setdefault(form, {})[rows] = value
    distinct = {rows: table[2] for rows, table in tables.items()}
    return ms, distinct, anon_huge_pages_mb()


def table_scaling_child(tf, cfg):
    """The ``--table-scaling-child`` run: table_scaling, printed as JSON for the parent."""
    ms, _, huge_mb = table_scaling(tf, cfg)
    print(json.dumps({"ms": ms["tf.function"], "anon_huge_pages_MB": huge_mb}))
    return 0


def table_scaling_with_small_pages(quick):
    """table_scaling in a child process with the ops' huge-page advice off
    (FUSEDOPT_HUGE_PAGES=0): 4 KB pages, as TensorFlow allocates them."""
    from fusedopt.info import HUGE_PAGES_SETTING

    child = subprocess.run(
        [sys.executable, "-m", "fusedopt.bench", "--table-scaling-child"]
        + (["--quick"] if quick else []),
        env={**os.environ, HUGE_PAGES_SETTING: "0"}, capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def scenario_scaling(tf, cfg, progress, quick):
    """Step time vs touched rows, and vs table rows twice: at default settings (the ops put
    tables of 32 MB or more on transparent huge pages), and in a child process with that
    off (FUSEDOPT_HUGE_PAGES=0: 4 KB pages). Rows of a 10M-row table sit on different
    pages, so with 4 KB pages nearly every row costs a TLB miss and page walk on top of
    its DRAM miss."""
    out = {"touched_rows": {}, "table_rows": {}}
    # The child first, while this process holds no table: both hold ~8 GB at 10M rows.
    if huge_pages_available():
        result = table_scaling_with_small_pages(quick)
        out["table_rows_small_pages"] = {int(k): v for k, v in result["ms"].items()}
        progress(f"scaling: table rows, huge pages off (4 KB pages) -> "
                 f"{out['table_rows_small_pages']}")
    for ids in cfg["touched"]:
        step = sparse_lazy_adam_step(tf, cfg, cfg["scaling_table"], ids, 2)
        step()
        wait_for_huge_pages()  # a new table: timed once its collapse is done
        out["touched_rows"][ids] = median_ms(time_contenders(
            {"fusedopt": step}, cfg["scaling_steps"], cfg["repeats"], lambda _: None))["fusedopt"]
        progress(f"scaling: {ids:,} touched rows -> {out['touched_rows'][ids]:.2f} ms")
        del step
        gc.collect()  # this table's variables (held in reference cycles), before the next
    ms, out["distinct_ids"], out["huge_pages_MB"] = table_scaling(tf, cfg, TABLE_FORMS)
    out["table_rows"] = ms.pop("tf.function")
    out["table_rows_xla"] = ms
    huge = out["huge_pages_MB"]
    progress(f"scaling: table rows (default settings, "
             + (f"{huge:,.0f} MB on huge pages" if huge is not None else "huge pages unknown")
             + f") -> {out['table_rows']}")
    return out


def best_seconds(fn, repeats):
    """The fastest of `repeats` timed calls, after one untimed (as the probes report)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def adam_op_gb_per_s(tf, n, repeats):
    """GB/s of fusedopt's dense Adam op on n float32 parameters (28 bytes each)."""
    from fusedopt import ops

    var, m, v = (tf.Variable(tf.zeros([n])) for _ in range(3))
    grad = tf.fill([n], 0.5)
    step = quiet_function(tf, lambda: ops.resource_apply_lazy_adam(
        var, m, v, 0.9, 0.999, LR, BETA1, BETA2, EPS, grad))
    return 7 * 4 * n / best_seconds(step, repeats) / 1e9  # read var, m, v, grad; write var, m, v


def adam_core_gb_per_s(n, repeats):
    """GB/s of the same kernel called through fusedopt._core on NumPy arrays."""
    from fusedopt import _core

    arrays = [np.zeros(n, np.float32) for _ in range(3)]
    grad = np.full(n, 0.5, np.float32)
    hyper = dict(beta1_power=0.9, beta2_power=0.999, lr=LR, beta1=BETA1, beta2=BETA2, epsilon=EPS)
    seconds = best_seconds(lambda: _core.apply_dense(
        "lazy_adam", arrays[0], arrays[1:], grad, hyper, num_threads=THREADS), repeats)
    return 7 * 4 * n / seconds / 1e9


def scenario_bandwidth(tf, cfg, progress):
    """Memory bandwidth this machine sustains, and fusedopt's share of it.

    Probes and Adam run on arrays far larger than the last-level cache at full size
    (the dense scenario's 16M parameters, 256 MB with slots, partly fit in a large L3),
    so both measure DRAM. Probes: ``fusedopt._core.memory_bandwidth`` (C++ threads,
    STREAM-style, bytes that actually cross the bus; "update3" has Adam's exact traffic
    with no math; see cc/pybind/bandwidth.h). The aim compares with the best probe.
    """
    from fusedopt import _core

    n, repeats = cfg["bandwidth_params"], cfg["repeats"]
    measured = {f"{kernel} ({THREADS} threads)": _core.memory_bandwidth(kernel, n, THREADS, repeats)
                for kernel in ("copy", "triad", "update", "update3")}
    peak = max(measured.values())
    progress(f"bandwidth probes: {', '.join(f'{k} {v:.1f} GB/s' for k, v in measured.items())}")
    op_gbs = adam_op_gb_per_s(tf, n, repeats)
    gc.collect()  # the op's variables, before the NumPy arrays of the same size
    core_gbs = adam_core_gb_per_s(n, repeats)
    out = {"params": n, "measured_GB_per_s": measured, "peak_GB_per_s": peak,
           "fusedopt_op_adam_GB_per_s": op_gbs, "fusedopt_op_adam_pct": 100 * op_gbs / peak,
           "fusedopt_core_adam_GB_per_s": core_gbs,
           "fusedopt_core_adam_pct": 100 * core_gbs / peak}
    progress(f"bandwidth: peak {peak:.1f} GB/s; fused Adam op {op_gbs:.1f} GB/s "
             f"({out['fusedopt_op_adam_pct']:.0f}%), raw kernel {core_gbs:.1f} GB/s")
    return out
