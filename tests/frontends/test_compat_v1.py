"""fusedopt.compat.v1 optimizers (tf.compat.v1.train.Optimizer subclasses).

Numbers: dense LazyAdam against tf.compat.v1.train.AdamOptimizer and Adagrad (dense and
sparse) against tf.compat.v1.train.AdagradOptimizer, side by side on the same initial
values; sparse LazyAdam and Adamax against the NumPy float64 reference, step by step from
the state the optimizer actually produced. Variables: ref (graph), resource (graph and
eager). Plus the inherited Optimizer API, the cases TF's adam_test.py / adagrad_test.py
cover, and Saver checkpoints exchanged with TF's optimizers both ways.
"""

import os
import re

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import harness
import numpy_reference as npref
from fusedopt import ops, rules
from fusedopt.compat import v1 as fv1
from fusedopt.rules._front import ArgOr, NonSlot

MODES = ("graph_ref", "graph_resource", "eager")
DTYPES = {"half": tf.float16, "float": tf.float32, "double": tf.float64}

# Every rule's COMPAT_V1 spec, and the tables the tests read from it: our class, TF's
# class it reproduces (where TF has one), TF's slot names, the non-slot powers, the op
# name suffix, and constructor arguments large enough to matter at half precision.
# Settings that run a rule of their own (RMSPropOptimizer(centered=True)) are tested as
# that rule: its spec, the class that takes the setting (VARIANT_OF) and the setting in its
# oracle's COMPAT_V1_KWARGS.
_CLASS_SPECS = dict(rules.front_end_specs("COMPAT_V1"))
VARIANT_OF = {variant: rule for rule, spec in _CLASS_SPECS.items()
              for _, variant in spec.variants}
SPECS = {**_CLASS_SPECS, **{rule: rules.module(rule).COMPAT_V1 for rule in VARIANT_OF}}
ALL_RULES = tuple(SPECS)
OURS = {rule: getattr(fv1, SPECS[VARIANT_OF.get(rule, rule)].name) for rule in SPECS}
TFS = {rule: getattr(tf.compat.v1.train, spec.anchor) for rule, spec in SPECS.items()
       if spec.anchor}
SLOTS = {rule: tuple(name for name, _ in spec.slots) for rule, spec in SPECS.items()}
POWERS = {rule: tuple(name for name, _ in spec.powers) for rule, spec in SPECS.items()}
OP_SUFFIX = {rule: ops.RULES[rule]["op_name"] for rule in SPECS}
HYPER = {rule: npref.ORACLES[rule].COMPAT_V1_KWARGS for rule in SPECS}


