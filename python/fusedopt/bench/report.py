"""The benchmark's results as a markdown report and a plot."""
import json

from fusedopt.bench.config import THREADS
from fusedopt.bench.contenders import ORACLE_COMPOSITION, fastest_composition

# Scenarios whose results are {table: {contender: row}}, with their report titles.
CONTENDER_TABLES = [("Sparse embedding step", "sparse"),
                    ("Sparse step under XLA (jit_compile), LazyAdam, by table rows", "sparse_xla"),
                    ("Dense step", "dense"),
                    ("Dense LazyAdam step vs TF's kernel and torch, by parameters", "dense_sizes")]


def megabytes(n_bytes):
    """"512", "0.13": MB (10^6 bytes) to a precision a person reads."""
    mb = n_bytes / 1e6
    return f"{mb:,.0f}" if mb >= 10 else f"{mb:.2g}"


def _load_averages(values):
    return ", ".join(f"{x:.1f}" for x in values)


def header(results, command, developer=True):
    env = results["environment"]
    torch = f"torch {env['torch']}" if env.get("torch") else "PyTorch not installed"
    rerun = ""
    if "earlier_run" in env:
        early = env["earlier_run"]
        rerun = (f"Re-ran {', '.join(env['rerun_scenarios'])}; the other scenarios are from "
                 f"the run of {early['date']} (load average at start "
                 f"{_load_averages(early['load_average_at_start'])}).  ")
    legend = ([] if developer else [
        "Every contender was first checked against fusedopt's numbers (checked against, max "
        "rel err), then all were timed in turn. x fusedopt: a contender's median step time "
        "over fusedopt's (above 1: fusedopt is faster).", ""])
    return [f"Command: `{command}`  ", rerun, f"Date: {env['date']}; machine: {env['machine']} "
            f"(load average at start: {_load_averages(env['load_average_at_start'])}); "
            f"TF {env['tensorflow']}; tf.keras = Keras {env['keras']}; {torch}; "
            f"threads pinned to {THREADS} (TF intra-op, torch, fusedopt._core); inter-op 1.", ""
            ] + legend


# What each contender was checked against (its "semantics": contenders.py), in words.
CHECKED_AGAINST = {"lazy": "fusedopt's sparse update", "dense": "fusedopt's dense update",
                   "lazy_eps_out": "fusedopt's sparse update, TF's epsilon",
                   "tf": "fusedopt, TF's form", "keras": "fusedopt, Keras's form",
                   "torch": "fusedopt, PyTorch's form"}


def meta_words(key, meta):
    """A table's notes (its "_meta") in words, for users."""
    words = []
    if "unique_ids_per_step" in meta:
        words.append(f"{meta['unique_ids_per_step']:,} distinct ids per step")
    if "fusedopt_x_floor" in meta:
        words.append(f"fusedopt's op takes {meta['fusedopt_x_floor']:.1f}x the time of only "
                     f"reading, updating and writing those rows ({meta['floor_ms']:.2f} ms)")
    if "fusedopt_in_step_x_floor" in meta:
        words.append(f"{meta['fusedopt_in_step_x_floor']:.1f}x in a training step (ten "
                     f"updates in one tf.function call: {meta['fusedopt_in_step_ms']:.2f} ms each)")
    if "fusedopt_in_step_best_x_floor" in meta:
        words.append(f"{meta['fusedopt_in_step_best_x_floor']:.1f}x taking the fastest call "
                     f"({meta['fusedopt_in_step_best_ms']:.2f} ms an update) against the "
                     f"fastest of {len(meta['floor_probes_ms'])} floor measurements (each the "
                     "fastest of its repeats)")
    if "tf_function_call_ms" in meta:
        words.append(f"a tf.function call with the same inputs that does nothing takes "
                     f"{meta['tf_function_call_ms']:.2f} ms here")
    if "bytes_per_step" in meta:
        words.append(f"{megabytes(meta['bytes_per_step'])} MB read and written per step")
    in_step = meta.get("in_step_ms")
    if in_step:
        words.append("in a training step (ms an update, timed in turn): " + ", ".join(
            f"{name} {ms:.2f}" for name, ms in in_step.items()))
    same = meta.get("same_buffers_ms")
    if same:
        words.append("on the very same arrays: " + ", ".join(
            f"{name} {ms:.2f} ms" for name, ms in same.items()))
    return "; ".join(words)


def composition_words(rule, rows):
    """Which composition of TF ops a sparse table's anchor is, and fusedopt's lead over it."""
    fastest = fastest_composition(rule, rows)
    if fastest is None:
        return ""
    name, row = fastest
    if name == ORACLE_COMPOSITION:  # a record made before the faster composition was timed
        name += (" (fusedopt.reference's form, slower than the tensorflow-addons style "
                 "composition timed since)")
    return (f"the fastest of the same lazy update in composed TF ops: {name}, "
            f"{row['x_fusedopt']:.2f}x fusedopt's step time")


