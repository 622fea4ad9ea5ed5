"""The sparse embedding step, per rule and under XLA: the problem, the contenders' steps."""
import functools
import gc
import os
import time

import numpy as np

from fusedopt.bench import libraries
from fusedopt.bench.config import THREADS
from fusedopt.bench.contenders import COMPOSED_TF_OPS, RULES, add_optimizer
from fusedopt.bench.memory import wait_for_huge_pages
from fusedopt.bench.timing import (check_and_time, cycling, median_ms, quiet_function,
                                    time_contenders, updates_per_call)

XLA_RULE = "lazy_adam"  # the rule of the "sparse step under XLA" scenario
UPDATES_PER_CALL = 10  # op_in_step_ms: updates one tf.function call runs
FLOOR_ROUNDS = 5  # floor(): rounds of a floor probe, then the op in a training step


def zipf_ids(rng, rows, n, a=1.1):
    return ((rng.zipf(a, n) - 1) % rows).astype(np.int64)


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


class SparseSteps:
    """Builders of one rule's contenders on a Problem.

    Each takes the (ids, grad) batches to cycle through and returns (step, variable).
    """

    def __init__(self, tf, problem, rule):
        from fusedopt import ops

        self.tf, self.problem, self.rule_name, self.rule = tf, problem, rule, RULES[rule]
        self.shape = (problem.rows, problem.dim)
        self.sparse_op = getattr(ops, f"resource_sparse_apply_{rule}")
        self.dense_op = getattr(ops, f"resource_apply_{rule}")

    def _variables(self):
        tf = self.tf
        var = tf.Variable(self.problem.init)
        slots = [tf.Variable(tf.fill(self.rule.slot_shape(name, self.shape), self.rule.slot_init))
                 for name in self.rule.slots]
        return var, slots

    def _cycling(self, update, batches, pass_step=True):
        """Cycles update(ids, grad[, t as a float tensor]) through batches, as constants."""
        tf = self.tf
        constants = [(tf.constant(i), tf.constant(g)) for i, g in batches]
        if pass_step:  # a tensor, so that the tf.function does not retrace every step
            return cycling(lambda i, g, t: update(i, g, tf.constant(float(t))), constants)
        return cycling(lambda i, g, t: update(i, g), constants)

    def _densified(self, grad, ids):
        tf = self.tf
        return tf.convert_to_tensor(tf.IndexedSlices(grad, ids, tf.constant(self.shape, tf.int64)))

    def fused(self, batches, jit_compile=False, options=None):
        """fusedopt's sparse op; options default to the rule's Keras form."""
        var, slots = self._variables()
        options = self.rule.keras_options if options is None else options
        update = quiet_function(self.tf, lambda i, g, t: self.sparse_op(
            var, *slots, **self.rule.hyper(t), grad=g, indices=i, **options), jit_compile)
        return self._cycling(update, batches), var

    def fused_in_step(self, batches, count):
        """fusedopt's sparse op, `count` updates (cycling through batches, of equal
        lengths) in one tf.function call (timing.updates_per_call)."""
        tf = self.tf
        var, slots = self._variables()
        options = self.rule.keras_options
        ids = tf.constant(np.stack([i for i, _ in batches]))
        grads = tf.constant(np.stack([g for _, g in batches]))

        def update(k):  # update k + 1 uses batch k % len, as `fused` does
            b = k % len(batches)
            self.sparse_op(var, *slots, **self.rule.hyper(tf.cast(k + 1, tf.float32)),
                           grad=grads[b], indices=ids[b], **options)
        return updates_per_call(tf, update, count), var

    def fused_hlo(self, batches):
        """The XLA lowering XLA:GPU runs, here on the CPU."""
        step, var = self.fused(batches, jit_compile=True)

        def hlo_step():  # the lowering is chosen when the step compiles, at its first call
            os.environ["FUSEDOPT_XLA_LOWERING"] = "hlo"
            try:
                step()
            finally:
                del os.environ["FUSEDOPT_XLA_LOWERING"]
        return hlo_step, var

    def fused_dense_semantics(self, batches):
        """The oracle for contenders that update every row: the dense op, densified grad."""
        var, slots = self._variables()
        update = quiet_function(self.tf, lambda i, g, t: self.dense_op(
            var, *slots, **self.rule.hyper(t), grad=self._densified(g, i),
            **self.rule.keras_options))
        return self._cycling(update, batches), var

    def composed(self, batches):
        """The rule's lazy update in composed TF ops, written as tensorflow-addons wrote
        LazyAdam, in the fastest form we found: sum the gradient rows of repeated ids
        (``tf.unique``, then ``tf.scatter_nd`` adding each row into its id's: faster than
        ``tf.math.unsorted_segment_sum`` here), gather the touched rows of var and the
        slots, run the rule's math (its module's ``composed``) on them, and write each
        array's rows back with the resource variables' in-place ``scatter_update`` (no
        slower than ``scatter_sub`` for var, faster than ``scatter_add`` for the slots).
        Nothing reads a whole variable: after a gather, a dense read makes TensorFlow copy
        the whole table (``tf.shape(var)`` alone made the step about 20x slower)."""
        from fusedopt import rules

        tf = self.tf
        var, slots = self._variables()
        spec = rules.SPECS[self.rule_name]
        options = {**spec["options"], **self.rule.keras_options}
        math = rules.module(self.rule_name).composed
        width = self.shape[1:]

        @tf.function
        def update(ids, grad, t):
            rows, position = tf.unique(ids)
            grad = tf.scatter_nd(position[:, None], grad, tf.concat([tf.shape(rows), width], 0))
            hyper = {name: tf.cast(x, grad.dtype) for name, x in self.rule.hyper(t).items()}
            new_var, new_slots = math(tf.gather(var, rows),
                                      [tf.gather(slot, rows) for slot in slots], grad, hyper,
                                      options)
            for variable, values in zip([var, *slots], [new_var, *new_slots]):
                variable.scatter_update(tf.IndexedSlices(values, rows))
        step = self._cycling(update, batches)
        step.function = update  # for the tests: one trace however many rows a step touches
        return step, var

    def optimizer(self, make_optimizer, batches, jit_compile=False, dedup=False):
        """An optimizer object's apply_gradients on an IndexedSlices gradient; `dedup`:
        its repeated ids summed first (one row per id)."""
        tf = self.tf
        var = tf.Variable(self.problem.init)
        opt = make_optimizer()

        @tf.function(jit_compile=jit_compile)
        def update(i, g):
            if dedup:
                i, g = self._summed(i, g)
            opt.apply_gradients([(tf.IndexedSlices(g, i, tf.constant(self.shape, tf.int64)),
                                  var)])
        return self._cycling(update, batches, pass_step=False), var

    def _summed(self, ids, grad):
        """(unique ids, their gradient rows summed)."""
        tf = self.tf
        unique, pos = tf.unique(ids)
        return unique, tf.math.unsorted_segment_sum(grad, pos, tf.shape(unique)[0])

    def tf_sparse_kernel(self, batches):
        """TF's own fused sparse kernel, fed deduplicated rows (it needs unique ids)."""
        tf = self.tf
        var, slots = self._variables()
        kernel = getattr(tf.raw_ops, self.rule.tf_sparse_kernel)

        @tf.function
        def update(i, g, t):
            unique, summed = self._summed(i, g)
            kernel(**self.rule.tf_kernel_variables(var, slots), **self.rule.hyper(t), grad=summed,
                   indices=unique)
        return self._cycling(update, batches), var

    def torch(self, make_optimizer, batches):
        """A torch optimizer on a sparse Embedding's sparse gradient."""
        torch = libraries.torch()
        emb = torch.nn.Embedding(self.problem.rows, self.problem.dim, sparse=True)
        with torch.no_grad():
            emb.weight.copy_(torch.from_numpy(self.problem.init))
        opt = make_optimizer(emb.parameters())

        def update(i, g, t):
            emb.weight.grad = torch.sparse_coo_tensor(i[None], g, self.shape)
            opt.step()
        return cycling(update, [(torch.from_numpy(i), torch.from_numpy(g))
                                for i, g in batches]), emb.weight


