"""``python -m fusedopt.bench --largest-table [ROWS ...]``: the largest embedding table each
optimizer trains on this machine, measured, not computed.

Every (optimizer, table rows) point runs in a child process of its own
(``--largest-table-child``), one after the other, so that a table that does not fit ends
that child only. The child starts TensorFlow, then caps the memory it may still allocate
(``RLIMIT_DATA``, set in the child: see ``cap_memory``), makes the rows x dim float32 table
directly in TensorFlow (zeros, one buffer: no NumPy copy), builds the optimizer on it
(``opt.build([table])``) and runs a few sparse steps (``apply_gradients`` of a
``tf.IndexedSlices`` gradient of Zipf(1.1) ids in a ``tf.function``, as the
``state_memory`` scenario does), then reports its steps per second, its optimizer state and
its own peak resident memory (``VmHWM``: ``ru_maxrss`` would keep the peak of a parent
holding TensorFlow across the exec). An allocation refused under the cap is the outcome
"does not fit", with the stage it happened in (the table, the optimizer's state, a step's
temporaries); the child reports it and exits normally. The child also makes itself the
kernel's first choice should memory still run out (``oom_score_adj`` 1000: other processes
took memory meanwhile), so that the out-of-memory killer ends it and nothing else.

The cap: by default what the machine has available when the child has started
TensorFlow (``MemAvailable``) less ``KEEP_FREE`` for everything else; ``--memory-limit GB``
sets it. So "fits" means: trained here, with the memory this machine had free at the time.

Writes ``<out>/largest_table.json`` (``{"environment", "largest_table"}``) and prints the
report (``--markdown FILE``: also to FILE).
"""
import argparse
import decimal
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from fusedopt.bench.config import LR, largest_table_sizes
from fusedopt.bench.machine import machine_words
from fusedopt.bench.report import megabytes
from fusedopt.bench.state import BF16, Contender, Unavailable, state_of

__all__ = ["CHILD_FLAG", "CONTENDERS", "DEFAULT_ROWS", "KEEP_FREE", "ONEDNN_SETTING", "OUTCOMES",
           "QUICK_ROWS", "check_names", "child", "child_environment", "default_rows",
           "environment", "markdown", "mem_available", "onednn_words", "point_words", "run",
           "sizes", "table_rows"]

CHILD_FLAG = "--largest-table-child"
DEFAULT_ROWS = (10_000_000, 30_000_000, 100_000_000)
QUICK_ROWS = (1_000, 5_000)
KEEP_FREE = 1e9  # bytes the default cap leaves to the rest of the machine
GB = 1e9

# Command-line name: contender. fusedopt's row-wise and Adam-like rules, each with float32
# and bfloat16 slots, and the class they replace.
CONTENDERS = {
    "row_wise_adagrad": Contender("fusedopt.keras.RowWiseAdagrad", "fusedopt.keras",
                                  "RowWiseAdagrad"),
    "row_wise_adagrad_bf16": Contender("fusedopt.keras.RowWiseAdagrad, bf16 slots",
                                       "fusedopt.keras", "RowWiseAdagrad", BF16),
    "partial_row_wise_adam": Contender("fusedopt.keras.PartialRowWiseAdam", "fusedopt.keras",
                                       "PartialRowWiseAdam"),
    "lazy_adam": Contender("fusedopt.keras.LazyAdam", "fusedopt.keras", "LazyAdam"),
    "lazy_adam_bf16": Contender("fusedopt.keras.LazyAdam, bf16 slots", "fusedopt.keras",
                                "LazyAdam", BF16),
    "keras_adam": Contender("keras.optimizers.Adam", "keras", "Adam"),
}

# A point's outcome. "does not fit": an allocation failed under the cap (measured);
# "killed": the kernel ended the child (SIGKILL: out of memory all the same);
# "failed": anything else, reported with the child's last words, never as a fit or a miss.
FITS, DOES_NOT_FIT, KILLED, FAILED, NOT_AVAILABLE = (
    "fits", "does not fit", "killed", "failed", "not available")