def contender_table(title, key, tables, developer=True):
    """One section: a table of contenders per rule (or, under XLA, per table size).
    `developer`: notes as JSON and the checks' internal names (else in words)."""
    dense = key in ("dense", "dense_sizes")  # with achieved bandwidth
    lines = [f"### {title}"]
    for table, rows in tables.items():
        if key == "sparse_xla":
            table = f"{int(table):,} rows"
        elif key == "dense_sizes":
            table = f"{int(table):,} parameters"
        meta = rows.get("_meta", {})
        notes = (json.dumps(meta) if meta else "") if developer else meta_words(key, meta)
        if key == "sparse":
            notes = "; ".join(filter(None, [notes, composition_words(table, rows)]))
        lines += ["", f"**{table}** {notes}", "",
                  "| contender | median ms | min..max ms | x fusedopt | "
                  + ("checked vs" if developer else "checked against") + " | max rel err |"
                  + (" GB/s |" if dense else ""),
                  "|---|---|---|---|---|---|" + ("---|" if dense else "")]
        for name, r in rows.items():
            if name.startswith("_"):
                continue
            checked = r["semantics"] if developer else CHECKED_AGAINST.get(r["semantics"],
                                                                            r["semantics"])
            lines.append(f"| {name} | {r['median_ms']:.2f} | {r['min_ms']:.2f}..{r['max_ms']:.2f} | "
                         f"{r['x_fusedopt']:.2f} | {checked} | {r['max_rel_error']:.1e} |"
                         + (f" {r['GB_per_s']:.1f} |" if dense else ""))
    return lines + [""]


SMALL_PAGES = "huge pages off (4 KB pages)"


def scaling_section(scaling, developer=True):
    small = {int(k): v for k, v in scaling.get("table_rows_small_pages", {}).items()}
    lines = ["### Scaling (fusedopt sparse LazyAdam, ms per step)", "",
             "| touched rows | ms |", "|---|---|"]
    lines += [f"| {int(k):,} | {v:.2f} |" for k, v in scaling["touched_rows"].items()]
    off = "`FUSEDOPT_HUGE_PAGES=0` (4 KB pages)" if developer else SMALL_PAGES
    lines += ["", "| table rows | ms, default settings (huge pages from the ops) | ms, "
              f"{off} |", "|---|---|---|"]
    lines += [f"| {int(k):,} | {v:.2f} | " + (f"{small[int(k)]:.2f} |" if int(k) in small else "n/a |")
              for k, v in scaling["table_rows"].items()]
    xla = scaling.get("table_rows_xla", {})
    distinct = {int(k): v for k, v in scaling.get("distinct_ids", {}).items()}
    if xla:
        lines += ["", "| table rows | distinct ids per step | " + " | ".join(
            f"ms, {form}" for form in xla) + " |", "|---|---|" + "---|" * len(xla)]
        for rows in sorted({int(k) for tables in xla.values() for k in tables}):
            lines.append(f"| {rows:,} | {distinct.get(rows, float('nan')):,.0f} | " + " | ".join(
                f"{tables[k]:.2f}" for tables in xla.values() for k in tables
                if int(k) == rows) + " |")
    return lines + [""]


def bandwidth_section(bw, repeats):
    probes = ", ".join(f"{k} {v:.1f} GB/s" for k, v in bw["measured_GB_per_s"].items())
    return ["### Memory bandwidth", "",
            f"Arrays of {bw['params']:,} float32 each. Probes (`fusedopt._core.memory_bandwidth`, "
            f"best of {repeats}): {probes}. "
            f"Dense Adam moves 28 bytes/parameter: fused op {bw['fusedopt_op_adam_GB_per_s']:.1f} GB/s "
            f"({bw['fusedopt_op_adam_pct']:.0f}% of the best probe), raw kernel via fusedopt._core "
            f"{bw['fusedopt_core_adam_GB_per_s']:.1f} GB/s ({bw['fusedopt_core_adam_pct']:.0f}%).", ""]


def many_small_section(rows):
    meta = rows.get("_meta", {})
    lines = ["### Many small variables (one step)", "",
             f"{meta.get('shapes', '')} float32 ({meta.get('parameters', 0):,} parameters); "
             "x fusedopt: median / the packed group op's median (rows \"N steps per call\": ms per "
             "step of a tf.function looping N steps, against the looped packed group op).", "",
             "| contender | median ms | x fusedopt | matches |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['median_ms']:.2f} | {v['x_fusedopt']:.2f} | "
              f"{'yes' if v['match'] else '**no**'} |" for k, v in rows.items()
              if not k.startswith("_")]
    return lines + [""]


