"""``python -m fusedopt.bench --headline``: the few numbers a user asks first, in 2-3 minutes.

On one embedding problem (a rows x dim float32 table, `batch` Zipf-distributed ids per
step), for one optimizer rule (``--optimizer``, default lazy_adam):

1. the sparse step: fusedopt's Keras class against every other implementation of the rule
   installed here (Keras, ``tf.compat.v1``, tf_keras, tensorflow-addons, torch, the same
   update in plain TF ops), each first checked to give fusedopt's numbers (the sparse
   scenario's contenders, ``sparse.rule_contenders``), and the fastest of those written in
   plain TF ops named (``contenders.fastest_composition``);
2. a dense step on one variable (``dense_params``): fusedopt's op against TF's fused kernel,
   Keras and torch (``dense.rule_contenders``);
3. the optimizer state each optimizer class keeps for the table (``state.STATE_CONTENDERS``,
   built on the table in this process: exact bytes, no step).

Writes ``<out>/headline.json`` and, with matplotlib, ``<out>/headline.png``; prints a
summary table. ``SIZES`` are the defaults, ``QUICK_SIZES`` the tiny ones of ``--quick``
(the tests' run: seconds, numbers meaningless); ``--rows/--dim/--batch/--optimizer``
override either.
"""
import gc
import os

import numpy as np

from fusedopt._console import Progress, Stages
from fusedopt.bench import dense, sparse
from fusedopt.bench.config import LR, THREADS
from fusedopt.bench.contenders import COMPOSED_TF_OPS, RULES, fastest_composition
from fusedopt.bench.report import megabytes
from fusedopt.bench.state import STATE_CONTENDERS, make_table, state_of

__all__ = ["QUICK_SIZES", "SIZES", "USER_SIZES", "memory_needed", "mismatches", "output_paths",
           "plot", "run", "sizes", "stages", "summary"]

SIZES = dict(rows=1_000_000, dim=64, batch=16_384, optimizer="lazy_adam",
             dense_params=1 << 22, check_steps=2, steps=5, repeats=3)
QUICK_SIZES = dict(SIZES, rows=2_000, dim=8, batch=300, dense_params=4096, check_steps=1,
                   steps=2, repeats=2)
USER_SIZES = ("rows", "dim", "batch", "optimizer")  # what the command line may set
# Each stage's time at SIZES, measured on a 2-vCPU VM (2.5 minutes in all): said where the
# stage begins when the sizes are the defaults (elsewhere the progress line's estimate).
EXPECTED = {"problem": "a few seconds", "sparse": "about 2 minutes",
            "dense": "a few seconds", "state": "a few seconds"}

# Contender names of the sparse and dense scenarios, as a user reads them in the summary.
LABELS = {"fusedopt (raw op)": "fusedopt's op, called directly",
          COMPOSED_TF_OPS: "the same lazy update in plain TF ops (tensorflow-addons style)"}


def sizes(args):
    """The run's sizes: the defaults (or --quick's), then what the user gave."""
    cfg = dict(QUICK_SIZES if args.quick else SIZES)
    cfg.update({name: getattr(args, name) for name in USER_SIZES
                if getattr(args, name) is not None})
    return cfg


def state_slots(rule):
    """How many float32 arrays of the table's size the rule's optimizer keeps (its
    element-wise slots; a per-row slot counts as none)."""
    entry = RULES[rule]
    return sum(slot not in entry.per_row for slot in entry.slots)


def memory_needed(cfg):
    """Bytes the run holds at its peak, about: each sparse contender keeps its own table
    and state while all are timed (up to 9 contenders), the problem and the checks'
    reference values two more tables."""
    table = 4 * cfg["rows"] * cfg["dim"]
    return table * ((1 + state_slots(cfg["optimizer"])) * 9 + 2)


def sparse_contenders(tf, problem, rule):
    """The sparse scenario's contenders for `rule`, fusedopt's Keras class first (the
    baseline: what users run), else fusedopt's op."""
    contenders, oracles = sparse.rule_contenders(tf, problem, rule)
    keras_class = RULES[rule].fusedopt_keras
    ours = keras_class.name if keras_class and keras_class.name in contenders \
        else "fusedopt (raw op)"
    return {ours: contenders[ours], **contenders}, oracles


