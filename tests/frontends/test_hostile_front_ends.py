"""A hostile round against the front ends: what it found, each case as a test.

- compat.v1: restoring a checkpoint before the first step (TF's deferred slot creation) with
  compact or per-row slots; Saver checkpoints of TF's optimizers into a class with
  stochastic rounding; a variable listed twice (updated twice, as TF does);
  ``learning_rate=None``.
- Keras 3 and Keras 2: a variable listed twice (accepted and updated twice, as Keras does).
- Every front end: boolean options given a truthy stand-in ("False"); ``slot_dtype`` on
  variables it cannot apply to says so.
- ``fusedopt.explain`` through a LossScaleOptimizer and on bad input; ``cast_slots`` given
  one key as a string; ``python -m fusedopt.info`` lists every op.
"""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import fusedopt
import fusedopt.keras as fk
from fusedopt import checkpoint
from fusedopt.compat import v1 as fv1

KERAS3 = hasattr(tf.keras.optimizers.Optimizer, "stateless_apply")
G = np.linspace(-1, 1, 12).reshape(4, 3).astype(np.float32)


# --- compat.v1: restore before the first step -------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: fv1.AdagradOptimizer(0.1, slot_dtype="bfloat16"),
    lambda: fv1.LazyAdamOptimizer(0.1, slot_dtype="float16"),
    lambda: fv1.RowWiseAdagradOptimizer(0.1),
    lambda: fv1.PartialRowWiseAdamOptimizer(0.1, slot_dtype="bfloat16"),
    lambda: fv1.RMSPropOptimizer(0.1, momentum=0.5, centered=True, slot_dtype="bfloat16"),
], ids=["adagrad_bf16", "lazy_adam_f16", "row_wise_adagrad", "partial_row_wise_adam_bf16",
        "centered_rms_prop_bf16"])
def test_compat_v1_restore_before_the_first_step_resumes_exactly(make, tmp_path):
    """tf.train.Checkpoint.restore() on a fresh optimizer, then train (TF creates the slots
    from the checkpoint, in the rule's shape and dtype): the same bits as never stopping."""
    grad = tf.constant(G)
    straight_var, straight = tf.Variable(tf.ones([4, 3])), make()
    for _ in range(3):
        straight.apply_gradients([(grad, straight_var)])
    var, opt = tf.Variable(tf.ones([4, 3])), make()
    opt.apply_gradients([(grad, var)])
    path = tf.train.Checkpoint(v=var, o=opt).save(str(tmp_path / "ckpt"))
    resumed_var, resumed = tf.Variable(tf.zeros([4, 3])), make()
    tf.train.Checkpoint(v=resumed_var, o=resumed).restore(path)
    for _ in range(2):
        resumed.apply_gradients([(grad, resumed_var)])
    assert resumed_var.numpy().tobytes() == straight_var.numpy().tobytes()


# --- compat.v1: stochastic rounding and name-based checkpoints ---------------------------

def _saver_round_trip(tmp_path, writer, reader, global_step):
    path = str(tmp_path / "model")

    def build(make):
        var = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 3]), use_resource=True)
        step = tf.compat.v1.train.get_or_create_global_step() if global_step else None
        return var, make().minimize(tf.reduce_sum(var * var), global_step=step)

    with tf.Graph().as_default():
        _, train = build(writer)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            tf.compat.v1.train.Saver().save(sess, path)
    with tf.Graph().as_default():
        var, train = build(reader)
        names = {v.op.name for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, path)
            sess.run(train)
            return names, sess.run(var)