def fbgemm_section(peer):
    """FBGEMM's CPU TBE beside fusedopt's sparse ops (scenario sparse_fbgemm)."""
    lines = ["### FBGEMM CPU beside fusedopt (sparse Adagrad, row-wise Adagrad)", ""]
    if "_skipped" in peer:
        return lines + [f"Skipped: {peer['_skipped']}.", ""]
    versions = peer["_meta"]["versions"]
    lines += [f"FBGEMM: fbgemm-gpu-cpu {versions['fbgemm_gpu']}, torch {versions['torch']}, "
              "its own process; HOST/CPU TBE, fp32 weights and output, SUM pooling with one "
              "id per bag. fusedopt: the raw sparse op (epsilon outside the sqrt) in a "
              "tf.function. Update: fusedopt's op / FBGEMM's backward; lookup + update: "
              "tf.gather first / FBGEMM's forward first. x = FBGEMM ms / fusedopt ms "
              "(above 1: fusedopt faster). Checked: max rel error of FBGEMM's table and "
              "accumulator after one step against fusedopt's.", "",
              "| table | unique ids | threads | fusedopt rule | FBGEMM optimizer | step | "
              "fusedopt ms (min..max) | FBGEMM ms (min..max) | x | checked |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in peer["rows"]:
        ours, theirs = r["fusedopt"], r["FBGEMM"]
        lines.append(
            f"| {r['table_rows']:,} x {r['dim']} | {r['unique_ids']:,} of {r['ids']:,} | "
            f"{r['threads']} | {r['rule']} | {r['fbgemm']} | {r['mode']} | "
            f"{ours['median_ms']:.2f} ({ours['min_ms']:.2f}..{ours['max_ms']:.2f}) | "
            f"{theirs['median_ms']:.2f} ({theirs['min_ms']:.2f}..{theirs['max_ms']:.2f}) | "
            f"{r['x_fusedopt']:.2f} | {r['max_rel_error']:.1e}"
            f"{'' if r['match'] else ' **mismatch**'} |")
    return lines + [""]


def _slots(slots):
    """"2 x 10000000x64 float32": the slots by shape and dtype."""
    kinds = {}
    for s in slots:
        kind = f"{'x'.join(map(str, s['shape']))} {s['dtype']}"
        kinds[kind] = kinds.get(kind, 0) + 1
    return " + ".join(f"{n} x {kind}" if n > 1 else kind for kind, n in kinds.items())


def state_memory_section(rows):
    meta = rows["_meta"]
    lines = [f"### Embedding-scale optimizer state: {meta['rows']:,} x {meta['dim']} float32 "
             f"table ({meta['table_MB']:,.0f} MB)", "",
             "Each contender in its own process, one after the other (not interleaved: a "
             "step time follows the machine's load at that time). State: the optimizer's "
             "variables but scalars. Peak: the process's VmHWM from the moment only the "
             "table is resident (reset there); over the table: peak minus that resident "
             "memory (slots, their initializers' temporaries, the steps' temporaries: "
             "TensorFlow's CPU allocator keeps what it frees). Step: `apply_gradients` of a "
             f"`tf.IndexedSlices` of {meta['ids_per_step']:,} Zipf({meta['zipf_a']}) ids in a "
             f"`tf.function`, median of {meta['steps']} after {meta['warmup_steps']} (and "
             "after fusedopt's huge-page collapse of the table is done).", "",
             "| contender | state | state bytes / parameter | state / table | peak MB | "
             "peak over the table MB | step ms (min..max) |", "|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        if label.startswith("_"):
            continue
        if "not_available" in r or "error" in r:
            why = r.get("not_available") or "failed: " + r["error"]
            lines.append(f"| {label} | {why} | | | | | |")
            continue
        lines.append(f"| {label} | {_slots(r['slots'])} | {r['state_bytes_per_param']:.4g} | "
                     f"{r['state_vs_table']:.4g} | {r['peak_MB']:,.0f} | "
                     f"{r['peak_over_table_MB']:,.0f} | {r['median_step_ms']:.2f} "
                     f"({r['min_step_ms']:.2f}..{r['max_step_ms']:.2f}) |")
    return lines + [""]


def convergence_section(conv):
    meta = conv["_meta"]
    steps = [s for s, _ in next((r["curve"] for r in conv["runs"].values() if "curve" in r),
                                [])]
    lines = ["### Convergence: synthetic CTR model, held-out log-loss", "",
             f"One {meta['rows']:,} x {meta['dim']} table, {meta['features']} "
             f"Zipf({meta['zipf_a']}) ids per example, ReLU tower of {meta['hidden']}, "
             f"{meta['steps']:,} steps of {meta['batch']:,} examples (the same batches, the "
             f"same initial weights for every run), tower: {meta['tower_optimizer']}; "
             f"held-out set of {meta['held_out']:,} (positive rate "
             f"{meta['held_out_positive_rate']:.3f}); the hidden model's own log-loss "
             f"there {meta['hidden_model_log_loss']:.4f}.", "",
             "| table optimizer | arguments | " + " | ".join(f"step {s:,}" for s in steps)
             + " |", "|---|---|" + "---|" * len(steps)]
    for label, r in conv["runs"].items():
        values = ([f"{loss:.4f}" for _, loss in r["curve"]] if "curve" in r
                  else [r["not_available"]] + [""] * (len(steps) - 1))
        lines.append(f"| {label} | {json.dumps(r['kwargs'])} | " + " | ".join(values) + " |")
    lines += ["", "| variant | counterpart | log-loss above the counterpart's | as a share of "
              "the counterpart's excess over the hidden model | the same at steps "
              + ", ".join(f"{s:,}" for s in steps[1:]) + " |", "|---|---|---|---|---|"]
    for p in conv["pairs"]:
        pct = p["rel_diff_pct"]
        lines.append(f"| {p['variant']} | {p['counterpart']} | " + (
            "not measured | | |" if pct is None else
            f"{pct:+.2f}% | {p['of_excess_over_hidden_pct']:+.1f}% | "
            + ", ".join(f"{x:+.2f}%" for _, x in p["rel_diff_pct_curve"]) + " |"))
    return lines + [""]


def aims_section(aims):
    lines = ["### Aims", "", "| aim | value | target | met |", "|---|---|---|---|"]
    return lines + [f"| {a['aim']} | " + ("not measured | " + a["target"] + " | - |"
                                         if a["value"] is None else
                                         f"{a['value']:.2f} | {a['target']} | "
                                         f"{'yes' if a['met'] else '**no**'} |") for a in aims]


def markdown(results, command, developer=True):
    """The report. `developer` (``--aims``): with the project's aims and its internal notes;
    else for users (notes in words, a skipped peer left to the run's "not compared" line)."""
    lines = header(results, command, developer)
    for title, key in CONTENDER_TABLES:
        if key in results:
            lines += contender_table(title, key, results[key], developer)
    if "scaling" in results:
        lines += scaling_section(results["scaling"], developer)
    if "bandwidth" in results:
        lines += bandwidth_section(results["bandwidth"],
                                   results["environment"]["config"]["repeats"])
    if "many_small" in results:
        lines += many_small_section(results["many_small"])
    if "sparse_fbgemm" in results and (developer or "_skipped" not in results["sparse_fbgemm"]):
        lines += fbgemm_section(results["sparse_fbgemm"])
    lines += sum((section(results[name]) for name, section in (
        ("state_memory", state_memory_section), ("convergence", convergence_section))
        if name in results), [])
    if developer:
        lines += aims_section(results["aims"])
    return "\n".join(lines) + "\n"


def _speedup_bars(ax, results):
    """Each contender's step time as a multiple of fusedopt's, sparse and dense."""
    names, values = [], []
    for block in ("sparse", "dense"):
        for rule, rows in results.get(block, {}).items():
            for name, r in rows.items():
                if not name.startswith("_") and not name.startswith("fusedopt (raw"):
                    names.append(f"{block} {rule}: {name}")
                    values.append(r["x_fusedopt"])
    ax.barh(names, values)
    ax.axvline(1, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("step time / fusedopt's (higher = fusedopt faster)")
    ax.tick_params(axis="y", labelsize=6)


def _scaling_lines(touched_ax, table_ax, scaling):
    for ax, key, label, legend in [(touched_ax, "touched_rows", "touched rows", "1M-row table"),
                                   (table_ax, "table_rows", "table rows", "default settings"),
                                   (table_ax, "table_rows_small_pages", "table rows",
                                    SMALL_PAGES)]:
        if key not in scaling:
            continue
        ax.plot([int(k) for k in scaling[key]], list(scaling[key].values()), "o-", label=legend)
        ax.set_xscale("log")
        if key == "touched_rows":
            ax.set_yscale("log")  # linear work shows as a straight line
        ax.set_xlabel(label)
        ax.set_ylabel("ms / step (fusedopt sparse LazyAdam)")
    for ax in {touched_ax, table_ax}:  # a run without the scaling scenario drew nothing
        if ax.get_legend_handles_labels()[0]:
            ax.legend()


def plot(results, path):
    """Writes the plot to path; False where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    _speedup_bars(axes[0], results)
    _scaling_lines(axes[1], axes[2], results.get("scaling", {}))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True