def state_memory(tf, cfg, progress):
    """{label: {state_bytes, state_bytes_per_param, slots}} of each optimizer class built
    on one rows x dim table (or {not_available: why})."""
    table = make_table(tf, cfg["rows"], cfg["dim"])
    params = cfg["rows"] * cfg["dim"]
    out = {}
    for contender in STATE_CONTENDERS:
        why = contender.unavailable()
        if why:
            out[contender.label] = {"not_available": why}
        else:
            optimizer = contender.make(learning_rate=LR)
            optimizer.build([table])
            slots = state_of(tf, optimizer)
            total = sum(s["bytes"] for s in slots)
            out[contender.label] = {"state_bytes": total, "state_bytes_per_param": total / params,
                                    "slots": slots}
            del optimizer
            gc.collect()
        progress(contender.label)
    return out


class CheckedTiming:
    """check_and_time's progress messages (one per contender checked, one per repeat) as
    a progress line."""

    def __init__(self, contenders, repeats):
        self.done, self.bar = 0, Progress(contenders + repeats, "checks and timing rounds")
        self.bar.update(0, "building the first optimizer")

    def __call__(self, message):
        self.done += 1
        self.bar.update(self.done, message.replace("checked ", "checked: ")[:60])
        if self.done == self.bar.total:
            self.bar.close()


def run(tf, cfg, stages):
    """The three measurements: {"sparse": rows, "dense": rows, "state": rows, "_meta"}."""
    rule = cfg["optimizer"]

    def expected(stage):
        return f" ({EXPECTED[stage]})" if cfg == SIZES else ""
    stages.begin(f"Making the problem: a {cfg['rows']:,} x {cfg['dim']} table's initial values "
                 f"and batches of {cfg['batch']:,} Zipf-distributed ids{expected('problem')}")
    problem = sparse.Problem(cfg["rows"], cfg["dim"], cfg["batch"], cfg["check_steps"])
    unique = len(np.unique(problem.batches[0][0]))
    stages.end(f"{unique:,} distinct ids per step")

    contenders, oracles = sparse_contenders(tf, problem, rule)
    stages.begin(f"Sparse embedding step ({rule}): {len(contenders)} implementations, each "
                 f"first checked to give fusedopt's numbers, then timed, {cfg['repeats']} rounds "
                 f"of {cfg['steps']} steps each{expected('sparse')}")
    progress = CheckedTiming(len(contenders), cfg["repeats"])
    sparse_rows = sparse.measure(cfg, progress, problem, contenders, oracles)
    del problem, contenders, oracles
    gc.collect()
    stages.end()

    n = cfg["dense_params"]
    rng = np.random.default_rng(1)
    init = rng.normal(0, 0.05, n).astype(np.float32)
    grads = [tf.constant(rng.normal(0, 1, n).astype(np.float32)) for _ in range(2)]
    contenders, oracles = dense.rule_contenders(dense.DenseSteps(tf, init, grads, rule))
    stages.begin(f"Dense step ({rule}): one variable of {n:,} parameters, {len(contenders)} "
                 f"implementations, checked, then timed{expected('dense')}")
    progress = CheckedTiming(len(contenders), cfg["repeats"])
    dense_rows = dense.check_and_time(contenders, oracles, cfg["check_steps"], cfg["steps"],
                                      cfg["repeats"], progress)
    del contenders, oracles, grads
    gc.collect()
    stages.end()

    stages.begin(f"Optimizer state: {len(STATE_CONTENDERS)} optimizers built on a "
                 f"{cfg['rows']:,} x {cfg['dim']} table{expected('state')}")
    bar = Progress(len(STATE_CONTENDERS), "optimizers")
    count = iter(range(1, len(STATE_CONTENDERS) + 1))
    state = state_memory(tf, cfg, lambda label: bar.update(next(count), label))
    bar.close()
    stages.end()
    return {"sparse": sparse_rows, "dense": dense_rows, "state": state,
            "_meta": {**cfg, "unique_ids_per_step": unique, "threads": THREADS}}


def _times(ratio):
    """How a contender's step compares with fusedopt's, in words."""
    if 1 / 1.05 < ratio < 1.05:
        return "about the same"
    if ratio >= 1:
        return f"{ratio:.1f}x slower" if ratio < 100 else f"{ratio:,.0f}x slower"
    return f"{1 / ratio:.1f}x faster"


def composition_line(rule, rows):
    """The sparse step's plain-TF anchor in words: the fastest implementation here that
    composes the same update of TensorFlow ops, against fusedopt; None if none ran."""
    fastest = fastest_composition(rule, rows)
    if fastest is None:
        return None
    name, row = fastest
    against = _times(row["x_fusedopt"])
    against += " as fusedopt" if against == "about the same" else " than fusedopt"
    return (f"  Fastest above in plain TF ops with the same lazy update (only the step's rows "
            f"change): {LABELS.get(name, name)}, {against}")