def arguments(rule, **kwargs):
    """Every constructor argument of the rule's class, defaults filled in."""
    bound = OURS[rule].__signature__.bind(**kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


SHAPE = (6, 3)
STEPS = 3


np_dtype = npref.np_dtype


def is_resource(variable):
    return isinstance(variable, tf.Variable) and variable.dtype != tf.resource and hasattr(
        variable, "handle") and variable.handle.dtype == tf.resource


def make_problem(dtype, sparse, index_dtype=np.int32, seed=0, n_vars=2):
    """(initial values, grads per step): sparse grads are (values, indices) with repeats."""
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    var0s = [rng.uniform(-1, 1, SHAPE).astype(dt) for _ in range(n_vars)]
    steps = []
    for _ in range(STEPS):
        grads = []
        for _ in range(n_vars):
            if sparse:
                # rows 0 and 5 never touched; row 1 repeated; the order is not sorted
                idx = rng.permutation([1, 3, 1, 2, 4, 1, 3]).astype(index_dtype)
                vals = rng.uniform(-1, 1, (len(idx),) + SHAPE[1:]).astype(dt)
                grads.append((vals, idx))
            else:
                grads.append(rng.uniform(-1, 1, SHAPE).astype(dt))
        steps.append(grads)
    return var0s, steps


class Trainer:
    """Variables + one optimizer in `mode`; applies the given grads step by step."""

    def __init__(self, mode, make_opt, var0s, names=None):
        self.mode = mode
        names = names or ["var%d" % i for i in range(len(var0s))]
        if mode == "eager":
            self.vars = [tf.Variable(v, name=n) for v, n in zip(var0s, names)]
            self.opt = make_opt()
            return
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.vars = [tf.compat.v1.Variable(v, name=n, use_resource=(mode == "graph_resource"))
                         for v, n in zip(var0s, names)]
            self.opt = make_opt()
            self.sess = tf.compat.v1.Session(graph=self.graph)
        self._train = {}

    def _graph_train(self, grads):
        sparse = isinstance(grads[0], tuple)
        key = (sparse, None if not sparse else grads[0][1].dtype)
        if key not in self._train:
            with self.graph.as_default():
                feeds, tf_grads = [], []
                for g, v in zip(grads, self.vars):
                    if sparse:
                        vals = tf.compat.v1.placeholder(v.dtype.base_dtype)
                        idx = tf.compat.v1.placeholder(tf.as_dtype(g[1].dtype))
                        feeds.append((vals, idx))
                        tf_grads.append(tf.IndexedSlices(vals, idx, tf.shape(v)))
                    else:
                        ph = tf.compat.v1.placeholder(v.dtype.base_dtype)
                        feeds.append(ph)
                        tf_grads.append(ph)
                op = self.opt.apply_gradients(list(zip(tf_grads, self.vars)))
                self.sess.run(tf.compat.v1.global_variables_initializer())
            self._train[key] = (op, feeds)
        return self._train[key]

    def step(self, grads):
        if self.mode == "eager":
            tf_grads = [tf.IndexedSlices(tf.constant(g[0]), tf.constant(g[1]), tf.shape(v))
                        if isinstance(g, tuple) else tf.constant(g)
                        for g, v in zip(grads, self.vars)]
            self.opt.apply_gradients(list(zip(tf_grads, self.vars)))
            return
        op, feeds = self._graph_train(grads)
        feed = {}
        for ph, g in zip(feeds, grads):
            if isinstance(g, tuple):
                feed[ph[0]], feed[ph[1]] = g
            else:
                feed[ph] = g
        self.sess.run(op, feed)

    def state(self, rule):
        """{'var0': ..., 'var0/m': ..., 'beta1_power': ...} as NumPy arrays."""
        named = {}
        for i, v in enumerate(self.vars):
            named["var%d" % i] = v
            for s in SLOTS[rule]:
                named["var%d/%s" % (i, s)] = self.opt.get_slot(v, s)
        if POWERS[rule]:
            if self.mode == "eager":
                powers = self.opt._get_beta_accumulators()
            else:
                with self.graph.as_default():
                    powers = self.opt._get_beta_accumulators()
            named.update(zip(POWERS[rule], powers if isinstance(powers, tuple) else [powers]))
        if self.mode == "eager":
            return {k: v.numpy() for k, v in named.items()}
        return self.sess.run(named)

    def op_types(self):
        return {op.type for op in self.graph.get_operations()}

    def close(self):
        if hasattr(self, "sess"):
            self.sess.close()


def run(mode, make_opt, var0s, steps, rule):
    """(states after each step, op types in the graph or None in eager)."""
    t = Trainer(mode, make_opt, var0s)
    try:
        states = []
        for grads in steps:
            t.step(grads)
            states.append(t.state(rule))
        types = t.op_types() if mode != "eager" else None
        return states, types
    finally:
        t.close()


def tf_kernel_tolerance(dtype):
    """Against TF's own optimizers (the NumPy oracle's is npref.tolerance): TF's kernels
    compute half in half (per-op rounding), ours in float32 rounding once, so half gets a
    few-ulp allowance; float/double differ by operation order."""
    return {"half": dict(rtol=4e-3, atol=2e-3), "float": dict(rtol=2e-6, atol=1e-6),
            "double": dict(rtol=1e-13, atol=1e-14)}[dtype]


def assert_states_close(test, ours, theirs, dtype, rule):
    test.assertEqual(len(ours), len(theirs))
    for t, (a, b) in enumerate(zip(ours, theirs)):
        test.assertEqual(sorted(a), sorted(b))
        for key in a:
            np.testing.assert_allclose(a[key].astype(np.float64), b[key].astype(np.float64),
                                       err_msg="%s %s %s step %d" % (rule, dtype, key, t + 1),
                                       **tf_kernel_tolerance(dtype))


def expected_ops(rule, mode, sparse):
    if mode == "graph_resource" and not sparse:  # a step's dense updates: one group op
        return {"FusedOpt>ResourceGroupApply" + OP_SUFFIX[rule]}
    return {"FusedOpt>%s%sApply%s" % ("Resource" if mode == "graph_resource" else "",
                                       "Sparse" if sparse else "", OP_SUFFIX[rule])}


def check_op_types(test, types, rule, mode, sparse):
    if types is None:
        return
    fused = {t for t in types if t.startswith("FusedOpt>")}
    test.assertEqual(fused, expected_ops(rule, mode, sparse))
    # No TF training op, no Python-level dedup (unique + segment sum) and no densifying.
    test.assertFalse({t for t in types if "Apply" in t and not t.startswith("FusedOpt>")})
    if sparse:
        test.assertFalse(types & {"Unique", "UnsortedSegmentSum", "ScatterNd",
                                  "SparseToDense"}, types)


class NumbersTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.product(mode=MODES, dtype=sorted(DTYPES))
    def test_dense_lazy_adam_equals_tf_adam(self, mode, dtype):
        var0s, steps = make_problem(dtype, sparse=False)
        h = HYPER["lazy_adam"]
        ours, types = run(mode, lambda: fv1.LazyAdamOptimizer(**h), var0s, steps, "lazy_adam")
        theirs, _ = run(mode, lambda: tf.compat.v1.train.AdamOptimizer(**h), var0s, steps,
                        "lazy_adam")
        check_op_types(self, types, "lazy_adam", mode, sparse=False)
        assert_states_close(self, ours, theirs, dtype, "lazy_adam")
        self.assertNotAllClose(ours[-1]["var0"], var0s[0])  # it did train

    def test_dense_lazy_adam_same_graph_as_tf_adam(self):
        """Both optimizers in one graph and one session.run, default hyper-parameters."""
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            init = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
            grad = tf.constant([[0.1, -0.2], [0.3, 0.01]])
            a, b = tf.Variable(init, name="a"), tf.Variable(init, name="b")
            ours = fv1.LazyAdamOptimizer(0.01, name="Ours").apply_gradients([(grad, a)])
            theirs = tf.compat.v1.train.AdamOptimizer(0.01).apply_gradients([(grad, b)])
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(5):
                sess.run([ours, theirs])
                va, vb = sess.run([a, b])
                self.assertAllClose(va, vb, rtol=1e-6, atol=1e-7)
            self.assertNotAllClose(va, init)

    @parameterized.product(mode=MODES, dtype=sorted(DTYPES), sparse=(False, True))
    def test_adagrad_equals_tf_adagrad(self, mode, dtype, sparse):
        index_dtype = np.int64 if mode == "graph_resource" else np.int32
        var0s, steps = make_problem(dtype, sparse=sparse, index_dtype=index_dtype)
        h = HYPER["adagrad"]
        ours, types = run(mode, lambda: fv1.AdagradOptimizer(**h), var0s, steps, "adagrad")
        theirs, _ = run(mode, lambda: tf.compat.v1.train.AdagradOptimizer(**h), var0s, steps,
                        "adagrad")
        check_op_types(self, types, "adagrad", mode, sparse)
        assert_states_close(self, ours, theirs, dtype, "adagrad")
        self.assertNotAllClose(ours[-1]["var0"], var0s[0])

    @parameterized.product(centered=(False, True), mode=MODES, dtype=sorted(DTYPES),
                           sparse=(False, True))
    def test_rms_prop_equals_tf_rms_prop(self, centered, mode, dtype, sparse):
        """Every setting of tf.compat.v1.train.RMSPropOptimizer, centered included (its own
        rule: a third slot, mg)."""
        rule = "centered_rms_prop" if centered else "rms_prop"
        index_dtype = np.int64 if mode == "graph_resource" else np.int32
        var0s, steps = make_problem(dtype, sparse=sparse, index_dtype=index_dtype)
        h = dict(HYPER["rms_prop"], centered=centered)
        ours, types = run(mode, lambda: fv1.RMSPropOptimizer(**h), var0s, steps, rule)
        theirs, _ = run(mode, lambda: tf.compat.v1.train.RMSPropOptimizer(**h), var0s, steps,
                        rule)
        check_op_types(self, types, rule, mode, sparse)
        assert_states_close(self, ours, theirs, dtype, rule)
        self.assertNotAllClose(ours[-1]["var0"], var0s[0])

    def _check_against_numpy(self, rule, mode, dtype, sparse, index_dtype=np.int32, opt_kwargs=None,
                             options=None):
        var0s, steps = make_problem(dtype, sparse=sparse, index_dtype=index_dtype)
        kwargs = dict(HYPER[rule], **(opt_kwargs or {}))
        states, types = run(mode, lambda: OURS[rule](**kwargs), var0s, steps, rule)
        check_op_types(self, types, rule, mode, sparse)
        spec, args = SPECS[rule], arguments(rule, **kwargs)
        options = dict(spec.options, **(options or {}))
        dt = np_dtype(dtype)
        prev = {}
        for i, v in enumerate(var0s):
            prev["var%d" % i] = v
            for (slot, initial), name in zip(spec.slots, npref.RULES[rule]["slots"]):
                value = args[initial] if isinstance(initial, str) else (initial or 0)
                prev["var%d/%s" % (i, slot)] = np.full(npref.slot_shape(rule, name, SHAPE),
                                                       value, dt)
        for power, base in spec.powers:
            prev[power] = np.float32(args[base])
        for t, (grads, got) in enumerate(zip(steps, states), start=1):
            hyper = {}
            for name, source in spec.hyper.items():
                if isinstance(source, NonSlot):
                    hyper[name] = float(prev[source.name])  # the float32 variable, as read
                elif isinstance(source, ArgOr):
                    value = args[source.name]
                    hyper[name] = source.default if value is None else value
                else:
                    hyper[name] = args[source]
            for power, base in spec.powers:  # the powers follow base**t (float32 products)
                self.assertAllClose(got[power], args[base] ** (t + 1), rtol=1e-6)
            # Python floats become float32 tensors (as in TF's optimizers), then the op
            # casts them to the var dtype
            hyper = npref.round_hyper(npref.round_hyper(hyper, np.float32), dt)
            for i, g in enumerate(grads):
                slots = [prev["var%d/%s" % (i, s)] for s in SLOTS[rule]]
                if sparse:
                    exp_var, exp_slots = npref.sparse_update(rule, prev["var%d" % i], slots,
                                                             g[0], g[1], hyper, options)
                    untouched = np.setdiff1d(np.arange(SHAPE[0]), g[1])
                    self.assertAllEqual(untouched, [0, 5])
                    for key in ["var%d" % i] + ["var%d/%s" % (i, s) for s in SLOTS[rule]]:
                        self.assertEqual(got[key][untouched].tobytes(),
                                         prev[key][untouched].tobytes(), key)
                else:
                    exp_var, exp_slots = npref.dense_update(rule, prev["var%d" % i], slots, g,
                                                            hyper, options)
                where = "%s %s %s step %d" % (rule, mode, dtype, t)
                npref.assert_close(got["var%d" % i], exp_var, dt, "var%d %s" % (i, where))
                for s, e in zip(SLOTS[rule], exp_slots):
                    npref.assert_close(got["var%d/%s" % (i, s)], e, dt,
                                       "var%d/%s %s" % (i, s, where))
            prev = got
        self.assertNotAllClose(states[-1]["var0"], var0s[0])

    @parameterized.product(rule=ALL_RULES, mode=MODES, dtype=sorted(DTYPES),
                           sparse=(False, True))
    def test_every_rule_against_numpy(self, rule, mode, dtype, sparse):
        """Every rule of the registry, step by step against its NumPy oracle."""
        self._check_against_numpy(rule, mode, dtype, sparse,
                                  np.int64 if mode == "eager" else np.int32)

    @parameterized.product(mode=MODES, dtype=sorted(DTYPES), index_dtype=("int32", "int64"))
    def test_sparse_lazy_adam_is_lazy(self, mode, dtype, index_dtype):
        self._check_against_numpy("lazy_adam", mode, dtype, True, getattr(np, index_dtype))

    @parameterized.product(mode=MODES, dtype=sorted(DTYPES), sparse=(False, True))
    def test_adamax(self, mode, dtype, sparse):
        self._check_against_numpy("adamax", mode, dtype, sparse,
                                  np.int64 if mode == "eager" else np.int32)

    @parameterized.product(mode=("graph_ref", "eager"), sparse=(False, True))
    def test_adagrad_v2_epsilon(self, mode, sparse):
        self._check_against_numpy("adagrad", mode, "float", sparse, opt_kwargs={"epsilon": 0.1})

    def test_adagrad_epsilon_changes_the_update(self):
        var0s, steps = make_problem("double", sparse=False)
        a, _ = run("eager", lambda: fv1.AdagradOptimizer(0.2), var0s, steps, "adagrad")
        b, _ = run("eager", lambda: fv1.AdagradOptimizer(0.2, epsilon=0.5), var0s, steps,
                   "adagrad")
        self.assertNotAllClose(a[0]["var0"], b[0]["var0"])

    @parameterized.parameters(*MODES)
    def test_repeated_indices_equal_their_sum(self, mode):
        """A gradient naming row 1 twice == one naming it once with the summed values."""
        for rule in ("lazy_adam", "adamax", "adagrad"):
            var0 = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float64)
            rep = [(np.array([[0.1, 0.2], [0.3, -0.1], [0.5, 0.5]]), np.array([1, 2, 1]))]
            agg = [(np.array([[0.6, 0.7], [0.3, -0.1]]), np.array([1, 2]))]
            make = lambda: OURS[rule](**HYPER[rule])  # noqa: E731
            a, _ = run(mode, make, [var0], [rep, rep], rule)
            b, _ = run(mode, make, [var0], [agg, agg], rule)
            for key in a[-1]:
                self.assertAllClose(a[-1][key], b[-1][key], rtol=1e-14, atol=1e-15, msg=key)
            self.assertAllEqual(a[-1]["var0"][0], var0[0])
            self.assertNotAllClose(a[-1]["var0"][1], var0[1])


