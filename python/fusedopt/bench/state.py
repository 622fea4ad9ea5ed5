"""Embedding-scale optimizer state: what each optimizer / slot storage keeps per
parameter of one large table, the process's peak memory, and its sparse step.

Each contender runs in its own child process (``--state-memory-child N``), one after the
other: the table is created first, the process's peak reset and its resident memory read
(``VmRSS``), then the optimizer is built on it and a few sparse steps run
(``apply_gradients`` of a ``tf.IndexedSlices`` gradient of Zipf(1.1) ids, in a
``tf.function``), then the child reports the optimizer's state (its slot variables' bytes;
scalars such as ``iterations`` left out), the process's peak resident memory since the
reset (``VmHWM``) and the median step. The contenders are not interleaved (as the other
scenarios' are): each has the machine to itself, one at a time, so a step time shifts
with the machine's load then (the load average at each child's start is recorded);
memory figures are per process.

A contender is one entry of ``STATE_CONTENDERS`` (a class of ``keras.optimizers`` or
``fusedopt.keras`` and its keyword arguments): a storage variant (``slot_dtype``) is one more
entry. An entry whose class refuses one of its arguments is reported "not available".
"""
import gc
import json
import os
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np

from fusedopt.bench.config import LR, embedding_sizes
from fusedopt.bench.memory import anon_huge_pages_mb, wait_for_huge_pages
from fusedopt.bench.sparse import zipf_ids

CHILD_FLAG = "--state-memory-child"


class Contender(NamedTuple):
    """An optimizer class and its arguments, run under `label`."""
    label: str
    module: str  # "keras" (keras.optimizers, Keras's own) or "fusedopt.keras"
    name: str  # the class
    kwargs: dict = {}

    def cls(self):
        if self.module == "keras":
            import tensorflow as tf
            return getattr(tf.keras.optimizers, self.name)
        import fusedopt.keras
        return getattr(fusedopt.keras, self.name)

    def make(self, **defaults):
        """The optimizer (`defaults` under `kwargs`); Unavailable where the class does not
        take one of `kwargs` (a storage option not implemented yet)."""
        try:
            return self.cls()(**{**defaults, **self.kwargs})
        except (TypeError, ValueError) as e:
            refused = [k for k in self.kwargs if k in str(e)]
            if refused:
                raise Unavailable(f"{self.module}.{self.name} does not take "
                                  f"{', '.join(refused)} yet") from e
            raise

    def unavailable(self):
        """Why this contender cannot run here, or None."""
        try:
            self.make(learning_rate=LR)
        except Unavailable as e:
            return str(e)
        return None


class Unavailable(Exception):
    pass


BF16 = {"slot_dtype": "bfloat16"}  # compact slot storage (fusedopt.keras), when there

# keras.optimizers.Adam first: the anchor. Every contender the same table, ids, steps.
STATE_CONTENDERS = (
    Contender("keras.optimizers.Adam", "keras", "Adam"),
    Contender("keras.optimizers.Adagrad", "keras", "Adagrad"),
    Contender("fusedopt.keras.LazyAdam", "fusedopt.keras", "LazyAdam"),
    Contender("fusedopt.keras.LazyAdam, bf16 slots", "fusedopt.keras", "LazyAdam", BF16),
    Contender("fusedopt.keras.Adagrad", "fusedopt.keras", "Adagrad"),
    Contender("fusedopt.keras.Adagrad, bf16 slots", "fusedopt.keras", "Adagrad", BF16),
    Contender("fusedopt.keras.RowWiseAdagrad", "fusedopt.keras", "RowWiseAdagrad"),
    Contender("fusedopt.keras.PartialRowWiseAdam", "fusedopt.keras", "PartialRowWiseAdam"),
)

# The aims on state size: (aim, numerator, denominator, target, at_most), labels
# of STATE_CONTENDERS. Per parameter of a D = 64 table: row-wise Adagrad 4/64 bytes against
# Adagrad's 4 (1/64), partial row-wise Adam 4 + 4/64 against Adam's 8.
STATE_AIMS = (
    ("optimizer state: keras.optimizers.Adagrad's / fusedopt.keras.RowWiseAdagrad's",
     "keras.optimizers.Adagrad", "fusedopt.keras.RowWiseAdagrad", 32, False),
    ("optimizer state: fusedopt.keras.PartialRowWiseAdam's / keras.optimizers.Adam's",
     "fusedopt.keras.PartialRowWiseAdam", "keras.optimizers.Adam", 0.52, True),
    ("optimizer state: fusedopt.keras.LazyAdam, bf16 slots / float32 slots",
     "fusedopt.keras.LazyAdam, bf16 slots", "fusedopt.keras.LazyAdam", 0.5, True),
    ("optimizer state: fusedopt.keras.Adagrad, bf16 slots / float32 slots",
     "fusedopt.keras.Adagrad, bf16 slots", "fusedopt.keras.Adagrad", 0.5, True),
)


def proc_status_mb(field):
    """A /proc/self/status memory field (VmRSS, VmHWM, ...) in MB (10^6 bytes)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    raise KeyError(field)


def reset_peak():
    """Makes VmHWM the current VmRSS (Linux >= 4.0): the peak from here on."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def make_table(tf, rows, dim):
    """A rows x dim float32 variable of small random values holding nothing else: made in
    NumPy (returned to the OS once freed), copied once into TensorFlow's allocator, which
    keeps every buffer it ever freed for reuse (its random ops' temporaries would hold
    GBs the optimizer's slots then reuse unseen)."""
    values = np.random.default_rng(1).random((rows, dim), dtype=np.float32)
    values -= 0.5
    values *= 0.1
    table = tf.Variable(values)
    del values
    gc.collect()
    return table


