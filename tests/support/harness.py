"""Test harness shared by test_ops.py and test_reference.py.

A ``Runner`` holds a variable and its slots in one of several MODES and applies an
update function step by step; ``check_steps`` drives several steps and compares every
step (var and every slot) with the NumPy float64 reference, starting each step from
the state the implementation under test actually produced.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import numpy_reference as npref

SUPPORT_DIR = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(SUPPORT_DIR)
REPO_ROOT = os.path.dirname(TESTS_DIR)
# tests/<concern>: each a folder of test files
TEST_DIRS = sorted(os.path.join(TESTS_DIR, d) for d in os.listdir(TESTS_DIR)
                   if d not in ("support", "gpu", "__pycache__")
                   and os.path.isdir(os.path.join(TESTS_DIR, d)))

RULES = npref.RULES
DTYPES = ["half", "bfloat16", "float", "double"]
TF_DTYPES = {"half": tf.float16, "bfloat16": tf.bfloat16, "float": tf.float32,
             "double": tf.float64}
INDEX_DTYPES = {"int32": np.int32, "int64": np.int64}

# Option combinations worth testing per rule (defaults first): from each rule's oracle.
OPTION_SETS = {rule: oracle.OPTION_SETS for rule, oracle in npref.ORACLES.items()}
RULE_OPTIONS = [(r, o) for r in sorted(RULES) for o in OPTION_SETS[r]]


def param_ids(val):
    """pytest ids for option dicts and dtypes."""
    if isinstance(val, dict):
        return "-".join("%s=%s" % kv for kv in sorted(val.items())) or "defaults"
    if isinstance(val, type):
        return val.__name__
    return None

# eager/function/jit: resource variables; graph_resource/graph_ref: tf.compat.v1 graph
# + Session with resource / ref variables.
MODES = ["graph_ref", "eager", "function", "graph_resource"]

# Per-rule hyper-parameters (powers such as beta1_power are filled in per step): from each
# rule's oracle; epsilons are large enough to matter at half precision.
BASE_HYPER = {rule: oracle.BASE_HYPER for rule, oracle in npref.ORACLES.items()}


np_dtype = npref.np_dtype


def hyper_for(rule, dtype, step):
    """Hyper-parameters for 1-based `step`, rounded to `dtype` (Python floats)."""
    h = dict(BASE_HYPER[rule])
    for power, base in npref.ORACLES[rule].POWERS.items():
        h[power] = h[base] ** step
    return npref.round_hyper(h, dtype)


def keras_spec_hyper(spec, opt, step, learning_rate):
    """The op's hyper-parameters for `step` (1-based), as floats, read off the Keras
    optimizer `opt` through its rule's KERAS `spec` (fusedopt.rules._front)."""
    from fusedopt.rules._front import LearningRate, Power

    out = {}
    for name, source in spec.hyper.items():
        if isinstance(source, LearningRate):
            out[name] = learning_rate
        else:
            value = float(np.asarray(getattr(opt, source.name)))
            out[name] = value ** step if isinstance(source, Power) else value
    return out


def make_state(rule, shape, dtype, rng):
    """(var, [slots]) as arrays of `dtype`, slots drawn from their oracle's SLOT_RANGES."""
    dt = np_dtype(dtype)
    var = rng.uniform(-1, 1, shape).astype(dt)
    ranges = npref.ORACLES[rule].SLOT_RANGES
    slots = [rng.uniform(*ranges[name], npref.slot_shape(rule, name, shape)).astype(dt)
             for name in RULES[rule]["slots"]]
    return var, slots


def make_grad(shape, dtype, rng):
    g = rng.uniform(-1, 1, shape)
    g[np.abs(g) < 1e-3] = 0.5  # no (near-)zero gradients: keeps signs of zero out of it
    return g.astype(np_dtype(dtype))


