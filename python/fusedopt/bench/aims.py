"""The project's performance targets (what the benchmark was built to show), for the
scenarios present: `python -m fusedopt.bench --aims`."""
from fusedopt.bench.contenders import fastest_composition
from fusedopt.bench.convergence import PAIRS_WITHIN_PCT
from fusedopt.bench.dense import LOOPED
from fusedopt.bench.state import STATE_AIMS


def aim(text, value, target, at_most=False):
    """An aim's row; value None: not measured (met None)."""
    met = None if value is None else value <= target if at_most else value >= target
    return {"aim": text, "value": value, "target": ("<= " if at_most else ">= ") + str(target),
            "met": met}


# The floor aim: every rule's op, as a training step runs it (several updates in one
# tf.function call, so TensorFlow's fixed cost per call is not charged to one op), within
# this of only grouping the ids and reading, updating and writing the touched rows, on
# whatever CPU the run is on.
FLOOR_TARGET = 1.3


def sparse_aims(sparse, cpu=None):
    """The sparse scenario's aims; `cpu`: the run's CPU in words (environment "cpu"), named
    in the floor rows, whose ratio depends on it as much as on the code."""
    lazy = sparse["lazy_adam"]
    composition = fastest_composition("lazy_adam", lazy)  # the strongest plain-TF anchor
    rows = [aim("sparse LazyAdam vs tf.keras Adam", lazy["tf.keras Adam"]["x_fusedopt"], 10),
            aim("sparse LazyAdam vs the fastest composition of TF ops"
                + (f": {composition[0]}" if composition else ""),
                composition[1]["x_fusedopt"] if composition else None, 2)]
    if "tensorflow_addons LazyAdam" in lazy:
        rows.append(aim("sparse LazyAdam vs tensorflow_addons LazyAdam",
                        lazy["tensorflow_addons LazyAdam"]["x_fusedopt"], 2))
    if "torch SparseAdam" in lazy:
        rows.append(aim("sparse LazyAdam vs torch SparseAdam",
                        lazy["torch SparseAdam"]["x_fusedopt"], 1))
    rows.append(aim("sparse Adagrad vs TF fused (+dedup)",
                    sparse["adagrad"]["TF ResourceSparseApplyAdagradV2 (+dedup)"]["x_fusedopt"], 1))
    on = f" on {cpu}" if cpu else ""
    for rule, table in sparse.items():
        if rule.startswith("_") or not isinstance(table, dict):
            continue
        meta = table.get("_meta", {})
        if "fusedopt_in_step_best_x_floor" in meta:  # best call against best probe
            rows.append(aim(f"sparse {rule} op in a training step / the floor{on}, best of each",
                            meta["fusedopt_in_step_best_x_floor"], FLOOR_TARGET, at_most=True))
        else:  # an earlier run's results: the median call
            rows.append(aim(f"sparse {rule} op in a training step / the floor{on}",
                            meta.get("fusedopt_in_step_x_floor"), FLOOR_TARGET, at_most=True))
    return rows


def fbgemm_aims(peer):
    """">= 2x FBGEMM CPU at equal threads": every row of the largest table."""
    rows = peer.get("rows", [])  # none when FBGEMM's venv was not there (_skipped)
    largest = max((r["table_rows"] for r in rows), default=None)
    return [aim(f"sparse {r['rule']} vs FBGEMM CPU {r['fbgemm']} ({r['mode']}, "
                f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}, "
                f"{r['table_rows']:,} rows)", r["x_fusedopt"], 2)
            for r in rows if r["table_rows"] == largest]


def sparse_xla_aims(tables):
    small_rows, large_rows = min(tables, key=int), max(tables, key=int)
    small, large = tables[small_rows], tables[large_rows]
    ours = "fusedopt.keras.LazyAdam, XLA"
    if ours not in large:
        return []
    return [aim(f"XLA step at {int(large_rows):,} rows / at {int(small_rows):,}",
                large[ours]["median_ms"] / small[ours]["median_ms"], 1.5, at_most=True),
            aim("sparse under XLA: Keras 3 Adam (XLA) vs fusedopt.keras.LazyAdam (XLA)",
                large["tf.keras Adam, XLA"]["x_fusedopt"], 10),
            aim("sparse under XLA: fusedopt.keras (XLA) / fusedopt op without XLA",
                1 / large["fusedopt (raw op), no XLA"]["x_fusedopt"], 2, at_most=True)]


def dense_aims(dense):
    rows = []
    for rule, contenders in dense.items():
        if "TF fused kernel" not in contenders:  # a rule TF and Keras do not have
            continue
        rows.append(aim(f"dense {rule} vs TF fused kernel",
                        contenders["TF fused kernel"]["x_fusedopt"], 1))
        rows.append(aim(f"dense {rule} vs tf.keras composed",
                        contenders["tf.keras (composed)"]["x_fusedopt"], 2))
    return rows


