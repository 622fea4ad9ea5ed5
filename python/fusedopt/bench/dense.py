"""Dense steps: one large variable per rule, and many small variables (LazyAdam)."""
import functools
import gc

import numpy as np

from fusedopt.bench import libraries
from fusedopt.bench.config import BETA1, BETA2, EPS, LR, THREADS
from fusedopt.bench.contenders import RULES, Optimizer, add_optimizer
from fusedopt.bench.memory import wait_for_huge_pages
from fusedopt.bench.timing import (check_and_time, cycling, median_ms, quiet_function,
                                    time_contenders, updates_per_call)


class DenseSteps:
    """Builders of one rule's contenders on a dense variable: make() -> (step, variable).

    Every step alternates between the same two gradients.
    """

    def __init__(self, tf, init, grads, rule):
        from fusedopt import ops

        self.tf, self.init, self.grads = tf, init, grads
        self.rule = RULES[rule]
        self.op = getattr(ops, f"resource_apply_{rule}")

    def _variables(self):
        tf = self.tf
        var = tf.Variable(self.init)
        slots = [tf.Variable(tf.fill(self.rule.slot_shape(name, [self.init.size]),
                                     self.rule.slot_init))
                 for name in self.rule.slots]
        return var, slots

    def _cycling(self, update):
        """Cycles update(grad, t as a float tensor: no retracing) through the gradients."""
        tf = self.tf
        return cycling(lambda g, t: update(g, tf.constant(float(t))), [(g,) for g in self.grads])

    def fused(self, options=None, hyper=None):
        """fusedopt's dense op; by default in TF's form (no options) with the rule's hyper."""
        var, slots = self._variables()
        options, hyper = options or {}, hyper or self.rule.hyper
        update = quiet_function(self.tf, lambda g, t: self.op(
            var, *slots, grad=g, **hyper(t), **options))
        return self._cycling(update), var

    def fused_in_step(self, count):
        """fusedopt's dense op, `count` updates in one tf.function call
        (timing.updates_per_call), update k + 1 on the gradient `fused`'s step k + 1 uses."""
        tf = self.tf
        var, slots = self._variables()
        grads = self.grads

        def update(k):  # the gradient tensors themselves (no copy)
            grad = tf.switch_case(tf.cast(k % len(grads), tf.int32),
                                  [lambda g=g: g for g in grads])
            self.op(var, *slots, grad=grad, **self.rule.hyper(tf.cast(k + 1, tf.float32)))
        return updates_per_call(tf, update, count), var

    def tf_kernel(self):
        """TF's own fused dense kernel."""
        var, slots = self._variables()
        kernel = getattr(self.tf.raw_ops, self.rule.tf_dense_kernel)
        update = quiet_function(self.tf, lambda g, t: kernel(
            **self.rule.tf_kernel_variables(var, slots), grad=g, **self.rule.hyper(t)))
        return self._cycling(update), var

    def optimizer(self, make_optimizer):
        """An optimizer object's apply_gradients (tf.keras's: composed TF ops)."""
        var = self.tf.Variable(self.init)
        opt = make_optimizer()
        update = quiet_function(self.tf, lambda g, t: opt.apply_gradients([(g, var)]))
        return self._cycling(update), var

    def torch(self, make_optimizer):
        """A torch optimizer on a dense parameter."""
        torch = libraries.torch()
        parameter = torch.nn.Parameter(torch.from_numpy(self.init.copy()))
        opt = make_optimizer([parameter])

        def update(g, t):
            parameter.grad = g
            opt.step()
        return cycling(update, [(torch.from_numpy(g.numpy()),) for g in self.grads]), parameter


def rule_contenders(steps):
    """({name: (make, semantics)}, {semantics: make}) of one rule's dense scenario."""
    rule = steps.rule
    contenders = {"fusedopt (raw op)": (steps.fused, "tf")}
    if rule.tf_dense_kernel is not None:
        contenders["TF fused kernel"] = (steps.tf_kernel, "tf")
    if rule.keras is not None:
        keras = functools.partial(rule.keras.make, steps.tf)
        contenders["tf.keras (composed)"] = (functools.partial(steps.optimizer, keras), "keras")
    for optimizer in rule.torch_dense:
        add_optimizer(contenders, optimizer, steps.torch)
    oracles = {"tf": steps.fused,
               "keras": functools.partial(steps.fused, options=rule.keras_options)}
    if rule.torch_hyper is not None:
        oracles["torch"] = functools.partial(steps.fused, hyper=rule.torch_hyper)
    return contenders, oracles