def timing_table(rows):
    """[(label, ms, against fusedopt, note)] of a scenario's rows, fusedopt's first."""
    out = []
    for index, (name, r) in enumerate(row for row in rows.items() if not row[0].startswith("_")):
        against = "(fusedopt)" if index == 0 else _times(r["x_fusedopt"])
        note = "" if r["match"] else "DIFFERENT NUMBERS (max rel error %.1e)" % r["max_rel_error"]
        out.append((LABELS.get(name, name), f"{r['median_ms']:,.2f}", against, note))
    return out


def _aligned(header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = []
    for row in [header, *rows]:
        cells = [str(x).ljust(w) if i == 0 or i == len(row) - 1 else str(x).rjust(w)
                 for i, (x, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def summary(headline):
    """The summary table: plain text lines."""
    meta, rule = headline["_meta"], headline["_meta"]["optimizer"]
    lines = [f"Sparse embedding step ({rule}): a {meta['rows']:,} x {meta['dim']} table "
             f"({megabytes(4 * meta['rows'] * meta['dim'])} MB), {meta['batch']:,} ids per step "
             f"({meta['unique_ids_per_step']:,} distinct)"]
    lines += _aligned(("implementation", "ms per step", "against fusedopt", ""),
                      timing_table(headline["sparse"]))
    lines += filter(None, [composition_line(rule, headline["sparse"])])
    lines += ["", f"Dense step ({rule}): one variable of {meta['dense_params']:,} parameters"]
    dense_rows = timing_table(headline["dense"])
    lines += _aligned(("implementation", "ms per step", "against fusedopt", ""), dense_rows)
    if len(dense_rows) == 1:
        lines.append("  (TensorFlow, Keras and PyTorch have no dense form of this optimizer)")
    lines += ["", f"Optimizer state for the {meta['rows']:,} x {meta['dim']} table"]
    state_rows = []
    for label, r in headline["state"].items():
        if "not_available" in r:
            state_rows.append((label, "-", "-", "not available: " + r["not_available"]))
        else:
            state_rows.append((label, f"{r['state_bytes_per_param']:.4g}",
                               megabytes(r["state_bytes"]), ""))
    lines += _aligned(("optimizer", "bytes per parameter", "MB", ""), state_rows)
    checked = [r["max_rel_error"] for block in ("sparse", "dense")
               for name, r in headline[block].items() if not name.startswith("_")]
    lines += ["", f"Every implementation was first checked to give fusedopt's numbers (largest "
                  f"relative difference {max(checked):.1e}). Times: the median of "
                  f"{meta['repeats']} rounds of {meta['steps']} steps, all implementations in "
                  f"turn, {meta['threads']} threads each. \"Nx slower\": its step takes N "
                  "times as long as fusedopt's."]
    return lines


def mismatches(headline):
    return [(block, name) for block in ("sparse", "dense")
            for name, r in headline[block].items() if not name.startswith("_") and not r["match"]]


def plot(headline, path):
    """The sparse step times and the state sizes as bars; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    meta = headline["_meta"]
    fig, (times_ax, state_ax) = plt.subplots(1, 2, figsize=(14, 5))
    fig.suptitle(f"fusedopt headline: {meta['rows']:,} x {meta['dim']} table, "
                 f"{meta['batch']:,} ids per step, {meta['threads']} threads")
    rows = {LABELS.get(k, k): v["median_ms"] for k, v in headline["sparse"].items()
            if not k.startswith("_")}
    times_ax.barh(list(rows)[::-1], list(rows.values())[::-1])
    times_ax.set_xscale("log")
    times_ax.set_xlabel(f"ms per sparse step ({headline['_meta']['optimizer']}), log scale")
    state = {k: v["state_bytes_per_param"] for k, v in headline["state"].items()
             if "state_bytes_per_param" in v}
    state_ax.barh(list(state)[::-1], list(state.values())[::-1])
    state_ax.set_xlabel("optimizer state, bytes per parameter of the table")
    for ax in (times_ax, state_ax):
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def output_paths(out):
    return os.path.join(out, "headline.json"), os.path.join(out, "headline.png")


def stages():
    """The headline's stages: TensorFlow, the problem, sparse, dense, state."""
    return Stages(5)