def make_indices(n, rows, index_dtype, rng):
    """n indices in [0, rows) with duplicates (n > rows/2) and some untouched rows."""
    touched = rng.choice(rows, size=max(1, rows - 2), replace=False)
    return rng.choice(touched, size=n, replace=True).astype(index_dtype)


def presum(grad, indices):
    """Duplicates summed sequentially in the grad dtype, in order of appearance."""
    order, sums = [], {}
    for i, r in enumerate(indices.tolist()):
        if r in sums:
            sums[r] = (sums[r] + grad[i]).astype(grad.dtype)
        else:
            order.append(r)
            sums[r] = grad[i].copy()
    g = np.stack([sums[r] for r in order]) if order else grad[:0].copy()
    return g, np.array(order, dtype=indices.dtype)


class Runner:
    """Variables for one (var, slots) set in `mode`, updated by `update_fn`.

    update_fn(var, slots, grad, indices, hyper, mode) issues one update (indices is None
    for dense) and returns what should be fetched (e.g. the ref op's output) or None.
    Hyper-parameters are passed as Python floats in eager mode, tensors of the var
    dtype in the other modes.
    """

    def __init__(self, mode, dtype, var0, slots0, update_fn, sparse=False,
                 index_dtype=np.int32):
        self.mode, self.update_fn, self.sparse = mode, update_fn, sparse
        self.dtype = TF_DTYPES[dtype]
        self.index_dtype = index_dtype
        if mode in ("graph_ref", "graph_resource"):
            self.graph = tf.Graph()
            with self.graph.as_default():
                use_resource = mode == "graph_resource"
                self.vars = [tf.compat.v1.Variable(x, use_resource=use_resource)
                             for x in [var0] + list(slots0)]
                self.sess = tf.compat.v1.Session(graph=self.graph)
                self.sess.run(tf.compat.v1.global_variables_initializer())
            self._ops = {}
        else:
            self.vars = [tf.Variable(x) for x in [var0] + list(slots0)]
            if mode in ("function", "jit"):
                self._fn = tf.function(self._fcall, jit_compile=(mode == "jit"))

    def _call(self, grad, indices, hyper):
        return self.update_fn(self.vars[0], self.vars[1:], grad, indices, hyper, self.mode)

    def _fcall(self, grad, indices, hyper):
        out = self._call(grad, indices, hyper)
        return None if out is None or isinstance(out, tf.Operation) else out

    def _graph_op(self, hyper_names):
        key = tuple(sorted(hyper_names))
        if key not in self._ops:
            with self.graph.as_default():
                g = tf.compat.v1.placeholder(self.dtype, name="grad")
                i = (tf.compat.v1.placeholder(tf.as_dtype(self.index_dtype), name="indices")
                     if self.sparse else None)
                h = {k: tf.compat.v1.placeholder(self.dtype, shape=[], name=k) for k in key}
                out = self._call(g, i, h)
                if out is None:
                    out = tf.no_op()
                self._ops[key] = (out, g, i, h)
        return self._ops[key]

    def step(self, grad, indices, hyper):
        """Applies one update; returns the fetched output (np array) or None."""
        dt = np_dtype(self.dtype)
        if self.mode in ("graph_ref", "graph_resource"):
            out, g, i, h = self._graph_op(hyper)
            feed = {g: grad}
            if i is not None:
                feed[i] = indices
            feed.update({h[k]: np.asarray(v, dt) for k, v in hyper.items()})
            return self.sess.run(out, feed)
        if self.mode == "eager":
            res = self._call(tf.constant(grad),
                             None if indices is None else tf.constant(indices), hyper)
        else:
            res = self._fn(tf.constant(grad),
                           None if indices is None else tf.constant(indices),
                           {k: tf.constant(v, self.dtype) for k, v in hyper.items()})
        if res is None or isinstance(res, (tf.Operation, tf.Variable)):
            return None
        return res.numpy()

    def state(self):
        """(var, [slots]) as NumPy arrays of the var dtype."""
        if self.mode in ("graph_ref", "graph_resource"):
            vals = self.sess.run(self.vars)
        else:
            vals = [v.numpy() for v in self.vars]
        return vals[0], vals[1:]

    def close(self):
        if hasattr(self, "sess"):
            self.sess.close()


