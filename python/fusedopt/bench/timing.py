"""Running contenders: steps that cycle through batches, checks against an oracle, timing.

A contender is built by a ``make`` function returning ``(step, variable)``: ``step()`` runs
one update, ``variable`` is what it updates (read back for the check).
"""
import time

import numpy as np

MATCH_TOLERANCE = 1e-3  # largest relative error of a contender that "matches" its oracle


def cycling(update, batches):
    """A step whose t-th call (t = 1, 2, ...) runs ``update(*batches[(t - 1) % len], t)``."""
    calls = {"t": 0}

    def step():
        calls["t"] += 1
        t = calls["t"]
        update(*batches[(t - 1) % len(batches)], t)
    return step


def updates_per_call(tf, update, count):
    """A step that runs `count` updates in one tf.function call, as a training step runs an
    optimizer beside the rest of its work (TensorFlow's fixed cost of a call spread over
    them): its t-th call runs update(k) for k = (t - 1) * count, ..., t * count - 1, k an
    int64 tensor (update k + 1 of a one-update-per-call step)."""
    @tf.function
    def run(done):
        for k in tf.range(done, done + count):
            update(k)
    calls = {"n": 0}

    def step():
        run(tf.constant(calls["n"] * count, tf.int64))
        calls["n"] += 1
    return step


def quiet_function(tf, fn, jit_compile=False):
    """tf.function of fn, discarding its result (graph-mode update ops return Operations)."""
    def body(*args):
        fn(*args)
    return tf.function(body, jit_compile=jit_compile)


def time_contenders(steps, iterations, repeats, progress):
    """{name: [seconds per step, one entry per repeat]}, interleaved, order rotating."""
    times = {name: [] for name in steps}
    names = list(steps)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            step = steps[name]
            step()  # keep caches/turbo state comparable across contenders
            start = time.perf_counter()
            for _ in range(iterations):
                step()
            times[name].append((time.perf_counter() - start) / iterations)
        progress(f"repeat {r + 1}/{repeats}")
    return times


def median_ms(times):
    return {name: 1e3 * float(np.median(ts)) for name, ts in times.items()}


def summarize(times, baseline):
    """Median, min and max ms per contender, and its median as a multiple of baseline's."""
    base = float(np.median(times[baseline]))
    rows = {}
    for name, ts in times.items():
        median = float(np.median(ts))
        rows[name] = {"median_ms": 1e3 * median, "min_ms": 1e3 * min(ts), "max_ms": 1e3 * max(ts),
                      "x_fusedopt": median / base}
    return rows


def max_rel_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-3))) if a.size else 0.0


def read(variable):
    """A TF variable's or torch parameter's value as a NumPy array."""
    return variable.detach().numpy() if hasattr(variable, "detach") else variable.numpy()


def value_after(make, inputs, check_steps):
    """What `make`'s contender holds after `check_steps` steps on `inputs`."""
    step, variable = make(*inputs)
    for _ in range(check_steps):
        step()
    return read(variable)


def check_and_time(contenders, oracles, check_steps, steps, repeats, progress, batches=None,
                   settle=None):
    """Checks each contender against its oracle, then times them all: {name: row}.

    contenders: {name: (make, semantics)}, the first one the baseline; oracles:
    {semantics: make}. With ``batches`` = (check batches, timed batches), every make takes
    the batches to cycle through and contenders are built twice: on the check batches for
    the comparison, then afresh on the timed ones; else makes take no arguments.
    ``settle``: called after one step of each timed contender, before timing (e.g. to let
    background work those steps started finish).
    """
    check_inputs, timed_inputs = ((batches[0],), (batches[1],)) if batches else ((), ())
    expected = {semantics: value_after(make, check_inputs, check_steps)
                for semantics, make in oracles.items()}
    checks, timed_steps = {}, {}
    for name, (make, semantics) in contenders.items():
        error = max_rel_error(value_after(make, check_inputs, check_steps), expected[semantics])
        checks[name] = {"semantics": semantics, "max_rel_error": error,
                        "match": error < MATCH_TOLERANCE}
        timed_steps[name] = make(*timed_inputs)[0]
        progress(f"checked {name}: max rel error {error:.1e}")
    if settle is not None:
        for step in timed_steps.values():
            step()
        settle()
    rows = summarize(time_contenders(timed_steps, steps, repeats, progress), next(iter(contenders)))
    for name in rows:
        rows[name].update(checks[name])
    return rows