def test_saver_checkpoint_of_tf_adam_restores_into_stochastic_rounding_without_16_bit_slots(
        tmp_path):
    """float32 slots: stochastic rounding has nothing to round, so no step counter is made
    and TF's checkpoint restores (before: NotFoundError for rounding_step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fusedopt.IgnoredOptionWarning)
        names, _ = _saver_round_trip(
            tmp_path, lambda: tf.compat.v1.train.AdamOptimizer(0.1),
            lambda: fv1.LazyAdamOptimizer(0.1, stochastic_rounding=True), global_step=False)
    assert not [n for n in names if "rounding_step" in n]


def test_stochastic_rounding_seeded_by_the_global_step_makes_no_variable(tmp_path):
    """A run that counts its steps (global_step given to minimize/apply_gradients) seeds the
    rounding with it: turning stochastic rounding on for a run saved without it resumes."""
    names, resumed = _saver_round_trip(
        tmp_path, lambda: fv1.LazyAdamOptimizer(0.1, slot_dtype="bfloat16"),
        lambda: fv1.LazyAdamOptimizer(0.1, slot_dtype="bfloat16", stochastic_rounding=True),
        global_step=True)
    assert not [n for n in names if "rounding_step" in n]
    assert np.isfinite(resumed).all() and not np.allclose(resumed, 1.0)


def test_stochastic_rounding_without_a_global_step_counts_its_own_steps(tmp_path):
    names, _ = _saver_round_trip(
        tmp_path, lambda: fv1.LazyAdamOptimizer(0.1, slot_dtype="bfloat16",
                                                stochastic_rounding=True),
        lambda: fv1.LazyAdamOptimizer(0.1, slot_dtype="bfloat16", stochastic_rounding=True),
        global_step=False)
    assert [n for n in names if n.endswith("rounding_step")]


def test_global_step_seeds_each_step_differently():
    """Seeded by the global step: var never moves (lr 0), the accumulators grow by the exact
    sum on average (one seed for every step would leave most at 1.0)."""
    n, steps = 1024, 48
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = tf.compat.v1.Variable(np.linspace(-1, 1, n).astype(np.float32), use_resource=True)
        step = tf.compat.v1.train.get_or_create_global_step()
        opt = fv1.AdagradOptimizer(0.0, initial_accumulator_value=1.0, slot_dtype="bfloat16",
                                   stochastic_rounding=True)
        g = np.full(n, np.sqrt(1 / 640), np.float32)
        train = opt.apply_gradients([(tf.constant(g), var)], global_step=step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(steps):
            sess.run(train)
        acc = sess.run(opt.get_slot(var, "accumulator")).astype(np.float64)
        assert sess.run(step) == steps
    exact = steps * float(g[0] * g[0])
    assert abs((acc.mean() - 1.0) - exact) < 0.06 * exact


# --- a variable listed twice -------------------------------------------------------------

@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("ours,theirs", [
    (lambda: fv1.LazyAdamOptimizer(0.1), lambda: tf.compat.v1.train.AdamOptimizer(0.1)),
    (lambda: fv1.AdagradOptimizer(0.1), lambda: tf.compat.v1.train.AdagradOptimizer(0.1)),
], ids=["adam", "adagrad"])
def test_compat_v1_variable_listed_twice_is_updated_twice(ours, theirs, mode):
    """apply_gradients([(g, v), (g, v)]) with one gradient object (minimize(var_list=[v, v])
    does this): TF updates v twice; so do we (before: once, silently)."""
    def run(make):
        if mode == "eager":
            var = tf.Variable(np.ones(5, np.float32))
            grad = tf.constant(np.full(5, 0.5, np.float32))
            opt = make()
            for _ in range(2):
                opt.apply_gradients([(grad, var), (grad, var)])
            return var.numpy()
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var = tf.compat.v1.Variable(np.ones(5, np.float32), use_resource=True)
            grad = tf.constant(np.full(5, 0.5, np.float32))
            train = make().apply_gradients([(grad, var), (grad, var)])
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                sess.run(train)
            return sess.run(var)

    np.testing.assert_allclose(run(ours), run(theirs), rtol=1e-6)


def test_keras_variable_listed_twice_is_accepted_as_keras_accepts_it():
    def run(cls):
        var = tf.Variable(np.ones(4, np.float32))
        cls(learning_rate=0.1).apply_gradients(
            [(tf.constant([1.0, 2.0, 3.0, 4.0]), var), (tf.constant([0.5] * 4), var)])
        return var.numpy()

    # Keras 3 computes 1 - beta in double precision, the kernels in float32: ~1e-5 of a step.
    np.testing.assert_allclose(run(fk.LazyAdam), run(tf.keras.optimizers.Adam), rtol=1e-5)


def test_keras2_variable_listed_twice_is_accepted():
    from fusedopt.keras import legacy

    def run(cls):
        var = tf.Variable(np.ones(4, np.float32))
        cls(learning_rate=0.1).apply_gradients(
            [(tf.constant([1.0, 2.0, 3.0, 4.0]), var), (tf.constant([0.5] * 4), var)])
        return var.numpy()

    np.testing.assert_allclose(run(legacy.LazyAdam), run(legacy._legacy.Adam), rtol=1e-6)


# --- options: booleans, None, dtypes they cannot apply to -------------------------------

@pytest.mark.parametrize("make", [
    lambda v: fk.Adagrad(0.1, stochastic_rounding=v),
    lambda v: fk.Adagrad(0.1, lazy_weight_decay=v),
    lambda v: fv1.AdagradOptimizer(0.1, stochastic_rounding=v),
], ids=["keras_stochastic_rounding", "keras_lazy_weight_decay", "compat_v1"])
@pytest.mark.parametrize("value", ["False", "no", 1, 0, None])
def test_boolean_options_take_booleans_only(make, value):
    with pytest.raises(TypeError, match=r"must be True or False, got"):
        make(value)


def test_keras2_boolean_options_take_booleans_only():
    from fusedopt.keras import legacy
    with pytest.raises(TypeError, match=r"stochastic_rounding must be True or False"):
        legacy.Adagrad(0.1, stochastic_rounding="False")


def test_compat_v1_learning_rate_none_is_a_clear_error():
    with pytest.raises(ValueError, match=r"learning_rate must be a number, a tensor or a "
                                         r"callable returning one, got None"):
        fv1.LazyAdamOptimizer(learning_rate=None)


@pytest.mark.parametrize("make", [
    lambda: fk.Adagrad(0.1, slot_dtype="bfloat16"),
    lambda: fv1.AdagradOptimizer(0.1, slot_dtype="bfloat16"),
], ids=["keras", "compat_v1"])
def test_slot_dtype_on_a_float64_variable_says_it_has_no_effect(make):
    opt = make()
    var = tf.Variable(np.ones(4, np.float64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            opt.apply_gradients([(tf.constant(np.ones(4)), var)])
    (warning,) = [w for w in caught if issubclass(w.category, fusedopt.IgnoredOptionWarning)]
    assert "compact slots are for float32 variables" in str(warning.message)


# --- explain, cast_slots, info ------------------------------------------------------------

def test_explain_sees_through_a_loss_scale_optimizer_and_refuses_bad_input():
    var = tf.Variable(np.zeros((3, 2), np.float32))
    if KERAS3:
        wrapped = tf.keras.optimizers.LossScaleOptimizer(fk.LazyAdam())
    else:
        wrapped = tf.keras.mixed_precision.LossScaleOptimizer(fk.LazyAdam())
    explanation = fusedopt.explain(wrapped, var)  # one variable, not a list
    assert explanation.rule == "lazy_adam" and explanation.fused
    assert "inside LossScaleOptimizer" in explanation.optimizer
    assert len(explanation.variables) == 1
    for bad in (fk.LazyAdam, None, "LazyAdam"):
        with pytest.raises(TypeError, match=r"takes an optimizer"):
            fusedopt.explain(bad, [var])
    with pytest.raises(TypeError, match=r"takes variables"):
        fusedopt.explain(fk.LazyAdam(), [tf.constant(1.0)])


def test_explain_says_a_constrained_variable_is_updated_alone():
    var = tf.Variable(np.zeros((3, 2), np.float32), constraint=lambda x: x)
    route = fusedopt.explain(fv1.AdagradOptimizer(0.1), [var]).variables[0]
    assert route.dense.startswith("FusedOpt>ResourceApplyAdagrad (alone")


def test_cast_slots_refuses_one_key_given_as_a_string(tmp_path):
    with pytest.raises(TypeError, match=r"keys must be a list of checkpoint keys"):
        checkpoint.cast_slots(str(tmp_path / "a"), str(tmp_path / "b"), "float32",
                              keys="var/m")


def test_info_lists_every_op_and_the_pack_op():
    out = subprocess.run([sys.executable, "-m", "fusedopt.info"], capture_output=True,
                         text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                         timeout=300)
    assert out.returncode == 0, out.stderr
    for name in ("FusedOpt>ResourceGroupApplyLazyAdam",
                 "FusedOpt>ResourcePackedGroupApplyCenteredRMSProp", "FusedOpt>VariablePack"):
        assert name in out.stdout
    assert "xla_kernels" in out.stdout
