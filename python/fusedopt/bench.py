"""``python -m fusedopt.bench``: fusedopt against what users would otherwise pick.

Every scenario runs all its contenders in this one process, interleaved (the order
rotates every repeat), several repeats, and reports the median step time, the spread
(min..max over repeats) and each contender's time as a multiple of fusedopt's. Before
timing, every contender runs the same steps from the same initial values and its
result is compared with fusedopt's op of the same semantics (lazy contenders with the
sparse op, dense-update contenders with the dense op on the densified gradient), so
the benchmark compares like with like. ``--quick`` shrinks every size (CI smoke run).

Scenarios: sparse embedding step (LazyAdam, Adagrad, Adamax), the sparse step under XLA
(jit_compile) at two table sizes, dense step, scaling
with touched rows and with table rows, achieved memory bandwidth, many small variables.
Outputs: ``<out>/results.json``, ``<out>/benchmarks.png`` and the markdown report
(``--markdown``, e.g. BENCHMARKS.md).
"""
import argparse
import gc
import json
import os
import platform
import sys
import time

import numpy as np

THREADS = 2
BETA1, BETA2, EPS, LR = 0.9, 0.999, 1e-7, 1e-3


# --------------------------------------------------------------------------- helpers

def zipf_ids(rng, rows, n, a=1.1):
    return ((rng.zipf(a, n) - 1) % rows).astype(np.int64)


def time_contenders(contenders, steps, repeats, progress):
    """{name: [seconds per step, one entry per repeat]}, interleaved, order rotating."""
    times = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            step = contenders[name]
            step()  # keep caches/turbo state comparable across contenders
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append((time.perf_counter() - start) / steps)
        progress(f"repeat {r + 1}/{repeats}")
    return times


def summarize(times, baseline):
    base = float(np.median(times[baseline]))
    rows = {}
    for name, ts in times.items():
        median = float(np.median(ts))
        rows[name] = {"median_ms": 1e3 * median, "min_ms": 1e3 * min(ts), "max_ms": 1e3 * max(ts),
                      "x_fusedopt": median / base}
    return rows


def quiet_function(tf, fn, jit_compile=False):
    """tf.function of fn, discarding its result (graph-mode update ops return Operations)."""
    def body(*args):
        fn(*args)
    return tf.function(body, jit_compile=jit_compile)


def max_rel_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-3))) if a.size else 0.0


# ------------------------------------------------------------------ contender builders

class Problem:
    """Initial table and fixed sparse gradients, shared by all contenders.

    `batches` (timed) draw Zipf ids with many duplicates, as embedding lookups do.
    `check_batches` have unique ids: Keras 3 squares (Adam, Adagrad) or takes |g| (Adamax)
    of each duplicate separately before summing, so with duplicates its numbers differ
    from every "sum duplicates first" implementation (TF v1, tf_keras, torch, fusedopt).
    """

    def __init__(self, rows, dim, ids, check_steps, seed=0):
        rng = np.random.default_rng(seed)
        self.rows, self.dim = rows, dim
        self.init = rng.normal(0, 0.05, (rows, dim)).astype(np.float32)
        self.batches = [(zipf_ids(rng, rows, ids),
                         rng.normal(0, 1, (ids, dim)).astype(np.float32)) for _ in range(2)]
        self.check_batches = [(rng.choice(rows, min(ids, rows), replace=False).astype(np.int64),
                               rng.normal(0, 1, (min(ids, rows), dim)).astype(np.float32))
                              for _ in range(check_steps)]
        self.check_steps = check_steps