class KnownValuesTest(tf.test.TestCase, parameterized.TestCase):
    """Literal expectations from TF's adagrad_test.py / adam_test.py (independent of both
    TF's kernels and our NumPy reference)."""

    @parameterized.product(use_resource=(False, True), dtype=sorted(DTYPES))
    def test_adagrad_sparse_basic(self, use_resource, dtype):
        dt = DTYPES[dtype]
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var0 = tf.compat.v1.Variable([[1.0], [2.0]], dtype=dt, use_resource=use_resource)
            var1 = tf.compat.v1.Variable([[3.0], [4.0]], dtype=dt, use_resource=use_resource)
            grads0 = tf.IndexedSlices(tf.constant([0.1], shape=[1, 1], dtype=dt),
                                      tf.constant([0]), tf.constant([2, 1]))
            grads1 = tf.IndexedSlices(tf.constant([0.01], shape=[1, 1], dtype=dt),
                                      tf.constant([1]), tf.constant([2, 1]))
            update = fv1.AdagradOptimizer(3.0, initial_accumulator_value=0.1).apply_gradients(
                zip([grads0, grads1], [var0, var1]))
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(update)
            self.assertAllCloseAccordingToType([[-1.6026098728179932], [2.0]], sess.run(var0))
            self.assertAllCloseAccordingToType([[3.0], [3.715679168701172]], sess.run(var1))

    @parameterized.parameters(*sorted(DTYPES))
    def test_adagrad_sparse_stability(self, dtype):
        dt = DTYPES[dtype]
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            shape = [1, 6]
            var0 = tf.compat.v1.Variable(
                [[0.00872496, -0.106952, 0.110467, 0.226505, -0.0147257, -0.0105945]],
                dtype=dt, use_resource=False)
            grads0 = tf.IndexedSlices(
                tf.constant([[-5.91278e-05, 5.31673e-05, -2.5779e-06, 4.29153e-05,
                              -8.4877e-05, -9.48906e-05]], shape=shape, dtype=dt),
                tf.constant([0]), tf.constant(shape))
            opt = fv1.AdagradOptimizer(1.0, initial_accumulator_value=0.1)
            update = opt.apply_gradients(zip([grads0], [var0]))
            self.assertEqual(["accumulator"], opt.get_slot_names())
            slot0 = opt.get_slot(var0, "accumulator")
            init = tf.compat.v1.global_variables_initializer()
            for _ in range(5):
                sess.run(init)
                sess.run(update)
                self.assertAllCloseAccordingToType(np.full([1, 6], 0.1), sess.run(slot0))
                self.assertAllCloseAccordingToType(
                    [[0.00891194, -0.10712013, 0.11047515, 0.22636929, -0.0144573,
                      -0.01029443]], sess.run(var0))

    @parameterized.product(use_resource=(False, True), dtype=sorted(DTYPES))
    def test_adagrad_sharing(self, use_resource, dtype):
        dt = DTYPES[dtype]
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var0 = tf.compat.v1.Variable([1.0, 2.0], dtype=dt, use_resource=use_resource)
            var1 = tf.compat.v1.Variable([3.0, 4.0], dtype=dt, use_resource=use_resource)
            grads = [tf.constant([0.1, 0.1], dtype=dt), tf.constant([0.01, 0.01], dtype=dt)]
            opt = fv1.AdagradOptimizer(3.0)
            up1 = opt.apply_gradients(zip(grads, [var0, var1]))
            up2 = opt.apply_gradients(zip(grads, [var0, var1]))
            self.assertEqual(opt.get_slot(var0, "accumulator").get_shape(), var0.get_shape())
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(up1)
            sess.run(up2)
            sess.run(up1)
            self.assertAllCloseAccordingToType([-1.6026098728179932, -0.6026098728179932],
                                               sess.run(var0))
            self.assertAllCloseAccordingToType([2.715679168701172, 3.715679168701172],
                                               sess.run(var1))

    def test_adagrad_dynamic_shape_variable(self):
        """A variable of unknown static shape: accumulator initialized at run time."""
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var0 = tf.compat.v1.get_variable("var0", initializer=tf.constant([1.0, 2.0]),
                                             validate_shape=False, use_resource=False)
            self.assertFalse(var0.shape.is_fully_defined())
            opt = fv1.AdagradOptimizer(lambda: 3.0, initial_accumulator_value=0.1,
                                       use_locking=True)
            update = opt.apply_gradients([(tf.constant([0.1, 0.1]), var0)])
            # var0 first: the accumulator's initial value reads var0's shape, and TF's guard
            # for that (a cond on is_variable_initialized) races with var0's own initializer
            # when both run in one global_variables_initializer: TF's own AdagradOptimizer
            # fails this way in about 1 of 60 runs on TF 2.19.
            sess.run(var0.initializer)
            sess.run(tf.compat.v1.variables_initializer(
                [v for v in tf.compat.v1.global_variables() if v is not var0]))
            for _ in range(3):
                sess.run(update)
            self.assertAllClose([-1.6026098728179932, -0.6026098728179932], sess.run(var0))
            self.assertAllClose([0.13, 0.13], sess.run(opt.get_slot(var0, "accumulator")))

    @parameterized.product(mode=MODES, dtype=sorted(DTYPES), callable_params=(False, True))
    def test_adam_basic(self, mode, dtype, callable_params):
        """adam_test.doTestBasic: default hyper-parameters, adam_update_numpy expectations."""
        dt = DTYPES[dtype]
        lr = (lambda: 0.001) if callable_params else 0.001
        var0_np = np.array([1.0, 2.0], dt.as_numpy_dtype)
        var1_np = np.array([3.0, 4.0], dt.as_numpy_dtype)
        g = [np.array([0.1, 0.1], dt.as_numpy_dtype), np.array([0.01, 0.01], dt.as_numpy_dtype)]
        t = Trainer(mode, lambda: fv1.LazyAdamOptimizer(learning_rate=lr), [var0_np, var1_np])
        try:
            m = [0.0, 0.0]
            v = [0.0, 0.0]
            expect = [var0_np.astype(np.float64), var1_np.astype(np.float64)]
            for step in range(1, 4):
                t.step(g)
                state = t.state("lazy_adam")
                self.assertAllCloseAccordingToType(0.9 ** (step + 1), state["beta1_power"])
                self.assertAllCloseAccordingToType(0.999 ** (step + 1), state["beta2_power"])
                for i in range(2):
                    alpha = 0.001 * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
                    m[i] = 0.9 * m[i] + 0.1 * g[i]
                    v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i]
                    expect[i] = expect[i] - alpha * m[i] / (np.sqrt(v[i]) + 1e-8)
                    self.assertAllCloseAccordingToType(expect[i], state["var%d" % i])
            powers = t.opt._get_beta_accumulators() if mode == "eager" else None
            if mode != "eager":
                with t.graph.as_default():
                    powers = t.opt._get_beta_accumulators()
                    opt_vars = t.opt.variables()
                with tf.Graph().as_default():
                    self.assertEqual(0, len(t.opt.variables()))  # none from other graphs
            else:
                opt_vars = t.opt.variables()
            for p in powers:
                self.assertTrue(any(p is x for x in opt_vars))
                # non-slot variables have the kind of the variables they serve
                self.assertEqual(mode != "graph_ref", is_resource(p))
            self.assertEqual(t.opt.get_slot(t.vars[0], "m").name, "var0/Adam:0")
            self.assertEqual(t.opt.get_slot(t.vars[0], "v").name, "var0/Adam_1:0")
        finally:
            t.close()


