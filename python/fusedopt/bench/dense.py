"""Dense steps: one large variable per rule, and many small variables (LazyAdam)."""
import functools
import gc

import numpy as np

from fusedopt.bench import libraries
from fusedopt.bench.contenders import RULES, add_optimizer
from fusedopt.bench.timing import check_and_time, cycling, quiet_function


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
        slots = [tf.Variable(tf.fill([self.init.size], self.rule.slot_init))
                 for _ in self.rule.slots]
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
    keras = functools.partial(rule.keras.make, steps.tf)
    contenders = {"fusedopt (raw op)": (steps.fused, "tf"),
                  "TF fused kernel": (steps.tf_kernel, "tf"),
                  "tf.keras (composed)": (functools.partial(steps.optimizer, keras), "keras")}
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


MANY_SMALL_RULE = "lazy_adam"  # the rule of the "many small variables" scenario


def scenario_many_small(tf, cfg, progress):
    """One step over many small variables: the cost of one op per variable."""
    from fusedopt import ops

    rule = RULES[MANY_SMALL_RULE]
    count, size = cfg["small_vars"], cfg["small_size"]
    rng = np.random.default_rng(3)
    inits = [rng.normal(0, 0.05, size).astype(np.float32) for _ in range(count)]
    grads = [tf.constant(rng.normal(0, 1, size).astype(np.float32)) for _ in range(count)]
    hyper = rule.hyper(1)  # every step repeats the first step's update: one check step
    fused_op = getattr(ops, f"resource_apply_{MANY_SMALL_RULE}")
    tf_kernel = getattr(tf.raw_ops, rule.tf_dense_kernel)

    def one_op_per_variable(apply):
        variables = [tf.Variable(x) for x in inits]
        slots = [[tf.Variable(tf.fill([size], rule.slot_init)) for _ in rule.slots]
                 for _ in variables]

        @tf.function
        def step():
            for var, var_slots, g in zip(variables, slots, grads):
                apply(var, var_slots, g)
        return step, variables[0]

    def fused():
        return one_op_per_variable(lambda var, slots, g: fused_op(var, *slots, grad=g, **hyper))

    def tf_fused():
        return one_op_per_variable(lambda var, slots, g: tf_kernel(
            **rule.tf_kernel_variables(var, slots), grad=g, **hyper))

    def keras():
        variables = [tf.Variable(x) for x in inits]
        opt = rule.keras.make(tf)
        return quiet_function(tf, lambda: opt.apply_gradients(zip(grads, variables))), variables[0]

    progress(f"many small variables: {count} x {size}")
    return check_and_time({"fusedopt (raw op)": (fused, "tf"), "TF fused kernel": (tf_fused, "tf"),
                           rule.keras.name: (keras, "tf")},
                          {"tf": fused}, 1, cfg["small_steps"], cfg["repeats"], progress)