def rule_contenders(tf, problem, rule):
    """({name: (make, semantics)}, {semantics: make}) of one rule's sparse scenario."""
    steps, entry = SparseSteps(tf, problem, rule), RULES[rule]
    contenders = {"fusedopt (raw op)": (steps.fused, "lazy"),
                  COMPOSED_TF_OPS: (steps.composed, "lazy")}
    oracles = {"lazy": steps.fused, "dense": steps.fused_dense_semantics}
    if entry.tf_sparse_kernel:
        contenders[f"TF {entry.tf_sparse_kernel} (+dedup)"] = (steps.tf_sparse_kernel,
                                                               "lazy_eps_out")
        oracles["lazy_eps_out"] = functools.partial(steps.fused, options={})
    if entry.keras_sparse_dedup:
        add_optimizer(contenders, entry.keras, functools.partial(steps.optimizer, dedup=True),
                      " (+dedup)")
    for optimizer in (None if entry.keras_sparse_dedup else entry.keras,
                      *entry.sparse_optimizers, entry.fusedopt_keras):
        add_optimizer(contenders, optimizer, steps.optimizer)
    add_optimizer(contenders, entry.torch_sparse, steps.torch)
    return contenders, oracles


def xla_contenders(tf, problem):
    """The contenders of the "sparse step under XLA" scenario, and their oracles."""
    steps, entry = SparseSteps(tf, problem, XLA_RULE), RULES[XLA_RULE]
    under_xla = functools.partial(steps.optimizer, jit_compile=True)
    contenders = {}
    add_optimizer(contenders, entry.fusedopt_keras, under_xla, ", XLA")
    contenders["fusedopt (raw op), XLA"] = (functools.partial(steps.fused, jit_compile=True),
                                            "lazy")
    contenders["fusedopt (raw op), XLA, HLO lowering"] = (steps.fused_hlo, "lazy")
    contenders["fusedopt (raw op), no XLA"] = (steps.fused, "lazy")
    add_optimizer(contenders, entry.keras, under_xla, ", XLA")
    return contenders, {"lazy": steps.fused, "dense": steps.fused_dense_semantics}