def tf_contenders_sparse(tf, problem, rule, xla=False):
    """{name: (make() -> (step, read_var), semantics)} for one rule's sparse scenario; with
    `xla`, the contenders of the "sparse under XLA" scenario (LazyAdam)."""
    from fusedopt import ops, reference

    shape = (problem.rows, problem.dim)

    def variables(n_slots, slot_init=0.0):
        var = tf.Variable(problem.init)
        slots = [tf.Variable(tf.fill(shape, slot_init)) for _ in range(n_slots)]
        return var, slots

    def cycling(fn, batches):
        idx_t = [tf.constant(i) for i, _ in batches]
        grad_t = [tf.constant(g) for _, g in batches]
        counter = {"i": 0, "t": 0}

        def step():
            i = counter["i"] % len(idx_t)
            counter["i"] += 1
            counter["t"] += 1
            fn(idx_t[i], grad_t[i], counter["t"])
        return step

    hyper = {
        "lazy_adam": lambda t: dict(beta1_power=BETA1 ** t, beta2_power=BETA2 ** t, lr=LR,
                                    beta1=BETA1, beta2=BETA2, epsilon=EPS),
        "adamax": lambda t: dict(beta1_power=BETA1 ** t, lr=LR, beta1=BETA1, beta2=BETA2,
                                 epsilon=EPS),
        "adagrad": lambda t: dict(lr=LR, epsilon=EPS),
    }[rule]
    n_slots = 1 if rule == "adagrad" else 2
    slot_init = 0.1 if rule == "adagrad" else 0.0
    options = {"epsilon_inside_sqrt": True} if rule == "adagrad" else {}
    sparse_op = getattr(ops, f"resource_sparse_apply_{rule}")
    dense_op = getattr(ops, f"resource_apply_{rule}")

    def fused_raw(batches, jit_compile=False):
        var, slots = variables(n_slots, slot_init)
        f = quiet_function(tf, lambda i, g, t: sparse_op(var, *slots, **hyper(t), grad=g, indices=i,
                                                  **options), jit_compile)
        return cycling(lambda i, g, t: f(i, g, tf.constant(float(t))), batches), var

    def fused_raw_hlo(batches):  # the XLA lowering XLA:GPU runs, here on the CPU
        step, var = fused_raw(batches, jit_compile=True)

        def hlo_step():  # the lowering is chosen when the step compiles, at its first call
            os.environ["FUSEDOPT_XLA_LOWERING"] = "hlo"
            try:
                step()
            finally:
                del os.environ["FUSEDOPT_XLA_LOWERING"]
        return hlo_step, var

    def fused_dense_semantics(batches):  # oracle for contenders that update every row
        var, slots = variables(n_slots, slot_init)
        f = quiet_function(tf, lambda i, g, t: dense_op(
            var, *slots, **hyper(t), grad=tf.convert_to_tensor(
                tf.IndexedSlices(g, i, tf.constant(shape, tf.int64))), **options))
        return cycling(lambda i, g, t: f(i, g, tf.constant(float(t))), batches), var

    def composed_gather_scatter(batches):  # the tensorflow-addons approach, in composed TF ops
        var, slots = variables(n_slots, slot_init)
        f = quiet_function(tf, lambda i, g, t: reference.apply_sparse(rule, var, slots, g, i,
                                                               **hyper(t), **options))
        return cycling(lambda i, g, t: f(i, g, tf.constant(float(t))), batches), var

    def keras_optimizer(make_opt, jit_compile=False):
        def make(batches):
            var = tf.Variable(problem.init)
            opt = make_opt()

            @tf.function(jit_compile=jit_compile)
            def f(i, g):
                opt.apply_gradients([(tf.IndexedSlices(g, i, tf.constant(shape, tf.int64)), var)])
            return cycling(lambda i, g, t: f(i, g), batches), var
        return make

    k = tf.keras.optimizers
    if xla:
        contenders = {}
        fk = _fusedopt_keras()
        if fk is not None:
            contenders["fusedopt.keras.LazyAdam, XLA"] = (keras_optimizer(
                lambda: fk.LazyAdam(LR, BETA1, BETA2, EPS), True), "lazy")
        contenders["fusedopt (raw op), XLA"] = (lambda b: fused_raw(b, True), "lazy")
        contenders["fusedopt (raw op), XLA, HLO lowering"] = (fused_raw_hlo, "lazy")
        contenders["fusedopt (raw op), no XLA"] = (fused_raw, "lazy")
        contenders["tf.keras Adam, XLA"] = (keras_optimizer(
            lambda: k.Adam(LR, BETA1, BETA2, EPS), True), "dense")
        return contenders, {"lazy": fused_raw, "dense": fused_dense_semantics}
    contenders = {"fusedopt (raw op)": (fused_raw, "lazy"),
                  "composed gather/scatter": (composed_gather_scatter, "lazy")}
    if rule == "lazy_adam":
        contenders["tf.keras Adam"] = (keras_optimizer(
            lambda: k.Adam(LR, BETA1, BETA2, EPS)), "dense")
        contenders["tf.compat.v1 AdamOptimizer"] = (keras_optimizer(
            lambda: tf.compat.v1.train.AdamOptimizer(LR, BETA1, BETA2, EPS)), "dense")
        legacy = _tf_keras()
        if legacy is not None:
            contenders["tf_keras legacy Adam"] = (keras_optimizer(
                lambda: legacy.optimizers.legacy.Adam(LR, BETA1, BETA2, EPS)), "dense")
        tfa = _tensorflow_addons()
        if tfa is not None:  # the real thing (TF <= 2.15): Keras 2 legacy optimizer, lazy rows
            contenders["tensorflow_addons LazyAdam"] = (keras_optimizer(
                lambda: tfa.optimizers.LazyAdam(LR, BETA1, BETA2, EPS)), "lazy")
        fk = _fusedopt_keras()
        if fk is not None:
            contenders["fusedopt.keras.LazyAdam"] = (keras_optimizer(
                lambda: fk.LazyAdam(LR, BETA1, BETA2, EPS)), "lazy")
    elif rule == "adagrad":
        def tf_fused_adagrad(batches):  # TF's own fused sparse kernel, fed deduplicated rows
            var, slots = variables(1, slot_init)

            @tf.function
            def f(i, g):
                unique, pos = tf.unique(i)
                summed = tf.math.unsorted_segment_sum(g, pos, tf.shape(unique)[0])
                # TF's kernel has epsilon outside the sqrt; make it equal by folding:
                # not possible exactly, so compare against fusedopt with the same form.
                tf.raw_ops.ResourceSparseApplyAdagradV2(
                    var=var.handle, accum=slots[0].handle, lr=LR, epsilon=EPS, grad=summed,
                    indices=unique)
            return cycling(lambda i, g, t: f(i, g), batches), var
        contenders["TF ResourceSparseApplyAdagradV2 (+dedup)"] = (tf_fused_adagrad, "lazy_eps_out")
        contenders["tf.keras Adagrad"] = (keras_optimizer(
            lambda: k.Adagrad(LR, initial_accumulator_value=slot_init, epsilon=EPS)), "lazy")
    else:
        contenders["tf.keras Adamax"] = (keras_optimizer(
            lambda: k.Adamax(LR, BETA1, BETA2, EPS)), "dense")

    oracles = {"lazy": fused_raw, "dense": fused_dense_semantics}
    if rule == "adagrad":
        def fused_eps_out(batches):
            var, slots = variables(1, slot_init)
            f = quiet_function(tf, lambda i, g: sparse_op(var, *slots, lr=LR, epsilon=EPS, grad=g,
                                                   indices=i))
            return cycling(lambda i, g, t: f(i, g), batches), var
        oracles["lazy_eps_out"] = fused_eps_out
    return contenders, oracles