class HyperParameterTest(tf.test.TestCase, parameterized.TestCase):

    def _final(self, mode, make_opt, rule="lazy_adam"):
        var0s, steps = make_problem("float", sparse=False)
        states, _ = run(mode, make_opt, var0s, steps, rule)
        return states[-1]

    @parameterized.parameters("graph_ref", "graph_resource", "eager")
    def test_callable_hyper_parameters(self, mode):
        for rule in ("lazy_adam", "adamax", "adagrad"):
            h = HYPER[rule]
            callables = {k: (lambda x=x: x) for k, x in h.items()
                         if k != "initial_accumulator_value"}
            kw = dict(h, **callables)
            plain = self._final(mode, lambda: OURS[rule](**h), rule)
            with_callables = self._final(mode, lambda: OURS[rule](**kw), rule)
            for key in plain:
                self.assertAllEqual(plain[key], with_callables[key], msg=key)

    def test_callable_learning_rate_is_called_every_step(self):
        """Eager: the callable is evaluated at each apply_gradients (TF's _call_if_callable)."""
        rates = iter([0.1, 0.0, 0.0])
        var = tf.Variable([1.0, 2.0])
        opt = fv1.AdagradOptimizer(lambda: next(rates))
        opt.apply_gradients([(tf.constant([0.5, 0.5]), var)])
        after_first = var.numpy()
        # accumulator 0.1 + 0.5**2 = 0.35
        self.assertAllClose(after_first, np.array([1.0, 2.0]) - 0.1 * 0.5 / np.sqrt(0.35))
        opt.apply_gradients([(tf.constant([0.5, 0.5]), var)])
        self.assertAllEqual(var.numpy(), after_first)  # lr 0 now

    @parameterized.parameters("graph_ref", "graph_resource")
    def test_tensor_learning_rate(self, mode):
        for rule in ("lazy_adam", "adamax", "adagrad"):
            h = HYPER[rule]
            plain = self._final(mode, lambda: OURS[rule](**h), rule)

            def make_opt():  # called inside the Trainer's graph
                tensors = {k: tf.constant(x) for k, x in h.items()
                           if k != "initial_accumulator_value"}
                return OURS[rule](**dict(h, **tensors))

            with_tensors = self._final(mode, make_opt, rule)
            for key in plain:
                self.assertAllEqual(plain[key], with_tensors[key], msg=key)

    def test_learning_rate_placeholder(self):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var = tf.compat.v1.Variable([1.0, 2.0], use_resource=False)
            lr = tf.compat.v1.placeholder(tf.float32, [])
            train = fv1.LazyAdamOptimizer(lr).minimize(tf.reduce_sum(var * var))
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {lr: 0.0})
            self.assertAllEqual(sess.run(var), [1.0, 2.0])
            sess.run(train, {lr: 0.5})
            self.assertNotAllClose(sess.run(var), [1.0, 2.0])

    def test_adagrad_initial_accumulator_validation(self):
        for bad in (0.0, -0.1):
            with self.assertRaisesRegex(ValueError, "initial_accumulator_value must be positive"):
                fv1.AdagradOptimizer(0.1, initial_accumulator_value=bad)
        var = tf.Variable(tf.zeros([2, 2], tf.float64))
        opt = fv1.AdagradOptimizer(0.1, initial_accumulator_value=0.25)
        opt.apply_gradients([(tf.zeros([2, 2], tf.float64), var)])
        self.assertAllEqual(opt.get_slot(var, "accumulator").numpy(), np.full([2, 2], 0.25))