def check_steps(mode, rule, dtype, update_fn, sparse=False, index_dtype=np.int32,
                options=None, shape=(7, 3), steps=3, seed=0, n_indices=None,
                check_output=False):
    """Runs `steps` updates in `mode` and checks each against the NumPy reference.

    Checks var and every slot (per-dtype tolerance), that untouched rows are bit-for-bit
    unchanged (sparse), and, if check_output, that the fetched output equals the new var.
    Returns the Runner's final state.
    """
    rng = np.random.default_rng(seed)
    var0, slots0 = make_state(rule, shape, dtype, rng)
    runner = Runner(mode, dtype, var0, slots0, update_fn, sparse, index_dtype)
    try:
        var_b, slots_b = runner.state()
        assert var_b.tobytes() == var0.tobytes()
        for t in range(1, steps + 1):
            hyper = hyper_for(rule, dtype, t)
            if sparse:
                n = n_indices if n_indices is not None else shape[0] + 2
                indices = make_indices(n, shape[0], index_dtype, rng)
                grad = make_grad((n,) + tuple(shape[1:]), dtype, rng)
                exp_var, exp_slots = npref.sparse_update(rule, var_b, slots_b, grad, indices,
                                                         hyper, options)
            else:
                indices = None
                grad = make_grad(shape, dtype, rng)
                exp_var, exp_slots = npref.dense_update(rule, var_b, slots_b, grad, hyper,
                                                        options)
            out = runner.step(grad, indices, hyper)
            var_a, slots_a = runner.state()
            where = "%s %s %s step %d" % (mode, rule, dtype, t)
            assert var_a.dtype == var0.dtype and var_a.shape == var0.shape
            npref.assert_close(var_a, exp_var, dtype, "var, " + where)
            for name, got, exp in zip(RULES[rule]["slots"], slots_a, exp_slots):
                npref.assert_close(got, exp, dtype, "%s, %s" % (name, where))
            if sparse:
                untouched = np.setdiff1d(np.arange(shape[0]), indices)
                assert untouched.size > 0
                for name, before, after in zip(["var"] + RULES[rule]["slots"],
                                               [var_b] + slots_b, [var_a] + slots_a):
                    assert before[untouched].tobytes() == after[untouched].tobytes(), (
                        "untouched rows of %s changed, %s" % (name, where))
            if check_output:
                assert out is not None, "ref op returned nothing, " + where
                assert out.dtype == var_a.dtype and out.tobytes() == var_a.tobytes(), (
                    "ref op output != updated var, " + where)
            var_b, slots_b = var_a, slots_a
        return var_b, slots_b
    finally:
        runner.close()


# tf.estimator ships with TF <= 2.15 only (tensorflow-estimator); CI runs the suite on
# TF 2.15 too, where tests marked with this run.
requires_estimator = pytest.mark.skipif(
    getattr(tf.compat.v1, "estimator", None) is None,
    reason="tf.compat.v1.estimator is absent in TensorFlow %s (removed in 2.16; "
           "needs TF <= 2.15 + tensorflow-estimator)" % tf.__version__)