def torch_sparse_adam(problem):
    torch = _torch()
    if torch is None:
        return None

    def make(batches):
        emb = torch.nn.Embedding(problem.rows, problem.dim, sparse=True)
        with torch.no_grad():
            emb.weight.copy_(torch.from_numpy(problem.init))
        opt = torch.optim.SparseAdam(emb.parameters(), lr=LR, betas=(BETA1, BETA2), eps=EPS)
        batches = [(torch.from_numpy(i), torch.from_numpy(g)) for i, g in batches]
        counter = {"i": 0}

        def step():
            i, g = batches[counter["i"] % len(batches)]
            counter["i"] += 1
            emb.weight.grad = torch.sparse_coo_tensor(i[None], g, (problem.rows, problem.dim))
            opt.step()
        return step, emb.weight
    return make


def _torch():
    try:
        import torch
        torch.set_num_threads(THREADS)
        return torch
    except ImportError:
        return None


def _tf_keras():
    try:
        import tf_keras
        return tf_keras
    except ImportError:
        return None


def _tensorflow_addons():
    import warnings
    try:
        with warnings.catch_warnings():  # its end-of-life notice
            warnings.simplefilter("ignore")
            import tensorflow_addons
        return tensorflow_addons
    except ImportError:
        return None


def _fusedopt_keras():
    try:
        from fusedopt import keras as fk
        return fk if hasattr(fk, "LazyAdam") else None
    except ImportError:
        return None


def read(var):
    return var.detach().numpy() if hasattr(var, "detach") else var.numpy()


def check_and_time(contenders, oracles, check_steps, steps, repeats, progress, problem=None):
    """Checks each contender against its oracle, then times them all. Returns a dict.

    With a sparse `problem`, contenders are built twice: on its check batches for the
    comparison, then afresh on its timed batches."""
    build = (lambda make, batches: make(batches)) if problem else (lambda make, _: make())
    expected = {}
    for semantics, make in oracles.items():
        step, var = build(make, problem and problem.check_batches)
        for _ in range(check_steps):
            step()
        expected[semantics] = read(var)
    checks, steppers = {}, {}
    for name, (make, semantics) in contenders.items():
        step, var = build(make, problem and problem.check_batches)
        for _ in range(check_steps):
            step()
        err = max_rel_error(read(var), expected[semantics])
        checks[name] = {"semantics": semantics, "max_rel_error": err, "match": err < 1e-3}
        del step, var
        steppers[name] = build(make, problem and problem.batches)[0]
        progress(f"checked {name}: max rel error {err:.1e}")
    times = time_contenders(steppers, steps, repeats, progress)
    rows = summarize(times, next(iter(contenders)))
    for name in rows:
        rows[name].update(checks[name])
    return rows


# ----------------------------------------------------------------------------- scenarios

def scenario_sparse(tf, cfg, progress):
    out = {}
    problem = Problem(cfg["rows"], cfg["dim"], cfg["ids"], cfg["check_steps"])
    for rule in ("lazy_adam", "adagrad", "adamax"):
        progress(f"sparse {rule}: {cfg['rows']:,} x {cfg['dim']} table, {cfg['ids']:,} ids/step")
        contenders, oracles = tf_contenders_sparse(tf, problem, rule)
        if rule == "lazy_adam":
            torch_make = torch_sparse_adam(problem)
            if torch_make is not None:
                contenders["torch SparseAdam"] = (torch_make, "lazy")
        out[rule] = check_and_time(contenders, oracles, cfg["check_steps"], cfg["steps"],
                                   cfg["repeats"], progress, problem)
        del contenders, oracles
        gc.collect()
        unique = len(np.unique(problem.batches[0][0]))
        out[rule]["_meta"] = {"unique_ids_per_step": unique}
    return out


def scenario_sparse_xla(tf, cfg, progress):
    """The sparse LazyAdam step compiled by XLA (what Keras 3 does by default on GPU
    machines), at two table sizes with the same batches: the step must cost the same."""
    out = {}
    for rows in cfg["xla_tables"]:
        problem = Problem(rows, cfg["dim"], cfg["ids"], cfg["check_steps"])
        progress(f"sparse under XLA: {rows:,} x {cfg['dim']} table, {cfg['ids']:,} ids/step")
        contenders, oracles = tf_contenders_sparse(tf, problem, "lazy_adam", xla=True)
        out[str(rows)] = check_and_time(contenders, oracles, cfg["check_steps"], cfg["steps"],
                                        cfg["repeats"], progress, problem)
        del contenders, oracles, problem
        gc.collect()
    return out