class ApiTest(tf.test.TestCase, parameterized.TestCase):

    def test_signatures_and_names(self):
        self.assertEqual(fv1.LazyAdamOptimizer().get_name(), "Adam")
        self.assertEqual(fv1.AdamaxOptimizer().get_name(), "AdaMax")  # contrib's
        self.assertEqual(fv1.AdagradOptimizer(0.1).get_name(), "Adagrad")
        for cls in (fv1.LazyAdamOptimizer, fv1.AdamaxOptimizer, fv1.AdagradOptimizer):
            self.assertTrue(issubclass(cls, tf.compat.v1.train.Optimizer))
            self.assertTrue(cls.__doc__ and "fused" in cls.__doc__)
            self.assertEqual((cls.GATE_NONE, cls.GATE_OP, cls.GATE_GRAPH), (0, 1, 2))
        import inspect
        sig = inspect.signature(fv1.LazyAdamOptimizer)
        self.assertEqual([(p.name, p.default) for p in sig.parameters.values()],
                         [("learning_rate", 0.001), ("beta1", 0.9), ("beta2", 0.999),
                          ("epsilon", 1e-08), ("use_locking", False), ("name", "Adam"),
                          # fusedopt's own, keyword only: compact slots
                          ("slot_dtype", None), ("stochastic_rounding", False)])
        sig = inspect.signature(fv1.AdamaxOptimizer)
        self.assertEqual([(p.name, p.default) for p in sig.parameters.values()],
                         [("learning_rate", 0.001), ("beta1", 0.9), ("beta2", 0.999),
                          ("epsilon", 1e-08), ("use_locking", False), ("name", "AdaMax"),
                          # fusedopt's own, keyword only: compact slots
                          ("slot_dtype", None), ("stochastic_rounding", False)])
        sig = inspect.signature(fv1.AdagradOptimizer)
        self.assertEqual([p.name for p in sig.parameters.values()][:4],
                         ["learning_rate", "initial_accumulator_value", "use_locking", "name"])

    @parameterized.parameters(("lazy_adam", False), ("adamax", True), ("adagrad", False))
    def test_inherited_api_graph(self, rule, use_resource):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            w = tf.compat.v1.get_variable("w", initializer=np.ones([3, 2], np.float32),
                                          use_resource=use_resource)
            emb = tf.compat.v1.get_variable("emb", initializer=np.ones([5, 2], np.float32),
                                            use_resource=use_resource)
            frozen = tf.compat.v1.get_variable("frozen", initializer=[1.0],
                                               use_resource=use_resource)
            x = tf.constant([[1.0, 2.0, 3.0]])
            loss = (tf.reduce_sum(tf.matmul(x, w) ** 2)
                    + tf.reduce_sum(tf.gather(emb, [1, 3, 1])) + tf.reduce_sum(frozen))
            gs = tf.compat.v1.train.get_or_create_global_step()
            opt = OURS[rule](**HYPER[rule])
            gv = opt.compute_gradients(loss, var_list=[w, emb],
                                       gate_gradients=opt.GATE_GRAPH)
            self.assertEqual([v for _, v in gv], [w, emb])
            self.assertIsInstance(gv[0][0], tf.Tensor)
            self.assertIsInstance(gv[1][0], tf.IndexedSlices)
            train = opt.apply_gradients(gv, global_step=gs)
            self.assertEqual(sorted(opt.get_slot_names()), sorted(SLOTS[rule]))
            for s in SLOTS[rule]:
                self.assertIsNotNone(opt.get_slot(w, s))
                self.assertIsNotNone(opt.get_slot(emb, s))
                self.assertIsNone(opt.get_slot(frozen, s))
            self.assertIsNone(opt.get_slot(w, "nope"))
            suffixes = {"m": "", "v": "_1", "accumulator": ""}
            names = sorted(v.op.name for v in opt.variables())
            expected = sorted(["w/%s%s" % (opt.get_name(), suffixes[s]) for s in SLOTS[rule]]
                              + ["emb/%s%s" % (opt.get_name(), suffixes[s])
                                 for s in SLOTS[rule]] + list(POWERS[rule]))
            self.assertEqual(names, expected)
            sess.run(tf.compat.v1.global_variables_initializer())
            before = sess.run(loss)
            for _ in range(3):
                sess.run(train)
            self.assertEqual(sess.run(gs), 3)
            self.assertLess(sess.run(loss), before)
            self.assertAllEqual(sess.run(frozen), [1.0])
            self.assertAllEqual(sess.run(emb)[[0, 2, 4]], np.ones([3, 2]))  # lazy rows
            # minimize with every gating mode, sharing the optimizer
            for gate in (opt.GATE_NONE, opt.GATE_OP, opt.GATE_GRAPH):
                sess.run(opt.minimize(loss, global_step=gs, gate_gradients=gate,
                                      var_list=[w]))
            self.assertEqual(sess.run(gs), 6)
            self.assertEqual(len(opt.variables()), len(expected))  # no new slots/non-slots

    @parameterized.parameters(*ALL_RULES)
    def test_minimize_eager(self, rule):
        w = tf.Variable(np.ones([3, 2], np.float32))
        emb = tf.Variable(np.ones([5, 2], np.float32))
        opt = OURS[rule](**HYPER[rule])

        def loss():
            return tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(emb, [1, 3, 1]))

        before = loss().numpy()
        for _ in range(3):
            opt.minimize(loss)
        self.assertLess(loss().numpy(), before)
        self.assertAllEqual(emb.numpy()[[0, 2, 4]], np.ones([3, 2]))

    @parameterized.parameters(*ALL_RULES)
    def test_tf_function_and_xla_equal_eager(self, rule):
        """Eager, tf.function and tf.function(jit_compile=True): the fused ops run in all
        three (under XLA through their XLA kernels), with the same numbers."""
        results = []
        for wrap in (lambda f: f, tf.function, lambda f: tf.function(f, jit_compile=True)):
            w = tf.Variable([1.0, -2.0])
            emb = tf.Variable(np.ones([4, 2], np.float32))
            opt = OURS[rule](**HYPER[rule])

            def loss():
                return tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(emb, [2, 0, 2]) ** 2)

            def train():
                opt.minimize(loss)

            step = wrap(train)
            for _ in range(3):
                step()
            # In natural name order: variables() sorts by name, and the names' counters grow
            # across the loop (Adam_8 .. Adam_11 would sort as 10, 11, 8, 9).
            slots = sorted(opt.variables(), key=lambda v: [int(t) if t.isdigit() else t
                                                           for t in re.split(r"(\d+)", v.name)])
            results.append([w.numpy(), emb.numpy()] + [v.numpy() for v in slots])
        from fusedopt import ops
        for k, other in enumerate(results[1:]):
            self.assertEqual(len(results[0]), len(other))
            for a, b in zip(results[0], other):
                if k == 1 and ops.xla_cpu_lowering() == "hlo":  # XLA contracts multiply-adds
                    self.assertAllClose(a, b, rtol=5e-7, atol=0)
                else:
                    self.assertAllEqual(a, b)
            self.assertAllEqual(other[1][[1, 3]], np.ones([2, 2]))

    def test_use_locking_reaches_the_ops(self):
        with tf.Graph().as_default() as g:
            var = tf.compat.v1.Variable([1.0, 2.0], use_resource=False)
            for cls in (fv1.LazyAdamOptimizer, fv1.AdamaxOptimizer):
                cls(use_locking=True).minimize(tf.reduce_sum(var * var))
            fv1.AdagradOptimizer(0.1, use_locking=True).minimize(tf.reduce_sum(var * var))
            fused = [op for op in g.get_operations() if op.type.startswith("FusedOpt>")]
            self.assertLen(fused, 3)
            self.assertTrue(all(op.get_attr("use_locking") for op in fused))

    @parameterized.parameters(("lazy_adam", 6), ("adamax", 5), ("adagrad", 2))
    def test_slots_unique_eager(self, rule, count):
        v1 = tf.Variable(1.0)
        v2 = tf.Variable(1.0)
        opt = OURS[rule](1.0)
        opt.minimize(lambda: v1 + v2)
        # the non-slot variables once, one slot of each kind per variable
        self.assertLen({id(v) for v in opt.variables()}, count)
        opt.minimize(lambda: v1 + v2)
        self.assertLen({id(v) for v in opt.variables()}, count)

    @parameterized.product(mode=("graph_ref", "graph_resource"), dtype=sorted(DTYPES))
    def test_sharing_one_optimizer(self, mode, dtype):
        """One optimizer, two apply_gradients ops run alternately (adam_test.testSharing)."""
        for rule in ("lazy_adam", "adagrad"):
            var0s, steps = make_problem(dtype, sparse=False)
            results = []
            for cls in (OURS[rule], TFS[rule]):
                t = Trainer(mode, lambda: cls(**HYPER[rule]), var0s)
                with t.graph.as_default():
                    grads = [tf.constant(g) for g in steps[0]]
                    ups = [t.opt.apply_gradients(list(zip(grads, t.vars))) for _ in range(2)]
                    t.sess.run(tf.compat.v1.global_variables_initializer())
                    for i in range(4):
                        t.sess.run(ups[i % 2])
                    results.append(t.state(rule))
                    self.assertEqual(len(t.opt.variables()),
                                     len(POWERS[rule]) + 2 * len(SLOTS[rule]))
                t.close()
            if rule == "lazy_adam":
                self.assertAllClose(results[0]["beta1_power"], 0.9 ** 5)
            assert_states_close(self, results[:1], results[1:], dtype, rule)

    def test_two_sessions_one_graph(self):
        """Each session has its own variable values; the ops are shared."""
        with tf.Graph().as_default():
            var = tf.compat.v1.Variable([1.0, 2.0], use_resource=False)
            opt = fv1.LazyAdamOptimizer(0.1)
            train = opt.apply_gradients([(tf.constant([0.1, 0.1]), var)])
            init = tf.compat.v1.global_variables_initializer()
            with tf.compat.v1.Session() as s1, tf.compat.v1.Session() as s2:
                s1.run(init)
                s2.run(init)
                s1.run(train)
                s1.run(train)
                s2.run(train)
                one_step = s2.run(var)
                self.assertAllClose(one_step, [0.9, 1.9], rtol=1e-6)  # Adam: first step = lr
                self.assertAllClose(s1.run(opt._get_beta_accumulators()[0]), 0.9 ** 3)
                self.assertAllClose(s2.run(opt._get_beta_accumulators()[0]), 0.9 ** 2)

    def test_one_optimizer_in_eager_and_two_graphs(self):
        """State is keyed by graph (adam_test.testTwoSessions)."""
        opt = fv1.LazyAdamOptimizer()
        var = tf.Variable([1.0, 2.0])
        opt.apply_gradients([(tf.constant([0.1, 0.1]), var)])
        for dtype in (tf.float32, tf.float64):
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                gvar = tf.compat.v1.Variable(tf.constant([1.0, 2.0], dtype), name="v0")
                train = opt.apply_gradients([(tf.constant([0.1, 0.1], dtype), gvar)])
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train)
                self.assertAllClose(sess.run(gvar), [0.999, 1.999], rtol=1e-6)
                self.assertAllClose(sess.run(opt._get_beta_accumulators()[0]), 0.81)