def check_savedmodel_of_a_packed_step(tmp_path, weights, make_optimizer, build):
    """A tf.Module's training step (``make_optimizer()``'s apply_gradients over
    ``weights()``, fresh variables each call; ``build(opt, variables)`` makes the slots)
    runs on a member pack, is saved as a SavedModel, loads, and trains on exactly as a
    twin that was never saved."""

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            self.weights = weights()
            self.opt = make_optimizer()
            build(self.opt, self.weights)

        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
        def train(self, scale):
            grads = [scale * tf.ones_like(w) for w in self.weights]
            self.opt.apply_gradients(zip(grads, self.weights))
            return self.weights[0].read_value()

    trainer, twin = Trainer(), Trainer()
    trainer.train(tf.constant(1.0))
    twin.train(tf.constant(1.0))
    graph = trainer.train.get_concrete_function().graph
    assert any(op.type.startswith("FusedOpt>ResourcePackedGroupApply")
               for op in graph.get_operations())
    tf.saved_model.save(trainer, str(tmp_path / "trainer"))
    loaded = tf.saved_model.load(str(tmp_path / "trainer"))
    np.testing.assert_array_equal(loaded.train(tf.constant(0.5)).numpy(),
                                  twin.train(tf.constant(0.5)).numpy())
    for got, want in zip(loaded.weights, twin.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def run_test_file_in_subprocess(path, env):
    """Runs pytest on `path` in a fresh interpreter with `env` (for settings that must be
    in place before TensorFlow is imported) and asserts everything there passed."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         os.path.abspath(path)],
        cwd=REPO_ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    tail = proc.stdout[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail and "failed" not in tail, tail


def run_python_in_subprocess(code, env_extra=None, timeout=300):
    """Runs `code` in a fresh interpreter that imports this fusedopt and these test helpers,
    for scenarios that could kill the process (an abort or a signal must fail one test, not
    end the run). Returns the CompletedProcess, stdout and stderr merged into .stdout."""
    import fusedopt

    # the helpers, and every folder of tests (a scenario may import a test module)
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(fusedopt.__file__))),
             SUPPORT_DIR] + TEST_DIRS
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def describe_exit(proc):
    """'exit status N' or 'killed by SIGXXX', for assertion messages."""
    if proc.returncode < 0:
        import signal

        return "killed by %s" % signal.Signals(-proc.returncode).name
    return "exit status %d" % proc.returncode


# --- dtypes the fused ops do not take (issue 29, item 4) --------------------------------

FALLBACK_DTYPES = ["complex64", "complex128", "int32"]


def _fallback_var(dtype):
    if dtype.startswith("complex"):
        return np.array([[1 + 2j, 3 - 1j], [0.5, -2j], [1, 1j]], dtype)
    return np.array([[1, 3], [2, -1], [0, 4]], dtype)


def _fallback_grad(dtype, sparse):
    values = (np.array([[0.5 + 0.1j, -0.2j], [0.3, 1 - 1j], [-1j, 0.25]], dtype)
              if dtype.startswith("complex") else np.array([[1, -2], [3, 1], [2, 2]], dtype))
    if sparse:  # rows 2, 0, 2: a duplicate
        return tf.IndexedSlices(tf.constant(values), tf.constant([2, 0, 2]),
                                tf.constant([3, 2]))
    return tf.constant(values)


def run_fallback(make_optimizer, dtype, sparse, make_variable=tf.Variable):
    """Three steps on a `dtype` variable: (var, optimizer variables), or the exception type."""
    var = make_variable(_fallback_var(dtype))
    opt = make_optimizer()
    try:
        for _ in range(3):
            opt.apply_gradients([(_fallback_grad(dtype, sparse), var)])
    except Exception as error:  # pylint: disable=broad-except
        return type(error)
    variables = opt.variables() if callable(opt.variables) else opt.variables  # Keras 2: a method
    return [np.asarray(var.numpy())] + [np.asarray(v.numpy()) for v in variables]


def check_fallback_is_the_replaced_class(ours, theirs, dtype, sparse, equal, must_train):
    """Ours behaves as theirs: both raise the same error type, or give the same numbers."""
    if isinstance(theirs, type):
        assert ours is theirs, (ours, theirs)
        assert not must_train, theirs
        return
    assert not isinstance(ours, type), ours
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        equal(a, b)
    if must_train:
        assert not np.array_equal(ours[0], _fallback_var(dtype))