def scenario_dense(tf, cfg, progress):
    from fusedopt import ops

    n = cfg["dense_params"]
    rng = np.random.default_rng(1)
    init = rng.normal(0, 0.05, n).astype(np.float32)
    grads = [tf.constant(rng.normal(0, 1, n).astype(np.float32)) for _ in range(2)]
    out = {}

    def cycle(f):
        c = {"t": 0}

        def step():
            c["t"] += 1
            f(grads[c["t"] % 2], tf.constant(float(c["t"])))
        return step

    specs = {
        "lazy_adam": (2, 0.0, lambda t: dict(beta1_power=BETA1 ** t, beta2_power=BETA2 ** t,
                                             lr=LR, beta1=BETA1, beta2=BETA2, epsilon=EPS)),
        "adamax": (2, 0.0, lambda t: dict(beta1_power=BETA1 ** t, lr=LR, beta1=BETA1,
                                          beta2=BETA2, epsilon=EPS)),
        "adagrad": (1, 0.1, lambda t: dict(lr=LR, epsilon=EPS)),
    }
    tf_raw = {
        "lazy_adam": lambda v, s, g, h: tf.raw_ops.ResourceApplyAdam(
            var=v.handle, m=s[0].handle, v=s[1].handle, grad=g, **h),
        "adamax": lambda v, s, g, h: tf.raw_ops.ResourceApplyAdaMax(
            var=v.handle, m=s[0].handle, v=s[1].handle, grad=g, **h),
        "adagrad": lambda v, s, g, h: tf.raw_ops.ResourceApplyAdagradV2(
            var=v.handle, accum=s[0].handle, grad=g, **h),
    }
    keras = {"lazy_adam": lambda: tf.keras.optimizers.Adam(LR, BETA1, BETA2, EPS),
             "adamax": lambda: tf.keras.optimizers.Adamax(LR, BETA1, BETA2, EPS),
             "adagrad": lambda: tf.keras.optimizers.Adagrad(LR, 0.1, EPS)}
    for rule, (n_slots, slot_init, hyper) in specs.items():
        progress(f"dense {rule}: {n:,} float32 parameters")
        # TF's own kernels: Adagrad V2 has epsilon outside the sqrt, so compare that form.
        options = {}

        def fused(options=options, rule=rule, n_slots=n_slots, slot_init=slot_init,
                  hyper=hyper):
            var = tf.Variable(init)
            slots = [tf.Variable(tf.fill([n], slot_init)) for _ in range(n_slots)]
            op = getattr(ops, f"resource_apply_{rule}")
            f = quiet_function(tf, lambda g, t: op(var, *slots, grad=g, **hyper(t), **options))
            return cycle(f), var

        def tf_fused(rule=rule, n_slots=n_slots, slot_init=slot_init, hyper=hyper):
            var = tf.Variable(init)
            slots = [tf.Variable(tf.fill([n], slot_init)) for _ in range(n_slots)]
            f = quiet_function(tf, lambda g, t: tf_raw[rule](var, slots, g, hyper(t)))
            return cycle(f), var

        def fused_keras_form(rule=rule, n_slots=n_slots, slot_init=slot_init, hyper=hyper):
            var = tf.Variable(init)
            slots = [tf.Variable(tf.fill([n], slot_init)) for _ in range(n_slots)]
            op = getattr(ops, f"resource_apply_{rule}")
            extra = {"epsilon_inside_sqrt": True} if rule == "adagrad" else {}
            f = quiet_function(tf, lambda g, t: op(var, *slots, grad=g, **hyper(t), **extra))
            return cycle(f), var

        def keras_composed(rule=rule):
            var = tf.Variable(init)
            opt = keras[rule]()
            f = quiet_function(tf, lambda g, t: opt.apply_gradients([(g, var)]))
            return cycle(f), var

        contenders = {"fusedopt (raw op)": (fused, "tf"),
                      "TF fused kernel": (tf_fused, "tf"),
                      "tf.keras (composed)": (keras_composed, "keras")}
        torch = _torch()
        if torch is not None and rule == "lazy_adam":
            for variant in ("foreach", "fused"):
                def torch_adam(variant=variant):
                    p = torch.nn.Parameter(torch.from_numpy(init.copy()))
                    opt = torch.optim.Adam([p], lr=LR, betas=(BETA1, BETA2), eps=EPS,
                                           **{variant: True})
                    tg = [torch.from_numpy(g.numpy()) for g in grads]
                    c = {"t": 0}

                    def step():
                        c["t"] += 1
                        p.grad = tg[c["t"] % 2]
                        opt.step()
                    return step, p
                contenders[f"torch Adam ({variant})"] = (torch_adam, "torch")
        oracles = {"tf": fused, "keras": fused_keras_form}
        if rule == "lazy_adam":
            # torch adds epsilon after bias-correcting sqrt(v): the same update as ours with
            # epsilon * sqrt(1 - beta2^t).
            def fused_torch_form(hyper=hyper):
                var = tf.Variable(init)
                slots = [tf.Variable(tf.zeros([n])) for _ in range(2)]
                f = quiet_function(tf, lambda g, t: ops.resource_apply_lazy_adam(
                    var, *slots, grad=g, **dict(hyper(t), epsilon=EPS * tf.sqrt(1 - BETA2 ** t))))
                return cycle(f), var
            oracles["torch"] = fused_torch_form
        rows = check_and_time(contenders, oracles, cfg["check_steps"], cfg["dense_steps"],
                              cfg["repeats"], progress)
        bytes_per_step = 4 * n * (2 * (1 + n_slots) + 1)  # read+write var & slots, read grad
        for row in rows.values():
            row["GB_per_s"] = bytes_per_step / (row["median_ms"] / 1e3) / 1e9
        rows["_meta"] = {"bytes_per_step": bytes_per_step}
        out[rule] = rows
        del contenders, oracles
        gc.collect()
    return out