class ContribAdaMaxTest(tf.test.TestCase):
    """Issue 29, item 3: what contrib's adamax_test reads off AdaMaxOptimizer."""

    def test_default_name_and_slot_names_are_contribs(self):
        with tf.Graph().as_default():
            var = tf.compat.v1.Variable([1.0, 2.0], name="var0")
            opt = fv1.AdamaxOptimizer()
            opt.apply_gradients([(tf.constant([0.1, 0.1]), var)])
            self.assertEqual(opt.get_name(), "AdaMax")
            self.assertEqual(opt.get_slot(var, "m").name, "var0/AdaMax:0")
            self.assertEqual(opt.get_slot(var, "v").name, "var0/AdaMax_1:0")

    def test_beta_accumulators_is_the_variable(self):
        var = tf.Variable([1.0, 2.0])
        opt = fv1.AdamaxOptimizer(0.1)
        for t in range(1, 4):
            opt.apply_gradients([(tf.constant([0.1, -0.2]), var)])
            beta1_power = opt._get_beta_accumulators()
            self.assertIsInstance(beta1_power, tf.Variable)
            self.assertAllCloseAccordingToType(0.9 ** (t + 1), beta1_power.numpy())
        # Adam's (LazyAdam's) stays AdamOptimizer's pair.
        adam = fv1.LazyAdamOptimizer()
        adam.apply_gradients([(tf.constant([0.1, -0.2]), var)])
        beta1_power, beta2_power = adam._get_beta_accumulators()
        self.assertAllClose([beta1_power.numpy(), beta2_power.numpy()], [0.81, 0.999 ** 2])