def state_of(tf, optimizer):
    """[{name, shape, dtype, bytes}] of the optimizer's variables that are not scalars."""
    slots = []
    for v in optimizer.variables:
        shape = tuple(int(d) for d in v.shape)
        if shape:
            dtype = tf.as_dtype(v.dtype)
            slots.append({"name": getattr(v, "path", None) or v.name, "shape": list(shape),
                          "dtype": dtype.name, "bytes": int(np.prod(shape)) * dtype.size})
    return slots


def child(tf, index, quick):
    """The ``--state-memory-child`` run: one contender, printed as JSON for the parent."""
    contender, cfg = STATE_CONTENDERS[index], embedding_sizes(quick)["state"]
    rows, dim = cfg["rows"], cfg["dim"]
    import fusedopt.runtime  # noqa: F401 (wait_for_huge_pages's), loaded before the baseline

    contender.cls()  # its modules imported, TensorFlow's runtime started: before the baseline
    tf.zeros([1]) + 1
    rss_start = proc_status_mb("VmRSS")
    table = make_table(tf, rows, dim)
    peak_making_table = proc_status_mb("VmHWM")
    reset_peak()
    rss_table = proc_status_mb("VmRSS")
    optimizer = contender.make(learning_rate=LR)
    optimizer.build([table])
    rss_built = proc_status_mb("VmRSS")
    rng = np.random.default_rng(3)
    batches = [(tf.constant(zipf_ids(rng, rows, cfg["ids"])),
                tf.constant(rng.normal(0, 1, (cfg["ids"], dim)).astype(np.float32)))
               for _ in range(2)]
    shape = tf.constant([rows, dim], tf.int64)

    @tf.function
    def step(ids, grad):
        optimizer.apply_gradients([(tf.IndexedSlices(grad, ids, shape), table)])

    for t in range(cfg["warmup"]):
        step(*batches[t % 2])
    wait_for_huge_pages()  # fusedopt's ops put big tables on huge pages: steady state first
    times = []
    for t in range(cfg["steps"]):
        start = time.perf_counter()
        step(*batches[t % 2])
        times.append(time.perf_counter() - start)
    slots = state_of(tf, optimizer)
    state = sum(s["bytes"] for s in slots)
    params, table_bytes = rows * dim, rows * dim * table.dtype.size
    peak = proc_status_mb("VmHWM")
    print(json.dumps({
        "slots": slots, "state_bytes": state, "state_bytes_per_param": state / params,
        "state_vs_table": state / table_bytes, "rss_start_MB": rss_start,
        "peak_making_table_MB": peak_making_table, "rss_table_MB": rss_table,
        "rss_built_MB": rss_built, "peak_MB": peak,
        "peak_over_table_MB": peak - rss_table, "median_step_ms": 1e3 * float(np.median(times)),
        "min_step_ms": 1e3 * min(times), "max_step_ms": 1e3 * max(times),
        "unique_ids_per_step": int(len(np.unique(batches[0][0].numpy()))),
        "anon_huge_pages_MB": anon_huge_pages_mb()}))
    return 0


def run_child(index, quick):
    """One contender's child process: its JSON, or {"error": why it did not give one}."""
    result = subprocess.run([sys.executable, "-m", "fusedopt.bench", CHILD_FLAG, str(index)]
                            + (["--quick"] if quick else []), capture_output=True, text=True)
    if result.returncode == 0:
        return json.loads(result.stdout.strip().splitlines()[-1])
    why = ("killed (SIGKILL: out of memory?)" if result.returncode == -9
           else f"exit status {result.returncode}")
    last = (result.stderr.strip().splitlines() or [""])[-1]
    return {"error": f"{why}: {last}"[:500]}


def scenario_state_memory(tf, progress, quick):
    """{label: row} for every contender, plus "_meta": the table and the step."""
    cfg = embedding_sizes(quick)["state"]
    out = {"_meta": {"rows": cfg["rows"], "dim": cfg["dim"], "dtype": "float32",
                     "table_MB": cfg["rows"] * cfg["dim"] * 4 / 1e6,
                     "ids_per_step": cfg["ids"], "zipf_a": 1.1, "steps": cfg["steps"],
                     "warmup_steps": cfg["warmup"],
                     "timing": "one child process per contender, sequentially (not "
                               "interleaved): step times follow the machine's load then"}}
    for index, contender in enumerate(STATE_CONTENDERS):
        row = {"class": f"{contender.module}.{contender.name}", "kwargs": contender.kwargs}
        why = contender.unavailable()
        if why:
            row["not_available"] = why
            progress(f"state_memory: {contender.label}: not available ({why})")
        else:
            row["load_average_at_start"] = os.getloadavg()
            row.update(run_child(index, quick))
            progress(f"state_memory: {contender.label}: " + (
                row["error"] if "error" in row else
                f"{row['state_bytes_per_param']:.4f} state bytes/param, peak "
                f"{row['peak_MB']:.0f} MB ({row['peak_over_table_MB']:+.0f} over the table), "
                f"{row['median_step_ms']:.2f} ms/step"))
        out[contender.label] = row
    return out