def huge_pages_available():
    from fusedopt.info import huge_pages_available as available
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


def sparse_lazy_adam_step(tf, cfg, rows, ids, num_batches):
    """A fused sparse LazyAdam step on a rows x dim table, cycling through `num_batches`
    batches of `ids` uniform ids (more batches: fewer rows still cached from before)."""
    from fusedopt import ops

    rng = np.random.default_rng(2)
    var, m, v = (tf.Variable(tf.zeros([rows, cfg["dim"]])) for _ in range(3))
    batches = [(tf.constant(rng.integers(0, rows, ids)),
                tf.constant(rng.normal(0, 1, (ids, cfg["dim"])).astype(np.float32)))
               for _ in range(num_batches)]
    f = quiet_function(tf, lambda i, g: ops.resource_sparse_apply_lazy_adam(
        var, m, v, 0.5, 0.5, LR, BETA1, BETA2, EPS, g, i))
    c = {"t": 0}

    def step():
        c["t"] += 1
        f(*batches[c["t"] % num_batches])
    return step


def median_ms(times):
    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def table_scaling(tf, cfg):
    """{table rows: ms} at fixed touched rows, the sizes interleaved (memory speed on a
    shared machine drifts), plus the huge-page memory seen at the end."""
    steps = {rows: sparse_lazy_adam_step(tf, cfg, rows, cfg["scaling_ids"], 16)
             for rows in cfg["tables"]}
    ms = median_ms(time_contenders(steps, cfg["scaling_steps"], 3 * cfg["repeats"], lambda _: None))
    return ms, anon_huge_pages_mb()


