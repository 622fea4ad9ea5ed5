"""The ``sparse_fbgemm`` scenario: fusedopt's sparse Adagrad and row-wise Adagrad ops beside
FBGEMM's CPU TBE (EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD), the update alone and lookup +
update, at 1 and 2 threads, on the sparse scenario's Zipf ids.

FBGEMM runs in its own venv and process (``fbgemm.py``, ``fbgemm_worker.py``); without
one (FUSEDOPT_FBGEMM_PYTHON unset) the scenario prints one line and is skipped. TF's
intra-op threads are fixed per process, so fusedopt's side runs in one child process per
thread count (``--fbgemm-child THREADS``), on the same problem (``Problem`` is seeded).
Before any timing, one step of each FBGEMM optimizer is compared with fusedopt's op.

What is timed, per step, with the same (ids, gradient rows) batches on both sides:
- "update": fusedopt's sparse op in a tf.function; FBGEMM's backward (its fused
  duplicate sum + optimizer step), the forward that precedes it untimed;
- "lookup + update": the same with the lookup first, tf.gather of the ids' rows
  (returned) / FBGEMM's forward (a SUM-pooled lookup, one id per bag).
The two processes run one after the other (fusedopt's side first), not interleaved.
FBGEMM's torch allocates with transparent huge pages (THP_MEM_ALLOC_ENABLE=1) as
fusedopt's ops advise them for big tables; otherwise FBGEMM runs with its defaults and
this process's environment (on a 2-vCPU VM its OpenMP stalls at 2 threads unless
OMP_WAIT_POLICY=PASSIVE: BENCHMARKS.md, "FBGEMM CPU beside fusedopt").
"""
import json
import subprocess
import sys

import numpy as np

from fusedopt.bench import fbgemm
from fusedopt.bench.config import THREADS
from fusedopt.bench.contenders import RULES
from fusedopt.bench.memory import wait_for_huge_pages
from fusedopt.bench.sparse import Problem, SparseSteps
from fusedopt.bench.timing import MATCH_TOLERANCE, max_rel_error, time_contenders

MODES = {"update": "update", "lookup_update": "lookup + update"}


def problems(cfg):
    return {rows: Problem(rows, cfg["dim"], cfg["ids"], 1) for rows in cfg["fbgemm_tables"]}


def fusedopt_step(tf, problem, rule, batches, lookup):
    """(step, var, slots) of fusedopt's sparse op (TF's form: epsilon outside the sqrt, as
    FBGEMM), after a tf.gather of the ids' rows where `lookup`."""
    from fusedopt.bench.timing import cycling

    steps = SparseSteps(tf, problem, rule)
    var, slots = steps._variables()

    @tf.function
    def update(i, g, t):
        rows = tf.gather(var, i) if lookup else None
        steps.sparse_op(var, *slots, **RULES[rule].hyper(t), grad=g, indices=i)
        return rows
    constants = [(tf.constant(i), tf.constant(g)) for i, g in batches]
    return cycling(lambda i, g, t: update(i, g, tf.constant(float(t))), constants), var, slots


def fusedopt_seconds(tf, cfg):
    """{rows: {rule: {mode: [seconds per step, one per repeat]}}} at this process's threads."""
    out = {}
    for rows, problem in problems(cfg).items():
        steps = {(rule, mode): fusedopt_step(tf, problem, rule, problem.batches,
                                             mode == "lookup_update")[0]
                 for rule in fbgemm.OPTIMIZERS for mode in MODES}
        for step in steps.values():
            step()
        wait_for_huge_pages()
        times = time_contenders(steps, cfg["steps"], cfg["repeats"], lambda _: None)
        out[rows] = {rule: {mode: times[(rule, mode)] for mode in MODES}
                     for rule in fbgemm.OPTIMIZERS}
    return out


def child(tf, cfg):
    """The ``--fbgemm-child`` run: fusedopt_seconds, printed as JSON for the parent."""
    print(json.dumps(fusedopt_seconds(tf, cfg)))
    return 0