def measure(cfg, progress, problem, contenders, oracles):
    # settle: big tables are timed once their huge-page collapse is done (steady state).
    return check_and_time(contenders, oracles, cfg["check_steps"], cfg["steps"], cfg["repeats"],
                          progress, (problem.check_batches, problem.batches),
                          settle=wait_for_huge_pages)


def scenario_sparse(tf, cfg, progress):
    """Every rule's sparse step on one Zipf-distributed embedding problem."""
    out = {}
    problem = Problem(cfg["rows"], cfg["dim"], cfg["ids"], cfg["check_steps"])
    call_ms = call_cost_ms(tf, problem, cfg)
    for rule in RULES:
        progress(f"sparse {rule}: {cfg['rows']:,} x {cfg['dim']} table, {cfg['ids']:,} ids/step")
        out[rule] = measure(cfg, progress, problem, *rule_contenders(tf, problem, rule))
        gc.collect()  # the contenders' variables
        unique = len(np.unique(problem.batches[0][0]))
        out[rule]["_meta"] = {"unique_ids_per_step": unique, "tf_function_call_ms": call_ms,
                              **floor(tf, problem, rule,
                                      out[rule]["fusedopt (raw op)"]["median_ms"], cfg)}
        gc.collect()
    return out


def call_cost_ms(tf, problem, cfg):
    """The median cost of calling a tf.function that takes the raw op's inputs (ids,
    gradient, step) and does nothing with them: what every TF contender pays per step
    before any work, and the plain-C++ floor does not."""
    nothing = SparseSteps(tf, problem, "adagrad")._cycling(
        quiet_function(tf, lambda i, g, t: tf.identity(t)), problem.batches)
    times = time_contenders({"call": nothing}, cfg["steps"], cfg["repeats"], lambda _: None)
    return median_ms(times)["call"]


