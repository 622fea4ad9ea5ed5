"""fusedopt.keras's ``lazy_weight_decay`` (issue 32, item 4): Keras's decoupled weight decay
(``var -= var * weight_decay * lr`` before the update) on the rows a sparse gradient touches
only, with the variable's own update; dense gradients decay as Keras decays them.

Checked against the Keras class replaced (dense: the same bits), against a NumPy model of
the decay followed by the NumPy oracle's lazy update (sparse), in eager, tf.function and
XLA-compiled steps, with Keras's ``exclude_from_weight_decay``, and through get_config.
"""
import inspect

import numpy as np
import pytest
import tensorflow as tf

import harness
import front_ends
import numpy_reference as npref

import fusedopt.keras as fk
from fusedopt import rules

keras = tf.keras
SPECS = front_ends.specs("KERAS")
CLASSES = front_ends.classes("KERAS", fk)
REPLACED = {rule: getattr(keras.optimizers, spec.base)
            for rule, spec in SPECS.items() if spec.base is not None}
WD, LR = 0.1, 0.05
ROWS, WIDTH = 10, 3


def _table(seed=0):
    return tf.Variable(np.random.default_rng(seed).uniform(-1, 1, (ROWS, WIDTH))
                       .astype(np.float32))


def _sparse_grad(rng, ids):
    return tf.IndexedSlices(tf.constant(rng.normal(size=(len(ids), WIDTH)).astype(np.float32)),
                            tf.constant(ids, tf.int64), tf.constant([ROWS, WIDTH], tf.int64))


def _make(rule, **kwargs):
    extra = npref.ORACLES[rule].KERAS_KWARGS
    return CLASSES[rule](**{**extra, "learning_rate": LR, "weight_decay": WD, **kwargs})


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("rule", sorted(CLASSES))
def test_sparse_decays_touched_rows_only(rule, mode):
    """Untouched rows keep their bits; touched rows (duplicates among them) are decayed
    once, then updated lazily: the NumPy model of both, step after step."""
    table = _table()
    opt = _make(rule, lazy_weight_decay=True)
    opt.build([table])
    slots = [opt._slot(getattr(opt, attr), table) for attr in SPECS[rule].slots]
    step = {"eager": lambda g: opt.apply_gradients([(g, table)]),
            "function": tf.function(lambda g: opt.apply_gradients([(g, table)])),
            "xla": tf.function(lambda g: opt.apply_gradients([(g, table)]),
                               jit_compile=True)}[mode]
    rng = np.random.default_rng(1)
    for t in range(1, 4):
        ids = [2, 7, 2, 5, 7, 2]  # rows 0, 1, 3, 4, 6, 8, 9 never touched
        grad = _sparse_grad(rng, ids)
        v0 = table.numpy().astype(np.float64)
        s0 = [np.asarray(s.numpy(), np.float64) for s in slots]
        step(grad)
        touched = sorted(set(ids))
        decayed = v0.copy()
        decayed[touched] -= decayed[touched] * WD * LR
        hyper = harness.keras_spec_hyper(SPECS[rule], opt, t, LR)
        want_v, want_s = npref.sparse_update(rule, decayed, s0, grad.values.numpy(),
                                             np.asarray(ids), hyper, SPECS[rule].options)
        untouched = [r for r in range(ROWS) if r not in touched]
        np.testing.assert_array_equal(table.numpy()[untouched], v0[untouched].astype(np.float32))
        npref.assert_close(table.numpy(), want_v, "float32", "%s var step %d" % (rule, t))
        for s, e in zip(slots, want_s):
            npref.assert_close(np.asarray(s.numpy()), e, "float32", "%s slot step %d" % (rule, t))


@pytest.mark.parametrize("rule", sorted(REPLACED))
def test_dense_gradients_decay_as_keras(rule):
    """Dense gradients: the replaced Keras class's numbers with weight decay, bit for bit
    or as close as our plain dense update is (the decay is Keras's own expression)."""
    kwargs = dict(npref.ORACLES[rule].KERAS_KWARGS, learning_rate=LR, weight_decay=WD)
    ours, theirs = CLASSES[rule](lazy_weight_decay=True, **kwargs), REPLACED[rule](**kwargs)
    plain = CLASSES[rule](**kwargs)
    v_ours, v_theirs, v_plain = _table(3), _table(3), _table(3)
    rng = np.random.default_rng(4)
    for _ in range(4):
        g = tf.constant(rng.normal(size=(ROWS, WIDTH)).astype(np.float32))
        ours.apply_gradients([(g, v_ours)])
        theirs.apply_gradients([(g, v_theirs)])
        plain.apply_gradients([(g, v_plain)])
    np.testing.assert_array_equal(v_ours.numpy(), v_plain.numpy())  # same as Keras's decay
    np.testing.assert_allclose(v_ours.numpy(), v_theirs.numpy(), rtol=2e-5, atol=2e-6)


def test_default_keeps_keras_behaviour_every_row_decays():
    """Without the keyword: Keras's decay, every row of the table every step."""
    table, other = _table(), _table()
    opt = _make("lazy_adam")
    lazy = _make("lazy_adam", lazy_weight_decay=True)
    grad = _sparse_grad(np.random.default_rng(5), [1])
    opt.apply_gradients([(grad, table)])
    lazy.apply_gradients([(grad, other)])
    init = _table().numpy()
    np.testing.assert_array_equal(table.numpy()[5], init[5] - init[5] * np.float32(WD * LR))
    np.testing.assert_array_equal(other.numpy()[5], init[5])


def test_excluded_variables_are_not_decayed():
    table = _table()
    opt = _make("adagrad", lazy_weight_decay=True)
    opt.exclude_from_weight_decay(var_list=[table])
    plain = _make("adagrad", weight_decay=None)
    same = _table()
    grad = _sparse_grad(np.random.default_rng(6), [0, 3])
    opt.apply_gradients([(grad, table)])
    plain.apply_gradients([(grad, same)])
    np.testing.assert_array_equal(table.numpy(), same.numpy())


@pytest.mark.parametrize("rule", ["lazy_adam", "row_wise_adagrad"])
def test_config_round_trip(rule):
    opt = _make(rule, lazy_weight_decay=True)
    config = opt.get_config()
    assert config["lazy_weight_decay"] is True
    again = CLASSES[rule].from_config(config)
    assert again.lazy_weight_decay is True
    assert "lazy_weight_decay" not in _make(rule).get_config()  # the replaced class's config
    parameter = inspect.signature(CLASSES[rule]).parameters["lazy_weight_decay"]
    assert parameter.kind == parameter.KEYWORD_ONLY and parameter.default is False