class CheckpointTest(tf.test.TestCase, parameterized.TestCase):

    def _train_and_save(self, make_opt, use_resource, path, steps, restore_from=None):
        """Builds the model, optionally restores, trains `steps`, saves; returns the values."""
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            w = tf.compat.v1.get_variable("w", initializer=np.full([3, 2], 0.5, np.float32),
                                          use_resource=use_resource)
            emb = tf.compat.v1.get_variable(
                "emb", initializer=np.arange(10, dtype=np.float32).reshape(5, 2) / 10,
                use_resource=use_resource)
            x = tf.constant([[1.0, -2.0, 3.0]])
            loss = tf.reduce_sum(tf.matmul(x, w) ** 2) + tf.reduce_sum(tf.gather(emb, [1, 3]) ** 2)
            gs = tf.compat.v1.train.get_or_create_global_step()
            train = make_opt().minimize(loss, global_step=gs)
            saver = tf.compat.v1.train.Saver()
            if restore_from:
                saver.restore(sess, restore_from)
            else:
                sess.run(tf.compat.v1.global_variables_initializer())
            restored = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
            for _ in range(steps):
                sess.run(train)
            saver.save(sess, path)
            final = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
            return restored, final

    @parameterized.product(rule=("lazy_adam", "adagrad"), use_resource=(False, True))
    def test_saver_both_ways(self, rule, use_resource):
        tmp = self.get_temp_dir()
        h = HYPER[rule]
        # dense-only update for the continuation check: TF's Adam is not lazy on sparse rows
        for first, second in ((TFS[rule], OURS[rule]), (OURS[rule], TFS[rule])):
            tag = "%s_%s_%d_%s" % (rule, first.__module__.split(".")[0], use_resource,
                                   self.id().split(".")[-1])
            p1 = os.path.join(tmp, tag + "_a")
            _, saved = self._train_and_save(lambda: first(**h), use_resource, p1, 2)
            keys_first = dict(tf.train.list_variables(p1))
            restored, cont = self._train_and_save(lambda: second(**h), use_resource,
                                                  os.path.join(tmp, tag + "_b"), 1,
                                                  restore_from=p1)
            keys_second = dict(tf.train.list_variables(os.path.join(tmp, tag + "_b")))
            self.assertEqual(keys_first, keys_second)  # same names and shapes
            self.assertEqual(sorted(restored), sorted(saved))
            for k in saved:
                self.assertAllEqual(restored[k], saved[k], msg=k)
            # one more step with the first optimizer from the same checkpoint: same result
            _, ref = self._train_and_save(lambda: first(**h), use_resource,
                                          os.path.join(tmp, tag + "_c"), 1, restore_from=p1)
            for k in ref:
                if rule == "lazy_adam" and k.startswith("emb") and first is not second:
                    # sparse rows: TF's Adam decays untouched rows of m/v too; compare
                    # the touched rows only
                    self.assertAllClose(cont[k][[1, 3]], ref[k][[1, 3]], rtol=2e-6, msg=k)
                else:
                    self.assertAllClose(cont[k], ref[k], rtol=2e-6, atol=1e-7, msg=k)
            self.assertEqual(cont["global_step"], 3)

    def test_object_checkpoint_eager(self):
        """tf.train.Checkpoint dependencies (slot and non-slot names) match TF's Adam."""
        tmp = self.get_temp_dir()
        var = tf.Variable([1.0, 2.0])
        tf_opt = tf.compat.v1.train.AdamOptimizer(0.1)
        for _ in range(2):
            tf_opt.apply_gradients([(tf.constant([0.1, -0.3]), var)])
        path = tf.train.Checkpoint(var=var, opt=tf_opt).save(os.path.join(tmp, "obj"))
        var2 = tf.Variable([0.0, 0.0])
        ours = fv1.LazyAdamOptimizer(0.1)
        status = tf.train.Checkpoint(var=var2, opt=ours).restore(path)
        ours.apply_gradients([(tf.constant([0.1, -0.3]), var2)])  # slots restore on creation
        status.assert_consumed()
        tf_opt.apply_gradients([(tf.constant([0.1, -0.3]), var)])
        self.assertAllClose(var2.numpy(), var.numpy(), rtol=1e-6)
        self.assertAllClose(ours.get_slot(var2, "m").numpy(), tf_opt.get_slot(var, "m").numpy())
        self.assertAllClose(ours._get_beta_accumulators()[0].numpy(), 0.9 ** 4)