def scenario_dense(tf, cfg, progress):
    """Every rule's dense step on one large variable, with its achieved GB/s."""
    n = cfg["dense_params"]
    rng = np.random.default_rng(1)
    init = rng.normal(0, 0.05, n).astype(np.float32)
    grads = [tf.constant(rng.normal(0, 1, n).astype(np.float32)) for _ in range(2)]
    out = {}
    for rule in RULES:
        progress(f"dense {rule}: {n:,} float32 parameters")
        steps = DenseSteps(tf, init, grads, rule)
        rows = check_and_time(*rule_contenders(steps), cfg["check_steps"], cfg["dense_steps"],
                              cfg["repeats"], progress)
        del steps
        gc.collect()
        bytes_per_step = 4 * n * (2 * (1 + len(RULES[rule].slots)) + 1)  # r+w var, slots; r grad
        for row in rows.values():
            row["GB_per_s"] = bytes_per_step / (row["median_ms"] / 1e3) / 1e9
        rows["_meta"] = {"bytes_per_step": bytes_per_step}
        out[rule] = rows
    return out


def scenario_dense_sizes(tf, cfg, progress):
    """Dense Adam against TF's fused kernel and torch's multi-tensor Adam (foreach, fused)
    at two sizes: in cache-unfriendly memory (16M parameters: 448 MB moved per step) and
    far beyond it (128M: 3.6 GB). {parameters: rows}."""
    rule_name = "lazy_adam"
    out = {}
    for n in cfg["dense_sizes"]:
        rng = np.random.default_rng(1)
        init = rng.normal(0, 0.05, n).astype(np.float32)
        grads = [tf.constant(rng.normal(0, 1, n).astype(np.float32)) for _ in range(2)]
        progress(f"dense sizes: {rule_name}, {n:,} float32 parameters")
        steps = DenseSteps(tf, init, grads, rule_name)
        contenders = {"fusedopt (raw op)": (steps.fused, "tf"),
                      "TF fused kernel": (steps.tf_kernel, "tf")}
        for optimizer in steps.rule.torch_dense:
            add_optimizer(contenders, optimizer, steps.torch)
        oracles = {"tf": steps.fused,
                   "torch": functools.partial(steps.fused, hyper=steps.rule.torch_hyper)}
        # settle: timed once the op's huge-page collapse of var, m and v is done (a long
        # run's steady state; torch's buffers stay on 4 KB pages, THP being "madvise").
        rows = check_and_time(contenders, oracles, cfg["check_steps"], cfg["dense_steps"],
                              cfg["repeats"], progress, settle=wait_for_huge_pages)
        bytes_per_step = 4 * n * 7  # r+w var, m, v; r grad
        for row in rows.values():
            row["GB_per_s"] = bytes_per_step / (row["median_ms"] / 1e3) / 1e9
        rows["_meta"] = {"bytes_per_step": bytes_per_step}
        fused_torch = [entry for entry in steps.rule.torch_dense if entry.name == TORCH_FUSED]
        if fused_torch and libraries.torch() is not None:
            progress(f"dense sizes: {n:,} parameters, the op in a training step and torch")
            rows["_meta"]["in_step_ms"] = in_step_ms(steps, fused_torch[0], cfg)
        del steps, grads
        gc.collect()
        if libraries.torch() is not None:
            progress(f"dense sizes: {n:,} parameters, the engine and torch on the same buffers")
            rows["_meta"]["same_buffers_ms"] = same_buffers_ms(init, cfg["dense_steps"],
                                                               cfg["repeats"], progress)
        out[n] = rows
        del init
        gc.collect()
    return out


TORCH_FUSED = "torch Adam (fused)"
IN_STEP = "fusedopt (raw op), {} updates per call"  # in_step_ms's row of the op