def scaling_aims(scaling):
    """The step at the largest table against the next smaller (10M rows against 1M at
    full size), per touched row (uniform ids touch a few more distinct rows of a larger
    table), in every form measured: within 1.3x, flat in the table's size."""
    distinct = {int(k): v for k, v in scaling.get("distinct_ids", {}).items()}
    forms = [("tf.function", scaling.get("table_rows")),
             ("tf.function, FUSEDOPT_HUGE_PAGES=0", scaling.get("table_rows_small_pages")),
             *scaling.get("table_rows_xla", {}).items()]
    rows = []
    for form, tables in forms:
        tables = {int(k): v for k, v in (tables or {}).items()}
        if len(tables) < 2:
            continue
        small, large = sorted(tables)[-2:]
        ratio = tables[large] / tables[small]
        if small in distinct and large in distinct:
            ratio *= distinct[small] / distinct[large]
            text = f"step per touched row at {large:,} table rows / at {small:,} ({form})"
        else:  # an earlier run's results: no distinct ids recorded
            text = f"step time at {large:,} table rows / at {small:,} ({form})"
        rows.append(aim(text, ratio, 1.3, at_most=True))
    return rows


def dense_sizes_aims(sizes):
    rows = []
    for n, contenders in sorted(sizes.items(), key=lambda kv: int(kv[0])):
        in_step = contenders.get("_meta", {}).get("in_step_ms")
        if in_step:  # the op as a training step runs it, timed beside torch's step
            ours = next(name for name in in_step if name.startswith("fusedopt"))
            rows.append(aim(f"dense Adam at {int(n):,} parameters, the op in a training step "
                            "vs torch Adam (fused)",
                            in_step["torch Adam (fused)"] / in_step[ours], 1))
        elif "torch Adam (fused)" in contenders:  # an earlier run's results
            rows.append(aim(f"dense Adam at {int(n):,} parameters vs torch Adam (fused)",
                            contenders["torch Adam (fused)"]["x_fusedopt"], 1))
        same = contenders.get("_meta", {}).get("same_buffers_ms")
        if same:
            rows.append(aim(f"dense Adam at {int(n):,} parameters, the engine (fusedopt._core) "
                            "vs torch Adam (fused) on the same buffers",
                            same["torch Adam (fused)"] / same["fusedopt engine (_core)"], 1))
    return rows


def many_small_aims(rows):
    group, per_variable = "fusedopt group op (raw)", "fusedopt per-variable ops (raw)"
    keras_class, keras = "fusedopt.keras.LazyAdam (group op)", "tf.keras Adam"
    # x_fusedopt: against the packed group op (the first contender), what the classes run.
    out = [aim("many small variables: packed group op vs our per-variable ops",
               rows[per_variable]["x_fusedopt"], 2)]
    if group in rows:
        out.append(aim("many small variables: list group op vs our per-variable ops",
                       rows[per_variable]["median_ms"] / rows[group]["median_ms"], 2))
    if group + ", v1 Session" in rows:
        out.append(aim("many small variables: same, in a v1 Session (no tf.function captures)",
                       rows[per_variable + ", v1 Session"]["median_ms"]
                       / rows[group + ", v1 Session"]["median_ms"], 2))
    if keras_class in rows:
        ratio = rows[keras]["median_ms"] / rows[keras_class]["median_ms"]
        out += [aim("many small variables: fusedopt.keras.LazyAdam vs tf.keras Adam", ratio, 5),
                aim("many small variables: same, moonshot", ratio, 10)]
    looped = rows.get("_meta", {}).get("loop_steps")
    suffix = LOOPED.format(looped)
    if looped and keras_class + suffix in rows:  # the call's cost spread over the loop
        out += [aim(f"many small variables: packed group op vs per-variable ops, {looped} steps "
                    "per call",
                    rows[per_variable + suffix]["x_fusedopt"], 2),
                aim(f"many small variables: fusedopt.keras.LazyAdam vs tf.keras Adam, {looped} "
                    "steps per call", rows[keras + suffix]["median_ms"]
                    / rows[keras_class + suffix]["median_ms"], 5)]
    return out


def state_memory_aims(rows):
    out = []
    for text, numerator, denominator, target, at_most in STATE_AIMS:
        a, b = (rows.get(label, {}).get("state_bytes") for label in (numerator, denominator))
        out.append(aim(text, a / b if a and b else None, target, at_most))
    return out


def convergence_aims(convergence):
    return [aim(f"held-out log-loss of {p['variant']} above {p['counterpart']}'s, %",
                p["rel_diff_pct"], PAIRS_WITHIN_PCT, at_most=True)
            for p in convergence["pairs"]]


def aims(results):
    """[{aim, value, target, met}] for the scenarios present in results."""
    rows = []
    if "sparse" in results:
        cpu = results.get("environment", {}).get("cpu", {})
        rows += sparse_aims(results["sparse"], cpu.get("words") if isinstance(cpu, dict) else None)
    if "sparse_fbgemm" in results:
        rows += fbgemm_aims(results["sparse_fbgemm"])
    if "sparse_xla" in results:
        rows += sparse_xla_aims(results["sparse_xla"])
    if "dense" in results:
        rows += dense_aims(results["dense"])
    if "bandwidth" in results:
        rows.append(aim("dense Adam op, % of measured bandwidth",
                        results["bandwidth"]["fusedopt_op_adam_pct"], 60))
    if "dense_sizes" in results:
        rows += dense_sizes_aims(results["dense_sizes"])
    if "many_small" in results:
        rows += many_small_aims(results["many_small"])
    rows += [row for name, of in (("state_memory", state_memory_aims),
                                  ("convergence", convergence_aims))
             if name in results for row in of(results[name])]
    return rows + scaling_aims(results.get("scaling", {}))