def scenario_scaling(tf, cfg, progress, quick):
    """Step time vs touched rows, and vs table rows twice: with the process's default
    (4 KB) pages, and in a child process whose malloc backs tables with transparent
    huge pages. Rows of a 10M-row table sit on different pages, so with 4 KB pages
    nearly every row costs a TLB miss and page walk on top of its DRAM miss."""
    import subprocess

    from fusedopt.info import HUGE_PAGES_TUNABLE

    out = {"touched_rows": {}, "table_rows": {}}
    for ids in cfg["touched"]:
        step = sparse_lazy_adam_step(tf, cfg, cfg["scaling_table"], ids, 2)
        out["touched_rows"][ids] = median_ms(time_contenders(
            {"fusedopt": step}, cfg["scaling_steps"], cfg["repeats"], lambda _: None))["fusedopt"]
        progress(f"scaling: {ids:,} touched rows -> {out['touched_rows'][ids]:.2f} ms")
    out["table_rows"], _ = table_scaling(tf, cfg)
    progress(f"scaling: table rows (4 KB pages) -> {out['table_rows']}")
    if huge_pages_available():
        child = subprocess.run(
            [sys.executable, "-m", "fusedopt.bench", "--table-scaling-child"]
            + (["--quick"] if quick else []),
            env={**os.environ, "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}, capture_output=True,
            text=True, check=True)
        result = json.loads(child.stdout.strip().splitlines()[-1])
        out["table_rows_huge_pages"] = {int(k): v for k, v in result["ms"].items()}
        out["huge_pages_MB"] = result["anon_huge_pages_MB"]
        progress(f"scaling: table rows (huge pages, {result['anon_huge_pages_MB']} MB of them) -> "
                 f"{out['table_rows_huge_pages']}")
    return out


def scenario_bandwidth(tf, cfg, progress):
    """Memory bandwidth this machine sustains, and fusedopt's share of it.

    Probes and Adam run on arrays far larger than the last-level cache at full size
    (the dense scenario's 16M parameters, 256 MB with slots, partly fit in a large L3),
    so both measure DRAM. Probes: ``fusedopt._core.memory_bandwidth`` (C++ threads,
    STREAM-style, bytes that actually cross the bus; "update3" has Adam's exact traffic
    with no math; see cc/pybind/bandwidth.h). The aim compares with the best probe.
    """
    from fusedopt import _core, ops

    n = cfg["bandwidth_params"]
    reps = cfg["repeats"]
    measured = {f"{kernel} ({THREADS} threads)": _core.memory_bandwidth(kernel, n, THREADS, reps)
                for kernel in ("copy", "triad", "update", "update3")}
    peak = max(measured.values())
    progress(f"bandwidth probes: {', '.join(f'{k} {v:.1f} GB/s' for k, v in measured.items())}")
    bytes_adam = 7 * 4 * n  # read var, m, v, grad; write var, m, v

    def best_seconds(fn):
        fn()
        ts = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
        return min(ts)  # best of, as the probes report

    var, m, v = (tf.Variable(tf.zeros([n])) for _ in range(3))
    grad = tf.fill([n], 0.5)
    op_step = quiet_function(tf, lambda: ops.resource_apply_lazy_adam(
        var, m, v, 0.9, 0.999, LR, BETA1, BETA2, EPS, grad))
    op_gbs = bytes_adam / best_seconds(op_step) / 1e9
    del var, m, v, grad, op_step
    gc.collect()
    arrays = [np.zeros(n, np.float32) for _ in range(3)]
    g = np.full(n, 0.5, np.float32)
    hyper = dict(beta1_power=0.9, beta2_power=0.999, lr=LR, beta1=BETA1, beta2=BETA2, epsilon=EPS)
    core_gbs = bytes_adam / best_seconds(lambda: _core.apply_dense(
        "lazy_adam", arrays[0], arrays[1:], g, hyper, num_threads=THREADS)) / 1e9
    out = {"params": n, "measured_GB_per_s": measured, "peak_GB_per_s": peak,
           "fusedopt_op_adam_GB_per_s": op_gbs, "fusedopt_op_adam_pct": 100 * op_gbs / peak,
           "fusedopt_core_adam_GB_per_s": core_gbs,
           "fusedopt_core_adam_pct": 100 * core_gbs / peak}
    progress(f"bandwidth: peak {peak:.1f} GB/s; fused Adam op {op_gbs:.1f} GB/s "
             f"({out['fusedopt_op_adam_pct']:.0f}%), raw kernel {core_gbs:.1f} GB/s")
    return out


def scenario_many_small(tf, cfg, progress):
    from fusedopt import ops

    count, size = cfg["small_vars"], cfg["small_size"]
    rng = np.random.default_rng(3)
    inits = [rng.normal(0, 0.05, size).astype(np.float32) for _ in range(count)]
    grads = [tf.constant(rng.normal(0, 1, size).astype(np.float32)) for _ in range(count)]

    def fused():
        vs = [tf.Variable(x) for x in inits]
        slots = [(tf.Variable(tf.zeros([size])), tf.Variable(tf.zeros([size]))) for _ in vs]

        @tf.function
        def f():
            for var, (m, v), g in zip(vs, slots, grads):
                ops.resource_apply_lazy_adam(var, m, v, 0.9, 0.999, LR, BETA1, BETA2, EPS, g)
        return f, vs[0]

    def keras_adam():
        vs = [tf.Variable(x) for x in inits]
        opt = tf.keras.optimizers.Adam(LR, BETA1, BETA2, EPS)
        f = quiet_function(tf, lambda: opt.apply_gradients(zip(grads, vs)))
        return f, vs[0]

    def tf_fused():  # TF's own fused kernel, one op per variable like ours
        vs = [tf.Variable(x) for x in inits]
        slots = [(tf.Variable(tf.zeros([size])), tf.Variable(tf.zeros([size]))) for _ in vs]

        @tf.function
        def f():
            for var, (m, v), g in zip(vs, slots, grads):
                tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle,
                                             beta1_power=0.9, beta2_power=0.999, lr=LR,
                                             beta1=BETA1, beta2=BETA2, epsilon=EPS, grad=g)
        return f, vs[0]

    progress(f"many small variables: {count} x {size}")
    return check_and_time({"fusedopt (raw op)": (fused, "tf"), "TF fused kernel": (tf_fused, "tf"),
                           "tf.keras Adam": (keras_adam, "tf")},
                          {"tf": fused}, 1, cfg["small_steps"], cfg["repeats"], progress)


# ---------------------------------------------------------------------------- reporting

SCENARIOS = ("sparse", "sparse_xla", "dense", "scaling", "bandwidth", "many_small")


def aims(results):
    """The issue's aims, for the scenarios present in results."""
    rows = []

    def add(text, value, target, at_most=False):
        met = value <= target if at_most else value >= target
        rows.append({"aim": text, "value": value, "target": ("<= " if at_most else ">= ") + str(target),
                     "met": met})
    if "sparse" in results:
        sp = results["sparse"]
        lazy = sp["lazy_adam"]
        add("sparse LazyAdam vs tf.keras Adam", lazy["tf.keras Adam"]["x_fusedopt"], 10)
        add("sparse LazyAdam vs composed gather/scatter", lazy["composed gather/scatter"]["x_fusedopt"], 2)
        if "tensorflow_addons LazyAdam" in lazy:
            add("sparse LazyAdam vs tensorflow_addons LazyAdam",
                lazy["tensorflow_addons LazyAdam"]["x_fusedopt"], 2)
        if "torch SparseAdam" in lazy:
            add("sparse LazyAdam vs torch SparseAdam", lazy["torch SparseAdam"]["x_fusedopt"], 1)
        add("sparse Adagrad vs TF fused (+dedup)",
            sp["adagrad"]["TF ResourceSparseApplyAdagradV2 (+dedup)"]["x_fusedopt"], 1)
    if "sparse_xla" in results:
        tables = results["sparse_xla"]
        small, large = tables[min(tables, key=int)], tables[max(tables, key=int)]
        ours = "fusedopt.keras.LazyAdam, XLA"
        if ours in large:
            add(f"XLA step at {int(max(tables, key=int)):,} rows / at {int(min(tables, key=int)):,}",
                large[ours]["median_ms"] / small[ours]["median_ms"], 1.5, at_most=True)
            add("sparse under XLA: Keras 3 Adam (XLA) vs fusedopt.keras.LazyAdam (XLA)",
                large["tf.keras Adam, XLA"]["x_fusedopt"], 10)
            add("sparse under XLA: fusedopt.keras (XLA) / fusedopt op without XLA",
                1 / large["fusedopt (raw op), no XLA"]["x_fusedopt"], 2, at_most=True)
    if "dense" in results:
        for rule in ("lazy_adam", "adamax", "adagrad"):
            dense = results["dense"][rule]
            add(f"dense {rule} vs TF fused kernel", dense["TF fused kernel"]["x_fusedopt"], 1)
            add(f"dense {rule} vs tf.keras composed", dense["tf.keras (composed)"]["x_fusedopt"], 2)
    if "bandwidth" in results:
        add("dense Adam op, % of measured bandwidth", results["bandwidth"]["fusedopt_op_adam_pct"], 60)
    for key, pages in [("table_rows", "4 KB pages"), ("table_rows_huge_pages", "huge pages")]:
        tables = results.get("scaling", {}).get(key)
        if tables:
            small, large = min(tables, key=int), max(tables, key=int)
            add(f"step time at {int(large):,} table rows / at {int(small):,} ({pages})",
                tables[large] / tables[small], 1.3, at_most=True)
    return rows


