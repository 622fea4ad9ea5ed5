"""The sparse ops' ``every_row=True``: a sparse gradient applied to every row (rows no index
names take the update of a zero gradient), as the dense op on the densified gradient would,
without that table-sized gradient (cc/core/engine.h's ApplySparseEveryRow). It is what
fusedopt.keras.Adam and fusedopt.compat.v1.AdamOptimizer run on the CPU.

Checked for every rule against the independent NumPy float64 oracle (the dense update of
the summed gradient) and bit for bit against the dense op given the densified gradient;
bad input is refused with every variable unchanged; the GPU and XLA kernels refuse it.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import numpy_reference as npref
from fusedopt import ops

RULES = list(ops.RULES)
DTYPES = ["float32", "float64", "half", "bfloat16"]


def _state(rule, shape, dtype, seed, slot_dtype=None):
    rng = np.random.default_rng(seed)
    var, slots = harness.make_state(rule, shape, dtype, rng)
    tf_dtype = tf.as_dtype(harness.np_dtype(dtype))
    return (tf.Variable(tf.constant(var, tf_dtype)),
            [tf.Variable(tf.cast(tf.constant(s), slot_dtype or tf_dtype)) for s in slots])


def _batch(shape, n, dtype, index_dtype, seed):
    rng = np.random.default_rng(seed + 100)
    ids = harness.make_indices(n, shape[0], index_dtype, rng)
    return ids, harness.make_grad((n,) + shape[1:], dtype, rng)


def _values(var, slots):
    return [var.numpy()] + [s.numpy() for s in slots]


def _sparse(rule, var, slots, hyper, grad, ids, **kw):
    return getattr(ops, f"resource_sparse_apply_{rule}")(var, *slots, **hyper, grad=grad,
                                                         indices=ids, every_row=True, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULES)
def test_every_row_is_the_dense_update_of_the_summed_gradient(rule, dtype):
    shape = (23, 6)
    var, slots = _state(rule, shape, dtype, 0)
    expected = _values(var, slots)
    for step in (1, 2, 3):
        ids, grad = _batch(shape, 30, dtype, np.int64, step)  # repeats, untouched rows
        hyper = harness.hyper_for(rule, dtype, step)
        dense = np.zeros(shape)
        np.add.at(dense, ids, grad.astype(np.float64))
        new_var, new_slots = npref.dense_update(rule, expected[0], expected[1:], dense, hyper)
        expected = [new_var] + list(new_slots)
        _sparse(rule, var, slots, hyper, tf.constant(grad), tf.constant(ids))
        for name, got, want in zip(["var", *ops.RULES[rule]["slots"]], _values(var, slots),
                                   expected):
            npref.assert_close(got, want, dtype, err_msg=f"{name} after step {step}")
            expected[0 if name == "var" else 1 + ops.RULES[rule]["slots"].index(name)] = got


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rule", RULES)
def test_every_row_is_bit_for_bit_the_dense_op_on_the_densified_gradient(rule, index_dtype):
    # 2,000 rows: several threads' blocks, each finding its first named row by bisection.
    shape = (2000, 16)
    a, a_slots = _state(rule, shape, "float32", 1)
    b, b_slots = _state(rule, shape, "float32", 1)
    for step in (1, 2):
        ids, grad = _batch(shape, 700, "float32", index_dtype, 10 + step)
        hyper = harness.hyper_for(rule, "float32", step)
        _sparse(rule, a, a_slots, hyper, tf.constant(grad), tf.constant(ids))
        dense = tf.math.unsorted_segment_sum(tf.constant(grad), tf.constant(ids), shape[0])
        getattr(ops, f"resource_apply_{rule}")(b, *b_slots, **hyper, grad=dense)
    for got, want in zip(_values(a, a_slots), _values(b, b_slots)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rule", RULES)
def test_compact_slots_with_stochastic_rounding_match_the_dense_op(rule):
    shape = (300, 8)
    a, a_slots = _state(rule, shape, "float32", 2, slot_dtype=tf.bfloat16)
    b, b_slots = _state(rule, shape, "float32", 2, slot_dtype=tf.bfloat16)
    ids, grad = _batch(shape, 200, "float32", np.int32, 3)
    hyper = harness.hyper_for(rule, "float32", 1)
    rounding = dict(stochastic_rounding=True, rounding_seed=7)
    _sparse(rule, a, a_slots, hyper, tf.constant(grad), tf.constant(ids), **rounding)
    dense = tf.math.unsorted_segment_sum(tf.constant(grad), tf.constant(ids), shape[0])
    getattr(ops, f"resource_apply_{rule}")(b, *b_slots, **hyper, grad=dense, **rounding)
    for got, want in zip(_values(a, a_slots), _values(b, b_slots)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rule", RULES)
def test_no_indices_still_update_every_row(rule):
    shape = (50, 4)
    a, a_slots = _state(rule, shape, "float32", 3)
    b, b_slots = _state(rule, shape, "float32", 3)
    hyper = harness.hyper_for(rule, "float32", 1)
    _sparse(rule, a, a_slots, hyper, tf.zeros([0, 4]), tf.zeros([0], tf.int32))
    getattr(ops, f"resource_apply_{rule}")(b, *b_slots, **hyper, grad=tf.zeros(shape))
    for got, want in zip(_values(a, a_slots), _values(b, b_slots)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [-1, 40, 2 ** 40])
@pytest.mark.parametrize("rule", RULES)
def test_a_bad_index_is_refused_and_nothing_is_written(rule, bad):
    shape = (40, 3)
    var, slots = _state(rule, shape, "float32", 4)
    before = _values(var, slots)
    ids, grad = _batch(shape, 25, "float32", np.int64, 5)
    ids[17] = bad
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[17\] = %d is not in \[0, 40\)" % bad):
        _sparse(rule, var, slots, harness.hyper_for(rule, "float32", 1), tf.constant(grad),
                tf.constant(ids))
    for got, want in zip(_values(var, slots), before):
        np.testing.assert_array_equal(got, want)


def test_ref_variables_in_a_graph():
    rule, shape = "lazy_adam", (30, 4)
    var0, slots0 = harness.make_state(rule, shape, "float32", np.random.default_rng(5))
    ids, grad = _batch(shape, 40, "float32", np.int32, 6)
    hyper = harness.hyper_for(rule, "float32", 1)
    with tf.Graph().as_default():
        var = tf.compat.v1.Variable(var0, use_resource=False)
        slots = [tf.compat.v1.Variable(s, use_resource=False) for s in slots0]
        out = ops.sparse_apply_lazy_adam(var, *slots, **hyper, grad=grad, indices=ids,
                                         every_row=True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(out)
    dense = np.zeros(shape)
    np.add.at(dense, ids, grad.astype(np.float64))
    want, _ = npref.dense_update(rule, var0, slots0, dense, hyper)
    npref.assert_close(got, want, "float32")
    assert not np.allclose(got[np.setdiff1d(np.arange(30), ids)],
                           var0[np.setdiff1d(np.arange(30), ids)])  # untouched rows moved


def test_xla_refuses_every_row_by_name():
    var, slots = _state("lazy_adam", (10, 2), "float32", 6)

    @tf.function(jit_compile=True)
    def step():
        _sparse("lazy_adam", var, slots, harness.hyper_for("lazy_adam", "float32", 1),
                tf.ones([3, 2]), tf.constant([1, 2, 2]))

    with pytest.raises(tf.errors.InvalidArgumentError, match="every_row=True.*XLA-compiled"):
        step()


def test_every_row_must_be_a_bool():
    var, slots = _state("adagrad", (10, 2), "float32", 7)
    with pytest.raises(TypeError, match="every_row must be a bool"):
        ops.resource_sparse_apply_adagrad(
            var, *slots, **harness.hyper_for("adagrad", "float32", 1), grad=tf.ones([1, 2]),
            indices=tf.constant([1]), every_row="yes")