def fusedopt_seconds_at(tf, cfg, threads, quick):
    """fusedopt_seconds at `threads`: in this process where it has that many, else a child."""
    if threads == THREADS:
        return fusedopt_seconds(tf, cfg)
    result = subprocess.run(
        [sys.executable, "-m", "fusedopt.bench", "--fbgemm-child", str(threads)]
        + (["--quick"] if quick else []), capture_output=True, text=True, check=True)
    return {int(rows): v for rows, v in
            json.loads(result.stdout.strip().splitlines()[-1]).items()}


def check_errors(tf, problem, request):
    """Adds one "apply" step per rule to `request` and returns a function that, given the
    worker's arrays, gives {rule: max relative error of FBGEMM's table and accumulator
    against fusedopt's op after that step}."""
    batch = problem.batches[0]  # Zipf ids, with duplicates: both sum them first
    ours, jobs = {}, {}
    for rule in fbgemm.OPTIMIZERS:
        step, var, slots = fusedopt_step(tf, problem, rule, [batch], lookup=False)
        step()
        ours[rule] = (var.numpy(), slots[0].numpy())
        jobs[rule] = request.job(rule, problem.init, [batch], **_hyper(rule), threads=THREADS,
                                 state_init=RULES[rule].slot_init)

    def errors(arrays):
        out = {}
        for rule, job in jobs.items():
            ((table, state),) = fbgemm.states_after_each_step(arrays, job, 1)
            var, accum = ours[rule]
            out[rule] = max(max_rel_error(table, var),
                            max_rel_error(state.reshape(accum.shape), accum))
        return out
    return errors


def _hyper(rule):
    h = RULES[rule].hyper(1)
    return {"lr": h["lr"], "eps": h["epsilon"]}


def fbgemm_timing_jobs(request, problem, cfg):
    """{(rule, threads, mode): job index} of one table's FBGEMM timings."""
    return {(rule, threads, mode): request.job(
        rule, problem.init, problem.batches, **_hyper(rule), mode=mode, steps=cfg["steps"],
        threads=threads, state_init=RULES[rule].slot_init, repeats=cfg["repeats"])
            for rule in fbgemm.OPTIMIZERS for threads in cfg["fbgemm_threads"] for mode in MODES}


def _ms(seconds):
    return {"median_ms": 1e3 * float(np.median(seconds)), "min_ms": 1e3 * min(seconds),
            "max_ms": 1e3 * max(seconds)}


def scenario_sparse_fbgemm(tf, cfg, progress, quick):
    python, why = fbgemm.find_python()
    if python is None:
        progress(f"FBGEMM CPU peer skipped: {why}")
        return {"_skipped": why}
    by_rows = problems(cfg)
    request = fbgemm.Request()
    checks = {rows: check_errors(tf, problem, request) for rows, problem in by_rows.items()}
    timings = {rows: fbgemm_timing_jobs(request, problem, cfg) for rows, problem in by_rows.items()}
    progress(f"sparse vs FBGEMM: {len(request.jobs)} FBGEMM jobs ({python})")
    result, arrays = request.run(python, huge_pages=True)
    errors = {rows: check(arrays) for rows, check in checks.items()}
    progress(f"sparse vs FBGEMM: checked, max rel errors {errors}")
    del arrays
    ours = {}
    for threads in cfg["fbgemm_threads"]:
        ours[threads] = fusedopt_seconds_at(tf, cfg, threads, quick)
        progress(f"sparse vs FBGEMM: fusedopt timed at {threads} thread(s)")
    rows_out = []
    for rows, jobs in timings.items():
        unique = len(np.unique(by_rows[rows].batches[0][0]))
        for (rule, threads, mode), job in jobs.items():
            mine = _ms(ours[threads][rows][rule][mode])
            theirs = _ms(result["jobs"][job]["seconds_per_step"])
            rows_out.append({
                "table_rows": rows, "dim": cfg["dim"], "ids": cfg["ids"],
                "unique_ids": unique, "threads": threads, "rule": rule,
                "fbgemm": fbgemm.OPTIMIZERS[rule], "mode": MODES[mode],
                "fusedopt": mine, "FBGEMM": theirs,
                "x_fusedopt": theirs["median_ms"] / mine["median_ms"],
                "max_rel_error": errors[rows][rule],
                "match": errors[rows][rule] < MATCH_TOLERANCE})
    return {"_meta": {"versions": result["versions"], "python": python}, "rows": rows_out}
