"""Is the sparse step flat in the table's size? LazyAdam's step per touched row, small table against large.

    python benchmarks/experiments/table_size_flat.py [--rounds 5] [--out FILE.json] [--quick]

fusedopt's raw sparse LazyAdam op on a 1M x 64 and a 10M x 64 table (100K Zipf ids a step),
in three forms sharing the tables: a tf.function, XLA's custom call (jit_compile) and XLA's
HLO lowering (jit_compile with FUSEDOPT_XLA_LOWERING=hlo when it compiles). Every form and
size is built and run once, the op library's huge-page collapse is waited for (a long run's
steady state), then all are timed in alternating rounds. Beside them, the plain-C++ floor
probe (fusedopt._core.sparse_floor: group the ids, then read, update and write the touched
rows) on the same ids. Reports each form's time per touched row, large table over small.
--quick: tiny sizes (a smoke run: the numbers mean nothing).
"""
import argparse
import json
import os
import time

import numpy as np

DIM, STEPS = 64, 8
FORMS = ("tf.function", "XLA custom call", "XLA HLO lowering")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes, ids_per_step = ((2_000, 20_000), 500) if args.quick else ((1_000_000, 10_000_000),
                                                                      100_000)
    import tensorflow as tf
    from fusedopt import _core, ops
    from fusedopt.bench.memory import wait_for_huge_pages
    from fusedopt.bench.sparse import zipf_ids

    rng = np.random.default_rng(0)
    grad = tf.constant(rng.standard_normal((ids_per_step, DIM)).astype(np.float32))
    steps, batches = {}, {}
    for rows in sizes:
        batches[rows] = [zipf_ids(rng, rows, ids_per_step).astype(np.int32) for _ in range(4)]
        ids = [tf.constant(b) for b in batches[rows]]
        var = tf.Variable(tf.random.uniform((rows, DIM)))
        m, v = tf.Variable(tf.zeros((rows, DIM))), tf.Variable(tf.zeros((rows, DIM)))
        for form in FORMS:
            def update(i, var=var, m=m, v=v):
                ops.resource_sparse_apply_lazy_adam(var, m, v, 0.9, 0.999, 1e-3, 0.9, 0.999,
                                                    1e-7, grad, i)
            fn = tf.function(update, jit_compile=form != "tf.function")
            if form == "XLA HLO lowering":
                os.environ["FUSEDOPT_XLA_LOWERING"] = "hlo"
            try:
                for i in ids:
                    fn(i)  # compiled here, with this lowering
            finally:
                os.environ.pop("FUSEDOPT_XLA_LOWERING", None)
            steps[rows, form] = (fn, ids)
    huge_pages = wait_for_huge_pages()
    times = {key: [] for key in steps}
    keys = list(steps)
    for r in range(args.rounds):
        for key in (keys if r % 2 == 0 else keys[::-1]):
            fn, ids = steps[key]
            t0 = time.perf_counter()
            for s in range(STEPS):
                fn(ids[s % 4])
            times[key].append((time.perf_counter() - t0) / STEPS * 1e3)
    steps.clear()
    unique = {rows: float(np.mean([len(np.unique(b)) for b in batches[rows]])) for rows in sizes}
    floor = {rows: min((_core.sparse_floor(batches[rows], rows, DIM, element_slots=2,
                                           row_slots=0, num_threads=2, repeats=6)
                        for _ in range(2)), key=lambda p: p["floor_ms"]) for rows in sizes}
    small, large = sizes
    summary = {}
    for form in FORMS:
        ms = {rows: float(np.median(times[rows, form])) for rows in sizes}
        summary[form] = {"small_ms": ms[small], "large_ms": ms[large],
                         "per_touched_row_large_over_small":
                             (ms[large] / unique[large]) / (ms[small] / unique[small])}
    summary["floor (plain C++)"] = {
        "small_ms": floor[small]["floor_ms"], "large_ms": floor[large]["floor_ms"],
        "per_touched_row_large_over_small": (floor[large]["floor_ms"] / unique[large])
        / (floor[small]["floor_ms"] / unique[small])}
    for name, row in summary.items():
        print("%-18s %d rows %.2f ms, %d rows %.2f ms: per touched row %.2f" % (
            name, small, row["small_ms"], large, row["large_ms"],
            row["per_touched_row_large_over_small"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"sizes": list(sizes), "dim": DIM, "ids_per_step": ids_per_step,
                       "unique_ids": {str(r): u for r, u in unique.items()},
                       "huge_pages": huge_pages, "summary": summary,
                       "runs_ms": {f"{r} {form}": t for (r, form), t in times.items()},
                       "floor": {str(r): p for r, p in floor.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