def in_step_ms(steps, torch_entry, cfg):
    """Median ms per update of fusedopt's op as a training step runs it
    (DenseSteps.fused_in_step, UPDATES_PER_CALL updates per tf.function call) and of
    torch's fused Adam, timed in alternation, each timed call running UPDATES_PER_CALL
    updates: {row name: ms}. Per-call costs differ in kind (TensorFlow's call of a
    function, torch's Python step), and a training step pays TensorFlow's once for all
    its work: this compares the updates. Both are checked against fusedopt's numbers in
    the scenario's table (`fused_in_step`'s updates are those of the op's row: tested)."""
    from fusedopt.bench.sparse import UPDATES_PER_CALL

    fused_step, _ = steps.fused_in_step(UPDATES_PER_CALL)
    torch_step, _ = steps.torch(functools.partial(torch_entry.make, libraries.torch()))

    def torch_steps():
        for _ in range(UPDATES_PER_CALL):
            torch_step()
    timed = {IN_STEP.format(UPDATES_PER_CALL): fused_step, TORCH_FUSED: torch_steps}
    for step in timed.values():
        step()
    wait_for_huge_pages()
    times = median_ms(time_contenders(timed, max(1, cfg["dense_steps"] // UPDATES_PER_CALL) + 1,
                                      cfg["repeats"], lambda _: None))
    return {name: ms / UPDATES_PER_CALL for name, ms in times.items()}


def same_buffers_ms(init, steps, repeats, progress):
    """Median ms per dense Adam step of fusedopt's engine (``fusedopt._core``, no TF) and
    torch's fused Adam, alternating on the very same var, m, v and grad arrays.

    On a VM the physical placement of a buffer can change a memory-bound step by 3x (two
    identical TF setups in one process: 78 and 261 ms at 128M parameters, BENCHMARKS.md):
    contenders with buffers of their own then compare placements, not kernels. Timing
    only: both kernels' numbers are checked in the scenario's table."""
    from fusedopt import _core

    torch = libraries.torch()
    var, grad = init.copy(), np.random.default_rng(2).normal(0, 1, init.size).astype(np.float32)
    m, v = np.zeros_like(var), np.zeros_like(var)
    parameter = torch.nn.Parameter(torch.from_numpy(var))
    parameter.grad = torch.from_numpy(grad)
    opt = torch.optim.Adam([parameter], lr=LR, betas=(BETA1, BETA2), eps=EPS, fused=True)
    opt.step()  # makes its state; then its moments become ours
    state = opt.state[parameter]
    state["exp_avg"], state["exp_avg_sq"] = torch.from_numpy(m), torch.from_numpy(v)
    hyper = RULES["lazy_adam"].hyper(1)

    def engine():
        _core.apply_dense("lazy_adam", var, [m, v], grad, hyper, num_threads=THREADS)
    return median_ms(time_contenders({"fusedopt engine (_core)": engine,
                                      "torch Adam (fused)": opt.step}, steps, repeats, progress))


MANY_SMALL_RULE = "lazy_adam"  # the rule of the "many small variables" scenario


def many_small_shapes(cfg):
    """small_pairs x ([small_dim, small_dim] and [small_dim]): a model's weights and biases."""
    n, d = cfg["small_pairs"], cfg["small_dim"]
    return [(d, d)] * n + [(d,)] * n


def scenario_many_small(tf, cfg, progress):
    """One dense step over many small variables: one op per variable (fusedopt's and TF's
    kernels), fusedopt's group op, the optimizer classes (Keras 3 and Keras 2, fusedopt's
    on the group op) and torch's multi-tensor Adam (foreach, fused) on the same shapes.
    Every step repeats the first step's update (one check step)."""
    from fusedopt import ops

    rule = RULES[MANY_SMALL_RULE]
    shapes = many_small_shapes(cfg)
    rng = np.random.default_rng(3)
    inits = [rng.normal(0, 0.05, shape).astype(np.float32) for shape in shapes]
    grads = [tf.constant(rng.normal(0, 1, shape).astype(np.float32)) for shape in shapes]
    hyper = rule.hyper(1)
    fused_op = getattr(ops, f"resource_apply_{MANY_SMALL_RULE}")
    group_op = getattr(ops, f"resource_group_apply_{MANY_SMALL_RULE}")
    packed_op = getattr(ops, f"resource_packed_group_apply_{MANY_SMALL_RULE}")
    tf_kernel = getattr(tf.raw_ops, rule.tf_dense_kernel)

    loop_steps = cfg["small_loop_steps"]

    # A contender's step body takes the op's hyper-parameters: one step per call repeats
    # step 1's (as every step of this scenario), a loop of steps takes each step's own
    # (the Keras classes count their iterations).
    def one_step(body, hyper=hyper):
        return quiet_function(tf, lambda: body(hyper))

    def looped(body, hyper=None):
        @tf.function
        def steps():
            for i in tf.range(loop_steps):
                body(rule.hyper(tf.cast(i + 1, tf.float32)))
        return steps

    def variables_and_slots():
        variables = [tf.Variable(x) for x in inits]
        slots = [[tf.Variable(tf.fill(x.shape, rule.slot_init)) for _ in rule.slots]
                 for x in inits]
        return variables, slots

    # Each contender's step body, wrapped by `wrap` in a tf.function: one step per call, or
    # `loop_steps` steps per call in a loop (Keras's steps_per_execution).
    def one_op_per_variable(apply, wrap, hyper=hyper):
        variables, slots = variables_and_slots()

        def body(step_hyper):
            for var, var_slots, g in zip(variables, slots, grads):
                apply(var, var_slots, g, step_hyper)
        return wrap(body, hyper), variables[0]

    def group(wrap=one_step):
        variables, slots = variables_and_slots()
        per_slot = [[s[k] for s in slots] for k in range(len(rule.slots))]
        return wrap(lambda step_hyper: group_op(variables, *per_slot, grad=grads, **step_hyper)), \
            variables[0]

    def packed_group(wrap=one_step):
        """The group op on a member pack (one captured handle for all variables and slots:
        what the Keras classes run)."""
        variables, slots = variables_and_slots()
        pack = ops.variable_pack(variables + [s[k] for k in range(len(rule.slots))
                                              for s in slots])
        return wrap(lambda step_hyper: packed_op(pack, grad=grads, **step_hyper)), variables[0]

    def fused(hyper=hyper, wrap=one_step):
        return one_op_per_variable(
            lambda var, slots, g, step_hyper: fused_op(var, *slots, grad=g, **step_hyper),
            wrap, hyper)

    def tf_fused():
        return one_op_per_variable(lambda var, slots, g, step_hyper: tf_kernel(
            **rule.tf_kernel_variables(var, slots), grad=g, **step_hyper), one_step)

    def optimizer(make_optimizer, wrap=one_step):
        variables = [tf.Variable(x) for x in inits]
        opt = make_optimizer()
        if wrap is looped:  # Keras 3: its slots made before the loop, not in its body
            opt.build(variables)
        return wrap(lambda _: opt.apply_gradients(zip(grads, variables))), variables[0]

    def torch(make_optimizer):
        torch = libraries.torch()
        parameters = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in inits]
        opt = make_optimizer(parameters)
        torch_grads = [torch.from_numpy(g.numpy()) for g in grads]

        def step():
            for p, g in zip(parameters, torch_grads):
                p.grad = g
            opt.step()
        return step, parameters[0]

    def v1_graph(build):
        """build(variables, slots, grads) -> op, in a tf.compat.v1 graph run by a Session:
        the op's own cost, without tf.function's per-call handling of ~4,000 captured
        inputs (variables, slots, gradients) that every contender above pays."""
        graph = tf.Graph()
        with graph.as_default():
            variables = [tf.compat.v1.Variable(x, use_resource=True) for x in inits]
            slots = [[tf.compat.v1.Variable(tf.fill(x.shape, rule.slot_init), use_resource=True)
                      for _ in rule.slots] for x in inits]
            graph_grads = [tf.constant(g.numpy()) for g in grads]
            op = build(variables, slots, graph_grads)
            session = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=THREADS, inter_op_parallelism_threads=1))
            session.run(tf.compat.v1.global_variables_initializer())

        class Value:  # what check_and_time reads back
            def numpy(self):
                return session.run(variables[0])
        return (lambda: session.run(op)), Value()

    def group_v1():
        return v1_graph(lambda variables, slots, g: group_op(
            variables, *[[s[k] for s in slots] for k in range(len(rule.slots))], grad=g,
            **hyper))

    def fused_v1():
        return v1_graph(lambda variables, slots, g: tf.group(
            [fused_op(v, *s, grad=x, **hyper) for v, s, x in zip(variables, slots, g)]))

    contenders = {"fusedopt packed group op (raw)": (packed_group, "tf"),
                  "fusedopt group op (raw)": (group, "tf"),
                  "fusedopt per-variable ops (raw)": (fused, "tf"),
                  "fusedopt group op (raw), v1 Session": (group_v1, "tf"),
                  "fusedopt per-variable ops (raw), v1 Session": (fused_v1, "tf"),
                  "TF fused kernel per variable": (tf_fused, "tf")}
    for entry in MANY_SMALL_OPTIMIZERS:
        add_optimizer(contenders, entry, optimizer)
    for entry in rule.torch_dense:
        add_optimizer(contenders, entry, torch)
    oracles = {"tf": fused, "torch": functools.partial(fused, hyper=rule.torch_hyper(1))}
    progress(f"many small variables: {len(shapes)} ({cfg['small_pairs']} x "
             f"[{cfg['small_dim']},{cfg['small_dim']}] + {cfg['small_pairs']} x "
             f"[{cfg['small_dim']}])")
    rows = check_and_time(contenders, oracles, 1, cfg["small_steps"], cfg["repeats"], progress)
    rows.update(many_small_looped(tf, cfg, progress, packed_group, group, fused, optimizer,
                                  looped))
    rows["_meta"] = {"shapes": f"{cfg['small_pairs']} x [{cfg['small_dim']},{cfg['small_dim']}]"
                               f" + {cfg['small_pairs']} x [{cfg['small_dim']}]",
                     "parameters": int(sum(np.prod(s) for s in shapes)),
                     "loop_steps": loop_steps}
    return rows