if __name__ == "__main__":
    tf.test.main()


@parameterized.parameters("ref", "resource")
class DemoTest(tf.test.TestCase, parameterized.TestCase):
    """`python -m fusedopt.demo --tf1 ref|resource`: the TF1-style graph-mode demo."""

    def test_demo_tf1(self, variables):
        from fusedopt import demo

        # Small sizes (seconds): --quick is sized to show the speed-up, not timed here.
        results = demo.main(["--tf1", variables, "--rows", "10000", "--batch", "256",
                             "--steps", "30"])
        (ours, first, final, _), (base, base_first, base_final, _) = results
        self.assertEqual((ours, base), ("fusedopt v1 LazyAdam", "tf.compat.v1 Adam"))
        self.assertEqual(first, base_first)  # same initial values and data
        self.assertLess(final, first - 0.005)
        self.assertLess(abs(final - base_final), 0.02)


# --- dtypes the fused ops do not take: the rule in composed TF ops (issue 29, item 4) ---

# The TF class each reproduces on its dense path (contrib's LazyAdam is Adam's dense update;
# contrib's AdaMax has no complex kernel, as ApplyAdaMax has none).
_ANCHORS = {"LazyAdamOptimizer": "AdamOptimizer", "AdagradOptimizer": "AdagradOptimizer",
            "RMSPropOptimizer": "RMSPropOptimizer", "AdamaxOptimizer": None}


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class ComplexDtypeTest(tf.test.TestCase, parameterized.TestCase):
    """complex variables train as under TF's optimizers (which take them); integers are
    refused as TF's are."""

    def _pair(self, name, dtype, sparse):
        make = {"ours": lambda: getattr(fv1, name)(0.1)}
        if _ANCHORS[name] is not None:
            make["tf"] = lambda: getattr(tf.compat.v1.train, _ANCHORS[name])(0.1)
        return {k: harness.run_fallback(f, dtype, sparse) for k, f in make.items()}

    @parameterized.product(name=sorted(_ANCHORS), dtype=["complex64", "complex128"],
                           sparse=[False, True])
    def test_complex_trains_as_tf_does(self, name, dtype, sparse):
        got = self._pair(name, dtype, sparse)
        if name == "AdamaxOptimizer":  # neither ApplyAdaMax nor tf.maximum takes complex
            self.assertIs(got["ours"], tf.errors.InvalidArgumentError)
            return
        if name == "LazyAdamOptimizer" and sparse:
            # lazy: row 1 (untouched) keeps its moments, unlike TF's Adam; the real case
            # of the same numbers is the fused float64 op's
            self._check_lazy_adam_sparse_against_float64(dtype)
            return
        # variable and slots; TF's Adam lists its beta powers last, ours first
        ours, theirs = got["ours"], got["tf"]
        self.assertNotIsInstance(ours, type)
        _close(ours[0], theirs[0])
        self.assertFalse(np.array_equal(ours[0], harness._fallback_var(dtype)))

    def _check_lazy_adam_sparse_against_float64(self, dtype):
        values = np.array([[0.5, -0.2], [0.3, 1.0], [-1.0, 0.25]])
        start = np.array([[1.0, 3.0], [0.5, -2.0], [1.0, 1.0]])
        out = []
        for dt in (dtype, "float64"):
            var = tf.Variable(start.astype(dt))
            opt = fv1.LazyAdamOptimizer(0.1)
            for _ in range(3):
                opt.apply_gradients([(tf.IndexedSlices(tf.constant(values.astype(dt)),
                                                       tf.constant([2, 0, 2]),
                                                       tf.constant([3, 2])), var)])
            out.append(var.numpy())
        np.testing.assert_array_equal(out[0].imag, 0)
        _close(out[0].real, out[1])
        np.testing.assert_array_equal(out[1][1], start[1])  # row 1 untouched

    def test_complex_ref_variables_in_a_graph(self):
        """The ref-variable path (Session graphs): TF's AdagradOptimizer's numbers."""
        results = []
        for make in (lambda: fv1.AdagradOptimizer(0.1),
                     lambda: tf.compat.v1.train.AdagradOptimizer(0.1)):
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                var = tf.compat.v1.get_variable(
                    "w", initializer=harness._fallback_var("complex64"), use_resource=False)
                opt = make()
                train = [opt.apply_gradients([(harness._fallback_grad("complex64", s), var)])
                         for s in (False, True)]
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(2):
                    for op in train:  # one at a time: their order is part of the numbers
                        sess.run(op)
                results.append(sess.run(var))
        _close(results[0], results[1])

    def test_integer_variables_are_refused_as_tf_refuses_them(self):
        for name in ("AdagradOptimizer", "RMSPropOptimizer", "LazyAdamOptimizer"):
            got = self._pair(name, "int32", sparse=False)
            self.assertIsInstance(got["ours"], type)
            self.assertTrue(issubclass(got["ours"], Exception))
            self.assertIsInstance(got["tf"], type)