def floor(tf, problem, rule, fused_ms, cfg):
    """The floor of this rule's sparse step on the problem, and the raw op against it.

    The floor (fusedopt._core.sparse_floor): group the ids and sum duplicates on one
    thread, then read, update and write exactly the touched rows of var and the rule's
    slots on THREADS threads. A probe is the best of its repeats, stage by stage: the
    least time the work takes on this machine. The op is timed as a training step runs it
    (SparseSteps.fused_in_step: UPDATES_PER_CALL updates per tf.function call, so
    TensorFlow's fixed cost of a call is spread over them).

    FLOOR_ROUNDS rounds alternate a probe (on tables of its own: where the kernel places
    a probe's tables moves its time) and a few of the op's calls, so that the machine's
    drift reaches both. The aim compares best with best (`fusedopt_in_step_best_x_floor`:
    the op's fastest call against the fastest probe); the op's median call against the
    fastest probe (`fusedopt_in_step_x_floor`) and one update per call
    (`fusedopt_x_floor`, from the scenario's own median `fused_ms`) are reported beside it.
    """
    from fusedopt import _core

    layouts = _core.rules()[rule]["slot_layouts"].values()
    step, _ = SparseSteps(tf, problem, rule).fused_in_step(problem.batches, UPDATES_PER_CALL)
    step()  # traced and warm
    wait_for_huge_pages()
    calls = max(2, cfg["steps"] // UPDATES_PER_CALL)
    probes, call_ms = [], []
    for _ in range(FLOOR_ROUNDS):
        probes.append(_core.sparse_floor(
            [ids for ids, _ in problem.batches], problem.rows, problem.dim,
            element_slots=sum(x == "per_element" for x in layouts),
            row_slots=sum(x == "per_row" for x in layouts),
            num_threads=THREADS, repeats=max(5, 4 * cfg["repeats"])))
        step()  # after the probe, as before every timed run (time_contenders)
        for _ in range(calls):
            start = time.perf_counter()
            step()
            call_ms.append(1e3 * (time.perf_counter() - start) / UPDATES_PER_CALL)
    probe = min(probes, key=lambda p: p["floor_ms"])
    in_step_ms, best_ms = float(np.median(call_ms)), min(call_ms)
    return {"floor_ms": probe["floor_ms"], "floor_group_ms": probe["group_ms"],
            "floor_rows_ms": probe["rows_ms"],
            "floor_probes_ms": [p["floor_ms"] for p in probes],
            "fusedopt_x_floor": fused_ms / probe["floor_ms"],
            "fusedopt_in_step_ms": in_step_ms, "fusedopt_in_step_best_ms": best_ms,
            "fusedopt_in_step_x_floor": in_step_ms / probe["floor_ms"],
            "fusedopt_in_step_best_x_floor": best_ms / probe["floor_ms"]}


def scenario_sparse_xla(tf, cfg, progress):
    """The sparse LazyAdam step compiled by XLA (what Keras 3 does by default on GPU
    machines), at two table sizes with the same batches: the step must cost the same."""
    out = {}
    for rows in cfg["xla_tables"]:
        problem = Problem(rows, cfg["dim"], cfg["ids"], cfg["check_steps"])
        progress(f"sparse under XLA: {rows:,} x {cfg['dim']} table, {cfg['ids']:,} ids/step")
        out[str(rows)] = measure(cfg, progress, problem, *xla_contenders(tf, problem))
        del problem
        gc.collect()
    return out