LOOPED = ", {} steps per call"  # the suffix of the looped contenders' rows


def many_small_looped(tf, cfg, progress, packed_group, group, fused, optimizer, looped):
    """The TF contenders again, each call running `small_loop_steps` steps in a loop inside
    the function (as Keras's ``steps_per_execution``): the call's per-input cost is paid
    once per call, the loop's per-iteration cost still once per step. Rows in ms per step;
    "x_fusedopt" against the looped packed group op."""
    k = cfg["small_loop_steps"]
    suffix = LOOPED.format(k)
    contenders = {"fusedopt packed group op (raw)" + suffix:
                      (functools.partial(packed_group, wrap=looped), "tf"),
                  "fusedopt group op (raw)" + suffix: (functools.partial(group, wrap=looped), "tf"),
                  "fusedopt per-variable ops (raw)" + suffix:
                      (functools.partial(fused, wrap=looped), "tf")}
    for entry in MANY_SMALL_OPTIMIZERS[:2]:  # the Keras 3 classes
        add_optimizer(contenders, entry, functools.partial(optimizer, wrap=looped), suffix)
    oracles = {"tf": functools.partial(fused, wrap=looped)}
    progress(f"many small variables, {k} steps per call")
    rows = check_and_time(contenders, oracles, 1, cfg["small_steps"], cfg["repeats"], progress)
    for row in rows.values():
        for key in ("median_ms", "min_ms", "max_ms"):
            row[key] /= k
    return rows


def _keras_adam(module):
    return module.optimizers.Adam(LR, BETA1, BETA2, EPS)


# The optimizer classes of the many-small scenario, all in TF's Adam form ("tf").
MANY_SMALL_OPTIMIZERS = (
    Optimizer("fusedopt.keras.LazyAdam (group op)", "tf", libraries.fusedopt_keras,
              lambda fk: fk.LazyAdam(LR, BETA1, BETA2, EPS)),
    Optimizer("tf.keras Adam", "tf", libraries.tensorflow, lambda tf: _keras_adam(tf.keras)),
    Optimizer("fusedopt.keras.legacy.LazyAdam (group op)", "tf", libraries.fusedopt_legacy,
              lambda legacy: legacy.LazyAdam(LR, BETA1, BETA2, EPS)),
    Optimizer("tf_keras legacy Adam", "tf", libraries.tf_keras,
              lambda tf_keras: tf_keras.optimizers.legacy.Adam(LR, BETA1, BETA2, EPS)),
)