def markdown(results, command):
    env = results["environment"]
    load = ", ".join(f"{x:.1f}" for x in env["load_average_at_start"])
    rerun = ""
    if "earlier_run" in env:
        early = env["earlier_run"]
        rerun = (f"Re-ran {', '.join(env['rerun_scenarios'])}; the other scenarios are from "
                 f"the run of {early['date']} (load average at start "
                 f"{', '.join(f'{x:.1f}' for x in early['load_average_at_start'])}).  ")
    lines = [f"Command: `{command}`  ", rerun, f"Date: {env['date']}; machine: {env['machine']} "
             f"(load average at start: {load}); "
             f"TF {env['tensorflow']}; tf.keras = Keras {env['keras']}; torch {env['torch']}; threads pinned to {THREADS} "
             "(TF intra-op, torch, fusedopt._core); inter-op 1.", ""]
    for title, key in [("Sparse embedding step", "sparse"),
                       ("Sparse step under XLA (jit_compile), LazyAdam, by table rows", "sparse_xla"),
                       ("Dense step", "dense")]:
        if key not in results:
            continue
        dense = key == "dense"
        lines.append(f"### {title}")
        for rule, rows in results[key].items():
            if key == "sparse_xla":
                rule = f"{int(rule):,} rows"
            meta = rows.get("_meta", {})
            lines += ["", f"**{rule}** {json.dumps(meta) if meta else ''}", "",
                      "| contender | median ms | min..max ms | x fusedopt | checked vs | max rel err |"
                      + (" GB/s |" if dense else ""),
                      "|---|---|---|---|---|---|" + ("---|" if dense else "")]
            for name, r in rows.items():
                if name.startswith("_"):
                    continue
                lines.append(f"| {name} | {r['median_ms']:.2f} | {r['min_ms']:.2f}..{r['max_ms']:.2f} | "
                             f"{r['x_fusedopt']:.2f} | {r['semantics']} | {r['max_rel_error']:.1e} |"
                             + (f" {r['GB_per_s']:.1f} |" if dense else ""))
        lines.append("")
    if "scaling" in results:
        sc = results["scaling"]
        lines += ["### Scaling (fusedopt sparse LazyAdam, ms per step)", "",
                  "| touched rows | ms |", "|---|---|"]
        lines += [f"| {int(k):,} | {v:.2f} |" for k, v in sc["touched_rows"].items()]
        huge = {int(k): v for k, v in sc.get("table_rows_huge_pages", {}).items()}
        lines += ["", "| table rows | ms, 4 KB pages | ms, huge pages "
                  "(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) |", "|---|---|---|"]
        lines += [f"| {int(k):,} | {v:.2f} | " + (f"{huge[int(k)]:.2f} |" if int(k) in huge else "n/a |")
                  for k, v in sc["table_rows"].items()]
        lines.append("")
    if "bandwidth" in results:
        bw = results["bandwidth"]
        lines += ["### Memory bandwidth", "",
                  f"Arrays of {bw['params']:,} float32 each. Probes (`fusedopt._core.memory_bandwidth`, "
                  f"best of {env['config']['repeats']}): "
                  f"{', '.join(f'{k} {v:.1f} GB/s' for k, v in bw['measured_GB_per_s'].items())}. "
                  f"Dense Adam moves 28 bytes/parameter: fused op {bw['fusedopt_op_adam_GB_per_s']:.1f} GB/s "
                  f"({bw['fusedopt_op_adam_pct']:.0f}% of the best probe), raw kernel via fusedopt._core "
                  f"{bw['fusedopt_core_adam_GB_per_s']:.1f} GB/s ({bw['fusedopt_core_adam_pct']:.0f}%).", ""]
    if "many_small" in results:
        lines += ["### Many small variables (one step)", "", "| contender | median ms | x fusedopt |",
                  "|---|---|---|"]
        lines += [f"| {k} | {v['median_ms']:.2f} | {v['x_fusedopt']:.2f} |"
                  for k, v in results["many_small"].items()]
        lines.append("")
    lines += ["### Aims", "", "| aim | value | target | met |", "|---|---|---|---|"]
    lines += [f"| {a['aim']} | {a['value']:.2f} | {a['target']} | {'yes' if a['met'] else '**no**'} |"
              for a in results["aims"]]
    return "\n".join(lines) + "\n"


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    names, values = [], []
    for block in ("sparse", "dense"):
        for rule, rows in results.get(block, {}).items():
            for name, r in rows.items():
                if not name.startswith("_") and not name.startswith("fusedopt (raw"):
                    names.append(f"{block} {rule}: {name}")
                    values.append(r["x_fusedopt"])
    axes[0].barh(names, values)
    axes[0].axvline(1, color="k", lw=1)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("step time / fusedopt's (higher = fusedopt faster)")
    axes[0].tick_params(axis="y", labelsize=6)
    sc = results.get("scaling", {})
    for ax, key, label, legend in [(axes[1], "touched_rows", "touched rows", "1M-row table"),
                                   (axes[2], "table_rows", "table rows", "4 KB pages"),
                                   (axes[2], "table_rows_huge_pages", "table rows", "huge pages")]:
        if key not in sc:
            continue
        xs = [int(k) for k in sc[key]]
        ax.plot(xs, list(sc[key].values()), "o-", label=legend)
        ax.set_xscale("log")
        if key == "touched_rows":
            ax.set_yscale("log")  # linear work shows as a straight line
        ax.set_xlabel(label)
        ax.set_ylabel("ms / step (fusedopt sparse LazyAdam)")
    axes[1].legend()
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def configs(quick):
    if quick:
        return dict(rows=2000, dim=8, ids=300, check_steps=3, steps=3, repeats=2,
                    dense_params=4096, dense_steps=3, bandwidth_params=1 << 16, touched=[16, 64], tables=[1000, 4000],
                    scaling_table=4000, scaling_ids=64, scaling_steps=3,
                    small_vars=20, small_size=64, small_steps=2, xla_tables=[500, 2000])
    return dict(rows=1_000_000, dim=64, ids=16_384, check_steps=3, steps=20, repeats=5,
                dense_params=16 * 2**20, dense_steps=10, bandwidth_params=1 << 27,
                touched=[1024, 4096, 16384, 65536, 262144], tables=[100_000, 1_000_000, 10_000_000],
                scaling_table=1_000_000, scaling_ids=16_384, scaling_steps=20,
                small_vars=500, small_size=4096, small_steps=10,
                xla_tables=[10_000, 1_000_000])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run for CI")
    p.add_argument("--out", default="bench_results", help="directory for results.json and the plot")
    p.add_argument("--markdown", help="also write the markdown report to this file")
    p.add_argument("--table-scaling-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset to (re)run; the others are kept from "
                        "<out>/results.json when it exists")
    args = p.parse_args(argv)
    selected = set(args.scenarios.split(","))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # each contender has its own tf.function: no retrace noise
    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cfg = configs(args.quick)
    if args.table_scaling_child:  # run by scenario_scaling with huge pages enabled
        ms, huge_mb = table_scaling(tf, cfg)
        print(json.dumps({"ms": ms, "anon_huge_pages_MB": huge_mb}))
        return 0
    os.makedirs(args.out, exist_ok=True)
    started = time.time()

    def progress(msg):
        print(f"[{time.time() - started:6.1f}s] {msg}", flush=True)

    torch = _torch()
    previous = {}
    unknown = selected - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    existing = os.path.join(args.out, "results.json")
    if selected != set(SCENARIOS) and os.path.exists(existing):
        with open(existing) as f:
            previous = json.load(f)
    results = dict(previous)
    results["environment"] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "tensorflow": tf.__version__, "keras": getattr(tf.keras, "__version__", None) or
        __import__("keras").__version__, "torch": torch.__version__ if torch else None,
        "python": sys.version.split()[0], "quick": args.quick, "config": cfg,
        "load_average_at_start": os.getloadavg()}
    if previous:
        results["environment"]["rerun_scenarios"] = sorted(selected)
        results["environment"]["earlier_run"] = previous["environment"]
    def save():  # after every scenario, so a late failure keeps what was measured
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)

    for key, run in [("sparse", lambda: scenario_sparse(tf, cfg, progress)),
                     ("sparse_xla", lambda: scenario_sparse_xla(tf, cfg, progress)),
                     ("dense", lambda: scenario_dense(tf, cfg, progress)),
                     ("scaling", lambda: scenario_scaling(tf, cfg, progress, args.quick)),
                     ("bandwidth", lambda: scenario_bandwidth(tf, cfg, progress)),
                     ("many_small", lambda: scenario_many_small(tf, cfg, progress))]:
        if key not in selected:
            continue
        results[key] = run()
        gc.collect()  # the previous scenario's variables (GBs at full size)
        save()
    results["aims"] = aims(results)
    save()
    plotted = plot(results, os.path.join(args.out, "benchmarks.png"))
    command = "python -m fusedopt.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    report = markdown(results, command.strip())
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    print(report)
    mismatches = [(block, rule, name) for block in ("sparse", "dense") for rule, rows in
                  results.get(block, {}).items() for name, r in rows.items()
                  if not name.startswith("_") and not r["match"]]
    mismatches += [("many_small", name) for name, r in results.get("many_small", {}).items()
                   if not r["match"]]
    progress(f"done; plot {'written' if plotted else 'skipped (no matplotlib)'}")
    if mismatches:
        print("contenders whose numbers differ from fusedopt's:", mismatches, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