OUTCOMES = (FITS, DOES_NOT_FIT, KILLED, FAILED, NOT_AVAILABLE)

# What an allocation refused under the cap says, wherever it happens: TensorFlow's
# allocator (ResourceExhaustedError), Python and NumPy (MemoryError), C++ (std::bad_alloc,
# which aborts the process when no one catches it), glibc.
OUT_OF_MEMORY_WORDS = ("OOM when allocating", "ResourceExhaustedError", "MemoryError",
                       "bad_alloc", "Cannot allocate memory", "out of memory")


def table_rows(text):
    """argparse type: a row count, "100000000", "100,000,000", "100M", "1.5M" or "50K"."""
    words = text.strip().replace(",", "").replace("_", "")
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(words[-1:].upper(), 1)
    try:  # decimal: 1.1M is 1,100,000 exactly (in binary floating point it is not)
        value = decimal.Decimal(words[:-1] if scale > 1 else words) * scale
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a row count (e.g. 30000000, 30M, 500K)") from None
    if not value.is_finite() or value < 1 or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of rows")
    return int(value)


def proc_status_bytes(field):
    """A /proc/self/status memory field (VmRSS, VmHWM, VmData, ...) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def mem_available():
    """MemAvailable in bytes (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def first_to_be_killed():
    """Makes this process the out-of-memory killer's first choice (raising one's own score
    needs no privilege), so that it, not a neighbour, ends if memory runs out regardless."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        return True
    except OSError:
        return False


def cap_memory(memory_limit):
    """Caps what this process may still allocate at `memory_limit` bytes (None: what the
    machine has available now, less KEEP_FREE); returns (cap, MemAvailable now).

    RLIMIT_DATA, not RLIMIT_AS: both held in a trial (TensorFlow's allocator fails the op
    with ResourceExhaustedError at the cap), but the address space counts what is only
    reserved or shared: TensorFlow's libraries and glibc's 64 MB arena per thread (VmSize
    1.5 GB against VmData 0.36 GB once TensorFlow has started), which grow with threads and
    are not memory. RLIMIT_DATA (Linux 4.7+) counts private writable mappings, heap and
    anonymous mmap: what can become this process's own resident memory. Set on top of what
    the process has mapped so far, so the cap is the table's, the state's and the steps'.
    """
    available = mem_available()
    cap = memory_limit if memory_limit is not None else max(0, (available or 0) - KEEP_FREE)
    limit = proc_status_bytes("VmData") + int(cap)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return int(cap), available


def emit(record):
    """One JSON line for the parent (stage markers, then the result)."""
    print(json.dumps(record), flush=True)


def out_of_memory(error):
    return isinstance(error, MemoryError) or type(error).__name__ == "ResourceExhaustedError" \
        or any(word in str(error) for word in OUT_OF_MEMORY_WORDS)


def error_words(error, limit=300):
    """The line of an error that says what failed: TensorFlow's "OOM when allocating tensor
    with shape[...]" rather than its "Graph execution error:" heading."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [""]
    line = next((x for x in lines if any(word in x for word in OUT_OF_MEMORY_WORDS)), lines[0])
    if line.startswith("{{") and "}}" in line:  # TensorFlow's "{{function_node ...}}" prefix
        line = line.split("}}", 1)[1].strip()
    return f"{type(error).__name__}: {line}"[:limit]


def child(spec_text, import_tensorflow):
    """The ``--largest-table-child`` run: one point, JSON lines on stdout, exit status 0
    whether it fits or not."""
    spec = json.loads(spec_text)
    killable_first = first_to_be_killed()
    tf = import_tensorflow()
    from fusedopt.bench.memory import wait_for_huge_pages
    from fusedopt.bench.sparse import zipf_ids

    contender = CONTENDERS[spec["contender"]]
    try:  # its modules imported, TensorFlow's runtime started: before the cap
        contender.make(learning_rate=LR)
    except Unavailable as e:
        emit({"outcome": NOT_AVAILABLE, "error": str(e)})
        return 0
    tf.zeros([1]) + 1
    rows, dim, ids = spec["rows"], spec["dim"], spec["ids"]
    result = {"tensorflow": tf.__version__, "keras": _keras_version(tf),
              "oom_score_adj_1000": killable_first, "load_average_at_start": os.getloadavg(),
              "rss_start_MB": proc_status_bytes("VmRSS") / 1e6}
    cap, available = cap_memory(spec["memory_limit"])
    result.update(memory_limit_GB=cap / GB, mem_available_at_start_GB=(available or 0) / GB)
    emit({"stage": "capped", **result})
    stage = "making the table"
    try:
        # tf.zeros: one table-sized buffer, adopted by the variable (random initial values
        # would cost two more while they are made; a step's cost does not depend on them).
        table = tf.Variable(tf.zeros([rows, dim]))
        result["rss_table_MB"] = proc_status_bytes("VmRSS") / 1e6
        emit({"stage": "table made"})
        stage = "building the optimizer state"
        optimizer = contender.make(learning_rate=LR)
        optimizer.build([table])
        slots = state_of(tf, optimizer)
        result.update(slots=slots, state_bytes=sum(s["bytes"] for s in slots),
                      table_bytes=rows * dim * 4, rss_built_MB=proc_status_bytes("VmRSS") / 1e6)
        emit({"stage": "optimizer built"})
        stage = "running a step"
        rng = np.random.default_rng(3)
        batches = [(tf.constant(zipf_ids(rng, rows, ids)),
                    tf.constant(rng.normal(0, 1, (ids, dim)).astype(np.float32)))
                   for _ in range(2)]
        shape = tf.constant([rows, dim], tf.int64)

        @tf.function
        def step(indices, grad):
            optimizer.apply_gradients([(tf.IndexedSlices(grad, indices, shape), table)])

        for t in range(spec["warmup"]):
            step(*batches[t % 2])
        # fusedopt's ops put big tables on huge pages in a background thread: steady state
        pending = wait_for_huge_pages(spec["huge_pages_wait_s"])["pending_bytes"]
        times, started = [], time.perf_counter()
        while len(times) < spec["steps"] and (len(times) < spec["min_steps"] or
                                              time.perf_counter() - started < spec["budget_s"]):
            start = time.perf_counter()
            step(*batches[len(times) % 2])
            times.append(time.perf_counter() - start)
    except Exception as e:  # noqa: BLE001 (only an allocation refused is reported as such)
        if not out_of_memory(e):
            raise
        result.update(outcome=DOES_NOT_FIT, stage=stage,
                      error=error_words(e),
                      peak_MB=proc_status_bytes("VmHWM") / 1e6)
        emit(result)
        return 0
    median = float(np.median(times))
    result.update(outcome=FITS, steps_timed=len(times), median_step_ms=1e3 * median,
                  min_step_ms=1e3 * min(times), max_step_ms=1e3 * max(times),
                  steps_per_s=1 / median, huge_pages_pending_MB=pending / 1e6,
                  unique_ids_per_step=int(len(np.unique(batches[0][0].numpy()))),
                  peak_MB=proc_status_bytes("VmHWM") / 1e6)
    emit(result)
    return 0


def _keras_version(tf):
    return getattr(tf.keras, "__version__", None) or __import__("keras").__version__


def _json_lines(text):
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    return records


ONEDNN_SETTING = "TF_ENABLE_ONEDNN_OPTS"


def child_environment(environ=None):
    """The children's environment: this process's, with TensorFlow's oneDNN CPU
    optimisations off unless the user set TF_ENABLE_ONEDNN_OPTS. Where TensorFlow turns them
    on by itself (x86 CPUs with AVX-512), an allocation its oneDNN allocator is refused
    under the cap crashed the child (SIGSEGV while TensorFlow turned the failure into a
    Python error; TF 2.21, about every other run of Keras's Adam at 1M x 8 under 100 MB)
    instead of raising ResourceExhaustedError, so "does not fit" could not be told from a
    crash. The optimizer updates measured here do not use oneDNN either way."""
    env = dict(os.environ if environ is None else environ)
    env.setdefault(ONEDNN_SETTING, "0")
    return env


def run_point(name, rows, cfg, memory_limit, timeout_s):
    """One point in its child process: the child's result, or what ended it."""
    spec = dict(contender=name, rows=rows, dim=cfg["dim"], ids=cfg["batch"],
                warmup=cfg["warmup"], steps=cfg["steps"], min_steps=cfg["min_steps"],
                budget_s=cfg["budget_s"], huge_pages_wait_s=cfg["huge_pages_wait_s"],
                memory_limit=memory_limit)
    try:
        done = subprocess.run([sys.executable, "-m", "fusedopt.bench", CHILD_FLAG,
                               json.dumps(spec)], capture_output=True, text=True,
                              timeout=timeout_s, env=child_environment())
        stdout, stderr, status = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        stdout, stderr, status = e.stdout or "", e.stderr or "", None
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
    records = _json_lines(stdout)
    result = dict(records[-1]) if records and "outcome" in records[-1] else {}
    if result:
        return result
    # The child ended without its result: say where it was and why it ended.
    capped = next((r for r in records if r.get("stage") == "capped"), {})
    result = {k: v for k, v in capped.items() if k != "stage"}
    reached = [r["stage"] for r in records if r.get("stage") != "capped"]
    result["stage"] = ({None: "making the table", "table made": "building the optimizer state",
                        "optimizer built": "running a step"}[reached[-1] if reached else None]
                       if capped else "starting TensorFlow")
    words = [line for line in stderr.strip().splitlines() if line.strip()]
    last = words[-1][:300] if words else ""
    if status is None:
        result.update(outcome=FAILED, error=f"no result within {timeout_s:.0f} s")
    elif status == -9:
        result.update(outcome=KILLED, error="killed (SIGKILL), most likely by the kernel's "
                                            "out-of-memory killer: memory ran out beyond the cap")
    elif capped and any(word in stderr for word in OUT_OF_MEMORY_WORDS):
        oom_line = next(line for line in reversed(words)
                        if any(word in line for word in OUT_OF_MEMORY_WORDS))
        result.update(outcome=DOES_NOT_FIT, error="the process ended when an allocation "
                      f"failed under the cap (exit status {status}): {oom_line[:300]}")
    else:
        result.update(outcome=FAILED, error=f"exit status {status}: {last}")
    return result


def _summary(points, dim):
    """A contender's largest fitting rows and its figures there, its smallest miss, and the
    table + state bytes per row measured (None where no point fit)."""
    fits = [p for p in points if p["outcome"] == FITS]
    misses = [p for p in points if p["outcome"] in (DOES_NOT_FIT, KILLED)]
    largest = max(fits, key=lambda p: p["rows"], default=None)
    smallest_miss = min(misses, key=lambda p: p["rows"], default=None)
    per_row = (None if largest is None else
               (largest["table_bytes"] + largest["state_bytes"]) / largest["rows"])
    return {"bytes_per_row": per_row,
            "table_bytes_per_row": 4 * dim,
            "state_bytes_per_row": None if per_row is None else per_row - 4 * dim,
            "largest_fit_rows": largest and largest["rows"],
            "steps_per_s_there": largest and largest["steps_per_s"],
            "peak_GB_there": largest and largest["peak_MB"] / 1e3,
            "smallest_miss_rows": smallest_miss and smallest_miss["rows"],
            "smallest_miss_stage": smallest_miss and smallest_miss.get("stage")}


def run(cfg, rows, names, memory_limit, stages):
    """The sweep: {"_meta", label: {class, kwargs, points: [...], summary fields}}."""
    out = {"_meta": {"rows": list(rows), "dim": cfg["dim"], "dtype": "float32",
                     "ids_per_step": cfg["batch"], "zipf_a": 1.1, "warmup_steps": cfg["warmup"],
                     "steps": cfg["steps"], "min_steps": cfg["min_steps"],
                     "step_budget_s": cfg["budget_s"],
                     "memory_limit_GB": None if memory_limit is None else memory_limit / GB,
                     "keep_free_GB": KEEP_FREE / GB,
                     "memory_limit_kind": "RLIMIT_DATA over the child's mappings after "
                                          "TensorFlow started",
                     "timing": "one child process per point, one after the other (not "
                               "interleaved): step times follow the machine's load then",
                     "onednn_opts": child_environment()[ONEDNN_SETTING]}}
    for name in names:
        contender = CONTENDERS[name]
        entry = {"name": name, "class": f"{contender.module}.{contender.name}",
                 "kwargs": contender.kwargs, "points": []}
        for n in rows:
            stages.begin(f"{contender.label}: {n:,} x {cfg['dim']} table "
                         f"({size_words(4 * n * cfg['dim'])})")
            point = {"rows": n, **run_point(name, n, cfg, memory_limit, cfg["timeout_s"])}
            entry["points"].append(point)
            stages.end(point_words(point))
        entry.update(_summary(entry["points"], cfg["dim"]))
        out[contender.label] = entry
    return out


def size_words(n_bytes):
    """"12.8 GB", "32 MB": a size as a person reads it."""
    return f"{n_bytes / GB:,.1f} GB" if n_bytes >= GB else f"{megabytes(n_bytes)} MB"


def rate_words(steps_per_s):
    """"766", "12.5", "0.131": steps per second to three figures or more."""
    return f"{steps_per_s:,.0f}" if steps_per_s >= 100 else f"{steps_per_s:.3g}"


def point_words(p):
    """A point's outcome in a few words (progress lines and the report's grid)."""
    if p["outcome"] == FITS:
        return (f"fits: {rate_words(p['steps_per_s'])} steps/s, peak "
                f"{size_words(p['peak_MB'] * 1e6)}")
    if p["outcome"] == DOES_NOT_FIT:
        return (f"does not fit in {size_words(p['memory_limit_GB'] * GB)}: an allocation "
                f"failed {p['stage']}")
    return f"{p['outcome']}: {p.get('error', '')}"


def onednn_words(meta):
    """The report's sentence on TF_ENABLE_ONEDNN_OPTS in the children ("" for a file an
    earlier version wrote, which did not record it)."""
    value = meta.get("onednn_opts")
    if value is None:
        return ""
    if value == "0":
        return (" TensorFlow's oneDNN optimisations were off in each process "
                f"({ONEDNN_SETTING}=0, unless set otherwise): with them on, TensorFlow 2.21 "
                "crashed instead of raising an out-of-memory error when an allocation was "
                "refused under the cap.")
    return f" {ONEDNN_SETTING}={value} in each process (as set)."


def markdown(sweep, environment, command):
    """The report: a summary table per optimizer, then every point."""
    meta = sweep["_meta"]
    dim = meta["dim"]
    # Summaries recomputed from the points: a file an earlier version wrote reads the same.
    entries = {k: {**v, **_summary(v["points"], dim)} for k, v in sweep.items()
               if not k.startswith("_")}
    caps = sorted({p["memory_limit_GB"] for e in entries.values() for p in e["points"]
                   if "memory_limit_GB" in p})
    cap_words = (size_words(caps[0] * GB) if len(caps) == 1 else
                 f"{caps[0]:,.1f}-{caps[-1]:,.1f} GB" if caps else "(no run got so far)")
    how = ("set with --memory-limit" if meta["memory_limit_GB"] is not None else
           f"the memory available when it had started, less {meta['keep_free_GB']:g} GB")
    load = ", ".join(f"{x:.1f}" for x in environment["load_average_at_start"])
    lines = [f"Command: `{command}`  ",
             f"Date: {environment['date']}; machine: {environment['machine']}, "
             f"{environment['memory_total_GB']:,.1f} GB of memory "
             f"({environment['mem_available_at_start_GB']:,.1f} GB available at the start; "
             f"load average {load}); TF {environment.get('tensorflow')}, "
             f"Keras {environment.get('keras')}.", "",
             f"### The largest table each optimizer trains: {dim}-wide float32 rows", "",
             "Each optimizer and table size ran in a process of its own, which could allocate "
             f"at most {cap_words} beyond TensorFlow's own start-up ({how}): "
             "the table (zeros, made in TensorFlow), the optimizer's state and a step's "
             "temporaries. \"Does not fit\": an allocation failed under that cap, in the "
             "stage named. A step: `apply_gradients` of a `tf.IndexedSlices` gradient of "
             f"{meta['ids_per_step']:,} Zipf({meta['zipf_a']}) ids in a `tf.function`; "
             f"steps/s from the median of up to {meta['steps']} steps after "
             f"{meta['warmup_steps']} untimed. Peak: the process's peak resident memory "
             "(VmHWM), TensorFlow's own included. Bytes per row: the table's "
             f"({4 * dim}) and the optimizer state's, as measured." + onednn_words(meta),
             "",
             "| optimizer | table + state, bytes per row | largest table that trained | "
             "steps/s there | peak memory there | smallest that did not fit |",
             "|---|---|---|---|---|---|"]
    for label, e in entries.items():
        per_row = e["bytes_per_row"]
        largest = e["largest_fit_rows"]
        miss = e["smallest_miss_rows"]
        if miss is None:
            miss_words = "none: every size tried fit"
        else:
            miss_words = f"{miss:,} rows" + (
                f": failed {e['smallest_miss_stage']}" if e["smallest_miss_stage"] else "") + (
                f" (table + state {size_words(miss * per_row)})" if per_row is not None else "")
        lines.append(
            f"| {label} | " + ("not measured" if per_row is None else
                               f"{per_row:,.4g} ({4 * dim} + {per_row - 4 * dim:,.4g})")
            + " | " + ("none" if largest is None else
                       f"{largest:,} rows ({size_words(4 * dim * largest)} table)")
            + " | " + ("" if largest is None else rate_words(e["steps_per_s_there"]))
            + " | " + ("" if largest is None else size_words(e["peak_GB_there"] * GB))
            + f" | {miss_words} |")
    rows = meta["rows"]
    lines += ["", "| optimizer | " + " | ".join(f"{n:,} rows" for n in rows) + " |",
              "|---|" + "---|" * len(rows)]
    for label, e in entries.items():
        cells = {p["rows"]: point_words(p) for p in e["points"]}
        lines.append(f"| {label} | " + " | ".join(cells.get(n, "") for n in rows) + " |")
    return "\n".join(lines) + "\n"


def environment(cfg, sweep):
    """The run's machine and software (TensorFlow's versions as the children reported)."""
    points = [p for k, e in sweep.items() if not k.startswith("_") for p in e["points"]]
    versions = next((p for p in points if "tensorflow" in p), {})
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_words(),
            "memory_total_GB": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GB,
            "python": sys.version.split()[0], "tensorflow": versions.get("tensorflow"),
            "keras": versions.get("keras"), "config": cfg}


def sizes(quick, dim=None, batch=None):
    cfg = largest_table_sizes(quick)
    cfg.update({k: v for k, v in (("dim", dim), ("batch", batch)) if v is not None})
    return cfg


def default_rows(quick):
    return QUICK_ROWS if quick else DEFAULT_ROWS


def check_names(text):
    """The contenders a --contenders list names (None: all), or ValueError naming the
    unknown ones."""
    if not text:
        return list(CONTENDERS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not names:
        raise ValueError(f"unknown optimizers {', '.join(unknown) or repr(text)}; choose "
                         f"from {', '.join(CONTENDERS)}")
    return names

